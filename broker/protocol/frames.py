"""The broker's binary protocol ("remoting", after RocketMQ's): length-prefixed frames, many
requests in flight on one connection, answers in any order (matched by request id).

Pure: no sockets, no clocks. Shared by the broker (``broker/edge/binary.py``) and the SDK
(``broker/client/remoting.py``). Every frame::

    offset size  field
    0      4     length      bytes after this field (header rest + auth + body), big-endian
    4      1     version     1
    5      1     flags       bit 0 RESPONSE, bit 1 ERROR (the body is {code, message, status, ...})
    6      2     op          the operation (``Op``); an answer repeats its request's op
    8      4     request id  chosen by the client, unique among its requests in flight; echoed
    12     2     auth length bytes of the signature that follow (0: unsigned; answers: 0)
    14     auth  signature   the ``Authorization`` value of broker.protocol.auth, ASCII
    14+a   rest  body        msgpack: a map (requests: the HTTP API's request body for that op)

Signature: ``authorization(creds, "REMOTING", op_name(op), body, ts, scope=<broker's scope>)`` — the
HTTP scheme with ``method`` = ``REMOTING`` and ``target`` = the op's name; it declares the body's
hash, so the broker checks it from the frame's *head* (the 14 bytes and the signature) before it
buffers the body, and compares the hash once the body is in (same timestamp and nonce windows as
HTTP).

``FrameDecoder`` takes bytes as they arrive and yields a frame's head (``next_head``) as soon as it
is complete, then its body (``next_body``) or discards the body unread as it arrives
(``skip_body``: a refused frame costs no memory); ``next`` yields whole frames (the SDK). Anything
malformed (a length beyond the cap or below the header, an unknown version or flag) raises
``FrameError`` — the connection is then answered with an error frame and closed: after a bad frame
nothing that follows can be trusted to be aligned.
"""

from __future__ import annotations

import dataclasses
import enum
import struct
import threading
from typing import Any, Final

import msgpack

from broker.protocol.auth import HEADER_CHARS_MAX
from broker.protocol.errors import ProtocolError

VERSION: Final = 1
HEADER: Final = struct.Struct(">IBBHIH")
HEADER_BYTES: Final = HEADER.size  # 14
LENGTH_MIN: Final = HEADER_BYTES - 4
AUTH_BYTES_MAX: Final = HEADER_CHARS_MAX  # the same bound as HTTP's Authorization header
FRAME_BYTES_MAX_DEFAULT: Final = 12 << 20  # the broker sets its own: maxMessageSize + 8 MiB, like HTTP
REQUEST_ID_MAX: Final = 2**32 - 1

FLAG_RESPONSE: Final = 0x01
FLAG_ERROR: Final = 0x02
_FLAGS_KNOWN: Final = FLAG_RESPONSE | FLAG_ERROR

AUTH_METHOD: Final = "REMOTING"


class Op(enum.IntEnum):
    """Operations; each takes and answers the map its HTTP route (``HTTP_PATH``) takes and answers."""

    SEND = 1  # one message or a batch
    PULL = 2
    # 3 is reserved (consumer heartbeats, which stay on HTTP for now)
    PING = 4  # no body; answers {} (liveness, tests)


# The HTTP API's route (POST) of each data-path operation: the same request map, the same answer.
# Where a client sends the operation when the broker has no binary port (docs/API.md).
HTTP_PATH: Final[dict[Op, str]] = {Op.SEND: "/v1/send", Op.PULL: "/v1/pull"}


OP_NAMES: Final = {int(op): op.name for op in Op}
OPS: Final = {int(op): op for op in Op}  # Op(n) without the enum's Python __call__ and __new__


def op_name(op: int) -> str:
    return OP_NAMES.get(op, f"OP_{op}")


class FrameError(ProtocolError):
    """A malformed frame or stream: ``code`` for the error frame, then the connection closes."""


@dataclasses.dataclass(frozen=True, slots=True)
class Frame:
    flags: int
    op: int
    request_id: int
    auth: str
    body: bytes

    @property
    def is_response(self) -> bool:
        return bool(self.flags & FLAG_RESPONSE)

    @property
    def is_error(self) -> bool:
        return bool(self.flags & FLAG_ERROR)


def encode(op: int, request_id: int, body: bytes, *, flags: int = 0, auth: str = "") -> bytes:
    raw_auth = auth.encode("ascii")
    if len(raw_auth) > AUTH_BYTES_MAX:
        raise ValueError(f"signature longer than {AUTH_BYTES_MAX} bytes")
    if not 0 <= request_id <= REQUEST_ID_MAX or not 0 <= op <= 0xFFFF or flags & ~_FLAGS_KNOWN:
        raise ValueError("request id, op or flags out of range")
    length = LENGTH_MIN + len(raw_auth) + len(body)
    return HEADER.pack(length, VERSION, flags, op, request_id, len(raw_auth)) + raw_auth + body


_PACKERS = threading.local()  # one msgpack Packer per thread (a Packer is not safe to share)


