"""The programs built on the dledger library: the standalone node process (``dledger-node``), the
local cluster manager (``dledger-cluster``), the log benchmark (``python -m dledger.apps.bench``),
the stock-pysyncobj reference server it compares against, the container health check, the
start-up shared by every server process of the project (logging, signals, test plants), the
standalone node's state machine (``checkpoint``) and the latency histogram of the benchmarks and
tools (``stats``). Nothing in the library (``dledger/``) imports from here."""
