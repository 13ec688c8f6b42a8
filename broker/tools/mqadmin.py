"""``mqadmin <command> [options]``: RocketMQ's admin tool for the DLedger-mode cluster.

Command names and flags follow RocketMQ's ``mqadmin`` where they exist (``-n`` NameServers, ``-t``
topic, ``-g`` group, ``-c`` cluster, ``-b`` broker address...); ``mqadmin <command> --help`` lists
them. Output is an aligned text table like RocketMQ's; ``--json`` prints one JSON document instead.

Exit codes: 0 done; 1 the cluster answered an error or could not be reached (the message names
the code, e.g. ``TOPIC_NOT_EXIST: ...``); 2 bad usage or bad input (argparse errors, invalid names,
bad timestamps), refused before any request. Expected failures never print a traceback.

This module is the command table (the argparse parser) and the runner (exit codes, errors). Parsing
and rendering are plain functions over plain data (``mqadmin_format.py``); the ``await`` sits in one
``run_*`` function per command, each over one ``Admin``: ``mqadmin_cluster.py`` (cluster, topics,
groups), ``mqadmin_messages.py`` (queries, send, consume), ``mqadmin_ops.py`` and ``mqadmin_txn.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Sequence

from broker.client.admin import Admin
from broker.client.admin_records import FanOutError, InvalidArgument
from broker.client.trace import TRACE_TOPIC_DEFAULT
from broker.client.transport import DEFAULT_NAMESRV, ClientError, add_security_arguments, security_kwargs
from broker.protocol.auth import CredentialsError
from broker.tools import mqadmin_ops, mqadmin_txn
from broker.tools.cli import add_namesrv_argument
from broker.tools.mqadmin_cluster import (
    run_broker_status,
    run_cluster_list,
    run_consumer_progress,
    run_delete_topic,
    run_reset_offset_by_time,
    run_topic_list,
    run_topic_route,
    run_topic_status,
    run_transfer_leader,
    run_update_sub_group,
    run_update_topic,
)
from broker.tools.mqadmin_format import (
    Runner,
    non_negative_int,
    parse_bool,
    parse_timestamp,
    positive_float,
    render_outcomes,
    to_jsonable,
)
from broker.tools.mqadmin_messages import (
    run_consume_message,
    run_query_dlq_messages,
    run_query_msg_by_id,
    run_query_msg_by_key,
    run_query_msg_by_offset,
    run_query_msg_by_unique_key,
    run_query_msg_trace_by_id,
    run_resend_dlq_message,
    run_send_message,
)

PROG = "mqadmin"
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: what a shell reports for a tool whose reader closed the pipe


# -- the parser -------------------------------------------------------------------------------------
def _common(p: argparse.ArgumentParser) -> None:
    add_namesrv_argument(p)
    p.add_argument("--json", action="store_true", help="print one JSON document instead of a table")
    p.add_argument("--timeout", type=positive_float, default=3.0, help="seconds per request (default 3)")
    add_security_arguments(p)


def _target(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("-c", "--clusterName", dest="cluster", help="every group leader of this cluster")
    g.add_argument("-b", "--brokerAddr", dest="broker_addr", help="this one broker (host:port)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Admin tool of the DLedger-mode message cluster (RocketMQ's mqadmin).",
        epilog="Exit codes: 0 ok, 1 the cluster answered an error or is unreachable, 2 bad usage or input.",
    )
    parser.add_argument(
        "--json",
        dest="json_first",
        action="store_true",
        help="print one JSON document instead of a table (also accepted after the command)",
    )
    sub = parser.add_subparsers(dest="command", metavar="<command>")

    def cmd(name: str, help_text: str, runner: Runner) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        _common(p)
        p.set_defaults(runner=runner)
        return p

    cmd("clusterList", "List the broker groups of every cluster, one row per replica", run_cluster_list)
    cmd("topicList", "List every topic the NameServer knows", run_topic_list)
    p = cmd("topicRoute", "Show a topic's queues and broker groups", run_topic_route)
    p.add_argument("-t", "--topic", required=True)
    p = cmd("updateTopic", "Create or update a topic", run_update_topic)
    p.add_argument("-t", "--topic", required=True)
    _target(p)
    p.add_argument("-r", "--readQueueNums", dest="read_queue_nums", type=int, default=4)
    p.add_argument("-w", "--writeQueueNums", dest="write_queue_nums", type=int, default=4)
    p.add_argument("-p", "--perm", type=int, default=6, help="4 read | 2 write (default 6)")
    p.add_argument("-o", "--order", type=parse_bool, nargs="?", const=True, default=False)
    p = cmd(
        "deleteTopic", "Delete a topic from a cluster's brokers, then from every NameServer", run_delete_topic
    )
    p.add_argument("-t", "--topic", required=True)
    p.add_argument("-c", "--clusterName", dest="cluster", required=True)
    p = cmd("topicStatus", "Min/max offset and last store time of every queue of a topic", run_topic_status)
    p.add_argument("-t", "--topic", required=True)
    p = cmd("updateSubGroup", "Create or update a subscription group", run_update_sub_group)
    p.add_argument("-g", "--groupName", dest="group", required=True)
    _target(p)
    p.add_argument("-s", "--consumeEnable", dest="consume_enable", type=parse_bool, default=True)
    p.add_argument(
        "-d", "--consumeBroadcastEnable", dest="consume_broadcast_enable", type=parse_bool, default=True
    )
    p.add_argument("-r", "--retryMaxTimes", dest="retry_max_times", type=int, default=16)
    p = cmd("consumerProgress", "A consumer group's offsets and lag per queue", run_consumer_progress)
    p.add_argument("-g", "--groupName", dest="group", required=True)
    p.add_argument("-t", "--topic", default=None)
    p = cmd("brokerStatus", "A broker's own status", run_broker_status)
    p.add_argument("-b", "--brokerAddr", dest="broker_addr", required=True)
    p = cmd("queryMsgById", "A message by its msgId (<brokerName>:<position>)", run_query_msg_by_id)
    p.add_argument("-i", "--msgId", dest="msg_id", required=True)
    p = cmd("queryMsgTraceById", "A message's trace: its send, then each group's consumption",
            run_query_msg_trace_by_id)
    p.add_argument("-i", "--msgId", dest="msg_id", required=True, help="the msgId or the unique id")
    p.add_argument("-t", "--traceTopic", dest="trace_topic", default=TRACE_TOPIC_DEFAULT)
    p = cmd("queryMsgByKey", "Messages of a topic carrying a key, newest first", run_query_msg_by_key)
    p.add_argument("-t", "--topic", required=True)
    p.add_argument("-k", "--msgKey", dest="key", required=True)
    p.add_argument("-c", "--maxNum", dest="max", type=int, default=64)
    p = cmd("queryMsgByUniqueKey", "Messages by the producer's unique key", run_query_msg_by_unique_key)
    p.add_argument("-t", "--topic", required=True)
    p.add_argument("-u", "--uniqueKey", dest="unique_key", required=True)
    p = cmd("queryMsgByOffset", "The message at a queue offset", run_query_msg_by_offset)
    p.add_argument("-t", "--topic", required=True)
    p.add_argument("-m", "--brokerName", dest="broker_name", required=True)
    p.add_argument("-q", "--queueId", dest="queue_id", type=non_negative_int, required=True)
    p.add_argument("-o", "--offset", type=non_negative_int, required=True)
    p = cmd("queryDlqMessageByConsumerGroup", "The newest messages of a group's dead-letter queue",
            run_query_dlq_messages)
    p.add_argument("-g", "--consumerGroup", dest="group", required=True)
    p.add_argument("-c", "--maxNum", dest="max", type=int, default=64, help="per queue (default 64)")
    p = cmd("resendDlqMessage", "Send a dead-letter message back to its group's retry topic", run_resend_dlq_message)
    p.add_argument("-g", "--consumerGroup", dest="group", required=True)
    p.add_argument("-i", "--msgId", dest="msg_id", required=True)
    p = cmd("sendMessage", "Send one message", run_send_message)
    p.add_argument("-t", "--topic", required=True)
    p.add_argument("-p", "--body", required=True, help="the body, as UTF-8 text")
    p.add_argument("-k", "--keys", default=None, help="space-separated keys")
    p.add_argument("-c", "--tags", default=None)
    p.add_argument("-m", "--brokerName", dest="broker_name", default=None)
    p.add_argument("-q", "--queueId", dest="queue_id", type=non_negative_int, default=None)
    p = cmd("consumeMessage", "Print messages of a topic (reads only: commits nothing)", run_consume_message)
    p.add_argument("-t", "--topic", required=True)
    p.add_argument("--sql", default=None, help="only messages matching this SQL92 condition (filtered by the broker)")
    p.add_argument("-g", "--consumerGroup", dest="group", default=None)
    p.add_argument(
        "-c", "--count", dest="count", type=int, default=128, help="at most this many (default 128)"
    )
    p.add_argument("-m", "--brokerName", dest="broker_name", default=None)
    p.add_argument("-q", "--queueId", dest="queue_id", type=non_negative_int, default=None)
    p.add_argument(
        "-s",
        "--startOffset",
        dest="start_offset",
        type=non_negative_int,
        default=None,
        help="first queue offset (default: each queue's first)",
    )
    p.add_argument(
        "-e",
        "--endOffset",
        dest="end_offset",
        type=non_negative_int,
        default=None,
        help="stop before this queue offset (default: each queue's max when started)",
    )
    p = cmd(
        "resetOffsetByTime",
        "Move a group's offsets of a topic to a time (backwards too)",
        run_reset_offset_by_time,
    )
    p.add_argument("-g", "--groupName", dest="group", required=True)
    p.add_argument("-t", "--topic", required=True)
    p.add_argument(
        "-s",
        "--timestamp",
        type=parse_timestamp,
        required=True,
        help="now, epoch ms, or yyyy-MM-dd#HH:mm:ss:SSS",
    )
    p = cmd("transferLeader", "Hand a broker group's leadership to another replica", run_transfer_leader)
    p.add_argument("-m", "--brokerName", dest="broker_name", required=True)
    p.add_argument("-i", "--targetId", dest="target_id", default=None, help="peer id, e.g. n1 (default: any)")
    mqadmin_ops.register(cmd)
    mqadmin_txn.register(cmd)  # queryTransactionHalf
    return parser


# -- running ----------------------------------------------------------------------------------------
def _fail(args: argparse.Namespace, exc: ClientError, code: int) -> int:
    if args.json:
        print(json.dumps({"ok": False, "code": exc.code, "message": exc.message, "addr": exc.addr}))
    print(f"{PROG} {args.command}: {exc}", file=sys.stderr)
    return code


async def run(args: argparse.Namespace) -> int:
    try:
        admin = Admin(args.namesrv, timeout_s=args.timeout, **security_kwargs(args))
    except InvalidArgument as exc:
        return _fail(args, exc, 2)
    except CredentialsError as exc:
        return _fail(args, ClientError("BAD_CREDENTIALS", str(exc)), 2)
    try:
        out = await args.runner(admin, args)
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
    if args.namesrv is None:
        args.namesrv = os.environ.get("NAMESRV_ADDR") or DEFAULT_NAMESRV
    try:
        return asyncio.run(run(args))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `mqadmin ... | head -1`: the reader left; exit like a Unix tool, quietly
        _quiet_stdout()
        return EXIT_BROKEN_PIPE


if __name__ == "__main__":
    sys.exit(main())
