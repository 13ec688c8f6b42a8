"""``offsets/reset`` (mqadmin resetOffsetByTime) reaches running consumers.

Every applied ``offset.reset`` bumps the (group, topic) reset generation in the replicated
metadata; a commit that carries an older generation was computed before the reset and is refused as
a whole (409 ``OFFSET_RESET``), decided at apply time so every replica decides alike. The push
consumer sends the generation it read with every commit and, when refused or when a periodic check
sees a newer one, restarts the topic's queues from the reset offsets.

Tiers: the state machine alone; the message store (snapshot, state entry); the SDK's offset store
against the real state machine (no sockets); a broker group in this process.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import msgpack
import pytest

from broker.client import PushConsumer
from broker.client.admin import Admin
from broker.client.message import MessageQueue
from broker.client.offset_store import RemoteOffsetStore
from broker.client.transport import ClientError, Transport
from broker.store.message import COMMAND_MAGIC, decode_command, encode_command
from broker.store.message_store import MessageStore
from broker.store.metadata import Metadata
from broker.store.snapshot import read_snapshot
from dledger import command_codec
from dledger.entry_store import EntryStore
from dledger.node import CommittedEntry
from dledger.records import to_committed
from tests.broker.harness import BrokerCluster
from tests.dledger.harness import wait_until

TOPIC = "T"
BROKER = "RaftNode00"
MQ0 = MessageQueue(TOPIC, BROKER, 0)
MQ1 = MessageQueue(TOPIC, BROKER, 1)


def _commit(offsets: dict[int, int], generation: int | None = None, group: str = "g") -> dict[str, Any]:
    cmd: dict[str, Any] = {"op": "offset.commit", "group": group, "topic": TOPIC, "offsets": offsets}
    if generation is not None:
        cmd["reset_generation"] = generation
    return cmd


def _reset(offsets: dict[int, int], group: str = "g") -> dict[str, Any]:
    return {"op": "offset.reset", "group": group, "topic": TOPIC, "offsets": offsets}


# -- the state machine ------------------------------------------------------------------------------
def test_reset_bumps_the_generation_and_a_stale_commit_is_refused_whole() -> None:
    md = Metadata()
    assert md.apply(_commit({0: 10, 1: 10}, 0)) == {"updated": 2, "reset_generation": 0}
    assert md.apply(_reset({0: 2})) == {"updated": 1, "reset_generation": 1}
    assert md.apply(_reset({1: 3})) == {"updated": 1, "reset_generation": 2}
    version = md.version
    # read before the second reset: refused as a whole, the answer carries what to take instead
    refused = md.apply(_commit({0: 11, 1: 1}, 1))
    assert refused == {"refused": "OFFSET_RESET", "reset_generation": 2, "offsets": {0: 2, 1: 3}}
    assert md.group_offsets("g", TOPIC) == {0: 2, 1: 3}
    assert md.version == version  # a refused commit changes nothing
    # the current (or a newer) generation commits as usual, monotonic as ever
    assert md.apply(_commit({0: 5, 1: 1}, 2)) == {"updated": 1, "reset_generation": 2}
    assert md.apply(_commit({1: 4}, 7)) == {"updated": 1, "reset_generation": 2}
    assert md.group_offsets("g", TOPIC) == {0: 5, 1: 4}
    # generations are per (group, topic)
    assert md.reset_generation("other", TOPIC) == 0 and md.reset_generation("g", "U") == 0
    assert md.apply(_commit({0: 1}, 0, group="other"))["updated"] == 1


def test_a_commit_without_a_generation_behaves_as_before() -> None:
    """Old clients send none: a commit is applied even across a reset (and can undo it, as before)."""
    md = Metadata()
    md.apply(_commit({0: 10}))
    md.apply(_reset({0: 0}))
    assert md.apply(_commit({0: 10})) == {"updated": 1, "reset_generation": 1}
    assert md.group_offsets("g", TOPIC) == {0: 10}
    assert "error" in md.apply(_commit({0: 1}, "x"))  # type: ignore[arg-type]  # malformed: skipped


def test_generations_outlive_deletes_and_round_trip_through_snapshots() -> None:
    md = Metadata()
    md.apply({"op": "topic.put", "topic": TOPIC, "read_queue_nums": 2, "write_queue_nums": 2, "perm": 6})
    md.apply(_reset({0: 0}))
    md.apply(_reset({0: 0}, group="h"))
    md.apply({"op": "group.delete", "group": "g"})
    md.apply({"op": "topic.delete", "topic": TOPIC})
    # a consumer that read generation 0 must stay fenced even after its offsets were deleted
    assert md.reset_generation("g", TOPIC) == 1 and md.reset_generation("h", TOPIC) == 1
    snap = md.to_snapshot()
    assert sorted(snap["reset_generations"]) == [["g", TOPIC, 1], ["h", TOPIC, 1]]
    again = Metadata.from_snapshot(msgpack.unpackb(msgpack.packb(snap), raw=False))
    assert again.reset_generations == md.reset_generations
    assert again.apply(_commit({0: 9}, 0))["refused"] == "OFFSET_RESET"
    older = {k: v for k, v in snap.items() if k != "reset_generations"}  # an older broker's snapshot
    assert Metadata.from_snapshot(older).reset_generations == {}


# -- the message store: snapshot and state entry ------------------------------------------------------
class _Log:
    """Appends broker records as dledger entries and hands back what the node would apply."""

    def __init__(self, root: str):
        self.es = EntryStore(os.path.join(root, "log"), segment_bytes=1 << 20)
        self.index = 0

    def entry(self, records: list[bytes]) -> CommittedEntry:
        self.index += 1
        self.es.append(self.index, 1, command_codec.encode_batch(records))
        return to_committed(self.es.read(self.index), self.es)


def _store(root: str, log: _Log) -> MessageStore:
    ms = MessageStore(root, BROKER, snapshot_interval_ms=600_000)
    ms.open(log.es)
    return ms


def _history(log: _Log) -> list[CommittedEntry]:
    topic = encode_command({"op": "topic.put", "topic": TOPIC, "read_queue_nums": 2, "write_queue_nums": 2,
                            "perm": 6})
    return [
        log.entry([topic]),
        log.entry([encode_command(_commit({0: 10, 1: 10}, 0))]),
        log.entry([encode_command(_reset({0: 0, 1: 0}))]),
    ]


def _apply_one(ms: MessageStore, e: CommittedEntry) -> Any:
    """What applying ``e``'s one body produced (the apply's own answer, as the send path reads it)."""
    (produced,) = ms.apply([e])
    assert produced is not None
    return produced[0]


def test_generation_survives_a_store_restart(tmp_path: Any) -> None:
    log = _Log(str(tmp_path))
    root = str(tmp_path / "broker")
    ms = _store(root, log)
    try:
        ms.apply(_history(log))
    finally:
        ms.close()
    snap = read_snapshot(os.path.join(root, "snapshot"))
    assert snap is not None and snap["applied_index"] == 3
    assert snap["metadata"]["reset_generations"] == [["g", TOPIC, 1]]
    again = _store(root, log)  # recovers from the snapshot: nothing is applied again
    try:
        assert again.applied_index() == 3
        assert again.metadata_view().reset_generation("g", TOPIC) == 1
        stale = log.entry([encode_command(_commit({0: 10, 1: 10}, 0))])
        assert _apply_one(again, stale)["refused"] == "OFFSET_RESET"
        assert again.metadata_view().group_offsets("g", TOPIC) == {0: 0, 1: 0}
    finally:
        again.close()
        log.es.close()


def test_generation_travels_in_the_state_entry(tmp_path: Any) -> None:
    """A follower re-anchored past retention takes the leader's metadata from a ``state`` entry: the
    generation comes with it, so it refuses the same stale commits as the leader."""
    log = _Log(str(tmp_path))
    leader = _store(str(tmp_path / "leader"), log)
    follower = _store(str(tmp_path / "follower"), log)
    try:
        leader.apply(_history(log))
        state = leader.capture_state()  # as of index 3
        assert state["metadata"]["reset_generations"] == [["g", TOPIC, 1]]
        follower.on_install(2)  # re-anchored at 2: waits for a state entry
        e_state = log.entry([encode_command(state)])
        leader.apply([e_state])
        follower.apply([e_state])
        assert follower.needs_state_after is None and follower.counters["state_loads"] == 1
        assert follower.metadata_view().reset_generation("g", TOPIC) == 1
        stale = log.entry([encode_command(_commit({0: 7}, 0))])
        fresh = log.entry([encode_command(_commit({1: 4}, 1))])
        on_leader = leader.apply([stale, fresh])
        on_follower = follower.apply([stale, fresh])
        assert on_leader == on_follower  # every replica decides the same
        assert on_follower[0] is not None and on_follower[1] is not None
        assert on_follower[0][0]["refused"] == "OFFSET_RESET"
        assert on_follower[1][0] == {"updated": 1, "reset_generation": 1}
        assert follower.metadata_view().group_offsets("g", TOPIC) == {0: 0, 1: 4}
        assert leader.metadata_view().group_offsets("g", TOPIC) == {0: 0, 1: 4}
    finally:
        leader.close()
        follower.close()
        log.es.close()


# -- the SDK's offset store against the real state machine ---------------------------------------------
class _MetadataBroker:
    """Stands in for the transport: ``/v1/offsets`` answered by a real ``Metadata``, like the broker
    does (reads from ``read_from``, a lagging replica when a test sets one)."""

    def __init__(self) -> None:
        self.md = Metadata()
        self.read_from: Metadata | None = None
        self.commits: list[dict[str, Any]] = []
        self.reads = 0

    async def call(self, addr: str, method: str, path: str, body: Any = None, *, params: Any = None,
                   timeout_s: float | None = None) -> Any:
        assert path == "/v1/offsets"
        if method == "GET":
            self.reads += 1
            md = self.read_from or self.md
            g, t = params["group"], params["topic"]
            return {"offsets": {str(q): o for q, o in md.group_offsets(g, t).items()},
                    "reset_generation": md.reset_generation(g, t)}
        self.commits.append(dict(body))
        result = self.md.apply({"op": "offset.commit", **body})
        if result.get("refused"):
            raise ClientError("OFFSET_RESET", "reset", status=409, addr=addr)
        return result

    def reset(self, offsets: dict[int, int]) -> None:
        self.md.apply(_reset(offsets))


class _Routes:
    async def get(self, topic: str, timeout_s: float | None = None) -> str:
        return topic

    def replicas(self, route: str, broker_name: str) -> list[str]:
        return ["leader"]

    def leader_addr(self, route: str, broker_name: str) -> str:
        return "leader"


def _remote(broker: _MetadataBroker, fencing: bool = True) -> tuple[RemoteOffsetStore, list[tuple[str, str]]]:
    seen: list[tuple[str, str]] = []
    store = RemoteOffsetStore(broker, _Routes(), "g", reset_fencing=fencing,  # type: ignore[arg-type]
                              on_reset=lambda t, b: seen.append((t, b)))
    return store, seen


async def test_remote_store_fences_commits_with_the_generation_it_read() -> None:
    broker = _MetadataBroker()
    broker.md.apply(_commit({0: 10, 1: 10}))
    store, seen = _remote(broker)
    assert await store.fetch(MQ0) == 10 and await store.fetch(MQ1) == 10
    assert store.reset_generation(MQ0) == 0
    store.update(MQ0, 15)
    assert await store.persist() == 1 and broker.commits[-1]["reset_generation"] == 0
    broker.reset({0: 0, 1: 0})
    store.update(MQ0, 20)
    store.update(MQ1, 12)
    assert await store.persist() == 0  # refused: the reset stands
    assert broker.md.group_offsets("g", TOPIC) == {0: 0, 1: 0}
    assert seen == [(TOPIC, BROKER)] and store.stale_keys() == [(TOPIC, BROKER)]
    sent = len(broker.commits)
    assert await store.persist() == 0 and len(broker.commits) == sent  # stale: not even sent again
    store.drop(TOPIC, BROKER, refetch=True)
    assert store.read(MQ0) is None and store.stale_keys() == [(TOPIC, BROKER)]  # fenced until read again
    assert await store.fetch(MQ0) == 0 and await store.fetch(MQ1) == 0
    assert store.reset_generation(MQ0) == 1 and store.stale_keys() == []
    store.update(MQ0, 3)
    assert await store.persist() == 1 and broker.commits[-1]["reset_generation"] == 1
    assert broker.md.group_offsets("g", TOPIC) == {0: 3, 1: 0}
    assert seen == [(TOPIC, BROKER)]


async def test_remote_store_sees_a_reset_by_checking_or_fetching() -> None:
    broker = _MetadataBroker()
    broker.md.apply(_commit({0: 10, 1: 10}))
    store, seen = _remote(broker)
    await store.fetch(MQ0)
    await store.check_generations()
    assert seen == []
    broker.reset({0: 1, 1: 1})
    await store.check_generations()  # nothing dirty, nothing committed: the check finds it
    await store.check_generations()
    assert seen == [(TOPIC, BROKER)]  # told once
    # a queue fetched while another of its broker group is held from an older generation
    store2, seen2 = _remote(broker)
    assert await store2.fetch(MQ1) == 1
    broker.reset({0: 0})
    assert await store2.fetch(MQ0) == 0  # this queue's offset is the reset one...
    assert seen2 == [(TOPIC, BROKER)]  # ...but MQ1's in memory predates the reset
    assert store2.stale_keys() == [(TOPIC, BROKER)] and store2.reset_generation(MQ0) == 1
    # dropped without queues to read again: the generation is forgotten, the next read starts afresh
    store2.drop(TOPIC, BROKER, refetch=False)
    assert store2.stale_keys() == [] and store2.reset_generation(MQ0) is None


async def test_an_answer_from_behind_the_reset_fences_with_its_older_generation() -> None:
    """A replica that has not applied the reset yet answers the offsets from before it: commits of
    what it answered carry its older generation, so the broker refuses them and the reset stands."""
    broker = _MetadataBroker()
    broker.md.apply(_commit({0: 10, 1: 10}))
    lagging = Metadata.from_snapshot(broker.md.to_snapshot())
    broker.reset({0: 0, 1: 0})
    store, seen = _remote(broker)
    assert await store.fetch(MQ0) == 0 and store.reset_generation(MQ0) == 1
    broker.read_from = lagging  # answers generation 0 and the offsets from before the reset
    assert await store.fetch(MQ1) == 10 and store.reset_generation(MQ1) == 0
    store.update(MQ1, 11)
    assert await store.persist() == 0 and broker.commits[-1]["reset_generation"] == 0
    assert broker.md.group_offsets("g", TOPIC) == {0: 0, 1: 0}
    assert seen == [(TOPIC, BROKER)]


async def test_without_fencing_commits_carry_no_generation() -> None:
    """The pull consumer's store: the generation is only reported; commits are not fenced."""
    broker = _MetadataBroker()
    broker.md.apply(_commit({0: 10}))
    store, seen = _remote(broker, fencing=False)
    assert await store.fetch(MQ0) == 10 and store.reset_generation(MQ0) == 0
    broker.reset({0: 0})
    store.update(MQ0, 11)
    assert await store.persist() == 1 and "reset_generation" not in broker.commits[-1]
    assert broker.md.group_offsets("g", TOPIC) == {0: 11}
    assert await store.fetch(MQ0) == 11 and store.reset_generation(MQ0) == 1
    assert seen == [] and store.stale_keys() == []


