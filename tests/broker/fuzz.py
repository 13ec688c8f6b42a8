"""A seeded fuzzer for every broker and NameServer endpoint (issue 10, finding 8), over raw sockets.

    .venv/bin/python -m tests.broker.fuzz --seed 1 --requests 20000      # prints the figures

It starts an in-process 3-replica group and a NameServer with ACL on, then sends requests built by
a seeded RNG: each endpoint with bodies whose fields get the right type, the wrong type, extreme
numbers, unicode digits, lone surrogates, newlines, huge strings, unknown fields; random media
types and encodings; mangled paths and queries; garbage instead of HTTP; CONNECT; truncated bodies.
Most requests are signed with the admin account (so the handlers run), some with no or a forged
signature. A request passes when it gets an answer (or, for input that never completes a request,
the connection is closed) within ``HANG_S``; every answer of 400 and above must carry
``{code, message}``; no answer may be a 5xx; the servers must still answer afterwards and must
not have logged an error. A failure names the seed and the request number to replay it.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import dataclasses
import json
import logging
import random
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote as _quote

import msgpack

from broker.protocol.auth import authorization
from tests.acl_fixtures import ADMIN, BROKER_G0, write_acl
from tests.broker.harness import BrokerCluster

HANG_S = 10.0


def quote(value: object, safe: str = "") -> str:
    return _quote(str(value), safe=safe, errors="surrogatepass")
WORKERS = 8

NAMES = ["T", "T2", "g", "%RETRY%g", "RaftNode00", "Evil\n", "a b", "", "x" * 300, "²", "..", "a/b", "\u202e"]
STRINGS = ["", "*", "a||b", "\ud800", "\x00", "a\nb", "٣", "²", "x" * 5000, "😀", "%00", "\\", "null", "1e309",
           "A" * 70, "0" * 20, "-1", "TagA"]
INTS = [0, 1, -1, 7, 1023, 1024, 2**31, 2**63 - 1, 2**63, 2**64, -(2**63), -(2**63) - 1, 10**30]


class Gen:
    """Values for one field: usually of the right kind, sometimes anything."""

    def __init__(self, rng: random.Random):
        self.r = rng

    def junk(self, depth: int = 0) -> Any:
        r = self.r
        kind = r.randrange(9 if depth < 3 else 6)
        if kind == 0:
            return r.choice(INTS)
        if kind == 1:
            return r.choice(STRINGS)
        if kind == 2:
            return r.choice([None, True, False])
        if kind == 3:
            return r.choice([0.5, -0.0, 1e300, float("inf")])
        if kind == 4:
            return r.randbytes(r.randrange(0, 40))
        if kind == 5:
            return r.choice(NAMES)
        if kind == 6:
            return [self.junk(depth + 1) for _ in range(r.randrange(0, 5))]
        if kind == 7:
            return {self.key(): self.junk(depth + 1) for _ in range(r.randrange(0, 5))}
        return r.randrange(-5, 70000)

    def key(self) -> Any:
        return self.r.choice(["topic", "group", "x", "v", "0", "²", "\ud800", "", "offsets", "messages"])

    def pick(self, good: Callable[[], Any]) -> Any:
        return good() if self.r.random() < 0.8 else self.junk()

    def name(self) -> str:
        return self.r.choice(["T", "T", "T2", "g", "TBW102", f"Q{self.r.randrange(5)}"]) if self.r.random() < 0.85 \
            else self.r.choice(NAMES)

    def small(self) -> int:
        return self.r.randrange(0, 8) if self.r.random() < 0.85 else self.r.choice(INTS)


def _fields(g: Gen, spec: dict[str, Callable[[], Any]]) -> dict[str, Any]:
    r = g.r
    out = {k: g.pick(f) for k, f in spec.items() if r.random() < 0.9}
    if r.random() < 0.1:
        out[g.key()] = g.junk()
    return out


def broker_request(g: Gen) -> tuple[str, str, Any, dict[str, Any]]:
    """(method, path, body or None, query)."""
    r = g.r
    msg = lambda: {k: v for k, v in {  # noqa: E731
        "body": g.pick(lambda: r.randbytes(r.randrange(1, 64))), "tags": g.pick(lambda: r.choice(["A", "B", ""])),
        "keys": g.pick(lambda: ["k1", "k2"]), "properties": g.pick(lambda: {"p": "v"}),
        "unique_id": g.pick(lambda: f"U{r.randrange(100)}"), "born_ts": g.pick(lambda: 1), "flag": g.pick(lambda: 0),
    }.items() if r.random() < 0.7}
    choice = r.randrange(24)
    if choice <= 3:
        return "POST", "/v1/send", _fields(g, {"topic": g.name, "queue_id": g.small, "producer_group": g.name,
                                               "messages": lambda: [msg() for _ in range(r.randrange(1, 4))]}), {}
    if choice <= 6:
        return "POST", "/v1/pull", _fields(g, {
            "topic": g.name, "queue_id": g.small, "offset": g.small, "max_count": g.small,
            "max_bytes": lambda: r.choice([1, 100, 1 << 20]), "tags": lambda: r.choice(STRINGS),
            "suspend_ms": lambda: r.choice([0, 50]), "consumer_group": g.name}), {}
    if choice == 7:
        return "GET", "/v1/msg/id/" + quote(r.choice([f"RaftNode00:{r.randrange(1 << 20):016X}", "x:y",
                                                      "RaftNode00:" + "Z" * 16, g.name()]), safe=""), None, {}
    if choice == 8:
        path = r.choice(["/v1/msg/key", "/v1/msg/unique", "/v1/msg/offset", "/v1/offset/search"])
        q = {"topic": g.name(), "key": r.choice(STRINGS), "unique_id": r.choice(["U1", "\x00", "a/b"]),
             "queue_id": r.choice(["0", "1", "²", "-1", "x"]), "offset": r.choice(["0", "99", "1e3"]),
             "ts": r.choice(["0", "99999999999999", "x"]), "max": r.choice(["1", "0", "999999"])}
        return "GET", path, None, {k: v for k, v in q.items() if r.random() < 0.7}
    if choice == 9:
        return "POST", "/v1/topics", _fields(g, {
            "topic": g.name, "read_queue_nums": g.small, "write_queue_nums": g.small,
            "perm": lambda: r.choice([6, 2, 4, 7, 8]), "order": lambda: r.random() < 0.5}), {}
    if choice == 10:
        return r.choice(["GET", "DELETE"]), "/v1/topics/" + quote(g.name(), safe=""), None, {}
    if choice == 11:
        return "GET", r.choice(["/v1/topics", "/v1/groups", "/v1/status"]), None, {}
    if choice == 12:
        return "GET", "/v1/topics/" + quote(g.name(), safe="") + "/status", None, {}
    if choice == 13:
        return "POST", "/v1/groups", _fields(g, {"group": g.name, "consume_enable": lambda: True,
                                                 "consume_broadcast_enable": lambda: False,
                                                 "retry_max_times": g.small}), {}
    if choice == 14:
        tail = r.choice(["", "/progress", "/consumers"])
        return ("DELETE" if not tail else "GET"), "/v1/groups/" + quote(g.name(), safe="") + tail, None, (
            {"topic": g.name()} if r.random() < 0.3 else {})
    if choice == 15:
        offsets = lambda: {r.choice(["0", "1", "²", "١", "x", 0, 1, -1]): r.choice(INTS) for _ in range(2)}  # noqa: E731
        return "POST", "/v1/offsets", _fields(g, {"group": g.name, "topic": g.name, "offsets": offsets,
                                                  "reset_generation": g.small}), {}
    if choice == 16:
        return "GET", "/v1/offsets", None, {"group": g.name(), "topic": g.name()}
    if choice == 17:
        offsets = lambda: {r.choice(["0", "²", 0]): r.choice(INTS)}  # noqa: E731
        body = _fields(g, {"group": g.name, "topic": g.name, "ts": g.small, "offsets": offsets})
        return "POST", "/v1/offsets/reset", body, {}
    if choice <= 19:
        groups = lambda: [{"group": g.name(), "topics": [g.name() for _ in range(r.randrange(0, 3))],  # noqa: E731
                           "model": r.choice(["CLUSTERING", "BROADCASTING", "P2P"])} for _ in range(r.randrange(0, 3))]
        return "POST", "/v1/heartbeat", _fields(g, {"client_id": lambda: r.choice(["c1", "c2", "a b", "\x7f"]),
                                                    "groups": groups}), {}
    if choice == 20:
        return "POST", "/v1/unregister", _fields(g, {"client_id": lambda: r.choice(["c1", "c2"])}), {}
    if choice == 21:  # leadership transfer only with bodies that must be refused (a transfer would be real)
        return "POST", "/v1/admin/transfer", r.choice(
            [{"target": "zz"}, {"target": 5}, {"target": ["n1"]}, {"target": None, "x": 1}, {"target": "n9"}]), {}
    if choice == 22:
        return r.choice(["PUT", "PATCH", "OPTIONS", "TRACE"]), r.choice(["/v1/send", "/v1/status", "/"]), None, {}
    return "GET", "/" + "/".join(quote(g.name(), safe="") for _ in range(r.randrange(1, 4))), None, {}


def namesrv_request(g: Gen) -> tuple[str, str, Any, dict[str, Any]]:
    r = g.r
    choice = r.randrange(8)
    if choice <= 2:
        topics = lambda: [_fields(g, {"topic": g.name, "read_queue_nums": g.small, "write_queue_nums": g.small,  # noqa: E731
                                      "perm": g.small, "order": lambda: False}) for _ in range(r.randrange(0, 3))]
        body = _fields(g, {"cluster": lambda: "FuzzCluster", "broker_name": lambda: r.choice(["RaftNode00", "Fz"]),
                           "broker_id": g.small, "address": lambda: r.choice(["127.0.0.1:1", "h:0", "x", "1.2.3.4:5"]),
                           "role": lambda: r.choice(["LEADER", "FOLLOWER", "CANDIDATE", "KING"]),
                           "term": lambda: r.choice([0, 1, 2**63 - 1]), "topics": topics,
                           "data_version": g.small, "heartbeat_timeout_ms": lambda: r.choice([None, 1, 10**12])})
        body.setdefault("v", 1) if r.random() < 0.9 else None
        return "POST", "/v1/brokers/register", body, {}
    if choice == 3:
        body = _fields(g, {"v": lambda: 1, "cluster": lambda: "FuzzCluster", "broker_name": g.name,
                           "address": lambda: "127.0.0.1:1"})
        return "POST", "/v1/brokers/unregister", body, {}
    if choice == 4:
        return r.choice(["GET", "DELETE"]), "/v1/routes/" if r.random() < 0.1 else (
            "/v1/" + r.choice(["routes", "topics"]) + "/" + quote(g.name(), safe="")), None, (
            {"v": r.choice(["1", "2", "x"])} if r.random() < 0.3 else {})
    if choice == 5:
        return "GET", r.choice(["/v1/clusters", "/v1/topics", "/v1/status"]), None, (
            {"v": r.choice(["1", "2"])} if r.random() < 0.3 else {})
    if choice == 6:
        return r.choice(["PUT", "POST"]), r.choice(["/v1/clusters", "/v1/status", "/x"]), None, {}
    return "DELETE", "/v1/topics/" + quote(g.name(), safe=""), None, {}


def encode(g: Gen, method: str, path: str, body: Any, query: dict[str, Any], host: str) -> tuple[bytes, bool]:
    """The raw request and whether it is complete (the server must answer it)."""
    r = g.r
    target = path + ("?" + "&".join(f"{quote(k)}={quote(v)}" for k, v in query.items())
                     if query else "")
    ctype, data = "", b""
    if path == "/v1/admin/transfer":  # a body the broker must refuse, never mangled into a real transfer
        data = json.dumps(body).encode()
        auth = authorization(ADMIN, method, path, data, int(time.time() * 1000))
        return (f"POST {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\nContent-Type: application/json\r\n"
                f"Authorization: {auth}\r\nContent-Length: {len(data)}\r\n\r\n").encode() + data, True
    if body is not None:
        mode = r.random()
        if mode < 0.5:
            ctype = "application/x-msgpack"
            try:
                data = msgpack.packb(body, use_bin_type=True)
            except (TypeError, ValueError, OverflowError, UnicodeEncodeError):
                ctype, mode = "application/json", 0.8
        if mode >= 0.5:
            ctype = ctype or "application/json"
            data = json.dumps(body, default=lambda b: b.hex() if isinstance(b, bytes) else str(b)).encode(
                "utf-8", "surrogatepass")
        if r.random() < 0.05:
            ctype = r.choice(["text/plain", "application/x-www-form-urlencoded", "multipart/form-data", "", "a/b;c"])
        if r.random() < 0.03:
            data = r.randbytes(r.randrange(0, 200))
    headers = [f"Host: {host}", "Connection: close"]
    if ctype:
        headers.append(f"Content-Type: {ctype}")
    complete = True
    roll = r.random()
    if roll < 0.03:
        headers.append("Content-Encoding: " + r.choice(["gzip", "deflate", "br", "zstd", "x"]))
    elif roll < 0.05:
        headers.append("Transfer-Encoding: chunked")
        data = f"{len(data):x}\r\n".encode() + data + b"\r\n0\r\n\r\n" if r.random() < 0.5 else b"zz\r\n" + data
    elif roll < 0.06:
        headers.append("Expect: 100-continue")
    elif roll < 0.07:
        headers.append("X-Big: " + "h" * r.choice([100, 9000]))
    if r.random() < 0.9:
        signed_as = ADMIN if r.random() < 0.95 else BROKER_G0
        headers.append("Authorization: " + authorization(signed_as, method, target, data, int(time.time() * 1000)))
    elif r.random() < 0.5:
        headers.append("Authorization: DLEDGER-HMAC-SHA256 AccessKey=admin, Timestamp=1, Nonce=" + "0" * 32
                       + ", Signature=" + "A" * 43 + "=")
    if "Transfer-Encoding: chunked" not in headers:
        length = len(data)
        if r.random() < 0.01:  # a body that never completes (answered after serverBodyTimeoutMs)
            length += r.randrange(1, 100)
            complete = False
        headers.append(f"Content-Length: {length}")
    raw = (f"{method} {target} HTTP/1.1\r\n" + "\r\n".join(headers) + "\r\n\r\n").encode("utf-8", "surrogatepass")
    raw += data
    if r.random() < 0.02:
        raw = garbage(g)
        complete = False
    return raw, complete


def garbage(g: Gen) -> bytes:
    r = g.r
    return r.choice([
        lambda: r.randbytes(r.randrange(1, 300)),
        lambda: b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03" + r.randbytes(40),  # a TLS hello
        lambda: b"CONNECT a:1 HTTP/1.1\r\nHost: a\r\n\r\nGET /v1/status HTTP/1.1\r\n\r\n",
        lambda: b"GET /v1/status HTTP/9.9\r\n\r\n",
        lambda: b"G\x00T / HTTP/1.1\r\n\r\n",
        lambda: b"GET /v1/status HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\nxx",
        lambda: b"GET " + b"/" * 10000 + b" HTTP/1.1\r\n\r\n",
        lambda: b"POST /v1/send HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
        lambda: b"\r\n\r\n\r\n",
    ])()


@dataclasses.dataclass
class Figures:
    requests: int = 0
    answered: int = 0
    closed_unanswered: int = 0
    hangs: int = 0
    five_xx: int = 0
    uncoded_errors: int = 0
    by_status: collections.Counter[int] = dataclasses.field(default_factory=collections.Counter)
    by_code: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    failures: list[str] = dataclasses.field(default_factory=list)

    def line(self) -> str:
        top = ", ".join(f"{c} {n}" for c, n in self.by_code.most_common(8))
        return (f"{self.requests} requests: {self.answered} answered, {self.closed_unanswered} closed unanswered, "
                f"{self.hangs} hangs, {self.five_xx} x 5xx, {self.uncoded_errors} errors without a code; "
                f"statuses {dict(sorted(self.by_status.items()))}; top codes: {top}")


async def _exchange(addr: str, raw: bytes) -> tuple[int, bytes, str] | None:
    """(status, body, content type), or None when the server closed without an answer."""
    host, _, port = addr.rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(raw)
        try:
            await writer.drain()
        except ConnectionError:
            pass
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            while head.split(b" ", 2)[1:2] == [b"100"]:  # an interim "100 Continue" (Expect: 100-continue)
                head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            return None
        lines = head.decode("latin-1").split("\r\n")
        hdrs = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
        try:
            body = await reader.readexactly(int(hdrs.get("content-length", "0")))
        except (asyncio.IncompleteReadError, ConnectionError):
            body = b""
        return int(lines[0].split()[1]), body, hdrs.get("content-type", "")
    finally:
        writer.close()


def _coded(body: bytes, ctype: str) -> bool:
    try:
        doc = msgpack.unpackb(body, raw=False) if "msgpack" in ctype else json.loads(body)
    except Exception:
        return False
    return isinstance(doc, dict) and isinstance(doc.get("code"), str) and isinstance(doc.get("message"), str)


async def run(cluster: BrokerCluster, seed: int, requests: int, workers: int = WORKERS) -> Figures:
    figures = Figures()
    broker_addrs = [b.cfg.address for b in cluster.brokers.values()]
    ns_addrs = [ns.addr for ns in cluster.namesrvs]
    counter = iter(range(requests))

    async def worker(w: int) -> None:
        rng = random.Random(f"{seed}/{w}")
        g = Gen(rng)
        for i in counter:
            to_ns = rng.random() < 0.3
            addr = rng.choice(ns_addrs if to_ns else broker_addrs)
            method, path, body, query = (namesrv_request if to_ns else broker_request)(g)
            raw, complete = encode(g, method, path, body, query, addr)
            figures.requests += 1
            where = f"seed {seed} worker {w} request {i}: {raw[:160]!r}"
            try:
                got = await asyncio.wait_for(_exchange(addr, raw), HANG_S)
            except TimeoutError:
                figures.hangs += 1
                figures.failures.append("hang: " + where)
                continue
            if got is None:
                figures.closed_unanswered += 1
                if complete:
                    figures.failures.append("closed without an answer: " + where)
                continue
            status, answer, ctype = got
            figures.answered += 1
            figures.by_status[status] += 1
            if status >= 500:
                figures.five_xx += 1
                figures.failures.append(f"{status} {answer[:200]!r}: " + where)
            if status >= 400:
                if _coded(answer, ctype):
                    doc = msgpack.unpackb(answer, raw=False) if "msgpack" in ctype else json.loads(answer)
                    figures.by_code[doc["code"]] += 1
                else:
                    figures.uncoded_errors += 1
                    figures.failures.append(f"{status} without a code {answer[:200]!r}: " + where)

    await asyncio.gather(*(worker(w) for w in range(workers)))
    return figures


FUZZ_CLUSTER = {"longPollingMaxMs": 200, "serverBodyTimeoutMs": 500, "serverHeaderTimeoutMs": 1000}


async def fuzz_cluster(root: str) -> BrokerCluster:
    acl = write_acl(f"{root}/plain_acl.yml")
    cluster = BrokerCluster(root, acl_file=acl, **FUZZ_CLUSTER)
    for ns in cluster.namesrvs:
        ns.cfg = dataclasses.replace(ns.cfg, body_timeout_ms=500, header_timeout_ms=1000)
        from namesrv.server import NamesrvService

        ns.service = NamesrvService(ns.cfg)
    await cluster.start()
    return cluster


class ErrorLog(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.ERROR or record.exc_info:
            self.records.append(record)


async def main_async(seeds: list[int], requests: int) -> int:
    bad = 0
    for seed in seeds:
        errors = ErrorLog()
        logging.getLogger().addHandler(errors)
        with tempfile.TemporaryDirectory() as root:
            cluster = await fuzz_cluster(root)
            try:
                started = time.monotonic()
                figures = await run(cluster, seed, requests)
                elapsed = time.monotonic() - started
                alive = await run(cluster, seed + 10_000, 0)  # (no-op; the servers still answer:)
                from broker.client.transport import Transport

                t = Transport(timeout_s=5.0, credentials=None, tls=None)
                for b in cluster.brokers.values():
                    await t.call(b.cfg.address, "GET", "/v1/status")
                for ns in cluster.namesrvs:
                    await t.call(ns.addr, "GET", "/v1/status")
                await t.close()
                del alive
            finally:
                await cluster.stop()
        logging.getLogger().removeHandler(errors)
        print(f"seed {seed}: {figures.line()} in {elapsed:.0f} s; {len(errors.records)} errors logged")
        for f in figures.failures[:10]:
            print("  FAIL", f)
        for rec in errors.records[:5]:
            print("  LOGGED", rec.levelname, rec.name, rec.getMessage()[:200])
        bad += len(figures.failures) + len(errors.records)
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.broker.fuzz", description=__doc__.split("\n")[0])
    p.add_argument("--seed", type=int, action="append", help="repeatable (default: 1 and 2)")
    p.add_argument("--requests", type=int, default=20_000, help="per seed (default 20000)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    return asyncio.run(main_async(args.seed or [1, 2], args.requests))


if __name__ == "__main__":
    sys.exit(main())
