"""A chaos run directory (docs/CHAOS.md) as the audit sees it: validated paths and the small files.

``RunDir.open(path)`` checks the layout and raises ``UsageError`` (exit code 2) with a message that
says what is missing; the big inputs (histories, replica files) are only located here and read by
``history`` and ``replica_tables``. ``run.json`` and ``faults.jsonl`` are small and parsed here.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
from typing import Any

__all__ = ["FaultLine", "ReplicaStatus", "RunDir", "UsageError"]


class UsageError(Exception):
    """The run directory or the command line is unusable (exit code 2)."""

    code = "AUDIT_USAGE"


@dataclasses.dataclass(frozen=True, slots=True)
class ReplicaStatus:
    """A replica's final status as ``run.json`` recorded it."""

    group: str
    replica: str
    role: str | None
    term: int | None
    commit_index: int | None
    applied_index: int | None


@dataclasses.dataclass(frozen=True, slots=True)
class FaultLine:
    time_us: int
    fault: str
    action: str  # "apply" | "heal"
    targets: tuple[str, ...]
    detail: dict[str, Any]


@dataclasses.dataclass
class RunDir:
    path: str
    run: dict[str, Any]
    replicas: list[tuple[str, str, str]]  # (group, replica id, path), sorted
    send_files: list[str]
    receipt_files: list[str]
    drain_file: str | None
    faults: list[FaultLine]
    statuses: dict[tuple[str, str], ReplicaStatus]
    warnings: list[str]
    samples_file: str | None = None
    offset_files: list[str] = dataclasses.field(default_factory=list)
    retry_files: list[str] = dataclasses.field(default_factory=list)  # retries-*.jsonl (the retry group's)
    dlq_file: str | None = None  # dlq.jsonl: the retry group's DLQ, read at the end

    @staticmethod
    def check_history(path: str) -> list[str]:
        """The send files of the run directory ``path`` (UsageError when it is none)."""
        path = os.path.abspath(path)
        if not os.path.isdir(path):
            raise UsageError(f"RUN_DIR {path} does not exist or is not a directory")
        send_files = sorted(glob.glob(os.path.join(path, "history", "sends-*.jsonl")))
        if not send_files:
            raise UsageError(
                f"{path} is not a chaos run directory: no history/sends-*.jsonl (see docs/CHAOS.md)"
            )
        return send_files

    @classmethod
    def open(cls, path: str, data_dir: str | None = None) -> RunDir:
        """``data_dir``: where the replicas' directories are (default ``RUN_DIR/cluster/data``;
        ``--from-cluster`` gives the copies it fetched)."""
        path = os.path.abspath(path)
        send_files = cls.check_history(path)
        warnings: list[str] = []
        hist = os.path.join(path, "history")
        receipt_files = sorted(glob.glob(os.path.join(hist, "receipts-*.jsonl")))
        drain = os.path.join(hist, "drain.jsonl")
        drain_file = drain if os.path.isfile(drain) else None
        if drain_file is None:
            warnings.append("no history/drain.jsonl: 'never consumed' is judged on receipts alone")
        if not receipt_files and drain_file is None:
            warnings.append("no receipts and no drain: the 'never consumed' check is skipped")
        data = data_dir or os.path.join(path, "cluster", "data")
        replicas = []
        for d in sorted(glob.glob(os.path.join(data, "*", "dledger-*"))):
            if os.path.isdir(d):
                replicas.append(
                    (os.path.basename(os.path.dirname(d)), os.path.basename(d)[len("dledger-") :], d)
                )
        if not replicas:
            raise UsageError(f"no replica data under {data}/<group>/dledger-<node_id>/ (see docs/CHAOS.md)")
        run = _load_run_json(path, warnings)
        check_one_cluster(run, replicas)
        statuses = _statuses(run)
        faults = _load_faults(os.path.join(path, "faults.jsonl"), warnings)
        samples = os.path.join(hist, "samples.jsonl")
        samples_file = samples if os.path.isfile(samples) else None
        if samples_file is None:
            warnings.append("no history/samples.jsonl: the sampler's checks (committed prefix, offsets) are skipped")
        offset_files = sorted(glob.glob(os.path.join(hist, "offsets-*.jsonl")))
        retry_files = sorted(glob.glob(os.path.join(hist, "retries-*.jsonl")))
        dlq = os.path.join(hist, "dlq.jsonl")
        dlq_file = dlq if os.path.isfile(dlq) else None
        if retry_files and dlq_file is None:
            warnings.append("retry group receipts but no history/dlq.jsonl: the DLQ is taken as empty")
        return cls(
            path, run, replicas, send_files, receipt_files, drain_file, faults, statuses, warnings,
            samples_file, offset_files, retry_files, dlq_file,
        )

    @property
    def max_reconsume_times(self) -> int | None:
        """The retry group's maxReconsumeTimes (run.json ``retry``), None when the run had none."""
        raw = self.run.get("retry")
        value = raw.get("max_reconsume_times") if isinstance(raw, dict) else None
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    @property
    def sampler(self) -> tuple[str, str | None]:
        """(consumer group, topic) whose offsets the sampler read."""
        raw = self.run.get("sampler")
        info: dict[str, Any] = raw if isinstance(raw, dict) else {}
        topic = info.get("topic")
        if not isinstance(topic, str):
            topic = self.topics[0] if self.topics else None
        group = info.get("group")
        return (group if isinstance(group, str) else "chaos_consumer"), topic

    @property
    def drain_errors(self) -> list[str]:
        """Queues the final drain could not read to the end (run.json)."""
        errors = self.run.get("drain_errors")
        return [str(e) for e in errors] if isinstance(errors, list) else []

    @property
    def topics(self) -> list[str]:
        topics = self.run.get("topics")
        if isinstance(topics, list):
            return [t if isinstance(t, str) else str(t.get("topic", t.get("name"))) for t in topics]
        return []