# -- a broker group in this process ------------------------------------------------------------------
@pytest.fixture
async def cluster(tmp_path: Any) -> AsyncIterator[BrokerCluster]:
    c = BrokerCluster(str(tmp_path))
    await c.start()
    try:
        yield c
    finally:
        await c.stop()


async def _topic(c: BrokerCluster, t: Transport, topic: str, queues: int) -> str:
    leader = await c.wait_writable()
    await t.call(leader.cfg.address, "POST", "/v1/topics",
                 {"topic": topic, "read_queue_nums": queues, "write_queue_nums": queues})
    ns = c.namesrvs[0].addr

    async def routed() -> bool:
        r = await t.call(ns, "GET", f"/v1/routes/{topic}", params={"v": 1})
        return bool(r["queue_datas"] and r["queue_datas"][0]["write_queue_nums"] == queues)

    await wait_until(routed, 5, f"route of {topic}")
    return leader.cfg.address


async def _send(t: Transport, addr: str, topic: str, qid: int, first: int, n: int) -> None:
    await t.call(addr, "POST", "/v1/send", {"topic": topic, "queue_id": qid, "messages": [
        {"body": b"q%d-%04d" % (qid, i)} for i in range(first, first + n)]})


async def _offsets(t: Transport, addr: str, group: str, topic: str) -> dict[str, Any]:
    got = dict(await t.call(addr, "GET", "/v1/offsets", params={"group": group, "topic": topic}))
    assert isinstance(got.pop("topic_epoch"), int)  # the topic's incarnation (tests/broker/test_topic_recreate.py)
    return got


