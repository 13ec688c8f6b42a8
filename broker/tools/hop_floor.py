"""``mq-bench hop-floor``: the floor of a synchronous send's chain in Python on this machine (issue 26).

The same topology as a send to a group of three replicas, with nothing else in it: a client, a
"leader" and two "followers", each its own process on 127.0.0.x, over TCP, written as well as we
know how in Python (asyncio on uvloop as the product runs, TCP_NODELAY, 4-byte length-prefixed
frames parsed from each read, no pickle). Per message (``--size`` bytes, 1 KiB by default)::

    client ──request──▶ leader: append to its file, one frame per follower ──▶ follower 1, 2:
                        fdatasync (--sync)                                      append, fdatasync, ack
    client ◀──answer─── leader: once its own fdatasync and one follower's  ◀── (a majority of 3)
                        ack cover the message

Whatever arrives in one loop turn travels together, as in the product: the leader replicates the
requests of one turn as one frame per follower and answers them in one write; a follower writes
each frame of one read, then syncs and acks once for them all; the client writes the requests of
one turn at once. ``--sync``: ``inline`` (fdatasync on the loop), ``thread`` (one flusher thread per
process with group commit, as ``dledger/flusher.py``: one job in flight, the next covers what was
written meanwhile, its completion one ``call_soon_threadsafe``), ``none`` (no fdatasync).
``--crypto``: every peer frame sealed with AES-256-GCM (a key per direction, the nonce the frame's
sequence number, as ``dledger/peer_tcp.py``). ``--codec msgpack``: every frame's fields as one
msgpack array instead of fixed binary headers.

Not in it (what the product does on top of this floor): Raft (terms, per-peer match indices,
heartbeats, elections, the pysyncobj tick), entry headers and CRCs, the index file, request
signatures, the message record codec, apply (consume queue, de-dup window, key index).

Figures, over the client's window after ``--warmup``: msgs/s, RT percentiles, and per message the
CPU time (``/proc/PID/stat``, every thread: ``broker/tools/cpu_usage.py``) and the context switches
(``/proc/PID/task/*/status``, voluntary and not) of every process. Each case runs fresh processes
in a fresh directory (removed after); every process started is ended by its PID. The children also
end on their own when their stdin (a pipe from this process) closes, when their upstream
connection closes, or after a bounded lifetime.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import hashlib
import json
import os
import queue
import select
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from broker.tools.cpu_usage import CLIENT, CpuSampler

FRAME_BYTES_MAX = 64 * 1024 * 1024  # a frame longer than this ends the connection
SENDERS_MAX = 1024
SIZE_MAX = 1024 * 1024
READY_TIMEOUT_S = 20.0  # a child's "READY <port>" line
END_TIMEOUT_S = 5.0  # a child's own exit once its upstream closed, before SIGTERM, then SIGKILL
LIFETIME_SLACK_S = 60.0  # a child outlives the window by at most this much
SECRET_ENV = "HOP_FLOOR_SECRET"  # the run's random secret the children derive peer keys from (hex)
HOSTS = {"leader": "127.0.0.2", "follower-1": "127.0.0.3", "follower-2": "127.0.0.4"}
FOLLOWERS = ("follower-1", "follower-2")
SYNC_MODES = ("inline", "thread", "none")
CODECS = ("raw", "msgpack")

LEN = struct.Struct(">I")
REQ = struct.Struct(">IQ")  # frame length, request id; then the body
ANS = struct.Struct(">IQQ")  # frame length (16), request id, the message's index
APPEND = struct.Struct(">QI")  # first index, count; then count x (length, body)
ACK = struct.Struct(">Q")  # the highest index the follower has durable (per --sync)


# -- pure parts: frames, codecs, the commit rule -------------------------------------------------------
class FrameError(Exception):
    """A malformed or oversized frame: the connection ends."""


class FrameReader:
    """Splits a byte stream into the payloads of its length-prefixed frames; keeps a partial tail."""

    __slots__ = ("_tail", "max_bytes")

    def __init__(self, max_bytes: int = FRAME_BYTES_MAX):
        self._tail = b""
        self.max_bytes = max_bytes

    def feed(self, data: bytes) -> list[bytes]:
        buf = self._tail + data if self._tail else data
        frames: list[bytes] = []
        pos, end = 0, len(buf)
        while end - pos >= 4:
            (size,) = LEN.unpack_from(buf, pos)
            if size > self.max_bytes:
                raise FrameError(f"a frame of {size} bytes (at most {self.max_bytes})")
            stop = pos + 4 + size
            if stop > end:
                break
            frames.append(buf[pos + 4 : stop])
            pos = stop
        self._tail = bytes(buf[pos:]) if pos < end else b""
        return frames


def frame(payload: bytes) -> bytes:
    return LEN.pack(len(payload)) + payload


class Codec(Protocol):
    name: str

    def request(self, req_id: int, body: bytes) -> bytes: ...  # a whole frame
    def parse_request(self, payload: bytes) -> tuple[int, bytes]: ...
    def answer(self, req_id: int, index: int) -> bytes: ...  # a whole frame
    def parse_answer(self, payload: bytes) -> tuple[int, int]: ...
    def append(self, first: int, bodies: Sequence[bytes]) -> tuple[bytes, bytes | memoryview]: ...
    def parse_append(self, payload: bytes) -> tuple[int, int, bytes | memoryview]: ...
    def ack(self, index: int) -> bytes: ...  # a payload
    def parse_ack(self, payload: bytes) -> int: ...


class RawCodec:
    """Fixed big-endian headers; an append frame carries its records exactly as the files keep
    them (length, body), so a follower writes the frame's tail as it came."""

    name = "raw"

    def request(self, req_id: int, body: bytes) -> bytes:
        return REQ.pack(8 + len(body), req_id) + body

    def parse_request(self, payload: bytes) -> tuple[int, bytes]:
        return int.from_bytes(payload[:8], "big"), payload[8:]

    def answer(self, req_id: int, index: int) -> bytes:
        return ANS.pack(16, req_id, index)

    def parse_answer(self, payload: bytes) -> tuple[int, int]:
        if len(payload) != 16:
            raise FrameError(f"an answer of {len(payload)} bytes")
        req_id, index = struct.unpack(">QQ", payload)
        return req_id, index

    def append(self, first: int, bodies: Sequence[bytes]) -> tuple[bytes, bytes | memoryview]:
        """(the frame's payload, the records to write: its tail)."""
        parts = [APPEND.pack(first, len(bodies))]
        for body in bodies:
            parts += (LEN.pack(len(body)), body)
        payload = b"".join(parts)
        return payload, memoryview(payload)[APPEND.size :]

    def parse_append(self, payload: bytes) -> tuple[int, int, bytes | memoryview]:
        if len(payload) < APPEND.size:
            raise FrameError(f"an append of {len(payload)} bytes")
        first, count = APPEND.unpack_from(payload)
        return first, count, memoryview(payload)[APPEND.size :]

    def ack(self, index: int) -> bytes:
        return ACK.pack(index)

    def parse_ack(self, payload: bytes) -> int:
        if len(payload) != ACK.size:
            raise FrameError(f"an ack of {len(payload)} bytes")
        return int(ACK.unpack(payload)[0])


