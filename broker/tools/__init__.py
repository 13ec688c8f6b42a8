"""The operator's tools, apart from the broker library: ``mqadmin`` (RocketMQ's admin
commands; the ``mqadmin_*`` modules by area), ``mqbench`` (``mq-bench``: produce/consume benchmarks,
``failover_bench`` and ``stability_bench`` as its sub-commands), ``progress`` (the one-line status
of long runs, also used by chaos/), ``dashboard`` (``dledger-dashboard``). They talk to a cluster
only through the client SDK (broker/client/) and the NameServers, like any RocketMQ tool; nothing in
the broker imports them.
"""
