"""Review findings on the broker that show without a Raft group: the apply/read race of the store,
NameServer registration with one unresponsive NameServer, consumer membership bounds.

Each test fails on the code as reviewed and names the bug, where it is and the fix in its docstring.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import os
import threading
import time
import types
from collections.abc import AsyncIterator, Iterator
from typing import Any

import msgpack
import pytest
from aiohttp.test_utils import TestClient, TestServer

from broker.edge.http_api import BrokerApi
from broker.protocol.errors import ProtocolError
from broker.protocol.routes import BrokerRegistration
from broker.server.registration import Registrar
from broker.service.broker_service import BrokerService
from broker.service.consumers import MAX_GROUPS_PER_CLIENT, ConsumerManager
from broker.serving.http_edge import Guard, Limits
from broker.serving.security import Security
from broker.store.message import StoredMessage, encode_command, encode_message, parse_msg_id
from broker.store.message_store import MessageStore
from dledger import command_codec
from dledger.clock import SYSTEM
from dledger.entry_store import EntryStore
from dledger.node import CommittedEntry
from dledger.records import Refused, to_committed
from tests.dledger.harness import wait_until

MSGPACK = "application/x-msgpack"


# -- a message store over a real entry store, applied by hand ------------------------------------
class _Log:
    """Appends broker records as dledger entries and hands back what the node would apply."""

    def __init__(self, root: str):
        self.es = EntryStore(os.path.join(root, "log"), segment_bytes=1 << 20)
        self.index = 0

    def entry(self, records: list[bytes]) -> CommittedEntry:
        self.index += 1
        self.es.append(self.index, 1, command_codec.encode_batch(records))
        return to_committed(self.es.read(self.index), self.es)


def _message(topic: str, body: bytes, uid: str) -> bytes:
    return encode_message(
        StoredMessage(
            topic=topic, queue_id=0, flag=0, tags="", keys=("k1",), properties={}, born_ts=1,
            born_host="h", store_ts=1, unique_id=uid, body=body,
        )
    )


@pytest.fixture
def store(tmp_path: Any) -> Iterator[tuple[MessageStore, _Log]]:
    log = _Log(str(tmp_path))
    ms = MessageStore(str(tmp_path / "broker"), "RaftNode00", snapshot_interval_ms=600_000)
    ms.open(log.es)
    try:
        yield ms, log
    finally:
        ms.cqs.close()
        ms.index.close()
        log.es.close()


def _fake_server(ms: MessageStore) -> Any:
    async def wait_for_queue(_topic: str, _qid: int, timeout_s: float, since: int | None = None) -> None:
        await asyncio.sleep(min(timeout_s, 0.01))

    guard = Guard(Limits(client_max_size=1 << 20), lambda code, message: {"code": code, "message": message})
    return types.SimpleNamespace(
        store=ms,
        guard=guard,
        security=Security(None, lambda: 0, guard, scope="broker:C/RaftNode00/n0"),  # ACL off
        counters=collections.Counter(),
        applied_seq=0,
        clock=SYSTEM,
        cfg=types.SimpleNamespace(broker_name="RaftNode00", long_polling_max_ms=30_000),
        wait_for_queue=wait_for_queue,
        metrics=types.SimpleNamespace(  # broker/server/metrics.py's event hooks, not under test here
            sent=lambda *_a: None, pulled=lambda *_a: None, send_failed=lambda *_a: None
        ),
    )


@pytest.fixture
async def api_client(store: tuple[MessageStore, _Log]) -> AsyncIterator[TestClient[Any, Any]]:
    ms, _ = store
    fake = _fake_server(ms)
    client: TestClient[Any, Any] = TestClient(
        TestServer(BrokerApi(fake, BrokerService(fake)).app(), host="127.0.0.1")
    )
    await client.start_server()
    try:
        yield client
    finally:
        await client.close()


async def _pull(client: TestClient[Any, Any], offset: int) -> dict[str, Any]:
    resp = await client.post(
        "/v1/pull",
        data=msgpack.packb({"topic": "T", "queue_id": 0, "offset": offset}),
        headers={"Content-Type": MSGPACK},
    )
    assert resp.status == 200, await resp.read()
    return dict(msgpack.unpackb(await resp.read()))


async def test_pull_never_skips_a_unit_whose_record_is_not_yet_readable(
    store: tuple[MessageStore, _Log], api_client: TestClient[Any, Any]
) -> None:
    """BUG (race tick thread / event loop, invariant 4 + at-least-once delivery): a pull can move a
    consumer *past* a committed message that it never delivered.

    broker/store/message_store.py:177-184 (``apply``) and :219 (``_dispatch``): the consume-queue unit is appended
    (``cq.append`` publishes ``max_offset`` to readers at once) *before* ``applied_end_position`` is
    raised past the record (after the key index puts). In that window a pull on the event loop sees
    the unit, ``MessageStore.read_message`` refuses it (``position >= applied_end_position``,
    broker/store/message_store.py read_message) and ``BrokerApi._read_queue``
    (broker/edge/http_api.py:310-314) takes the MessageNotFound for "removed by retention": it skips the unit
    and answers NO_MATCHED_MSG with ``next_offset`` past it. A consumer that follows next_offset (and commits
    it) never sees that message. The window is real: ``cq.append`` pwrites (releasing the GIL) every 4096
    units, index puts take locks, and the GIL switch interval can hand the loop thread control anywhere in
    between.

    Fix: raise ``applied_end_position`` to the record's end *before* ``cq.append`` (readers then never
    see a unit they cannot read), and in ``_read_queue`` treat MessageNotFound as "removed" only when
    the unit's position is below the log's first retained position (otherwise stop the scan there
    and answer what was read, with next_offset at that unit).
    """
    ms, log = store
    tick = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="fake-tick")  # the store's one applier
    tick.submit(ms.apply, [log.entry([encode_command({"op": "topic.put", "topic": "T", "read_queue_nums": 1,
                                                      "write_queue_nums": 1, "perm": 6})])]).result(5)
    cq = ms.cqs.get_or_create("T", 0)
    published, release = threading.Event(), threading.Event()
    real_append = cq.append

    def append_then_pause(*args: Any) -> int:
        offset = real_append(*args)  # the unit is now visible to readers
        published.set()
        release.wait(5)  # the tick thread loses the CPU here (GIL switch, pwrite, lock wait)
        return offset

    cq.append = append_then_pause  # type: ignore[method-assign,assignment]
    ms._queue_cache[("T", 0)] = cq
    entry = log.entry([_message("T", b"payload", "U1")])
    applying = tick.submit(ms.apply, [entry])
    try:
        assert await asyncio.get_running_loop().run_in_executor(None, published.wait, 5)
        during = await _pull(api_client, 0)
    finally:
        release.set()
        await asyncio.wrap_future(applying)
        tick.shutdown()
    after = await _pull(api_client, 0)
    assert [m["body"] for m in after["messages"]] == [b"payload"], "the message is committed and applied"
    # A pull racing the apply may answer the message or nothing yet, but must not step past it.
    delivered = [m["body"] for m in during["messages"]]
    assert delivered == [b"payload"] or during["next_offset"] == 0, (
        f"pull during apply answered {during['status']} next_offset={during['next_offset']} "
        f"messages={delivered}: a consumer following it skips offset 0 for good"
    )


# -- registration ----------------------------------------------------------------------------------
class _NameServers:
    """A Transport stand-in: 'slow' never answers (the caller's 3 s timeout fires), 'fast' records."""

    def __init__(self) -> None:
        self.fast: list[tuple[float, dict[str, Any]]] = []

    async def call(self, addr: str, method: str, path: str, body: Any, *, timeout_s: float) -> Any:
        if addr == "slow:9876":
            await asyncio.sleep(timeout_s)  # a NameServer that is partitioned / suspended
            raise TimeoutError(f"no answer within {timeout_s} s")
        self.fast.append((time.monotonic(), dict(body)))
        return {}

    async def close(self) -> None:
        pass


async def test_role_change_reaches_a_live_namesrv_within_1s_while_another_hangs() -> None:
    """BUG (invariant 6: "a broker registers at the NameServers with its current role within one
    second of a role change"): one unresponsive NameServer delays the role change at every other.

    broker/server/registration.py:46-61 (``run``/``register_all``): ``run`` registers in rounds;
    ``register_all`` gathers the
    calls to all NameServers and the next round (the one ``trigger`` asked for) starts only when the
    slowest call of the current round ended — up to the 3 s timeout when one NameServer is
    partitioned, suspended or blackholed (chaos faults). A role change that happens while a round
    is in flight reaches the healthy NameServers ~3 s late, so producers keep sending to the old
    leader (NOT_LEADER) for that long.

    Fix: register with each NameServer independently (one task/loop per address, each woken by
    ``trigger`` and each registering the *current* record), so a slow NameServer only delays itself.
    """
    names = _NameServers()
    record = BrokerRegistration("C", "B", 1, "h:1", "FOLLOWER", 1)
    reg = Registrar(("slow:9876", "fast:9876"), lambda: record, period_ms=30_000,
                    transport=names)  # type: ignore[arg-type]
    task = asyncio.create_task(reg.run())
    try:
        await wait_until(lambda: names.fast, 2, "the first registration at the live NameServer", 0.005)
        # the broker becomes leader while the first round still waits on the slow NameServer
        record = BrokerRegistration("C", "B", 0, "h:1", "LEADER", 2)
        changed = time.monotonic()
        reg.trigger()
        with contextlib.suppress(AssertionError):  # the assertion below says how late it was
            await wait_until(lambda: any(b["role"] == "LEADER" for _, b in names.fast), 1.5, "the new role")
        got = [t - changed for t, b in names.fast if b["role"] == "LEADER"]
        assert got and got[0] < 1.0, (
            f"the live NameServer learned the new role after {got[0] if got else '> 1.5'} s "
            "(held up by the unresponsive one)"
        )
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


# -- consumer membership ---------------------------------------------------------------------------
def test_one_client_cannot_join_unbounded_groups() -> None:
    """BUG (invariant 8, memory bounded): ``MAX_GROUPS_PER_CLIENT`` (broker/service/consumers.py:12) is
    defined but never enforced. ``ConsumerManager.heartbeat`` (broker/service/consumers.py:28-36) only bounds the
    number of *clients*; a known client is added to every group named in each heartbeat and never
    removed from groups it no longer names (until 40 s of silence). The API caps one heartbeat at 64
    groups x 1024 topics, but a client that heartbeats repeatedly with new group names (or a buggy
    client regenerating names) grows the table without limit — each membership can hold 1024 topic
    names — and a consumer that switched groups stays a member of the old one, so rebalancing there
    assigns queues to it for up to 40 s.

    Fix: a heartbeat states the client's full membership: remove the client from groups it does not
    name, and refuse (or cap) more than MAX_GROUPS_PER_CLIENT groups per client.
    """
    cm = ConsumerManager()
    for i in range(MAX_GROUPS_PER_CLIENT * 4):
        cm.heartbeat("client-1", [(f"g{i}", "CLUSTERING", ("T",))], now_ms=1_000 + i)
    joined = [g for g in cm.groups() if any(m.client_id == "client-1" for m in cm.members(g, 1_000))]
    assert len(joined) <= MAX_GROUPS_PER_CLIENT, (
        f"one client is a member of {len(joined)} groups (MAX_GROUPS_PER_CLIENT = {MAX_GROUPS_PER_CLIENT})"
    )


# -- state entries (followers re-anchored past retention) -----------------------------------------
def test_state_entry_grouped_with_sends_does_not_drop_their_messages(tmp_path: Any) -> None:
    """BUG (invariant 4; replicas assign the same queue offsets): a follower in needs-state mode that
    loads a ``state`` command skips every *other* body of the entry carrying it.

    broker/store/message_store.py ``apply`` (the ``needs_state_after`` branch, :168-173): after ``_await_state``
    loaded the state it marks the whole entry applied and ``continue``s. But the leader's
    ``_state_entries`` (broker/server/broker_server.py) appends the state with ``node.append``, and the node groups
    concurrent requests into one Raft entry (dledger/node.py ``_append_queued``: group commit), so
    under load the state shares its entry with producers' messages (and offset commits). The leader
    dispatches them; the follower never does: its queue misses those messages for good and every
    later message gets a lower queue offset than on the leader (replicas disagree on offsets and
    msg-by-offset answers).

    Fix: after ``_load_state`` apply the remaining bodies of the state's entry normally (the
    ``state`` command is already a no-op in ``_command``), i.e. fall through to the regular loop for
    that entry instead of ``continue``.
    """
    log = _Log(str(tmp_path))
    topic_put = encode_command({"op": "topic.put", "topic": "T", "read_queue_nums": 1, "write_queue_nums": 1,
                                "perm": 6})
    e1 = log.entry([topic_put])
    e2 = log.entry([_message("T", b"m0", "U0"), _message("T", b"m1", "U1")])
    leader = MessageStore(str(tmp_path / "leader"), "RaftNode00", snapshot_interval_ms=600_000)
    follower = MessageStore(str(tmp_path / "follower"), "RaftNode00", snapshot_interval_ms=600_000)
    leader.open(log.es)
    follower.open(log.es)
    try:
        leader.apply([e1, e2])
        state = leader.capture_state()  # as of index 2
        # the state shares its entry with a concurrent send (group commit)
        e3 = log.entry([encode_command(state), _message("T", b"m2", "U2")])
        leader.apply([e3])
        follower.on_install(2)  # re-anchored at 2: waits for a state entry
        follower.apply([e3])
        assert follower.needs_state_after is None and follower.counters["state_loads"] == 1
        lq, fq = leader.cqs.get("T", 0), follower.cqs.get("T", 0)
        assert lq is not None and fq is not None
        leader_units = [(u.offset, u.position) for u in lq.read(0, 10)]
        follower_units = [(u.offset, u.position) for u in fq.read(0, 10)]
        assert len(leader_units) == 3
        assert follower_units == leader_units, (
            f"follower queue T/0 {follower_units} != leader's {leader_units}: the message sharing the "
            "state's entry was never dispatched on the follower"
        )
    finally:
        for ms in (leader, follower):
            ms.cqs.close()
            ms.index.close()
        log.es.close()


# -- msg ids -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "hexpos", ["-000000000000001", "+00000000000000F", "0x0000000000001F", "0000_0000_0000_1"]
)
def test_msg_id_position_must_be_16_hex_digits(hexpos: str) -> None:
    """BUG (minor, docs/BROKER_API.md: a malformed id is 400 ``INVALID_MSG_ID``):
    broker/store/message.py ``parse_msg_id`` checks only ``len(hexpos) == 16`` and then ``int(hexpos, 16)``,
    which also takes a sign, a ``0x`` prefix and underscores. ``GET /v1/msg/id/RaftNode00:-000000000000001``
    therefore reaches ``_message_at(-1)`` and is answered 410 ``MESSAGE_REMOVED`` ("position -1 was
    removed by retention"); the other forms alias real positions under several ids.

    Fix: require ``re.fullmatch(r"[0-9A-Fa-f]{16}", hexpos)`` before converting.
    """
    with pytest.raises(ProtocolError) as e:
        parse_msg_id(f"RaftNode00:{hexpos}")
    assert e.value.code == "INVALID_MSG_ID"


