"""The audit's outputs: ``summary.json``, ``details/<check>.json`` and a self-contained ``report.html``
(plots are matplotlib PNGs embedded as base64), plus the text summary printed by the CLI."""

from __future__ import annotations

import base64
import io
import json
import math
import os
import shutil
from typing import Any

QUANTILES = (0.5, 0.9, 0.99, 0.999)
SERIES_BUCKETS = 400

DEFINITIONS = {
    "lost": "ok send absent from its group's committed log, or read by nobody although reads of its queue "
    "went past its acknowledged offset",
    "unseen": "ok send in the committed log that nobody read, and no read went past it (never delivered after "
    "heal and drain)",
    "divergence": "replica whose (term, chain CRC, body) differs from the majority at a committed index",
    "unexpected": "received or drained unique id that no send line names",
    "cq_mismatch": "consume queue whose units differ from the committed log's messages of that queue",
    "key_order": "ok send of a producer's key stored after a higher seq of the same key (log order)",
    "replica_damage": "replica file damaged beyond a torn tail (the store would refuse to open)",
    "inconsistent_offsets": "one (broker, topic, queue, offset) named with two different unique ids by acks, "
    "receipts, the drain or a replica's consume queue",
    "ack_offset_mismatch": "ok send whose acknowledged queue offset is not where a replica's consume queue "
    "holds the message",
    "send_order": "a producer's ok sends to one queue whose acknowledged offsets do not grow (non-monotonic send)",
    "poll_order": "within one consumer session of a queue, a receipt that is not the previous offset + 1 "
    "(backwards: non-monotonic poll; skip: poll skip)",
    "aborted_read": "unique id whose every send said 'fail' (definitely not stored) that was stored or read",
    "corrupt_read": "a read (or a damaged replica's read-back) whose body differs from the bytes sent",
    "offset_regression": "stored consumer offset lower than one read at a lower applied index (offsets moved "
    "backwards without a reset)",
    "committed_prefix": "replica whose committed prefix changed or shrank (later samples or its final log)",
    "commit_crc_mismatch": "two replicas reporting one committed index with different chain CRCs",
    "nonconflicting_truncation": "replica that truncated entries while its log already ended in the current term "
    "(they could not conflict)",
    "drain_incomplete": "a queue the final drain could not read to its end",
    "duplicate_deliveries": "unique id received more than once",
    "duplicate_log_entries": "unique id stored more than once in a group's committed log",
    "unavailability": "period with send attempts but no ok send completing, at least the threshold long",
    "elections_without_fault": "a new term first seen outside every fault window (plus 10 s after its heal)",
    "cq_damaged": "consume queue files that contradict each other (the broker rebuilds them from the log)",
    "bad_history_lines": "history lines that are not JSON objects of the documented types (skipped)",
    "retained_away": "ok send pointing below every replica's retained log (cannot be checked in the log)",
    "delayed_lost": "acknowledged delayed send of which no copy reached its real topic (no receipt, not drained)",
    "delivered_early": "delayed message whose first copy in the real topic was stored before its due time "
    "(send store time + level delay, or deliver time) − 20 ms",
    "delayed_twice": "delayed message made visible more than once in its real topic (two positions)",
    "retry_lost": "message the retry group failed that was neither consumed by a later attempt nor put in its "
    "DLQ, or an acknowledged message the retry group never received and the DLQ does not hold",
    "dlq_mismatch": "DLQ disagreeing with the retry group's answers: failed at the last attempt but missing, "
    "in the DLQ without failing the last attempt, or after other than 1 + maxReconsumeTimes failed attempts",
    "dlq_duplicates": "message held more than once by the DLQ (a send-back sent again: the client's doing)",
    "txn_rolled_back_delivered": "rolled-back transactional message that was read or stored in its topic "
    "(an aborted read)",
}


