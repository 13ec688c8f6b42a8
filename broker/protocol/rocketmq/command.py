"""Remoting frames and ``RemotingCommand`` headers, both encodings, and the bounded frame decoder.

A frame (every integer big-endian)::

    offset  size  field
    0       4     length           bytes after this field: 4 + header + body
    4       1     serialize type   0 JSON, 1 ROCKETMQ (``SerializeType``)
    5       3     header length    bytes of the header that follows
    8       h     header           the command's fields, JSON or ROCKETMQ binary (below)
    8+h     rest  body             opaque bytes (a message, a batch, a JSON body ...)

JSON header: fastjson's text of the command's fields, sorted by name and without null ones:
``{"code":310,"extFields":{"a":"pg",...},"flag":0,"language":"JAVA","opaque":7,
"remark":"...","serializeTypeCurrentRPC":"JSON","version":409}``; ``extFields`` values are strings.

ROCKETMQ header::

    2 code (int16)  1 language  2 version (int16)  4 opaque  4 flag
    4 remark length + remark (UTF-8; length 0 = no remark)
    4 ext length + ext fields: per field 2 key length + key, 4 value length + value

``flag`` bit 0 marks a response, bit 1 a oneway request (no answer). A response repeats its
request's ``opaque`` and serialize type (``response_to``). Java's encoder may write a field twice
in a ROCKETMQ header (its fast path writes the header's fields and then ``extFields``): the
decoder keeps the last value, as Java's ``HashMap`` does.

``FrameDecoder`` bounds everything it allocates: a frame's length (``frame_bytes_max``), a header's
length, the number of ext fields and each key and value length (``Bounds``); on garbage it raises
``RemotingError`` (BAD_FRAME, FRAME_TOO_LARGE, HEADER_TOO_LARGE, BAD_HEADER) and the connection is
closed — after a bad frame nothing that follows can be trusted to be aligned.
"""

from __future__ import annotations

import dataclasses
import json
import struct
from collections.abc import Mapping
from typing import Any, Final

from broker.protocol.rocketmq.codes import LANGUAGE_BY_NAME, LanguageCode, SerializeType
from broker.protocol.rocketmq.errors import RemotingError
from broker.protocol.rocketmq.fastjson import NEEDS_ESCAPE, quote

FLAG_RESPONSE: Final = 0x1
FLAG_ONEWAY: Final = 0x2

VERSION_V4_9_3: Final = 399
"""``MQVersion.Version.V4_9_3.ordinal()``: a request whose ``version`` is at most this was signed
by a client that left ``_UNIQUE_KEY_QUERY`` out of its ACL signature (``acl.verify``)."""
VERSION_V4_9_8: Final = 409
"""``MQVersion.CURRENT_VERSION`` of the 4.9.8 client: what our servers put in ``version``."""

FRAME_BYTES_MAX_DEFAULT: Final = 16 << 20  # RocketMQ's default frameMaxLength
HEADER_BYTES_MAX_DEFAULT: Final = 256 << 10
EXT_FIELDS_MAX_DEFAULT: Final = 256
EXT_KEY_BYTES_MAX_DEFAULT: Final = 255
EXT_VALUE_BYTES_MAX_DEFAULT: Final = 64 << 10

_PREFIX: Final = struct.Struct(">II")
_RMQ_FIXED: Final = struct.Struct(">hBhiiI")  # code, language, version, opaque, flag, remark length
_U16: Final = struct.Struct(">H")
_U32: Final = struct.Struct(">I")
_INT32_MIN: Final = -(2**31)
_INT32_MAX: Final = 2**31 - 1
_STR_ONLY: Final = frozenset({str})


@dataclasses.dataclass(frozen=True, slots=True)
class Bounds:
    """What one frame may hold; a server passes its own (the broker: ``maxMessageSize`` + room)."""

    frame_bytes_max: int = FRAME_BYTES_MAX_DEFAULT
    header_bytes_max: int = HEADER_BYTES_MAX_DEFAULT
    ext_fields_max: int = EXT_FIELDS_MAX_DEFAULT
    ext_key_bytes_max: int = EXT_KEY_BYTES_MAX_DEFAULT
    ext_value_bytes_max: int = EXT_VALUE_BYTES_MAX_DEFAULT


