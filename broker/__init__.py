"""The broker: RocketMQ messaging on a dledger group (one process per replica), and the client SDK.

Server side: ``message`` (records in the Raft log), ``store`` (the dledger state machine: dispatch
to ``consume_queue`` and ``key_index``, replicated ``metadata``), ``api`` (HTTP v1), ``server``
(process, roles, long polling), ``registration`` (NameServers), ``consumers`` (group membership).
Client side: ``broker.client`` (producer, push/pull consumers, admin). Tools: ``mqadmin``, ``mqbench``.
"""
