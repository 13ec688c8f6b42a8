"""The sampler: every ``interval_s`` (a few hundred ms), each replica's commit index, term and chain
CRC at its commit index, and the stored offsets of the workload's consumer group, into
``history/samples.jsonl`` (``SampleRecord``).

What the audit does with the samples (docs/CHAOS.md, "Checks"): a replica's committed prefix may
never shrink or change (a later sample, or the replica's final log, must hold every committed
index it reported with the same chain CRC); two replicas reporting one committed index must report
one chain CRC; a replica may not truncate entries while its log already ends in the current term;
stored consumer offsets may never move backwards as the applied index grows.

Every replica is read directly on its own client port (never through a proxy: faults on client
links do not blind the sampler), all replicas of a round concurrently; a replica that does not
answer (killed, suspended, partitioned from nobody but dead) is simply absent from that round. The
offsets are read right after the status, so at an applied index at least the status's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from broker.client.transport import FROM_ENV, ClientError, Transport
from chaos.history import JsonlWriter, SampleRecord, now_us
from chaos.target import Member, Target

log = logging.getLogger(__name__)

SAMPLE_TIMEOUT_S = 1.0


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def sample_from(m: Member, t_us: int, st: dict[str, Any], offsets: dict[str, int] | None) -> SampleRecord:
    """A SampleRecord from one replica's ``GET /v1/status`` answer (pure)."""
    return SampleRecord(
        time_us=t_us, replica=m.name, group=m.group, node_id=m.node_id, pid=_int(st.get("pid")),
        role=st.get("role") if isinstance(st.get("role"), str) else None, term=_int(st.get("term")),
        leader_id=st.get("leader_id") if isinstance(st.get("leader_id"), str) else None,
        commit_index=_int(st.get("commit_index")), applied_index=_int(st.get("applied_index")),
        last_index=_int(st.get("last_index")), last_term=_int(st.get("last_term")),
        chain_crc_at_commit=_int(st.get("chain_crc_at_commit")),
        entries_truncated=_int(st.get("entries_truncated")), offsets=offsets,
    )


class Sampler:
    def __init__(self, target: Target, out: JsonlWriter, *, group: str, topic: str, interval_s: float = 0.25):
        self.target = target
        self.out = out
        self.group = group
        self.topic = topic
        self.interval_s = interval_s
        # the cluster's admin account when ACL is on
        self.transport = Transport(timeout_s=SAMPLE_TIMEOUT_S, credentials=getattr(target, "credentials", FROM_ENV))
        self.samples = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="chaos-sampler")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self.transport.close()
        self.out.flush()

    async def _run(self) -> None:
        next_at = time.monotonic()
        while True:
            await self.round()
            next_at = max(next_at + self.interval_s, time.monotonic())
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))

    async def round(self) -> None:
        members = self.target.members()
        rows = await asyncio.gather(*(self._sample(m) for m in members), return_exceptions=True)
        for row in rows:
            if isinstance(row, SampleRecord):
                self.out.write(row)
                self.samples += 1
            elif isinstance(row, BaseException) and not isinstance(row, ClientError):
                log.warning("sampler: %r", row)
        self.out.flush()

    async def _sample(self, m: Member) -> SampleRecord | None:
        t_us = now_us()
        try:
            st = await self.transport.call(m.control_addr, "GET", "/v1/status", timeout_s=SAMPLE_TIMEOUT_S)
        except ClientError:
            return None
        if not isinstance(st, dict):
            return None
        offsets: dict[str, int] | None = None
        try:
            got = await self.transport.call(m.control_addr, "GET", "/v1/offsets",
                                            params={"group": self.group, "topic": self.topic},
                                            timeout_s=SAMPLE_TIMEOUT_S)
            raw = got.get("offsets") if isinstance(got, dict) else None
            if isinstance(raw, dict):
                offsets = {str(q): int(v) for q, v in raw.items() if _int(v) is not None}
        except ClientError:
            pass  # a replica without the topic yet, or waiting for state: no offsets this round
        return sample_from(m, t_us, st, offsets)
