"""Replays across replicas and leaderships: the nonces of state-changing requests live in the Raft log.

A replica's in-memory nonce window (``broker.protocol.auth.NonceWindow``) dies with its process and
is its own: on its own it would let a request captured on its way to one leader be replayed at the
same replica after a restart, or at a later leader. So every request that changes replicated state
carries its signature's (access key, nonce, timestamp) into its Raft entry, and the state machine —
every replica, every future leader, in log order — decides once and for all whether it is new:

    signed request --verify (scope, signature, time, in-memory window, *this log's set*)--> handler
        handler's first append: [nonce record, body 1 .. body n]   (one request = one entry)
            apply, every replica: nonce record admitted -> bodies 1..n applied
                                  refused (replay, too old) -> bodies 1..n skipped, the same everywhere

The nonce record is a command ``{"op": "auth.nonce", "ak", "nonce", "ts", "now", "n"}``: ``now`` is
the leader's wall clock when it appended (so no replica reads a clock at apply), ``n`` the bodies
of the request that follow it in the entry.

``NonceLog`` (the replicated set) is a pure function of the log: a record is refused when its
``ts`` is outside ``[now - window, now + future]`` (what the appending leader checked), at or below
its key's floor, or when (key, nonce) was admitted before. Entries older than ``M - 2 x window``
(``M`` = the newest ``now`` applied) are forgotten: a replay of one could only be admitted by a
leader whose clock is more than a window behind ``M`` — and the scope of the signature already
binds it to the one replica it was sent to (broker/protocol/auth.py), whose clock would have to have
gone back that far. At most ``per_key_max`` entries per access key, beyond which that key's floor
rises (never another key's). A leader whose clock runs ahead moves ``M`` but refuses nothing for a
later leader: only each record's own ``now`` judges its age.

Durability, like the de-duplication window (broker/store/dedup.py): the store's snapshot keeps
``checkpoint()`` (``M``, the floors, the log index of the oldest entry still remembered, the
positions of skipped bodies); a restart re-adds the nonce records from that index (``restore_add``
filters what the floors and ``M`` exclude), so the set after a restart equals the set before it. A
follower loading a ``state`` entry takes the same checkpoint and re-adds from its own log.
Rebuilding queues from the log skips the bodies a refusal skipped (``is_skipped``).

The early check (``check``) runs on the event loop at verification: a leader that already applied
a nonce refuses its replay before anything is appended.

``ReplayGuardedNode`` is the broker's ``DLedgerNode``: it prepends the nonce record to the first
append of a signed request (the request's verified signature travels in ``broker.serving.security.SIGNED``,
set where it was verified) and turns a refusal at apply into the request's ``AuthError``.
"""

from __future__ import annotations

import collections
import heapq
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, TypeGuard

from broker.protocol.auth import (
    FUTURE_MS_DEFAULT,
    NONCES_PER_KEY_MAX_DEFAULT,
    WINDOW_MS_DEFAULT,
    AuthError,
    KeyNonces,
    SignedHeader,
)
from broker.serving.security import SIGNED
from broker.store.message import encode_command
from dledger.node import BodyLocation, DLedgerNode

NONCE_OP: Final = "auth.nonce"
SKIPPED_MAX: Final = 100_000  # positions of skipped bodies remembered (refusals at apply are rare)

_MESSAGES: Final = {
    "REPLAYED_REQUEST": "this signed request was already applied (nonce reused)",
    "REQUEST_TOO_OLD": "the request was signed too long ago for the replicated nonce window: sign it again",
    "TIMESTAMP_OUT_OF_WINDOW": "the request's time is too far ahead of the leader's",
    "BAD_NONCE_RECORD": "malformed nonce record",
}


def nonce_command(signed: SignedHeader, leader_ms: int, bodies: int) -> bytes:
    return encode_command({"op": NONCE_OP, "ak": signed.access_key, "nonce": signed.nonce,
                           "ts": signed.timestamp_ms, "now": leader_ms, "n": bodies})


