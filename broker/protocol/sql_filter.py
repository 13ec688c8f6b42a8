"""SQL92 message filters (RocketMQ's ``MessageSelector.bySql``): parse once, evaluate per message.

Grammar (RocketMQ's, keywords case-insensitive)::

    expr      := or
    or        := and (OR and)*
    and       := not (AND not)*
    not       := NOT not | predicate
    predicate := value op value                      op: > >= < <= = <>
               | value [NOT] BETWEEN value AND value
               | property [NOT] IN ('s1', 's2', ...)
               | value IS [NOT] NULL
               | TRUE | FALSE | ( expr )
    value     := property | number | 'string' ('' escapes a quote) | TRUE | FALSE | NULL
    property  := [a-zA-Z_$][a-zA-Z0-9_$.]*

Parsing is lark's LALR parser (no recursion: a deeply nested input cannot exhaust the stack);
the parse tree is compiled into closures on the way up, so an expression is compiled once
(``compile_filter`` caches) and evaluating it per message walks no tree.

Evaluation follows RocketMQ (``org.apache.rocketmq.filter.expression``):
- A message's properties are strings: its user properties, plus ``TAGS`` (its tag) and ``KEYS``
  (its keys, space separated) when it has them. A missing property is NULL.
- Three-valued logic: a comparison with a NULL operand is UNKNOWN; ``NOT UNKNOWN`` is UNKNOWN;
  AND/OR are Kleene's, evaluated left to right with short circuit; a message matches only when the
  whole expression is TRUE. ``IS [NOT] NULL`` is never UNKNOWN.
- ``> >= < <=`` and ``BETWEEN`` compare numbers: a property is converted (Java's
  ``Double.valueOf`` reading: optional sign, digits, fraction, exponent). A value that is not a
  number makes the evaluation fail, and a failed evaluation does not match the message (RocketMQ's
  broker catches the exception and skips the message) — even under NOT.
- ``=`` / ``<>`` against a number compare numbers (a property that is not a number is not equal);
  against TRUE/FALSE compare booleans (a property is true when it reads "true", any case, like
  Java's ``Boolean.valueOf``); otherwise strings. ``a <> b`` is ``NOT (a = b)``.
- ``IN`` lists hold strings; the left side is a property.
Refused when compiled (with the position of the error, like a syntax error): ``> >= < <=`` or
``BETWEEN`` with a string or boolean constant, ``= NULL`` (write ``IS NULL``), comparing two
constants of different kinds, ``BETWEEN`` whose low bound is above its high bound, an integer out
of the 64-bit range, and anything past the bounds below.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from lark import Lark, Token, Transformer
from lark.exceptions import LarkError, UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, VisitError

MAX_EXPRESSION_CHARS = 4096
MAX_DEPTH = 32  # nested NOT / AND / OR / parenthesised levels
MAX_IN_ITEMS = 256
MAX_PREDICATES = 256
_INT64 = 2**63

Truth = bool | None  # None: UNKNOWN
Props = Mapping[str, str]
Const = int | float | str | bool | None

_GRAMMAR = r"""
?start: or_expr
?or_expr: and_expr (_OR and_expr)*
?and_expr: not_expr (_AND not_expr)*
?not_expr: _NOT not_expr -> not_expr
         | predicate
?predicate: value COMP_OP value                          -> compare
          | value _BETWEEN value _AND value              -> between
          | value _NOT _BETWEEN value _AND value         -> not_between
          | value _IN "(" string_list ")"                -> in_list
          | value _NOT _IN "(" string_list ")"           -> not_in_list
          | value _IS NULL                               -> is_null
          | value _IS _NOT NULL                          -> is_not_null
          | BOOL                                         -> bool_predicate
          | LPAR or_expr ")"                             -> group
string_list: STRING ("," STRING)*
value: PROPERTY | NUMBER | STRING | BOOL | NULL