# -- data for the report ------------------------------------------------------------------------------
def latency_and_series(fr: Any, span: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Latency percentiles (ms) and per-bucket throughput/latency series, from Spark."""
    from pyspark.sql import functions as F

    from spark_jobs import checks as C

    # Delayed messages are late by design: their lateness is the audit's ``delays`` section.
    delayed = fr.sends.where(F.col("due_us").isNotNull()).select("unique_id")
    # Kept for the series below: one aggregation of every receipt instead of two.
    first = C.latency_first_deliveries(fr.workload(fr.receipts).join(delayed, ["unique_id"], "left_anti")).persist()
    r = first.agg(
        F.count("*").alias("n"),
        C.percentiles("e2e_us", QUANTILES).alias("e2e"),
        F.max("e2e_us").alias("e2e_max"),
        C.percentiles("s2r_us", QUANTILES).alias("s2r"),
        F.max("s2r_us").alias("s2r_max"),
    ).first()
    ok = fr.sends.where(F.col("outcome") == "ok").withColumn(
        "lat_us", F.col("complete_us") - F.col("invoke_us")
    )
    s = ok.agg(
        F.count("*").alias("n"), C.percentiles("lat_us", QUANTILES).alias("q"), F.max("lat_us").alias("mx")
    ).first()
    latency = {
        "end_to_end_ms": _quantiles(r["n"], r["e2e"], r["e2e_max"]) if r else {},
        "store_to_receipt_ms": _quantiles(r["n"], r["s2r"], r["s2r_max"]) if r else {},
        "send_ms": _quantiles(s["n"], s["q"], s["mx"]) if s else {},
        "definition": "first receipt of each unique id (delayed messages excepted): receipt time − born time "
        "(end to end) and − store time; send: complete − invoke of ok sends",
    }
    t0, t1 = span.get("first_invoke_us"), span.get("last_complete_us")
    if t0 is None or t1 is None:
        first.unpersist()
        return latency, {}
    bucket_us = max(1_000_000, math.ceil((t1 - t0) / SERIES_BUCKETS / 1_000_000) * 1_000_000)
    b = lambda col: F.floor((F.col(col) - F.lit(t0)) / bucket_us).cast("long")  # noqa: E731
    sends_ts = (
        fr.sends.withColumn("lat_us", F.col("complete_us") - F.col("invoke_us"))
        .groupBy(b("complete_us").alias("bucket"))
        .agg(
            *[F.sum((F.col("outcome") == o).cast("int")).alias(o) for o in ("ok", "fail", "unknown")],
            C.percentiles(F.when(F.col("outcome") == "ok", F.col("lat_us")), (0.5, 0.99)).alias("lat"),
        )
        .collect()
    )
    recv_ts = (
        first.groupBy(b("time_us").alias("bucket"))
        .agg(F.count("*").alias("received"), C.percentiles("e2e_us", (0.5, 0.99)).alias("e2e"))
        .collect()
    )
    first.unpersist()
    series = {
        "t0_us": t0,
        "bucket_us": bucket_us,
        "sends": sorted(
            [[x["bucket"], x["ok"], x["fail"], x["unknown"], *(x["lat"] or [None, None])] for x in sends_ts],
            key=lambda v: v[0],
        ),
        "receipts": sorted(
            [[x["bucket"], x["received"], *(x["e2e"] or [None, None])] for x in recv_ts], key=lambda v: v[0]
        ),
    }
    return latency, series


def commit_series(work_dir: str) -> dict[str, Any]:
    """The sampled commit indexes over time: {group: {replica: [[time_us, commit_index, term], ...]}}
    (read with pyarrow: the samples are small)."""
    from spark_jobs._arrow import pq

    path = os.path.join(work_dir, "samples")
    if not os.path.isdir(path):
        return {}
    t = pq.read_table(path, columns=["group", "replica", "time_us", "commit_index", "term"]).to_pylist()
    out: dict[str, dict[str, list[list[int]]]] = {}
    for r in sorted(t, key=lambda r: r["time_us"]):
        if r["commit_index"] is not None:
            out.setdefault(r["group"], {}).setdefault(r["replica"], []).append(
                [r["time_us"], r["commit_index"], r["term"]]
            )
    return out


def lateness_quantiles(n: int, qs: list[int] | None, mx: int | None) -> dict[str, Any]:
    """Lateness percentiles p50/p90/p99 and max in ms (µs inputs)."""
    if not n or qs is None:
        return {"count": n or 0}
    out: dict[str, Any] = {"count": n}
    for q, v in zip(("p50", "p90", "p99"), qs, strict=True):
        out[q] = v / 1000
    out["max"] = None if mx is None else mx / 1000
    return out


def _quantiles(n: int, qs: list[int] | None, mx: int | None) -> dict[str, Any]:
    if not n or qs is None:
        return {"count": n or 0}
    out: dict[str, Any] = {"count": n}
    for q, v in zip(QUANTILES, qs, strict=True):
        out[f"p{q * 100:g}"] = v / 1000
    out["max"] = None if mx is None else mx / 1000
    return out


# -- files --------------------------------------------------------------------------------------------
def workload_figures(span: dict[str, Any], run: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The workload's achieved rate from the sends (acknowledged ones per second between the first
    invocation and the last completion), next to what the run asked and what its fault mix needs
    (``run.json`` ``workload_rate``, written by ``chaos run``); a warning when it fell short."""
    first, last, ok = span.get("first_invoke_us"), span.get("last_complete_us"), int(span.get("ok") or 0)
    seconds = (last - first) / 1e6 if first is not None and last is not None and last > first else None
    recorded = run.get("workload_rate") or {}
    out: dict[str, Any] = {
        "achieved_ok_per_s": round(ok / seconds, 1) if seconds else None,
        "sends_per_s": round(int(span.get("sends") or 0) / seconds, 1) if seconds else None,
        "seconds": round(seconds, 1) if seconds else None,
        "offered_per_s": recorded.get("offered_per_s"),
        "needed_ok_per_s": recorded.get("needed_ok_per_s"),
        "acked_in_fault_windows": recorded.get("acked_in_fault_windows", []),
    }
    warnings = []
    need, got = out["needed_ok_per_s"], out["achieved_ok_per_s"]
    if need is not None and got is not None and got < need:
        warnings.append(
            f"the workload achieved {got} acknowledged sends/s, below the {need}/s its fault mix needs: faults "
            "may have passed without the traffic that would show their effect (docs/CHAOS.md, 'Workload rate')"
        )
    return out, warnings


def write_summary(out_dir: str, summary: dict[str, Any]) -> None:
    _atomic_json(os.path.join(out_dir, "summary.json"), summary)


def write(
    out_dir: str,
    summary: dict[str, Any],
    details: dict[str, list[dict[str, Any]]],
    series: dict[str, Any],
    plots: bool = True,
    commits: dict[str, Any] | None = None,
    proof: dict[str, list[Any]] | None = None,
) -> None:
    details_dir = os.path.join(out_dir, "details")
    shutil.rmtree(details_dir, ignore_errors=True)
    os.makedirs(details_dir)
    for name, rows in details.items():
        _atomic_json(os.path.join(details_dir, f"{name}.json"), rows)
    write_summary(out_dir, summary)
    images = _plots(summary, series) if plots and series else {}
    if plots and commits:
        images["commits"] = _commit_plot(summary, commits, series.get("t0_us"))
    page = render_html(summary, images, proof or {})
    tmp = os.path.join(out_dir, "report.html.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(page)
    os.replace(tmp, os.path.join(out_dir, "report.html"))


def _atomic_json(path: str, obj: Any) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1, default=str)
    os.replace(tmp, path)


# -- plots --------------------------------------------------------------------------------------------
def _plots(summary: dict[str, Any], series: dict[str, Any]) -> dict[str, str]:
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0, bucket_s = series["t0_us"], series["bucket_us"] / 1e6
    sends, recv = series["sends"], series["receipts"]
    out: dict[str, str] = {}

    def shade(ax: Any) -> None:
        for f in summary.get("faults", []):
            start = (f["apply_us"] - t0) / 1e6
            end = ((f["heal_us"] or f["apply_us"]) - t0) / 1e6
            ax.axvspan(start, max(end, start + bucket_s), color="orange", alpha=0.25, lw=0)
        for w in summary["findings"].get("unavailability", {}).get("sample", []):
            ax.axvspan((w["start_us"] - t0) / 1e6, (w["end_us"] - t0) / 1e6, color="red", alpha=0.25, lw=0)

    # Dense buckets: a bucket nobody completed in is 0 messages/s, and a gap (not a line) in latency.
    last = max([v[0] for v in sends] + [v[0] for v in recv] + [0])
    xs = [k * bucket_s for k in range(last + 1)]
    by_send = {v[0]: v for v in sends}
    by_recv = {v[0]: v for v in recv}

    def column(rows: dict[int, list[Any]], idx: int, scale: float, empty: float) -> list[float]:
        out_ = []
        for k in range(last + 1):
            v = rows.get(k)
            out_.append(empty if v is None or v[idx] is None else v[idx] / scale)
        return out_

    fig, ax = plt.subplots(figsize=(10, 3.2))
    ax.plot(xs, column(by_send, 1, bucket_s, 0.0), label="ok sends/s", lw=1.5)
    failed = [
        a + b
        for a, b in zip(column(by_send, 2, bucket_s, 0.0), column(by_send, 3, bucket_s, 0.0), strict=True)
    ]
    ax.plot(xs, failed, label="failed+unknown/s", lw=1)
    ax.plot(xs, column(by_recv, 1, bucket_s, 0.0), label="received/s", lw=1, ls="--")
    shade(ax)
    ax.set_xlabel("seconds since the first send")
    ax.set_ylabel("messages/s")
    ax.set_title("Throughput (orange: fault windows, red: unavailability)")
    ax.legend(loc="upper right", fontsize=8)
    out["throughput"] = _png(fig, plt)

    fig, ax = plt.subplots(figsize=(10, 3.2))
    nan = float("nan")
    for rows, idx, label in (
        (by_send, 4, "send p50"),
        (by_send, 5, "send p99"),
        (by_recv, 2, "end-to-end p50"),
        (by_recv, 3, "end-to-end p99"),
    ):
        ax.plot(xs, column(rows, idx, 1000, nan), label=label, lw=1)
    shade(ax)
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel("seconds since the first send")
    ax.set_ylabel("ms")
    ax.set_title("Latency")
    ax.legend(loc="upper right", fontsize=8)
    out["latency"] = _png(fig, plt)
    return out


def _commit_plot(summary: dict[str, Any], commits: dict[str, Any], t0_us: int | None) -> str:
    """One panel per group: every replica's sampled commit index over time, fault windows shaded and
    named, elections without a fault marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted(commits)
    t0 = t0_us or min(p[0] for g in groups for pts in commits[g].values() for p in pts)
    fig, axes = plt.subplots(len(groups), 1, figsize=(10, 2.8 * len(groups)), squeeze=False)
    elections = summary["findings"].get("elections_without_fault", {}).get("sample", [])
    for ax, group in zip(axes[:, 0], groups, strict=True):
        for replica, pts in sorted(commits[group].items()):
            ax.step([(p[0] - t0) / 1e6 for p in pts], [p[1] for p in pts], where="post", lw=1, label=replica)
        top = ax.get_ylim()[1]
        for f in summary.get("faults", []):
            start = (f["apply_us"] - t0) / 1e6
            end = ((f["heal_us"] or f["apply_us"]) - t0) / 1e6
            ax.axvspan(start, max(end, start + 0.2), color="orange", alpha=0.2, lw=0)
            ax.text(start, top, f["fault"], fontsize=6, rotation=90, va="top", ha="right", color="#a60")
        for e in elections:
            if e.get("group") == group:
                ax.axvline((e["time_us"] - t0) / 1e6, color="red", lw=0.8, ls=":")
        ax.set_title(f"{group}: commit index per replica (orange: fault windows; red dotted: election without "
                     "a fault)", fontsize=9)
        ax.set_ylabel("commit index")
        ax.legend(loc="lower right", fontsize=7)
    axes[-1, 0].set_xlabel("seconds since the first send")
    return _png(fig, plt)


def _png(fig: Any, plt: Any) -> str:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


# -- html ---------------------------------------------------------------------------------------------
def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, (dict, list)):
        return json.dumps(v, default=str)
    return str(v)


def _columns(rows: list[dict[str, Any]], limit: int = 20) -> list[str]:
    return list(dict.fromkeys(k for r in rows[:limit] for k in r))


def _environment() -> Any:
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("spark_jobs", "templates"),
        autoescape=jinja2.select_autoescape(["html"]),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["cell"] = _cell
    env.globals["columns"] = _columns
    return env


def render_html(summary: dict[str, Any], images: dict[str, str], proof: dict[str, list[Any]] | None = None) -> str:
    """report.html (``templates/report.html``): verdict, every check with its definition, the plots
    (throughput, latency, commit indexes next to the fault windows), and for every check that found
    something its rows and the history lines that prove the first of them."""
    f = summary["findings"]
    checks = [
        {
            "check": name,
            "count": v["count"],
            "fails the run": "yes" if v["fails"] else "no",
            "definition": DEFINITIONS.get(name, ""),
        }
        for name, v in f.items()
    ]
    inputs = summary.get("inputs", {})
    lat = summary.get("latency", {})
    return str(
        _environment()
        .get_template("report.html")
        .render(
            s=summary,
            checks=checks,
            found=[(name, v) for name, v in f.items() if v["count"]],
            definitions=DEFINITIONS,
            images=images,
            proof=proof or {},
            latency_rows=[{"latency": k, **v} for k, v in lat.items() if isinstance(v, dict)],
            latency_definition=str(lat.get("definition", "")),
            delay_rows=[{"lateness": k, **v} for k, v in summary.get("delays", {}).items() if isinstance(v, dict)],
            delay_counts={k: v for k, v in summary.get("delays", {}).items() if isinstance(v, int)},
            delay_definition=str(summary.get("delays", {}).get("definition", "")),
            retry_counts=summary.get("retries", {}),
            history_rows=[{"table": k, "rows": v} for k, v in inputs.get("history_rows", {}).items()],
            inputs=inputs,
        )
    )


def text(summary: dict[str, Any], out_dir: str) -> str:
    lines = [f"audit {summary['run_dir']}: {summary['verdict']}"]
    for name, v in summary["findings"].items():
        flag = "FAIL" if v["fails"] and v["count"] else ("    " if not v["count"] else "note")
        lines.append(f"  {flag} {name:<22} {v['count']}")
    rate = summary.get("workload", {})
    if rate.get("achieved_ok_per_s") is not None:
        need = rate.get("needed_ok_per_s")
        lines.append(
            f"  workload: {rate['achieved_ok_per_s']} acknowledged sends/s"
            + (f" (asked {rate['offered_per_s']:g}/s)" if rate.get("offered_per_s") else "")
            + (f"; the fault mix needs >= {need}/s" if need is not None else "")
        )
    lat = summary.get("latency", {}).get("end_to_end_ms", {})
    if lat.get("count"):
        lines.append(f"  end-to-end ms: p50 {lat.get('p50')} p99 {lat.get('p99')} max {lat.get('max')}")
    delays = summary.get("delays", {})
    if delays.get("acknowledged"):
        late = delays.get("lateness_all_ms", {})
        calm = delays.get("lateness_outside_faults_ms", {})
        lines.append(
            f"  delayed: {delays['acknowledged']} acknowledged, {delays.get('delivered')} delivered; lateness ms "
            f"p50 {late.get('p50')} p99 {late.get('p99')} max {late.get('max')}; outside faults p99 {calm.get('p99')}"
        )
    retries = summary.get("retries", {})
    if retries.get("deliveries"):
        lines.append(
            f"  retry group: {retries.get('failed_ids')} ids failed, {retries.get('consumed_after_retry')} consumed "
            f"later, {retries.get('via_retry_topic')} deliveries via %RETRY%, {retries.get('in_dlq')} in the DLQ "
            f"(expected {retries.get('expected_in_dlq')}, {retries.get('dlq_messages')} DLQ messages)"
        )
    for w in summary.get("warnings", []):
        lines.append(f"  warning: {w}")
    lines.append(
        f"  took {summary['timings_s'].get('total')} s; report: {os.path.join(out_dir, 'report.html')}"
    )
    return "\n".join(lines)
