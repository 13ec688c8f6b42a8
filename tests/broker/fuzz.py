"""A seeded fuzzer for every broker and NameServer endpoint, HTTP and binary (issue 10, finding 8;
issue 23).

    .venv/bin/python -m tests.broker.fuzz --seed 1 --requests 20000      # prints the figures and the time

It starts a real in-process cluster (tests/broker/inproc_cluster.py: a 3-replica group and a
NameServer, ACL on, each replica's binary port open) and sends requests built by a seeded RNG:

- HTTP, to every route of the broker and the NameServer: bodies whose fields get the right type, the
  wrong type, extreme numbers, unicode digits, lone surrogates, newlines, huge strings, unknown
  fields; random media types and encodings; mangled paths and queries; garbage instead of HTTP;
  CONNECT; truncated bodies. Most are signed as the admin (so the handlers run), some as a broker's
  account, some unsigned or with a forged signature.
- Binary (the SDK's send and pull port): SEND, PULL, PING, reserved and unknown ops, through the SDK's
  own connection (``broker/client/remoting.py``: signed as the admin, as a broker's account, or
  unsigned), and raw frames built with ``broker/protocol/frames.py`` (its encoder, header layout and
  decoder): forged, stale and cross-op signatures, bodies that are no map, unknown versions and flags,
  lengths below the header or past the cap, truncated frames, several frames at once, garbage. A
  framing change made in those modules carries over here.
- Names at every length limit and one past it: topics of 127/128 characters, groups of 120/121 and
  255/256 (the group limit, and the limit before issue 23), retry and DLQ topics of 127/128, unique
  ids of 64/65, keys, tags and client ids of 255/256, property names of 64/65, property values at
  the 32 KiB limit. A topic and a group at the limit exist, so requests naming them succeed too.

A request passes when it gets an answer within ``HANG_S`` (or, for input that never completes a
request, the connection is closed); every answer of 400 and above — an error frame on the binary
port — must carry ``{code, message}``; no answer may be a 5xx. Afterwards every replica must still
run and answer, the replicas' logs must be identical up to the commit index (chain CRC), no record
may have been refused at apply (nothing slipped past the edges' validation: docs/SECURITY.md), and
nothing may have been logged at ERROR. A failure names the seed and the request to replay it.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
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

from broker.client.remoting import RemotingConnection
from broker.client.signer import Signer
from broker.client.transport import ClientError, Transport
from broker.protocol import frames
from broker.protocol.auth import UNKNOWN_SCOPE, Credentials, authorization
from tests.acl_fixtures import ADMIN, BROKER_G0
from tests.broker.inproc_cluster import InProcBrokerCluster
from tests.dledger.harness import wait_until

HANG_S = 10.0


def quote(value: object, safe: str = "") -> str:
    return _quote(str(value), safe=safe, errors="surrogatepass")
WORKERS = 8

NAMES = ["T", "T2", "g", "%RETRY%g", "RaftNode00", "Evil\n", "a b", "", "x" * 300, "²", "..", "a/b", "\u202e"]
LIMIT_TOPIC = "t" * 127  # exists (created by prepare)
LIMIT_GROUP = "g" * 120  # exists, with a member subscribed to T and LIMIT_TOPIC
# Every name length limit, and one past it (the 255-character groups: the limit before issue 23).
LIMIT_NAMES = [LIMIT_TOPIC, "t" * 128, LIMIT_GROUP, "g" * 121, "g" * 255, "g" * 256, "%RETRY%" + LIMIT_GROUP,
               "%RETRY%" + "g" * 121, "%DLQ%" + "g" * 122, "%DLQ%" + "g" * 123, "n" * 127, "n" * 128]
STRINGS = ["", "*", "a||b", "\ud800", "\x00", "a\nb", "٣", "²", "x" * 5000, "😀", "%00", "\\", "null", "1e309",
           "A" * 70, "0" * 20, "-1", "TagA"]
INTS = [0, 1, -1, 7, 1023, 1024, 2**31, 2**63 - 1, 2**63, 2**64, -(2**63), -(2**63) - 1, 10**30]


class Gen:
    """Values for one field: usually of the right kind, sometimes anything."""

    def __init__(self, rng: random.Random, known: list[str] | None = None):
        self.r = rng
        self.known = known or ["RaftNode00:0000000000000000"]  # msg ids of stored messages (prepare)

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
        roll = self.r.random()
        if roll < 0.7:
            return self.r.choice(["T", "T", "T2", "g", "TBW102", f"Q{self.r.randrange(5)}"])
        if roll < 0.85:
            return self.r.choice(LIMIT_NAMES)
        return self.r.choice(NAMES)

    def msg_id(self) -> str:
        r = self.r
        return r.choice([*self.known, *self.known, f"RaftNode00:{r.randrange(1 << 20):016X}", "RaftNode00:" + "F" * 16,
                         "x:y", "RaftNode00:" + "Z" * 16, "n" * 128 + ":" + "0" * 16, self.name()])

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
    msg = lambda: message(g)  # noqa: E731
    choice = r.randrange(40)
    if choice <= 3:
        return "POST", "/v1/send", send_body(g), {}
    if choice <= 6:
        return "POST", "/v1/pull", pull_body(g), {}
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
        return "POST", "/v1/heartbeat", _fields(g, {
            "client_id": lambda: r.choice(["c1", "c2", "a b", "\x7f", "c" * 255, "c" * 256]), "groups": groups}), {}
    if choice == 20:
        return "POST", "/v1/unregister", _fields(g, {"client_id": lambda: r.choice(["c1", "c2"])}), {}
    if choice == 21:  # leadership transfer only with bodies that must be refused (a transfer would be real)
        return "POST", "/v1/admin/transfer", r.choice(
            [{"target": "zz"}, {"target": 5}, {"target": ["n1"]}, {"target": None, "x": 1}, {"target": "n9"}]), {}
    if choice == 22:
        return r.choice(["PUT", "PATCH", "OPTIONS", "TRACE"]), r.choice(["/v1/send", "/v1/status", "/"]), None, {}
    if choice <= 25:  # consumer retries (finding 2 of issue 23: the stored message is checked)
        return "POST", "/v1/consumer/sendback", _fields(g, {
            "group": g.name, "msg_id": g.msg_id, "position": g.small, "max_reconsume_times": g.small,
            "dlq": lambda: r.random() < 0.5}), {}
    if choice == 26:
        return "POST", "/v1/dlq/resend", _fields(g, {"group": g.name, "msg_id": g.msg_id, "position": g.small}), {}
    if choice == 27:
        return "POST", "/v1/transaction/half", _fields(g, {
            "topic": g.name, "queue_id": g.small, "producer_group": g.name,
            "messages": lambda: [msg() for _ in range(r.randrange(1, 3))]}), {}
    if choice == 28:
        return "POST", "/v1/transaction/end", _fields(g, {
            "producer_group": g.name, "topic": g.name, "msg_id": g.msg_id,
            "state": lambda: r.choice(["COMMIT_MESSAGE", "ROLLBACK_MESSAGE", "UNKNOW", "x"]),
            "transaction_id": lambda: r.choice(["U1", "U" * 64, "U" * 65]), "from_check": lambda: True}), {}
    if choice == 29:
        return "POST", "/v1/transaction/checks", _fields(g, {
            "producer_group": g.name, "topics": lambda: [g.name() for _ in range(r.randrange(0, 3))],
            "max_count": g.small, "wait_ms": lambda: r.choice([0, 50])}), {}
    if choice == 30:
        q = {"group": g.name(), "topic": g.name(), "limit": r.choice(["1", "0", "x", "99999"])}
        return "GET", "/v1/transaction/halves", None, {k: v for k, v in q.items() if r.random() < 0.6}
    if choice == 31:
        return "GET", r.choice(["/v1/producers/", "/v1/groups/"]) + quote(g.name(), safe="") + r.choice(
            ["", "/progress", "/consumers"]), None, {}
    if choice == 32:  # hot config keys: values that are refused, or the value in force (nothing changes)
        return "POST", "/v1/admin/config", r.choice([
            {"key": "longPollingMaxMs", "value": r.choice(["200", "x", "-1", "²"])},
            {"key": "autoCreateTopicEnable", "value": r.choice(["true", "maybe"])},
            {"key": "brokerName", "value": "x"}, {"key": g.junk(), "value": g.junk()}, {"x": 1}]), {}
    if choice == 33:
        return "GET", r.choice(["/v1/admin/config", "/v1/admin/refused", "/metrics"]), None, {}
    if choice == 34:
        return "POST", "/v1/admin/clean-expired-cq", r.choice([None, {}, {"x": 1}]), {}
    if choice == 35:
        path = r.choice(["broker/snapshot", "store/anchor", "meta/raft_term", "../x", "/etc/passwd", "",
                         "broker/consumequeue/T/0/min_offset", "broker/consumequeue/../0/x", "a" * 600])
        q = {"path": path, "offset": r.choice(["0", "-1", "x", "99999999999"]), "max_bytes": r.choice(["1", "0"])}
        return "GET", "/v1/replica/file", None, {k: v for k, v in q.items() if r.random() < 0.8}
    if choice == 36:
        return "GET", "/v1/replica/files", None, {"after": r.choice(["", "store", "\x00"]),
                                                  "limit": r.choice(["1", "0", "10001", "x"])}
    return "GET", "/" + "/".join(quote(g.name(), safe="") for _ in range(r.randrange(1, 4))), None, {}


def send_body(g: Gen) -> Any:
    """The map of ``POST /v1/send`` and of the binary SEND."""
    r = g.r
    return _fields(g, {"topic": g.name, "queue_id": g.small, "producer_group": g.name,
                       "messages": lambda: [message(g) for _ in range(r.randrange(1, 4))]})


def pull_body(g: Gen) -> Any:
    """The map of ``POST /v1/pull`` and of the binary PULL."""
    r = g.r
    return _fields(g, {
        "topic": g.name, "queue_id": g.small, "offset": g.small, "max_count": g.small,
        "max_bytes": lambda: r.choice([1, 100, 1 << 20]), "tags": lambda: r.choice(STRINGS),
        "suspend_ms": lambda: r.choice([0, 50]), "consumer_group": g.name,
        "sql": lambda: r.choice(["a > 1", "(", "TAGS IN ('A')", "x" * 5000])})


def message(g: Gen) -> dict[str, Any]:
    """One message of a send, its fields at and past every limit now and then."""
    r = g.r
    props = lambda: r.choice([  # noqa: E731
        {"p": "v"}, {"p" * 64: "v"}, {"p" * 65: "v"}, {"p": "v" * (32 << 10)}, {"p": "v" * ((32 << 10) + 1)},
        {f"p{i}": "v" for i in range(64)}, {f"p{i}": "v" for i in range(65)},
        {"DELAY": r.choice(["1", "2", "99", "-1", "²", "1e3", " 3 "])},
        {"TIMER_DELAY_SEC": r.choice(["1", "-99999999999", "9" * 19, "9" * 20, "٣"])},
        {"TIMER_DELIVER_MS": r.choice(["0", "99999999999999", "x"])},
        {"CHECK_IMMUNITY_TIME_IN_SECONDS": r.choice(["5", "²", "9" * 30])},
        {"__SCHED_POS": "1"}, {"REAL_TOPIC": "%DLQ%" + "g" * 200}, {"RETRY_TOPIC": "Secret"}])
    fields = {
        "body": g.pick(lambda: r.randbytes(r.randrange(1, 64))),
        "tags": g.pick(lambda: r.choice(["A", "B", "", "a" * 255, "a" * 256])),
        "keys": g.pick(lambda: r.choice([["k1", "k2"], ["k" * 255], ["k" * 256], ["k"] * 32, ["k"] * 33])),
        "properties": g.pick(props),
        "unique_id": g.pick(lambda: r.choice([f"U{r.randrange(100)}", "U" * 64, "U" * 65])),
        "born_ts": g.pick(lambda: 1), "flag": g.pick(lambda: 0),
        "born_host": g.pick(lambda: r.choice(["h", "h" * 255, "h" * 256])),
        "queue_id": g.pick(lambda: r.choice([0, 1, 1023, 1024])),
    }
    return {k: v for k, v in fields.items() if r.random() < (0.7 if k not in ("born_host", "queue_id") else 0.1)}


def namesrv_request(g: Gen) -> tuple[str, str, Any, dict[str, Any]]:
    r = g.r
    choice = r.randrange(11)
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
    if choice == 7:  # never wipes the group under test: other broker names, or write back on
        return "POST", "/v1/brokers/perm", r.choice([
            {"v": 1, "broker_name": r.choice(["Fz", "n" * 127, "n" * 128, "\x00"]), "write": r.random() < 0.5},
            {"v": 1, "broker_name": "RaftNode00", "write": True},
            {"v": 1, "broker_name": g.junk(), "write": g.junk()}]), {}
    if choice == 8:
        return "POST", "/v1/config", r.choice([{"v": 1, "key": "x", "value": "1"}, {"v": 1, "key": g.junk()},
                                               {"v": 1, "key": "scanNotActiveBrokerIntervalMs", "value": "²"}]), {}
    if choice == 9:
        return "GET", "/metrics", None, {}
    return "DELETE", "/v1/topics/" + quote(g.name(), safe=""), None, {}


def encode(g: Gen, method: str, path: str, body: Any, query: dict[str, Any], host: str) -> tuple[bytes, bool]:
    """The raw request and whether it is complete (the server must answer it)."""
    r = g.r
    target = path + ("?" + "&".join(f"{quote(k)}={quote(v)}" for k, v in query.items())
                     if query else "")
    ctype, data = "", b""
    if path == "/v1/admin/transfer":  # a body the broker must refuse, never mangled into a real transfer
        data = json.dumps(body).encode()
        auth = authorization(ADMIN, method, path, data, int(time.time() * 1000), scope=scope_of(host))
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
        headers.append("Authorization: " + authorization(signed_as, method, target, data, int(time.time() * 1000),
                                                         scope=scope_of(host)))
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
    http: int = 0
    binary: int = 0  # through the SDK's connection
    raw_frames: int = 0  # hand-built frames on a fresh connection
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
        return (f"{self.requests} requests ({self.http} HTTP, {self.binary} binary, {self.raw_frames} raw frames): "
                f"{self.answered} answered, {self.closed_unanswered} closed unanswered, "
                f"{self.hangs} hangs, {self.five_xx} x 5xx, {self.uncoded_errors} errors without a code; "
                f"statuses {dict(sorted(self.by_status.items()))}; top codes: {top}")

    def answer(self, status: int, coded: bool, code: str | None, where: str) -> None:
        self.answered += 1
        self.by_status[status] += 1
        if status >= 500:
            self.five_xx += 1
            self.failures.append(f"{status} {code}: {where}")
        if status >= 400:
            if coded and code:
                self.by_code[code] += 1
            else:
                self.uncoded_errors += 1
                self.failures.append(f"{status} without a code: {where}")


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


# -- the binary port ------------------------------------------------------------------------------------
BINARY_OPS = [int(frames.Op.SEND)] * 4 + [int(frames.Op.PULL)] * 4 + [int(frames.Op.PING), 3, 0, 99, 0xFFFF]
SIGNERS: dict[str, Credentials | None] = {"admin": ADMIN, "broker": BROKER_G0, "unsigned": None}


def binary_request(g: Gen) -> tuple[int, Any]:
    """(op, body) for the SDK's connection: the maps of /v1/send and /v1/pull, or anything."""
    r = g.r
    op = r.choice(BINARY_OPS)
    if r.random() < 0.1:
        return op, g.junk()  # a body that is no map
    return op, send_body(g) if op == frames.Op.SEND else pull_body(g)


