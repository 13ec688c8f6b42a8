"""``mq-bench transaction``: transactional sends as fast as they are answered, against a running
cluster. ``--threads`` asyncio senders share one ``TransactionProducer``; each call of
``send_message_in_transaction`` (half message, local transaction — a no-op answering at once —, end
transaction) is timed with ``time.perf_counter`` from start to end. ``--rollback-share`` F answers
ROLLBACK_MESSAGE for a share F of the calls (the rest COMMIT_MESSAGE). Prints transactions/s and
latency (p50/p99/max) every ``--report-interval`` and a summary (``--json``: one JSON object).
Exit codes as ``mq-bench produce``."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

from broker.client.transport import ClientError, add_security_arguments, security_kwargs
from dledger.apps.stats import LatencyHistogram


class _Listener:
    def __init__(self, rollback_share: float):
        self.rollback_share = rollback_share
        self.n = 0

    def execute_local_transaction(self, msg: Any, arg: Any) -> str:
        self.n += 1  # exactly a share of the calls: where floor(n * share) steps up
        rolled = int(self.n * self.rollback_share) != int((self.n - 1) * self.rollback_share)
        return "ROLLBACK_MESSAGE" if rolled else "COMMIT_MESSAGE"

    def check_local_transaction(self, msg: Any) -> str:
        return "ROLLBACK_MESSAGE"  # nothing a bench left unknown is worth delivering


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be a number 0..1, got {text!r}")
    return value


def add_parser(sub: Any, positive: Any) -> None:
    p = sub.add_parser("transaction", help="transactional sends (half + end) as fast as answered; TPS and RT")
    p.add_argument("-n", "--namesrvAddr", dest="namesrv", default=None,
                   help="NameServer list 'a:9876;b:9877' (default: $NAMESRV_ADDR, else 127.0.0.1:9876)")
    p.add_argument("-t", "--topic", default="BenchmarkTxn")
    p.add_argument("--duration", type=positive(float), default=30.0, help="seconds (default 30)")
    p.add_argument("--report-interval", dest="report_interval", type=positive(float), default=5.0)
    p.add_argument("-w", "--threads", type=positive(int, 10_000), default=64, help="concurrent senders (64)")
    p.add_argument("-s", "--size", type=positive(int, 4 << 20), default=1024, help="body bytes (default 1024)")
    p.add_argument("--rollback-share", dest="rollback_share", type=_share, default=0.0,
                   help="share of transactions rolled back, 0..1 (default 0)")
    p.add_argument("--json", action="store_true", help="one JSON summary on stdout; reports on stderr")
    add_security_arguments(p)


async def run_transaction(args: argparse.Namespace) -> int:
    from broker.client import Message, TransactionProducer

    listener = _Listener(args.rollback_share)
    producer = TransactionProducer("benchmark_txn_producer", args.namesrv, listener, **security_kwargs(args))
    hist = LatencyHistogram()
    windows = [LatencyHistogram()]  # the current report interval's (replaced at every report)
    counts = {"ok": 0, "failed": 0, "commit": 0, "rollback": 0, "end_failed": 0}
    errors: dict[str, int] = {}
    body = b"x" * args.size
    out = sys.stderr if args.json else sys.stdout
    await producer.start()
    start = time.perf_counter()
    deadline = start + args.duration

    async def sender() -> None:
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            try:
                r = await producer.send_message_in_transaction(Message(args.topic, body))
            except ClientError as exc:
                counts["failed"] += 1
                errors[exc.code] = errors.get(exc.code, 0) + 1
                continue
            dt = time.perf_counter() - t0
            hist.record_s(dt)
            windows[-1].record_s(dt)
            counts["ok"] += 1
            counts["commit" if r.local_transaction_state == "COMMIT_MESSAGE" else "rollback"] += 1
            if r.end_answer is None:
                counts["end_failed"] += 1

    async def reporter() -> None:
        last_n, last_t = 0, start
        while True:
            await asyncio.sleep(args.report_interval)
            now = time.perf_counter()
            n = counts["ok"]
            w = windows[-1]
            windows[-1] = LatencyHistogram()
            print(f"txn/s {(n - last_n) / (now - last_t):.0f} | RT p50 {w.percentile_ms(50):.1f} ms "
                  f"p99 {w.percentile_ms(99):.1f} ms | ok {n} failed {counts['failed']}", file=out, flush=True)
            last_n, last_t = n, now

    rep = asyncio.get_running_loop().create_task(reporter())
    try:
        await asyncio.gather(*(sender() for _ in range(args.threads)))
    finally:
        rep.cancel()
        await asyncio.gather(rep, return_exceptions=True)
        await producer.shutdown()
    elapsed = time.perf_counter() - start
    summary = {
        "transactions": counts["ok"], "tps": round(counts["ok"] / elapsed, 1), "elapsed_s": round(elapsed, 1),
        "threads": args.threads, "size": args.size, **counts, "errors": errors,
        "rt_ms": {"p50": hist.percentile_ms(50), "p99": hist.percentile_ms(99), "max": hist.percentile_ms(100)},
    }
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"summary: {summary['tps']} transactions/s over {summary['elapsed_s']} s ({counts['ok']} ok, "
              f"{counts['commit']} committed, {counts['rollback']} rolled back, {counts['failed']} failed); "
              f"RT p50 {summary['rt_ms']['p50']:.1f} ms, p99 {summary['rt_ms']['p99']:.1f} ms")
    return 0 if counts["ok"] else 1
