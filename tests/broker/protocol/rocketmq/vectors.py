"""The test vectors made by the official RocketMQ 4.9.8 and 5.3.1 classes (tests/wire/vectors/rmq4.json,
rmq5.json)."""

from __future__ import annotations

import functools
import json
import os
from typing import Any

DIR = os.path.join(os.path.dirname(__file__), "..", "..", "..", "wire", "vectors")


@functools.cache
def load(name: str = "rmq4.json") -> dict[str, Any]:
    with open(os.path.join(DIR, name), encoding="ascii") as f:
        data: dict[str, Any] = json.load(f)
    return data


def load5() -> dict[str, Any]:
    return load("rmq5.json")


def pairs(items: list[list[str]]) -> dict[str, str]:
    """A Java map's entries, in Java's iteration order."""
    return {k: v for k, v in items}