class MsgpackCodec:
    """Every frame one msgpack array: [id, body], [id, index], [first, [bodies]], index."""

    name = "msgpack"

    def __init__(self) -> None:
        import msgpack

        self._pack = msgpack.packb
        self._unpack = msgpack.unpackb

    def request(self, req_id: int, body: bytes) -> bytes:
        return frame(self._pack((req_id, body)))

    def parse_request(self, payload: bytes) -> tuple[int, bytes]:
        req_id, body = self._unpack(payload)
        return int(req_id), body

    def answer(self, req_id: int, index: int) -> bytes:
        return frame(self._pack((req_id, index)))

    def parse_answer(self, payload: bytes) -> tuple[int, int]:
        req_id, index = self._unpack(payload)
        return int(req_id), int(index)

    def append(self, first: int, bodies: Sequence[bytes]) -> tuple[bytes, bytes | memoryview]:
        return self._pack((first, bodies)), b"".join(bodies)

    def parse_append(self, payload: bytes) -> tuple[int, int, bytes | memoryview]:
        first, bodies = self._unpack(payload)
        return int(first), len(bodies), b"".join(bodies)

    def ack(self, index: int) -> bytes:
        return bytes(self._pack(index))

    def parse_ack(self, payload: bytes) -> int:
        return int(self._unpack(payload))


def make_codec(name: str) -> Codec:
    return MsgpackCodec() if name == "msgpack" else RawCodec()


def commit_index(own_synced: int, followers_acked: Sequence[int]) -> int:
    """The highest index a client may be answered for: durable on the leader and on at least one
    follower (a majority of three, the leader's own copy included)."""
    return min(own_synced, max(followers_acked, default=0))


