"""The package boundaries hold (issues 11 and 24): imports follow the arrows between units, no import
cycle, no private name used across packages, and the replicated-log library imports nothing above
it. Read from the source with ``ast``, so a new violation fails here with its file and line.

Units: each top-level package, with the broker's packages (``broker.protocol``, ``broker.serving``,
``broker.store``, ``broker.service``, ``broker.edge``, ``broker.server``, ``broker.client`` (the SDK),
``broker.tools``), ``dledger.apps`` (processes, benchmarks) and ``dledger.sim`` counted apart from
their parents.

Arrows (``ARROWS``): which unit may import which — every import counts, at module level, inside a
function or under ``TYPE_CHECKING``; the allowed arrows themselves form no cycle, and no module
imports itself back through others (``KNOWN_CYCLES`` names the one left, with its reason).

Private names: a *private name* is ``_x`` (not ``__dunder__``). Three checks:

1. ``from X import _x`` / ``import X._x`` where X is in another unit;
2. ``module._x`` where ``module`` was imported from another unit;
3. ``obj._x`` (``obj`` not ``self`` / ``cls``) where no module of this unit defines ``_x`` but a
   module of another unit does: a reach into another package's object.

``ALLOWED`` lists the justified exceptions, each with its reason."""

from __future__ import annotations

import ast
import collections
import functools
import os
import sys
from collections.abc import Iterator

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("dledger", "broker", "namesrv", "chaos", "spark_jobs")
SUBUNITS = {
    "broker": ("protocol", "serving", "store", "service", "edge", "server", "client", "tools"),
    "dledger": ("apps", "sim"),
}

# (file, private name): why it is allowed
ALLOWED: dict[tuple[str, str], str] = {}
# files that reach into internals on purpose: planted defects (docs/CHAOS.md) break them to show
# that the audit and the simulator catch the damage
ALLOWED_FILES: dict[str, str] = {
    "chaos/plants.py": "planted defects patch pysyncobj, the node and the store on purpose",
    "dledger/sim/plants.py": "planted defects patch the replica core on purpose",
}
# broker.protocol.rocketmq (RocketMQ's remoting wire) is a pure codec every side shares: the standard
# library and the rest of the wire contract only (no msgpack, no server module).
ROCKETMQ_WIRE_MAY_IMPORT = ("broker.protocol",)
# dledger.apps are processes, the top layer: they may use the serving kit's HTTP edge (one error
# middleware, bounded parameters, the one coded error) and its process start-up. The dledger
# library itself imports nothing above it.
# dledger-cluster also drives a broker cluster's signed admin endpoint (``replace``: the membership
# change on a broker group) as every client does: through the SDK's transport, never its own signer
DLEDGER_APPS_MAY_IMPORT = (
    "broker.serving.http_edge", "broker.serving.process_main", "broker.protocol.errors", "broker.client.transport",
)


def _unit(module: str) -> str:
    parts = module.split(".")
    if parts[0] in SUBUNITS and len(parts) > 1 and parts[1] in SUBUNITS[parts[0]]:
        return ".".join(parts[:2])
    return parts[0]


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _sources() -> Iterator[tuple[str, str, ast.Module]]:
    yield from _parsed()


@functools.cache
def _parsed() -> tuple[tuple[str, str, ast.Module], ...]:
    """Every source file, parsed once for all the checks (they only read the trees)."""
    out = []
    for top in PACKAGES:
        for dirpath, _dirs, files in os.walk(os.path.join(ROOT, top)):
            for name in sorted(files):
                if name.endswith(".py"):
                    path = os.path.join(dirpath, name)
                    rel = os.path.relpath(path, ROOT)
                    module = rel[:-3].replace(os.sep, ".").removesuffix(".__init__")
                    with open(path, encoding="utf-8") as f:
                        out.append((rel, module, ast.parse(f.read(), rel)))
    return tuple(out)


