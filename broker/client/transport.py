"""The SDK's wire layer: msgpack over HTTP to brokers, route lookups at NameServers.

Every client object (producer, consumers, admin) owns or shares one ``Transport`` (pooled
keep-alive connections). Every failure surfaces as a ``ClientError`` with a
RocketMQ-style ``code``: broker answers keep the broker's code (``NOT_LEADER``, ``TOPIC_NOT_EXIST``,
...); a refused/closed connection is ``CONNECT_FAILED``; no answer in time is ``TIMEOUT``.

Credentials and TLS (docs/SECURITY.md): every request is signed (``broker.protocol.auth``: HMAC-SHA256 over
the server's scope, method, target, body hash, timestamp and a fresh nonce — signed again for every
attempt; ``signer.py`` learns each server's scope and clock from its answers) when the
transport has credentials: given as ``credentials=``, else from ``DLEDGER_ACCESS_KEY`` +
``DLEDGER_SECRET_KEY``, else from the file ``DLEDGER_CREDENTIALS_FILE`` names. TLS: ``tls=`` an
``ssl.SSLContext`` (or True for the system CAs), else ``DLEDGER_TLS_CA_FILE`` (a custom CA) or
``DLEDGER_TLS=true``; then every NameServer and broker is reached over HTTPS.
"""

from __future__ import annotations

import asyncio
import os
import random
import ssl
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, TypeVar
from urllib.parse import quote, urlencode

import msgpack

from broker.client.remoting import RemotingConnection
from broker.client.signer import Signer
from broker.protocol import route_wire
from broker.protocol.auth import (
    Credentials,
    CredentialsError,
    as_credentials,
    credentials_from_env,
    load_credentials,
)
from broker.protocol.errors import ProtocolError
from broker.protocol.frames import HTTP_PATH, Op
from broker.protocol.limits import ANSWER_BYTES_MAX, ANSWER_HEADERS_MAX
from broker.protocol.routes import ClusterInfo, TopicRouteData

T = TypeVar("T")

MSGPACK = "application/x-msgpack"
DEFAULT_NAMESRV = "127.0.0.1:9876"
ENV_TLS_CA_FILE: Final = "DLEDGER_TLS_CA_FILE"
ENV_TLS: Final = "DLEDGER_TLS"
ENV_TRANSPORT: Final = "DLEDGER_TRANSPORT"  # "http" forces HTTP for the data path (default: binary)
PROTOCOLS: Final = ("auto", "http")
IDLE_S_DEFAULT: Final = 30.0  # below the servers' idle timeout (60 s), so a reused connection is open
TLS_HANDSHAKE_TIMEOUT_S: Final = 10.0
# A body this large is not sent to a server whose scope is unknown: a refusal would come before the
# server read it and close the connection under the client's write. One anonymous GET asks first.
PROBE_BODY_BYTES: Final = 64 << 10


class _FromEnv:
    def __repr__(self) -> str:
        return "FROM_ENV"


FROM_ENV: Final = _FromEnv()  # credentials / TLS settings taken from the environment
CredentialsArg = Credentials | tuple[str, str] | _FromEnv | None
TlsArg = ssl.SSLContext | bool | _FromEnv | None


