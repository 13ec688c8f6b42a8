"""The broker's read-only replica export (``broker/edge/export.py``): which paths it serves, and reads
that never need write access."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from broker.edge.export import exported_path, list_files, read_part
from broker.protocol.errors import ProtocolError


@pytest.mark.parametrize("path", [
    "store/anchor", "store/log/00000000000000000000", "meta/raft_commit", "meta/raft_term", "broker/snapshot",
    "broker/consumequeue/TopicA/3/00000000000000300000", "broker/consumequeue/TopicA/0/min_offset",
])
def test_exported_paths(path: str) -> None:
    assert exported_path(path)


@pytest.mark.parametrize("path", [
    "", "store", "store/log/1", "store/index/00000000000000000000", "../acl.yml", "conf/broker.conf",
    "broker/consumequeue/../0/min_offset", "broker/consumequeue/A/0/../../../../etc", "/etc/passwd",
    "meta/raft_commit/", "store/log/00000000000000000000/../../x", "broker/consumequeue/a b/0/min_offset",
    "broker/snapshot.tmp", "peer.password",
])
def test_other_paths_are_refused(path: str) -> None:
    assert not exported_path(path)
    with pytest.raises(ProtocolError) as e:
        read_part("/nonexistent", path, 0, 10)
    assert (e.value.status, e.value.code) == (400, "BAD_PATH")


def test_list_and_read_a_read_only_replica(tmp_path: Path) -> None:
    files = {"store/anchor": b"A" * 40, "store/log/00000000000000000000": bytes(range(256)) * 10,
             "meta/raft_term": b"t", "broker/consumequeue/T/1/00000000000000000000": b"u" * 56,
             "store/index/00000000000000000000": b"i", "conf.yml": b"secret"}
    for rel, data in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    os.symlink("/etc/hostname", tmp_path / "store" / "log" / "00000000000000000099")
    for d, _dirs, names in os.walk(tmp_path, topdown=False):  # nothing writable: reads must still work
        for n in names:
            if not os.path.islink(os.path.join(d, n)):
                os.chmod(os.path.join(d, n), stat.S_IRUSR)
        os.chmod(d, stat.S_IRUSR | stat.S_IXUSR)
    try:
        listed, more = list_files(str(tmp_path), "", 10)
        assert not more
        assert listed == sorted((r, len(files[r])) for r in files if not r.startswith(("store/index", "conf")))
        page, more = list_files(str(tmp_path), "broker/zzz", 1)
        assert page == [("meta/raft_term", 1)] and more
        data, size = read_part(str(tmp_path), "store/log/00000000000000000000", 250, 20)
        assert (data, size) == ((bytes(range(256)) * 10)[250:270], 2560)
        assert read_part(str(tmp_path), "store/log/00000000000000000000", 5000, 20) == (b"", 2560)
        with pytest.raises(ProtocolError) as e:
            read_part(str(tmp_path), "store/log/00000000000000000099", 0, 10)  # a symlink is not followed
        assert e.value.code == "FILE_GONE"
        with pytest.raises(ProtocolError) as e:
            read_part(str(tmp_path), "store/log/00000000000000000001", 0, 10)
        assert (e.value.status, e.value.code) == (404, "FILE_GONE")
    finally:
        for d, _dirs, _names in os.walk(tmp_path):
            os.chmod(d, stat.S_IRWXU)


def test_from_cluster_usage_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from spark_jobs import audit
    from spark_jobs.source.localcluster import port_free

    assert audit.main([str(tmp_path), "--from-cluster", "127.0.0.1:1"]) == 2
    assert "no history/sends-" in capsys.readouterr().err
    assert not (tmp_path / "audit").exists(), "nothing is written into a directory that is no run"
    (tmp_path / "history").mkdir()
    (tmp_path / "history" / "sends-p0.jsonl").write_text("")
    assert audit.main([str(tmp_path), "--from-cluster", "nohostport"]) == 2
    assert "--from-cluster: bad address 'nohostport'" in capsys.readouterr().err
    creds = tmp_path / "tools.yml"
    creds.write_text("accessKey: a-key\nsecretKey: secret-0123456789\n")
    creds.chmod(0o644)
    assert audit.main([str(tmp_path), "--from-cluster", "127.0.0.1:1", "--credentials", str(creds)]) == 2
    assert "chmod 600" in capsys.readouterr().err
    port = next(p for p in range(31000, 32000) if port_free(p))
    assert audit.main([str(tmp_path), "--from-cluster", f"127.0.0.1:{port}"]) == 2
    err = capsys.readouterr().err
    assert f"--from-cluster 127.0.0.1:{port}:" in err and "CONNECT" in err.upper(), err


@pytest.mark.parametrize("link", ["broker/consumequeue/T", "broker/consumequeue", "broker", "store", "store/log"])
def test_a_symlink_on_any_component_is_refused(tmp_path: Path, link: str) -> None:
    """Issue 23, finding 7: a symlinked *directory* inside the node directory was followed (only the
    file itself was opened O_NOFOLLOW): the export served whatever the link pointed at. Every
    component is now opened without following links, and listing never descends into one."""
    node = tmp_path / "dledger-n0"
    outside = tmp_path / "outside"
    wanted = {"broker/consumequeue/T/0/00000000000000000000": b"secret-cq",
              "store/log/00000000000000000000": b"secret-log"}
    for rel, data in wanted.items():  # the real files live outside the node directory
        p = outside / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    (node / link).parent.mkdir(parents=True, exist_ok=True)
    os.symlink(outside / link, node / link)
    for rel in wanted:
        if rel.startswith(link + "/"):
            with pytest.raises(ProtocolError) as e:
                read_part(str(node), rel, 0, 100)
            assert (e.value.status, e.value.code) == (404, "FILE_GONE"), rel
    listed, _more = list_files(str(node), "", 100)
    assert listed == []