def raw_frames(g: Gen, addr: str) -> tuple[bytes, int | None]:
    """Hand-built bytes for a fresh binary connection and the request id an answer must carry
    (None: the stream is malformed, the broker may close it after an error frame)."""
    r = g.r
    rid = r.randrange(1, 1 << 20)
    op = r.choice([int(frames.Op.SEND), int(frames.Op.PULL), int(frames.Op.PING), 77])
    body = frames.pack_body(packable(r.choice([{"topic": "T", "queue_id": 0, "offset": 0},
                                               {"topic": "T", "messages": [{"body": b"x"}]}, {}, {"x": g.junk()}])))
    now_ms = int(time.time() * 1000)
    scope = scope_of(addr)
    kind = r.randrange(12)
    if kind == 0:  # forged signature
        auth = "DLEDGER-HMAC-SHA256 AccessKey=admin, Timestamp=1, Nonce=" + "0" * 32 + ", Signature=" + "A" * 43 + "="
        return frames.encode(op, rid, body, auth=auth), rid
    if kind == 1:  # a signature an hour old
        return frames.encode(op, rid, body, auth=authorization(ADMIN, frames.AUTH_METHOD, frames.op_name(op), body,
                                                               now_ms - 3_600_000, scope=scope)), rid
    if kind == 2:  # signed for another op
        return frames.encode(op, rid, body, auth=authorization(ADMIN, frames.AUTH_METHOD, "PING", body, now_ms,
                                                               scope=scope)), rid
    if kind == 3:  # signed over another body
        return frames.encode(op, rid, body, auth=authorization(ADMIN, frames.AUTH_METHOD, frames.op_name(op), b"x",
                                                               now_ms, scope=scope)), rid
    if kind == 4:  # a body that is no msgpack map
        data = r.choice([b"\xc1", frames.pack_body([1, 2]), r.randbytes(20)])
        return frames.encode(op, rid, data, auth=authorization(ADMIN, frames.AUTH_METHOD, frames.op_name(op), data,
                                                               now_ms, scope=scope)), rid
    if kind == 5:  # two requests in one write, the second unsigned
        signed = authorization(ADMIN, frames.AUTH_METHOD, frames.op_name(op), body, now_ms, scope=scope)
        return frames.encode(op, rid, body, auth=signed) + frames.encode(op, rid + 1, body), rid
    auth = b""
    if kind == 6:  # an unknown version
        return frames.HEADER.pack(frames.LENGTH_MIN + len(body), 9, 0, op, rid, 0) + body, None
    if kind == 7:  # unknown flags, or a response flag on a request
        return frames.HEADER.pack(frames.LENGTH_MIN + len(body), frames.VERSION, r.choice([0x80, 0x01]), op, rid,
                                  0) + body, None
    if kind == 8:  # a length below the header, or past any cap
        return frames.HEADER.pack(r.choice([0, 3, 2**32 - 1, 64 << 20]), frames.VERSION, 0, op, rid, 0), None
    if kind == 9:  # a signature longer than its frame, or than the cap
        n = r.choice([frames.AUTH_BYTES_MAX + 1, 40])
        return frames.HEADER.pack(frames.LENGTH_MIN + 10, frames.VERSION, 0, op, rid, n) + auth + b"x" * 10, None
    if kind == 10:  # a frame cut short (the rest never comes)
        whole = frames.encode(op, rid, body)
        return whole[: r.randrange(1, len(whole))], None
    return r.randbytes(r.randrange(1, 200)), None  # garbage


