"""A deterministic simulator of a dledger group: the production Raft code on in-memory twins,
driven by one seed (``python -m dledger.sim --seeds N --steps M``)."""
