"""The Helm chart docker/helm/dledger-mq (issue 27, part 6; docs/OPERATIONS.md, "Kubernetes").

No Kubernetes cluster runs on these machines, so this checks what can be checked without one:
``helm lint``; ``helm template`` renders the objects the issue asks for (a StatefulSet of three per
group with stable peer names and a volume per replica, a PodDisruptionBudget of minAvailable 2, the
readiness probe in HEALTH_MODE=ready, NameServer Deployments with Services, Secrets for the peer
passwords, ACL and TLS); the rendered configuration, completed per pod by the chart's launch script,
is read by the project's own config parsers; the TLS certificate covers every name a client or peer
dials; bad values stop the render with a message. helm is built by .ci/setup.sh (Go module proxy).
"""

from __future__ import annotations

import base64
import os
import subprocess
from typing import Any

import pytest
import yaml
from cryptography import x509

from broker.server.config import load_broker_config
from broker.serving.acl import parse_acl
from namesrv.config import load_namesrv_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHART = os.path.join(REPO, "docker", "helm", "dledger-mq")
HELM = os.path.join(REPO, ".ci", "bin", "helm")

pytestmark = pytest.mark.slow  # needs the helm binary .ci/setup.sh builds


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    if not os.access(HELM, os.X_OK):
        pytest.fail(f"{HELM} is missing: run `bash .ci/setup.sh` (it builds helm from the Go module proxy)")
    r = subprocess.run([HELM, *args], capture_output=True, text=True, timeout=120, cwd=REPO, check=False)
    if check and r.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed ({r.returncode}): {r.stderr[-3000:]}")
    return r


def render(*sets: str, namespace: str = "mq") -> list[dict[str, Any]]:
    args = ["template", "rel", CHART, "--namespace", namespace]
    for s in sets:
        args += ["--set", s]
    docs = [d for d in yaml.safe_load_all(helm(*args).stdout) if d]
    return docs


def by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def secret_data(secret: dict[str, Any]) -> dict[str, str]:
    return {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}


def test_helm_lint_default_and_three_groups() -> None:
    for sets in ([], ["broker.groups=3", "namesrv.count=2"], ["tls.enabled=false", "acl.enabled=false"]):
        args = ["lint", CHART, "--strict"]
        for s in sets:
            args += ["--set", s]
        r = helm(*args)
        assert "0 chart(s) failed" in r.stdout, r.stdout


