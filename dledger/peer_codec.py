"""The wire codec of Raft peer messages: msgpack arrays with a fixed schema per type, no pickle.

pysyncobj hands its transport Python dicts and unpickles whatever arrives, so a peer frame was
code execution for anyone holding the password. Here every message type has a fixed field list;
``decode`` checks types and bounds and raises ``PeerCodecError`` on anything else (the transport
then drops the connection). Nothing from the network is turned into objects other than ints,
bools, bytes and lists of them.

Frame body (before the transport's encryption)::

    msgpack array: [VERSION, type_code, field, field, ...]   (fields in the order of FIELDS[type])

``append_entries`` entries travel as ``[[body, index, term], ...]`` and come back as tuples.
"""

from __future__ import annotations

from typing import Any, Final

import msgpack

VERSION: Final = 1
U63: Final = (1 << 63) - 1
MAX_ENTRIES_PER_MESSAGE: Final = 100_000
MAX_CONFIG_BYTES: Final = 8192


class PeerCodecError(ValueError):
    """A peer frame that is not a well-formed message of a known type."""


def _int(v: Any) -> int:
    if type(v) is not int or not 0 <= v <= U63:
        raise PeerCodecError(f"expected an unsigned integer, got {type(v).__name__}")
    return v


def _opt_int(v: Any) -> int | None:
    return None if v is None else _int(v)


def _bool(v: Any) -> bool:
    if type(v) is not bool:
        raise PeerCodecError(f"expected a boolean, got {type(v).__name__}")
    return v


def _entries(v: Any) -> list[tuple[bytes, int, int]]:
    if type(v) is not list or len(v) > MAX_ENTRIES_PER_MESSAGE:
        raise PeerCodecError("entries must be a bounded list")
    out = []
    for e in v:
        if type(e) is not list or len(e) != 3 or type(e[0]) is not bytes:
            raise PeerCodecError("an entry must be [body, index, term]")
        out.append((e[0], _int(e[1]), _int(e[2])))
    return out


def _config(v: Any) -> bytes:
    if type(v) is not bytes or not 0 < len(v) <= MAX_CONFIG_BYTES:
        raise PeerCodecError("a membership must be 1..8192 bytes")
    return v


def _anchor(v: Any) -> tuple[int, int, int]:
    if type(v) is not list or len(v) != 3:
        raise PeerCodecError("an anchor must be [index, term, chain_crc]")
    return (_int(v[0]), _int(v[1]), _int(v[2]))


# type name -> (code, ((field, checker, default when absent on encode), ...))
_SCHEMAS: Final[dict[str, tuple[int, tuple[tuple[str, Any, Any], ...]]]] = {
    "append_entries": (
        1,
        (
            ("term", _int, None),
            ("commit_index", _int, None),
            ("entries", _entries, []),
            ("prevLogIdx", _opt_int, None),
            ("prevLogTerm", _opt_int, None),
            ("dl_floor", _opt_int, None),
        ),
    ),
    "next_node_idx": (
        2,
        (
            ("next_node_idx", _int, None),
            ("reset", _bool, False),
            ("success", _bool, False),
            ("installed", _bool, False),
        ),
    ),
    "request_vote": (
        3,
        (
            ("term", _int, None),
            ("last_log_index", _int, None),
            ("last_log_term", _int, None),
            ("dl_transfer", _bool, False),
        ),
    ),
    "response_vote": (4, (("term", _int, None),)),
    "timeout_now": (5, (("term", _int, None),)),
    "dl_install": (6, (("term", _int, None), ("anchor", _anchor, None))),
    "dl_pre_vote": (
        7,
        (
            ("term", _int, None),
            ("last_log_index", _int, None),
            ("last_log_term", _int, None),
            ("round", _int, None),
        ),
    ),
    "dl_pre_vote_response": (
        8,
        (("term", _int, None), ("granted", _bool, None), ("current_term", _int, None), ("round", _int, None)),
    ),
    "dl_stale_term": (9, (("term", _int, None),)),
    # Issue 27: the membership in force at the leader's anchor, sent just before a dl_install
    # (only by a group whose membership changed: a group that never changed sends none, so mixed
    # versions interoperate). ``config`` is a dledger.membership entry body.
    "dl_membership": (
        10,
        (("term", _int, None), ("index", _int, None), ("entry_term", _int, None), ("config", _config, None)),
    ),
}
_BY_CODE: Final = {code: (name, fields) for name, (code, fields) in _SCHEMAS.items()}


class SharedMessage(dict[str, Any]):
    """A message sent unchanged to several peers (a leader's append to followers at the same next
    index, issue 26): encoded once, by the first ``encode``. Never changed once built."""

    __slots__ = ("wire",)

    def __init__(self, **fields: Any):
        super().__init__(**fields)
        self.wire: bytes | None = None


