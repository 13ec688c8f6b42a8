"""One coded error, and the codes the docs list are the codes the broker raises (issue 24, item 3).

Read from the source with ``ast``: every ``ProtocolError(code, message, status)`` (and its two
status-first subclasses, ``AuthError`` and ``EdgeError``) raised in the broker's server side, the
status/code tables the edges and the service map other failures with, and the codes passed to the
validators; against the table of docs/API.md ("Error codes"). A call whose code or status is not
a literal must be listed in ``COMPUTED`` with where its codes come from."""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Iterator

from broker.client import ClientError
from broker.protocol.auth import AuthError
from broker.protocol.errors import ProtocolError
from broker.serving.http_edge import EdgeError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SERVER_SIDE = (
    "broker/serving", "broker/store", "broker/service", "broker/edge", "broker/server", "broker/protocol/auth.py",
)
# RocketMQ's remoting: its answers are response codes with the coded error as remark (``CODE: message``),
# documented with the server that serves it (docs/NAMESRV.md, docs/REMOTING.md, docs/SECURITY.md)
NOT_HTTP = ("broker/serving/remoting_server.py", "broker/serving/remoting_acl.py")
CODE_FIRST = {"ProtocolError"}
STATUS_FIRST = {"AuthError", "EdgeError"}
# (file, function): where the codes of a call with a computed code or status come from
COMPUTED: dict[tuple[str, str], str] = {
    ("broker/store/message.py", "check_int"): "the caller names the code: check_int(..., code=...), collected below",
    ("broker/service/base.py", "refusal_error"): "RECORD_REFUSED (422) or BAD_COMMAND (400): REFUSALS below",
    ("broker/service/base.py", "translate"): "DLEDGER_ERRORS, collected below",
    ("broker/service/txn.py", "_resolved"): "_REFUSED's codes, with 409, collected below",
    ("broker/edge/binary.py", "handle"): (
        "a refused signature (AuthError, its own code) or a frame's (docs/API.md, the binary section)"
    ),
    ("broker/serving/security.py", "authenticate"): "a refused signature (AuthError, its own code) answered early",
    ("broker/store/replay.py", "append"): "the replicated nonce window's refusals: _MESSAGES, collected below",
    ("broker/service/admin.py", "change_membership"): "_MEMBERSHIP_REFUSALS, collected below",
}
REFUSALS = {(422, "RECORD_REFUSED"), (400, "BAD_COMMAND")}
# Exceptions with a ``code`` that is no coded error: (file, class) -> why
NOT_CODED: dict[tuple[str, str], str] = {
    ("broker/serving/remoting_server.py", "CommandError"): (
        "a RocketMQ answer a remoting handler chose: its code is a ResponseCode (an int), its remark the text"
    ),
}


def _files() -> Iterator[tuple[str, ast.Module]]:
    for top in SERVER_SIDE:
        path = os.path.join(ROOT, top)
        paths = [path] if path.endswith(".py") else sorted(
            os.path.join(d, f) for d, _dirs, files in os.walk(path) for f in files if f.endswith(".py")
        )
        for p in paths:
            rel = os.path.relpath(p, ROOT).replace(os.sep, "/")
            if rel in NOT_HTTP:
                continue
            with open(p, encoding="utf-8") as f:
                yield rel, ast.parse(f.read(), rel)


def _functions(tree: ast.Module) -> Iterator[tuple[str, ast.AST]]:
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node


def _literal(node: ast.AST | None) -> object:
    return node.value if isinstance(node, ast.Constant) else None


