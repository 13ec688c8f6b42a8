"""The Raft peer transport over TCP: authenticated, encrypted, bounded. No pickle on the wire.

Replaces pysyncobj's TCPTransport/TcpConnection, which unpickled every frame (code execution for
whoever held the password), buffered whatever length a frame's prefix claimed (a 100 MiB garbage
frame cost a leader its leadership), never timed out unauthenticated connections, and closed its
listener for good when ``accept`` failed with EMFILE.

Handshake (initiator I = the peer whose address is greater, as in pysyncobj; acceptor A)::

    I -> A  HELLO    "DLH1" | group | I's id | I's ephemeral X25519 key | nonce_I (16 random bytes)
                     | key id (4 bytes: which password I uses; see below)
    A -> I  ACCEPT   "DLA1" | A's id | A's ephemeral X25519 key | nonce_A | mac_A
    I -> A  CONFIRM  "DLC1" | mac_I

    psk   = PBKDF2-SHA256(password, salt = "dledger-peer|" + group, 200,000 iterations)
    keys  = HKDF-SHA256(ikm = psk || X25519(eph_I, eph_A), salt = nonce_I || nonce_A,
                        info = "dledger-peer-v1" || SHA-256(HELLO || ACCEPT without its mac))
            -> k_mac | k_I->A | k_A->I
    mac_A = HMAC(k_mac, "A" || transcript), mac_I = HMAC(k_mac, "I" || transcript || mac_A)

Cluster id (issue 28): a node configured with ``clusterId`` opens with HELLO "DLH2", the v1 fields
followed by ``len | cluster id``, and the acceptor answers "DLA2", ACCEPT's fields followed by
``len | its cluster id`` (both inside the MAC'd transcript). Two nodes whose ids both are set and
differ refuse each other: the acceptor answers "DLR1" | reason instead of ACCEPT and closes, the
initiator, having had an answer, does not retry in the old format; both count ``cluster_id_mismatch`` and log it.
Backward compatible: a node without an id sends DLH1 exactly as before, and DLH1 is always
accepted (a legacy peer has no id to compare). A previous release closes on DLH2 without a word:
an initiator whose DLH2 is closed before any answer marks the peer legacy and uses DLH1 until that
link drops (then tries DLH2 again, in case the peer was upgraded).

Rolling password change: a node may hold a previous password besides its current one. It opens
connections with the current one and accepts both (the key id, the first 4 bytes of
SHA-256(psk), says which); so replicas switch one at a time without losing a link.

Both sides prove they hold the password; each learns that the other is the configured peer it
claims to be (ids are the Raft addresses of the members in force: dLegerPeers, then the
membership entries of the log, issue 27); a peer whose id is not a member here but that proves
the password is accepted as a *stranger* (a replica that missed a membership change must still
hear a new member that leads; a removed member): the replica counts nothing it says (its votes
and pre-votes are ignored, nothing is replicated to it; see ``DLedgerSyncObj.dl_node_for``), and
it is never dialled. Without the password nobody gets that far; fresh nonces and
ephemeral keys per connection give freshness (a recorded session cannot be replayed) and forward
secrecy. After the handshake every frame is AES-256-GCM with a per-direction key and a nonce that
is the frame's sequence number, so a frame replayed, dropped or reordered inside a session fails
to decrypt and ends the connection.

Framing: ``u32 length (big-endian) | body``. The length is checked before anything is buffered:
at most ``HANDSHAKE_FRAME_MAX`` before the handshake completes, ``max_frame_bytes`` after.
Bodies are ``peer_codec`` messages (msgpack, fixed schemas).

Limits: a connection cap (extra connections are closed at accept), a handshake deadline, an idle
timeout on established links (each side sends a keep-alive when it has been quiet), a cap on bytes
queued towards a peer. ``accept`` failing for lack of descriptors pauses accepting briefly; the
listener is never closed.

``connect_via`` routes each link through another address (a Toxiproxy proxy per link in chaos
runs) while peers keep their identities. ``blocked`` drops traffic to and from the listed peers
(in-process partition tests).

Thread ownership: everything runs on the replica's thread, its event loop (socket callbacks come
from the loop through the SyncObj poller, ``dledger.loop_poller``; timers from the tick callback).
A send writes to the socket at once (what the kernel does not take waits in the connection's
buffer, flushed when the socket is writable): no hop between threads.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import ipaddress
import logging
import os
import socket
import struct
import threading
from collections.abc import Callable
from typing import Any

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from pysyncobj.poller import POLL_EVENT_TYPE
from pysyncobj.transport import Transport, TransportNotReadyError

from dledger import clock as dl_clock
from dledger import peer_codec

log = logging.getLogger(__name__)

HANDSHAKE_FRAME_MAX = 512
PBKDF2_ITERATIONS = 200_000
_LEN = struct.Struct(">I")
_HELLO, _ACCEPT, _CONFIRM = b"DLH1", b"DLA1", b"DLC1"
_HELLO2, _ACCEPT2, _REFUSE = b"DLH2", b"DLA2", b"DLR1"
CLUSTER_ID_MAX = 64
_PING = b""  # an empty body: keep-alive
FALLBACK_DIAL_S = 3.0
_NO_FD_ERRNOS = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}
_psk_cache: dict[tuple[str, str], bytes] = {}


def pre_shared_key(password: str, group: str) -> bytes:
    """The key both sides derive from the peer password (cached: PBKDF2 is slow on purpose)."""
    key = (password, group)
    if key not in _psk_cache:
        salt = b"dledger-peer|" + group.encode()
        _psk_cache[key] = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, PBKDF2_ITERATIONS, 32)
    return _psk_cache[key]


class HandshakeError(Exception):
    pass


def _field(data: bytes, at: int) -> tuple[bytes, int]:
    if at >= len(data):
        raise HandshakeError("truncated handshake")
    n = data[at]
    value = data[at + 1 : at + 1 + n]
    if len(value) != n:
        raise HandshakeError("truncated handshake")
    return value, at + 1 + n


def _session_keys(psk: bytes, shared: bytes, nonce_i: bytes, nonce_a: bytes, transcript: bytes) -> bytes:
    info = b"dledger-peer-v1" + hashlib.sha256(transcript).digest()
    return HKDF(hashes.SHA256(), 96, nonce_i + nonce_a, info).derive(psk + shared)


def _key_id(psk: bytes) -> bytes:
    return hashlib.sha256(psk).digest()[:4]


def _raw_public(key: X25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


class _Cipher:
    """AES-256-GCM for one direction of one session; the nonce is the frame's sequence number."""

    __slots__ = ("_aead", "_seq")

    def __init__(self, key: bytes):
        self._aead = AESGCM(key)
        self._seq = 0

    def seal(self, body: bytes) -> bytes:
        nonce = self._seq.to_bytes(12, "big")
        self._seq += 1
        return self._aead.encrypt(nonce, body, None)

    def open(self, frame: bytes | memoryview) -> bytes:
        nonce = self._seq.to_bytes(12, "big")
        self._seq += 1
        return self._aead.decrypt(nonce, bytes(frame), None)  # InvalidTag on anything tampered