def packable(obj: Any) -> Any:
    """``obj``, or a map standing for it when msgpack cannot carry it (10**30, a lone surrogate)."""
    try:
        frames.pack_body(obj)
    except (TypeError, ValueError, OverflowError):
        return {"junk": repr(obj)[:200]}
    return obj


def _error_map(body: bytes) -> dict[str, Any] | None:
    try:
        value = msgpack.unpackb(body, raw=False, strict_map_key=False)
    except Exception:
        return None
    return value if isinstance(value, dict) else None


async def _raw_exchange(addr: str, data: bytes, rid: int | None) -> list[frames.Frame] | None:
    """Send ``data`` on a fresh connection; the frames read until the answer to ``rid`` (or, for a
    malformed stream, until the broker closes it). None: no answer to ``rid`` before the close."""
    host, _, port = addr.rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    decoder = frames.FrameDecoder()
    got: list[frames.Frame] = []
    try:
        writer.write(data)
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        while True:
            try:
                chunk = await reader.read(65536)
            except ConnectionError:
                chunk = b""
            if not chunk:
                return got if rid is None else None
            decoder.feed(chunk)
            while (frame := decoder.next()) is not None:
                got.append(frame)
                if rid is not None and frame.request_id == rid:
                    return got
                if frame.request_id == 0 and frame.is_error and rid is not None:
                    return None  # the broker refused the stream before answering
    finally:
        writer.close()