def _defined_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.alias):
            names.add(node.asname or node.name.split(".")[0])
    return names


def _project(module: str) -> bool:
    return module.split(".")[0] in PACKAGES


def violations(sources: list[tuple[str, str, ast.Module]]) -> list[str]:
    defined: dict[str, set[str]] = collections.defaultdict(set)
    for _rel, module, tree in sources:
        defined[_unit(module)] |= _defined_names(tree)
    found: list[str] = []
    for rel, module, tree in sources:
        if rel.replace(os.sep, "/") in ALLOWED_FILES:
            continue
        unit = _unit(module)
        foreign_modules: set[str] = set()  # local names bound to modules of other units
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and _project(node.module):
                for alias in node.names:
                    if _unit(node.module) != unit and _private(alias.name):
                        found.append(f"{rel}:{node.lineno}: from {node.module} import {alias.name}")
                    elif _unit(f"{node.module}.{alias.name}") != unit:
                        foreign_modules.add(alias.asname or alias.name)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if _project(alias.name) and _unit(alias.name) != unit:
                        if any(_private(p) for p in alias.name.split(".")):
                            found.append(f"{rel}:{node.lineno}: import {alias.name}")
                        foreign_modules.add(alias.asname or alias.name.split(".")[0])
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and _private(node.attr)):
                continue
            if (rel.replace(os.sep, "/"), node.attr) in ALLOWED:
                continue
            base = node.value
            if isinstance(base, ast.Name) and base.id in ("self", "cls"):
                continue
            if isinstance(base, ast.Name) and base.id in foreign_modules:
                found.append(f"{rel}:{node.lineno}: {base.id}.{node.attr} (a private name of another package)")
            elif node.attr not in defined[unit] and any(
                node.attr in names for other, names in defined.items() if other != unit
            ):
                where = f"{rel}:{node.lineno}: {ast.unparse(base)[:40]}.{node.attr}"
                found.append(f"{where} (defined only in another package)")
    return found


def test_no_private_name_is_used_across_packages() -> None:
    found = violations(list(_sources()))
    assert not found, "private names used across packages (give them public, documented names):\n" + "\n".join(found)


def test_the_dledger_library_imports_nothing_above_it() -> None:
    found: list[str] = []
    for rel, module, tree in _sources():
        if not module.startswith("dledger"):
            continue
        allowed = DLEDGER_APPS_MAY_IMPORT if _unit(module) == "dledger.apps" else ()
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                targets = [node.module]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            for target in targets:
                if _project(target) and not target.startswith("dledger") and target not in allowed:
                    found.append(f"{rel}:{node.lineno}: imports {target}")
    assert not found, "dledger/ imports a package above it:\n" + "\n".join(found)


