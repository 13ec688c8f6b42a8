"""``mqadmin <command> [options]``: RocketMQ's admin tool for the DLedger-mode cluster.

Command names and flags follow RocketMQ's ``mqadmin`` where they exist (``-n`` NameServers, ``-t``
topic, ``-g`` group, ``-c`` cluster, ``-b`` broker address...); ``mqadmin <command> --help`` lists
them. Output is an aligned text table like RocketMQ's; ``--json`` prints one JSON document instead.

Exit codes: 0 done; 1 the cluster answered an error or could not be reached (the message names
the code, e.g. ``TOPIC_NOT_EXIST: ...``); 2 bad usage or bad input (argparse errors, invalid names,
bad timestamps), refused before any request. Expected failures never print a traceback.

This module is the runner (exit codes, errors); the command table (the argparse parser) is
``mqadmin_commands.py``, which names each command's function so that only its module is imported.
Parsing and rendering are plain functions over plain data (``mqadmin_format.py``); the ``await`` sits
in one ``run_*`` function per command, each over one ``Admin``: ``mqadmin_cluster.py`` (cluster,
topics, groups), ``mqadmin_messages.py`` (queries, send, consume), ``mqadmin_ops.py``,
``mqadmin_stats.py`` and ``mqadmin_txn.py``. ``-n`` and ``--json`` are accepted before the command
too (``mqadmin -n ADDR clusterList``, as RocketMQ users type it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from broker.client.admin_records import FanOutError, InvalidArgument
from broker.client.transport import DEFAULT_NAMESRV, ClientError, security_kwargs
from broker.protocol.auth import CredentialsError
from broker.tools.mqadmin_commands import PROG, build_parser, runner
from broker.tools.mqadmin_format import render_outcomes, to_jsonable

if TYPE_CHECKING:
    from broker.client.admin import Admin

EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: what a shell reports for a tool whose reader closed the pipe


# -- running ----------------------------------------------------------------------------------------
def _fail(args: argparse.Namespace, exc: ClientError, code: int) -> int:
    if args.json:
        print(json.dumps({"ok": False, "code": exc.code, "message": exc.message, "addr": exc.addr}))
    print(f"{PROG} {args.command}: {exc}", file=sys.stderr)
    return code


async def run(args: argparse.Namespace) -> int:
    from broker.client.admin import Admin  # with the command's module, after the arguments are checked

    run_command = runner(args.runner)
    try:
        admin = Admin(args.namesrv, timeout_s=args.timeout, **security_kwargs(args))
    except InvalidArgument as exc:
        return _fail(args, exc, 2)
    except CredentialsError as exc:
        return _fail(args, ClientError("BAD_CREDENTIALS", str(exc)), 2)
    try:
        out = await run_command(admin, args)
    except InvalidArgument as exc:
        return _fail(args, exc, 2)
    except FanOutError as exc:
        if args.json:
            print(
                json.dumps(
                    {
                        "ok": False,
                        "code": exc.code,
                        "message": exc.message,
                        "results": to_jsonable(exc.outcomes),
                    },
                    indent=2,
                )
            )
        else:
            print(render_outcomes(exc.outcomes))
        print(f"{PROG} {args.command}: {exc}", file=sys.stderr)
        return 1
    except ClientError as exc:
        return _fail(args, await _explain(admin, exc), 1)
    except Exception as exc:
        code = getattr(exc, "code", None)
        if not isinstance(code, str):  # not a typed client failure: a bug
            raise
        return _fail(args, ClientError(code, str(exc)), 1)
    finally:
        await admin.close()
    print(json.dumps(out.data, indent=2, ensure_ascii=False) if args.json else out.text)
    sys.stdout.flush()  # a closed pipe fails here, inside main's BrokenPipeError handling
    return out.exit_code


async def _explain(admin: Admin, exc: ClientError) -> ClientError:
    """A 404 for a NameServer path from an address given with -n: that address is no NameServer."""
    if exc.code != "NOT_FOUND" or exc.addr is None or exc.addr not in admin.namesrv.addrs:
        return exc
    what = "it has no NameServer API"
    try:
        st = await admin.transport.call(exc.addr, "GET", "/v1/status", timeout_s=2.0)
        if isinstance(st, dict) and st.get("broker_name"):
            what = f"it is a broker ({st.get('cluster')}/{st.get('broker_name')}, replica {st.get('self_id')})"
    except ClientError:
        pass
    return ClientError(
        "NOT_A_NAMESRV",
        f"{exc.addr} is not a NameServer: {what}; -n takes the NameServer list, e.g. 127.0.0.1:9876",
        addr=exc.addr,
    )


def _quiet_stdout() -> None:
    """After EPIPE: point stdout at /dev/null so the interpreter's final flush stays silent."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2, message already on stderr)
        return exc.code if isinstance(exc.code, int) else 2
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    args.json = args.json or args.json_first
    if args.namesrv is None:  # -n after the command wins over -n before it
        args.namesrv = args.namesrv_first or os.environ.get("NAMESRV_ADDR") or DEFAULT_NAMESRV
    try:
        return asyncio.run(run(args))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `mqadmin ... | head -1`: the reader left; exit like a Unix tool, quietly
        _quiet_stdout()
        return EXIT_BROKEN_PIPE


if __name__ == "__main__":
    sys.exit(main())