DEFAULT_BOUNDS: Final = Bounds()


@dataclasses.dataclass(frozen=True, slots=True)
class RemotingCommand:
    """One request or response. ``ext_fields`` is None when the command carries no map at all
    (JSON leaves ``extFields`` out then), ``{}`` for an empty one; ``language`` is kept as the
    number sent (an unknown one is written back as ``OTHER`` in JSON)."""

    code: int
    opaque: int
    flag: int = 0
    language: int = LanguageCode.JAVA
    version: int = 0
    remark: str | None = None
    ext_fields: dict[str, str] | None = None
    body: bytes = b""
    serialize_type: SerializeType = SerializeType.JSON

    @property
    def is_response(self) -> bool:
        return bool(self.flag & FLAG_RESPONSE)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flag & FLAG_ONEWAY)

    def ext(self, name: str) -> str | None:
        return None if self.ext_fields is None else self.ext_fields.get(name)


def request(
    code: int,
    opaque: int,
    ext_fields: Mapping[str, str] | None = None,
    body: bytes = b"",
    *,
    oneway: bool = False,
    serialize_type: SerializeType = SerializeType.JSON,
    version: int = VERSION_V4_9_8,
    language: int = LanguageCode.JAVA,
) -> RemotingCommand:
    """A request (what a server sends a client: CHECK_TRANSACTION_STATE, NOTIFY_CONSUMER_IDS_CHANGED)."""
    return RemotingCommand(
        code=code, opaque=opaque, flag=FLAG_ONEWAY if oneway else 0, language=language, version=version,
        ext_fields=None if ext_fields is None else dict(ext_fields), body=body, serialize_type=serialize_type,
    )


def response_to(
    req: RemotingCommand,
    code: int,
    remark: str | None = None,
    ext_fields: Mapping[str, str] | None = None,
    body: bytes = b"",
    *,
    version: int = VERSION_V4_9_8,
) -> RemotingCommand:
    """The answer to ``req``: its opaque, its serialize type, the response flag."""
    return RemotingCommand(
        code=code, opaque=req.opaque, flag=FLAG_RESPONSE, language=LanguageCode.JAVA, version=version,
        remark=remark, ext_fields=None if ext_fields is None else dict(ext_fields), body=body,
        serialize_type=req.serialize_type,
    )


# -- encoding ---------------------------------------------------------------------------------------
_LANGUAGE_NAMES: Final = {int(c): c.name for c in LanguageCode}
_SERIALIZE_NAMES: Final = {int(t): t.name for t in SerializeType}


def _ext_members(ext: Mapping[str, str]) -> str:
    """``extFields``' members as fastjson writes them. When no key and no value needs escaping (the
    usual header) they are joined in C, no call per field; otherwise each is quoted."""
    if not ext:
        return ""
    if NEEDS_ESCAPE.search("".join(ext)) is None and NEEDS_ESCAPE.search("".join(ext.values())) is None:
        return '"' + '","'.join(map('":"'.join, ext.items())) + '"'
    return ",".join(f"{quote(k)}:{quote(v)}" for k, v in ext.items())


def encode_json_header(cmd: RemotingCommand) -> bytes:
    language = _LANGUAGE_NAMES.get(cmd.language, "OTHER")
    stype = _SERIALIZE_NAMES.get(cmd.serialize_type) or SerializeType(cmd.serialize_type).name
    ext = "" if cmd.ext_fields is None else ',"extFields":{' + _ext_members(cmd.ext_fields) + "}"
    remark = "" if cmd.remark is None else ',"remark":' + quote(cmd.remark)
    return ('{"code":' + str(cmd.code) + ext + f',"flag":{cmd.flag},"language":"{language}","opaque":{cmd.opaque}'
            + remark + f',"serializeTypeCurrentRPC":"{stype}","version":{cmd.version}}}').encode("utf-8", "replace")


