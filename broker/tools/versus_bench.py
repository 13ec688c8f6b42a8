"""``mq-bench versus-nats``: our cases and NATS JetStream's, back to back in one run, and the ratios.

The comparison of issue 13. Ours: a private local cluster (``dledger-cluster up`` in a temporary
directory, SYNC_FLUSH: every acknowledged message fdatasynced on a majority), measured with
``mq-bench produce`` / ``consume``. Theirs: the scripts in ``--nats-dir`` (default
``../shared/bench/nats``: NATS JetStream R3, file storage, nats-py; it installs nats-server and
nats-py on first use), run right after ours on the same machine. Cases (1 KiB bodies):

=================  ===============================  ===========================================
case               ours                             NATS
=================  ===============================  ===========================================
sync 1             1 sender, one send at a time     1 sync publisher
sync 32            32 senders                       32 sync publishers
pipelined          256 senders in flight (the SDK   256 publishes in flight (publish_async)
                   coalesces them: auto-batching)
pipelined batches  16 senders, ``send_batch`` of 64  the same figure as pipelined (the issue's
                   messages each                    definition of our pipelined case)
consumer           push consumer drains the topic   pull consumer drains the stream (acks)
=================  ===============================  ===========================================

Ours also get a ``mixed`` case (sends paced at ``--mixed-rate``, 1,000 msgs/s, while a consumer
reads at the same rate: the send p99 is the figure), the CPU time per message of every process in
every case — each broker, the NameServer and the client (``mq-bench produce/consume --cpu-dir``;
the mixed case has two clients, the producer and the consumer) —, the leader elections during the whole
run (the largest term change of any replica) and every broker's RSS at the start and after each
case, split into anonymous memory (heap) and file-backed pages (mmapped log and queue files).

It prints one line per case with both figures and the ratio ours/NATS (``--json``: one object).
The ratio is the figure to quote: both sides ran on the same machine state within minutes. NATS
does not fsync before acknowledging (every 2 min by default); we do, unless ``--flush async``
(``ASYNC_FLUSH``: a majority wrote the entry to the page cache, fdatasync every
``flushIntervalCommitLog`` ms) runs ours on NATS's terms — the like-for-like comparison; the
issue's targets are with ``sync``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any

from broker.client.transport import ClientError, Transport
from broker.tools.cli import add_local_cluster_arguments
from broker.tools.failover_bench import cluster_command, cluster_processes
from dledger.apps.cluster import ADMIN_CREDENTIALS_FILE

DEFAULT_NATS_DIR = os.path.normpath(os.path.join(os.path.dirname(__file__), *[".."] * 3, "shared", "bench", "nats"))
CASES = ("sync 1", "sync 32", "pipelined", "consumer")  # what the NATS bench prints, in this order
# our send cases: mq-bench produce arguments, and the NATS case each is compared with
_PRODUCE_CASES: dict[str, tuple[list[str], str]] = {
    "sync 1": (["-w", "1"], "sync 1"),
    "sync 32": (["-w", "32"], "sync 32"),
    "pipelined": (["-w", "256"], "pipelined"),
    "pipelined batches": (["-w", "16", "--batch", "64"], "pipelined"),
}
OUR_CASES = (*_PRODUCE_CASES, "consumer")


def _mq_bench_cmd(args: argparse.Namespace, *argv: str) -> tuple[list[str], dict[str, str]]:
    env = {**os.environ, "DLEDGER_CREDENTIALS_FILE": os.path.join(args.dir, ADMIN_CREDENTIALS_FILE)}
    cmd = [sys.executable, "-m", "broker.tools.mqbench", *argv, "-n", f"127.0.0.1:{args.namesrv_port}"]
    cmd += ["-t", args.topic, "--duration", str(args.duration), "--json", *args.mq_bench_arg]
    return cmd, env


def _answer(what: str, rc: int, out: str, err: str) -> dict[str, Any]:
    if rc != 0:
        raise RuntimeError(f"{what} failed ({rc}): {err.strip()[-400:]}")
    return dict(json.loads(out.strip().splitlines()[-1]))


def _mq_bench(args: argparse.Namespace, *argv: str) -> dict[str, Any]:
    cmd, env = _mq_bench_cmd(args, *argv)
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.duration + 120)
    return _answer(argv[0], r.returncode, r.stdout, r.stderr)


def _mixed(args: argparse.Namespace) -> dict[str, Any]:
    """Sends paced at ``--mixed-rate`` while a push consumer reads the same topic from its end."""
    cmd, env = _mq_bench_cmd(args, "consume", "-g", "VersusMixed", "--from", "LAST")  # its own client CPU
    consumer = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        sent = _mq_bench(args, "produce", "-w", "32", "-s", "1024", "--rate", str(args.mixed_rate), "--cpu-dir",
                         args.dir)
        out, err = consumer.communicate(timeout=args.duration + 120)
    finally:
        if consumer.poll() is None:
            consumer.kill()
            consumer.wait(10)
    read = _answer("consume", consumer.returncode, out, err)
    cpu = _cpu_per_msg(sent)
    cpu["consumer client"] = (read.get("cpu") or {}).get("client", {}).get("cpu_us_per_msg")
    return {
        "msgs_per_s": sent["tps"],
        "p99_ms": (sent.get("rt_ms") or {}).get("p99"),
        "consumed_per_s": read["tps"],
        "cpu_us_per_msg": cpu,
        "raw": {"produce": sent, "consume": read},
    }


def _cpu_per_msg(r: dict[str, Any]) -> dict[str, Any]:
    """µs of CPU per message of every process of one mq-bench run (brokers, NameServers, client)."""
    return {name: c.get("cpu_us_per_msg") for name, c in (r.get("cpu") or r.get("broker_cpu") or {}).items()}


def _brokers(args: argparse.Namespace) -> list[dict[str, Any]]:
    return [p for p in cluster_processes(args) if p["kind"] == "broker"]


def _rss_kib(pid: int) -> dict[str, int] | None:
    """VmRSS and its two parts: anonymous memory (the heap: what would grow with a leak) and
    file-backed pages (the mmapped segments, consume queues and indexes: bounded by the files
    and reclaimable by the kernel)."""
    fields = {"VmRSS:": "rss", "RssAnon:": "anon", "RssFile:": "file"}
    try:
        with open(f"/proc/{pid}/status") as f:
            out = {fields[p[0]]: int(p[1]) for p in (line.split() for line in f) if p and p[0] in fields}
    except (OSError, ValueError, IndexError):
        return None
    return out if "rss" in out else None


def _terms(args: argparse.Namespace) -> dict[str, int]:
    """Every reachable broker's Raft term (``GET /v1/status``, open to anyone)."""

    async def read() -> dict[str, int]:
        out = {}
        t = Transport(timeout_s=2.0, credentials=None)
        try:
            for p in _brokers(args):
                try:
                    st = await t.call(f"{p['host']}:{p['http_port']}", "GET", "/v1/status")
                    out[p["name"]] = int(st["term"])
                except (ClientError, KeyError, TypeError, ValueError):
                    continue
        finally:
            await t.close()
        return out

    return asyncio.run(read())


