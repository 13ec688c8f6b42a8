"""The broker: RocketMQ messaging on a dledger group (one process per replica), and the client SDK.

Server side: ``message`` (records in the Raft log), ``store`` (the dledger state machine: dispatch
to ``consume_queue`` and ``key_index``, replicated ``metadata``), ``service`` (send, pull, queries,
admin: what every transport calls), ``api`` (HTTP v1 over the service), ``server``
(process, roles, long polling), ``registration`` (NameServers), ``consumers`` (group membership).
Client side: ``broker.client`` (producer, push/pull consumers, admin). Tools (mqadmin, mq-bench,
the dashboard): ``broker.tools``, apart from the library.
"""
