"""``dledger-cluster replace``'s planning (pure parts; the command against real processes: the slow
tests/broker/test_replace_replica.py)."""

from __future__ import annotations

from dledger.apps.cluster_plan import ProcessInfo
from dledger.apps.cluster_replace import new_peer_id, rewrite_conf, swap_in_list


def _proc(nid: str) -> ProcessInfo:
    return ProcessInfo(name=f"RaftNode00-{nid}", group="RaftNode00", node_id=nid, pid=0, conf="c", host="h",
                       raft_port=1, http_port=2, log="l")


def test_the_new_id_is_the_groups_next_and_never_a_replaced_one() -> None:
    members = [_proc("n0"), _proc("n1"), _proc("n3")]
    assert new_peer_id(members, [], "RaftNode00") == ("n4", 4)
    replaced = [{"group": "RaftNode00", "node_id": "n5"}, {"group": "RaftNode01", "node_id": "n9"}]
    assert new_peer_id(members, replaced, "RaftNode00") == ("n6", 6)


def test_the_dead_replicas_entry_is_replaced_in_place() -> None:
    # in place: the broker id (place in dLegerPeers + 1) of every other replica stays the same
    assert swap_in_list("n0-h:1;n1-h:2;n2-h:3", "n1", "n3-h:4") == "n0-h:1;n3-h:4;n2-h:3"
    assert swap_in_list("n0-h:1", "n7", "n3-h:4") == "n0-h:1;n3-h:4"
    text = (
        "# generated\ndLegerPeers=n0-h:1;n1-h:2;n2-h:3\ndLegerSelfId=n0\nlistenPort=10\n"
        "brokerPeerClientAddrs=n0-h:11;n1-h:12;n2-h:13\n"
    )
    out = rewrite_conf(text, {"dLegerSelfId": "n3", "dLegerLearner": "true"}, "n2", "n3", "h:4", "h:14")
    assert "dLegerPeers=n0-h:1;n1-h:2;n3-h:4\n" in out
    assert "brokerPeerClientAddrs=n0-h:11;n1-h:12;n3-h:14\n" in out
    assert "dLegerSelfId=n3\n" in out and out.endswith("dLegerLearner=true\n") and out.startswith("# generated\n")
