"""Apache RocketMQ's remoting protocol, as plain functions over plain data (no sockets, no loop).

The wire the official clients (Java 4.9.x / 5.x, Go, C++) and ``mqadmin`` speak to NameServers and
brokers; the servers that answer them are built on these modules (docs/REMOTING.md):

- ``errors``   the one coded error (``RemotingError``) every decoder raises on bad input;
- ``codes``    request, response and language codes (``RequestCode``, ``ResponseCode``, ...);
- ``command``  frames and ``RemotingCommand`` headers in JSON and in the ROCKETMQ binary encoding,
  and the incremental, bounded ``FrameDecoder``;
- ``headers``  typed request/response headers (the string ``extFields``), parsed with range checks
  (``admin_headers``: the NameServer's and mqadmin's; ``header_fields``: the machinery);
- ``fastjson`` a bounded reader and a writer for the JSON dialect fastjson produces (object keys
  that are numbers or objects, its escapes, its doubles);
- ``bodies``   the JSON bodies (routes, cluster info, heartbeats, stats ...) over ``jsonbean``;
- ``message``  the stored message layout, batch bodies, message ids and body compression;
- ``properties`` the properties string, property names, sysFlag bits and tag hash codes;
- ``acl``      ``AclClientRPCHook``'s signature: compute and verify.

Imports only the standard library and ``broker.protocol`` (tests/test_layering.py).
"""
