"""The message store: a broker replica's dledger state machine.

Committed entries are applied here in log order, on every replica alike (``message_store``):
records (``message``, admitted by ``record_rules``) go to the consume queues (``consume_queue``) and
the key index (``key_index``); commands change the replicated ``metadata``, the de-duplication
window (``dedup``), delayed messages (``schedule``), transactions (``transactions``) and retries
(``retry``). The snapshot file (``snapshot``), replica-local indexes that commit with it
(``snapshot_index``), state entries for followers behind retention (``state_entries``) and
rebuilding the queues from the log (``rebuild``) complete it.
"""
