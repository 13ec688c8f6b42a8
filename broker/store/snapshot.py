"""The store's snapshot file (``<store root>/snapshot``): a CRC32 then the msgpack map {version, applied
index, end position, metadata, per-queue max offsets, needs-state anchor, de-duplication window},
replaced atomically. A damaged or unknown-version file reads as None: the store rebuilds from the log."""

from __future__ import annotations

import logging
import zlib
from typing import Any

import msgpack

from dledger.durable import atomic_write

log = logging.getLogger("broker.store")

SNAPSHOT_VERSION = 1


def write_snapshot(path: str, snap: dict[str, Any]) -> None:
    payload = msgpack.packb(snap, use_bin_type=True)
    atomic_write(path, zlib.crc32(payload).to_bytes(4, "little") + payload)


def read_snapshot(path: str) -> dict[str, Any] | None:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    if len(data) < 4 or zlib.crc32(data[4:]) != int.from_bytes(data[:4], "little"):
        log.error("store snapshot %s is damaged: rebuilding consume queues from the log", path)
        return None
    snap = msgpack.unpackb(data[4:], raw=False, strict_map_key=False)
    if not isinstance(snap, dict) or snap.get("version") != SNAPSHOT_VERSION:
        log.error("store snapshot %s has an unknown version: ignored", path)
        return None
    return snap