def raised(files: list[tuple[str, ast.Module]]) -> tuple[dict[tuple[int, str], list[str]], list[str]]:
    """(status, code) -> where, for every coded error built with literals; and the calls that are not
    literal and not in ``COMPUTED``."""
    found: dict[tuple[int, str], list[str]] = {}
    unexplained: list[str] = []
    for rel, tree in files:
        owner: dict[int, str] = {}  # node -> the innermost function around it (ast.walk: outer first)
        for name, fn in _functions(tree):
            for node in ast.walk(fn):
                owner[id(node)] = name
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
                continue
            args = node.args
            if node.func.id in CODE_FIRST:
                code, status = _literal(args[0] if args else None), _literal(args[2] if len(args) > 2 else None)
            elif node.func.id in STATUS_FIRST:
                status, code = _literal(args[0] if args else None), _literal(args[1] if len(args) > 1 else None)
            elif node.func.id == "check_int":
                kw = {k.arg: k.value for k in node.keywords}
                code = _literal(kw.get("code", args[4] if len(args) > 4 else None))
                if isinstance(code, str):
                    found.setdefault((400, code), []).append(f"{rel}:{node.lineno}")
                continue
            else:
                continue
            if isinstance(code, str) and isinstance(status, int):
                found.setdefault((status, code), []).append(f"{rel}:{node.lineno}")
            elif (rel, owner.get(id(node), "")) not in COMPUTED:
                unexplained.append(f"{rel}:{node.lineno}: {ast.unparse(node)[:90]}")
        for node in ast.walk(tree):  # status/code tables: {status: code}, {type: (status, code)}, {state: (code, what)}
            if isinstance(node, ast.Dict):
                for k, v in zip(node.keys, node.values, strict=True):
                    key, value = _literal(k), _literal(v)
                    if isinstance(key, int) and isinstance(value, str) and 400 <= key < 600:
                        found.setdefault((key, value), []).append(f"{rel}:{node.lineno}")
                    elif isinstance(v, ast.Tuple) and len(v.elts) == 2:
                        a, b = (_literal(e) for e in v.elts)
                        if isinstance(a, int) and isinstance(b, str):
                            found.setdefault((a, b), []).append(f"{rel}:{node.lineno}")
                        elif rel.endswith("service/txn.py") and isinstance(a, str) and a.isupper():
                            found.setdefault((409, a), []).append(f"{rel}:{node.lineno}")
            elif isinstance(node, ast.AnnAssign) and rel.endswith("store/replay.py") and (
                isinstance(node.target, ast.Name) and node.target.id == "_MESSAGES"
            ):  # the nonce window's refusals, raised as AuthError(401, code, _MESSAGES[code])
                assert isinstance(node.value, ast.Dict)
                for k in node.value.keys:
                    code = _literal(k)
                    if isinstance(code, str):
                        found.setdefault((401, code), []).append(f"{rel}:{node.lineno}")
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and (
                node.func.attr == "json_response"
            ):
                status, code = (_literal(a) for a in node.args[:2]) if len(node.args) >= 2 else (None, None)
                if isinstance(status, int) and isinstance(code, str):
                    found.setdefault((status, code), []).append(f"{rel}:{node.lineno}")
    for pair in REFUSALS:
        found.setdefault(pair, []).append("refusal_error")
    return found, unexplained


def _documented(doc: str, heading: str, end: str, row: str) -> set[tuple[int, str]]:
    """(status, code) of every code in a table of docs/``doc`` (from ``heading`` to ``end``): ``row``
    matches a row's status and the cell of its codes; codes in parentheses are not counted."""
    with open(os.path.join(ROOT, "docs", doc), encoding="utf-8") as f:
        text = f.read()
    section = text[text.index(heading) :]
    section = section[: section.index(end, 1)]
    out: set[tuple[int, str]] = set()
    for line in section.splitlines():
        m = re.match(row, line)
        if not m:
            continue
        cell = m.group(2)
        while re.search(r"\([^()]*\)", cell):
            cell = re.sub(r"\([^()]*\)", "", cell)
        out.update((int(m.group(1)), code) for code in re.findall(r"`([A-Z][A-Z0-9_]+)`", cell))
    return out


def documented() -> set[tuple[int, str]]:
    """(status, code) of every code in docs/API.md's "Error codes" table (not those in parentheses)."""
    return _documented("API.md", "### Error codes", "\n### ", r"\|\s*(\d{3})\s*\|(.*)\|\s*$")


def test_every_code_raised_is_documented_with_its_status_and_every_documented_code_is_raised() -> None:
    found, unexplained = raised(list(_files()))
    assert not unexplained, "coded errors with a computed code or status (list them in COMPUTED):\n" + "\n".join(
        unexplained
    )
    docs = documented()
    missing = sorted(set(found) - docs)
    assert not missing, "raised but not in docs/API.md's error table:\n" + "\n".join(
        f"{status} {code}: {found[(status, code)][0]}" for status, code in missing
    )
    unraised = sorted(docs - set(found))
    assert not unraised, f"in docs/API.md's error table but never raised: {unraised}"


