"""The history lines that show a finding: for every sample row of a failing check, the few lines of
``history/*.jsonl`` (and ``faults.jsonl``) that prove it, read back from the run directory.

Finding rows carry references — a history table's ``file`` stem (``p0``, ``c1``, ``drain``) and
``line`` (the record's place in that file, 0-based), or a sample's ``line`` in ``samples.jsonl`` —
and ``refs`` turns one row of one check into ``Ref``s: a line to quote, or a sentence when the
proof lies in replica files rather than in the history (a replica's consume queue, its log).
``resolve`` reads every quoted line with one sequential pass per file (only the files and lines
asked for, stopping at the last one), so it stays cheap for a 1 M-event history.
"""

from __future__ import annotations

import dataclasses
import os
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["Ref", "refs", "resolve"]

LINE_CHARS_MAX = 600


@dataclasses.dataclass(frozen=True)
class Ref:
    label: str  # what the line is ("send", "receipt before", "sample after", ...)
    path: str | None = None  # relative to the run directory
    line: int | None = None  # 0-based
    text: str | None = None  # a sentence instead of a quoted line, or the quoted line once resolved


def _send(stem: Any) -> str | None:
    return f"history/sends-{stem}.jsonl" if isinstance(stem, str) else None


def _read(stem: Any) -> str | None:
    if not isinstance(stem, str):
        return None
    return "history/drain.jsonl" if stem == "drain" else f"history/receipts-{stem}.jsonl"


SAMPLES = "history/samples.jsonl"


def _line(label: str, path: str | None, line: Any) -> list[Ref]:
    return [Ref(label, path, int(line))] if path is not None and isinstance(line, int) else []


def refs(check: str, row: Mapping[str, Any]) -> list[Ref]:
    """The references that prove one finding row of ``check`` (empty for checks whose rows are
    their own proof: replica comparisons)."""
    r = row
    if check in ("lost", "unseen", "retained_away"):
        out = _line("send", _send(r.get("file")), r.get("line"))
        if check == "lost" and r.get("read_past") and not r.get("consumed"):
            out.append(Ref("reads", text=f"reads of {r.get('broker')} {r.get('topic')}:{r.get('queue_id')} went past "
                                          f"offset {r.get('queue_offset')}, none returned {r.get('unique_id')}"))
        if check == "lost" and not r.get("in_log"):
            out.append(Ref("log", text=f"no committed log of {r.get('broker')} holds {r.get('unique_id')}"))
        return out
    if check == "aborted_read":
        logged = [Ref("log", text=f"the committed log holds {r.get('unique_id')}")] if r.get("in_log") else []
        return [
            *_line("send (fail)", _send(r.get("file")), r.get("line")),
            *_line(f"read ({r.get('read_source')})", _read(r.get("read_file")), r.get("read_line")),
            *logged,
        ]
    if check == "inconsistent_offsets":
        out = []
        for c in r.get("claims") or []:
            src = c.get("source")
            if src == "ack":
                out += _line("ack", _send(c.get("file")), c.get("line"))
            elif src in ("receipt", "drain"):
                out += _line(src, _read(c.get("file")), c.get("line"))
            else:
                out.append(Ref(str(src), text=f"{src}: consume queue unit at offset {r.get('offset')} -> "
                                              f"{c.get('unique_id')}"))
        return out
    if check == "ack_offset_mismatch":
        stored = ", ".join(f"queue {u.get('queue_id')} offset {u.get('offset')}" for u in r.get("stored") or [])
        return [
            *_line("send", _send(r.get("file")), r.get("line")),
            Ref("replica", text=f"replica {r.get('replica')} holds {r.get('unique_id')} at {stored}"),
        ]
    if check == "send_order":
        return _line("earlier send", _send(r.get("file")), r.get("prev_line")) + _line(
            "later send", _send(r.get("file")), r.get("line")
        )
    if check == "poll_order":
        return _line("receipt before", _read(r.get("file")), r.get("prev_line")) + _line(
            "receipt", _read(r.get("file")), r.get("line")
        )
    if check == "corrupt_read":
        if r.get("fault_line") is not None:
            return _line("fault", "faults.jsonl", r.get("fault_line"))
        return _line("send", _send(r.get("send_file")), r.get("send_line")) + _line(
            str(r.get("source")), _read(r.get("file")), r.get("line")
        )
    if check == "offset_regression":
        return _line("sample (higher offset, lower applied index)", SAMPLES, r.get("prev_line")) + _line(
            "sample (lower offset, higher applied index)", SAMPLES, r.get("line")
        )
    if check == "committed_prefix":
        out = _line("sample", SAMPLES, r.get("line"))
        if r.get("later_line") is not None:
            return out + _line("later sample", SAMPLES, r.get("later_line"))
        if r.get("kind") == "shrank":
            final = (
                f"the final log of {r.get('replica')} ends at {r.get('later_last_index')}, before the committed "
                f"index {r.get('commit_index')} the sample reported"
            )
        else:
            final = (
                f"the final log of {r.get('replica')} holds chain CRC {r.get('later_chain_crc')} at index "
                f"{r.get('commit_index')}, where the sample reported {r.get('chain_crc')}"
            )
        return [*out, Ref("final log", text=final)]
    if check == "commit_crc_mismatch":
        return [ref for rep in r.get("reports") or [] for ref in _line("sample", SAMPLES, rep.get("line"))]
    if check in ("nonconflicting_truncation", "elections_without_fault"):
        return _line("sample before", SAMPLES, r.get("prev_line")) + _line("sample", SAMPLES, r.get("line"))
    if check == "drain_incomplete":
        return [Ref("run.json drain_errors", text=str(r.get("error")))]
    return []


