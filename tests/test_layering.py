"""The package boundaries hold (issue 11): no private name is used across packages, and the
replicated-log library imports nothing above it. Read from the source with ``ast``, so a new
violation fails here with its file and line.

Units: each top-level package, with ``broker.client`` (the SDK), ``broker.tools``,
``broker.protocol``, ``dledger.apps`` (processes, benchmarks) and ``dledger.sim`` counted apart from
their parents. A *private name* is ``_x`` (not ``__dunder__``). Three checks:

1. ``from X import _x`` / ``import X._x`` where X is in another unit;
2. ``module._x`` where ``module`` was imported from another unit;
3. ``obj._x`` (``obj`` not ``self`` / ``cls``) where no module of this unit defines ``_x`` but a
   module of another unit does: a reach into another package's object.

``ALLOWED`` lists the justified exceptions, each with its reason."""

from __future__ import annotations

import ast
import collections
import os
from collections.abc import Iterator

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("dledger", "broker", "namesrv", "chaos", "spark_jobs")
SUBUNITS = {"broker": ("client", "tools", "protocol"), "dledger": ("apps", "sim")}

# (file, private name): why it is allowed
ALLOWED: dict[tuple[str, str], str] = {
    ("dledger/node.py", "_poller"): "pysyncobj's poller (pinned 0.3.17, patched in syncobj_patch.py)",
    ("dledger/peer_tcp.py", "_poller"): "pysyncobj's poller: our transport registers its sockets there",
}
# files that reach into internals on purpose: planted defects (docs/CHAOS.md) break them to show
# that the audit and the simulator catch the damage
ALLOWED_FILES: dict[str, str] = {
    "chaos/plants.py": "planted defects patch pysyncobj, the node and the store on purpose",
    "dledger/sim/plants.py": "planted defects patch the replica core on purpose",
}
# dledger.apps are processes, the top layer: they may use the broker's HTTP edge (one error
# middleware, bounded parameters). The dledger library itself imports nothing above it.
DLEDGER_APPS_MAY_IMPORT = ("broker.serving.http_edge", "broker.serving.process_main")


def _unit(module: str) -> str:
    parts = module.split(".")
    if parts[0] in SUBUNITS and len(parts) > 1 and parts[1] in SUBUNITS[parts[0]]:
        return ".".join(parts[:2])
    return parts[0]


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _sources() -> Iterator[tuple[str, str, ast.Module]]:
    for top in PACKAGES:
        for dirpath, _dirs, files in os.walk(os.path.join(ROOT, top)):
            for name in sorted(files):
                if name.endswith(".py"):
                    path = os.path.join(dirpath, name)
                    rel = os.path.relpath(path, ROOT)
                    module = rel[:-3].replace(os.sep, ".").removesuffix(".__init__")
                    with open(path, encoding="utf-8") as f:
                        yield rel, module, ast.parse(f.read(), rel)


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
