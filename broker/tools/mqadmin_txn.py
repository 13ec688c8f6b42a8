"""``mqadmin queryTransactionHalf``: the half messages of transactions still pending (neither
committed nor rolled back; broker/store/transactions.py), per broker group, oldest first. Same conventions
as ``broker/tools/mqadmin.py``; named in its command table (``mqadmin_commands.py``)."""

from __future__ import annotations

import argparse
from typing import Any

from broker.client.admin import Admin
from broker.client.admin_checks import answers_checked, check_addr, check_group, check_name, check_topic
from broker.client.admin_records import InvalidArgument
from broker.tools.mqadmin_format import Output, format_table, format_ts, to_jsonable

HALVES_MAX = 1000  # the broker's bound per answer


def render_halves(answers: list[dict[str, Any]]) -> str:
    rows = [
        (a.get("broker_name"), h["msg_id"], h["topic"], h["producer_group"], format_ts(h["store_ts"]),
         round(int(h["age_ms"]) / 1000, 1), h["check_times"])
        for a in answers
        for h in a.get("halves") or ()
    ]
    table = format_table(["Broker Name", "Half MsgId", "Topic", "Producer Group", "Store Time", "Age (s)", "Checks"],
                         rows)
    totals = ", ".join(f"{a.get('broker_name')}: {a.get('pending')}" for a in answers)
    return f"{table}\npending halves per group: {totals}"


@answers_checked
async def run_query_transaction_half(admin: Admin, args: argparse.Namespace) -> Output:
    if (args.cluster is None) == (args.broker_addr is None):
        raise InvalidArgument("BAD_REQUEST", "give exactly one of a cluster (-c) or a broker address (-b)")
    if not 1 <= args.max <= HALVES_MAX:
        raise InvalidArgument("BAD_REQUEST", f"--maxNum must be 1..{HALVES_MAX}")
    params = {
        "group": check_group(args.group) if args.group else None,
        "topic": check_topic(args.topic) if args.topic else None,
        "limit": args.max,
    }
    if args.broker_addr is not None:
        addrs = [check_addr(args.broker_addr)]
    else:  # one replica per group: its leader (every replica holds the same halves, maybe a bit later)
        groups = await admin.cluster_groups(check_name(args.cluster, "cluster"))
        addrs = [a for a in (bd.any_addr() for bd in groups) if a is not None]  # the leader if routed
    answers = [dict(await admin.transport.call(a, "GET", "/v1/transaction/halves", params=params)) for a in addrs]
    return Output({"brokers": to_jsonable(answers)}, render_halves(answers))