def _imports(tree: ast.Module) -> Iterator[tuple[int, str]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                yield node.lineno, "." * node.level + (node.module or "")
            elif node.module:
                yield node.lineno, node.module
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name


def rocketmq_wire_violations(sources: list[tuple[str, str, ast.Module]]) -> list[str]:
    found: list[str] = []
    for rel, module, tree in sources:
        if not module.startswith("broker.protocol.rocketmq"):
            continue
        for lineno, target in _imports(tree):
            top = target.split(".")[0]
            if target == "__future__" or (top in sys.stdlib_module_names and top != "msgpack"):
                continue
            if any(target == ok or target.startswith(ok + ".") for ok in ROCKETMQ_WIRE_MAY_IMPORT):
                continue
            found.append(f"{rel}:{lineno}: imports {target}")
    return found


def test_the_rocketmq_wire_imports_only_the_standard_library_and_the_wire_contract() -> None:
    found = rocketmq_wire_violations(list(_sources()))
    assert not found, "broker/protocol/rocketmq imports outside the standard library and broker.protocol:\n" + \
        "\n".join(found)
    planted = ("broker/protocol/rocketmq/x.py", "broker.protocol.rocketmq.x",
               ast.parse("import msgpack\nfrom broker.service.broker_service import X\nimport struct\n"
                         "from . import y\n"))
    assert [line.split(":")[1] for line in rocketmq_wire_violations([planted])] == ["1", "2", "4"]


def test_the_checker_finds_a_reach_into_another_package() -> None:
    """The check can fail: a planted violation of each kind is reported, its own names are not."""
    client = ("broker/client/admin.py", "broker.client.admin", ast.parse(
        "def _x(): ...\nclass Admin:\n    def _only_here(self): ...\n    def public(self): self._only_here()\n"
    ))
    tool = ("broker/tools/t.py", "broker.tools.t", ast.parse(
        "from broker.client.admin import _x\nimport broker.client.admin as a\na._x()\nadmin._only_here()\n"
        "def _mine(): ...\nother._mine()\n"
    ))
    found = violations([client, tool])
    assert [line.split(":")[1] for line in found] == ["1", "3", "4"], found


# -- the arrows between units (issue 24) --------------------------------------------------------------
# The broker's server side is layered, each unit importing only those below it:
#     protocol < serving < store < service < edge < server
# (the wire contract; the process and edge kit the NameServer and dledger-node share; the state
# machine; what every edge calls; HTTP, the binary port, the export; the process's wiring). The SDK
# sees the wire contract only; the NameServer and dledger.apps use the serving kit, never a server
# module of the broker; chaos is the top and may use anything.
_BROKER_SERVER_SIDE = ("broker.protocol", "broker.serving", "broker.store", "broker.service", "broker.edge")
ARROWS: dict[str, frozenset[str]] = {
    "broker": frozenset(),
    "broker.protocol": frozenset(),
    "dledger": frozenset(),
    "dledger.sim": frozenset({"dledger"}),
    "broker.serving": frozenset({"broker.protocol"}),
    "broker.store": frozenset({*_BROKER_SERVER_SIDE[:2], "dledger"}),
    "broker.service": frozenset({*_BROKER_SERVER_SIDE[:3], "dledger"}),
    "broker.edge": frozenset({*_BROKER_SERVER_SIDE[:4], "dledger"}),
    # + the SDK's transport: registration talks to the NameServers as a client does
    "broker.server": frozenset({*_BROKER_SERVER_SIDE, "broker.client", "dledger"}),
    "broker.client": frozenset({"broker.protocol"}),
    # + dledger.apps: the benchmarks' histogram and the local cluster (mq-bench, failover bench)
    "broker.tools": frozenset({"broker.protocol", "broker.serving", "broker.client", "dledger", "dledger.apps"}),
    "namesrv": frozenset({"broker.protocol", "broker.serving", "dledger"}),
    # + broker.protocol: the one coded error, which dledger-node answers like every HTTP server
    # + broker.client: dledger-cluster replace signs a broker group's membership change as a client does
    "dledger.apps": frozenset({"dledger", "broker.serving", "broker.protocol", "broker.client"}),
    # + broker.store: the record and consume-queue codecs the replica reader decodes with (constants
    # and pure functions); broker.edge: the export's paths and page size (spark_jobs/remote.py)
    "spark_jobs": frozenset(
        {"broker.protocol", "broker.client", "broker.store", "broker.edge", "dledger", "dledger.apps"}
    ),
    "chaos": frozenset({
        "broker", *_BROKER_SERVER_SIDE, "broker.server", "broker.client", "broker.tools", "namesrv",
        "dledger", "dledger.apps", "dledger.sim", "spark_jobs",
    }),
}  # fmt: skip
# import cycles between modules that are known, each with its reason (a new one fails)
KNOWN_CYCLES: dict[frozenset[str], str] = {
    frozenset({"chaos.damage", "chaos.faults", "chaos.poison"}): (
        "the fault table in chaos.faults lists the damage and poison faults, which take its context "
        "type and helpers: a follow-up (chaos/ is being changed by another branch)"
    ),
}


def _modules(sources: list[tuple[str, str, ast.Module]]) -> set[str]:
    return {module for _rel, module, _tree in sources}


def _imported(module: str, rel: str, tree: ast.Module, known: set[str]) -> Iterator[tuple[int, str]]:
    """(line, project module) for every import of ``tree``: ``from a import b`` is ``a.b`` when that
    is a module, else ``a``; relative imports are resolved."""
    package = module if rel.endswith("__init__.py") else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - (node.level - 1)] if node.level > 1 else parts
                base = ".".join(parts + ([base] if base else []))
            for alias in node.names:
                target = f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                if _project(target):
                    yield node.lineno, target
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if _project(alias.name):
                    yield node.lineno, alias.name


