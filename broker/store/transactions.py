"""Transactional messages (RocketMQ's half messages, commit / rollback and check-back), with every
state change in the Raft log.

    producer                         leader                              every replica (apply)
    send half ────────────────────▶ append record to RMQ_SYS_TRANS_HALF_TOPIC ─▶ pending += half
    execute_local_transaction
    end(COMMIT) ──────────────────▶ append the real message (+__TXN_HALF_POS) ─▶ first copy of a
                                                                                 pending half: visible,
                                                                                 half -> COMMIT;
                                                                                 otherwise skipped
    end(ROLLBACK) ────────────────▶ append {op: txn.end, rollback} ───────────▶ half -> ROLLBACK
    (nothing, or UNKNOW)            every transactionCheckInterval: halves older
                                    than their immunity: {op: txn.check} ─────▶ checks += 1
                                    and a check request per half to the group's
    long-poll /v1/transaction/checks ◀── producers (bounded queue)
    check_local_transaction ─▶ end(...) as above
                                    checks >= transactionCheckMax:
                                    {op: txn.discard} (logged) ───────────────▶ half -> DISCARDED

Half states: PENDING --commit copy applied--> COMMIT; PENDING --txn.end--> ROLLBACK;
PENDING --txn.discard--> DISCARDED. A resolution is final: a second commit delivers nothing (the copy
is skipped on every replica alike) and is answered with the first one's message; a commit after a
rollback or a discard is refused (``TRANSACTION_ROLLED_BACK`` / ``TRANSACTION_DISCARDED``).

Where the state lives. ``TransactionIndex`` (sqlite on disk, memory bounded however many halves are
pending) is derived from the log alone, on the apply thread, in log order: a half record adds a pending
row; its committed copy, a ``txn.end`` or a ``txn.discard`` resolves it; ``txn.check`` counts a
check-back. It is committed with every store snapshot, stamped with the applied index; one that does
not match the snapshot at start is rebuilt from the log. So a restart or a new leader knows every
pending half, its check count and every resolution: a failover neither exposes a rolled-back message
nor loses a committed one, and the new leader goes on checking back. Resolutions are forgotten once
log retention removed their half (a commit of such a half answers ``TRANSACTION_NOT_FOUND``).

The check count is replicated (a ``txn.check`` command per scan round, before the requests are
handed out), so ``transactionCheckMax`` holds across failovers: a check handed out by a leader that
then died counts, even if no producer ever saw it. A half's age is the leader's wall clock minus the
half's store time (a stored wall timestamp, like the delay of a scheduled message); the scan period
reads the injected monotonic clock.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from broker.protocol.errors import ProtocolError
from broker.protocol.names import is_decimal
from broker.protocol.properties import (
    HALF_TOPIC,
    PROP_CHECK_IMMUNITY,
    PROP_CHECK_TIMES,
    PROP_HALF_POS,
    PROP_PGROUP,
    PROP_REAL_QID,
    PROP_REAL_TOPIC,
    PROP_TRAN_MSG,
)
from broker.store.host import LeaderHost
from broker.store.message import StoredMessage
from broker.store.snapshot_index import SnapshotIndex

if TYPE_CHECKING:
    from dledger.clock import Clock

log = logging.getLogger("broker.transactions")

DEFAULT_TIMEOUT_MS = 6000  # transactionTimeOut
DEFAULT_CHECK_INTERVAL_MS = 60_000  # transactionCheckInterval (RocketMQ 4.9)
DEFAULT_CHECK_MAX = 15  # transactionCheckMax
IMMUNITY_MAX_S = 7 * 86_400
SCAN_MAX = 2000  # halves checked per scan round (the rest wait for the next round)
CHECK_COMMAND_POSITIONS_MAX = 1000  # positions per txn.check / txn.discard command
QUEUE_MAX_PER_GROUP = 10_000  # check requests waiting for a producer of one group
GROUPS_MAX = 1024
POLL_S = 0.05

COMMIT, ROLLBACK, DISCARDED = "COMMIT", "ROLLBACK", "DISCARDED"


# -- pure: records ----------------------------------------------------------------------------------
def immunity_ms(props: Mapping[str, str], where: str) -> int | None:
    """CHECK_IMMUNITY_TIME_IN_SECONDS of a half (None: the broker's transactionTimeOut)."""
    raw = props.get(PROP_CHECK_IMMUNITY)
    if raw is None:
        return None
    text = raw.strip()
    if not is_decimal(text) or not 0 <= int(text) <= IMMUNITY_MAX_S:  # ASCII digits ('²'.isdigit() holds)
        raise ProtocolError(
            "BAD_REQUEST", f"{where}: {PROP_CHECK_IMMUNITY} must be 0..{IMMUNITY_MAX_S} seconds, got {raw[:40]!r}", 400
        )
    return int(text) * 1000


def to_half(m: StoredMessage, group: str) -> StoredMessage:
    """The half record of ``m``: stored in the half topic, its real topic and queue in properties."""
    props = dict(m.properties)
    props.update(
        {PROP_REAL_TOPIC: m.topic, PROP_REAL_QID: str(m.queue_id), PROP_TRAN_MSG: "true", PROP_PGROUP: group}
    )
    return m._replace(topic=HALF_TOPIC, queue_id=0, properties=props)


def committed_copy(half: StoredMessage, position: int, store_ts: int, queue_nums: int) -> StoredMessage:
    """The message a commit makes visible: the half's body, keys, tags, unique id and properties (with
    TRAN_MSG and PGROUP), in its real topic and queue, pointing back at the half."""
    props = dict(half.properties)
    topic = props.pop(PROP_REAL_TOPIC)
    qid = int(props.pop(PROP_REAL_QID, "0")) % max(1, queue_nums)
    props[PROP_HALF_POS] = str(position)
    return half._replace(topic=topic, queue_id=qid, properties=props, store_ts=store_ts)


@dataclasses.dataclass(frozen=True)
class Half:
    """A pending half message as the index knows it."""

    position: int
    size: int
    group: str
    topic: str
    store_ms: int
    immunity_ms: int | None
    checks: int


@dataclasses.dataclass(frozen=True)
class Resolution:
    state: str  # COMMIT, ROLLBACK or DISCARDED
    copy_position: int | None  # the committed message (COMMIT)
    queue_offset: int | None


def split_due(due: Sequence[Half], check_max: int) -> tuple[list[Half], list[Half]]:
    """(to check back, to discard): a half checked ``check_max`` times already is discarded."""
    check = [h for h in due if h.checks < check_max]
    discard = [h for h in due if h.checks >= check_max]
    return check, discard


class CheckScheduler:
    """When the leader scans for halves to check back: at once when it becomes leader (``reset``),
    then every ``interval_ms`` by the injected monotonic clock (seconds, as ``Clock.monotonic``)."""

    def __init__(self, interval_ms: int):
        self.interval_s = interval_ms / 1000
        self._last: float | None = None

    def reset(self) -> None:
        self._last = None

    def due(self, now_s: float) -> bool:
        if self._last is None or now_s - self._last >= self.interval_s:
            self._last = now_s
            return True
        return False


# -- the replicated index ------------------------------------------------------------------------------
class TransactionIndex(SnapshotIndex):
    """Pending halves and resolutions of one replica (sqlite; changed on the apply thread, committed
    with the store's snapshots; read by the leader's check service and the API)."""

    def __init__(self, path: str):
        super().__init__(
            path,
            (
                "CREATE TABLE IF NOT EXISTS half (position INTEGER PRIMARY KEY, size INTEGER NOT NULL,"
                " grp TEXT NOT NULL, topic TEXT NOT NULL, store_ms INTEGER NOT NULL, immunity_ms INTEGER,"
                " checks INTEGER NOT NULL)",
                "CREATE INDEX IF NOT EXISTS half_age ON half (store_ms, position)",
                "CREATE TABLE IF NOT EXISTS resolved (position INTEGER PRIMARY KEY, state TEXT NOT NULL,"
                " copy_position INTEGER, queue_offset INTEGER)",
            ),
            ("half", "resolved"),
        )
        self.counters = {"halves": 0, "committed": 0, "rolled_back": 0, "discarded": 0, "second_copies": 0}

    # -- reads (any thread) ---------------------------------------------------------------------------
    def half(self, position: int) -> Half | None:
        with self._lock:
            row = self._db.execute(f"SELECT {_HALF_COLS} FROM half WHERE position = ?", (position,)).fetchone()
        return Half(*row) if row else None

    def resolution(self, position: int) -> Resolution | None:
        with self._lock:
            row = self._db.execute(
                "SELECT state, copy_position, queue_offset FROM resolved WHERE position = ?", (position,)
            ).fetchone()
        return Resolution(*row) if row else None

    def due(self, now_ms: int, timeout_ms: int, limit: int) -> list[Half]:
        """Pending halves whose immunity (their own, or ``timeout_ms``) has passed by ``now_ms``."""
        with self._lock:
            rows = self._db.execute(
                f"SELECT {_HALF_COLS} FROM half WHERE store_ms + COALESCE(immunity_ms, ?) <= ?"
                " ORDER BY store_ms, position LIMIT ?",
                (timeout_ms, now_ms, limit),
            ).fetchall()
        return [Half(*r) for r in rows]

    def pending(self, *, group: str | None = None, topic: str | None = None, limit: int = 100) -> list[Half]:
        where, args = [], []
        if group is not None:
            where.append("grp = ?")
            args.append(group)
        if topic is not None:
            where.append("topic = ?")
            args.append(topic)
        clause = (" WHERE " + " AND ".join(where)) if where else ""
        with self._lock:
            rows = self._db.execute(
                f"SELECT {_HALF_COLS} FROM half{clause} ORDER BY store_ms, position LIMIT ?", (*args, limit)
            ).fetchall()
        return [Half(*r) for r in rows]

    def pending_count(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT count(*) FROM half").fetchone()[0])

    # -- applying (the store's apply thread, in log order) ---------------------------------------------
    def on_message(self, position: int, size: int, topic: str, props: Mapping[str, str], store_ts: int) -> bool:
        """Account one applied message record; False: a commit of a half that is not pending (a second
        commit, or one after a rollback): skip it."""
        if topic == HALF_TOPIC:
            self._add_half(position, size, props, store_ts)
            return True
        raw = props.get(PROP_HALF_POS)
        if raw is None:
            return True
        try:
            half_position = int(raw)
        except ValueError:
            return False
        with self._lock:
            taken = self._db.execute("DELETE FROM half WHERE position = ?", (half_position,)).rowcount > 0
            if taken:
                self._db.execute(
                    "INSERT OR REPLACE INTO resolved (position, state, copy_position, queue_offset)"
                    " VALUES (?, ?, ?, NULL)",
                    (half_position, COMMIT, position),
                )
        if taken:
            self.counters["committed"] += 1
        else:
            self.counters["second_copies"] += 1
        return taken

    def on_dispatched(self, copy_position: int, props: Mapping[str, str], queue_offset: int) -> None:
        """Record the queue offset a committed message got (answers a second commit)."""
        raw = props.get(PROP_HALF_POS)
        if raw is None:
            return
        with self._lock:
            self._db.execute(
                "UPDATE resolved SET queue_offset = ? WHERE position = ? AND copy_position = ?",
                (queue_offset, int(raw), copy_position),
            )

    def _add_half(self, position: int, size: int, props: Mapping[str, str], store_ts: int) -> None:
        group, topic = props.get(PROP_PGROUP), props.get(PROP_REAL_TOPIC)
        if not group or not topic:
            log.error("half message at position %d has no producer group or real topic: not tracked", position)
            return
        try:
            immunity = immunity_ms(props, "half")
        except ProtocolError:
            immunity = None
        with self._lock:
            self._db.execute(
                f"INSERT OR REPLACE INTO half ({_HALF_COLS}) VALUES (?, ?, ?, ?, ?, ?, 0)",
                (position, size, group, topic, store_ts, immunity),
            )
        self.counters["halves"] += 1

    def on_command(self, cmd: Mapping[str, Any]) -> dict[str, Any]:
        """Apply ``txn.end`` (rollback), ``txn.check`` or ``txn.discard``; the result travels back to
        the appender."""
        op = cmd.get("op")
        positions = [p for p in (cmd.get("positions") or ()) if isinstance(p, int)][:CHECK_COMMAND_POSITIONS_MAX]
        if op == "txn.end":
            position = cmd.get("position")
            if not isinstance(position, int) or cmd.get("state") != ROLLBACK:
                return {"outcome": "BAD_COMMAND"}
            return self._resolve(position, ROLLBACK)
        if op == "txn.check":
            with self._lock:
                n = sum(
                    self._db.execute("UPDATE half SET checks = checks + 1 WHERE position = ?", (p,)).rowcount
                    for p in positions
                )
            return {"checked": n}
        if op == "txn.discard":
            n = sum(1 for p in positions if self._resolve(p, DISCARDED)["outcome"] == DISCARDED)
            return {"discarded": n}
        return {"outcome": "BAD_COMMAND"}

    def _resolve(self, position: int, state: str) -> dict[str, Any]:
        with self._lock:
            taken = self._db.execute("DELETE FROM half WHERE position = ?", (position,)).rowcount > 0
            if taken:
                self._db.execute(
                    "INSERT OR REPLACE INTO resolved (position, state, copy_position, queue_offset)"
                    " VALUES (?, ?, NULL, NULL)",
                    (position, state),
                )
                self.counters["rolled_back" if state == ROLLBACK else "discarded"] += 1
                return {"outcome": state}
            row = self._db.execute("SELECT state FROM resolved WHERE position = ?", (position,)).fetchone()
        return {"outcome": "RESOLVED", "state": row[0]} if row else {"outcome": "NOT_FOUND"}

    # -- retention, snapshots, rebuilds ---------------------------------------------------------------
    def forget_before(self, first_position: int) -> list[Half]:
        """Log retention removed everything below ``first_position``: resolutions of those halves are
        forgotten; pending halves there can never be read again (returned, for the caller to log)."""
        with self._lock:
            lost = [
                Half(*r)
                for r in self._db.execute(f"SELECT {_HALF_COLS} FROM half WHERE position < ?", (first_position,))
            ]
            self._db.execute("DELETE FROM resolved WHERE position < ?", (first_position,))
        return lost

    def rebuild(self, records: Iterable[tuple[int, bytes]], applied_index: int) -> None:
        """Derive the index from the log's records (position order)."""
        from broker.store.message import COMMAND_MAGIC, MESSAGE_MAGICS
        from broker.store.record_rules import admit_command, admitted_header

        self.reset()
        for position, body in records:  # what applying refused (broker/store/record_rules.py) is skipped
            if body[:1] in MESSAGE_MAGICS:
                h = admitted_header(body)
                if h is not None:
                    self.on_message(position, len(body), h.topic, h.properties, h.store_ts)
            elif body[:1] == COMMAND_MAGIC:
                cmd, _refused = admit_command(body)
                if cmd is not None and str(cmd.get("op", "")).startswith("txn."):
                    self.on_command(cmd)
        self.commit(applied_index)
        log.info("transaction index rebuilt from the log: %d halves pending", self.pending_count())

    def rows(self) -> dict[str, list[list[Any]]]:
        """The whole index (for a state entry)."""
        with self._lock:
            return {
                "half": [list(r) for r in self._db.execute(f"SELECT {_HALF_COLS} FROM half")],
                "resolved": [list(r) for r in self._db.execute(f"SELECT {_RESOLVED_COLS} FROM resolved")],
            }

    def load_rows(self, rows: Mapping[str, Any], applied_index: int) -> None:
        self.reset()
        with self._lock:
            self._db.executemany(
                f"INSERT OR REPLACE INTO half ({_HALF_COLS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
                [tuple(r) for r in rows.get("half") or ()],
            )
            self._db.executemany(
                "INSERT OR REPLACE INTO resolved (position, state, copy_position, queue_offset) VALUES (?, ?, ?, ?)",
                [tuple(r) for r in rows.get("resolved") or ()],
            )
        self.commit(applied_index)



_HALF_COLS = "position, size, grp, topic, store_ms, immunity_ms, checks"
_RESOLVED_COLS = "position, state, copy_position, queue_offset"


# -- check requests waiting for producers (the event loop) ----------------------------------------------
@dataclasses.dataclass(frozen=True)
class CheckRequest:
    position: int
    topic: str
    view: dict[str, Any]  # the half as the API shows it, with the real topic/queue and check times


class CheckQueue:
    """Check requests per producer group, handed out through long polls (``take``). Bounded: at most
    ``QUEUE_MAX_PER_GROUP`` per group (more wait for the next scan round); a request for a half that
    has been resolved meanwhile is dropped when handed out."""

    def __init__(self) -> None:
        self._queues: dict[str, dict[int, CheckRequest]] = {}
        self._waiters: dict[str, set[asyncio.Future[None]]] = {}

    def offer(self, group: str, requests: Iterable[CheckRequest]) -> int:
        q = self._queues.get(group)
        if q is None:
            if len(self._queues) >= GROUPS_MAX:
                return 0
            q = self._queues[group] = {}
        n = 0
        for r in requests:
            if len(q) >= QUEUE_MAX_PER_GROUP:
                break
            q[r.position] = r
            n += 1
        for fut in self._waiters.pop(group, ()):
            if not fut.done():
                fut.set_result(None)
        return n

    def clear(self) -> None:
        """Leadership lost: the new leader checks these back itself."""
        self._queues.clear()
        self.wake_all()

    def wake_all(self) -> None:
        for waiters in self._waiters.values():
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)
        self._waiters.clear()

    def queued(self) -> int:
        return sum(len(q) for q in self._queues.values())

    def _pop(
        self, group: str, topics: frozenset[str], max_count: int, pending: Callable[[int], bool]
    ) -> list[CheckRequest]:
        q = self._queues.get(group)
        if not q:
            return []
        out: list[CheckRequest] = []
        for position in list(q):
            r = q[position]
            if r.topic not in topics:
                continue
            del q[position]
            if pending(position):
                out.append(r)
                if len(out) >= max_count:
                    break
        if not q:
            del self._queues[group]
        return out

    async def take(
        self, group: str, topics: frozenset[str], max_count: int, wait_s: float, *,
        pending: Callable[[int], bool], monotonic: Callable[[], float], stopping: Callable[[], bool],
    ) -> list[CheckRequest]:
        """Up to ``max_count`` requests of ``group`` for ``topics``, waiting at most ``wait_s`` (read
        on ``monotonic``; woken by ``offer``, and at least every 0.5 s to notice ``stopping``)."""
        deadline = monotonic() + wait_s
        while True:
            got = self._pop(group, topics, max_count, pending)
            remaining = deadline - monotonic()
            if got or remaining <= 0 or stopping():
                return got
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            waiters = self._waiters.setdefault(group, set())
            waiters.add(fut)
            try:
                await asyncio.wait_for(fut, min(remaining, 0.5))
            except TimeoutError:
                pass
            finally:
                waiters.discard(fut)


# -- the leader's check-back service ----------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class TransactionPolicy:
    timeout_ms: int = DEFAULT_TIMEOUT_MS
    check_interval_ms: int = DEFAULT_CHECK_INTERVAL_MS
    check_max: int = DEFAULT_CHECK_MAX


class CheckStore(Protocol):
    """What the check-back service reads of the message store (``MessageStore`` is one)."""

    @property
    def txn(self) -> TransactionIndex: ...
    def read_message(self, position: int, size: int | None = None) -> StoredMessage: ...


class NamedBroker(Protocol):
    @property
    def broker_name(self) -> str: ...


class CheckHost(LeaderHost, Protocol):
    """What the check-back service uses of the replica it runs on (``BrokerServer`` is one)."""

    clock: Clock

    @property
    def store(self) -> CheckStore: ...
    @property
    def cfg(self) -> NamedBroker: ...


class TransactionService:
    """One per broker: scans and hands out check-backs while this replica is the ready leader."""

    def __init__(self, server: CheckHost, policy: TransactionPolicy):
        self.s = server
        self.policy = policy
        self.scheduler = CheckScheduler(policy.check_interval_ms)
        self.queue = CheckQueue()
        self.counters = {"scans": 0, "checks_sent": 0, "discarded": 0, "lost": 0, "ends": 0}
        self._leading_term = -1

    @property
    def index(self) -> TransactionIndex:
        return self.s.store.txn

    def _leading(self) -> bool:
        node = self.s.node
        if not (node.role == "LEADER" and self.s.ready):
            if self._leading_term != -1:
                self._leading_term = -1
                self.queue.clear()
            return False
        if self._leading_term != node.term:
            self._leading_term = node.term
            self.scheduler.reset()  # a new leader checks back at once
        return True

    async def run(self) -> None:
        while True:
            await asyncio.sleep(POLL_S)
            if self.s.stopping:
                self.queue.wake_all()
                return
            if not self._leading() or not self.scheduler.due(self.s.clock.monotonic()):
                continue
            try:
                await self.scan_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # not leader any more, timeouts: the next round retries
                log.info("transaction check round interrupted: %s", exc)

    async def scan_once(self) -> tuple[int, int]:
        """One round: discard halves checked ``check_max`` times, count and hand out checks for the
        other halves past their immunity. Returns (checks handed out, halves discarded)."""
        self.counters["scans"] += 1
        due = self.index.due(self.s.wall_ms(), self.policy.timeout_ms, SCAN_MAX)
        to_check, to_discard = split_due(due, self.policy.check_max)
        for chunk in _chunks([h.position for h in to_discard]):
            result = await self._append_command({"op": "txn.discard", "positions": chunk})
            self.counters["discarded"] += int(result.get("discarded", 0))
        for h in to_discard:
            log.error(
                "transaction half message %s:%016X of group %s, topic %s, discarded after %d check-backs "
                "without an answer (transactionCheckMax)",
                self.s.cfg.broker_name, h.position, h.group, h.topic, h.checks,
            )
        requests: dict[str, list[CheckRequest]] = {}
        readable: list[Half] = []
        for h in to_check:
            try:
                m = self.s.store.read_message(h.position, h.size)
            except Exception as exc:  # removed by retention, damaged: it can never be checked
                log.error("transaction half at position %d cannot be read (%s): discarded", h.position, exc)
                self.counters["lost"] += 1
                await self._append_command({"op": "txn.discard", "positions": [h.position]})
                continue
            readable.append(h)
            requests.setdefault(h.group, []).append(CheckRequest(h.position, h.topic, self._view(m, h)))
        for chunk in _chunks([h.position for h in readable]):
            await self._append_command({"op": "txn.check", "positions": chunk})  # counted before handed out
        sent = 0
        for group, reqs in requests.items():
            sent += self.queue.offer(group, reqs)
        self.counters["checks_sent"] += sent
        return sent, len(to_discard)

    def _view(self, m: StoredMessage, h: Half) -> dict[str, Any]:
        from broker.store.message import message_view

        props = {k: v for k, v in m.properties.items() if k not in (PROP_REAL_TOPIC, PROP_REAL_QID)}
        props[PROP_CHECK_TIMES] = str(h.checks + 1)
        real = m._replace(topic=h.topic, queue_id=int(m.properties.get(PROP_REAL_QID, "0")),
                                   properties=props)
        view = message_view(real, broker_name=self.s.cfg.broker_name, position=h.position, size=h.size,
                            queue_offset=None)
        view["queue_offset"] = -1  # not in a queue (yet)
        view["check_times"] = h.checks + 1
        view["transaction_id"] = m.unique_id
        return view

    async def _append_command(self, cmd: dict[str, Any]) -> dict[str, Any]:
        from broker.store.message import encode_command

        locs = await self.s.node.append([encode_command(cmd)], timeout_s=self.s.send_timeout_s)
        result = locs[0].result  # a refusal (logged and listed by the store) counts as nothing done
        return result if isinstance(result, dict) else {}

    def status(self) -> dict[str, Any]:
        return {
            "pending": self.index.pending_count(),
            "queued_checks": self.queue.queued(),
            "timeout_ms": self.policy.timeout_ms,
            "check_interval_ms": self.policy.check_interval_ms,
            "check_max": self.policy.check_max,
            **self.counters,
            **self.index.counters,
        }


def _chunks(positions: list[int]) -> Iterable[list[int]]:
    for i in range(0, len(positions), CHECK_COMMAND_POSITIONS_MAX):
        yield positions[i : i + CHECK_COMMAND_POSITIONS_MAX]


def half_fields(props: Mapping[str, str]) -> dict[str, Any]:
    """What a message view shows of a half (mqadmin)."""
    return {"real_topic": props.get(PROP_REAL_TOPIC), "producer_group": props.get(PROP_PGROUP)}
