"""dledger: the Raft-replicated commit log.

A segmented, checksummed entry store (``entry_store``) that *is* pysyncobj's journal
(``journal``), driven by a patched SyncObj (``raft``) and exposed to asyncio code through
``DLedgerNode`` (``node``). The log is the broker's commit log: every replica holds the
same entries, with equal chain CRCs at every committed index.
"""