def arrow_violations(sources: list[tuple[str, str, ast.Module]]) -> list[str]:
    known = _modules(sources)
    found = []
    for rel, module, tree in sources:
        unit = _unit(module)
        for lineno, target in _imported(module, rel, tree, known):
            other = _unit(target)
            line = f"{rel}:{lineno}: {unit} imports {target} ({other})"
            if other != unit and other not in ARROWS[unit] and line not in found:
                found.append(line)
    return found


def module_cycles(sources: list[tuple[str, str, ast.Module]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    known = _modules(sources)
    graph: dict[str, set[str]] = {m: set() for m in known}
    for rel, module, tree in sources:
        for _lineno, target in _imported(module, rel, tree, known):
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != module:
                graph[module].add(target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    return cycles


def test_imports_follow_the_arrows_between_units() -> None:
    found = arrow_violations(list(_sources()))
    assert not found, "imports against the arrows (tests/test_layering.py ARROWS):\n" + "\n".join(found)


def test_the_arrows_form_no_cycle() -> None:
    assert set(ARROWS) >= {_unit(m) for _r, m, _t in _sources()}, "a unit without its arrows"
    done: set[str] = set()
    while len(done) < len(ARROWS):
        free = [u for u in ARROWS if u not in done and ARROWS[u] <= done]
        assert free, f"the arrows form a cycle among {sorted(set(ARROWS) - done)}"
        done.update(free)


def test_no_import_cycle_between_modules() -> None:
    cycles = [c for c in module_cycles(list(_sources())) if frozenset(c) not in KNOWN_CYCLES]
    assert not cycles, "modules that import each other (type-checking imports count):\n" + "\n".join(
        " <-> ".join(c) for c in cycles
    )


def test_the_nameserver_imports_no_server_module_of_the_broker() -> None:
    sources = list(_sources())
    found = [
        f"{rel}:{lineno}: {target}"
        for rel, module, tree in sources
        if _unit(module) == "namesrv"
        for lineno, target in _imported(module, rel, tree, _modules(sources))
        if target.split(".")[0] == "broker" and _unit(target) not in ("broker.protocol", "broker.serving")
    ]
    assert not found, "namesrv imports the broker beyond broker.protocol and broker.serving:\n" + "\n".join(found)


def test_the_arrow_checks_can_fail() -> None:
    """A planted upward import (under TYPE_CHECKING, in a function) and a planted cycle are found."""
    store = ("broker/store/x.py", "broker.store.x", ast.parse(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from broker.server.broker_server import S\n"
        "def f():\n    from broker.edge import http_api\nfrom broker.store import y\n"
    ))
    store_y = ("broker/store/y.py", "broker.store.y", ast.parse("import broker.store.x\n"))
    namesrv = ("namesrv/x.py", "namesrv.x", ast.parse("from broker.serving import acl\nimport broker.service.base\n"))
    found = arrow_violations([store, store_y, namesrv])
    assert [line.split(": ")[0] for line in found] == ["broker/store/x.py:3", "broker/store/x.py:5", "namesrv/x.py:2"]
    assert module_cycles([store, store_y, namesrv]) == [["broker.store.x", "broker.store.y"]]
