"""SQL92 filters (broker/protocol/sql_filter.py): examples of RocketMQ's semantics, errors with positions,
bounds, and a property-based check of the compiled evaluator against a reference evaluation.

The reference (``_ref``) walks a generated syntax tree directly, written from the rules in the
module docstring and independent of the parser and of the closures the compiler builds; hypothesis
renders the same tree to text (random keyword case, spacing, redundant parentheses), compiles it and
compares the two answers for random property maps."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.protocol.sql_filter import (
    MAX_DEPTH,
    MAX_EXPRESSION_CHARS,
    MAX_IN_ITEMS,
    SqlFilterError,
    compile_filter,
    message_properties,
)

MSG = {"a": "10", "region": "eu", "price": "2.5", "flag": "TRUE", "name": "abc"}


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("a > 5 AND region IN ('eu','us')", True),
        ("a > 5 and region in ('us')", False),
        ("a BETWEEN 10 AND 20", True),
        ("a NOT BETWEEN 10 AND 20", False),
        ("price >= 2.5 AND price < 3", True),
        ("a = 10", True),
        ("a = 10.0", True),
        ("a <> 10", False),
        ("region = 'eu'", True),
        ("region <> 'eu'", False),
        ("flag = TRUE", True),
        ("missing IS NULL", True),
        ("missing IS NOT NULL", False),
        ("a IS NOT NULL", True),
        ("TRUE", True),
        ("FALSE OR a > 1", True),
        ("name = 'abc' AND NOT (a < 3)", True),
        ("region NOT IN ('us', 'cn')", True),
        ("name = 'it''s'", False),
        # a missing property makes a comparison UNKNOWN, and NOT UNKNOWN is UNKNOWN: no match
        ("missing > 1", False),
        ("NOT missing > 1", False),
        ("missing = 'x'", False),
        ("missing <> 'x'", False),
        ("missing IN ('x')", False),
        ("missing NOT IN ('x')", False),
        ("missing > 1 OR a = 10", True),
        ("missing > 1 AND a = 10", False),
        ("NOT (missing > 1 AND a = 11)", True),  # UNKNOWN AND FALSE is FALSE
        # a value of the wrong kind: the evaluation fails and the message does not match, even under NOT
        ("name > 1", False),
        ("NOT name > 1", False),
        ("name BETWEEN 1 AND 2", False),
        ("name = 1", False),  # not a number: simply not equal
        ("name <> 1", True),
        ("a = 9 AND name > 1", False),  # short circuit: FALSE before the failing comparison
        ("a = 10 OR name > 1", True),  # TRUE before it
        ("TAGS = 'TagA'", True),
        ("KEYS = 'k1 k2'", True),
    ],
)
def test_examples(expr: str, expected: bool) -> None:
    props = message_properties(MSG, "TagA", ["k1", "k2"])
    assert compile_filter(expr).matches(props) is expected


@pytest.mark.parametrize(
    ("expr", "position", "fragment"),
    [
        ("a > ", 4, "ends too early"),
        ("a > 5 AN b = 1", 6, "unexpected 'AN'"),
        ("a > 'x'", 4, "compares numbers"),
        ("a = NULL", 4, "IS NULL"),
        ("a BETWEEN 3 AND 1", 10, "low bound"),
        ("'x' IN ('a')", 0, "property"),
        ("a ~ 1", 2, "unexpected character"),
        ("1 = 'a'", 4, "cannot be compared"),
        ("a", 1, "ends too early"),
        ("", 0, "empty"),
        ("a > 99999999999999999999", 4, "64-bit"),
        ("region IN ()", 11, "unexpected"),
    ],
)
def test_invalid_expressions_name_the_position(expr: str, position: int, fragment: str) -> None:
    with pytest.raises(SqlFilterError) as e:
        compile_filter(expr)
    assert e.value.position == position, str(e.value)
    assert fragment in str(e.value) and f"position {position}" in str(e.value)


def test_bounds() -> None:
    with pytest.raises(SqlFilterError, match="longer than"):
        compile_filter("a = 1 OR " * 600 + "a = 1")
    assert len("a = 1 OR " * 600) > MAX_EXPRESSION_CHARS
    with pytest.raises(SqlFilterError, match="nests deeper"):
        compile_filter("(" * (MAX_DEPTH + 1) + "a = 1" + ")" * (MAX_DEPTH + 1))
    with pytest.raises(SqlFilterError, match="nests deeper"):
        compile_filter("NOT " * (MAX_DEPTH + 1) + "a = 1")
    # 2,000 nested parentheses fit in the length bound: refused, not a RecursionError
    with pytest.raises(SqlFilterError):
        compile_filter("(" * 2000 + "a=1" + ")" * 2000)
    items = ",".join(f"'{i}'" for i in range(MAX_IN_ITEMS + 1))
    with pytest.raises(SqlFilterError, match="IN list"):
        compile_filter(f"a IN ({items})")
    compile_filter("a IN (" + ",".join(f"'{i}'" for i in range(MAX_IN_ITEMS)) + ")")
    assert compile_filter("(" * (MAX_DEPTH - 1) + "a = 1" + ")" * (MAX_DEPTH - 1)).matches({"a": "1"})


def test_compiled_once_per_expression() -> None:
    expr = "a > 5 AND region IN ('eu','us') AND zz IS NULL"
    assert compile_filter(expr) is compile_filter(expr)
    with pytest.raises(SqlFilterError) as first:
        compile_filter("a >>> 1")
    with pytest.raises(SqlFilterError) as again:
        compile_filter("a >>> 1")
    assert first.value is again.value


# -- property-based: the compiled evaluator against a reference evaluation --------------------------
NAMES = ("a", "b", "price", "region")
NUMBER_TEXTS = ("0", "5", "-3", "10", "2.5", "1e2", " 7 ", "+4")
OTHER_TEXTS = ("eu", "us", "abc", "true", "FALSE", "", "5x")


@dataclasses.dataclass(frozen=True)
class Cmp:
    op: str
    left: Any  # ("p", name) | ("n", number) | ("s", str) | ("b", bool)
    right: Any


@dataclasses.dataclass(frozen=True)
class Between:
    value: Any
    low: float
    high: float
    negate: bool


@dataclasses.dataclass(frozen=True)
class In:
    name: str
    items: tuple[str, ...]
    negate: bool


@dataclasses.dataclass(frozen=True)
class IsNull:
    name: str
    negate: bool


@dataclasses.dataclass(frozen=True)
class Not:
    inner: Any


@dataclasses.dataclass(frozen=True)
class Logic:
    op: str  # AND | OR
    parts: tuple[Any, ...]


@dataclasses.dataclass(frozen=True)
class Const:
    value: bool


class Failed(Exception):
    pass


def _num(v: Any) -> float:
    if isinstance(v, bool):
        raise Failed
    if isinstance(v, int | float):
        return float(v)
    if re.fullmatch(r"\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s*", v):
        return float(v)
    raise Failed


def _val(operand: Any, props: dict[str, str]) -> Any:
    kind, v = operand
    return props.get(v) if kind == "p" else v


def _ref(node: Any, props: dict[str, str]) -> bool | None:
    if isinstance(node, Const):
        return node.value
    if isinstance(node, IsNull):
        return (props.get(node.name) is None) != node.negate
    if isinstance(node, In):
        v = props.get(node.name)
        return None if v is None else (v in node.items) != node.negate
    if isinstance(node, Between):
        v = _val(node.value, props)
        if v is None:
            return None
        x = _num(v)
        inside = node.low <= x <= node.high
        return inside != node.negate
    if isinstance(node, Cmp):
        lv, rv = _val(node.left, props), _val(node.right, props)
        if lv is None or rv is None:
            return None
        if node.op in ("=", "<>"):
            if isinstance(lv, bool) or isinstance(rv, bool):
                eq = (lv if isinstance(lv, bool) else lv.lower() == "true") == (
                    rv if isinstance(rv, bool) else rv.lower() == "true"
                )
            elif isinstance(lv, int | float) or isinstance(rv, int | float):
                try:
                    eq = _num(lv) == _num(rv)
                except Failed:
                    eq = False
            else:
                eq = lv == rv
            return eq if node.op == "=" else not eq
        a, b = _num(lv), _num(rv)
        return {">": a > b, ">=": a >= b, "<": a < b, "<=": a <= b}[node.op]
    if isinstance(node, Not):
        inner = _ref(node.inner, props)
        return None if inner is None else not inner
    assert isinstance(node, Logic)
    unknown = False
    for part in node.parts:  # left to right, stopping at the deciding value
        truth = _ref(part, props)
        if truth is (node.op == "OR"):
            return truth
        unknown |= truth is None
    return None if unknown else node.op == "AND"


def _reference_matches(node: Any, props: dict[str, str]) -> bool:
    try:
        return _ref(node, props) is True
    except Failed:
        return False


def _kw(draw: Any, word: str) -> str:
    return draw(st.sampled_from([word, word.lower(), word.capitalize()]))


def _lit(draw: Any, operand: Any) -> str:
    kind, v = operand
    if kind == "p":
        return str(v)
    if kind == "s":
        return "'" + str(v).replace("'", "''") + "'"
    if kind == "b":
        return _kw(draw, "TRUE" if v else "FALSE")
    return repr(v) if isinstance(v, float) else str(v)


numbers = st.one_of(st.integers(-20, 20), st.sampled_from([2.5, -0.5, 100.0, 7.0]))
props_st = st.dictionaries(st.sampled_from(NAMES), st.sampled_from(NUMBER_TEXTS + OTHER_TEXTS), max_size=4)


@st.composite
def leaves(draw: Any) -> Any:
    prop = ("p", draw(st.sampled_from(NAMES)))
    kind = draw(st.sampled_from(["order", "eq", "between", "in", "null", "const"]))
    if kind == "order":
        other = draw(st.one_of(st.just(("p", draw(st.sampled_from(NAMES)))), numbers.map(lambda n: ("n", n))))
        left, right = (prop, other) if draw(st.booleans()) else (other, prop)
        return Cmp(draw(st.sampled_from([">", ">=", "<", "<="])), left, right)
    if kind == "eq":
        other = draw(
            st.one_of(
                numbers.map(lambda n: ("n", n)),
                st.sampled_from((*OTHER_TEXTS, "it's")).map(lambda s: ("s", s)),
                st.booleans().map(lambda b: ("b", b)),
                st.sampled_from(NAMES).map(lambda n: ("p", n)),
            )
        )
        left, right = (prop, other) if draw(st.booleans()) else (other, prop)
        return Cmp(draw(st.sampled_from(["=", "<>"])), left, right)
    if kind == "between":
        lo = draw(st.integers(-10, 10))
        return Between(prop, float(lo), float(lo + draw(st.integers(0, 10))), draw(st.booleans()))
    if kind == "in":
        items = tuple(draw(st.lists(st.sampled_from(OTHER_TEXTS + NUMBER_TEXTS), min_size=1, max_size=4)))
        return In(str(prop[1]), items, draw(st.booleans()))
    if kind == "null":
        return IsNull(str(prop[1]), draw(st.booleans()))
    return Const(draw(st.booleans()))


trees = st.recursive(
    leaves(),
    lambda children: st.one_of(
        children.map(Not),
        st.tuples(st.sampled_from(["AND", "OR"]), st.lists(children, min_size=2, max_size=3)).map(
            lambda t: Logic(t[0], tuple(t[1]))
        ),
    ),
    max_leaves=8,
)


@st.composite
def rendered(draw: Any, node: Any) -> str:
    sp = draw(st.sampled_from([" ", "  ", "\t"]))
    if isinstance(node, Const):
        text = _kw(draw, "TRUE" if node.value else "FALSE")
    elif isinstance(node, IsNull):
        text = f"{node.name} {_kw(draw, 'IS')}{sp}{_kw(draw, 'NOT') + ' ' if node.negate else ''}{_kw(draw, 'NULL')}"
    elif isinstance(node, In):
        items = ",".join("'" + i.replace("'", "''") + "'" for i in node.items)
        text = f"{node.name} {_kw(draw, 'NOT') + ' ' if node.negate else ''}{_kw(draw, 'IN')} ({items})"
    elif isinstance(node, Between):
        not_ = _kw(draw, "NOT") + " " if node.negate else ""
        text = (
            f"{_lit(draw, node.value)} {not_}{_kw(draw, 'BETWEEN')} {node.low!r} {_kw(draw, 'AND')} {node.high!r}"
        )
    elif isinstance(node, Cmp):
        text = f"{_lit(draw, node.left)}{sp}{node.op}{sp}{_lit(draw, node.right)}"
    elif isinstance(node, Not):
        text = f"{_kw(draw, 'NOT')} ({draw(rendered(node.inner))})"
    else:
        text = f"{sp}{_kw(draw, node.op)}{sp}".join(f"({draw(rendered(p))})" for p in node.parts)
    return f"({text})" if draw(st.integers(0, 5)) == 0 else text


def _valid(node: Any) -> bool:
    """Trees the compiler must refuse (two constants of different kinds compared) are left out."""
    if isinstance(node, Cmp):
        kinds = {node.left[0], node.right[0]} - {"p"}
        return len(kinds) < 2
    if isinstance(node, Not):
        return _valid(node.inner)
    if isinstance(node, Logic):
        return all(_valid(p) for p in node.parts)
    return True


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), node=trees.filter(_valid), props=st.lists(props_st, min_size=1, max_size=5))
def test_compiled_filter_agrees_with_the_reference(data: Any, node: Any, props: list[dict[str, str]]) -> None:
    text = data.draw(rendered(node))
    flt = compile_filter(text)
    for p in props:
        assert flt.matches(p) is _reference_matches(node, p), (text, p)


@settings(max_examples=300, deadline=None)
@given(text=st.text(alphabet="ab1 ()'=<>!.,-ANDORNTISUL", max_size=40))
def test_any_text_compiles_or_is_refused_with_a_position(text: str) -> None:
    try:
        flt = compile_filter(text)
    except SqlFilterError as exc:
        assert 0 <= exc.position <= len(text)
        return
    flt.matches({"a": "1", "b": "x"})