def encode(message: dict[str, Any]) -> bytes:
    """One message dict (as pysyncobj builds them) -> frame body. KeyError/PeerCodecError on misuse."""
    if type(message) is SharedMessage:
        wire = message.wire
        if wire is None:
            wire = message.wire = _encode(message)
        return wire
    return _encode(message)


def _encode(message: dict[str, Any]) -> bytes:
    name = message["type"]
    try:
        code, fields = _SCHEMAS[name]
    except KeyError:
        raise PeerCodecError(f"no wire schema for message type {name!r}") from None
    out: list[Any] = [VERSION, code]
    for field, _check, default in fields:
        value = message.get(field, default)
        if field == "entries":
            value = [[bytes(e[0]), int(e[1]), int(e[2])] for e in value]
        elif field == "anchor":
            value = list(value)
        out.append(value)
    return msgpack.packb(out, use_bin_type=True)


def decode(frame: bytes | memoryview) -> dict[str, Any]:
    """Frame body -> message dict; PeerCodecError on anything that is not exactly a known message."""
    try:
        raw = msgpack.unpackb(
            frame,
            raw=False,
            use_list=True,
            strict_map_key=True,
            max_bin_len=len(frame),
            max_str_len=0,
            max_array_len=MAX_ENTRIES_PER_MESSAGE + 16,
            max_map_len=0,
            max_ext_len=0,
        )
    except Exception as exc:  # msgpack raises several types for malformed input
        raise PeerCodecError(f"not a msgpack message: {exc}") from None
    if type(raw) is not list or len(raw) < 2 or raw[0] != VERSION or type(raw[1]) is not int:
        raise PeerCodecError("not a dledger peer message of this version")
    try:
        name, fields = _BY_CODE[raw[1]]
    except KeyError:
        raise PeerCodecError(f"unknown message type code {raw[1]}") from None
    if len(raw) != 2 + len(fields):
        raise PeerCodecError(f"{name}: {len(raw) - 2} fields, expected {len(fields)}")
    fast = _FAST.get(raw[1])
    if fast is not None:
        decoded = fast(raw)
        if decoded is not None:
            return decoded
    message: dict[str, Any] = {"type": name}
    for (field, check, _default), value in zip(fields, raw[2:], strict=True):
        message[field] = check(value)
    if name == "append_entries" and message["prevLogIdx"] is None:
        # pysyncobj tells "no previous entry" by the key's absence, not by None.
        del message["prevLogIdx"], message["prevLogTerm"]
    return message


# The two messages of every round (an append and its answer), checked inline: the same checks as
# the schema's field checkers, with no call per field (issue 26: Python calls per round). A value
# that fails a check returns None, and the schema's loop above raises its usual error.
def _fast_append_entries(raw: list[Any]) -> dict[str, Any] | None:
    _v, _c, term, commit, entries, prev, prev_term, floor = raw
    if (
        type(term) is not int
        or not 0 <= term <= U63
        or type(commit) is not int
        or not 0 <= commit <= U63
        or type(entries) is not list
        or len(entries) > MAX_ENTRIES_PER_MESSAGE
    ):
        return None
    for v in (prev, prev_term, floor):
        if v is not None and (type(v) is not int or not 0 <= v <= U63):
            return None
    out = []
    for e in entries:
        if type(e) is not list or len(e) != 3:
            return None
        body, index, entry_term = e
        if (
            type(body) is not bytes
            or type(index) is not int
            or not 0 <= index <= U63
            or type(entry_term) is not int
            or not 0 <= entry_term <= U63
        ):
            return None
        out.append((body, index, entry_term))
    if prev is None:  # pysyncobj tells "no previous entry" by the key's absence, not by None
        return {"type": "append_entries", "term": term, "commit_index": commit, "entries": out, "dl_floor": floor}
    return {
        "type": "append_entries",
        "term": term,
        "commit_index": commit,
        "entries": out,
        "prevLogIdx": prev,
        "prevLogTerm": prev_term,
        "dl_floor": floor,
    }


def _fast_next_node_idx(raw: list[Any]) -> dict[str, Any] | None:
    _v, _c, next_idx, reset, success, installed = raw
    if (
        type(next_idx) is not int
        or not 0 <= next_idx <= U63
        or type(reset) is not bool
        or type(success) is not bool
        or type(installed) is not bool
    ):
        return None
    return {
        "type": "next_node_idx",
        "next_node_idx": next_idx,
        "reset": reset,
        "success": success,
        "installed": installed,
    }


_FAST: Final[dict[int, Any]] = {1: _fast_append_entries, 2: _fast_next_node_idx}
