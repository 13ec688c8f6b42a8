"""Group membership: who votes, who only learns, and how a change travels through the Raft log.

A group starts with the members of ``dLegerPeers``, every one a voter. It changes one server at a
time (Raft thesis §4.1, single-server changes), each change a log entry that carries the whole new
membership (not a delta), in our own fixed format (pysyncobj's membership command is pickled: we
never put pickle on the wire or in the log)::

    'M' | version u8 | count u8 | (role u8 | len u8 | id | len u8 | address)*

``role`` is 1 (voter) or 2 (learner). State machines see such an entry as a no-op (it is not a
batch: ``command_codec.is_batch`` is false), like pysyncobj's leader no-op.

Rules (``dledger/replica.py`` keeps them, ``dledger/syncobj_patch.py`` follows the voters):
- a replica uses the latest membership entry *in its log* (appended, committed or not), as Raft
  does; an entry that is truncated away gives back the one before it (``MembershipHistory``);
- a learner receives the log and counts for nothing: not for commit, not for elections; it does
  not campaign and does not vote;
- the leader refuses a change while the previous one is not committed, before the first entry of
  its own term committed, a change that removes itself, and the promotion of a learner that has not
  caught up (coded errors, ``MembershipError``);
- the membership in force is saved durably beside the term and vote (``meta/membership``): our
  retention removes old segments (read back as no-ops), so the entry that set it may be gone from
  the log; a restart takes the saved one (never falls back to ``dLegerPeers`` once a change was made).
"""

from __future__ import annotations

import dataclasses
import struct
import zlib
from collections.abc import Iterable

from dledger.records import DLedgerError

MEMBERSHIP_TYPE = 0x4D  # 'M': a command type pysyncobj does not know, and not our batch 'D'
MEMBERSHIP_VERSION = 1
VOTER, LEARNER = 1, 2
MAX_MEMBERS = 16
MAX_ID_BYTES = 64
MAX_ADDRESS_BYTES = 255
HISTORY_KEEP = 16  # placed memberships kept (changes are rare; see MembershipHistory)
_HEAD = struct.Struct("<BBB")
_FILE_MAGIC = b"DLM1"
_PLACED = struct.Struct("<QQI")  # index, term, length of the membership body


class MembershipCodecError(ValueError):
    """A membership entry or record that is not well formed."""


class MembershipError(DLedgerError):
    """A membership change refused; ``code`` says why (the operator's tools print it)."""

    code = "MEMBERSHIP_REFUSED"

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


@dataclasses.dataclass(frozen=True)
class Membership:
    """The members of a group: id -> Raft address, voters and learners (disjoint)."""

    voters: tuple[tuple[str, str], ...]
    learners: tuple[tuple[str, str], ...] = ()

    @staticmethod
    def of(voters: dict[str, str], learners: dict[str, str] | None = None) -> Membership:
        return Membership(tuple(sorted(voters.items())), tuple(sorted((learners or {}).items())))

    @property
    def voter_ids(self) -> frozenset[str]:
        return frozenset(pid for pid, _ in self.voters)

    @property
    def learner_ids(self) -> frozenset[str]:
        return frozenset(pid for pid, _ in self.learners)

    def addresses(self) -> dict[str, str]:
        """Every member, voters and learners: id -> address."""
        return dict(self.voters + self.learners)

    def role_of(self, peer_id: str) -> str | None:
        if peer_id in self.voter_ids:
            return "voter"
        if peer_id in self.learner_ids:
            return "learner"
        return None

    def check(self) -> None:
        ids = [pid for pid, _ in self.voters + self.learners]
        addrs = [a for _, a in self.voters + self.learners]
        if not self.voters:
            raise MembershipCodecError("a membership needs at least one voter")
        if len(ids) > MAX_MEMBERS:
            raise MembershipCodecError(f"at most {MAX_MEMBERS} members")
        if len(set(ids)) != len(ids) or len(set(addrs)) != len(addrs):
            raise MembershipCodecError("member ids and addresses must be unique")
        for pid, addr in self.voters + self.learners:
            if not 0 < len(pid.encode()) <= MAX_ID_BYTES or not 0 < len(addr.encode()) <= MAX_ADDRESS_BYTES:
                raise MembershipCodecError(f"member {pid!r}: id 1..{MAX_ID_BYTES} bytes, address 1..255")
            host, sep, port = addr.rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise MembershipCodecError(f"member {pid!r}: address {addr!r} is not host:port")

    # -- the single-server changes (pure: a new Membership, or MembershipError) ------------------
    def add_learner(self, peer_id: str, address: str) -> Membership:
        if peer_id in self.addresses():
            raise MembershipError("ALREADY_MEMBER", f"{peer_id} is already a {self.role_of(peer_id)}")
        if address in self.addresses().values():
            raise MembershipError("ADDRESS_IN_USE", f"{address} is already the address of a member")
        out = Membership(self.voters, tuple(sorted((*self.learners, (peer_id, address)))))
        _checked(out)
        return out

    def promote(self, peer_id: str) -> Membership:
        if peer_id not in self.learner_ids:
            raise MembershipError("NOT_A_LEARNER", f"{peer_id} is not a learner of this group")
        addr = dict(self.learners)[peer_id]
        out = Membership(
            tuple(sorted((*self.voters, (peer_id, addr)))),
            tuple(p for p in self.learners if p[0] != peer_id),
        )
        _checked(out)
        return out

    def remove(self, peer_id: str) -> Membership:
        if peer_id not in self.addresses():
            raise MembershipError("UNKNOWN_MEMBER", f"{peer_id} is not a member of this group")
        out = Membership(
            tuple(p for p in self.voters if p[0] != peer_id),
            tuple(p for p in self.learners if p[0] != peer_id),
        )
        if not out.voters:
            raise MembershipError("LAST_VOTER", "a group keeps at least one voter")
        _checked(out)
        return out

    def view(self) -> dict[str, object]:
        return {"voters": dict(self.voters), "learners": dict(self.learners)}