COMP_OP: ">=" | "<=" | "<>" | ">" | "<" | "="
LPAR: "("
_AND.2: /and\b/i
_OR.2: /or\b/i
_NOT.2: /not\b/i
_BETWEEN.2: /between\b/i
_IN.2: /in\b/i
_IS.2: /is\b/i
NULL.2: /null\b/i
BOOL.2: /(true|false)\b/i
PROPERTY: /[a-zA-Z_$][a-zA-Z0-9_$.]*/
NUMBER: /[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?/
STRING: /'(?:[^']|'')*'/
%ignore /[ \t\r\n]+/
"""

_NUMERIC = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
_INTEGER = re.compile(r"[+-]?\d+")


class SqlFilterError(ValueError):
    """An expression that is not valid; ``position`` is the 0-based character offset of the error."""

    def __init__(self, message: str, position: int):
        super().__init__(f"{message} at position {position}")
        self.position = position


class _EvalFailed(Exception):
    """A value of the wrong kind (a property that is not a number): the message does not match."""


# -- values --------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class _Operand:
    kind: str  # "property" | "number" | "string" | "bool" | "null"
    value: Const
    pos: int

    def get(self, props: Props) -> Const:
        if self.kind == "property":
            return props.get(str(self.value))
        return self.value


def _as_number(v: Const) -> int | float:
    if isinstance(v, bool):
        raise _EvalFailed(f"{v} is not a number")
    if isinstance(v, int | float):
        return v
    s = str(v).strip()
    if _INTEGER.fullmatch(s):
        return int(s)
    if _NUMERIC.fullmatch(s):
        return float(s)
    raise _EvalFailed(f"{s[:40]!r} is not a number")


def _as_bool(v: Const) -> bool:
    return v if isinstance(v, bool) else str(v).lower() == "true"


def _equal(a: Const, b: Const) -> bool:
    """``a = b`` for two non-NULL values."""
    if isinstance(a, bool) or isinstance(b, bool):
        return _as_bool(a) == _as_bool(b)
    if isinstance(a, int | float) or isinstance(b, int | float):
        try:
            return _as_number(a) == _as_number(b)
        except _EvalFailed:
            return False
    return a == b


_ORDER: dict[str, Callable[[Any, Any], bool]] = {
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
}


# -- compiled nodes ------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class _Node:
    fn: Callable[[Props], Truth]
    depth: int
    predicates: int


def _leaf(fn: Callable[[Props], Truth]) -> _Node:
    return _Node(fn, 1, 1)


def _compare_fn(op: str, left: _Operand, right: _Operand) -> Callable[[Props], Truth]:
    if op in _ORDER:
        order = _ORDER[op]

        def ordered(props: Props) -> Truth:
            a, b = left.get(props), right.get(props)
            if a is None or b is None:
                return None
            return order(_as_number(a), _as_number(b))

        return ordered
    negate = op == "<>"

    def equal(props: Props) -> Truth:
        a, b = left.get(props), right.get(props)
        if a is None or b is None:
            return None
        return _equal(a, b) != negate

    return equal


def _check_compare(op: str, left: _Operand, right: _Operand) -> None:
    for side in (left, right):
        if side.kind == "null":
            raise SqlFilterError("NULL cannot be compared (use IS NULL / IS NOT NULL)", side.pos)
        if op in _ORDER and side.kind in ("string", "bool"):
            raise SqlFilterError(f"{op} compares numbers, not {side.kind} constants", side.pos)
    consts = {left.kind, right.kind} - {"property"}
    if len(consts) == 2:
        raise SqlFilterError(f"a {left.kind} constant cannot be compared with a {right.kind} constant", right.pos)


def _kleene_and(children: Sequence[_Node]) -> Callable[[Props], Truth]:
    fns = [c.fn for c in children]

    def fn(props: Props) -> Truth:
        unknown = False
        for f in fns:
            v = f(props)
            if v is False:
                return False
            unknown |= v is None
        return None if unknown else True

    return fn


def _kleene_or(children: Sequence[_Node]) -> Callable[[Props], Truth]:
    fns = [c.fn for c in children]

    def fn(props: Props) -> Truth:
        unknown = False
        for f in fns:
            v = f(props)
            if v is True:
                return True
            unknown |= v is None
        return None if unknown else False

    return fn


def _combine(fn: Callable[[Props], Truth], children: Sequence[_Node]) -> _Node:
    node = _Node(fn, 1 + max(c.depth for c in children), sum(c.predicates for c in children))
    return node


class _Compile(Transformer[Token, _Node]):
    """Runs inside the LALR parser (bottom up): each rule becomes a closure."""

    def _bounded(self, node: _Node, pos: int) -> _Node:
        if node.depth > MAX_DEPTH:
            raise SqlFilterError(f"the expression nests deeper than {MAX_DEPTH} levels", pos)
        if node.predicates > MAX_PREDICATES:
            raise SqlFilterError(f"the expression has more than {MAX_PREDICATES} predicates", pos)
        return node

    def value(self, items: list[Token]) -> _Operand:
        (tok,) = items
        pos = tok.start_pos or 0
        if tok.type == "PROPERTY":
            return _Operand("property", str(tok), pos)
        if tok.type == "STRING":
            return _Operand("string", str(tok)[1:-1].replace("''", "'"), pos)
        if tok.type == "BOOL":
            return _Operand("bool", str(tok).lower() == "true", pos)
        if tok.type == "NULL":
            return _Operand("null", None, pos)
        text = str(tok)
        if _INTEGER.fullmatch(text):
            number = int(text)
            if not -_INT64 <= number < _INT64:
                raise SqlFilterError(f"integer {text[:40]} is out of the 64-bit range", pos)
            return _Operand("number", number, pos)
        value = float(text)
        if value in (float("inf"), float("-inf")):
            raise SqlFilterError(f"number {text[:40]} is out of range", pos)
        return _Operand("number", value, pos)

    def string_list(self, items: list[Token]) -> list[tuple[str, int]]:
        if len(items) > MAX_IN_ITEMS:
            raise SqlFilterError(f"an IN list holds at most {MAX_IN_ITEMS} strings", items[MAX_IN_ITEMS].start_pos or 0)
        return [(str(t)[1:-1].replace("''", "'"), t.start_pos or 0) for t in items]

    def compare(self, items: list[Any]) -> _Node:
        left, op, right = items
        _check_compare(str(op), left, right)
        return _leaf(_compare_fn(str(op), left, right))

    def _between(self, items: list[Any], negate: bool) -> _Node:
        value, low, high = items
        for side in (value, low, high):
            if side.kind in ("string", "bool", "null"):
                raise SqlFilterError(f"BETWEEN compares numbers, not {side.kind} constants", side.pos)
        if low.kind == high.kind == "number" and _as_number(low.value) > _as_number(high.value):
            raise SqlFilterError(f"BETWEEN {low.value} AND {high.value}: the low bound is above the high one", low.pos)
        ge, le = _compare_fn(">=", value, low), _compare_fn("<=", value, high)
        if not negate:
            return _Node(_kleene_and([_leaf(ge), _leaf(le)]), 1, 1)
        lt, gt = _compare_fn("<", value, low), _compare_fn(">", value, high)
        return _Node(_kleene_or([_leaf(lt), _leaf(gt)]), 1, 1)

    def between(self, items: list[Any]) -> _Node:
        return self._between(items, False)

    def not_between(self, items: list[Any]) -> _Node:
        return self._between(items, True)

    def _in(self, items: list[Any], negate: bool) -> _Node:
        value, strings = items
        if value.kind != "property":
            raise SqlFilterError("IN needs a property on its left", value.pos)
        members = frozenset(s for s, _ in strings)

        def fn(props: Props) -> Truth:
            v = value.get(props)
            if v is None:
                return None
            return (v in members) != negate

        return _leaf(fn)

    def in_list(self, items: list[Any]) -> _Node:
        return self._in(items, False)

    def not_in_list(self, items: list[Any]) -> _Node:
        return self._in(items, True)

    def is_null(self, items: list[Any]) -> _Node:
        value = items[0]
        return _leaf(lambda props: value.get(props) is None)

    def is_not_null(self, items: list[Any]) -> _Node:
        value = items[0]
        return _leaf(lambda props: value.get(props) is not None)

    def bool_predicate(self, items: list[Token]) -> _Node:
        truth = str(items[0]).lower() == "true"
        return _leaf(lambda props: truth)

    def group(self, items: list[Any]) -> _Node:
        lpar, inner = items
        node = _Node(inner.fn, inner.depth + 1, inner.predicates)
        return self._bounded(node, lpar.start_pos or 0)

    def not_expr(self, items: list[_Node]) -> _Node:
        (inner,) = items
        f = inner.fn

        def fn(props: Props) -> Truth:
            v = f(props)
            return None if v is None else not v

        return self._bounded(_combine(fn, [inner]), 0)

    def and_expr(self, items: list[_Node]) -> _Node:
        return self._bounded(_combine(_kleene_and(items), items), 0)

    def or_expr(self, items: list[_Node]) -> _Node:
        return self._bounded(_combine(_kleene_or(items), items), 0)


@functools.lru_cache(maxsize=1)
def _parser() -> Lark:
    """One LALR parser with the compiling transformer inline (lark runs the rule callbacks as it
    reduces); it keeps no state between parses, so threads may share it."""
    return Lark(_GRAMMAR, parser="lalr", maybe_placeholders=False, transformer=_Compile())


@dataclasses.dataclass(frozen=True)
class SqlFilter:
    """A compiled expression; ``matches`` is safe to call from any thread."""

    expression: str
    _fn: Callable[[Props], Truth] = dataclasses.field(repr=False, compare=False)

    def evaluate(self, props: Props) -> Truth:
        """TRUE, FALSE or UNKNOWN (None); raises nothing: a failed evaluation is UNKNOWN."""
        try:
            return self._fn(props)
        except _EvalFailed:
            return None

    def matches(self, props: Props) -> bool:
        return self.evaluate(props) is True


def message_properties(properties: Mapping[str, str], tags: str, keys: Sequence[str]) -> dict[str, str]:
    """What an expression sees of a message: user properties, ``TAGS`` and ``KEYS``."""
    props = dict(properties)
    if tags:
        props["TAGS"] = tags
    if keys:
        props["KEYS"] = " ".join(keys)
    return props


def _parse(text: str) -> SqlFilter:
    if not isinstance(text, str):
        raise SqlFilterError("the expression must be a string", 0)
    if len(text) > MAX_EXPRESSION_CHARS:
        raise SqlFilterError(f"the expression is longer than {MAX_EXPRESSION_CHARS} characters", MAX_EXPRESSION_CHARS)
    if not text.strip():
        raise SqlFilterError("the expression is empty", 0)
    try:
        node = _parser().parse(text)
    except SqlFilterError:
        raise
    except VisitError as exc:  # an error raised inside a rule callback
        if isinstance(exc.orig_exc, SqlFilterError):
            raise exc.orig_exc from None
        raise SqlFilterError(f"invalid expression: {exc.orig_exc}", 0) from None
    except UnexpectedCharacters as exc:
        at = exc.pos_in_stream or 0
        raise SqlFilterError(f"unexpected character {text[at : at + 1]!r}", at) from None
    except UnexpectedEOF:
        raise SqlFilterError("the expression ends too early", len(text)) from None
    except UnexpectedInput as exc:
        pos = exc.pos_in_stream if exc.pos_in_stream is not None else len(text)
        token = getattr(exc, "token", None)
        if token is not None and getattr(token, "type", "") == "$END":
            raise SqlFilterError("the expression ends too early", len(text)) from None
        shown = str(token)[:40] if token is not None else text[pos : pos + 20]
        raise SqlFilterError(f"unexpected {shown!r}", pos) from None
    except LarkError as exc:
        raise SqlFilterError(f"invalid expression: {exc}", 0) from None
    if not isinstance(node, _Node):  # a bare value: `a`, `'x'`, `5`
        raise SqlFilterError("the expression is not a condition", 0)
    return SqlFilter(text, node.fn)


@functools.lru_cache(maxsize=1024)
def _cached(text: str) -> SqlFilter | SqlFilterError:
    try:
        return _parse(text)
    except SqlFilterError as exc:
        return exc


def compile_filter(text: str) -> SqlFilter:
    """The compiled filter for ``text`` (cached: a subscription's expression is compiled once);
    raises ``SqlFilterError`` with the position of the first error."""
    if not isinstance(text, str) or len(text) > MAX_EXPRESSION_CHARS:
        return _parse(text)  # raises; not cached (unbounded keys)
    result = _cached(text)
    if isinstance(result, SqlFilterError):
        raise result
    return result