def _check_frames(figures: Figures, got: list[frames.Frame], where: str) -> None:
    for frame in got:
        if not frame.is_error:
            figures.answer(200, True, None, where)
            continue
        doc = _error_map(frame.body)
        status = doc.get("status") if doc is not None else None
        status = status if isinstance(status, int) else 500
        coded = doc is not None and isinstance(doc.get("code"), str) and isinstance(doc.get("message"), str)
        figures.answer(status, coded, doc.get("code") if doc else None, where)


# -- a run ---------------------------------------------------------------------------------------------
SCOPES: dict[str, str] = {}  # each server's signing scope, by address (filled by ``prepare``)


def scope_of(addr: str) -> str:
    return SCOPES.get(addr, UNKNOWN_SCOPE)


@dataclasses.dataclass
class Endpoints:
    brokers: list[str]  # HTTP
    remoting: list[str]  # binary
    namesrvs: list[str]
    known: list[str]  # msg ids of stored messages


async def run(cluster: InProcBrokerCluster, seed: int, requests: int, workers: int = WORKERS) -> Figures:
    figures = Figures()
    ends = await prepare(cluster)
    counter = iter(range(requests))

    async def worker(w: int) -> None:
        rng = random.Random(f"{seed}/{w}")
        g = Gen(rng, ends.known)
        conns: dict[tuple[str, str], RemotingConnection] = {}
        try:
            for i in counter:
                figures.requests += 1
                roll = rng.random()
                if roll < 0.35:
                    await _binary_one(figures, g, ends, conns, f"seed {seed} worker {w} request {i}")
                    continue
                figures.http += 1
                to_ns = roll < 0.55
                addr = rng.choice(ends.namesrvs if to_ns else ends.brokers)
                method, path, body, query = (namesrv_request if to_ns else broker_request)(g)
                raw, complete = encode(g, method, path, body, query, addr)
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
                code = None
                if _coded(answer, ctype):
                    doc = msgpack.unpackb(answer, raw=False) if "msgpack" in ctype else json.loads(answer)
                    code = doc["code"]
                figures.answer(status, code is not None, code, where + f" -> {answer[:200]!r}")
        finally:
            for c in conns.values():
                await c.close()

    await asyncio.gather(*(worker(w) for w in range(workers)))
    return figures


