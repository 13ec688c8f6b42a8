"""The NameServer: RocketMQ's stateless route registry, rebuilt for DLedger-mode broker groups.

Brokers register (and heartbeat) with every NameServer; clients ask any NameServer which broker
groups serve a topic and which address is each group's leader (broker id 0). NameServers keep
routes in memory only and never talk to each other: a restarted NameServer is empty until the
brokers' next registrations (every 30 s, and at once on a role change) fill it again.

- ``route_table`` — the pure table (records, RocketMQ/DLedger role and term rules, validation, expiry);
- ``wire`` — the v1 msgpack/JSON codec of its records;
- ``config`` — ``conf/namesrv.conf`` properties;
- ``server`` — the aiohttp process (``dledger-namesrv``) around the table.
"""
