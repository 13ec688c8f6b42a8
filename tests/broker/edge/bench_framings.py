"""CPU per message of a send and a pull through our SDK's binary frames and through RocketMQ's remoting, on
the same broker service (issue 25 item 7: are two framings worth keeping?).

    .venv/bin/python -m tests.broker.edge.bench_framings --dir /tmp/framings [--senders 16] [--seconds 8]
        [--rounds 3] [--pull-passes 10] [--body 1024] [--keep]

Starts ``dledger-cluster up`` (a NameServer and a 3-replica group, ACL on, uvloop, the defaults), makes a
topic of 4 queues, then in rounds, the two framings interleaved (binary, remoting, binary, ...):

- send: ``--senders`` tasks in this process, each sending one message per request and waiting for its
  answer (no auto-batching, so one request = one message on both framings), for ``--seconds``;
- pull: every message the round sent read back ``--pull-passes`` times, 32 per request, one request in
  flight per queue.

For each, the CPU seconds of the leader's process (user + system, ``/proc/PID/stat``) and of this client
process during the phase, divided by the messages: µs per message. Both framings sign every request (ours:
HMAC-SHA256 with a nonce and time; RocketMQ's ACL 1.0: HMAC-SHA1). The first round warms up and is not in
the summary (medians of the others). One JSON line per phase on stderr, the table on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import yaml

from broker.client.transport import ClientError
from broker.protocol.auth import Credentials
from broker.protocol.frames import Op
from broker.protocol.rocketmq import headers
from broker.protocol.rocketmq import message as rm
from broker.protocol.rocketmq import properties as rp
from broker.protocol.rocketmq.codes import RequestCode, ResponseCode
from broker.tools.cpu_usage import cpu_seconds
from tests.broker.edge.rmq import send_header, uniq
from tests.broker.serving.rmq_client import RmqClient

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
TOPIC = "FramingBench"
QUEUES = 4


def cluster(*args: str) -> Any:
    r = subprocess.run([sys.executable, "-m", "dledger.apps.cluster", *args], capture_output=True, text=True,
                       cwd=REPO, timeout=180)
    if r.returncode != 0:
        raise SystemExit(f"dledger-cluster {' '.join(args)} failed: {r.stderr[-2000:]}")
    return json.loads(r.stdout) if "--json" in args else r.stdout


def leader_of(root: str) -> dict[str, Any]:
    for _ in range(100):
        procs = cluster("status", "--dir", root, "--json")["processes"]
        leaders = [p for p in procs if p.get("kind") == "broker" and p.get("role") == "LEADER" and p.get("writable")]
        if leaders:
            return dict(leaders[0])
        time.sleep(0.2)
    raise SystemExit("no writable leader")


class Binary:
    """Our SDK's binary connection (broker/client/remoting.py), one message per SEND."""

    name = "binary"

    def __init__(self, addr: str, creds: Credentials):
        from broker.client.remoting import RemotingConnection

        self.conn = RemotingConnection(addr, error=ClientError, credentials=creds)

    async def send(self, queue_id: int, body: bytes) -> None:
        msg = {"body": body, "unique_id": uniq(), "born_ts": int(time.time() * 1000), "born_host": "127.0.0.1",
               "tags": "TagA"}
        await self.conn.call(Op.SEND, {"topic": TOPIC, "queue_id": queue_id, "producer_group": "bench",
                                       "messages": [msg]}, 10.0)

    async def pull(self, queue_id: int, offset: int) -> tuple[int, int]:
        got = await self.conn.call(Op.PULL, {"topic": TOPIC, "queue_id": queue_id, "offset": offset, "max_count": 32,
                                             "consumer_group": "bench"}, 10.0)
        return len(got["messages"]), int(got["next_offset"])

    async def close(self) -> None:
        await self.conn.close()


class Remoting:
    """RocketMQ's remoting as the Java 4.9.8 client frames it (SEND_MESSAGE_V2, PULL_MESSAGE), signed."""

    name = "remoting"

    def __init__(self, client: RmqClient):
        self.c = client

    @classmethod
    async def connect(cls, addr: str, creds: Credentials) -> Remoting:
        return cls(await RmqClient.connect(addr, credentials=(creds.access_key, creds.secret_key)))

    async def send(self, queue_id: int, body: bytes) -> None:
        props = {rp.UNIQ_KEY: uniq(), rp.WAIT_STORE_MSG_OK: "true", rp.TAGS: "TagA"}
        h = send_header(TOPIC, queue_id, props, group="bench")
        got = await self.c.call(RequestCode.SEND_MESSAGE_V2, headers.send_header_to_ext_v2(h), body)
        if got.code != ResponseCode.SUCCESS:
            raise RuntimeError(f"send: {got.code} {got.remark}")

    async def pull(self, queue_id: int, offset: int) -> tuple[int, int]:
        h = headers.PullMessageRequestHeader(
            consumer_group="bench", topic=TOPIC, queue_id=queue_id, queue_offset=offset, max_msg_nums=32,
            sys_flag=headers.pull_sys_flag(commit_offset=False, suspend=False, subscription=True), commit_offset=0,
            suspend_timeout_millis=0, sub_version=0, subscription="*", expression_type="TAG")
        got = await self.c.call(RequestCode.PULL_MESSAGE, headers.to_ext(h))
        n = len(rm.decode_stored_many(got.body)) if got.code == ResponseCode.SUCCESS else 0
        return n, int((got.ext_fields or {})["nextBeginOffset"])

    async def close(self) -> None:
        await self.c.close()


