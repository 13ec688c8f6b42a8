"""The machinery of typed headers: a header class lists ``FIELDS`` (``Field``: Python attribute,
wire name, kind, required, range); ``parse`` reads a command's ``extFields`` into it with Java's
parsing rules and range checks, ``to_ext`` writes it back (docs in ``headers``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Final, Literal, TypeVar

from broker.protocol.rocketmq.errors import RemotingError

Kind = Literal["str", "int", "long", "bool"]
INT_MIN: Final = -(2**31)
INT_MAX: Final = 2**31 - 1
LONG_MIN: Final = -(2**63)
LONG_MAX: Final = 2**63 - 1
RANGES: Final = {"int": (INT_MIN, INT_MAX), "long": (LONG_MIN, LONG_MAX)}


@dataclasses.dataclass(frozen=True, slots=True)
class Field:
    attr: str
    wire: str
    kind: Kind = "str"
    required: bool = False
    min: int | None = None
    max: int | None = None


def spec(attr: str, wire: str, kind: Kind = "str", required: bool = False, lo: int | None = None,
       hi: int | None = None) -> Field:
    return Field(attr, wire, kind, required, lo, hi)


def parse_value(field: Field, raw: str) -> Any:
    """One ext field's string as its typed value, or ``BAD_FIELD`` naming it."""
    kind = field.kind
    if kind == "str":
        return raw
    if kind == "bool":
        return raw.lower() == "true"
    # Java's parseInt/parseLong: an optional sign, then digits only (int() alone would also take
    # spaces, underscores and non-ASCII digits)
    if len(raw) > 20 or not raw.isascii() or not raw.lstrip("+-").isdigit() or raw[1:2] in ("+", "-"):
        raise RemotingError("BAD_FIELD", f"{field.wire} must be an integer, got {raw[:40]!r}")
    value = int(raw)
    lo, hi = RANGES[kind]
    if field.min is not None:
        lo = max(lo, field.min)
    if field.max is not None:
        hi = min(hi, field.max)
    if not lo <= value <= hi:
        raise RemotingError("BAD_FIELD", f"{field.wire} = {value} is outside {lo}..{hi}")
    return value


def format_value(value: Any) -> str:
    if value is True:
        return "true"
    if value is False:
        return "false"
    return str(value)


H = TypeVar("H")


def parse(cls: type[H], ext: Mapping[str, str] | None) -> H:
    """The header ``cls`` from a command's ext fields."""
    fields: tuple[Field, ...] = cls.FIELDS  # type: ignore[attr-defined]
    ext = ext or {}
    kwargs: dict[str, Any] = {}
    for field in fields:
        raw = ext.get(field.wire)
        if raw is None:
            if field.required:
                raise RemotingError("MISSING_FIELD", f"the header field {field.wire} is missing")
            continue
        kwargs[field.attr] = parse_value(field, raw)
    return cls(**kwargs)


def to_ext(header: Any) -> dict[str, str]:
    """A header's ext fields (strings), absent (None) fields left out."""
    out: dict[str, str] = {}
    for field in header.FIELDS:
        value = getattr(header, field.attr)
        if value is not None:
            out[field.wire] = format_value(value)
    return out


NAT: Final = 0  # lower bound of counts, ids and offsets that cannot be negative
