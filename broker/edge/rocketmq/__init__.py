"""The broker's RocketMQ edge (issue 25): RocketMQ's remoting protocol on the broker's ``listenPort``
and VIP channel, for the official Java and Go clients and mqadmin, answered by the one broker
service (``broker.service.broker_service.BrokerService``), the same methods the HTTP API and our binary port call.

- ``edge``      ``RocketMQEdge``: the remoting server, the dispatch table (``route``: RocketMQ's ACL
  check in front of every handler), the clients' connections, the broker's requests to clients;
- ``send``, ``pull``, ``clients``, ``offsets``: the handlers, by what they serve (each module's
  ``register(edge)`` adds its codes; ``edge.HANDLER_MODULES`` lists the modules);
- ``txn``, ``query``, ``admin``, ``stats``: transactions, message queries, mqadmin's codes;
- ``host``      ``EdgeHost``: the edge as the handlers see it (they do not import ``edge``);
- ``messages``  pure conversions: our stored records as RocketMQ's stored layout, a RocketMQ send as
  our messages;
- ``channels``  the clients' connections (``ClientChannels``);
- ``errors``    the response code the clients act on for each service error.

The wire codecs are ``broker.protocol.rocketmq``; sockets, bounds and ACL 1.0 signatures are
``broker.serving``. docs/REMOTING.md ("The broker side") describes the mapping.
"""
