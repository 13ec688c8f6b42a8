"""The cluster id (issue 28): which cluster a replica belongs to, like Kafka's ``cluster.id``.

``dledger-cluster up`` makes one random id per cluster directory (``new_cluster_id``) and writes
``clusterId=<id>`` into every config it generates. A replica started with an id records it in its
data directory (``cluster_id``, next to ``meta``) at first start and refuses to start when its
config's id and the recorded one differ (``check_cluster_id``): a data directory never serves
another cluster. Peers carry the id in their handshake (``dledger.peer_tcp``); brokers carry it in
their NameServer registrations. A replica without an id (legacy) records nothing and checks nothing.
"""

from __future__ import annotations

import base64
import os
import secrets

from dledger.durable import FILE_MODE, atomic_write
from dledger.records import DLedgerError

FILE_NAME = "cluster_id"
_MAX_FILE_BYTES = 256


class ClusterIdMismatch(DLedgerError):
    """The data directory belongs to another cluster than the config says."""


def new_cluster_id() -> str:
    """16 random bytes as 22 base64url characters (no padding)."""
    return base64.urlsafe_b64encode(secrets.token_bytes(16)).rstrip(b"=").decode()


def recorded_cluster_id(data_dir: str) -> str | None:
    """The id recorded in ``data_dir``, or None if none was (a new or a legacy data directory)."""
    try:
        with open(os.path.join(data_dir, FILE_NAME), "rb") as f:
            raw = f.read(_MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        return None
    text = raw.decode(errors="replace").strip()
    if len(raw) > _MAX_FILE_BYTES or not text:
        raise ClusterIdMismatch(f"{os.path.join(data_dir, FILE_NAME)} is not a cluster id file")
    return text


def check_cluster_id(data_dir: str, cluster_id: str) -> None:
    """Record ``cluster_id`` in ``data_dir`` on first use; ClusterIdMismatch if another is recorded."""
    recorded = recorded_cluster_id(data_dir)
    if recorded is None:
        os.makedirs(data_dir, exist_ok=True)
        atomic_write(os.path.join(data_dir, FILE_NAME), cluster_id.encode() + b"\n")
        os.chmod(os.path.join(data_dir, FILE_NAME), FILE_MODE)
        return
    if recorded != cluster_id:
        raise ClusterIdMismatch(
            f"the data directory {data_dir} belongs to cluster {recorded!r}, the config says clusterId={cluster_id}: "
            "refusing to start (a data directory never serves another cluster; point storePathRootDir at this "
            "cluster's data or fix clusterId)"
        )
