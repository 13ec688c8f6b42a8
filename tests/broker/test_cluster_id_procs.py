"""Issue 28 with real processes: ``dledger-cluster up`` gives the cluster one id, every broker
reports it in ``/v1/status`` and records it in its data directory; a broker whose data directory
belongs to another cluster exits 2 before it opens anything."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from typing import Any

import pytest

from dledger.cluster_id import check_cluster_id, recorded_cluster_id
from tests.broker.procs import REPO, ProcCluster

ID_A, ID_B = "AAAAAAAAAAAAAAAAAAAAAA", "BBBBBBBBBBBBBBBBBBBBBB"


def test_a_broker_on_another_clusters_data_exits_2(tmp_path: Any) -> None:
    with open(os.path.join(REPO, "conf", "broker-n0.conf")) as f:
        good = f.read()
    conf = tmp_path / "b.conf"
    conf.write_text(good.replace("storePathRootDir=./data/n0", f"storePathRootDir={tmp_path / 'data'}")
                    + f"\nclusterId={ID_B}\n")
    check_cluster_id(str(tmp_path / "data" / "dledger-n0"), ID_A)
    r = subprocess.run([sys.executable, "-m", "broker.server", "-c", str(conf)], capture_output=True, text=True,
                       timeout=60, cwd=REPO)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "belongs to cluster" in r.stderr and ID_A in r.stderr and ID_B in r.stderr


@pytest.mark.slow
def test_cluster_up_gives_every_broker_one_id(tmp_path: Any) -> None:
    c = ProcCluster(str(tmp_path), namesrv=1)
    try:
        c.up()
        with open(os.path.join(str(tmp_path), "cluster.json")) as f:
            cid = json.load(f)["settings"]["cluster_id"]
        assert len(cid) == 22
        for p in c.brokers():
            with urllib.request.urlopen(f"http://{c.addr(p)}/v1/status", timeout=10) as resp:
                assert json.load(resp)["cluster_id"] == cid
            assert recorded_cluster_id(os.path.join(str(tmp_path), "data", p.group, f"dledger-{p.node_id}")) == cid
    finally:
        c.down()