async def _post_json(addr: str, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as s, s.post(f"http://{addr}{path}", json=body) as r:
        return r.status, dict(await r.json())


async def test_raw_api_refuses_a_stale_commit_with_409(cluster: BrokerCluster) -> None:
    t = Transport(timeout_s=5.0)
    try:
        a = await _topic(cluster, t, "RAW", 2)
        r = await t.call(a, "POST", "/v1/offsets", {"group": "g", "topic": "RAW", "offsets": {"0": 5, "1": 5}})
        assert r == {"updated": 2, "reset_generation": 0}
        assert await _offsets(t, a, "g", "RAW") == {"offsets": {"0": 5, "1": 5}, "reset_generation": 0}
        r = await t.call(a, "POST", "/v1/offsets/reset", {"group": "g", "topic": "RAW", "offsets": {"0": 1}})
        assert r == {"offsets": {"0": 1}, "reset_generation": 1}
        # a commit computed from generation 0: refused whole, the body says what to take instead
        status, body = await _post_json(a, "/v1/offsets", {"group": "g", "topic": "RAW",
                                                           "offsets": {"0": 9, "1": 9}, "reset_generation": 0})
        assert status == 409 and body["code"] == "OFFSET_RESET"
        assert body["reset_generation"] == 1 and body["offsets"] == {"0": 1, "1": 5}
        with pytest.raises(ClientError) as e:  # what the SDK sees
            await t.call(a, "POST", "/v1/offsets", {"group": "g", "topic": "RAW", "offsets": {"1": 9},
                                                    "reset_generation": 0})
        assert e.value.code == "OFFSET_RESET" and e.value.status == 409
        assert await _offsets(t, a, "g", "RAW") == {"offsets": {"0": 1, "1": 5}, "reset_generation": 1}
        r = await t.call(a, "POST", "/v1/offsets", {"group": "g", "topic": "RAW", "offsets": {"0": 2},
                                                    "reset_generation": 1})
        assert r == {"updated": 1, "reset_generation": 1}
        r = await t.call(a, "POST", "/v1/offsets", {"group": "g", "topic": "RAW", "offsets": {"0": 3}})
        assert r == {"updated": 1, "reset_generation": 1}  # no generation: as before
        for bad in (True, "1", -1):
            status, body = await _post_json(a, "/v1/offsets", {"group": "g", "topic": "RAW", "offsets": {"0": 4},
                                                               "reset_generation": bad})
            assert (status, body["code"]) == (400, "BAD_REQUEST"), bad
        r = await t.call(a, "POST", "/v1/offsets/reset", {"group": "g", "topic": "RAW", "ts": 0})
        assert r == {"offsets": {"0": 0, "1": 0}, "reset_generation": 2}
        for nid in cluster.brokers:  # every replica applied the same decisions
            async def same(nid: str = nid) -> bool:
                o = await _offsets(t, cluster.addr(nid), "g", "RAW")
                return o == {"offsets": {"0": 0, "1": 0}, "reset_generation": 2}

            await wait_until(same, 10, f"offsets and generation on {nid}")
        # a replica restarted from its store snapshot keeps the generation
        leader = cluster.writable_leader()
        follower = next(nid for nid, b in cluster.brokers.items() if b is not leader)
        store_dir = cluster.config(follower).store_dir
        await cluster.stop_broker(follower)
        snap = read_snapshot(os.path.join(store_dir, "snapshot"))
        assert snap is not None and snap["metadata"]["reset_generations"] == [["g", "RAW", 2]]
        await cluster.start_broker(follower)

        async def kept() -> bool:
            return (await _offsets(t, cluster.addr(follower), "g", "RAW"))["reset_generation"] == 2

        await wait_until(kept, 10, "the generation on the restarted replica")
    finally:
        await t.close()


async def _log_commits(c: BrokerCluster, group: str, topic: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Every offset command of ``group``/``topic`` in the leader's log, with what applying it decided."""
    leader = await c.wait_writable()
    records = await leader.node.run_on_replica_thread(
        lambda: list(leader.store._scan_records(leader.node.applied_index)), 5.0
    )
    md = Metadata()
    out = []
    for position, body in records:
        if body[:1] != COMMAND_MAGIC:
            continue
        cmd = decode_command(body)
        result = md.apply(cmd, position)
        if cmd.get("group") == group and cmd.get("topic") == topic:
            out.append((cmd, result))
    return out


@pytest.mark.parametrize("trigger", ["refused_commit", "periodic_check"])
async def test_running_push_consumer_takes_the_reset(cluster: BrokerCluster, trigger: str) -> None:
    """A consumer that consumed and committed everything; the group is reset to the beginning while it
    runs. It re-delivers from offset 0, and no commit from before the reset lands afterwards.

    ``refused_commit``: new messages make the consumer commit positions from before the reset; the
    broker refuses them (409 ``OFFSET_RESET``), which is what makes it reset (the periodic checks are
    an hour away). ``periodic_check``: nothing is committed; the heartbeat round's check finds the
    newer generation."""
    group, topic, per_queue = "rst_group", "RST", 20
    t = Transport(timeout_s=5.0)
    first: set[tuple[int, int]] = set()
    again: set[tuple[int, int]] = set()
    reset_done = False
    gate = asyncio.Event()

    async def listener(msgs: list[Any], ctx: Any) -> str:
        for m in msgs:
            key = (m.queue_id, m.queue_offset)
            if reset_done and m.queue_offset < per_queue:  # only a restarted queue goes back there
                again.add(key)
                await gate.wait()
            else:
                first.add(key)
        return "CONSUME_SUCCESS"

    quick = trigger == "periodic_check"
    pc = PushConsumer(group, cluster.namesrv_addr, consume_from="FIRST", client_id="rst1", suspend_ms=1000,
                      commit_interval_s=0.1, rebalance_interval_s=3600,
                      heartbeat_interval_s=0.2 if quick else 3600, max_concurrency=64)
    pc.subscribe(topic)
    pc.register_listener(listener)
    try:
        a = await _topic(cluster, t, topic, 2)
        for qid in (0, 1):
            await _send(t, a, topic, qid, 0, per_queue)
        await pc.start()
        everything = {(q, o) for q in (0, 1) for o in range(per_queue)}
        await wait_until(lambda: first >= everything, 20, "the first delivery")
        done = {"0": per_queue, "1": per_queue}

        async def committed() -> bool:
            return (await _offsets(t, a, group, topic))["offsets"] == done

        await wait_until(committed, 10, "offsets committed")
        reset_done = True
        async with Admin(cluster.namesrv_addr) as admin:
            rows = await admin.reset_offset_by_time(group, topic, 0)
        assert [(r.queue_id, r.offset) for r in rows] == [(0, 0), (1, 0)]
        assert (await _offsets(t, a, group, topic))["reset_generation"] == 1
        extra = 5
        if not quick:  # the old positions move on and get committed (with generation 0)
            for qid in (0, 1):
                await _send(t, a, topic, qid, per_queue, extra)
        # the restarted queues deliver offset 0 again and wait there (the listener holds them)
        await wait_until(lambda: {(0, 0), (1, 0)} <= again, 20, "re-delivery from offset 0")
        assert (await _offsets(t, a, group, topic))["offsets"] == {"0": 0, "1": 0}
        mqs = pc.assigned_queues()
        assert len(mqs) == 2 and all(pc.store.read(mq) == 0 for mq in mqs) and pc.store.dirty() == {}
        # commit rounds come and go: the reset point holds
        rounds = 0
        persist = pc.store.persist

        async def counting(*args: Any, **kwargs: Any) -> int:
            nonlocal rounds
            rounds += 1
            return await persist(*args, **kwargs)

        pc.store.persist = counting  # type: ignore[method-assign]
        await wait_until(lambda: rounds >= 3, 10, "three commit rounds")
        assert (await _offsets(t, a, group, topic))["offsets"] == {"0": 0, "1": 0}
        gate.set()
        await wait_until(lambda: again >= everything, 20, "the whole re-delivery")
        end = per_queue + (0 if quick else extra)

        async def caught_up() -> bool:
            return (await _offsets(t, a, group, topic))["offsets"] == {"0": end, "1": end}

        await wait_until(caught_up, 10, "offsets committed after the re-delivery")
    finally:
        gate.set()
        await pc.shutdown()
        await t.close()
    # From the log: after the reset every commit that was applied carried the new generation; the
    # stale ones were refused (and there were some, when new messages moved the old positions).
    history = await _log_commits(cluster, group, topic)
    at = next(i for i, (cmd, _r) in enumerate(history) if cmd["op"] == "offset.reset")
    after = history[at + 1:]
    applied = [cmd for cmd, r in after if "refused" not in r]
    refused = [cmd for cmd, r in after if "refused" in r]
    assert applied and all(cmd.get("reset_generation") == 1 for cmd in applied)
    assert all(cmd.get("reset_generation") == 0 for cmd in refused)
    assert bool(refused) == (not quick)
