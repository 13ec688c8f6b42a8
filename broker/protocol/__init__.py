"""The wire contract shared by the broker, the NameServer, the SDK, the tools and the Spark reader.

Everything both sides of a connection must agree on lives here and nowhere else: name rules
(``names``), request signing and credential files (``auth``), the SQL92 selector language
(``sql_filter``) and the message properties with a meaning to the broker (``properties``: delays,
timers, retries, DLQs). The SDK (``broker.client``) imports nothing else from the server side.
"""
