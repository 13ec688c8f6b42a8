"""``python -m dledger.apps.store_bench`` runs, reports one fdatasync per durable append, refuses bad
arguments with exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dledger.apps import store_bench


def test_reports_one_fdatasync_per_durable_append(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert store_bench.main(["--appends", "20", "--rounds", "2", "--dir", str(tmp_path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["appends"] == 40 and out["fdatasync_per_append"] == 1.0
    assert out["append_flush_ms"]["p50"] > 0 and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args", [["--appends", "0"], ["--rounds", "-1"], ["--size", "0"]])
def test_bad_arguments_exit_2(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert store_bench.main(args) == 2
    assert "store_bench:" in capsys.readouterr().err