def encode_rocketmq_header(cmd: RemotingCommand) -> bytes:
    remark = cmd.remark.encode("utf-8", "replace") if cmd.remark else b""
    ext = b""
    if cmd.ext_fields:
        chunks = []
        for key, value in cmd.ext_fields.items():
            kb = key.encode("utf-8", "replace")
            vb = value.encode("utf-8", "replace")
            chunks.append(_U16.pack(len(kb)) + kb + _U32.pack(len(vb)) + vb)
        ext = b"".join(chunks)
    try:
        fixed = _RMQ_FIXED.pack(cmd.code, cmd.language, cmd.version, cmd.opaque, cmd.flag, len(remark))
    except struct.error:
        raise ValueError(f"code {cmd.code} or version {cmd.version} does not fit the ROCKETMQ header") from None
    return fixed + remark + _U32.pack(len(ext)) + ext


def encode_header(cmd: RemotingCommand, body_bytes: int | None = None) -> bytes:
    """The frame up to (not including) the body, for a body of ``body_bytes`` (default: cmd.body):
    a writer sends this and the body without copying the body into one buffer."""
    if cmd.serialize_type == SerializeType.ROCKETMQ:
        header = encode_rocketmq_header(cmd)
    else:
        header = encode_json_header(cmd)
    body_len = len(cmd.body) if body_bytes is None else body_bytes
    return _PREFIX.pack(4 + len(header) + body_len, (int(cmd.serialize_type) << 24) | len(header)) + header


def encode(cmd: RemotingCommand) -> bytes:
    """The whole frame."""
    return encode_header(cmd) + cmd.body