async def _binary_one(figures: Figures, g: Gen, ends: Endpoints, conns: dict[tuple[str, str], RemotingConnection],
                      where: str) -> None:
    r = g.r
    addr = r.choice(ends.remoting)
    if r.random() < 0.3:
        figures.raw_frames += 1
        data, rid = raw_frames(g, addr)
        where += f" raw {data[:80]!r}"
        try:
            got = await asyncio.wait_for(_raw_exchange(addr, data, rid), HANG_S)
        except TimeoutError:
            figures.hangs += 1
            figures.failures.append("hang: " + where)
            return
        if got is None:
            figures.closed_unanswered += 1
            figures.failures.append("closed without an answer: " + where)
            return
        if not got:
            figures.closed_unanswered += 1  # a malformed stream closed without an error frame: allowed
            return
        _check_frames(figures, got, where)
        return
    figures.binary += 1
    signer = r.choices(list(SIGNERS), weights=[85, 5, 10])[0]
    conn = conns.get((addr, signer))
    if conn is None:
        conn = conns[(addr, signer)] = RemotingConnection(addr, error=ClientError, signer=Signer(SIGNERS[signer]))
    op, body = binary_request(g)
    body = packable(body)
    where += f" binary op {op} as {signer}: {str(body)[:160]}"
    try:
        answer = await conn.call(op, body, HANG_S)
    except ClientError as exc:
        if exc.code == "TIMEOUT":
            figures.hangs += 1
            figures.failures.append("hang: " + where)
        elif exc.code in ("CONNECTION_LOST", "CONNECT_FAILED", "BAD_ANSWER"):
            figures.closed_unanswered += 1
            figures.failures.append(f"{exc.code} {exc.message}: " + where)
        else:  # an error frame: the SDK reads {code, message, status}; a missing code reads as "ERROR"
            figures.answer(exc.status, exc.code != "ERROR" and bool(exc.message), exc.code, where)
        return
    figures.answer(200, True, None, where)
    del answer


