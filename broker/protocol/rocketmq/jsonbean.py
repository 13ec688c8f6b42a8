"""A small schema layer between frozen dataclasses and fastjson text (``broker.protocol.rocketmq.fastjson``).

A body class lists ``JSON``: ``(attribute, JSON name, codec)`` per field. ``encode_bean`` writes a
fastjson bean (members sorted by JSON name, ``None`` left out); ``decode_bean`` reads one from what
``fastjson.loads`` returned, checking every type and naming the path of a bad member
(``RemotingError`` ``BAD_BODY``); members it does not know are ignored (a newer client's fields).

Codecs: ``STR``, ``INT`` (Java int), ``LONG``, ``BOOL``, ``DOUBLE``, ``enum_of(names)``,
``list_of(c)``, ``map_of(c)`` (string keys), ``long_map_of(c)`` (``HashMap<Long, X>``: keys written
bare, fastjson style, or quoted in standard JSON), ``bean_of(cls)``, ``bean_map_of(key_cls, c)``
(maps keyed by a bean, e.g. ``MessageQueue``: written as ``fastjson.Pairs``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Final

from broker.protocol.rocketmq.errors import RemotingError
from broker.protocol.rocketmq.fastjson import Pairs, items

INT_MIN: Final = -(2**31)
INT_MAX: Final = 2**31 - 1
LONG_MIN: Final = -(2**63)
LONG_MAX: Final = 2**63 - 1


@dataclasses.dataclass(frozen=True, slots=True)
class Codec:
    encode: Callable[[Any, bool], Any]  # (value, standard_json) -> JSON-ready value
    decode: Callable[[Any, str], Any]  # (parsed JSON, path) -> value


def _bad(path: str, what: str) -> RemotingError:
    return RemotingError("BAD_BODY", f"{path} {what}")


def _same(value: Any, _std: bool) -> Any:
    return value


def _str(value: Any, path: str) -> str:
    if not isinstance(value, str):
        raise _bad(path, "must be a string")
    return value


def _ranged(lo: int, hi: int) -> Callable[[Any, str], int]:
    def decode(value: Any, path: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise _bad(path, f"must be an integer in {lo}..{hi}")
        return value
    return decode


def _bool(value: Any, path: str) -> bool:
    if not isinstance(value, bool):
        raise _bad(path, "must be true or false")
    return value


def _double(value: Any, path: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _bad(path, "must be a number")
    return float(value)


STR: Final = Codec(_same, _str)
INT: Final = Codec(_same, _ranged(INT_MIN, INT_MAX))
LONG: Final = Codec(_same, _ranged(LONG_MIN, LONG_MAX))
BOOL: Final = Codec(_same, _bool)
DOUBLE: Final = Codec(lambda v, _std: float(v), _double)


def enum_of(names: frozenset[str]) -> Codec:
    def decode(value: Any, path: str) -> str:
        if value not in names:
            raise _bad(path, f"must be one of {', '.join(sorted(names))}")
        return str(value)
    return Codec(_same, decode)


def list_of(codec: Codec) -> Codec:
    def encode(value: Any, std: bool) -> list[Any]:
        return [codec.encode(v, std) for v in value]

    def decode(value: Any, path: str) -> tuple[Any, ...]:
        if not isinstance(value, list):
            raise _bad(path, "must be an array")
        return tuple(codec.decode(v, f"{path}[{i}]") for i, v in enumerate(value))
    return Codec(encode, decode)


def map_of(codec: Codec) -> Codec:
    def encode(value: Any, std: bool) -> dict[str, Any]:
        return {k: codec.encode(v, std) for k, v in value.items()}

    def decode(value: Any, path: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in items(value, path):
            if not isinstance(k, str):
                raise _bad(path, "must have string keys")
            out[k] = codec.decode(v, f"{path}.{k[:40]}")
        return out
    return Codec(encode, decode)


def long_map_of(codec: Codec) -> Codec:
    def encode(value: Any, std: bool) -> Any:
        if std:
            return {str(k): codec.encode(v, std) for k, v in value.items()}
        return Pairs((k, codec.encode(v, std)) for k, v in value.items())

    def decode(value: Any, path: str) -> dict[int, Any]:
        out: dict[int, Any] = {}
        for k, v in items(value, path):
            if isinstance(k, str) and k.lstrip("-").isdigit() and len(k) <= 20:
                k = int(k)
            if isinstance(k, bool) or not isinstance(k, int) or not LONG_MIN <= k <= LONG_MAX:
                raise _bad(path, "must have integer keys")
            out[k] = codec.decode(v, f"{path}.{k}")
        return out
    return Codec(encode, decode)


def bean_of(cls: type) -> Codec:
    return Codec(lambda v, std: encode_bean(v, std), lambda v, path: decode_bean(cls, v, path))


def bean_map_of(key_cls: type, codec: Codec) -> Codec:
    """A map keyed by a bean: ``{{...}:value, ...}`` (fastjson); the Python side holds ``(key, value)``
    pairs in order (``tuple``), keys being ``key_cls`` instances."""

    def encode(value: Any, std: bool) -> Pairs:
        return Pairs((encode_bean(k, std), codec.encode(v, std)) for k, v in value)

    def decode(value: Any, path: str) -> tuple[tuple[Any, Any], ...]:
        return tuple((decode_bean(key_cls, k, f"{path}<key>"), codec.decode(v, f"{path}<value>"))
                     for k, v in items(value, path))
    return Codec(encode, decode)


def encode_bean(obj: Any, std: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for attr, name, codec in _sorted_fields(type(obj)):
        value = getattr(obj, attr)
        if value is not None:
            out[name] = codec.encode(value, std)
    return out


def decode_bean(cls: type, value: Any, path: str = "body") -> Any:
    if not isinstance(value, dict):
        raise _bad(path, "must be an object")
    kwargs: dict[str, Any] = {}
    for attr, name, codec in cls.JSON:  # type: ignore[attr-defined]
        member = value.get(name)
        if member is not None:
            kwargs[attr] = codec.decode(member, f"{path}.{name}")
    try:
        return cls(**kwargs)
    except TypeError:
        missing = [name for attr, name, _ in cls.JSON if attr not in kwargs]  # type: ignore[attr-defined]
        raise _bad(path, f"lacks a required member among {', '.join(missing)}") from None


_SORTED: dict[type, tuple[tuple[str, str, Codec], ...]] = {}


def _sorted_fields(cls: type) -> tuple[tuple[str, str, Codec], ...]:
    fields = _SORTED.get(cls)
    if fields is None:
        fields = tuple(sorted(cls.JSON, key=lambda f: f[1]))  # type: ignore[attr-defined]
        _SORTED[cls] = fields
    return fields