def test_rendered_objects_for_three_groups_on_two_namesrvs() -> None:
    docs = render("broker.groups=3", "namesrv.count=2")
    sts, pdb, svc = by_kind(docs, "StatefulSet"), by_kind(docs, "PodDisruptionBudget"), by_kind(docs, "Service")
    deps, cms, secrets = by_kind(docs, "Deployment"), by_kind(docs, "ConfigMap"), by_kind(docs, "Secret")
    groups = [f"RaftNode0{g}" for g in range(3)]
    names = [f"rel-dledger-mq-raftnode0{g}" for g in range(3)]
    assert sorted(sts) == names and sorted(pdb) == names
    for name, group in zip(names, groups, strict=True):
        s = sts[name]["spec"]
        assert s["replicas"] == 3 and s["podManagementPolicy"] == "Parallel"
        assert s["serviceName"] == f"{name}-peers" and svc[f"{name}-peers"]["spec"]["clusterIP"] == "None"
        assert svc[f"{name}-peers"]["spec"]["publishNotReadyAddresses"] is True
        assert svc[f"{name}-peers"]["spec"]["selector"]["dledger-mq/group"] == group
        assert s["selector"]["matchLabels"]["dledger-mq/group"] == group
        [claim] = s["volumeClaimTemplates"]
        assert claim["metadata"]["name"] == "data" and claim["spec"]["accessModes"] == ["ReadWriteOnce"]
        [c] = s["template"]["spec"]["containers"]
        assert {"name": "data", "mountPath": "/var/lib/dledger"} in c["volumeMounts"]
        assert c["readinessProbe"]["exec"]["command"][:2] == ["env", "HEALTH_MODE=ready"]
        assert "HEALTH_MODE" not in " ".join(c["livenessProbe"]["exec"]["command"])
        env = {e["name"]: e for e in c["env"]}
        assert env["PEER_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "rel-dledger-mq-peer", "key": group}
        assert env["BROKER_SECRET_KEY"]["valueFrom"]["secretKeyRef"]["key"] == f"{group}-secret-key"
        assert pdb[name]["spec"]["minAvailable"] == 2
        assert pdb[name]["spec"]["selector"]["matchLabels"]["dledger-mq/group"] == group
        conf = cms[name]["data"]["broker.conf"]
        assert f"brokerName={group}" in conf and f"dLegerGroup={group}" in conf
    ns_names = ["rel-dledger-mq-namesrv-0", "rel-dledger-mq-namesrv-1"]
    assert sorted(deps) == ns_names
    for n in ns_names:
        assert deps[n]["spec"]["replicas"] == 1 and n in svc
    assert "rel-dledger-mq-namesrv" in svc  # every NameServer behind one name, for clients
    peer = secret_data(secrets["rel-dledger-mq-peer"])
    assert sorted(peer) == groups and len(set(peer.values())) == 3 and all(len(p) >= 32 for p in peer.values())
    assert {"rel-dledger-mq-acl", "rel-dledger-mq-tls", "rel-dledger-mq-tls-ca"} <= set(secrets)


def test_a_pod_s_config_as_the_launch_script_completes_it_is_read_by_the_parsers(tmp_path: Any) -> None:
    """What a broker pod starts with: the group's broker.conf plus the per-pod lines of
    launch-broker.sh, with the chart's ACL and TLS files where the pod mounts them."""
    docs = render("broker.groups=2", "namesrv.count=2")
    cms, secrets = by_kind(docs, "ConfigMap"), by_kind(docs, "Secret")
    sts = by_kind(docs, "StatefulSet")["rel-dledger-mq-raftnode01"]
    [c] = sts["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    acl, tls = secret_data(secrets["rel-dledger-mq-acl"]), secret_data(secrets["rel-dledger-mq-tls"])
    files = {"acl/plain_acl.yml": acl["plain_acl.yml"], "tls/tls.crt": tls["tls.crt"],
             "tls/tls.key": tls["tls.key"], "tls/ca.crt": tls["ca.crt"],
             "conf/broker.conf": cms["rel-dledger-mq-raftnode01"]["data"]["broker.conf"],
             "launch/launch-broker.sh": cms["rel-dledger-mq-launch"]["data"]["launch-broker.sh"],
             "ns/namesrv.conf": cms["rel-dledger-mq-namesrv"]["data"]["namesrv.conf"]}
    etc = tmp_path / "etc"
    for rel, text in files.items():
        (etc / rel).parent.mkdir(parents=True, exist_ok=True)
        (etc / rel).write_text(text.replace("/etc/dledger/", f"{etc}/"))
    run = tmp_path / "run"
    run.mkdir()
    peer = secret_data(secrets["rel-dledger-mq-peer"])["RaftNode01"]
    r = subprocess.run(["/bin/sh", str(etc / "launch/launch-broker.sh")], capture_output=True, text=True, timeout=30,
                       check=False, env={"PATH": os.environ["PATH"], "HOSTNAME": "rel-dledger-mq-raftnode01-2",
                                         "PEER_DOMAIN": env["PEER_DOMAIN"], "PEER_PASSWORD": peer,
                                         "BROKER_ACCESS_KEY": acl["RaftNode01-access-key"],
                                         "BROKER_SECRET_KEY": acl["RaftNode01-secret-key"],
                                         "DLEDGER_RUN_DIR": str(run),
                                         "DLEDGER_GROUP_CONF": str(etc / "conf/broker.conf"),
                                         "DLEDGER_BROKER": "true"})
    assert r.returncode == 0, r.stderr
    assert oct((run / "broker.conf").stat().st_mode & 0o777) == "0o600"  # it holds the secrets
    cfg = load_broker_config(run / "broker.conf")
    domain = "rel-dledger-mq-raftnode01-peers.mq.svc.cluster.local"
    assert env["PEER_DOMAIN"] == domain
    assert cfg.dledger.group == "RaftNode01" and cfg.dledger.self_id == "n2"
    assert [(p.id, p.host, p.port) for p in cfg.dledger.peers] == [
        (f"n{i}", f"rel-dledger-mq-raftnode01-{i}.{domain}", 40911) for i in range(3)]
    assert cfg.dledger.peer_password == peer
    assert cfg.namesrv_addrs == ("rel-dledger-mq-namesrv-0.mq.svc.cluster.local:9876",
                                 "rel-dledger-mq-namesrv-1.mq.svc.cluster.local:9876")
    # a pod outside 0..2 (a StatefulSet scaled by hand) refuses to start
    bad = subprocess.run(["/bin/sh", str(etc / "launch/launch-broker.sh")], capture_output=True, text=True,
                         timeout=30, check=False,
                         env={"HOSTNAME": "rel-dledger-mq-raftnode01-3", "PATH": os.environ["PATH"]})
    assert bad.returncode == 2 and "not replica 0, 1 or 2" in bad.stderr
    ns = load_namesrv_config(etc / "ns/namesrv.conf")
    assert ns.listen_port == 9876
    accounts = parse_acl(acl["plain_acl.yml"]).accounts
    assert accounts["admin"].admin and accounts["RaftNode01-broker"].broker_names == {"RaftNode01"}
    assert accounts["RaftNode01-broker"].secret_key == acl["RaftNode01-secret-key"]
    # the certificate covers every peer and NameServer name, chained to the CA the pods trust
    cert = x509.load_pem_x509_certificate(tls["tls.crt"].encode())
    ca = x509.load_pem_x509_certificate(tls["ca.crt"].encode())
    assert cert.issuer == ca.subject
    dns = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert f"*.{domain}" in dns and "rel-dledger-mq-namesrv-1.mq.svc.cluster.local" in dns
    assert "rel-dledger-mq-namesrv.mq.svc" in dns


@pytest.mark.parametrize(("sets", "message"), [
    (["broker.groups=0"], "broker.groups must be in 1..20"),
    (["namesrv.count=9"], "namesrv.count must be in 1..5"),
    (["podDisruptionBudget.minAvailable=1"], "minAvailable must be 2 or 3"),
])
def test_bad_values_stop_the_render_with_a_message(sets: list[str], message: str) -> None:
    args = ["template", "rel", CHART]
    for s in sets:
        args += ["--set", s]
    r = helm(*args, check=False)
    assert r.returncode != 0 and message in r.stderr, r.stderr


def test_tls_and_acl_off_render_no_secret_mounts() -> None:
    docs = render("tls.enabled=false", "acl.enabled=false")
    assert sorted(by_kind(docs, "Secret")) == ["rel-dledger-mq-peer"]
    [c] = by_kind(docs, "StatefulSet")["rel-dledger-mq-raftnode00"]["spec"]["template"]["spec"]["containers"]
    assert {v["name"] for v in c["volumeMounts"]} == {"data", "run", "tmp", "conf", "launch"}
    conf = by_kind(docs, "ConfigMap")["rel-dledger-mq-raftnode00"]["data"]["broker.conf"]
    assert "tlsEnable" not in conf and "aclEnable" not in conf