# -- decoding ---------------------------------------------------------------------------------------
def _check_int32(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not _INT32_MIN <= value <= _INT32_MAX:
        raise RemotingError("BAD_HEADER", f"{name} must be a 32-bit integer")
    return value


def decode_json_header(raw: bytes, bounds: Bounds = DEFAULT_BOUNDS) -> dict[str, Any]:
    """The fields of a JSON header, checked; keys as ``RemotingCommand``'s."""
    try:
        obj = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise RemotingError("BAD_HEADER", f"the JSON header cannot be read: {str(exc)[:120]}") from None
    if not isinstance(obj, dict):
        raise RemotingError("BAD_HEADER", "the JSON header must be an object")
    if "code" not in obj:
        raise RemotingError("BAD_HEADER", "the JSON header has no code")
    fields: dict[str, Any] = {"code": _check_int32(obj["code"], "code")}
    for name in ("opaque", "flag", "version"):
        value = obj.get(name)
        if value is None:
            fields[name] = 0
        elif type(value) is int and _INT32_MIN <= value <= _INT32_MAX:  # _check_int32's usual case, in line
            fields[name] = value
        else:
            fields[name] = _check_int32(value, name)
    language = obj.get("language")
    if isinstance(language, str):
        fields["language"] = LANGUAGE_BY_NAME.get(language, LanguageCode.OTHER)
    elif language is None:
        fields["language"] = LanguageCode.JAVA
    else:
        fields["language"] = _check_int32(language, "language")  # fastjson also reads an ordinal
    remark = obj.get("remark")
    if remark is not None and not isinstance(remark, str):
        raise RemotingError("BAD_HEADER", "remark must be a string")
    fields["remark"] = remark
    ext = obj.get("extFields")
    if ext is None:
        fields["ext_fields"] = None
    elif not isinstance(ext, dict):
        raise RemotingError("BAD_HEADER", "extFields must be an object")
    else:
        if len(ext) > bounds.ext_fields_max:
            raise RemotingError("BAD_HEADER", f"{len(ext)} ext fields exceed {bounds.ext_fields_max}")
        values = ext.values()
        if (set(map(type, values)) <= _STR_ONLY and max(map(len, ext), default=0) <= bounds.ext_key_bytes_max
                and max(map(len, values), default=0) <= bounds.ext_value_bytes_max):
            # every value a string within bounds (what clients send): the map json made is the answer,
            # checked in C; otherwise field by field below (conversions, dropped nulls, the refusal)
            fields["ext_fields"] = ext
            return fields
        checked: dict[str, str] = {}
        for key, value in ext.items():
            if len(key) > bounds.ext_key_bytes_max:
                raise RemotingError("BAD_HEADER", f"an ext field name of {len(key)} characters is too long")
            if isinstance(value, str):
                pass
            elif value is None:
                continue  # fastjson drops a null entry
            elif isinstance(value, bool):
                value = "true" if value else "false"
            elif isinstance(value, int):
                value = str(value)
            else:
                raise RemotingError("BAD_HEADER", f"ext field {key[:64]!r} must be a string")
            if len(value) > bounds.ext_value_bytes_max:
                raise RemotingError("BAD_HEADER", f"ext field {key[:64]!r} is longer than {bounds.ext_value_bytes_max}")
            checked[key] = value
        fields["ext_fields"] = checked
    return fields


def decode_rocketmq_header(raw: bytes | memoryview, bounds: Bounds = DEFAULT_BOUNDS) -> dict[str, Any]:
    """The fields of a ROCKETMQ binary header, checked against its own length and ``bounds``."""
    end = len(raw)
    if end < _RMQ_FIXED.size + 4:
        raise RemotingError("BAD_HEADER", f"a ROCKETMQ header of {end} bytes is shorter than its fixed part")
    code, language, version, opaque, flag, remark_len = _RMQ_FIXED.unpack_from(raw, 0)
    pos = _RMQ_FIXED.size
    if remark_len > end - pos - 4:
        raise RemotingError("BAD_HEADER", f"remark length {remark_len} exceeds the header")
    try:
        remark = bytes(raw[pos:pos + remark_len]).decode("utf-8") if remark_len else None
    except UnicodeDecodeError:
        raise RemotingError("BAD_HEADER", "the remark is not UTF-8") from None
    pos += remark_len
    (ext_len,) = _U32.unpack_from(raw, pos)
    pos += 4
    if ext_len != end - pos:
        raise RemotingError("BAD_HEADER", f"ext fields length {ext_len} does not match the header ({end - pos} left)")
    ext: dict[str, str] | None = None
    if ext_len:
        data = bytes(raw[pos:end])  # one copy, then slices of bytes: cheaper than memoryview slices
        ext = {}
        count, at, stop = 0, 0, len(data)
        key_max, value_max, fields_max = bounds.ext_key_bytes_max, bounds.ext_value_bytes_max, bounds.ext_fields_max
        unpack_u16, unpack_u32 = _U16.unpack_from, _U32.unpack_from
        try:
            while at < stop:
                count += 1
                if count > fields_max:
                    raise RemotingError("BAD_HEADER", f"more than {fields_max} ext fields")
                if at + 2 > stop:
                    raise RemotingError("BAD_HEADER", "the ext fields are truncated")
                (klen,) = unpack_u16(data, at)
                at += 2
                if klen > key_max or at + klen + 4 > stop:
                    raise RemotingError("BAD_HEADER", f"ext field name length {klen} does not fit")
                key = data[at:at + klen].decode()
                at += klen
                (vlen,) = unpack_u32(data, at)
                at += 4
                if vlen > value_max or at + vlen > stop:
                    raise RemotingError("BAD_HEADER", f"ext field {key[:64]!r}: value length {vlen} does not fit")
                ext[key] = data[at:at + vlen].decode()
                at += vlen
        except UnicodeDecodeError:
            raise RemotingError("BAD_HEADER", "an ext field is not UTF-8") from None
    return {"code": code, "language": language, "version": version, "opaque": opaque, "flag": flag,
            "remark": remark, "ext_fields": ext}


def decode_frame_content(content: bytes | memoryview, bounds: Bounds = DEFAULT_BOUNDS) -> RemotingCommand:
    """A frame without its 4-byte length: the header-length word, the header and the body."""
    if len(content) < 4:
        raise RemotingError("BAD_FRAME", f"a frame of {len(content)} bytes has no header length")
    (word,) = _U32.unpack_from(content, 0)
    kind, header_len = word >> 24, word & 0xFFFFFF
    if header_len > len(content) - 4:
        raise RemotingError("BAD_FRAME", f"header length {header_len} exceeds the frame ({len(content) - 4})")
    if header_len > bounds.header_bytes_max:
        raise RemotingError("HEADER_TOO_LARGE", f"a header of {header_len} bytes exceeds {bounds.header_bytes_max}")
    return _command(kind, content[4:4 + header_len], content[4 + header_len:], bounds)


def _command(kind: int, header: bytes | memoryview, body: bytes | memoryview, bounds: Bounds) -> RemotingCommand:
    """The command of a frame whose header length was checked: its header decoded by ``kind``."""
    if kind == SerializeType.JSON:
        return RemotingCommand(body=bytes(body), serialize_type=SerializeType.JSON,
                               **decode_json_header(bytes(header), bounds))
    if kind == SerializeType.ROCKETMQ:
        return RemotingCommand(body=bytes(body), serialize_type=SerializeType.ROCKETMQ,
                               **decode_rocketmq_header(header, bounds))
    raise RemotingError("BAD_FRAME", f"serialize type {kind} is neither JSON (0) nor ROCKETMQ (1)")


def decode(frame: bytes | memoryview, bounds: Bounds = DEFAULT_BOUNDS) -> RemotingCommand:
    """One whole frame (length included); its length must match."""
    if len(frame) < 4:
        raise RemotingError("BAD_FRAME", "a frame starts with a 4-byte length")
    (length,) = _U32.unpack_from(frame, 0)
    if length != len(frame) - 4:
        raise RemotingError("BAD_FRAME", f"frame length {length} does not match the {len(frame) - 4} bytes given")
    if length + 4 > bounds.frame_bytes_max:
        raise RemotingError("FRAME_TOO_LARGE", f"a frame of {length + 4} bytes exceeds {bounds.frame_bytes_max}")
    return decode_frame_content(memoryview(frame)[4:], bounds)


class FrameDecoder:
    """Bytes in as they arrive, commands out. Holds at most one partial frame (bounded by
    ``bounds.frame_bytes_max``) plus whatever arrived with it. (Deleting a consumed frame from
    the front of a ``bytearray`` only moves its start: no copy of what follows.)"""

    def __init__(self, bounds: Bounds = DEFAULT_BOUNDS):
        self.bounds = bounds
        self._buf = bytearray()

    @property
    def buffered(self) -> int:
        return len(self._buf)

    @property
    def mid_frame(self) -> bool:
        """Part of a frame has arrived (its rest must follow in time)."""
        return bool(self._buf)

    def feed(self, data: bytes) -> None:
        self._buf += data

    def next(self) -> RemotingCommand | None:
        """The next complete command, None when more bytes are needed, or ``RemotingError``."""
        buf = self._buf
        if len(buf) < 4:
            return None
        (length,) = _U32.unpack_from(buf, 0)
        if length < 4:
            raise RemotingError("BAD_FRAME", f"frame length {length} is below the 4-byte header length")
        if length + 4 > self.bounds.frame_bytes_max:
            raise RemotingError("FRAME_TOO_LARGE",
                                f"a frame of {length + 4} bytes exceeds {self.bounds.frame_bytes_max}")
        if len(buf) < 8:
            return None  # a whole frame is at least 8 bytes (length >= 4)
        (word,) = _U32.unpack_from(buf, 4)
        header_len, kind = word & 0xFFFFFF, word >> 24
        if header_len > length - 4:
            raise RemotingError("BAD_FRAME", f"header length {header_len} exceeds the frame ({length - 4})")
        if header_len > self.bounds.header_bytes_max:
            raise RemotingError("HEADER_TOO_LARGE",
                                f"a header of {header_len} bytes exceeds {self.bounds.header_bytes_max}")
        if kind > SerializeType.ROCKETMQ:
            raise RemotingError("BAD_FRAME", f"serialize type {kind} is neither JSON (0) nor ROCKETMQ (1)")
        end = 4 + length
        if len(buf) < end:
            return None
        # The whole frame is here and its header-length word was checked above (length >= 4, so
        # it is): what ``decode_frame_content`` would check again is not; the same command.
        header_end = 8 + header_len
        with memoryview(buf) as view, view[8:header_end] as header, view[header_end:end] as body:
            cmd = _command(kind, header, body, self.bounds)
        del buf[:end]
        return cmd
