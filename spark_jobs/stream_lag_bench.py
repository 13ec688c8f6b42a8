"""``python -m spark_jobs.stream_lag_bench``: how far behind the continuous audit runs at a given rate.

Starts a private 3-replica group (ACL on, free ports: ``source.localcluster``), creates a topic,
starts the stream audit (``stream_audit.StreamAudit``, Spark ``--master``) on an empty run
directory following that topic, then sends ``--rate`` msgs/s for ``--duration`` s with
``mq-bench produce`` (1 KiB bodies, ``--batch`` messages per send request) and waits until the
audit has caught up. Prints one JSON object: the producer's summary and, over the micro-batches
that ran after ``--warmup`` s (the JVM and the Python workers starting), the rows per batch and
the delay of the rows read (when the batch ran − the message's store time: the audit's lag),
p50 and max over batches of each batch's max.
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
import time
from typing import Any

from broker.client.transport import Transport
from spark_jobs.source.localcluster import REPO, LocalCluster
from spark_jobs.stream_audit import StreamAudit

TOPIC = "StreamLagTopic"


async def _create_topic(c: LocalCluster, queues: int) -> None:
    from broker.client.transport import NamesrvClient

    t = Transport(5.0, credentials=c.credentials, tls=None)
    try:
        for p in c.brokers():
            st = await t.call(c.addr(p), "GET", "/v1/status")
            if st.get("writable"):
                await t.call(c.addr(p), "POST", "/v1/topics",
                             {"topic": TOPIC, "read_queue_nums": queues, "write_queue_nums": queues})  # fmt: skip
                break
        else:
            raise RuntimeError("no writable leader")
        ns = NamesrvClient(c.namesrv_addr, t)
        for _ in range(200):
            try:
                await ns.route(TOPIC, timeout_s=2.0)
                return
            except Exception:
                await asyncio.sleep(0.1)
        raise RuntimeError("the topic was never routed")
    finally:
        await t.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m spark_jobs.stream_lag_bench", description=__doc__)
    ap.add_argument("--rate", type=float, default=2000.0, help="msgs/s sent (default %(default)s)")
    ap.add_argument("--duration", type=float, default=60.0, help="seconds of sending (default %(default)s)")
    ap.add_argument("--warmup", type=float, default=15.0, help="seconds not counted (default %(default)s)")
    ap.add_argument("--batch", type=int, default=10, help="messages per send request (default %(default)s)")
    ap.add_argument("--queues", type=int, default=8)
    ap.add_argument("--trigger-s", type=float, default=1.0, help="seconds between micro-batches (default 1)")
    ap.add_argument("--master", default="local[*]")
    ap.add_argument("--keep", action="store_true", help="keep the cluster's and the audit's directory")
    args = ap.parse_args(argv)
    from spark_jobs.session import get_session

    root = tempfile.mkdtemp(prefix="dledger-stream-lag-")
    c = LocalCluster(os.path.join(root, "cluster"))
    try:
        c.up()
        asyncio.run(_create_topic(c, args.queues))
        run_dir = os.path.join(root, "run")
        os.makedirs(os.path.join(run_dir, "history"))
        spark = get_session(args.master, app_name="dledger-stream-lag")
        audit = StreamAudit(spark, run_dir, os.path.join(run_dir, "stream-audit"),
                            {"topic": TOPIC, "namesrv": c.namesrv_addr, "credentialsFile": c.credentials_file},
                            args.trigger_s, printer=lambda line: print(line, file=sys.stderr))  # fmt: skip
        audit.start()
        started = time.time()
        r = subprocess.run(
            [sys.executable, "-m", "broker.tools.mqbench", "produce", "-n", c.namesrv_addr, "-t", TOPIC,
             "--rate", str(args.rate), "--batch", str(args.batch), "--duration", str(args.duration),
             "--credentials", c.credentials_file, "--json", "--report-interval", "10"],
            capture_output=True, text=True, cwd=REPO, timeout=args.duration + 120,
        )  # fmt: skip
        if r.returncode != 0:
            raise RuntimeError(f"mq-bench failed: {r.stderr[-2000:]}")
        audit.wait(duration_s=300, idle_s=10)
        summary = audit.stop()
        steady = [b for b in audit.reports if b.batch_id >= 0 and b.time_us / 1e6 >= started + args.warmup]
        maxes = sorted(b.delay_ms["max"] for b in steady if b.delay_ms["max"] is not None)
        out: dict[str, Any] = {
            "rate": args.rate, "duration_s": args.duration, "trigger_s": args.trigger_s, "master": args.master,
            "cpu_count": os.cpu_count(), "producer": json.loads(r.stdout) if r.stdout.strip() else None,
            "rows": summary["rows"], "batches": summary["batches"], "steady_batches": len(steady),
            "rows_per_batch_p50": sorted(b.rows for b in steady)[len(steady) // 2] if steady else None,
            "batch_delay_max_ms": {"p50": maxes[len(maxes) // 2] if maxes else None,
                                   "max": maxes[-1] if maxes else None},
            "first_batch_delay_max_ms": next((b.delay_ms["max"] for b in audit.reports if b.batch_id >= 0), None),
            "per_batch": [[b.batch_id, b.rows, b.delay_ms["max"]] for b in audit.reports if b.batch_id >= 0],
        }  # fmt: skip
        print(json.dumps(out))
        spark.stop()
        return 0
    finally:
        c.down()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