def run_ours(args: argparse.Namespace) -> dict[str, Any]:
    own_dir = args.dir is None
    if own_dir:
        args.dir = tempfile.mkdtemp(prefix="mq-bench-versus-")
    up = cluster_command(
        args, "up", "--raft-port", str(args.raft_port), "--http-port", str(args.http_port),
        "--namesrv-port", str(args.namesrv_port), "--wait", "30", "--flush", args.flush,
    )  # fmt: skip
    try:
        if up.returncode != 0:
            raise RuntimeError(f"the cluster did not start: {up.stderr.strip()[-400:]}")
        out: dict[str, Any] = {}
        rss: dict[str, list[Any]] = {p["name"]: [("start", _rss_kib(int(p["pid"])))] for p in _brokers(args)}

        def sample_rss(after: str) -> None:
            for p in _brokers(args):
                rss.setdefault(p["name"], []).append((after, _rss_kib(int(p["pid"]))))

        terms_before = _terms(args)
        for case, (argv, _theirs) in _PRODUCE_CASES.items():
            r = _mq_bench(args, "produce", *argv, "-s", "1024", "--cpu-dir", args.dir)
            out[case] = {"msgs_per_s": r["tps"], "p99_ms": (r.get("rt_ms") or {}).get("p99"),
                         "cpu_us_per_msg": _cpu_per_msg(r), "raw": r}  # fmt: skip
            sample_rss(case)
        r = _mq_bench(args, "consume", "-g", "VersusDrain", "--from", "FIRST", "--cpu-dir", args.dir)
        out["consumer"] = {"msgs_per_s": r.get("active_tps", r["tps"]), "cpu_us_per_msg": _cpu_per_msg(r), "raw": r}
        sample_rss("consumer")
        out["mixed"] = _mixed(args)
        sample_rss("mixed")
        terms_after = _terms(args)
        out["elections"] = max((terms_after[n] - t for n, t in terms_before.items() if n in terms_after), default=None)
        out["rss_kib"] = {
            name: [{"after": after, **(kib or {})} for after, kib in samples] for name, samples in rss.items()
        }
        return out
    finally:
        cluster_command(args, "down")
        if own_dir:
            shutil.rmtree(args.dir, ignore_errors=True)