def pack_body(obj: Any) -> bytes:
    """``msgpack.packb(obj, use_bin_type=True)``'s bytes, from this thread's Packer rather than a new
    one per frame (a Packer resets itself when a value cannot be packed)."""
    try:
        pack = _PACKERS.pack
    except AttributeError:
        pack = _PACKERS.pack = msgpack.Packer(use_bin_type=True).pack
    return pack(obj)


def unpack_body(raw: bytes) -> dict[str, Any]:
    """The body's map, or ``FrameError`` (BAD_MSGPACK / BAD_REQUEST); an empty body is ``{}``."""
    if not raw:
        return {}
    try:
        value = msgpack.unpackb(raw, raw=False, strict_map_key=False)
    except Exception as exc:
        raise FrameError("BAD_MSGPACK", f"the frame body is not msgpack: {str(exc)[:120]}") from None
    if not isinstance(value, dict):
        raise FrameError("BAD_REQUEST", "the frame body must be a map")
    return value


def error_body(code: str, message: str, status: int = 400, **extra: Any) -> bytes:
    return pack_body({"code": code, "message": message, "status": status, **extra})


@dataclasses.dataclass(frozen=True, slots=True)
class FrameHead:
    """A frame's header and signature; ``body_bytes`` of body follow."""

    flags: int
    op: int
    request_id: int
    auth: str
    body_bytes: int

    @property
    def is_response(self) -> bool:
        return bool(self.flags & FLAG_RESPONSE)


HEAD_BYTES_MAX: Final = HEADER_BYTES + AUTH_BYTES_MAX  # what a peer may make us hold before the body


class FrameDecoder:
    """Bytes in, frame heads and bodies out. ``frame_bytes_max`` bounds one frame; the buffer holds at
    most one frame plus what arrived with it, and nothing of a body being skipped."""

    def __init__(self, frame_bytes_max: int = FRAME_BYTES_MAX_DEFAULT):
        self.frame_bytes_max = frame_bytes_max
        self._buf = bytearray()
        self._head: FrameHead | None = None  # returned by next_head, body not taken yet
        self._skip = 0  # bytes of a skipped body still to come (dropped as they arrive)

    @property
    def buffered(self) -> int:
        return len(self._buf)

    @property
    def mid_frame(self) -> bool:
        """Part of a frame has arrived (its rest must follow in time)."""
        return bool(self._buf) or self._head is not None or self._skip > 0

    def feed(self, data: bytes) -> None:
        if self._skip:
            n = min(self._skip, len(data))
            self._skip -= n
            data = data[n:]
        self._buf += data

    def next_head(self) -> FrameHead | None:
        """The next frame's head (its body stays to be taken or skipped), None when more bytes are
        needed, or ``FrameError``."""
        assert self._head is None, "take or skip the previous frame's body first"
        buf = self._buf
        if len(buf) < 4:
            return None
        length = int.from_bytes(buf[:4], "big")
        if length < LENGTH_MIN:
            raise FrameError("BAD_FRAME", f"frame length {length} is below the header's {LENGTH_MIN}")
        if length + 4 > self.frame_bytes_max:
            raise FrameError("FRAME_TOO_LARGE", f"a frame of {length + 4} bytes exceeds {self.frame_bytes_max}")
        if len(buf) < HEADER_BYTES:
            return None
        _, version, flags, op, rid, auth_len = HEADER.unpack_from(buf)
        if version != VERSION:
            raise FrameError("BAD_VERSION", f"protocol version {version} is not served (this side speaks {VERSION})")
        if flags & ~_FLAGS_KNOWN:
            raise FrameError("BAD_FRAME", f"unknown flags 0x{flags:02x}")
        if auth_len > AUTH_BYTES_MAX or LENGTH_MIN + auth_len > length:
            raise FrameError("BAD_FRAME", f"signature length {auth_len} does not fit the frame")
        if len(buf) < HEADER_BYTES + auth_len:
            return None
        auth_raw = bytes(buf[HEADER_BYTES:HEADER_BYTES + auth_len])
        try:
            auth = auth_raw.decode("ascii")
        except UnicodeDecodeError:
            raise FrameError("BAD_FRAME", "the signature is not ASCII") from None
        del buf[:HEADER_BYTES + auth_len]
        self._head = FrameHead(flags, op, rid, auth, length - LENGTH_MIN - auth_len)
        return self._head

    def next_body(self) -> bytes | None:
        """The body of the head ``next_head`` returned, once all of it arrived (None before)."""
        head = self._head
        assert head is not None
        if len(self._buf) < head.body_bytes:
            return None
        body = bytes(self._buf[:head.body_bytes])
        del self._buf[:head.body_bytes]
        self._head = None
        return body

    def skip_body(self) -> None:
        """Discard the body of the head ``next_head`` returned, without buffering it."""
        head = self._head
        assert head is not None
        here = min(head.body_bytes, len(self._buf))
        del self._buf[:here]
        self._skip = head.body_bytes - here
        self._head = None

    def next(self) -> Frame | None:
        """The next complete frame, None when more bytes are needed, or ``FrameError``."""
        head = self._head or self.next_head()
        if head is None:
            return None
        body = self.next_body()
        if body is None:
            return None
        return Frame(head.flags, head.op, head.request_id, head.auth, body)