FUZZ_BROKER = {"longPollingMaxMs": "200", "serverBodyTimeoutMs": "500", "serverHeaderTimeoutMs": "1000",
               "remotingListenPort": "0"}
FUZZ_NAMESRV = {"body_timeout_ms": 500, "header_timeout_ms": 1000}


async def fuzz_cluster(root: str) -> InProcBrokerCluster:
    return await InProcBrokerCluster.start(root, broker_props=FUZZ_BROKER, namesrv_cfg=FUZZ_NAMESRV)


async def prepare(cluster: InProcBrokerCluster) -> Endpoints:
    """Topics and a group at the name limits, a member subscribed, a few stored messages."""
    g = cluster.groups[0]
    leader = g.replica("n0")
    for topic in ("T", "T2", LIMIT_TOPIC):
        await cluster.call(leader.addr, "POST", "/v1/topics", {"topic": topic, "read_queue_nums": 4,
                                                               "write_queue_nums": 4, "perm": 6})
    await cluster.call(leader.addr, "POST", "/v1/groups", {"group": LIMIT_GROUP})
    for r in g.replicas:
        await cluster.call(r.addr, "POST", "/v1/heartbeat", {"client_id": "fuzz-member", "groups": [
            {"group": LIMIT_GROUP, "topics": ["T", LIMIT_TOPIC]}, {"group": "g", "topics": ["T", "T2"]}]})
    known = []
    for topic in ("T", LIMIT_TOPIC):
        sent = await cluster.call(leader.addr, "POST", "/v1/send", {"topic": topic, "queue_id": 0, "messages": [
            {"body": b"fuzz-%d" % i, "keys": ["k1"], "unique_id": f"P{topic[:1]}{i}"} for i in range(3)]})
        known += [x["msg_id"] for x in sent["results"]]
    remoting = [r.broker.remoting_address for r in g.replicas]
    assert all(remoting), "the binary port is off"
    for r in g.replicas:  # a signature names its server (issue 23): the fuzz signs for the right one
        SCOPES[r.addr] = SCOPES[r.broker.remoting_address] = r.broker.security.scope
    for ns in cluster.namesrvs:
        SCOPES[ns.addr] = ns.service.security.scope
    return Endpoints([r.addr for r in g.replicas], [a for a in remoting if a], [ns.addr for ns in cluster.namesrvs],
                     known)


