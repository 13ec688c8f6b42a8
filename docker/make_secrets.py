"""The compose cluster's secrets, made at ``compose.sh up`` (never committed): ``docker/run/``.

    .venv/bin/python docker/make_secrets.py docker/run [--owner 10001]

Writes (files 0600 unless said, the directory 0700; with ``--owner`` chowned to the image's
``dledger`` user so the containers can read them):

- ``tls/ca.pem`` (0644, the CA clients trust), ``tls/server.pem`` (0644), ``tls/server.key``: one
  certificate for every service name (namesrv1, namesrv2, n0..n2, g1n0..g2n2, localhost) and 127.0.0.1;
- ``plain_acl.yml``: an admin account and each group's own account (``brokerNames: [RaftNode00]``,
  and RaftNode01, RaftNode02 for the ``fleet`` profile's groups);
- ``namesrv.conf``, ``broker-n0.conf`` .. ``broker-n2.conf`` and the fleet profile's
  ``broker-g1n0.conf`` .. ``broker-g2n2.conf``: ``conf/compose/*.conf`` with a fresh peer password per
  group instead of the shipped sample, and ACL and TLS on (mounted at /etc/dledger);
- ``admin-credentials.yml`` (owned by the caller): what host tools use
  (``DLEDGER_CREDENTIALS_FILE``), with ``DLEDGER_TLS_CA_FILE=docker/run/tls/ca.pem``.

An existing complete directory is kept (restarts keep their secrets); ``compose.sh down`` removes it.
"""

from __future__ import annotations

import os
import secrets
import sys

import yaml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from broker.serving.certs import make_certs  # noqa: E402

MOUNT = "/etc/dledger"
# broker group -> its services (containers); RaftNode01 and RaftNode02 run with the profile "fleet"
GROUPS = {"RaftNode00": ["n0", "n1", "n2"], "RaftNode01": ["g1n0", "g1n1", "g1n2"],
          "RaftNode02": ["g2n0", "g2n1", "g2n2"]}
SERVICES = ["namesrv1", "namesrv2", *(svc for services in GROUPS.values() for svc in services), "localhost"]
FILES = ["tls/ca.pem", "tls/server.pem", "tls/server.key", "plain_acl.yml", "namesrv.conf",
         *(f"broker-{svc}.conf" for services in GROUPS.values() for svc in services), "admin-credentials.yml"]


def _write(path: str, text: str, mode: int = 0o600) -> None:
    fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    os.chmod(path + ".tmp", mode)
    os.replace(path + ".tmp", path)


def _conf(template: str, password: str | None, extra: dict[str, str]) -> str:
    with open(os.path.join(REPO, "conf", "compose", template)) as f:
        lines = f.read().splitlines()
    out = []
    for line in lines:
        if password is not None and line.startswith("dLegerPeerPassword="):
            line = f"dLegerPeerPassword={password}"
        out.append(line)
    out.append("")
    out.append("# added by docker/make_secrets.py (ACL and TLS on; docs/SECURITY.md)")
    out += [f"{k}={v}" for k, v in extra.items()]
    return "\n".join(out) + "\n"


def make(run: str, owner: int | None) -> None:
    if all(os.path.exists(os.path.join(run, f)) for f in FILES):
        print(f"make_secrets: keeping the secrets in {run}")
        return
    os.makedirs(run, mode=0o700, exist_ok=True)
    os.chmod(run, 0o700)
    make_certs(os.path.join(run, "tls"), SERVICES, ["127.0.0.1"])
    os.chmod(os.path.join(run, "tls"), 0o700)
    admin = ("admin", secrets.token_urlsafe(24))
    brokers = {group: (f"{group}-broker", secrets.token_urlsafe(24)) for group in GROUPS}
    acl = {"accounts": [
        {"accessKey": admin[0], "secretKey": admin[1], "admin": True},
        *({"accessKey": ak, "secretKey": sk, "admin": False, "defaultTopicPerm": "DENY",
           "defaultGroupPerm": "DENY", "brokerNames": [group]} for group, (ak, sk) in brokers.items()),
    ]}
    _write(os.path.join(run, "plain_acl.yml"), yaml.safe_dump(acl, sort_keys=False))
    tls_server = {"tlsEnable": "true", "tlsServerCertPath": f"{MOUNT}/tls/server.pem",
                  "tlsServerKeyPath": f"{MOUNT}/tls/server.key"}
    acl_keys = {"aclEnable": "true", "aclFile": f"{MOUNT}/plain_acl.yml"}
    _write(os.path.join(run, "namesrv.conf"), _conf("namesrv.conf", None, {**acl_keys, **tls_server}))
    for group, services in GROUPS.items():
        password = secrets.token_urlsafe(24)  # one per group: a group's peers share it, no one else
        ak, sk = brokers[group]
        for svc in services:
            extra = {**acl_keys, "brokerAccessKey": ak, "brokerSecretKey": sk, **tls_server,
                     "tlsClientTrustCertPath": f"{MOUNT}/tls/ca.pem"}
            _write(os.path.join(run, f"broker-{svc}.conf"), _conf(f"broker-{svc}.conf", password, extra))
    if owner is not None:  # the containers run as the image's dledger user
        for dirpath, _dirs, files in os.walk(run):
            os.chown(dirpath, owner, owner)
            for name in files:
                os.chown(os.path.join(dirpath, name), owner, owner)
    _write(os.path.join(run, "admin-credentials.yml"),
           yaml.safe_dump({"accessKey": admin[0], "secretKey": admin[1]}, sort_keys=False))
    print(f"make_secrets: wrote TLS certificates, the ACL and the configs into {run}")


def main(argv: list[str]) -> int:
    if not argv or len(argv) not in (1, 3) or (len(argv) == 3 and argv[1] != "--owner"):
        print("usage: make_secrets.py RUN_DIR [--owner UID]", file=sys.stderr)
        return 2
    make(os.path.abspath(argv[0]), int(argv[2]) if len(argv) == 3 else None)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