class _Conn:
    """One TCP connection, from accept/connect through the handshake to close."""

    def __init__(self, sock: socket.socket, outbound: bool, peer: Any | None, now: float):
        self.sock = sock
        self.fd = sock.fileno()
        self.outbound = outbound
        self.peer = peer  # the Node: known up front for outbound, after HELLO for inbound
        self.state = "connecting" if outbound else "hello"
        self.inbuf = bytearray()
        self.outbuf = bytearray()
        self.deadline: float | None = None
        self.last_recv = now
        self.last_send = now
        self.send_cipher: _Cipher | None = None
        self.recv_cipher: _Cipher | None = None
        self.eph: X25519PrivateKey | None = None
        self.hello = b""
        self.accept_body = b""
        self.nonce = b""  # ours (initiator)
        self.keys = b""  # k_mac | k_I->A | k_A->I (acceptor, until CONFIRM)
        self.closed = False
        self.answered = False  # the acceptor sent something back (ACCEPT or a refusal)


class PeerResolver:
    """Resolves peer host names off the replica's thread.

    A peer named by host (``n1:40911`` in a compose network) must be looked up before each connect,
    because a restarted container can come back at another address; but a lookup blocks, and the
    name of a dead container fails (``Name or service not known``) only after the resolver gives
    up. So lookups run on one daemon thread; the replica asks, and connects only once an
    answer is there (a stale answer is used while a fresh one is on its way). Answers expire after
    ``ttl_s`` (a failed lookup after ``retry_s``) on the replica's clock (the caller passes ``now``).
    """

    def __init__(self, ttl_s: float = 2.0, retry_s: float = 0.5, lookup: Callable[[str], str] | None = None):
        self.ttl_s = ttl_s
        self.retry_s = retry_s
        self._lookup = lookup or _first_address
        self._lock = threading.Lock()
        self._answers: dict[str, str | None] = {}  # host -> address, or None (lookup failed)
        self._asked_at: dict[str, float] = {}  # host -> when the replica last asked (its clock)
        self._wanted: list[str] = []
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False
        self.failed_lookups = 0  # names that did not resolve (status, tests)

    def resolve(self, host: str, now: float) -> str | None:
        """The address to connect to now, or None (not known yet, or the name does not resolve)."""
        if _is_ip(host):
            return host
        with self._lock:
            answer = self._answers.get(host)
            asked = self._asked_at.get(host)
            ttl = self.ttl_s if answer is not None else self.retry_s
            if (asked is None or now - asked >= ttl) and host not in self._wanted:
                self._asked_at[host] = now
                self._wanted.append(host)
                self._wake.set()
                if self._thread is None and not self._closed:
                    self._thread = threading.Thread(target=self._run, name="dledger-peer-dns", daemon=True)
                    self._thread.start()
        return answer

    def close(self) -> None:
        self._closed = True
        self._wake.set()

    def _run(self) -> None:
        while not self._closed:
            self._wake.wait()
            with self._lock:
                self._wake.clear()
                hosts, self._wanted = self._wanted, []
            for host in hosts:
                try:
                    answer: str | None = self._lookup(host)
                except (OSError, UnicodeError) as exc:
                    log.info("peer host %s does not resolve (%s): retrying", host, exc)
                    answer = None
                with self._lock:
                    self._answers[host] = answer
                    if answer is None:
                        self.failed_lookups += 1


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _first_address(host: str) -> str:
    infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    return str(infos[0][4][0])


