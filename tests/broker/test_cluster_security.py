"""Issue 10, finding 5 (its file-permission and sample-password part) and the cluster's ACL:
``dledger-cluster up`` turns ACL on, writes its secrets 0600, keeps data 0700/0600, and the tools
pick up the admin credential file; shipped sample peer passwords work only on loopback."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from typing import Any

import pytest

from broker.server.config import parse_broker_config
from dledger.config import ConfigError, load_properties, parse_dledger_config
from dledger.durable import atomic_write, private_dir
from tests.broker.procs import REPO, ProcCluster


def mode(path: str) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_sample_passwords_are_refused_off_loopback() -> None:
    for name in ("broker-n0.conf", "dledger-n0.conf"):
        props = load_properties(os.path.join(REPO, "conf", name))
        parse_dledger_config(props, source=name, extra_known_keys=frozenset(props))  # loopback: accepted
    compose = load_properties(os.path.join(REPO, "conf", "compose", "broker-n0.conf"))
    with pytest.raises(ConfigError) as e:
        parse_broker_config(compose, source="compose/broker-n0.conf", env={})
    assert e.value.key == "dLegerPeerPassword" and "sample" in e.value.message
    local = load_properties(os.path.join(REPO, "conf", "broker-n0.conf"))
    moved = {**local, "dLegerPeers": local["dLegerPeers"].replace("127.0.0.1", "10.0.0.5"), "brokerIP1": "10.0.0.5"}
    with pytest.raises(ConfigError):
        parse_broker_config(moved, source="moved", env={})
    parse_broker_config({**moved, "dLegerPeerPassword": "a-secret-of-our-own"}, source="own", env={})


def test_durable_files_are_private(tmp_path: Any) -> None:
    d = str(tmp_path / "data")
    os.makedirs(d, mode=0o755)
    os.chmod(d, 0o755)
    private_dir(d)
    assert mode(d) == 0o700
    f = os.path.join(d, "snapshot")
    atomic_write(f, b"x")
    assert mode(f) == 0o600


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("DLEDGER_")}
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=60, cwd=REPO,
                          env={**base, **(env or {})})


@pytest.mark.slow
def test_cluster_up_enables_acl_and_keeps_its_files_private(tmp_path: Any) -> None:
    root = str(tmp_path / "run")
    c = ProcCluster(root)
    try:
        c.up()
        assert mode(root) == 0o700
        secrets = [os.path.join(root, "admin-credentials.yml"), os.path.join(root, "conf", "plain_acl.yml"),
                   os.path.join(root, "cluster.json")]
        secrets += [os.path.join(root, "conf", n) for n in os.listdir(os.path.join(root, "conf"))]
        secrets += [os.path.join(root, "logs", n) for n in os.listdir(os.path.join(root, "logs"))]
        for path in secrets:
            assert mode(path) == 0o600, (path, oct(mode(path)))
        for dirpath, _dirnames, filenames in os.walk(os.path.join(root, "data")):
            assert mode(dirpath) & 0o077 == 0, (dirpath, oct(mode(dirpath)))
            for n in filenames:
                assert mode(os.path.join(dirpath, n)) & 0o077 == 0, (dirpath, n, oct(mode(os.path.join(dirpath, n))))
        # the tools: refused without credentials, working with the file `up` wrote
        anonymous = run("broker.tools.mqadmin", "updateTopic", "-c", "DefaultCluster", "-t", "SecT",
                        env={"NAMESRV_ADDR": c.namesrv_addr})
        assert anonymous.returncode == 1 and "NO_CREDENTIALS" in anonymous.stderr, anonymous.stderr
        ok = run("broker.tools.mqadmin", "updateTopic", "-c", "DefaultCluster", "-t", "SecT", env=c.env)
        assert ok.returncode == 0, ok.stderr
        flag = run("broker.tools.mqadmin", "sendMessage", "-t", "SecT", "-p", "x", "--credentials",
                   os.path.join(root, "admin-credentials.yml"), env={"NAMESRV_ADDR": c.namesrv_addr})
        assert flag.returncode == 0, flag.stderr
        os.chmod(os.path.join(root, "admin-credentials.yml"), 0o644)
        loose = run("broker.tools.mqadmin", "clusterList", env=c.env)
        assert loose.returncode == 2 and "chmod 600" in loose.stderr
    finally:
        c.down()
