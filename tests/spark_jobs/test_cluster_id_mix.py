"""Issue 28: the audit refuses (exit 2) a run whose replicas belong to more than one cluster, read
from the cluster ids in the replicas' data directories and in run.json's final statuses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spark_jobs import audit
from spark_jobs.run_dir import RunDir, UsageError
from tests.spark_jobs.test_inputs import skeleton

ID_A, ID_B = "AAAAAAAAAAAAAAAAAAAAAA", "BBBBBBBBBBBBBBBBBBBBBB"


def _run(tmp_path: Path) -> Path:
    root = skeleton(tmp_path / "run")
    (root / "cluster" / "data" / "RaftNode00" / "dledger-n1").mkdir()
    return root


def test_a_run_of_one_cluster_or_without_ids_opens(tmp_path: Path) -> None:
    root = _run(tmp_path)
    RunDir.open(str(root))  # legacy: no ids anywhere
    for n in ("n0", "n1"):
        (root / "cluster" / "data" / "RaftNode00" / f"dledger-{n}" / "cluster_id").write_text(ID_A + "\n")
    (root / "run.json").write_text(json.dumps({"replicas": [{"name": "RaftNode00-n0", "cluster_id": ID_A},
                                                            {"name": "RaftNode00-n1", "cluster_id": None}]}))
    RunDir.open(str(root))


def test_data_directories_of_two_clusters_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = _run(tmp_path)
    (root / "cluster" / "data" / "RaftNode00" / "dledger-n0" / "cluster_id").write_text(ID_A + "\n")
    (root / "cluster" / "data" / "RaftNode00" / "dledger-n1" / "cluster_id").write_text(ID_B + "\n")
    with pytest.raises(UsageError, match="mixes 2 clusters"):
        RunDir.open(str(root))
    assert audit.main([str(root)]) == 2
    err = capsys.readouterr().err
    assert "mixes 2 clusters" in err and ID_A in err and ID_B in err


def test_statuses_of_another_cluster_are_refused(tmp_path: Path) -> None:
    root = _run(tmp_path)
    (root / "cluster" / "data" / "RaftNode00" / "dledger-n0" / "cluster_id").write_text(ID_A + "\n")
    (root / "run.json").write_text(json.dumps({"replicas": [{"name": "RaftNode00-n1", "cluster_id": ID_B}]}))
    with pytest.raises(UsageError, match="RaftNode00-n1 \\(status\\)"):
        RunDir.open(str(root))