def _checked(m: Membership) -> None:
    try:
        m.check()
    except MembershipCodecError as exc:
        raise MembershipError("BAD_MEMBERSHIP", str(exc)) from None


def _field(raw: bytes, at: int) -> tuple[str, int]:
    if at >= len(raw):
        raise MembershipCodecError("truncated membership")
    n = raw[at]
    value = raw[at + 1 : at + 1 + n]
    if len(value) != n:
        raise MembershipCodecError("truncated membership")
    try:
        return value.decode(), at + 1 + n
    except UnicodeDecodeError:
        raise MembershipCodecError("a member id or address is not UTF-8") from None


def is_membership(body: bytes) -> bool:
    return len(body) >= _HEAD.size and body[0] == MEMBERSHIP_TYPE


def encode(m: Membership) -> bytes:
    m.check()
    parts = [_HEAD.pack(MEMBERSHIP_TYPE, MEMBERSHIP_VERSION, len(m.voters) + len(m.learners))]
    for role, members in ((VOTER, m.voters), (LEARNER, m.learners)):
        for pid, addr in members:
            bid, baddr = pid.encode(), addr.encode()
            parts.append(bytes([role, len(bid)]) + bid + bytes([len(baddr)]) + baddr)
    return b"".join(parts)


def decode(body: bytes) -> Membership:
    """A membership entry body -> Membership; MembershipCodecError on anything malformed."""
    if not is_membership(body):
        raise MembershipCodecError("not a membership entry")
    _type, version, count = _HEAD.unpack_from(body, 0)
    if version != MEMBERSHIP_VERSION:
        raise MembershipCodecError(f"unsupported membership version {version}")
    if count > MAX_MEMBERS:
        raise MembershipCodecError(f"{count} members (at most {MAX_MEMBERS})")
    voters: list[tuple[str, str]] = []
    learners: list[tuple[str, str]] = []
    at = _HEAD.size
    for _ in range(count):
        if at >= len(body):
            raise MembershipCodecError("truncated membership")
        role = body[at]
        pid, at = _field(body, at + 1)
        addr, at = _field(body, at)
        if role == VOTER:
            voters.append((pid, addr))
        elif role == LEARNER:
            learners.append((pid, addr))
        else:
            raise MembershipCodecError(f"unknown member role {role}")
    if at != len(body):
        raise MembershipCodecError("trailing bytes after the last member")
    out = Membership(tuple(sorted(voters)), tuple(sorted(learners)))
    out.check()
    return out


@dataclasses.dataclass(frozen=True)
class Placed:
    """A membership and the log entry that set it (index 0: the bootstrap, from the config)."""

    index: int
    term: int
    membership: Membership