async def check_after(cluster: InProcBrokerCluster) -> list[str]:
    """What must hold once the fuzz is done: every replica and NameServer runs and answers, the
    replicas' logs are identical up to the commit index, and no record was refused at apply."""
    problems = []
    g = cluster.groups[0]
    for r in g.replicas:
        if not r.alive or r.broker.node.fatal is not None:
            problems.append(f"{r} stopped: {r.broker.node.fatal if r.alive else 'down'}")
    if problems:
        return problems
    t = Transport(timeout_s=5.0, credentials=None, tls=None)
    try:
        for r in g.replicas:
            if (await t.call(r.addr, "GET", "/v1/status"))["role"] not in ("LEADER", "FOLLOWER"):
                problems.append(f"{r} has no role")
        for ns in cluster.namesrvs:
            await t.call(ns.addr, "GET", "/v1/status")
    finally:
        await t.close()
    await g.wait_replicated()
    commit = min(r.broker.node.commit_index for r in g.replicas)
    await wait_until(lambda: all(r.broker.node.applied_index >= commit for r in g.replicas), 20.0, "every replica")
    crcs = {r.nid: r.broker.node.chain_crc_at(commit) for r in g.replicas}
    if len(set(crcs.values())) != 1:
        problems.append(f"the replicas' logs differ at commit index {commit}: {crcs}")
    for r in g.replicas:
        refused = r.broker.store.refusals.view()
        if refused["total"]:
            problems.append(f"{r} refused {refused['total']} record(s) at apply: {refused['recent'][:3]}")
    return problems


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
        problems: list[str] = []
        with tempfile.TemporaryDirectory() as root:
            cluster = await fuzz_cluster(f"{root}/cluster")
            try:
                started = time.monotonic()
                figures = await run(cluster, seed, requests)
                elapsed = time.monotonic() - started
                problems = await check_after(cluster)
            finally:
                await cluster.stop()
        logging.getLogger().removeHandler(errors)
        print(f"seed {seed}: {figures.line()} in {elapsed:.0f} s; {len(errors.records)} errors logged")
        for f in figures.failures[:10]:
            print("  FAIL", f)
        for p in problems:
            print("  AFTER", p)
        for rec in errors.records[:5]:
            print("  LOGGED", rec.levelname, rec.name, rec.getMessage()[:200])
        bad += len(figures.failures) + len(errors.records) + len(problems)
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
