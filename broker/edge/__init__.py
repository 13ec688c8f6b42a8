"""The broker's edges: decode, authorise, call the service, encode. HTTP (``http_api``, with
``http_retry``, ``http_txn`` and the body codec ``http_codec``), the binary port (``binary``: frames,
bounds, signatures; ``binary_ops``: its operations) and the read-only replica export (``export``).
"""
