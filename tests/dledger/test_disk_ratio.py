"""The disk's used ratio, which decides retention (diskMaxUsedSpaceRatio) and refused writes
(diskSpaceWarningLevelRatio), is df's Use%: blocks reserved for root are neither used nor usable.

Found when CI failed on this machine: its root file system reserves 160 GiB of 252 GiB, so
``(total - available) / total`` read 89-90 % while df showed 70 %, and every test cluster refused
writes with DISK_FULL once the run itself had written a few GiB.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from dledger import durable
from dledger.apps.checkpoint import ApplyCheckpoint
from dledger.node import DLedgerNode
from tests.dledger.harness import InProcCluster, wait_until

GIB_BLOCKS = 1 << 18  # 4 KiB blocks per GiB


class _Statvfs:
    """The figures a file system with a large root reservation reports."""

    def __init__(self, blocks_gib: int, free_gib: int, avail_gib: int):
        self.f_frsize = self.f_bsize = 4096
        self.f_blocks = blocks_gib * GIB_BLOCKS
        self.f_bfree = free_gib * GIB_BLOCKS
        self.f_bavail = avail_gib * GIB_BLOCKS


def _fake_statvfs(monkeypatch: pytest.MonkeyPatch, under: Path, st: _Statvfs) -> None:
    real = os.statvfs

    def statvfs(path: Any) -> Any:
        return st if str(path).startswith(str(under)) else real(path)

    monkeypatch.setattr(os, "statvfs", statvfs)


def test_the_ratio_is_dfs_use_percent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # this machine's root file system at the failed CI run: 252 GiB, 189 free, 28 usable by a writer
    _fake_statvfs(monkeypatch, tmp_path, _Statvfs(252, 189, 28))
    assert durable.disk_used_ratio(str(tmp_path)) == pytest.approx(63 / 91)
    # the default ext4 reservation (5 %): df shows 86 %, which is under the 90 % write limit
    _fake_statvfs(monkeypatch, tmp_path, _Statvfs(100, 19, 14))
    assert durable.disk_used_ratio(str(tmp_path)) == pytest.approx(81 / 95)
    # nothing usable is full, whatever root could still write
    _fake_statvfs(monkeypatch, tmp_path, _Statvfs(100, 5, 0))
    assert durable.disk_used_ratio(str(tmp_path)) == 1.0


class _RealDiskCluster(InProcCluster):
    """The in-process group, but each replica reads its disk itself (nothing injected)."""

    async def start_node(self, node_id: str) -> DLedgerNode:
        s = self.settings(node_id)
        cp = ApplyCheckpoint(os.path.join(s.data_dir, "meta", "apply_checkpoint"))
        node = DLedgerNode(s, cp, clock=self.clocks.get(node_id))
        await node.start()
        self.nodes[node_id] = node
        self.checkpoints[node_id] = cp
        return node


async def test_a_large_root_reservation_does_not_refuse_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 88 % used as df counts it (60 of 68 GiB a writer can have), 92 % by (total - available) / total
    _fake_statvfs(monkeypatch, tmp_path, _Statvfs(100, 40, 8))
    c = _RealDiskCluster(str(tmp_path), overrides={"retention_check_ms": 50})
    await c.start()
    try:
        leader = await c.leader()
        await leader.append([b"accepted at 88 %"])
        # and the same replica does refuse once df's figure passes the limit
        _fake_statvfs(monkeypatch, tmp_path, _Statvfs(100, 40, 5))  # 60 of 65: 92 %
        await wait_until(lambda: leader.disk_full, 10, "the leader to notice the full disk")
    finally:
        await c.stop()