def test_the_walk_can_fail() -> None:
    """A planted undocumented code, a planted computed one and a documented code nobody raises are found."""
    planted = ("broker/service/x.py", ast.parse(
        "def f(c):\n    raise ProtocolError('NEVER_DOCUMENTED', 'm', 400)\n"
        "def g(c):\n    raise ProtocolError(c, 'm', 400)\n"
        "def h():\n    raise AuthError(401, 'NO_CREDENTIALS', 'm')\n"
    ))
    found, unexplained = raised([planted])
    assert (400, "NEVER_DOCUMENTED") in found and (401, "NO_CREDENTIALS") in found
    assert [line.split(":")[1] for line in unexplained] == ["4"]
    assert (400, "NEVER_DOCUMENTED") not in documented()
    assert (404, "TOPIC_NOT_EXIST") in documented() and (405, "CONNECT") not in documented()


def test_one_error_type_holds_the_fields() -> None:
    """Only ``ProtocolError`` declares ``code`` / ``message`` / ``status``: every coded error of the
    service, the edges, the NameServer and the SDK is one (its subclasses only build it)."""
    for cls in (AuthError, EdgeError):
        assert issubclass(cls, ProtocolError)
    assert ClientError is ProtocolError  # the SDK's name for it (docs/CLIENT.md)
    declaring = []
    for top in ("broker", "namesrv", "dledger/apps"):
        for d, _dirs, files in os.walk(os.path.join(ROOT, top)):
            for name in files:
                if not name.endswith(".py"):
                    continue
                path = os.path.join(d, name)
                rel = os.path.relpath(path, ROOT).replace(os.sep, "/")
                if rel == "broker/protocol/errors.py":
                    continue
                with open(path, encoding="utf-8") as f:
                    tree = ast.parse(f.read())
                for cls_node in ast.walk(tree):
                    if not isinstance(cls_node, ast.ClassDef):
                        continue
                    bases = [b.id for b in cls_node.bases if isinstance(b, ast.Name)]
                    if not any(b.endswith(("Error", "Exception")) for b in bases):
                        continue
                    if (rel, cls_node.name) in NOT_CODED:
                        continue
                    for node in ast.walk(cls_node):
                        if (
                            isinstance(node, ast.Attribute)
                            and isinstance(node.ctx, ast.Store)
                            and isinstance(node.value, ast.Name)
                            and node.value.id == "self"
                            and node.attr in ("code", "status")
                        ):
                            declaring.append(f"{rel}:{node.lineno}: {cls_node.name}.{node.attr}")
    assert not declaring, "error classes that declare a code or status of their own (derive ProtocolError):\n" + (
        "\n".join(declaring)
    )


# -- the NameServer (docs/NAMESRV.md, "Errors") ------------------------------------------------------------
# Its coded errors carry no status: the HTTP status is their class's (``_STATUS_BY_ERROR`` in
# namesrv/server.py), read here from the source too. Its HTTP API raises them in these files.
NAMESRV_HTTP = ("namesrv/route_table.py", "namesrv/server.py", "broker/protocol/route_wire.py")
# Over RocketMQ's remoting only (answered SYSTEM_ERROR / SYSTEM_BUSY with the code as remark: the
# KV config is no HTTP resource), so not in the HTTP table: docs/NAMESRV.md's remoting section names them.
NAMESRV_REMOTING_ONLY = ("namesrv/kv_config.py", "namesrv/remoting.py")
# helpers whose caller names the code: (file, function) -> the index of the code argument
NAMESRV_CODE_ARG: dict[tuple[str, str], int] = {
    ("namesrv/route_table.py", "validate_name"): 1,
    ("namesrv/route_table.py", "_check_int"): 3,
}


def _parsed(rel: str) -> ast.Module:
    with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
        return ast.parse(f.read(), rel)


