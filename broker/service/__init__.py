"""The service layer: what every edge calls. ``BrokerService`` (``broker_service``) answers sends
(``send``), pulls and queries (``query``), topic and group administration (``admin``) and
transactions (``txn``) as plain async methods with typed answers, over the host it runs in
(``base``) and the request records (``requests``); client membership as each replica learns it
(``consumers``, ``producers``).
"""
