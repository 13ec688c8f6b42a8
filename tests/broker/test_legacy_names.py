"""Issue 23, finding 1 (c): a store holding a bad name from an older release still starts, registers
the rest of its topics at the NameServers, and lets an admin remove the bad name.

The store is written by the real writers the way a release before issue 23 wrote it: its send-back
appended ``topic.put`` for ``%DLQ%`` + a 200-character group (no length check), the group itself had
been created (groups of up to 255 characters were allowed) and had committed offsets, and the DLQ copy
followed (that record stopped every replica of that release). Then every replica restarts on the
current code, from its snapshot and its log.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker.store.message import StoredMessage, encode_command, encode_message
from broker.tools.mqadmin import main as mqadmin_main
from tests.acl_fixtures import ADMIN
from tests.broker.inproc_cluster import CLUSTER, WAIT_S, InProcBrokerCluster
from tests.dledger.harness import wait_until

OLD_GROUP = "g" * 200
OLD_DLQ = "%DLQ%" + OLD_GROUP  # 205 characters


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[InProcBrokerCluster]:
    baseline = InProcBrokerCluster.baseline()
    c = await InProcBrokerCluster.start(str(tmp_path / "cluster"))
    try:
        yield c
    finally:
        await c.stop()
    await InProcBrokerCluster.assert_nothing_left(baseline)


async def write_an_older_releases_store(cluster: InProcBrokerCluster) -> None:
    g = cluster.groups[0]
    await cluster.create_topic("T", 1)
    await g.put("T", 0, 1, body=b"payload")
    node = g.replica("n0").broker.node
    # what the older release appended (its writers, no name checks), in this order
    await node.append([encode_command({"op": "group.put", "group": OLD_GROUP})])
    await node.append([encode_command({"op": "offset.commit", "group": OLD_GROUP, "topic": "T", "offsets": {0: 1}})])
    await node.append([encode_command({"op": "topic.put", "topic": OLD_DLQ, "read_queue_nums": 1,
                                       "write_queue_nums": 1, "perm": 2})])
    copy = StoredMessage(OLD_DLQ, 0, 0, "", (), {"RETRY_TOPIC": "T", "DLQ_ORIGIN_GROUP": OLD_GROUP}, 1, "h", 2,
                         "U" * 32, b"payload")
    (loc,) = await node.append([encode_message(copy)])
    assert loc.result.code == "RECORD_REFUSED"  # the current code refuses it (the older one stopped there)
    await g.wait_replicated()
    for r in g.replicas:
        md = r.broker.store.metadata_view()
        assert OLD_DLQ in md.topics and OLD_GROUP in md.groups and md.offsets[(OLD_GROUP, "T", 0)] == 1


async def test_a_store_with_an_older_releases_bad_names_starts_registers_and_lets_an_admin_remove_them(
    cluster: InProcBrokerCluster, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    await write_an_older_releases_store(cluster)
    g = cluster.groups[0]
    for r in g.replicas:  # every replica restarts (the whole group was down)
        await g.kill(r.nid)
    for r in g.replicas:
        await g.start(r.nid)
    leader = await g.transfer("n0")
    await g.wait_replicated()
    for r in g.replicas:
        assert r.broker.node.fatal is None
        assert OLD_DLQ in r.broker.store.metadata_view().topics  # kept: replicas never diverge on it
    # registration: the bad name is left out, the rest is routed (a new topic reaches the NameServer)
    await cluster.create_topic("T2", 2)
    status = await cluster.call(leader.addr, "GET", "/v1/status")
    assert status["namesrv"]["errors"] == {} and status["namesrv"]["unroutable_topics"] == [OLD_DLQ]
    assert (await cluster.route("T")) is not None and (await cluster.route(OLD_DLQ[:127])) is None
    # the admin removes both names with the usual commands
    monkeypatch.setenv("DLEDGER_ACCESS_KEY", ADMIN.access_key)
    monkeypatch.setenv("DLEDGER_SECRET_KEY", ADMIN.secret_key)
    n = ["-n", cluster.namesrv_addr]
    capsys.readouterr()
    assert await asyncio.to_thread(mqadmin_main, ["deleteTopic", "-t", OLD_DLQ, "-c", CLUSTER, *n]) == 0
    assert await asyncio.to_thread(mqadmin_main, ["deleteSubGroup", "-g", OLD_GROUP, "-c", CLUSTER, *n]) == 0
    print(capsys.readouterr().out[-2000:])
    await g.wait_replicated()
    for r in g.replicas:  # read back on every replica
        md = r.broker.store.metadata_view()
        assert OLD_DLQ not in md.topics and OLD_GROUP not in md.groups
        assert not [k for k in md.offsets if k[0] == OLD_GROUP]
        assert {"T", "T2"} <= set(md.topics)
    await wait_until(lambda: not leader.broker.registrar.unroutable, WAIT_S, "a registration without the bad name")
    # ... and a new name of that length is still refused
    with pytest.raises(Exception, match="INVALID_GROUP"):
        await cluster.call(leader.addr, "POST", "/v1/groups", {"group": OLD_GROUP})