def _load_run_json(path: str, warnings: list[str]) -> dict[str, Any]:
    run_json = os.path.join(path, "run.json")
    if not os.path.isfile(run_json):
        warnings.append("no run.json: commit indexes come from the replicas' meta/raft_commit hints only")
        return {}
    try:
        with open(run_json, encoding="utf-8") as f:
            run = json.load(f)
    except (OSError, ValueError) as exc:
        raise UsageError(f"{run_json} is not valid JSON: {exc}") from None
    if not isinstance(run, dict):
        raise UsageError(f"{run_json} must hold a JSON object")
    return run


CLUSTER_ID_FILE = "cluster_id"  # dledger/cluster_id.py's FILE_NAME (spark_jobs does not import dledger)


def check_one_cluster(run: dict[str, Any], replicas: list[tuple[str, str, str]]) -> None:
    """UsageError when the run's replicas belong to more than one cluster (issue 28): the cluster
    ids recorded in the replicas' data directories and in run.json's final statuses. Replicas
    without an id (legacy) are not compared."""
    seen: dict[str, list[str]] = {}
    for group, node, d in replicas:
        try:
            with open(os.path.join(d, CLUSTER_ID_FILE), "rb") as f:
                cid = f.read(257).decode(errors="replace").strip()
        except OSError:
            continue
        if cid:
            seen.setdefault(cid[:256], []).append(f"{group}-{node} (data)")
    rows = run.get("replicas")
    for row in rows if isinstance(rows, list) else []:
        if isinstance(row, dict) and isinstance(row.get("cluster_id"), str) and row["cluster_id"]:
            seen.setdefault(row["cluster_id"][:256], []).append(f"{row.get('name', '?')} (status)")
    if len(seen) > 1:
        parts = "; ".join(f"{cid}: {', '.join(names[:5])}" for cid, names in sorted(seen.items()))
        raise UsageError(
            f"the run mixes {len(seen)} clusters ({parts}): another cluster answered on this run's ports; "
            "its data cannot be audited as this run's (docs/OPERATIONS.md#cluster-id)"
        )


def _int_or_none(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _statuses(run: dict[str, Any]) -> dict[tuple[str, str], ReplicaStatus]:
    """Final replica statuses: a list (or a name-keyed map) under ``replicas`` (or ``final_status``,
    ``statuses``) of objects with ``group``, ``node_id`` (or a ``name`` like ``RaftNode00-n1``) and
    ``commit_index``; a nested ``status`` object is looked into too."""
    raw: Any = None
    for key in ("replicas", "final_status", "final_statuses", "statuses"):
        if key in run:
            raw = run[key]
            break
    items: list[tuple[str | None, Any]]
    if isinstance(raw, dict):
        items = list(raw.items())
    elif isinstance(raw, list):
        items = [(None, v) for v in raw]
    else:
        return {}
    out: dict[tuple[str, str], ReplicaStatus] = {}
    for name, st in items:
        if not isinstance(st, dict):
            continue
        inner = st.get("status")
        merged = {**(inner if isinstance(inner, dict) else {}), **st}
        name = str(merged.get("name", name or ""))
        group = merged.get("group") or (name.rsplit("-", 1)[0] if "-" in name else None)
        node = merged.get("node_id") or (name.rsplit("-", 1)[1] if "-" in name else None)
        if not group or not node:
            continue
        out[(str(group), str(node))] = ReplicaStatus(
            str(group),
            str(node),
            merged.get("role") if isinstance(merged.get("role"), str) else None,
            _int_or_none(merged.get("term")),
            _int_or_none(merged.get("commit_index")),
            _int_or_none(merged.get("applied_index")),
        )
    return out


def _load_faults(path: str, warnings: list[str]) -> list[FaultLine]:
    if not os.path.isfile(path):
        return []
    out: list[FaultLine] = []
    bad = 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                d = json.loads(line)
                t = d["time_us"]
                if not isinstance(t, int) or d.get("action") not in ("apply", "heal"):
                    raise ValueError("time_us must be an int and action apply|heal")
                targets = d.get("targets") or []
                out.append(
                    FaultLine(
                        t,
                        str(d.get("fault", "?")),
                        d["action"],
                        tuple(map(str, targets)),
                        d.get("detail") if isinstance(d.get("detail"), dict) else {},
                    )
                )
            except (ValueError, KeyError, TypeError):
                bad += 1
    if bad:
        warnings.append(f"faults.jsonl: {bad} unreadable line(s) skipped")
    out.sort(key=lambda fl: fl.time_us)
    return out
