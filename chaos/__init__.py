"""Chaos testing for the DLedger-mode broker: faults, workloads that record histories, fault
schedules and failover drills (docs/CHAOS.md).

- ``history``   the history records (sends, receipts, drain, faults) and their JSON-lines writer
- ``layout``    pure planning of a chaos cluster: ports, one Toxiproxy proxy per link, node configs
- ``selection`` pure choice of fault targets (leader, random, minority, majority, fixed, all) and of
                the links a partition cuts (isolate leader, minority split, bridge)
- ``schedule``  pure fault/heal windows of a run
- ``toxi``      the Toxiproxy server process and the proxies and toxics, through toxiproxy-python
- ``unsynced``  the crash fault's model of a lost page cache (sizes at each fsync, truncation)
- ``launch``    ``python -m chaos.launch``: a broker with the fsync-recording hook installed
- ``target``    the small interface faults and drills act on, and its local-process implementation
- ``local``     the local cluster of a run: NameServer, brokers and the Toxiproxy server, started
                and stopped by PID
- ``faults``    fault objects (apply / heal, logged to faults.jsonl); composites; the standard mix
- ``damage``    the bitflip and truncate faults: damaged segments, refused, repaired or served?
- ``workload``  producers, orderly consumers (sessions) and a zombie offset client driving the SDK,
                writing the history; the final drain
- ``sampler``   every replica's commit index, term, chain CRC at the commit index and stored
                consumer offsets, every few hundred ms
- ``plants``    deliberate defects for the audit's sensitivity tests (``--plant``; test-only)
- ``runner``    ``chaos run``: cluster, workload, schedule, recovery, drain, run.json, audit
- ``drill``     ``chaos drill``: kill the leader N rounds, time route change and first ack
- ``cli``       the ``chaos`` command
"""