def resolve(run_dir: str, wanted: Iterable[Ref]) -> dict[tuple[str, int], str]:
    """The text of every (path, line) in ``wanted``: one sequential read per file, up to its last
    wanted line; lines are cut at LINE_CHARS_MAX characters."""
    by_path: dict[str, set[int]] = defaultdict(set)
    for ref in wanted:
        if ref.path is not None and ref.line is not None:
            by_path[ref.path].add(ref.line)
    out: dict[tuple[str, int], str] = {}
    for path, lines in by_path.items():
        last = max(lines)
        try:
            with open(os.path.join(run_dir, path), encoding="utf-8", errors="replace") as f:
                for k, text in enumerate(f):
                    if k in lines:
                        text = text.rstrip("\n")
                        out[(path, k)] = text if len(text) <= LINE_CHARS_MAX else text[:LINE_CHARS_MAX] + " …"
                    if k >= last:
                        break
        except FileNotFoundError:
            continue
    return out


def for_findings(run_dir: str, findings: Mapping[str, Mapping[str, Any]], rows_max: int = 5) -> dict[str, list[Any]]:
    """check -> [{"row": finding row, "lines": [{"label", "where", "text"}]}] for the first
    ``rows_max`` sample rows of every check that found something."""
    plan: dict[str, list[tuple[dict[str, Any], list[Ref]]]] = {}
    for check, f in findings.items():
        if not f.get("count"):
            continue
        plan[check] = [(row, refs(check, row)) for row in list(f.get("sample") or [])[:rows_max]]
    texts = resolve(run_dir, (ref for rows in plan.values() for _, rs in rows for ref in rs))
    out: dict[str, list[Any]] = {}
    for check, rows in plan.items():
        out[check] = []
        for row, rs in rows:
            lines = []
            for ref in rs:
                if ref.path is not None and ref.line is not None:
                    lines.append({"label": ref.label, "where": f"{ref.path}:{ref.line + 1}",
                                  "text": texts.get((ref.path, ref.line), "(line not found)")})
                else:
                    lines.append({"label": ref.label, "where": "", "text": ref.text or ""})
            out[check].append({"row": row, "lines": lines})
    return out
