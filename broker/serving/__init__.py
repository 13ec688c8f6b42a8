"""The process and edge kit the NameServer and the broker share: what sits between a listening socket
and a server's handlers.

- ``sniff``          one port, two protocols: a connection is told apart by its first byte (a RocketMQ
  remoting frame, HTTP, or a TLS record, then the same choice again inside TLS) and handed to
  aiohttp's request handler or to the remoting server (``SniffingListener``, ``start_dual_server``);
- ``remoting_server`` RocketMQ's remoting protocol on asyncio (``RemotingServer``): frames through
  ``broker.protocol.rocketmq.command.FrameDecoder``, many requests in flight per connection, answers
  in any order, oneway requests, requests the server sends a client, a dispatch table code ->
  handler, and the bounds every port of ours keeps;
- ``remoting_acl``   who sent a remoting request: ``AclClientRPCHook``'s signature (ACL 1.0) checked
  against the accounts of ``broker.serving.acl``, the operator's policy for that signature, and the
  permissions RocketMQ's ACL asks of each request code.

The wire itself (frames, headers, bodies, the signature's bytes) is ``broker.protocol.rocketmq``;
this package adds sockets, time and accounts. docs/REMOTING.md ("The server side") and docs/API.md
("One port, two protocols") describe it for operators.

Also, since issue 24:

- ``http_edge``    bounded HTTP connections, request heads and bodies, the one ``{code, message}``
  error middleware and integer-parameter parser of every HTTP port, TLS;
- ``acl``          accounts and permissions (``plain_acl.yml``, reloaded when it changes);
- ``security``     the ACL, request signatures and TLS tied together for a server;
- ``certs``        a private CA and server certificates (``python -m broker.serving.certs``);
- ``process_main`` logging, the event loop and running until SIGTERM/SIGINT.

Of the broker it imports only ``broker.protocol``: the NameServer and ``dledger.apps`` use it without
the broker's server modules.
"""