def run_nats(args: argparse.Namespace) -> dict[str, Any]:
    script = os.path.join(args.nats_dir, "run.sh")
    if not os.path.isfile(script):
        raise RuntimeError(f"no NATS bench scripts at {args.nats_dir} (give --nats-dir)")
    up = subprocess.run(["bash", script, "up"], capture_output=True, text=True, timeout=600)
    try:
        if up.returncode != 0:
            raise RuntimeError(f"NATS did not start: {up.stderr.strip()[-400:]}")
        r = subprocess.run(["bash", script, "bench", "--duration", str(args.duration)],
                           capture_output=True, text=True, timeout=4 * args.duration + 300)  # fmt: skip
        if r.returncode != 0:
            raise RuntimeError(f"the NATS bench failed: {r.stderr.strip()[-400:]}")
        lines = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    finally:
        subprocess.run(["bash", script, "down"], capture_output=True, text=True, timeout=120)
    if len(lines) != len(CASES):
        raise RuntimeError(f"the NATS bench printed {len(lines)} results, expected {len(CASES)}")
    return {
        case: {"msgs_per_s": line["msgs_per_s"], "p99_ms": (line.get("latency") or {}).get("p99_ms"), "raw": line}
        for case, line in zip(CASES, lines, strict=True)
    }


def compare(ours: dict[str, Any], nats: dict[str, Any] | None) -> list[dict[str, Any]]:
    rows = []
    for case in OUR_CASES:
        mine = ours[case]["msgs_per_s"]
        nats_case = _PRODUCE_CASES[case][1] if case in _PRODUCE_CASES else case
        theirs = nats[nats_case]["msgs_per_s"] if nats else None
        rows.append({
            "case": case,
            "ours_msgs_per_s": mine,
            "ours_p99_ms": ours[case].get("p99_ms"),
            "nats_msgs_per_s": theirs,
            "nats_p99_ms": nats[nats_case].get("p99_ms") if nats else None,
            "ratio": round(mine / theirs, 2) if theirs else None,
        })  # fmt: skip
    return rows


def run_versus(args: argparse.Namespace) -> int:
    try:
        ours = run_ours(args)
        nats = None if args.skip_nats else run_nats(args)
    except (RuntimeError, subprocess.TimeoutExpired, ValueError, KeyError) as exc:
        print(f"mq-bench versus-nats: {exc}", file=sys.stderr)
        return 1
    rows = compare(ours, nats)
    if args.json:
        print(json.dumps({"duration_s": args.duration, "flush": args.flush, "rows": rows, "ours": ours, "nats": nats}))
    else:
        how = "acknowledged before fsync, as NATS does" if args.flush == "async" else "fsync on a majority before ack"
        print(f"ours: {args.flush.upper()}_FLUSH ({how})")
        mixed = ours["mixed"]
        print(f"mixed      sends at {mixed['msgs_per_s']:,.0f} msgs/s (p99 {mixed['p99_ms']} ms) while a consumer "
              f"reads {mixed['consumed_per_s']:,.0f} msgs/s")
        for case in (*_PRODUCE_CASES, "consumer", "mixed"):
            per = sorted(ours[case]["cpu_us_per_msg"].items())
            print(f"CPU {case:<17} " + ", ".join(f"{n} {v} µs/msg" for n, v in per))
        print(f"elections during our run: {ours['elections']}")
        for name, samples in sorted(ours["rss_kib"].items()):
            trail = " -> ".join(f"{x.get('anon', '?')}+{x.get('file', '?')}" for x in samples)
            print(f"RSS KiB anon+file {name}: {trail} (start, then after each case)")
        for r in rows:
            p99 = f", p99 {r['ours_p99_ms']} ms" if r["ours_p99_ms"] is not None else ""
            theirs = f"NATS {r['nats_msgs_per_s']:>9,.0f} msgs/s" if r["nats_msgs_per_s"] else "NATS -"
            ratio = f"ratio {r['ratio']:.2f}" if r["ratio"] is not None else ""
            print(f"{r['case']:<17} ours {r['ours_msgs_per_s']:>9,.0f} msgs/s{p99} | {theirs} | {ratio}")
    return 0


def add_parser(sub: Any, positive: Any) -> None:
    p = sub.add_parser("versus-nats", help="our cases and NATS JetStream's back to back, with the ratios")
    p.add_argument("--duration", type=positive(float, 600), default=10.0, help="seconds per case (10)")
    p.add_argument("--nats-dir", dest="nats_dir", default=DEFAULT_NATS_DIR, help="the NATS bench scripts")
    p.add_argument("--skip-nats", dest="skip_nats", action="store_true", help="our cases only")
    p.add_argument("--flush", choices=("sync", "async"), default="sync",
                   help="our flush policy: sync (fsync on a majority before ack, the default) or async "
                        "(ack from memory, as NATS does by default: the like-for-like comparison)")  # fmt: skip
    p.add_argument("--mixed-rate", dest="mixed_rate", type=positive(float), default=1000.0,
                   help="msgs/s of the mixed case (sends while a consumer reads)")  # fmt: skip
    p.add_argument(
        "--mq-bench-arg", dest="mq_bench_arg", action="append", default=[],
        help="extra argument for every mq-bench produce/consume run (repeat), e.g. --mq-bench-arg=--transport=http",
    )  # fmt: skip
    add_local_cluster_arguments(p, positive, topic="VersusBench", raft_port=43911, http_port=13911, namesrv_port=28876)
