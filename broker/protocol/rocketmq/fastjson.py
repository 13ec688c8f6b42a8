"""The JSON dialect of fastjson (RocketMQ's Java serializer): a bounded reader and a writer.

fastjson writes a ``Map`` whose keys are not strings with the key itself as the member name:
``{0:"127.0.0.1:10911"}`` for ``HashMap<Long, String>`` (``BrokerData.brokerAddrs``) and
``{{"brokerName":"b","queueId":0,"topic":"t"}:{...}}`` for maps keyed by ``MessageQueue``
(``ConsumeStats``, ``TopicStatsTable``, ``ResetOffsetBody``). Standard JSON parsers refuse both;
the official clients parse them with fastjson. ``loads`` reads standard JSON plus exactly those two
key shapes; ``dumps`` writes what fastjson writes:

- a bean's fields sorted by name (the caller passes a dict in that order: ``bean``), maps and sets
  in the order given (Java's iteration order), ``null`` fields left out;
- strings escaped as fastjson does: ``\\b \\t \\n \\f \\r \\" \\\\``, other characters below
  U+0020, U+007F..U+009F, U+2028 and U+2029 as ``\\u00XX`` (upper-case hex); everything else
  as itself (UTF-8), ``/`` included;
- doubles as Java's ``Double.toString`` (``0.0``, ``12.5``, ``1.234567825E7``); NaN and infinities
  as ``null``.

A map with non-string keys is a ``Pairs`` (a list of ``(key, value)``) on both sides: a key is an
``int`` or a ``dict`` (an object used as a key). ``loads`` returns a plain ``dict`` for an object
whose keys are all strings or numbers, a ``Pairs`` when a key is an object.

Bounds of ``loads``: input bytes, nesting depth and the number of values (each a coded
``RemotingError`` ``BAD_JSON``; never RecursionError or MemoryError from hostile input).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Any, Final

from broker.protocol.rocketmq.errors import RemotingError

JSON_BYTES_MAX: Final = 64 << 20
DEPTH_MAX: Final = 32
VALUES_MAX: Final = 1_000_000


class Pairs(list[tuple[Any, Any]]):
    """A JSON object as ordered (key, value) pairs, for keys that are not strings."""


# -- writer -----------------------------------------------------------------------------------------
_ESCAPES: Final[dict[int, str]] = {c: f"\\u{c:04X}" for c in [*range(0x20), *range(0x7F, 0xA0), 0x2028, 0x2029]}
_ESCAPES.update({0x08: "\\b", 0x09: "\\t", 0x0A: "\\n", 0x0C: "\\f", 0x0D: "\\r", 0x22: '\\"', 0x5C: "\\\\"})
# The characters fastjson escapes (``quote``); a string without any is written as it is.
NEEDS_ESCAPE: Final = re.compile('[\\x00-\\x1f"\\\\\\x7f-\\x9f\u2028\u2029]')


def quote(s: str) -> str:
    """A JSON string literal as fastjson writes it."""
    if NEEDS_ESCAPE.search(s) is None:
        return f'"{s}"'
    return '"' + s.translate(_ESCAPES) + '"'


def java_double(value: float) -> str:
    """Java's ``Double.toString`` for the shortest digits of ``value``."""
    if value == 0:
        return "-0.0" if math.copysign(1.0, value) < 0 else "0.0"
    sign, digits_t, exp = Decimal(repr(value)).as_tuple()
    assert isinstance(exp, int)
    digits = "".join(map(str, digits_t)).rstrip("0") or "0"
    exp += len(digits_t) - len(digits)  # value = digits * 10**exp
    point = len(digits) + exp  # position of the decimal point in digits
    prefix = "-" if sign else ""
    magnitude = abs(value)
    if 1e-3 <= magnitude < 1e7:
        if point <= 0:
            return f"{prefix}0.{'0' * -point}{digits}"
        if point >= len(digits):
            return f"{prefix}{digits}{'0' * (point - len(digits))}.0"
        return f"{prefix}{digits[:point]}.{digits[point:]}"
    frac = digits[1:] or "0"
    return f"{prefix}{digits[0]}.{frac}E{point - 1}"


def dumps(value: Any) -> str:
    """``value`` as fastjson text (see the module doc for the shapes)."""
    out: list[str] = []
    _write(value, out)
    return "".join(out)


def dumps_bytes(value: Any) -> bytes:
    return dumps(value).encode("utf-8", "replace")


def _write(value: Any, out: list[str]) -> None:
    if isinstance(value, str):
        out.append(quote(value))
    elif value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, int):
        out.append(str(int(value)))
    elif isinstance(value, float):
        out.append("null" if math.isnan(value) or math.isinf(value) else java_double(value))
    elif isinstance(value, Pairs):
        out.append("{")
        first = True
        for key, item in value:
            if not first:
                out.append(",")
            first = False
            _write(key, out)
            out.append(":")
            _write(item, out)
        out.append("}")
    elif isinstance(value, Mapping):
        out.append("{")
        first = True
        for key, item in value.items():
            if item is None:
                continue  # fastjson leaves null members out
            if not first:
                out.append(",")
            first = False
            _write(key, out)
            out.append(":")
            _write(item, out)
        out.append("}")
    elif isinstance(value, (list, tuple, set, frozenset)):
        out.append("[")
        first = True
        for item in value:
            if not first:
                out.append(",")
            first = False
            _write(item, out)
        out.append("]")
    else:
        raise TypeError(f"cannot write {type(value).__name__} as fastjson")


def bean(**fields: Any) -> dict[str, Any]:
    """A Java bean as fastjson writes it: fields sorted by name, ``None`` ones left out."""
    return {name: fields[name] for name in sorted(fields) if fields[name] is not None}