def client_ssl_context(ca_file: str | None = None) -> ssl.SSLContext:
    """Verify servers against ``ca_file`` (a custom CA), or the system's CAs when None."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca_file)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


def tls_from_env(env: Mapping[str, str] | None = None) -> ssl.SSLContext | None:
    env = os.environ if env is None else env
    ca = env.get(ENV_TLS_CA_FILE)
    if ca:
        try:
            return client_ssl_context(ca)
        except (OSError, ssl.SSLError) as exc:
            raise CredentialsError(f"{ENV_TLS_CA_FILE}={ca}: {exc}") from None
    if env.get(ENV_TLS, "").lower() in ("1", "true", "yes"):
        return client_ssl_context()
    return None


def cluster_credentials(root: str) -> Credentials | _FromEnv:
    """The admin account ``dledger-cluster up --dir ROOT`` wrote (ROOT/admin-credentials.yml), or
    ``FROM_ENV`` for a cluster without one (ACL off, or a compose/remote cluster)."""
    path = os.path.join(root, "admin-credentials.yml")  # dledger.apps.cluster.ADMIN_CREDENTIALS_FILE
    return load_credentials(path) if os.path.exists(path) else FROM_ENV


def add_security_arguments(p: Any) -> None:
    """``--credentials FILE`` and ``--tls-ca FILE`` for the tools (mqadmin, mq-bench)."""
    p.add_argument("--credentials", metavar="FILE", default=None,
                   help="accessKey/secretKey YAML (default: $DLEDGER_ACCESS_KEY/$DLEDGER_SECRET_KEY, "
                        "else $DLEDGER_CREDENTIALS_FILE)")
    p.add_argument("--tls-ca", dest="tls_ca", metavar="FILE", default=None,
                   help="use HTTPS, trusting this CA (default: $DLEDGER_TLS_CA_FILE)")


def security_kwargs(args: Any) -> dict[str, Any]:
    """The ``credentials=`` / ``tls=`` a tool's flags ask for ({} when none: the environment decides).
    Raises ``CredentialsError`` for a file that cannot be used."""
    out: dict[str, Any] = {}
    if getattr(args, "credentials", None):
        out["credentials"] = load_credentials(args.credentials)
    if getattr(args, "tls_ca", None):
        try:
            out["tls"] = client_ssl_context(args.tls_ca)
        except (OSError, ssl.SSLError) as exc:
            raise CredentialsError(f"--tls-ca {args.tls_ca}: {exc}") from None
    return out


def resolve_security(credentials: CredentialsArg, tls: TlsArg) -> tuple[Credentials | None, ssl.SSLContext | None]:
    """The credentials and TLS context a client uses (explicit values win over the environment)."""
    creds = credentials_from_env() if isinstance(credentials, _FromEnv) else (
        None if credentials is None else as_credentials(credentials)
    )
    if isinstance(tls, _FromEnv):
        ctx = tls_from_env()
    elif tls is True:
        ctx = client_ssl_context()
    elif tls is False or tls is None:
        ctx = None
    else:
        ctx = tls
    return creds, ctx


# Methods safe to send again when a reused connection closes after the request went out (RFC 9110 9.2.2).
IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})


# The SDK's name for the coded error (docs/CLIENT.md, "Errors"): what every failed call raises.
ClientError = ProtocolError


def parse_addrs(spec: str | Sequence[str] | None) -> list[str]:
    """``"a:9876;b:9877"`` / list / None (then ``NAMESRV_ADDR``, then 127.0.0.1:9876)."""
    if spec is None:
        spec = os.environ.get("NAMESRV_ADDR") or DEFAULT_NAMESRV
    items = spec.replace(",", ";").split(";") if isinstance(spec, str) else list(spec)
    addrs = [a.strip() for a in items if a and a.strip()]
    for a in addrs:
        host, sep, port = a.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"bad address {a!r}: expected host:port")
    if not addrs:
        raise ValueError("no NameServer address given")
    return addrs


class _Conn:
    __slots__ = ("last_used", "reader", "used", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader = reader
        self.writer = writer
        self.used = False
        self.last_used = time.monotonic()

    def close(self) -> None:
        self.writer.close()


class _StaleConnection(Exception):
    """A reused keep-alive connection the server had closed: nothing was read (safe to retry)."""


class Transport:
    """HTTP/1.1 with keep-alive over asyncio streams: a pool of idle connections per address.

    Deliberately small (measured: ~50 µs of client CPU per request against ~330 µs with aiohttp's
    client): requests are written whole, answers must carry Content-Length (every server here
    does). Idle connections the server has closed are dropped before use. A reused connection that
    closes after the request went out, before any answer byte, may have been closed idle just then
    (the server never read the request) or after the server read it: only idempotent methods are
    sent again (on a fresh connection); others fail with ``CONNECTION_LOST`` (outcome unknown).
    """

    def __init__(
        self,
        timeout_s: float = 3.0,
        *,
        max_connections: int = 256,
        credentials: CredentialsArg = FROM_ENV,
        tls: TlsArg = FROM_ENV,
        idle_s: float = IDLE_S_DEFAULT,
        protocol: str | None = None,
        answer_bytes_max: int = ANSWER_BYTES_MAX,
    ):
        protocol = protocol or (os.environ.get(ENV_TRANSPORT) or "auto").lower()
        if protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {PROTOCOLS}, got {protocol!r}")
        # "auto": send, pull and heartbeat go over the broker's binary protocol when its route
        # advertises a remoting address (``learn_route``), else HTTP; "http": always HTTP.
        self.protocol = protocol
        self._remoting_addrs: dict[str, str] = {}  # broker HTTP address -> its remoting address
        self._remoting: dict[str, RemotingConnection] = {}
        self.timeout_s = timeout_s
        self._max_idle_per_addr = max_connections
        self._idle: dict[str, list[_Conn]] = {}
        self._closed = False
        self._idle_s = idle_s
        self._answer_bytes_max = answer_bytes_max  # a server cannot make this client buffer more
        self.credentials, self.ssl_context = resolve_security(credentials, tls)
        self.signer = Signer(self.credentials)  # each server's scope and clock, learned from its answers

    @property
    def scheme(self) -> str:
        return "https" if self.ssl_context is not None else "http"

    def learn_route(self, route: TopicRoute) -> None:
        """Remember the remoting addresses a route advertises (brokers that register one)."""
        if self.protocol == "http":
            return
        for bd in route.broker_datas:
            for bid, addr in bd.broker_addrs.items():
                raddr = bd.remoting_addrs.get(bid)
                if raddr is not None:
                    self._remoting_addrs[addr] = raddr
                else:  # no longer advertised (turned off, or a broker of an older version)
                    self._remoting_addrs.pop(addr, None)

    def remoting_addr(self, addr: str) -> str | None:
        return self._remoting_addrs.get(addr) if self.protocol != "http" else None

    def _remoting_connection(self, raddr: str) -> RemotingConnection:
        conn = self._remoting.get(raddr)
        if conn is None:
            conn = self._remoting[raddr] = RemotingConnection(
                raddr, error=ClientError, signer=self.signer, ssl_context=self.ssl_context
            )
        return conn

    async def close(self) -> None:
        self._closed = True
        remoting, self._remoting = self._remoting, {}
        for rc in remoting.values():
            await rc.close()
        for conns in self._idle.values():
            for c in conns:
                c.close()
        self._idle.clear()

    async def _connect(self, addr: str) -> _Conn:
        host, _, port = addr.rpartition(":")
        try:
            if self.ssl_context is None:
                reader, writer = await asyncio.open_connection(host, int(port), limit=1 << 20)
            else:
                reader, writer = await asyncio.open_connection(
                    host, int(port), limit=1 << 20, ssl=self.ssl_context, server_hostname=host,
                    ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT_S,
                )
        except ssl.SSLError as exc:
            raise ClientError("TLS_FAILED", str(exc) or type(exc).__name__, addr=addr) from None
        except (OSError, ValueError) as exc:
            raise ClientError("CONNECT_FAILED", str(exc) or type(exc).__name__, addr=addr) from None
        return _Conn(reader, writer)

    def _take_idle(self, addr: str) -> _Conn | None:
        idle = self._idle.get(addr)
        oldest_ok = time.monotonic() - self._idle_s
        while idle:
            conn = idle.pop()
            if conn.last_used >= oldest_ok and not conn.reader.at_eof() and not conn.writer.is_closing():
                return conn
            # closed by the server while idle (a timeout, a restart), or about to be: nothing was sent on it
            conn.close()
        return None

    def _release(self, addr: str, conn: _Conn) -> None:
        idle = self._idle.setdefault(addr, [])
        if self._closed or len(idle) >= self._max_idle_per_addr:
            conn.close()
        else:
            conn.used = True
            conn.last_used = time.monotonic()
            idle.append(conn)

    async def operation(
        self, addr: str, op: Op, body: Mapping[str, Any], *, timeout_s: float | None = None
    ) -> Any:
        """One data-path operation (``Op.SEND``, ``Op.PULL``) on the broker at ``addr`` (its HTTP
        address): over its binary port when a route advertised one (``learn_route``), else over
        its HTTP route (``HTTP_PATH``); the same answer either way, or ``ClientError``."""
        raddr = self._remoting_addrs.get(addr) if self._remoting_addrs and self.protocol != "http" else None
        if raddr is not None:
            conn = self._remoting.get(raddr) or self._remoting_connection(raddr)
            try:
                return await conn.call(op, body, timeout_s if timeout_s is not None else self.timeout_s)
            except ClientError as exc:
                if exc.code != "CONNECT_FAILED":
                    exc.addr = addr  # callers know brokers by their HTTP address (NOT_LEADER, faults)
                    raise
                # Nothing was sent: the binary port is unreachable (a firewall, a proxy that only
                # forwards HTTP), so this call goes over HTTP.
        return await self.call(addr, "POST", HTTP_PATH[op], body, timeout_s=timeout_s)

    async def call(
        self,
        addr: str,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        *,
        params: Mapping[str, Any] | None = None,
        timeout_s: float | None = None,
    ) -> Any:
        """One HTTP request; returns the decoded msgpack answer or raises ``ClientError``."""
        data = msgpack.packb(body, use_bin_type=True) if body is not None else b""
        qs = {k: str(v) for k, v in (params or {}).items() if v is not None}
        target = quote(path, safe="/%:@!$&'()*+,;=-._~") + ("?" + urlencode(qs) if qs else "")
        head = [f"{method} {target} HTTP/1.1", f"Host: {addr}", f"Accept: {MSGPACK}"]
        if body is not None:
            head.append(f"Content-Type: {MSGPACK}")
        head.append(f"Content-Length: {len(data)}")
        signer = self.signer

        def request() -> bytes:  # signed again for every attempt: a fresh timestamp and nonce
            lines = head
            signed = signer.sign(addr, method, target, data)
            if signed is not None:
                lines = [*head, f"Authorization: {signed}"]
            return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + data

        timeout = timeout_s if timeout_s is not None else self.timeout_s
        try:
            async with asyncio.timeout(timeout):
                if signer.credentials is not None and len(data) > PROBE_BODY_BYTES and not signer.knows(addr):
                    await self._exchange(addr, "GET", lambda: f"GET /v1/status HTTP/1.1\r\nHost: {addr}\r\n"
                                         "Content-Length: 0\r\n\r\n".encode("latin-1"))
                for attempt in (1, 2):
                    status, ctype, raw = await self._exchange(addr, method, request)
                    try:
                        decoded = _decode(raw, ctype)
                    except Exception:  # not msgpack/JSON (a proxy's page, say): never handed over as an answer
                        # Unknown outcome (BAD_ANSWER): the server took the request; what it did is unreadable.
                        raise ClientError("BAD_ANSWER", raw[:200].decode("utf-8", "replace"), status=status,
                                          addr=addr) from None
                    if not (status == 401 and attempt == 1 and isinstance(decoded, dict)
                            and signer.learn_refusal(addr, str(decoded.get("code")), decoded)):
                        break
                    # refused before it was acted on (wrong scope, or this client's clock): sign again
        except TimeoutError:
            raise ClientError("TIMEOUT", f"no answer within {timeout} s", addr=addr) from None
        if status >= 400:
            if isinstance(decoded, dict):
                raise ClientError(
                    str(decoded.get("code", f"HTTP_{status}")),
                    str(decoded.get("message", "")),
                    status=status,
                    addr=addr,
                    leader_addr=decoded.get("leader_addr"),
                    answer=decoded,
                )
            raise ClientError(f"HTTP_{status}", raw[:200].decode("utf-8", "replace"), status=status, addr=addr)
        return decoded

    async def _exchange(self, addr: str, method: str, request: Callable[[], bytes]) -> tuple[int, str, bytes]:
        for _attempt in range(3):
            conn = self._take_idle(addr) or await self._connect(addr)
            try:
                result, keep = await self._roundtrip(conn, request(), addr)
            except _StaleConnection:
                conn.close()
                if method not in IDEMPOTENT_METHODS:  # the server may have read it: never send it twice
                    raise ClientError(
                        "CONNECTION_LOST", "the server closed the connection before answering", addr=addr
                    ) from None
                continue
            except BaseException:
                conn.close()  # a timeout or cancel leaves an answer in flight: never reuse
                raise
            if keep:
                self._release(addr, conn)
            else:
                conn.close()
            return result
        raise ClientError("CONNECTION_LOST", "the server closed every connection", addr=addr)

    async def _roundtrip(self, conn: _Conn, request: bytes, addr: str) -> tuple[tuple[int, str, bytes], bool]:
        try:
            conn.writer.write(request)
            await conn.writer.drain()
            status_line = await conn.reader.readline()
        except (ConnectionResetError, BrokenPipeError) as exc:
            if conn.used:
                raise _StaleConnection() from None
            raise ClientError("CONNECTION_LOST", str(exc) or type(exc).__name__, addr=addr) from None
        except OSError as exc:
            raise ClientError("CONNECTION_LOST", str(exc) or type(exc).__name__, addr=addr) from None
        if not status_line:
            if conn.used:
                raise _StaleConnection()
            raise ClientError("CONNECTION_LOST", "the server closed the connection", addr=addr)
        try:
            if not status_line.endswith(b"\n"):
                raise ValueError("cut status line")
            parts = status_line.split(None, 2)
            status = int(parts[1])
            length = -1
            ctype = ""
            keep = True
            for _ in range(ANSWER_HEADERS_MAX + 1):
                line = await conn.reader.readline()
                if line in (b"\r\n", b"\n"):
                    break
                if not line.endswith(b"\n"):
                    raise ValueError("cut headers")
                name, _, value = line.partition(b":")
                lname = name.strip().lower()
                if lname == b"content-length":
                    length = int(value)
                elif lname == b"content-type":
                    ctype = value.strip().decode("latin-1")
                elif lname == b"connection" and value.strip().lower() == b"close":
                    keep = False
                elif lname == b"dledger-scope":
                    self.signer.learn_scope(addr, value.strip().decode("latin-1"))
            else:
                raise ValueError(f"more than {ANSWER_HEADERS_MAX} header lines")
            if length > self._answer_bytes_max:
                raise ValueError(f"answer of {length} bytes is over the {self._answer_bytes_max}-byte limit")
            if length < 0:  # no length: the answer ends with the connection
                chunks, got = [], 0
                while chunk := await conn.reader.read(1 << 16):
                    got += len(chunk)
                    if got > self._answer_bytes_max:
                        raise ValueError(f"answer over the {self._answer_bytes_max}-byte limit")
                    chunks.append(chunk)
                raw = b"".join(chunks)
                keep = False
            else:
                raw = await conn.reader.readexactly(length)
        except (asyncio.IncompleteReadError, ConnectionError, ValueError, IndexError) as exc:
            raise ClientError("CONNECTION_LOST", f"bad or cut answer: {exc!r}"[:200], addr=addr) from None
        return (status, ctype, raw), keep


def _decode(raw: bytes, ctype: str) -> Any:
    if not raw:
        return None
    if "json" in ctype:
        import json

        return json.loads(raw)
    return msgpack.unpackb(raw, raw=False, strict_map_key=False)


# -- routes ---------------------------------------------------------------------------------------
TopicRoute = TopicRouteData  # the SDK's name for a topic's route (RocketMQ: TopicRouteData)


def _decoded(decode: Callable[[Any], T], body: Any, what: str) -> T:
    try:
        return decode(body)
    except ProtocolError as exc:
        raise ClientError("BAD_RESPONSE", f"the NameServer's {what} is not a v1 record: {exc.message}") from None


class NamesrvClient:
    """Asks any NameServer (tried in random order) for routes, clusters and topics."""

    def __init__(self, addrs: str | Sequence[str] | None, transport: Transport):
        self.addrs = parse_addrs(addrs)
        self.transport = transport

    async def _any(self, method: str, path: str, timeout_s: float | None = None) -> Any:
        order = list(self.addrs)
        random.shuffle(order)
        last: ClientError | None = None
        for addr in order:
            try:
                return await self.transport.call(addr, method, path, params={"v": 1}, timeout_s=timeout_s)
            except ClientError as exc:
                if exc.status in (400, 404, 409):  # a real answer: another NameServer says the same
                    raise
                last = exc
        assert last is not None
        raise last

    async def route(self, topic: str, timeout_s: float | None = None) -> TopicRoute:
        body = await self._any("GET", f"/v1/routes/{quote(topic, safe='')}", timeout_s)
        route = _decoded(route_wire.topic_route_from_dict, body, "route")
        self.transport.learn_route(route)
        return route

    async def clusters(self, timeout_s: float | None = None) -> ClusterInfo:
        body = await self._any("GET", "/v1/clusters", timeout_s)
        return _decoded(route_wire.cluster_info_from_dict, body, "cluster info")

    async def topics(self, timeout_s: float | None = None) -> list[str]:
        body = await self._any("GET", "/v1/topics", timeout_s)
        return list(_decoded(route_wire.topic_list_from_dict, body, "topic list"))


async def sleep_jitter(base_s: float) -> None:
    await asyncio.sleep(base_s * (0.8 + 0.4 * random.random()))