def namesrv_raised(
    planted: dict[str, ast.Module] | None = None,
) -> tuple[dict[tuple[int, str], list[str]], list[str]]:
    """(status, code) -> where, for every coded error the NameServer's HTTP side raises; and the
    raise sites it cannot read (a computed code, a class without a status). ``planted``: more
    sources to walk (the test of the test)."""
    server = _parsed("namesrv/server.py")
    status_of: dict[str, int] = {}  # class name -> HTTP status
    for node in ast.walk(server):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and (
            node.target.id == "_STATUS_BY_ERROR"
        ):
            assert isinstance(node.value, ast.Dict)
            for k, v in zip(node.value.keys, node.value.values, strict=True):
                name = k.attr if isinstance(k, ast.Attribute) else k.id if isinstance(k, ast.Name) else None
                status = _literal(v)
                assert name is not None and isinstance(status, int)
                status_of[name] = status
    assert status_of, "namesrv/server.py has no _STATUS_BY_ERROR"
    trees = {rel: _parsed(rel) for rel in NAMESRV_HTTP} | (planted or {})
    bases: dict[str, str] = {}  # class -> its first base, to find the status of a subclass
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node.bases and isinstance(node.bases[0], ast.Name):
                bases[node.name] = node.bases[0].id

    def status(cls: str) -> int | None:
        while cls not in status_of and cls in bases:
            cls = bases[cls]
        return status_of.get(cls)

    found: dict[tuple[int, str], list[str]] = {}
    unexplained: list[str] = []
    for rel, tree in trees.items():
        owner: dict[int, str] = {}
        for name, fn in _functions(tree):
            for node in ast.walk(fn):
                owner[id(node)] = name
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            where = f"{rel}:{node.lineno}"
            if (rel, name) in NAMESRV_CODE_ARG:  # a helper: its caller names the code
                i = NAMESRV_CODE_ARG[(rel, name)]
                code = _literal(node.args[i]) if len(node.args) > i else None
                if isinstance(code, str):
                    found.setdefault((400, code), []).append(where)
                continue
            if not name.endswith("Error") or name not in bases:
                continue
            code, st = _literal(node.args[0]) if node.args else None, status(name)
            if isinstance(code, str) and st is not None:
                found.setdefault((st, code), []).append(where)
            elif (rel, owner.get(id(node), "")) not in NAMESRV_CODE_ARG:
                unexplained.append(f"{where}: {ast.unparse(node)[:90]}")
    return found, unexplained


def namesrv_documented() -> set[tuple[int, str]]:
    """(status, code) of every code in docs/NAMESRV.md's "Errors" table (its second column)."""
    return _documented("NAMESRV.md", "### Errors", "\n## ", r"\|\s*(\d{3})\s*\|([^|]*)\|")


def test_every_code_the_namesrv_raises_is_in_its_error_table_and_the_table_holds_nothing_else() -> None:
    """Both ways: each code the NameServer's HTTP side raises is in docs/NAMESRV.md's table with its
    class's status; each code there is raised by it, or by the HTTP edge it shares with the broker
    (aiohttp's router and body limit, ``HTTP_ERROR_CODES``; the edge's own refusals)."""
    found, unexplained = namesrv_raised()
    assert not unexplained, "coded errors whose code or status the walk cannot read:\n" + "\n".join(unexplained)
    docs = namesrv_documented()
    missing = sorted(set(found) - docs)
    assert not missing, "raised by the NameServer but not in docs/NAMESRV.md's error table:\n" + "\n".join(
        f"{status} {code}: {found[(status, code)][0]}" for status, code in missing
    )
    shared, _ = raised([(rel, tree) for rel, tree in _files() if rel.startswith("broker/serving/")])
    unraised = sorted(docs - set(found) - set(shared))
    assert not unraised, f"in docs/NAMESRV.md's error table but never raised: {unraised}"
    for rel in NAMESRV_REMOTING_ONLY:  # not answered over HTTP: nothing there raises a class with a status
        assert os.path.exists(os.path.join(ROOT, rel)), rel


def test_the_namesrv_walk_can_fail() -> None:
    """A planted code is found with its class's status (a subclass's too), a computed one is
    reported, and an undocumented one is not in the table."""
    planted = ast.parse(
        "class PlantedError(NotFoundError):\n    pass\n"
        "def f(c):\n    raise NotFoundError('NEVER_DOCUMENTED', 'm')\n"
        "def g(c):\n    raise PlantedError('ALSO_NEVER', 'm')\n"
        "def h(c):\n    raise ConflictError(c, 'm')\n"
    )
    found, unexplained = namesrv_raised({"namesrv/x.py": planted})
    assert (404, "NEVER_DOCUMENTED") in found and (404, "ALSO_NEVER") in found
    assert [line.split(":")[1] for line in unexplained] == ["8"]
    assert (404, "NEVER_DOCUMENTED") not in namesrv_documented()
    assert (404, "TOPIC_NOT_EXIST") in found and (400, "INVALID_CLUSTER_NAME") in found  # a helper's caller
    assert (409, "CLUSTER_MISMATCH") in found and (409, "CLUSTER_MISMATCH") in namesrv_documented()
