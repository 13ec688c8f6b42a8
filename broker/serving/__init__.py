"""The process and edge kit the NameServer, the broker and ``dledger-node`` share: what sits between
a listening socket and a server's handlers, and the start of a server process.

- ``http_edge``    bounded HTTP connections, request heads and bodies, the one ``{code, message}``
  error middleware and integer-parameter parser of every HTTP port, TLS;
- ``acl``          accounts and permissions (``plain_acl.yml``, reloaded when it changes);
- ``security``     the ACL, request signatures and TLS tied together for a server;
- ``certs``        a private CA and server certificates (``python -m broker.serving.certs``);
- ``process_main`` logging, the event loop and running until SIGTERM/SIGINT.

Of the broker it imports only ``broker.protocol``: the NameServer and ``dledger.apps`` use it without
the broker's server modules.
"""