class NonceLog:
    """The replicated nonce set. ``apply`` / ``restore_*`` on the apply thread; ``check`` from any."""

    def __init__(
        self,
        window_ms: int = WINDOW_MS_DEFAULT,
        future_ms: int = FUTURE_MS_DEFAULT,
        per_key_max: int = NONCES_PER_KEY_MAX_DEFAULT,
    ):
        self.window_ms = window_ms
        self.future_ms = future_ms
        self.per_key_max = per_key_max
        self._lock = threading.Lock()
        self._m = 0  # the newest leader time applied
        self._keys: dict[str, KeyNonces] = {}
        self._by_time: list[tuple[int, str, str]] = []  # (ts, ak, nonce), for aging by M
        # (log index, position, ak, nonce) in log order: the front is the oldest remembered entry
        self._order: collections.deque[tuple[int, int, str, str]] = collections.deque()
        self._skipped: dict[int, None] = {}  # positions of bodies skipped by a refusal, oldest first
        self._skip_entry = -1
        self.skip_left = 0  # bodies of entry _skip_entry still to skip (the store's apply reads it first: take_skip)
        self.refused: collections.Counter[str] = collections.Counter()

    def __len__(self) -> int:
        with self._lock:
            return sum(len(k.seen) for k in self._keys.values())

    # -- the early check (event loop) -------------------------------------------------------------
    def check(self, signed: SignedHeader) -> None:
        """Refuse a request this log already admitted, or one its key's floor excludes (the caller
        checked the time against its own clock)."""
        with self._lock:
            k = self._keys.get(signed.access_key)
            if k is None:
                return
            if signed.nonce in k.seen:
                raise AuthError(401, "REPLAYED_REQUEST", _MESSAGES["REPLAYED_REQUEST"])
            if signed.timestamp_ms <= k.floor_ms:
                raise AuthError(401, "REQUEST_TOO_OLD", _MESSAGES["REQUEST_TOO_OLD"])

    # -- apply (the apply thread, in log order) -----------------------------------------------------
    def apply(self, cmd: Mapping[str, Any], index: int, position: int) -> dict[str, Any]:
        """Admit the request (``{}``) or refuse it (``{"refused": code}``; its ``n`` bodies that follow
        in this entry are then skipped: ``take_skip``)."""
        n = cmd.get("n")
        n = n if isinstance(n, int) and not isinstance(n, bool) and 0 <= n <= 1 << 20 else 0
        ak, nonce, ts, now = cmd.get("ak"), cmd.get("nonce"), cmd.get("ts"), cmd.get("now")
        if not (isinstance(ak, str) and isinstance(nonce, str) and _is_int(ts) and _is_int(now)):
            return self._refuse("BAD_NONCE_RECORD", index, n)
        with self._lock:
            if now > self._m:
                self._m = now
            self._age()
            k = self._keys.get(ak)
            if ts > now + self.future_ms or ts < now - self.window_ms:
                code = "TIMESTAMP_OUT_OF_WINDOW"
            elif k is not None and ts <= k.floor_ms:
                code = "REQUEST_TOO_OLD"
            elif k is not None and nonce in k.seen:
                code = "REPLAYED_REQUEST"
            else:
                self._add(ak, nonce, ts, index, position)
                return {}
        return self._refuse(code, index, n)

    def _refuse(self, code: str, index: int, n: int) -> dict[str, Any]:
        self.refused[code] += 1
        self._skip_entry, self.skip_left = index, n
        return {"refused": code}

    def take_skip(self, index: int, position: int) -> bool:
        """Whether the body at ``position`` of entry ``index`` belongs to a refused request."""
        if self.skip_left <= 0 or index != self._skip_entry:
            return False
        self.skip_left -= 1
        with self._lock:
            self._skipped[position] = None
            while len(self._skipped) > SKIPPED_MAX:
                del self._skipped[next(iter(self._skipped))]
        return True

    def is_skipped(self, position: int) -> bool:
        return position in self._skipped

    def _add(self, ak: str, nonce: str, ts: int, index: int, position: int) -> None:
        k = self._keys.get(ak)
        if k is None:
            k = self._keys[ak] = KeyNonces()
        k.seen[nonce] = ts
        heapq.heappush(k.by_time, (ts, nonce))
        heapq.heappush(self._by_time, (ts, ak, nonce))
        self._order.append((index, position, ak, nonce))
        if len(k.seen) > self.per_key_max:
            k.floor_ms = max(k.floor_ms, k.by_time[0][0])
            k.drop_through(k.floor_ms)

    def _horizon(self) -> int:
        """Entries stamped before this are forgotten (the module doc: two windows behind ``M``)."""
        return self._m - 2 * self.window_ms

    def _age(self) -> None:
        horizon = self._horizon()
        heap = self._by_time
        while heap and heap[0][0] < horizon:
            t, ak, n = heapq.heappop(heap)
            k = self._keys.get(ak)
            if k is not None and k.seen.get(n) == t:
                del k.seen[n]
                if not k.seen and k.floor_ms < horizon:
                    del self._keys[ak]

    def _live(self, ak: str, nonce: str) -> bool:
        k = self._keys.get(ak)
        return k is not None and nonce in k.seen

    # -- durability (the apply thread) ----------------------------------------------------------------
    def checkpoint(self) -> dict[str, Any]:
        """What the snapshot and a state entry keep (the remembered entries are re-read from the log)."""
        with self._lock:
            self._age()
            order = self._order
            while order and not self._live(order[0][2], order[0][3]):
                order.popleft()
            live = sum(len(k.seen) for k in self._keys.values())
            if len(order) > 2 * live + 1024:  # entries dropped behind a live front: compact
                self._order = order = collections.deque(e for e in order if self._live(e[2], e[3]))
            horizon = self._horizon()
            return {
                "m": self._m,
                "floors": {ak: k.floor_ms for ak, k in self._keys.items() if k.floor_ms >= horizon},
                "from_index": order[0][0] if order else 0,
                "from_position": order[0][1] if order else 0,
                "skipped": list(self._skipped),
            }

    def begin_restore(self, checkpoint: Mapping[str, Any] | None) -> tuple[int, int] | None:
        """Start again from ``checkpoint``; returns the log index and position to re-add nonce records
        from (None: nothing to re-add)."""
        with self._lock:
            self._keys.clear()
            self._by_time.clear()
            self._order.clear()
            self.skip_left = 0
            cp = checkpoint or {}
            self._m = int(cp.get("m", 0))
            for ak, floor in dict(cp.get("floors") or {}).items():
                self._keys.setdefault(str(ak), KeyNonces()).floor_ms = int(floor)
            self._skipped = dict.fromkeys(int(p) for p in cp.get("skipped") or [])
            from_index = int(cp.get("from_index", 0))
            return (from_index, int(cp.get("from_position", 0))) if from_index > 0 else None

    def restore_add(self, cmd: Mapping[str, Any], index: int, position: int) -> None:
        """A nonce record of the log being re-read: kept when the checkpoint's floors and ``M`` keep it
        (an entry they exclude was refused or forgotten before the checkpoint)."""
        ak, nonce, ts, now = cmd.get("ak"), cmd.get("nonce"), cmd.get("ts"), cmd.get("now")
        if not (isinstance(ak, str) and isinstance(nonce, str) and _is_int(ts) and _is_int(now)):
            return
        if ts > now + self.future_ms or ts < now - self.window_ms:  # refused at its apply
            return
        with self._lock:
            k = self._keys.get(ak)
            if ts < self._horizon() or (k is not None and (ts <= k.floor_ms or nonce in k.seen)):
                return
            self._add(ak, nonce, ts, index, position)

    def forget_skipped_before(self, position: int) -> None:
        """Retention removed the log below ``position``: its skipped bodies need no memory."""
        with self._lock:
            for p in [p for p in self._skipped if p < position]:
                del self._skipped[p]


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


class ReplayGuardedNode(DLedgerNode):
    """The broker's node: the first append of a signed request carries its nonce (module doc).
    ``leader_ms``: the broker's wall clock in ms (the injected clock's)."""

    def __init__(self, *args: Any, leader_ms: Callable[[], int], **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.leader_ms = leader_ms

    async def append(self, bodies: Sequence[bytes], timeout_s: float = 3.0) -> list[BodyLocation]:
        signed = SIGNED.get()
        if signed is None or signed.carried or not bodies:
            return await super().append(bodies, timeout_s)
        signed.carried = True  # a request's later appends (and tasks it started) carry nothing
        record = nonce_command(signed.header, self.leader_ms(), len(bodies))
        locs = await super().append([record, *bodies], timeout_s)
        verdict = locs[0].result
        if isinstance(verdict, dict) and verdict.get("refused"):
            code = str(verdict["refused"])
            raise AuthError(401, code, _MESSAGES.get(code, "refused by the replicated nonce window"))
        return locs[1:]
