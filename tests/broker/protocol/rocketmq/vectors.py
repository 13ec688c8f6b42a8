"""The test vectors made by the official RocketMQ 4.9.8 classes (tests/wire/vectors/rmq4.json)."""

from __future__ import annotations

import functools
import json
import os
from typing import Any

PATH = os.path.join(os.path.dirname(__file__), "..", "..", "..", "wire", "vectors", "rmq4.json")


@functools.cache
def load() -> dict[str, Any]:
    with open(PATH, encoding="ascii") as f:
        data: dict[str, Any] = json.load(f)
    return data


def pairs(items: list[list[str]]) -> dict[str, str]:
    """A Java map's entries, in Java's iteration order."""
    return {k: v for k, v in items}
