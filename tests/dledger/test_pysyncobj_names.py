"""The pysyncobj names dledger touches (issue 26): docs/DLEDGER.md's table lists exactly the private
names the code uses, each exists in the pinned pysyncobj, and each row names a test that exists.
Read from the sources and the doc: a name added to the code without a row (or a row left behind
after the code stopped using it) fails here."""

from __future__ import annotations

import importlib
import os
import re
from typing import Any

import pytest
from pysyncobj import SyncObj, SyncObjConf
from pysyncobj.transport import Transport

from tests.dledger.harness import free_ports

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MANGLED = re.compile(r"\b_SyncObj__[A-Za-z]+\b")
# Names that are not SyncObj's mangled privates, and the pattern that finds their use in our code.
OTHERS = {
    "_onTick": re.compile(r"def _onTick\b"),
    "_poller": re.compile(r"(?<!self)\._poller\b"),
    "_doDestroy": re.compile(r"\._doDestroy\("),
    "_onMessageReceived": re.compile(r"self\._onMessageReceived\("),
    "_onNodeConnected": re.compile(r"self\._onNodeConnected\("),
    "_onNodeDisconnected": re.compile(r"self\._onNodeDisconnected\("),
    "createJournal": re.compile(r"\.createJournal\b"),
    "monotonicTime": re.compile(r"\.monotonicTime = "),
}
ROW = re.compile(r"^\| `(?P<name>[A-Za-z_]+)` \| (?P<use>[^|]+) \| (?P<why>[^|]+) \| (?P<guard>[^|]+) \|$")


def _code() -> dict[str, str]:
    out = {}
    for dirpath, _dirs, files in os.walk(os.path.join(ROOT, "dledger")):
        for name in files:
            if name.endswith(".py") and not (dirpath.endswith("sim") and name == "plants.py"):
                path = os.path.join(dirpath, name)
                with open(path, encoding="utf-8") as f:
                    out[os.path.relpath(path, ROOT)] = f.read()
    return out


def _used() -> set[str]:
    used: set[str] = set()
    for text in _code().values():
        used |= set(MANGLED.findall(text))
        used |= {name for name, pattern in OTHERS.items() if pattern.search(text)}
    return used


def _table() -> dict[str, dict[str, str]]:
    with open(os.path.join(ROOT, "docs", "DLEDGER.md"), encoding="utf-8") as f:
        text = f.read()
    section = text.split("## pysyncobj names we touch", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        m = ROW.match(line)
        if m:
            rows[m["name"]] = m.groupdict()
    return rows


def test_the_table_lists_exactly_the_private_names_the_code_touches() -> None:
    used, listed = _used(), set(_table())
    assert used - listed == set(), f"used but not in docs/DLEDGER.md's table: {sorted(used - listed)}"
    assert listed - used == set(), f"in the table but no longer used: {sorted(listed - used)}"


@pytest.fixture
def stock_syncobj() -> Any:
    (port,) = free_ports(1)
    sync = SyncObj(f"127.0.0.1:{port}", [], SyncObjConf(autoTick=False))
    yield sync
    sync.destroy()


def test_every_listed_name_exists_in_the_pinned_pysyncobj(stock_syncobj: SyncObj) -> None:
    for name in _table():
        if name.startswith("_SyncObj__") or name in ("_onTick", "_poller", "_doDestroy"):
            assert hasattr(stock_syncobj, name), f"pysyncobj's SyncObj has no {name}"
        elif name in ("_onMessageReceived", "_onNodeConnected", "_onNodeDisconnected"):
            assert callable(getattr(Transport, name, None)), f"pysyncobj's Transport has no {name}"
        elif name == "createJournal":
            assert callable(importlib.import_module("pysyncobj.syncobj").createJournal)
        elif name == "monotonicTime":
            for module in ("pysyncobj.syncobj", "pysyncobj.tcp_connection", "pysyncobj.transport",
                           "pysyncobj.dns_resolver"):  # fmt: skip
                assert hasattr(importlib.import_module(module), name), module
        else:
            raise AssertionError(f"no existence check for {name}")


def test_every_row_names_a_test_that_exists() -> None:
    for name, row in _table().items():
        guard = row["guard"].strip()
        m = re.match(r"`(?P<file>tests/[\w/]+\.py)::(?P<test>\w+)`", guard)
        assert m, f"{name}: the guard {guard!r} is not `tests/...py::test_name`"
        with open(os.path.join(ROOT, m["file"]), encoding="utf-8") as f:
            assert re.search(rf"def {m['test']}\(", f.read()), f"{name}: {m['file']} has no {m['test']}"