class TcpPeerTransport(Transport):
    def __init__(
        self,
        sync_obj: Any,
        self_node: Any,
        other_nodes: Any,
        *,
        password: str,
        group: str,
        previous_password: str | None = None,
        connect_via: dict[str, str] | None = None,
        max_frame_bytes: int = 8 << 20,
        max_connections: int = 16,
        handshake_timeout_s: float = 2.0,
        idle_timeout_s: float = 3.0,
        connect_retry_s: float = 0.3,
        max_queued_bytes: int = 64 << 20,
        cluster_id: str | None = None,
    ):
        super().__init__(sync_obj, self_node, other_nodes)
        if cluster_id is not None and not 0 < len(cluster_id.encode()) <= CLUSTER_ID_MAX:
            raise ValueError(f"a cluster id must be 1..{CLUSTER_ID_MAX} bytes")
        self.cluster_id = cluster_id
        # Peers that closed our DLH2 without an answer (a previous release): DLH1 until the link drops.
        self._legacy_peers: set[str] = set()

        if not password:
            raise ValueError("a peer password is required")
        self._sync = sync_obj
        self._self = self_node
        self._nodes = {n.address: n for n in other_nodes}
        # Peers that hold the password but are not members here (issue 27): accepted, never dialled.
        self._strangers: dict[str, Any] = {}
        # Since when a member whose address is greater (it dials us) has had no link: after
        # FALLBACK_DIAL_S we dial it ourselves (it may not know us yet: a member it has not heard of).
        self._no_link_since: dict[str, float] = {}
        self._group = group
        self._psk = pre_shared_key(password, group)
        self._psks = {_key_id(self._psk): self._psk}
        if previous_password:
            old = pre_shared_key(previous_password, group)
            self._psks[_key_id(old)] = old
        self.connect_via = dict(connect_via or {})
        self.max_frame_bytes = max_frame_bytes
        self.max_connections = max_connections
        self.handshake_timeout_s = handshake_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self.connect_retry_s = connect_retry_s
        self.max_queued_bytes = max_queued_bytes
        self.blocked: frozenset[str] = frozenset()
        self._listener: socket.socket | None = None
        self._listening = False
        self._accept_paused_until: float | None = None
        self._ready = False
        self._last_bind_attempt: float | None = None
        self._conns: dict[int, _Conn] = {}  # fd -> connection
        self._links: dict[str, _Conn] = {}  # peer address -> established connection
        self._last_connect: dict[str, float] = {}
        self.resolver = PeerResolver()
        self.counters: dict[str, int] = dict.fromkeys(
            (
                "accepted",
                "refused_cap",
                "handshake_failed",
                "oversized_frames",
                "bad_frames",
                "timeouts",
                "accept_errors",
                "connect_errors",
                "cluster_id_mismatch",
            ),
            0,
        )
        sync_obj.addOnTickCallback(self._on_tick)
        # Messages handed to SyncObj; with its dl_quiet_messages, says whether a read was quiet.
        self.delivered = 0
        self._counts_quiet = hasattr(sync_obj, "dl_quiet_messages")

    # -- pysyncobj's Transport ------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        return self._ready

    def tryGetReady(self) -> None:
        if self._ready:
            return
        now = dl_clock.current_monotonic()
        if self._last_bind_attempt is not None and now - self._last_bind_attempt < 1.0:
            raise TransportNotReadyError
        self._last_bind_attempt = now
        host, _, port = self._self.address.rpartition(":")
        bind_host = self._sync.conf.bindAddress.rpartition(":")[0] if self._sync.conf.bindAddress else host
        sock = socket.socket(socket.AF_INET6 if ":" in bind_host else socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((bind_host, int(port)))
            sock.listen(64)
            sock.setblocking(False)
        except OSError as exc:
            sock.close()
            log.warning("cannot listen on %s (%s): retrying", self._self.address, exc)
            raise TransportNotReadyError from None
        self._listener = sock
        self._listen(True)
        self._ready = True

    def send(self, node: Any, message: dict[str, Any]) -> bool:
        conn = self._links.get(node.address)
        if conn is None or conn.closed or node.address in self.blocked:
            return False
        if len(conn.outbuf) > self.max_queued_bytes:
            self._close(conn, "the peer does not read what is sent to it")
            return False
        self._send_frame(conn, peer_codec.encode(message))
        return True

    def pending_bytes(self, node: Any) -> int:
        conn = self._links.get(node.address)
        return len(conn.outbuf) if conn is not None else 0

    def is_up(self, address: str) -> bool:
        return address in self._links

    def addNode(self, node: Any) -> None:
        """A member joined (a membership entry in the log, issue 27): connect to it, accept it.
        It still has to pass the handshake: the group's password, and the cluster id check."""
        self._nodes[node.address] = node
        self._strangers.pop(node.address, None)

    def dropNode(self, node: Any) -> None:
        """A member left: its link is closed; if it comes back (it holds the password) it is a
        stranger: counted for nothing, its votes ignored (a removed replica cannot disrupt the group)."""
        self._nodes.pop(node.address, None)
        self._last_connect.pop(node.address, None)
        for conn in list(self._conns.values()):
            if conn.peer is not None and conn.peer.address == node.address:
                self._close(conn, "removed from the group", notify=True)

    def destroy(self) -> None:
        self.resolver.close()
        for conn in list(self._conns.values()):
            self._close(conn, None)
        if self._listener is not None:
            self._listen(False)
            self._listener.close()
            self._listener = None
        self._ready = False

    # -- listening ------------------------------------------------------------------------------
    def _listen(self, on: bool) -> None:
        assert self._listener is not None
        if on and not self._listening:
            self._sync.dl_poller.subscribe(self._listener.fileno(), self._on_accept, POLL_EVENT_TYPE.READ)
        elif not on and self._listening:
            self._sync.dl_poller.unsubscribe(self._listener.fileno())
        self._listening = on

    def _on_accept(self, _fd: int, _event: int) -> None:
        listener = self._listener
        if listener is None or not self._listening:
            return
        for _ in range(64):  # bounded per poll: established links get their turn
            try:
                sock, _addr = listener.accept()
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno in _NO_FD_ERRNOS:
                    # Out of descriptors: stop accepting for a moment (the kernel keeps queueing
                    # in the backlog), never close the listener.
                    self.counters["accept_errors"] += 1
                    if (
                        self.counters["accept_errors"] in (1, 10, 100)
                        or self.counters["accept_errors"] % 1000 == 0
                    ):
                        log.warning("accept failed (%s): pausing accepts for 0.5 s", exc)
                    self._listen(False)
                    self._accept_paused_until = dl_clock.current_monotonic() + 0.5
                    return
                log.warning("accept failed: %s", exc)
                return
            if len(self._conns) >= self.max_connections:
                self.counters["refused_cap"] += 1
                sock.close()
                continue
            self.counters["accepted"] += 1
            self._adopt(sock, outbound=False, peer=None)

    def _adopt(self, sock: socket.socket, outbound: bool, peer: Any | None) -> _Conn:
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        now = dl_clock.current_monotonic()
        conn = _Conn(sock, outbound, peer, now)
        conn.deadline = now + self.handshake_timeout_s
        self._conns[conn.fd] = conn
        mask = POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.ERROR
        if outbound:
            mask |= POLL_EVENT_TYPE.WRITE
        self._sync.dl_poller.subscribe(conn.fd, self._on_event, mask)
        return conn

    # -- connecting -----------------------------------------------------------------------------
    def _should_connect(self, address: str) -> bool:
        return bool(self._self.address > address)

    def _connect_missing(self, now: float) -> None:
        for address, node in self._nodes.items():
            if address in self._links or address in self.blocked:
                self._no_link_since.pop(address, None)
                continue
            if not self._should_connect(address):
                # It dials us, if it knows us; a member added by an entry it has not got yet does
                # not: after FALLBACK_DIAL_S without a link, dial it (it accepts a stranger).
                since = self._no_link_since.setdefault(address, now)
                if now - since < FALLBACK_DIAL_S:
                    continue
            if any(c.peer is node and not c.closed for c in self._conns.values()):
                continue  # a connection is on its way
            last = self._last_connect.get(address)
            if last is not None and now - last < self.connect_retry_s:
                continue
            self._last_connect[address] = now
            via = self.connect_via.get(address, address)
            host, _, port = via.rpartition(":")
            ip = self.resolver.resolve(host.strip("[]"), now)
            if ip is None:
                continue  # being looked up, or the name does not resolve (a dead container): retry
            sock = socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.setblocking(False)
                err = sock.connect_ex((ip, int(port)))
            except OSError as exc:  # never let one peer's address stop the replica
                err = exc.errno or -1
            if err not in (0, errno.EINPROGRESS):
                self.counters["connect_errors"] += 1
                sock.close()
                continue
            self._adopt(sock, outbound=True, peer=node)

    # -- events -----------------------------------------------------------------------------------
    def _on_event(self, fd: int, event: int) -> bool:
        """A descriptor is ready. True: the read handed over only messages that moved nothing a
        light tick reads (``DLedgerSyncObj.dl_quiet_messages``; keep-alives, a partial frame), so
        the poller need not tick after it (``LoopPoller``)."""
        conn = self._conns.get(fd)
        if conn is None or conn.closed:
            return False
        # Only a read of an established link can be quiet (no handshake, no error, no write).
        quiet_read = event == POLL_EVENT_TYPE.READ and conn.state == "ready" and self._counts_quiet
        delivered, quiet = (self.delivered, self._sync.dl_quiet_messages) if quiet_read else (0, 0)
        try:
            if event & POLL_EVENT_TYPE.ERROR:
                self._close(conn, "socket error")
                return False
            if conn.state == "connecting" and event & POLL_EVENT_TYPE.WRITE:
                err = conn.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if err:
                    self._close(conn, None)
                    return False
                self._send_hello(conn)
            if event & POLL_EVENT_TYPE.READ:
                self._read(conn)
            if not conn.closed and event & POLL_EVENT_TYPE.WRITE:
                self._flush(conn)
        except (HandshakeError, peer_codec.PeerCodecError) as exc:
            self.counters["handshake_failed" if conn.state != "ready" else "bad_frames"] += 1
            self._close(conn, f"refused: {exc}")
            return False
        except Exception as exc:  # a peer must never take the replica down
            self.counters["bad_frames"] += 1
            self._close(conn, f"dropped after {type(exc).__name__}: {exc}")
            return False
        return (
            quiet_read and not conn.closed and self.delivered - delivered == self._sync.dl_quiet_messages - quiet
        )

    def _read(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(1 << 18)
        except BlockingIOError:
            return
        except OSError as exc:
            self._close(conn, f"read failed: {exc}")
            return
        if not data:
            self._close(conn, None)
            return
        conn.last_recv = dl_clock.current_monotonic()
        conn.inbuf += data
        while not conn.closed:
            if len(conn.inbuf) < 4:
                return
            (n,) = _LEN.unpack_from(conn.inbuf)
            limit = self.max_frame_bytes if conn.state == "ready" else HANDSHAKE_FRAME_MAX
            if n > limit:
                self.counters["oversized_frames"] += 1
                self._close(conn, f"refused: a frame of {n} bytes (limit {limit})")
                return
            if len(conn.inbuf) < 4 + n:
                return
            body = bytes(conn.inbuf[4 : 4 + n])
            del conn.inbuf[: 4 + n]
            self._on_frame(conn, body)

    def _on_frame(self, conn: _Conn, body: bytes) -> None:
        if conn.state == "ready":
            assert conn.recv_cipher is not None and conn.peer is not None
            try:
                plain = conn.recv_cipher.open(body)
            except Exception:
                raise peer_codec.PeerCodecError("a frame failed authentication") from None
            if plain == _PING or conn.peer.address in self.blocked:
                return
            message = peer_codec.decode(plain)
            self.delivered += 1
            self._onMessageReceived(conn.peer, message)
        elif conn.state == "hello" and not conn.outbound:
            self._on_hello(conn, body)
        elif conn.state == "accept" and conn.outbound:
            self._on_accept_frame(conn, body)
        elif conn.state == "confirm" and not conn.outbound:
            self._on_confirm(conn, body)
        else:
            raise HandshakeError(f"unexpected frame in state {conn.state}")

    # -- the handshake -----------------------------------------------------------------------------
    def _send_hello(self, conn: _Conn) -> None:
        conn.eph = X25519PrivateKey.generate()
        conn.nonce = os.urandom(16)
        group, ident = self._group.encode(), self._self.address.encode()
        assert conn.peer is not None
        v2 = self.cluster_id is not None and conn.peer.address not in self._legacy_peers
        conn.hello = (
            (_HELLO2 if v2 else _HELLO)
            + bytes([len(group)])
            + group
            + bytes([len(ident)])
            + ident
            + _raw_public(conn.eph)
            + conn.nonce
            + _key_id(self._psk)
        )
        if v2:
            assert self.cluster_id is not None
            cid = self.cluster_id.encode()
            conn.hello += bytes([len(cid)]) + cid
        conn.state = "accept"
        self._queue_raw(conn, conn.hello)

    def _stranger(self, ident: bytes) -> Any:
        address = ident.decode(errors="replace")
        host, sep, port = address.rpartition(":")
        node_for = getattr(self._sync, "dl_node_for", None)
        if node_for is None or not sep or not host or not port.isdigit() or len(self._strangers) >= 16:
            raise HandshakeError(f"unknown peer {ident[:64]!r}")
        node = self._strangers.get(address)
        if node is None:
            node = self._strangers[address] = node_for(address)
        return node

    def _mismatch(self, peer_address: str, theirs: bytes) -> str:
        self.counters["cluster_id_mismatch"] += 1
        reason = (
            f"cluster id mismatch: peer {peer_address} belongs to cluster "
            f"{theirs[:CLUSTER_ID_MAX].decode(errors='replace')!r}, "
            f"this node to {self.cluster_id!r} (same group name and password, another cluster)"
        )
        log.warning("peer %s refused: %s", peer_address, reason)
        return reason

    def _on_hello(self, conn: _Conn, hello: bytes) -> None:
        v2 = hello.startswith(_HELLO2)
        if not (v2 or hello.startswith(_HELLO)):
            raise HandshakeError("not a dledger peer")
        group, at = _field(hello, 4)
        ident, at = _field(hello, at)
        if group != self._group.encode():
            raise HandshakeError(f"wrong group {group[:64]!r}")
        peer = self._nodes.get(ident.decode(errors="replace"))
        if peer is None:
            # Not a member here (yet, or any more): accepted once it proves the password (below),
            # as a stranger (see DLedgerSyncObj.dl_node_for; issue 27).
            peer = self._stranger(ident)
        theirs: bytes | None = None
        if v2:
            if len(hello) < at + 53:
                raise HandshakeError("malformed hello")
            theirs, end = _field(hello, at + 52)
            if end != len(hello) or not 0 < len(theirs) <= CLUSTER_ID_MAX:
                raise HandshakeError("malformed hello")
        elif len(hello) != at + 52:
            raise HandshakeError("malformed hello")
        peer_pub, nonce_i, key_id = hello[at : at + 32], hello[at + 32 : at + 48], hello[at + 48 : at + 52]
        psk = self._psks.get(key_id)
        if psk is None:
            raise HandshakeError("the peer uses a password this node does not hold")
        eph = X25519PrivateKey.generate()
        shared = eph.exchange(X25519PublicKey.from_public_bytes(peer_pub))
        nonce_a = os.urandom(16)
        ident_a = self._self.address.encode()
        if v2:
            assert theirs is not None
            ours = (self.cluster_id or "").encode()
            if ours and theirs != ours:
                reason = self._mismatch(peer.address, theirs)
                # Unauthenticated on purpose: it tells the initiator not to fall back to DLH1.
                self._queue_raw(conn, _REFUSE + reason.encode()[: HANDSHAKE_FRAME_MAX - 4])
                raise HandshakeError(reason)
            accept_body = (
                _ACCEPT2 + bytes([len(ident_a)]) + ident_a + _raw_public(eph) + nonce_a + bytes([len(ours)]) + ours
            )
        else:
            accept_body = _ACCEPT + bytes([len(ident_a)]) + ident_a + _raw_public(eph) + nonce_a
        transcript = hello + accept_body
        keys = _session_keys(psk, shared, nonce_i, nonce_a, transcript)
        mac_a = hmac.new(keys[:32], b"A" + transcript, "sha256").digest()
        conn.peer = peer
        conn.hello, conn.accept_body = hello, accept_body + mac_a
        conn.keys = keys
        conn.state = "confirm"
        self._queue_raw(conn, accept_body + mac_a)

    def _on_accept_frame(self, conn: _Conn, frame: bytes) -> None:
        conn.answered = True
        assert conn.peer is not None
        if frame.startswith(_REFUSE) and conn.hello.startswith(_HELLO2):
            self.counters["cluster_id_mismatch"] += 1
            reason = frame[4:].decode(errors="replace")
            log.warning("peer %s refused this node: %s", conn.peer.address, reason)
            raise HandshakeError(f"the peer refused: {reason}")
        v2 = frame.startswith(_ACCEPT2) and conn.hello.startswith(_HELLO2)
        if not (v2 or frame.startswith(_ACCEPT)) or conn.eph is None:
            raise HandshakeError("not a dledger peer")
        ident, at = _field(frame, 4)
        if len(frame) < at + 32 + 16 + 32:
            raise HandshakeError("malformed accept")
        theirs = b""
        end = at + 48
        if v2:
            theirs, end = _field(frame, at + 48)
        if len(frame) != end + 32:
            raise HandshakeError("malformed accept")
        if ident.decode(errors="replace") != conn.peer.address:
            raise HandshakeError(f"expected peer {conn.peer.address}, reached {ident[:64]!r}")
        peer_pub, nonce_a, mac_a = frame[at : at + 32], frame[at + 32 : at + 48], frame[end:]
        accept_body = frame[:end]
        transcript = conn.hello + accept_body
        shared = conn.eph.exchange(X25519PublicKey.from_public_bytes(peer_pub))
        keys = _session_keys(self._psk, shared, conn.nonce, nonce_a, transcript)
        if not hmac.compare_digest(mac_a, hmac.new(keys[:32], b"A" + transcript, "sha256").digest()):
            raise HandshakeError("the peer does not know the password")
        if theirs and self.cluster_id is not None and theirs != self.cluster_id.encode():
            raise HandshakeError(self._mismatch(conn.peer.address, theirs))
        mac_i = hmac.new(keys[:32], b"I" + transcript + mac_a, "sha256").digest()
        self._queue_raw(conn, _CONFIRM + mac_i)
        conn.send_cipher, conn.recv_cipher = _Cipher(keys[32:64]), _Cipher(keys[64:96])
        self._established(conn)

    def _on_confirm(self, conn: _Conn, frame: bytes) -> None:
        keys = conn.keys
        transcript = conn.hello + conn.accept_body[:-32]
        mac_a = conn.accept_body[-32:]
        want = _CONFIRM + hmac.new(keys[:32], b"I" + transcript + mac_a, "sha256").digest()
        if not hmac.compare_digest(frame, want):
            raise HandshakeError("the peer does not know the password")
        conn.send_cipher, conn.recv_cipher = _Cipher(keys[64:96]), _Cipher(keys[32:64])
        self._established(conn)

    def _established(self, conn: _Conn) -> None:
        assert conn.peer is not None
        conn.state = "ready"
        conn.deadline = None
        conn.eph = None
        old = self._links.get(conn.peer.address)
        if old is not None and old is not conn:
            if old.outbound != conn.outbound:
                # Both sides dialled (the fallback dial): keep the one the greater address opened.
                keep_new = conn.outbound == self._should_connect(conn.peer.address)
                if not keep_new:
                    self._close(conn, None, notify=False)
                    return
            self._close(old, None, notify=False)  # the peer restarted: the new session wins
        self._links[conn.peer.address] = conn
        if old is None:
            self._onNodeConnected(conn.peer)

    # -- writing -----------------------------------------------------------------------------------
    def _queue_raw(self, conn: _Conn, body: bytes) -> None:
        conn.outbuf += _LEN.pack(len(body)) + body
        self._flush(conn)

    def _send_frame(self, conn: _Conn, plain: bytes) -> None:
        assert conn.send_cipher is not None
        sealed = conn.send_cipher.seal(plain)
        conn.last_send = dl_clock.current_monotonic()
        conn.outbuf += _LEN.pack(len(sealed)) + sealed
        self._flush(conn)

    def _flush(self, conn: _Conn) -> None:
        if conn.closed or conn.state == "connecting":
            return
        if conn.outbuf:
            try:
                sent = conn.sock.send(conn.outbuf)
            except BlockingIOError:
                sent = 0
            except OSError as exc:
                self._close(conn, f"write failed: {exc}")
                return
            del conn.outbuf[:sent]
        mask = POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.ERROR
        if conn.outbuf:
            mask |= POLL_EVENT_TYPE.WRITE
        self._sync.dl_poller.subscribe(conn.fd, self._on_event, mask)

    # -- timers (tick callback) ---------------------------------------------------------------------
    def _on_tick(self) -> None:
        if not self._ready:
            return
        now = dl_clock.current_monotonic()
        if self._accept_paused_until is not None and now >= self._accept_paused_until:
            self._accept_paused_until = None
            self._listen(True)
        for conn in list(self._conns.values()):
            if conn.closed:
                continue
            if conn.deadline is not None and now > conn.deadline:
                self.counters["timeouts"] += 1
                self._close(conn, "no handshake in time" if conn.state != "connecting" else None)
            elif conn.state == "ready":
                if now - conn.last_recv > self.idle_timeout_s:
                    self.counters["timeouts"] += 1
                    self._close(conn, f"silent for {self.idle_timeout_s} s")
                elif now - conn.last_send > self.idle_timeout_s / 3:
                    self._send_frame(conn, _PING)
        self._connect_missing(now)

    # -- closing ----------------------------------------------------------------------------------
    def _close(self, conn: _Conn, reason: str | None, notify: bool = True) -> None:
        if conn.closed:
            return
        conn.closed = True
        self._conns.pop(conn.fd, None)
        if (
            conn.outbound
            and conn.state == "accept"
            and not conn.answered
            and not (reason or "").startswith(("refused", "no handshake"))
            and conn.peer is not None
            and conn.hello.startswith(_HELLO2)
        ):
            # Closed by the peer before any answer: a previous release, which knows only DLH1.
            self._legacy_peers.add(conn.peer.address)
        try:
            self._sync.dl_poller.unsubscribe(conn.fd)
        except Exception:
            pass
        try:
            conn.sock.close()
        except OSError:
            pass
        if reason:
            log.info(
                "peer connection %s closed: %s", conn.peer.address if conn.peer else "(unidentified)", reason
            )
        peer = conn.peer
        if peer is not None and self._links.get(peer.address) is conn:
            del self._links[peer.address]
            self._legacy_peers.discard(peer.address)  # it may come back upgraded
            self._strangers.pop(peer.address, None)
            if notify:
                self._onNodeDisconnected(peer)


def tcp_transport_factory(
    *,
    password: str,
    group: str,
    connect_via: dict[str, str],
    max_frame_bytes: int,
    idle_timeout_s: float,
    cluster_id: str | None = None,
) -> Callable[[Any, Any, Any], TcpPeerTransport]:
    def make(sync_obj: Any, self_node: Any, other_nodes: Any) -> TcpPeerTransport:
        return TcpPeerTransport(
            sync_obj,
            self_node,
            other_nodes,
            password=password,
            group=group,
            connect_via=connect_via,
            max_frame_bytes=max_frame_bytes,
            idle_timeout_s=idle_timeout_s,
            connect_retry_s=sync_obj.conf.connectionRetryTime,
            cluster_id=cluster_id,
        )

    return make