# -- reader -----------------------------------------------------------------------------------------
_WS: Final = re.compile(r"[ \t\n\r]*")
_NUMBER: Final = re.compile(r"-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?")
_NUMBER_CHARS_MAX: Final = 400
_scanstring: Any = getattr(json.decoder, "scanstring")  # noqa: B009 (C-accelerated string scanner)


class _Reader:
    __slots__ = ("depth_max", "pos", "text", "values", "values_max")

    def __init__(self, text: str, depth_max: int, values_max: int):
        self.text = text
        self.pos = 0
        self.depth_max = depth_max
        self.values = 0
        self.values_max = values_max

    def fail(self, what: str) -> RemotingError:
        return RemotingError("BAD_JSON", f"{what} at offset {self.pos}")

    def skip_ws(self) -> None:
        m = _WS.match(self.text, self.pos)
        assert m is not None
        self.pos = m.end()

    def value(self, depth: int) -> Any:
        self.values += 1
        if self.values > self.values_max:
            raise self.fail(f"more than {self.values_max} values")
        self.skip_ws()
        text = self.text
        if self.pos >= len(text):
            raise self.fail("unexpected end of input")
        c = text[self.pos]
        if c == '"':
            try:
                s, self.pos = _scanstring(text, self.pos + 1, False)
            except ValueError as exc:
                raise self.fail(f"bad string ({str(exc)[:80]})") from None
            return s
        if c == "{":
            return self.obj(depth + 1)
        if c == "[":
            return self.array(depth + 1)
        if text.startswith("true", self.pos):
            self.pos += 4
            return True
        if text.startswith("false", self.pos):
            self.pos += 5
            return False
        if text.startswith("null", self.pos):
            self.pos += 4
            return None
        m = _NUMBER.match(text, self.pos)
        if m is None:
            raise self.fail(f"unexpected character {c!r}")
        if m.end() - m.start() > _NUMBER_CHARS_MAX:
            raise self.fail("number too long")
        self.pos = m.end()
        if m.group(1) is None and m.group(2) is None:
            return int(m.group(0))
        return float(m.group(0))

    def key(self, depth: int) -> Any:
        c = self.text[self.pos]
        if c == '"' or c == "{":
            return self.value(depth - 1)
        m = _NUMBER.match(self.text, self.pos)
        if m is None or m.group(1) is not None or m.group(2) is not None or m.end() - m.start() > 20:
            raise self.fail("an object key must be a string, an integer or an object")
        self.pos = m.end()
        return int(m.group(0))

    def obj(self, depth: int) -> Any:
        if depth > self.depth_max:
            raise self.fail(f"nesting deeper than {self.depth_max}")
        text = self.text
        self.pos += 1
        pairs: list[tuple[Any, Any]] = []
        plain = True
        self.skip_ws()
        if self.pos < len(text) and text[self.pos] == "}":
            self.pos += 1
            return {}
        while True:
            self.skip_ws()
            if self.pos >= len(text):
                raise self.fail("unexpected end of input in an object")
            key = self.key(depth)
            if isinstance(key, dict):
                plain = False
            self.skip_ws()
            if self.pos >= len(text) or text[self.pos] != ":":
                raise self.fail("expected ':'")
            self.pos += 1
            pairs.append((key, self.value(depth)))
            self.skip_ws()
            if self.pos >= len(text):
                raise self.fail("unexpected end of input in an object")
            c = text[self.pos]
            self.pos += 1
            if c == "}":
                return dict(pairs) if plain else Pairs(pairs)
            if c != ",":
                raise self.fail("expected ',' or '}'")

    def array(self, depth: int) -> list[Any]:
        if depth > self.depth_max:
            raise self.fail(f"nesting deeper than {self.depth_max}")
        text = self.text
        self.pos += 1
        items: list[Any] = []
        self.skip_ws()
        if self.pos < len(text) and text[self.pos] == "]":
            self.pos += 1
            return items
        while True:
            items.append(self.value(depth))
            self.skip_ws()
            if self.pos >= len(text):
                raise self.fail("unexpected end of input in an array")
            c = text[self.pos]
            self.pos += 1
            if c == "]":
                return items
            if c != ",":
                raise self.fail("expected ',' or ']'")


def loads(
    raw: bytes | str,
    *,
    bytes_max: int = JSON_BYTES_MAX,
    depth_max: int = DEPTH_MAX,
    values_max: int = VALUES_MAX,
) -> Any:
    """Parse fastjson text (standard JSON plus integer and object keys); ``RemotingError``
    ``BAD_JSON`` on anything else or beyond the bounds."""
    if len(raw) > bytes_max:
        raise RemotingError("BAD_JSON", f"a JSON body of {len(raw)} bytes exceeds {bytes_max}")
    if isinstance(raw, (bytes, bytearray, memoryview)):
        try:
            text = bytes(raw).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise RemotingError("BAD_JSON", f"the body is not UTF-8 (byte {exc.start})") from None
    else:
        text = raw
    reader = _Reader(text, depth_max, values_max)
    value = reader.value(0)
    reader.skip_ws()
    if reader.pos != len(text):
        raise reader.fail("trailing data")
    return value


def items(value: Any, what: str) -> list[tuple[Any, Any]]:
    """The members of a JSON object read by ``loads`` (a dict or ``Pairs``), or ``BAD_BODY``."""
    if isinstance(value, Pairs):
        return list(value)
    if isinstance(value, dict):
        return list(value.items())
    raise RemotingError("BAD_BODY", f"{what} must be an object")