def peer_key(secret: bytes, follower: str, direction: str) -> bytes:
    """The AES-256 key of one direction (``down``: leader to follower, ``up``) of one link."""
    return hashlib.sha256(secret + f"{follower}/{direction}".encode()).digest()


class Sealer:
    """AES-256-GCM for one direction of one link; the nonce is the frame's sequence number."""

    __slots__ = ("_aead", "_seq")

    def __init__(self, key: bytes):
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        self._aead = AESGCM(key)
        self._seq = 0

    def seal(self, plain: bytes) -> bytes:
        nonce = self._seq.to_bytes(12, "big")
        self._seq += 1
        return self._aead.encrypt(nonce, plain, None)

    def open(self, sealed: bytes) -> bytes:
        nonce = self._seq.to_bytes(12, "big")
        self._seq += 1
        return self._aead.decrypt(nonce, sealed, None)  # InvalidTag on anything tampered


def write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


# -- durability: --sync inline | thread | none ----------------------------------------------------------
class Syncer:
    """Makes what was written to ``fd`` durable and reports the highest index it covers through
    ``on_synced`` (on the loop). ``thread``: group commit on one flusher thread — one job in
    flight; when it returns, the next covers everything written meanwhile."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        fd: int,
        mode: str,
        on_synced: Callable[[int], None],
        on_error: Callable[[BaseException], None],
    ):
        assert mode in SYNC_MODES
        self._loop, self.fd, self.mode = loop, fd, mode
        self._on_synced, self._on_error = on_synced, on_error
        self.written = 0  # the highest index written to the file (the loop's)
        self.synced = 0  # the highest index durable per the mode (the loop's)
        self._in_flight = False
        self._jobs: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        if mode == "thread":
            self._thread = threading.Thread(target=self._run, name="hop-floor-flush", daemon=True)
            self._thread.start()

    def wrote(self, index: int) -> None:
        self.written = index
        if self.mode == "thread":
            if not self._in_flight:
                self._submit()
            return
        if self.mode == "inline":
            os.fdatasync(self.fd)
        self.synced = index
        self._on_synced(index)

    def _submit(self) -> None:
        self._in_flight = True
        self._jobs.put(self.written)

    def _run(self) -> None:
        while True:
            target = self._jobs.get()
            if target is None:
                return
            try:
                os.fdatasync(self.fd)
            except OSError as exc:
                self._loop.call_soon_threadsafe(self._on_error, exc)
                return
            self._loop.call_soon_threadsafe(self._done, target)

    def _done(self, target: int) -> None:
        self._in_flight = False
        self.synced = target
        self._on_synced(target)
        if self.written > target:
            self._submit()

    def close(self) -> None:
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join(END_TIMEOUT_S)


# -- the processes ---------------------------------------------------------------------------------------
def _nodelay(transport: Any) -> None:
    sock = transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # the loops set it too: stated, not assumed


class _Ending:
    """How a child ends: its result future, set once (upstream closed, stdin closed, an error)."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.future: asyncio.Future[None] = loop.create_future()

    def ok(self) -> None:
        if not self.future.done():
            self.future.set_result(None)

    def fail(self, exc: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(exc)


def _watch_stdin(loop: asyncio.AbstractEventLoop, ending: _Ending) -> None:
    """The parent closed our stdin (or died): end."""

    def readable() -> None:
        try:
            data = os.read(0, 4096)
        except OSError:
            data = b""
        if not data:
            loop.remove_reader(0)
            ending.ok()

    loop.add_reader(0, readable)


class FollowerSide(asyncio.Protocol):
    """A follower's one connection from the leader: append frames in, acks out."""

    def __init__(self, codec: Codec, fd: int, sync: str, opener: Sealer | None, sealer: Sealer | None,
                 ending: _Ending):  # fmt: skip
        self.codec, self.fd, self.opener, self.sealer, self.ending = codec, fd, opener, sealer, ending
        self.sync_mode = sync
        self.reader = FrameReader()
        self.transport: Any = None
        self.syncer: Syncer | None = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        _nodelay(transport)
        self.syncer = Syncer(asyncio.get_running_loop(), self.fd, self.sync_mode, self._ack, self.ending.fail)

    def data_received(self, data: bytes) -> None:
        assert self.syncer is not None
        last = 0
        try:
            for payload in self.reader.feed(data):
                plain = self.opener.open(payload) if self.opener is not None else payload
                first, count, records = self.codec.parse_append(plain)
                write_all(self.fd, records)
                last = first + count - 1
        except Exception as exc:  # a bad frame, a failed write: the run is broken
            self.ending.fail(exc)
            self.transport.close()
            return
        if last > 0:
            self.syncer.wrote(last)

    def _ack(self, index: int) -> None:
        if self.transport.is_closing():  # a flush that completed after the leader left
            return
        plain = self.codec.ack(index)
        self.transport.write(frame(self.sealer.seal(plain) if self.sealer is not None else plain))

    def connection_lost(self, exc: Exception | None) -> None:
        if self.syncer is not None:
            self.syncer.close()
        self.ending.ok()


class Leader:
    """The leader's state, all on its loop: requests of this turn, what waits for its commit."""

    def __init__(self, loop: asyncio.AbstractEventLoop, codec: Codec, fd: int, sync: str, ending: _Ending):
        self.loop, self.codec, self.fd, self.ending = loop, codec, fd, ending
        self.links: list[LeaderPeerSide] = []
        self.acked: list[int] = []
        self.pending: list[tuple[LeaderClientSide, int, bytes]] = []
        self.scheduled = False
        self.next_index = 1
        self.waiting: deque[tuple[int, list[tuple[LeaderClientSide, int, int]]]] = deque()
        self.syncer = Syncer(loop, fd, sync, self._own_synced, ending.fail)

    def on_request(self, conn: LeaderClientSide, req_id: int, body: bytes) -> None:
        self.pending.append((conn, req_id, body))
        if not self.scheduled:  # everything that arrives in this loop turn goes in one frame
            self.scheduled = True
            self.loop.call_soon(self._replicate)

    def _replicate(self) -> None:
        self.scheduled = False
        batch, self.pending = self.pending, []
        first = self.next_index
        last = first + len(batch) - 1
        self.next_index = last + 1
        payload, records = self.codec.append(first, [body for _, _, body in batch])
        write_all(self.fd, records)
        for link in self.links:
            link.send(payload)
        self.waiting.append((last, [(conn, req_id, first + i) for i, (conn, req_id, _) in enumerate(batch)]))
        self.syncer.wrote(last)

    def _own_synced(self, _index: int) -> None:
        self._answer()

    def on_ack(self, k: int, index: int) -> None:
        if index > self.acked[k]:
            self.acked[k] = index
            self._answer()

    def _answer(self) -> None:
        commit = commit_index(self.syncer.synced, self.acked)
        out: dict[LeaderClientSide, list[bytes]] = {}
        while self.waiting and self.waiting[0][0] <= commit:
            for conn, req_id, index in self.waiting.popleft()[1]:
                out.setdefault(conn, []).append(self.codec.answer(req_id, index))
        for conn, frames in out.items():  # one write per client connection
            conn.write(frames[0] if len(frames) == 1 else b"".join(frames))


class LeaderClientSide(asyncio.Protocol):
    """The leader's connection from the client: requests in, answers out."""

    def __init__(self, leader: Leader):
        self.leader = leader
        self.reader = FrameReader()
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        _nodelay(transport)

    def data_received(self, data: bytes) -> None:
        try:
            for payload in self.reader.feed(data):
                req_id, body = self.leader.codec.parse_request(payload)
                self.leader.on_request(self, req_id, body)
        except Exception as exc:
            self.leader.ending.fail(exc)
            self.transport.close()

    def write(self, data: bytes) -> None:
        if not self.transport.is_closing():
            self.transport.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.leader.ending.ok()  # the client is done: so is the run


class LeaderPeerSide(asyncio.Protocol):
    """The leader's connection to follower ``k``: append frames out, acks in."""

    def __init__(self, leader: Leader, k: int, sealer: Sealer | None, opener: Sealer | None):
        self.leader, self.k, self.sealer, self.opener = leader, k, sealer, opener
        self.reader = FrameReader()
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        _nodelay(transport)

    def send(self, plain: bytes) -> None:
        self.transport.write(frame(self.sealer.seal(plain) if self.sealer is not None else plain))

    def data_received(self, data: bytes) -> None:
        top = 0
        try:
            for payload in self.reader.feed(data):
                top = max(top, self.leader.codec.parse_ack(self.opener.open(payload) if self.opener else payload))
        except Exception as exc:
            self.leader.ending.fail(exc)
            self.transport.close()
            return
        if top:
            self.leader.on_ack(self.k, top)

    def connection_lost(self, exc: Exception | None) -> None:
        self.leader.ending.fail(ConnectionError(f"follower {self.k + 1} closed the connection"))


def _open_log(directory: str, name: str) -> int:
    return os.open(os.path.join(directory, f"{name}.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)


def _secret() -> bytes:
    return bytes.fromhex(os.environ[SECRET_ENV])


async def _serve(args: argparse.Namespace, factory: Callable[[], asyncio.Protocol], ending: _Ending) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(factory, args.host, 0)
    port = server.sockets[0].getsockname()[1]
    print(f"READY {port}", flush=True)
    try:
        await asyncio.wait_for(asyncio.shield(ending.future), args.lifetime)
    finally:
        server.close()


async def follower_main(args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    ending = _Ending(loop)
    _watch_stdin(loop, ending)
    codec = make_codec(args.codec)
    fd = _open_log(args.dir, args.name)
    opener = sealer = None
    if args.crypto:
        opener = Sealer(peer_key(_secret(), args.name, "down"))
        sealer = Sealer(peer_key(_secret(), args.name, "up"))
    try:
        await _serve(args, lambda: FollowerSide(codec, fd, args.sync, opener, sealer, ending), ending)
    finally:
        os.close(fd)


async def leader_main(args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    ending = _Ending(loop)
    _watch_stdin(loop, ending)
    codec = make_codec(args.codec)
    fd = _open_log(args.dir, "leader")
    leader = Leader(loop, codec, fd, args.sync, ending)
    try:
        for k, addr in enumerate(args.followers.split(",")):
            host, port = addr.rsplit(":", 1)
            name = FOLLOWERS[k]
            sealer = opener = None
            if args.crypto:
                sealer = Sealer(peer_key(_secret(), name, "down"))
                opener = Sealer(peer_key(_secret(), name, "up"))
            _, link = await loop.create_connection(
                functools.partial(LeaderPeerSide, leader, k, sealer, opener), host, int(port),
                local_addr=(args.host, 0),
            )  # fmt: skip
            leader.links.append(link)
            leader.acked.append(0)
        await _serve(args, lambda: LeaderClientSide(leader), ending)
    finally:
        leader.syncer.close()
        for link in leader.links:
            if link.transport is not None:
                link.transport.close()
        os.close(fd)


# -- the client ------------------------------------------------------------------------------------------
def context_switches(pid: int) -> int | None:
    """Voluntary + involuntary context switches of every live thread of ``pid`` (None: gone)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    total = 0
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                for line in f:
                    if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                        total += int(line.split()[1])
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended meanwhile
    return total


_TICKS_S = os.sysconf("SC_CLK_TCK")


def user_system_s(pid: int) -> tuple[float, float] | None:
    """(user, system) CPU seconds of every thread of ``pid`` so far (None: gone): the split of
    ``cpu_usage.cpu_seconds``, to tell the kernel's share (fdatasync, TCP) from Python's."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
        fields = raw[raw.rfind(b")") + 2 :].split()
        return int(fields[11]) / _TICKS_S, int(fields[12]) / _TICKS_S
    except (OSError, IndexError, ValueError):
        return None


class ClientSide(asyncio.Protocol):
    """The client's connection: the requests of one loop turn go in one write; answers resolve
    their futures."""

    def __init__(self, loop: asyncio.AbstractEventLoop, codec: Codec):
        self.loop, self.codec = loop, codec
        self.reader = FrameReader()
        self.futures: dict[int, asyncio.Future[int]] = {}
        self.out: list[bytes] = []
        self.scheduled = False
        self.next_id = 0
        self.transport: Any = None
        self.lost: BaseException | None = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        _nodelay(transport)

    def request(self, body: bytes) -> asyncio.Future[int]:
        if self.lost is not None:
            raise ConnectionError("the leader closed the connection") from self.lost
        req_id = self.next_id
        self.next_id += 1
        fut: asyncio.Future[int] = self.loop.create_future()
        self.futures[req_id] = fut
        self.out.append(self.codec.request(req_id, body))
        if not self.scheduled:
            self.scheduled = True
            self.loop.call_soon(self._flush)
        return fut

    def _flush(self) -> None:
        self.scheduled = False
        out, self.out = self.out, []
        self.transport.write(out[0] if len(out) == 1 else b"".join(out))

    def data_received(self, data: bytes) -> None:
        try:
            answers = [self.codec.parse_answer(payload) for payload in self.reader.feed(data)]
        except Exception:  # a broken answer: its futures fail in connection_lost
            self.transport.close()
            return
        for req_id, index in answers:
            fut = self.futures.pop(req_id, None)
            if fut is not None and not fut.done():
                fut.set_result(index)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = exc or ConnectionError("closed")
        for fut in self.futures.values():
            if not fut.done():
                fut.set_exception(ConnectionError("the leader closed the connection"))
        self.futures.clear()


def latency_summary_ms(latencies_ns: list[int]) -> dict[str, float | None]:
    if not latencies_ns:
        return {"avg": None, "p50": None, "p99": None, "max": None}
    xs = sorted(latencies_ns)
    n = len(xs)

    def q(p: float) -> float:
        return round(xs[min(n - 1, int(p * n))] / 1e6, 3)

    return {"avg": round(sum(xs) / n / 1e6, 3), "p50": q(0.50), "p99": q(0.99), "max": round(xs[-1] / 1e6, 3)}


async def client_main(args: argparse.Namespace) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    codec = make_codec(args.codec)
    host, port = args.leader.rsplit(":", 1)
    transport, conn = await loop.create_connection(lambda: ClientSide(loop, codec), host, int(port))
    body = (b"0123456789abcdefghijklmnopqrstuvwxyz" * (args.size // 36 + 1))[: args.size]
    state = {"recording": False, "stop": False}
    latencies_ns: list[int] = []
    clock = time.perf_counter_ns

    async def sender() -> None:
        while not state["stop"]:
            t0 = clock()
            await conn.request(body)
            if state["recording"]:
                latencies_ns.append(clock() - t0)

    tasks = [asyncio.ensure_future(sender()) for _ in range(args.senders)]
    procs = {CLIENT: os.getpid(), **{k: int(v) for k, v in (x.split("=") for x in args.pids.split(","))}}
    try:
        done, _ = await asyncio.wait(tasks, timeout=args.warmup, return_when=asyncio.FIRST_EXCEPTION)
        for t in done:
            t.result()  # a sender failed: the run is broken
        cpu = CpuSampler(procs)
        switches = {name: context_switches(pid) for name, pid in procs.items()}
        split = {name: user_system_s(pid) for name, pid in procs.items()}
        cpu.start()
        t_start = time.perf_counter()
        state["recording"] = True
        done, _ = await asyncio.wait(tasks, timeout=args.duration, return_when=asyncio.FIRST_EXCEPTION)
        state["recording"] = False
        elapsed = time.perf_counter() - t_start
        messages = len(latencies_ns)
        used = cpu.stop(messages)
        for name, pid in procs.items():
            before, after = switches[name], context_switches(pid)
            per = None if before is None or after is None or not messages else round((after - before) / messages, 2)
            used[name]["ctx_switches_per_msg"] = per
            a, b = split[name], user_system_s(pid)
            for i, key in enumerate(("user_us_per_msg", "system_us_per_msg")):
                used[name][key] = None if a is None or b is None or not messages else round(
                    (b[i] - a[i]) * 1e6 / messages, 1)  # fmt: skip
        for t in done:
            t.result()
        state["stop"] = True
        await asyncio.wait_for(asyncio.gather(*tasks), END_TIMEOUT_S)
    finally:
        for t in tasks:
            t.cancel()
        transport.close()
    return {
        "senders": args.senders,
        "messages": messages,
        "elapsed_s": round(elapsed, 3),
        "msgs_per_s": round(messages / elapsed, 1),
        "rt_ms": latency_summary_ms(latencies_ns),
        "cpu": used,
    }


# -- the children's command line ----------------------------------------------------------------------
def child_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m broker.tools.hop_floor",
                                description="one process of mq-bench hop-floor")  # fmt: skip
    p.add_argument("role", choices=("leader", "follower", "client"))
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--name", default="follower-1", choices=FOLLOWERS)
    p.add_argument("--dir", default=".")
    p.add_argument("--sync", choices=SYNC_MODES, default="thread")
    p.add_argument("--codec", choices=CODECS, default="raw")
    p.add_argument("--crypto", action="store_true")
    p.add_argument("--followers", default="", help="HOST:PORT,HOST:PORT (leader)")
    p.add_argument("--leader", default="", help="HOST:PORT (client)")
    p.add_argument("--pids", default="", help="NAME=PID,... whose CPU the client reports")
    p.add_argument("--senders", type=int, default=1)
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--lifetime", type=float, default=600.0)
    p.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop")
    return p


def _run(coro: Any, which: str) -> Any:
    if which == "uvloop":
        import uvloop

        return uvloop.run(coro)
    return asyncio.run(coro)


def child_main(argv: Sequence[str] | None = None) -> int:
    args = child_parser().parse_args(argv)
    if args.role == "client":
        print(json.dumps(_run(client_main(args), args.loop)), flush=True)
    else:
        _run(leader_main(args) if args.role == "leader" else follower_main(args), args.loop)
    return 0


# -- the orchestrator: mq-bench hop-floor ---------------------------------------------------------------
class _Child:
    def __init__(self, name: str, argv: list[str], workdir: str, env: dict[str, str]):
        self.name = name
        self.err_path = os.path.join(workdir, f"{name}.stderr")
        with open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "broker.tools.hop_floor", *argv],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, env=env,
            )  # fmt: skip

    def stderr_tail(self) -> str:
        try:
            with open(self.err_path, errors="replace") as f:
                return f.read()[-600:].strip()
        except OSError:
            return ""

    def ready_port(self, timeout_s: float) -> int:
        """The port in the child's "READY <port>" line."""
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
        line = self.proc.stdout.readline().decode(errors="replace").split() if ready else []
        if len(line) != 2 or line[0] != "READY" or not line[1].isdigit():
            raise RuntimeError(f"{self.name} did not start: {self.stderr_tail() or 'no READY line'}")
        return int(line[1])

    def end(self) -> None:
        """Close its stdin (it ends on its own), then SIGTERM, then SIGKILL: by its PID."""
        p = self.proc
        if p.stdin is not None and not p.stdin.closed:
            try:
                p.stdin.close()
            except OSError:
                pass
        for stop in (None, p.terminate, p.kill):
            if stop is not None and p.poll() is None:
                stop()
            try:
                p.wait(END_TIMEOUT_S)
                break
            except subprocess.TimeoutExpired:
                continue
        if p.stdout is not None:
            p.stdout.close()


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def run_case(args: argparse.Namespace, senders: int, workdir: str, env: dict[str, str]) -> dict[str, Any]:
    """Fresh followers, leader and client; the client's figures and every process's CPU."""
    common = ["--dir", workdir, "--sync", args.sync, "--codec", args.codec, "--loop", args.loop,
              "--lifetime", str(args.warmup + args.duration + LIFETIME_SLACK_S)]  # fmt: skip
    if args.crypto:
        common.append("--crypto")
    children: list[_Child] = []
    load_before = _load()
    try:
        ports = {}
        for name in FOLLOWERS:
            children.append(_Child(name, ["follower", "--host", HOSTS[name], "--name", name, *common], workdir, env))
        for child in children:
            ports[child.name] = child.ready_port(READY_TIMEOUT_S)
        followers = ",".join(f"{HOSTS[n]}:{ports[n]}" for n in FOLLOWERS)
        leader_argv = ["leader", "--host", HOSTS["leader"], "--followers", followers, *common]
        leader = _Child("leader", leader_argv, workdir, env)
        children.append(leader)
        leader_port = leader.ready_port(READY_TIMEOUT_S)
        pids = ",".join(f"{c.name}={c.proc.pid}" for c in children)
        client = _Child("client", [
            "client", "--leader", f"{HOSTS['leader']}:{leader_port}", "--senders", str(senders), "--size",
            str(args.size), "--duration", str(args.duration), "--warmup", str(args.warmup), "--pids", pids, *common,
        ], workdir, env)  # fmt: skip
        children.append(client)
        try:
            out, _ = client.proc.communicate(timeout=args.warmup + args.duration + LIFETIME_SLACK_S)
        except subprocess.TimeoutExpired:
            limit_s = args.warmup + args.duration + LIFETIME_SLACK_S
            raise RuntimeError(f"the client did not finish within {limit_s} s") from None
        if client.proc.returncode != 0:
            raise RuntimeError(f"the client failed ({client.proc.returncode}): {client.stderr_tail()}")
        lines = out.decode(errors="replace").strip().splitlines()
        result: dict[str, Any] = json.loads(lines[-1]) if lines else {}
        if "messages" not in result:
            raise RuntimeError(f"the client printed no result: {client.stderr_tail()}")
        for child in children[:-1]:  # the client closed its connection: the others end on their own
            try:
                child.proc.wait(END_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                pass
            if child.proc.returncode not in (None, 0):
                raise RuntimeError(f"{child.name} failed ({child.proc.returncode}): {child.stderr_tail()}")
    finally:
        for child in reversed(children):
            child.end()
    result["load_before"], result["load_after"] = load_before, _load()
    return result


def parse_senders(spec: str) -> list[int]:
    """``1,32`` -> [1, 32]; ValueError for anything else."""
    out = []
    for item in spec.split(","):
        item = item.strip()
        if not item.isdigit() or not 1 <= int(item) <= SENDERS_MAX:
            raise ValueError(f"{item!r} is not a number of senders in 1..{SENDERS_MAX}")
        out.append(int(item))
    return out


def format_summary(summary: dict[str, Any]) -> str:
    lines = [
        f"hop-floor: --sync {summary['sync']}, codec {summary['codec']}, "
        f"crypto {'on' if summary['crypto'] else 'off'}, {summary['size']}-byte bodies, {summary['loop']}, "
        f"{summary['duration_s']} s per case"
    ]
    for case in summary["cases"]:
        rt = case["rt_ms"]
        lines.append(
            f"{case['senders']} sender{'s' if case['senders'] != 1 else ''}: {case['msgs_per_s']:,.0f} msgs/s "
            f"({case['messages']} msgs in {case['elapsed_s']:.2f} s) | RT(ms) p50 {rt['p50']} p99 {rt['p99']} "
            f"max {rt['max']} | load {case['load_before']} -> {case['load_after']}"
        )
        cpu = case["cpu"]
        order = [n for n in (CLIENT, "leader", *FOLLOWERS) if n in cpu]
        lines.append("  CPU µs/msg (user + system): " + ", ".join(
            f"{n} {cpu[n]['cpu_us_per_msg']} ({cpu[n]['user_us_per_msg']} + {cpu[n]['system_us_per_msg']})"
            for n in order))  # fmt: skip
        lines.append("  context switches/msg: " + ", ".join(f"{n} {cpu[n]['ctx_switches_per_msg']}" for n in order))
    return "\n".join(lines)


def run_hop_floor(args: argparse.Namespace) -> int:
    try:
        senders = parse_senders(args.senders)
    except ValueError as exc:
        print(f"mq-bench hop-floor: INVALID_ARGUMENT: --senders: {exc}", file=sys.stderr)
        return 2
    if args.dir is not None and not os.path.isdir(args.dir):
        print(f"mq-bench hop-floor: INVALID_ARGUMENT: --dir: {args.dir!r} is not a directory", file=sys.stderr)
        return 2
    if args.codec == "msgpack" or args.crypto:
        try:
            if args.codec == "msgpack":
                import msgpack  # noqa: F401
            if args.crypto:
                import cryptography  # noqa: F401
        except ImportError as exc:
            print(f"mq-bench hop-floor: UNAVAILABLE: {exc}", file=sys.stderr)
            return 1
    env = {**os.environ, SECRET_ENV: os.urandom(32).hex()}
    cases = []
    try:
        for n in senders:
            workdir = tempfile.mkdtemp(prefix="mq-bench-hop-floor-", dir=args.dir)
            try:
                cases.append(run_case(args, n, workdir, env))
            finally:
                shutil.rmtree(workdir, ignore_errors=True)
    except (RuntimeError, OSError, ValueError) as exc:
        print(f"mq-bench hop-floor: {exc}", file=sys.stderr)
        return 1
    summary = {"sync": args.sync, "codec": args.codec, "crypto": args.crypto, "size": args.size, "loop": args.loop,
               "duration_s": args.duration, "warmup_s": args.warmup, "cases": cases}  # fmt: skip
    print(json.dumps(summary) if args.json else format_summary(summary), flush=True)
    return 0


def add_parser(sub: Any, positive: Any) -> None:
    p = sub.add_parser("hop-floor", help="the floor of a send's chain in Python: client, leader, 2 followers, "
                                         "nothing else")  # fmt: skip
    p.add_argument("-w", "--senders", default="1,32",
                   help="synchronous senders per case, comma-separated (default 1,32: two cases)")  # fmt: skip
    p.add_argument("--sync", choices=SYNC_MODES, default="thread",
                   help="fdatasync on the loop (inline), on a flusher thread with group commit (thread, the "
                        "default, as the product), or not at all (none)")  # fmt: skip
    p.add_argument("--codec", choices=CODECS, default="raw", help="frame fields: fixed headers (raw) or msgpack")
    p.add_argument("--crypto", action="store_true", help="AES-256-GCM on every peer frame, as dledger/peer_tcp.py")
    p.add_argument("-s", "--size", type=positive(int, SIZE_MAX), default=1024, help="body bytes (default 1024)")
    p.add_argument("--duration", type=positive(float, 600), default=10.0, help="measured seconds per case (10)")
    p.add_argument("--warmup", type=positive(float, 60), default=1.0, help="seconds before measuring (1)")
    p.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop", help="the event loop of every process")
    p.add_argument("--dir", default=None, help="where the files go (default: a temporary directory, removed)")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")


if __name__ == "__main__":
    sys.exit(child_main())