async def send_phase(client: Any, senders: int, seconds: float, body: bytes) -> int:
    sent = 0
    deadline = time.monotonic() + seconds

    async def sender(i: int) -> None:
        nonlocal sent
        while time.monotonic() < deadline:
            await client.send(i % QUEUES, body)
            sent += 1

    await asyncio.gather(*(sender(i) for i in range(senders)))
    return sent


async def pull_phase(client: Any, start: dict[int, int], end: dict[int, int], passes: int) -> int:
    total = 0

    async def reader(q: int) -> None:
        nonlocal total
        for _ in range(passes):
            offset = start[q]
            while offset < end[q]:
                n, offset = await client.pull(q, offset)
                total += n

    await asyncio.gather(*(reader(q) for q in range(QUEUES)))
    return total


async def max_offsets(client: Remoting) -> dict[int, int]:
    out = {}
    for q in range(QUEUES):
        got = await client.c.call(RequestCode.GET_MAX_OFFSET, {"topic": TOPIC, "queueId": str(q)})
        out[q] = int((got.ext_fields or {})["offset"])
    return out


async def measured(pid: int, work: Any) -> tuple[Any, float, float, float]:
    """(``await work``'s result, leader CPU s, client CPU s, wall s) of one phase."""
    broker0, client0, t0 = cpu_seconds(pid), time.process_time(), time.monotonic()
    result = await work
    broker1, client1 = cpu_seconds(pid), time.process_time()
    assert broker0 is not None and broker1 is not None
    return result, broker1 - broker0, client1 - client0, time.monotonic() - t0


async def bench(args: argparse.Namespace) -> list[dict[str, Any]]:
    root = args.dir
    with open(os.path.join(root, "admin-credentials.yml")) as f:
        doc = yaml.safe_load(f)
    creds = Credentials(str(doc["accessKey"]), str(doc["secretKey"]))
    leader = leader_of(root)
    http = f"{leader['host']}:{leader['http_port']}"
    binary_addr = f"{leader['host']}:{leader['http_port'] + 1}"
    pid = int(leader["pid"])
    remoting = await Remoting.connect(http, creds)
    binary = Binary(binary_addr, creds)
    body = os.urandom(args.body // 2).hex().encode()[: args.body]
    rows: list[dict[str, Any]] = []
    try:
        for rnd in range(args.rounds):
            for client in (binary, remoting):
                start = await max_offsets(remoting)
                sent, cpu_b, cpu_c, wall = await measured(pid, send_phase(client, args.senders, args.seconds, body))
                row = {"round": rnd, "framing": client.name, "phase": "send", "messages": sent,
                       "msgs_per_s": round(sent / wall), "leader_cpu_us_per_msg": round(cpu_b / sent * 1e6, 1),
                       "client_cpu_us_per_msg": round(cpu_c / sent * 1e6, 1)}
                print(json.dumps(row), file=sys.stderr)
                rows.append(row)
                end = await max_offsets(remoting)
                got, cpu_b, cpu_c, wall = await measured(pid, pull_phase(client, start, end, args.pull_passes))
                row = {"round": rnd, "framing": client.name, "phase": "pull", "messages": got,
                       "msgs_per_s": round(got / wall), "leader_cpu_us_per_msg": round(cpu_b / got * 1e6, 1),
                       "client_cpu_us_per_msg": round(cpu_c / got * 1e6, 1)}
                print(json.dumps(row), file=sys.stderr)
                rows.append(row)
    finally:
        await remoting.close()
        await binary.close()
    return rows


def summary(rows: list[dict[str, Any]]) -> str:
    lines = ["| phase | framing | msgs/s | leader CPU µs/msg | client CPU µs/msg |", "|---|---|---|---|---|"]
    kept = [r for r in rows if r["round"] > 0] or rows
    for phase in ("send", "pull"):
        for framing in ("binary", "remoting"):
            rs = [r for r in kept if r["phase"] == phase and r["framing"] == framing]
            lines.append(f"| {phase} | {framing} | {statistics.median(r['msgs_per_s'] for r in rs):,.0f} | "
                         f"{statistics.median(r['leader_cpu_us_per_msg'] for r in rs):.0f} | "
                         f"{statistics.median(r['client_cpu_us_per_msg'] for r in rs):.0f} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--senders", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pull-passes", type=int, default=10)
    ap.add_argument("--body", type=int, default=1024)
    ap.add_argument("--keep", action="store_true", help="leave the cluster running")
    args = ap.parse_args()
    print(f"dledger-cluster up --dir {args.dir}", file=sys.stderr)
    cluster("up", "--dir", args.dir, "--raft-port", "21470", "--http-port", "24470", "--namesrv-port", "27470")
    try:
        env = dict(os.environ, NAMESRV_ADDR="127.0.0.1:27470",
                   DLEDGER_CREDENTIALS_FILE=os.path.join(args.dir, "admin-credentials.yml"))
        subprocess.run([os.path.join(os.path.dirname(sys.executable), "mqadmin"), "updateTopic", "-c", "DefaultCluster",
                        "-t", TOPIC, "-r", str(QUEUES), "-w", str(QUEUES)], check=True, env=env, cwd=REPO,
                       capture_output=True, timeout=60)
        rows = asyncio.run(bench(args))
    finally:
        if not args.keep:
            cluster("down", "--dir", args.dir)
    print(summary(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
