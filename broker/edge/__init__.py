"""The broker's edges: what decodes a request, checks who may make it, calls the one broker service
(``broker.service.broker_service``) and encodes its answer. ``rocketmq``: RocketMQ's remoting protocol for the
official clients and mqadmin (issue 25). (The HTTP API and the binary port of our SDK join them
here with issue 24.)
Also, since issue 24:

The broker's edges: decode, authorise, call the service, encode. HTTP (``http_api``, with
``http_retry``, ``http_txn`` and the body codec ``http_codec``), the binary port (``binary``: frames,
bounds, signatures; ``binary_ops``: its operations) and the read-only replica export (``export``).
"""
