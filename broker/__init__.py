"""The broker: RocketMQ messaging on a dledger group (one process per replica), and the client SDK.

Server side, lowest first: ``broker.protocol`` (the wire contract every side shares),
``broker.serving`` (the process and edge kit the NameServer and ``dledger-node`` share too),
``broker.store`` (the dledger state machine), ``broker.service`` (what every edge calls),
``broker.edge`` (HTTP, the binary port, the export) and ``broker.server`` (the process).
Client side: ``broker.client`` (producer, push/pull consumers, admin). Tools (mqadmin, mq-bench,
the dashboard): ``broker.tools``, apart from the library.
"""
