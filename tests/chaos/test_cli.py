"""The ``chaos`` command's usage errors and prerequisites (no cluster is started here)."""

from __future__ import annotations

from typing import Any

import pytest

import chaos.toxi
from chaos.cli import main
from chaos.runner import audit_available
from chaos.toxi import ToxiproxyMissing, find_server_binary


def test_faults_lists_every_name(capsys: Any) -> None:
    assert main(["faults"]) == 0
    out = capsys.readouterr().out.split()
    assert "kill-leader" in out and "partition-bridge" in out and "latency-raft" in out


@pytest.mark.parametrize(("argv", "message"), [
    (["--faults", "kill-everyone"], "unknown fault 'kill-everyone'"),
    (["--faults", " , "], "names no fault"),
    (["--faults", "kill-leader", "--interval", "30", "--duration", "50"], "must hold one fault and one heal"),
    (["--faults", "latency", "--toxic", "latency.speed=3"], "bad toxic parameter"),
    (["--faults", "latency", "--producers", "2", "--keyed-producers", "3"], "cannot exceed"),
    (["--faults", "kill-leader,suspend-random+kill-random", "--crash-gate", "all"], "needs a crash-* fault"),
])
def test_run_usage_errors_exit_2_before_starting_anything(tmp_path: Any, capsys: Any, argv: list[str],
                                                          message: str) -> None:
    assert main(["run", "--dir", str(tmp_path / "r"), "--no-audit", *argv]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_a_run_without_the_audit_installed_needs_no_audit(tmp_path: Any, capsys: Any, monkeypatch: Any) -> None:
    import chaos.cli

    assert audit_available()  # installed here (the spark extra); pretend it is not
    monkeypatch.setattr(chaos.cli, "audit_available", lambda: False)
    assert main(["run", "--dir", str(tmp_path / "r"), "--faults", "kill-leader"]) == 2
    assert "--no-audit" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_a_missing_toxiproxy_is_a_clear_error_not_a_skip(tmp_path: Any, capsys: Any, monkeypatch: Any) -> None:
    monkeypatch.setattr(chaos.toxi, "BUNDLED_SERVER", str(tmp_path / "nowhere" / "toxiproxy-server"))
    monkeypatch.delenv("TOXIPROXY_SERVER", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ToxiproxyMissing, match=r"bash \.ci/setup\.sh"):
        find_server_binary()
    assert main(["run", "--dir", str(tmp_path / "r"), "--faults", "partition-leader", "--no-audit"]) == 2
    assert "Toxiproxy server is not installed" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_drill_on_a_directory_without_a_cluster(tmp_path: Any, capsys: Any) -> None:
    assert main(["drill", "--rounds", "1", "--dir", str(tmp_path)]) == 2
    assert "no cluster recorded" in capsys.readouterr().err


def test_bad_numbers_are_refused_by_the_parser(tmp_path: Any) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["run", "--dir", str(tmp_path), "--faults", "latency", "--interval", "0"])
    assert exc.value.code == 2
    with pytest.raises(SystemExit):
        main(["drill", "--port-base", "65000"])
    for option, value in (("--delayed-share", "1.5"), ("--fail-share", "-0.1"), ("--max-reconsume-times", "17")):
        with pytest.raises(SystemExit) as exc:
            main(["run", "--dir", str(tmp_path), "--faults", "latency", option, value])
        assert exc.value.code == 2
