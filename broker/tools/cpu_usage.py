"""CPU time of processes (Linux ``/proc``), for ``mq-bench produce/consume``: how many CPU seconds
each process of a run spent during it (the brokers, the NameServers and the client itself), and
per message.

``cpu_seconds(pid)`` reads utime + stime from ``/proc/PID/stat`` (user + system time of every thread
of the process, in clock ticks); ``CpuSampler`` takes it before and after a run. Processes come
from a ``dledger-cluster`` directory (its ``cluster.json``), from ``name=pid`` pairs, and the
client is always this process (``CLIENT``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

_TICKS_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of ``pid`` so far, or None (gone, or no /proc)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: the fields after it follow the last ')'.
    fields = raw[raw.rfind(b")") + 2:].split()
    try:
        return (int(fields[11]) + int(fields[12])) / _TICKS_S  # fields 14 and 15 of proc(5)
    except (IndexError, ValueError):
        return None


CLIENT = "client"  # the name this process (the load generator) is reported under


def cluster_processes(root: str, kinds: tuple[str, ...] = ("broker",)) -> dict[str, int]:
    """``name -> pid`` of the processes of these kinds (``broker``, ``namesrv``, ``node``) that
    ``dledger-cluster up --dir ROOT`` recorded."""
    with open(os.path.join(root, "cluster.json")) as f:
        procs: list[dict[str, Any]] = json.load(f)["processes"]
    return {str(p["name"]): int(p["pid"]) for p in procs if p.get("kind") in kinds}


def parse_pids(spec: str) -> dict[str, int]:
    """``n0=123,n1=456`` (or bare pids) -> name -> pid; ValueError for anything else."""
    out: dict[str, int] = {}
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, pid = item.rpartition("=")
        if not pid.isdigit():
            raise ValueError(f"{item!r} is not NAME=PID or PID")
        out[name if sep else pid] = int(pid)
    if not out:
        raise ValueError("no process given")
    return out


class CpuSampler:
    def __init__(self, processes: Mapping[str, int]):
        self.processes = dict(processes)
        self._before: dict[str, float | None] = {}

    def start(self) -> None:
        self._before = {name: cpu_seconds(pid) for name, pid in self.processes.items()}

    def stop(self, messages: int) -> dict[str, dict[str, float | None]]:
        """Per process: CPU seconds during the run and µs per message (None when unreadable)."""
        out: dict[str, dict[str, float | None]] = {}
        for name, pid in self.processes.items():
            before, after = self._before.get(name), cpu_seconds(pid)
            spent = None if before is None or after is None else round(after - before, 3)
            per = None if spent is None or messages <= 0 else round(spent * 1e6 / messages, 1)
            out[name] = {"pid": pid, "cpu_s": spent, "cpu_us_per_msg": per}
        return out