class MembershipHistory:
    """The memberships of the log, oldest first: the latest is in force.

    Appending a membership entry adds one; truncating the log from ``i`` drops those at ``i`` and
    after (the previous comes back in force); an install (the log restarted after the leader's
    anchor) keeps only those at or below the anchor that were committed, plus the leader's.
    Bounded at ``HISTORY_KEEP``: the oldest go first — only the newest at or below the commit
    index can ever be needed again (committed entries are never truncated).
    """

    def __init__(self, bootstrap: Membership, placed: Iterable[Placed] = ()):
        self.bootstrap = bootstrap
        self.placed: list[Placed] = sorted(placed, key=lambda p: p.index)

    @property
    def current(self) -> Placed:
        return self.placed[-1] if self.placed else Placed(0, 0, self.bootstrap)

    def at(self, index: int) -> Placed:
        """The membership in force at ``index`` (the newest placed at or below it)."""
        found = Placed(0, 0, self.bootstrap)
        for p in self.placed:
            if p.index <= index:
                found = p
        return found

    def append(self, placed: Placed) -> None:
        self.placed = [p for p in self.placed if p.index < placed.index]
        self.placed.append(placed)
        del self.placed[:-HISTORY_KEEP]

    def truncate_from(self, index: int) -> bool:
        """Drop memberships set at ``index`` or after; True when the one in force changed."""
        before = len(self.placed)
        self.placed = [p for p in self.placed if p.index < index]
        return len(self.placed) != before

    def encode(self) -> bytes:
        parts = [_FILE_MAGIC, struct.pack("<H", len(self.placed))]
        for p in self.placed:
            body = encode(p.membership)
            parts.append(_PLACED.pack(p.index, p.term, len(body)) + body)
        payload = b"".join(parts)
        return payload + struct.pack("<I", zlib.crc32(payload))

    @staticmethod
    def decode_placed(raw: bytes) -> list[Placed]:
        """The placed memberships of a saved record; MembershipCodecError if it is damaged."""
        if len(raw) < 10 or not raw.startswith(_FILE_MAGIC):
            raise MembershipCodecError("not a membership record")
        payload, (crc,) = raw[:-4], struct.unpack("<I", raw[-4:])
        if zlib.crc32(payload) != crc:
            raise MembershipCodecError("membership record checksum mismatch")
        (count,) = struct.unpack_from("<H", payload, 4)
        at = 6
        out = []
        for _ in range(count):
            if at + _PLACED.size > len(payload):
                raise MembershipCodecError("truncated membership record")
            index, term, n = _PLACED.unpack_from(payload, at)
            at += _PLACED.size
            body = payload[at : at + n]
            if len(body) != n:
                raise MembershipCodecError("truncated membership record")
            out.append(Placed(index, term, decode(body)))
            at += n
        if at != len(payload):
            raise MembershipCodecError("trailing bytes in the membership record")
        return out


OPS = ("add_learner", "promote", "remove")


def check_membership_request(payload: object) -> tuple[str, str, str | None]:
    """A membership change request from the network, ``{op, id, address?}``, checked and bounded:
    ``(op, id, address)``; ``MembershipError`` ``BAD_REQUEST`` otherwise."""
    if not isinstance(payload, dict) or not set(payload) <= {"op", "id", "address"}:
        raise MembershipError("BAD_REQUEST", "expected a JSON object {op, id, address?}")
    op, peer_id, address = payload.get("op"), payload.get("id"), payload.get("address")
    if op not in OPS:
        raise MembershipError("BAD_REQUEST", f"op must be one of {', '.join(OPS)}")
    if not isinstance(peer_id, str) or not 0 < len(peer_id) <= MAX_ID_BYTES or not peer_id.replace("_", "").isalnum():
        raise MembershipError("BAD_REQUEST", f"id must be 1..{MAX_ID_BYTES} characters of [a-zA-Z0-9_]")
    if op == "add_learner":
        if not isinstance(address, str) or len(address) > MAX_ADDRESS_BYTES:
            raise MembershipError("BAD_REQUEST", "add_learner needs the new member's Raft address host:port")
        host, sep, port = address.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise MembershipError("BAD_REQUEST", f"address {address[:80]!r} is not host:port")
    elif address is not None:
        raise MembershipError("BAD_REQUEST", f"{op} takes no address")
    return op, peer_id, address