def test_apply_answers_each_body_of_each_entry_in_slot_order(store: tuple[MessageStore, _Log]) -> None:
    """The results travel with the call (issue 11): ``apply`` returns, per entry, what each body
    produced in slot order — a message's queue offset, a command's result, a ``Refused`` for a record
    it refused (issue 23: it was None, which the send path answered as a success) — which the node
    hands to the append's caller as ``BodyLocation.result``. (They used to go through a shared
    ``store.results`` dict that the send path popped by position; a missing entry read as ``{}``,
    i.e. success.)"""
    ms, log = store
    topic_put = encode_command({"op": "topic.put", "topic": "T", "read_queue_nums": 1, "write_queue_nums": 1,
                                "perm": 6})
    bad_put = encode_command({"op": "no.such.op"})
    e1 = log.entry([topic_put])
    e2 = log.entry([_message("T", b"m0", "U0"), b"?junk", _message("T", b"m1", "U1"), bad_put])
    e3 = log.entry([_message("T", b"m2", "U2")])
    out = ms.apply([e1, e2, e3])
    assert len(out) == 3 and all(r is not None for r in out)
    assert isinstance(out[0][0], dict) and "error" not in out[0][0]  # type: ignore[index]
    r2 = out[1]
    assert r2 is not None and r2[0] == 0 and isinstance(r2[1], Refused) and r2[2] == 1
    assert isinstance(r2[3], dict) and "error" in r2[3]
    assert out[2] == [2]


def test_the_store_is_applied_by_one_thread_only(store: tuple[MessageStore, _Log]) -> None:
    """Thread ownership is enforced, not left to the GIL (issue 11): once a thread applied, another
    one applying or capturing state raises instead of racing it."""
    ms, log = store
    ms.apply([log.entry([_message("T", b"m0", "U0")])])
    errors: list[BaseException] = []

    def other() -> None:
        for call in (lambda: ms.apply([]), ms.capture_state):
            try:
                call()
            except RuntimeError as exc:
                errors.append(exc)

    t = threading.Thread(target=other, name="intruder")
    t.start()
    t.join()
    assert len(errors) == 2 and all("intruder" in str(e) for e in errors)
