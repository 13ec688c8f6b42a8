"""The broker process: one replica's wiring of node, store, service and edges (``broker_server``,
``python -m broker.server`` / ``dledger-broker``), its configuration (``config``, and what mqadmin
may see and change of it: ``admin_config``), registration with the NameServers (``registration``)
and ``/metrics`` (``metrics``).
"""
