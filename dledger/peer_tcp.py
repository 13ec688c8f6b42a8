"""The Raft peer transport over TCP (pysyncobj's TCPTransport, with dledger's changes).

- Frames are authenticated (``AeadEncryptor``: AES-256-GCM, key from the password by PBKDF2);
  unlisted ("readonly") peers are refused.
- Frames are pickled with protocol 5 and zlib level 0 (measured: zlib took 58 % of the leader's CPU
  on incompressible 1 KiB bodies; Fernet's base64 30 %).
- ``connect_via`` routes each link through a proxy (chaos runs) while peers keep their identities.

Thread ownership: everything runs on the node's tick thread.
"""

from __future__ import annotations

import hashlib
import os
import pickle as std_pickle
import struct
import zlib
from typing import Any

import pysyncobj.syncobj as _syncobj_mod
import pysyncobj.tcp_connection as _tcp_mod
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from pysyncobj.tcp_connection import CONNECTION_STATE
from pysyncobj.transport import TCPTransport

from dledger import clock as dl_clock

WIRE_PICKLE_PROTOCOL = 5
WIRE_ZLIB_LEVEL = 0


class AeadEncryptor:
    """Authenticated encryption of peer frames: ``v1 | timestamp u64 | nonce(12) | ciphertext+tag``.

    The version byte and timestamp are authenticated (associated data). Nonces are an 8-byte random
    prefix per instance plus a 4-byte counter; the prefix is drawn again before the counter wraps,
    so a (key, nonce) pair is never reused in practice.
    """

    VERSION = b"\x01"
    _HEAD = struct.Struct("<cQ")
    SALT = b"dledger-peer-frames-v1"

    def __init__(self, password: str):
        key = hashlib.pbkdf2_hmac("sha256", password.encode(), self.SALT, 200_000, 32)
        self._aead = AESGCM(key)
        self._prefix = os.urandom(8)
        self._counter = 0

    def _nonce(self) -> bytes:
        self._counter += 1
        if self._counter >= 1 << 32:
            self._prefix, self._counter = os.urandom(8), 1
        return self._prefix + self._counter.to_bytes(4, "little")

    def encrypt_at_time(self, data: bytes, current_time: int) -> bytes:
        head = self._HEAD.pack(self.VERSION, current_time)
        nonce = self._nonce()
        return head + nonce + self._aead.encrypt(nonce, data, head)

    def extract_timestamp(self, token: bytes) -> int:
        if len(token) < self._HEAD.size + 12 + 16 or token[:1] != self.VERSION:
            raise ValueError("not a dledger peer frame")
        return int(self._HEAD.unpack_from(token, 0)[1])

    def decrypt(self, token: bytes) -> bytes:
        head, nonce = token[: self._HEAD.size], token[self._HEAD.size : self._HEAD.size + 12]
        return self._aead.decrypt(nonce, token[self._HEAD.size + 12 :], head)  # raises InvalidTag


def _get_encryptor(password: str) -> AeadEncryptor:
    return AeadEncryptor(password)


def _fast_send(self: Any, message: Any) -> None:
    """TcpConnection.send with pickle protocol 5 and zlib level 0 (see module doc, item 7)."""
    if self.sendRandKey:
        message = (self.sendRandKey, message)
    data = zlib.compress(std_pickle.dumps(message, WIRE_PICKLE_PROTOCOL), WIRE_ZLIB_LEVEL)
    if self.encryptor:
        data = self.encryptor.encrypt_at_time(data, int(_tcp_mod.monotonicTime()))
    self._TcpConnection__writeBuffer += struct.pack("i", len(data)) + data
    self._TcpConnection__trySendBuffer()


_installed = False


def install_tcp_patches() -> None:
    global _installed
    if _installed:
        return
    _syncobj_mod.getEncryptor = _get_encryptor
    _tcp_mod.TcpConnection.send = _fast_send
    _installed = True


class DLedgerTransport(TCPTransport):
    """pysyncobj's TCPTransport with per-link proxies, refused read-only peers and test partitions."""

    # Peers (by Raft address) whose traffic this node drops both ways: an in-process partition
    # for tests; chaos runs cut real links through Toxiproxy instead.
    blocked: frozenset[str] = frozenset()

    def send(self, node: Any, message: Any) -> bool:
        if node.address in self.blocked:
            return False
        return bool(super().send(node, message))

    def _onMessageReceived(self, node: Any, message: Any) -> None:
        if node.address in self.blocked:
            return
        super()._onMessageReceived(node, message)

    # Peer address (its identity, as announced) -> where to connect to reach it, when different
    # (a Toxiproxy proxy per link in chaos runs). Only the connecting side uses it.
    connect_via: dict[str, str] = {}

    def _connectIfNecessarySingle(self, node: Any) -> bool:
        via = self.connect_via.get(node.address)
        if via is None:
            return bool(super()._connectIfNecessarySingle(node))
        conn = self._connections.get(node)
        if conn is not None and conn.state != CONNECTION_STATE.DISCONNECTED:
            return True
        if not self._shouldConnect(node):
            return False
        last = self._lastConnectAttempt.get(node)
        if last is not None and dl_clock.current_monotonic() - last < self._syncObj.conf.connectionRetryTime:
            return False
        self._lastConnectAttempt[node] = dl_clock.current_monotonic()
        host, _, port = via.rpartition(":")
        return bool(self._connections[node].connect(host, int(port)))

    def pending_bytes(self, node: Any) -> int:
        conn = self._connections.get(node)
        if conn is None or conn.state != CONNECTION_STATE.CONNECTED:
            return 0
        return int(conn.getSendBufferSize())

    def _onIncomingMessageReceived(self, conn: Any, message: Any) -> None:
        # Unlisted ("readonly") peers would receive the whole log: refuse them.
        if message == "readonly" and (not self._syncObj.encryptor or conn.sendRandKey):
            conn.disconnect()
            self._unknownConnections.discard(conn)
            return
        super()._onIncomingMessageReceived(conn, message)
