"""The compose files' three groups (issue 27, part 1; docker-compose.yml, profile ``fleet``) without
a Docker engine: the secrets docker/make_secrets.py writes make every replica's config readable by
the broker's parser, each group with its own peer password and ACL account; the compose services,
their published ports, the configs and the chaos target's table (chaos/compose.py) agree."""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Any

import yaml

from broker.server.config import load_broker_config
from broker.serving.acl import parse_acl
from chaos.compose import FLEET_GROUPS

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def make_secrets_module() -> Any:
    spec = importlib.util.spec_from_file_location("make_secrets", os.path.join(REPO, "docker", "make_secrets.py"))
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("make_secrets", mod)
    spec.loader.exec_module(mod)
    return mod


def test_secrets_for_three_groups_make_configs_the_broker_reads(tmp_path: Any) -> None:
    ms = make_secrets_module()
    run = tmp_path / "run"
    ms.make(str(run), None)
    acl = parse_acl((run / "plain_acl.yml").read_text())
    passwords: dict[str, set[str]] = {}
    for group, services in ms.GROUPS.items():
        for svc in services:
            text = (run / f"broker-{svc}.conf").read_text().replace(f"{ms.MOUNT}/", f"{run}/")
            (tmp_path / f"{svc}.conf").write_text(text)
            cfg = load_broker_config(tmp_path / f"{svc}.conf")
            assert cfg.dledger.group == group
            assert [p.host for p in cfg.dledger.peers] == services  # the group's own containers
            passwords.setdefault(group, set()).add(cfg.dledger.peer_password)
            assert cfg.dledger.peer_password != "compose-dev-only-change-me"
        account = acl.accounts[f"{group}-broker"]
        assert account.broker_names == {group} and not account.admin
    assert all(len(p) == 1 for p in passwords.values()), "a group's replicas share one peer password"
    assert len({next(iter(p)) for p in passwords.values()}) == 3, "each group has its own"


def test_compose_services_ports_and_the_chaos_table_agree() -> None:
    with open(os.path.join(REPO, "docker-compose.yml")) as f:
        compose = yaml.safe_load(f)
    services = compose["services"]
    for group, nodes in FLEET_GROUPS.items():
        for nid, (svc, port) in nodes.items():
            s = services[svc]
            assert s["ports"] == [f"127.0.0.1:{port}:{port}"]
            assert s["environment"]["HEALTH_URL"] == f"https://127.0.0.1:{port}/v1/status"
            assert s.get("profiles", []) == ([] if group == "RaftNode00" else ["fleet"])
            assert f"{svc}-data" in compose["volumes"]
            with open(os.path.join(REPO, "conf", "compose", f"broker-{svc}.conf")) as c:
                props = dict(line.split("=", 1) for line in c.read().splitlines() if "=" in line and line[0] != "#")
            assert props["brokerName"] == props["dLegerGroup"] == group and props["dLegerSelfId"] == nid
            assert props["listenPort"] == str(port)
            assert f"{nid}-127.0.0.1:{port}" in props["brokerPeerClientAddrs"].split(";")
