"""The ``chaos`` command: ``chaos run``, ``chaos drill``, ``chaos faults`` (docs/CHAOS.md).

Exit codes: ``run`` — the audit's (0 clean, 1 lost or diverged); with ``--no-audit``, 0 when the
run's own check found every acknowledged message in the drain, 1 otherwise. ``drill`` — 0 when
nothing acknowledged was lost, 1 otherwise. Both: 2 bad usage or a missing prerequisite
(Toxiproxy, the audit), 3 the run itself failed (the cluster did not come up, ...).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import sys
from collections.abc import Callable
from typing import Any

from chaos import fleet, plants, replace, rolling
from chaos.drill import DrillError, DrillOptions, run_drill
from chaos.faults import (
    CRASH_GATES,
    SKEW_DEFAULT,
    STANDARD_FAULTS,
    expand_faults,
    fault_names,
    make_fault,
    parse_toxic_params,
)
from chaos.layout import DEFAULT_PORT_BASE, PORT_SPAN, Ports
from chaos.runner import Run, RunOptions, audit_available
from chaos.toxi import ToxiproxyMissing, find_server_binary
from chaos.workload import WorkloadConfig


class UsageError(Exception):
    pass


# With transactions in the workload the brokers check back within seconds, not RocketMQ's minute, so
# that unknown transactions are resolved inside a run's settle time.
TXN_BROKER_SETTINGS = {"transactionTimeOut": "2000", "transactionCheckInterval": "2000"}
_TXN_SETTINGS_TEXT = ", ".join(f"{k}={v}" for k, v in TXN_BROKER_SETTINGS.items())

def _bounded(kind: Callable[[str], Any], lo: float, hi: float) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        value = kind(text)
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{text} is not in {lo:g}..{hi:g}")
        return value
    return parse


def _port_base(text: str) -> int:
    value = int(text)
    try:
        Ports(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="chaos", description="Chaos runs and failover drills (docs/CHAOS.md).")
    parser.add_argument("--log-level", default="WARNING", help="log level of the SDK and tools (default WARNING)")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="a cluster behind Toxiproxy, a workload, faults, drain, audit")
    run.add_argument("--dir", required=True, help="the run directory (new or empty)")
    run.add_argument("--faults", required=True,
                     help="comma-separated fault names (chaos faults lists them); 'standard' is the standard mix")
    run.add_argument("--interval", type=_bounded(float, 1, 3600), default=30.0, help="seconds per window (30)")
    run.add_argument("--duration", type=_bounded(float, 2, 86400), default=600.0, help="seconds of windows (600)")
    run.add_argument("--recovery", type=_bounded(float, 0, 3600), default=30.0,
                     help="seconds of load without faults before the drain (30)")
    run.add_argument("--settle", type=_bounded(float, 0, 3600), default=60.0,
                     help="at most this long for consumers to receive every ack after producers stop (60)")
    run.add_argument("--producers", type=_bounded(int, 1, 64), default=4)
    run.add_argument("--keyed-producers", type=_bounded(int, 0, 64), default=None,
                     help="how many producers send keyed messages with HashKeySelector (default: half)")
    run.add_argument("--consumers", type=_bounded(int, 0, 64), default=2)
    run.add_argument("--rate", type=_bounded(float, 0, 100000), default=50.0,
                     help="sends/s per producer, 0 for as fast as acknowledged (50)")
    run.add_argument("--body-bytes", type=_bounded(int, 16, 1 << 20), default=128)
    run.add_argument("--topic", default="ChaosTopic")
    run.add_argument("--queues", type=_bounded(int, 1, 1024), default=8)
    run.add_argument("--groups", type=_bounded(int, 1, 9), default=1)
    run.add_argument("--flush", choices=["sync", "async"], default="sync")
    run.add_argument("--port-base", type=_port_base, default=DEFAULT_PORT_BASE,
                     help=f"every port of the run lies in [BASE, BASE+{PORT_SPAN}) (default {DEFAULT_PORT_BASE})")
    run.add_argument("--seed", type=int, default=None, help="seed of every random choice (default: random, printed)")
    run.add_argument("--order", choices=["cycle", "random"], default="cycle", help="fault order (cycle)")
    run.add_argument("--fixed-node", default="n0", help="node id the *-fixed faults hit in every group (n0)")
    run.add_argument("--toxic", action="append", default=[], metavar="TOXIC.ATTR=INT",
                     help="toxic parameter, e.g. latency.latency=200 latency.jitter=20 bandwidth.rate=32")
    run.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                     help="extra broker config key for every replica")
    run.add_argument("--progress", type=_bounded(float, 0.5, 600), default=5.0, help="seconds between progress lines")
    run.add_argument("--no-audit", action="store_true", help="skip the Spark audit (exit code from the quick check)")
    run.add_argument("--toxiproxy-server", default=None, help="path of toxiproxy-server (default: .ci/bin, PATH)")
    run.add_argument("--sample-interval", type=_bounded(float, 0.05, 60), default=0.25,
                     help="seconds between two samples of every replica (0.25)")
    run.add_argument("--zombie-interval", type=_bounded(float, 0, 600), default=3.0,
                     help="seconds between two rounds of the zombie offset client, 0 for none (3)")
    run.add_argument("--delayed-share", type=_bounded(float, 0, 1), default=0.0, metavar="F",
                     help="share of the unkeyed sends with a delay level 1-3 or a deliver time 1-10 s ahead (0)")
    run.add_argument("--fail-share", type=_bounded(float, 0, 1), default=0.0, metavar="F",
                     help="share of unique ids a concurrent retry group fails: half once, half always "
                          "(to its DLQ); 0 for no retry group (0)")
    run.add_argument("--txn-share", type=_bounded(float, 0, 1), default=0.0, metavar="F",
                     help="share of the unkeyed sends sent in transactions: a quarter each commit, rollback, "
                          "unknown then commit on check-back, unknown then rollback (0); brokers then check "
                          f"back fast unless --set says otherwise ({_TXN_SETTINGS_TEXT})")
    run.add_argument("--max-reconsume-times", type=_bounded(int, 0, 16), default=2,
                     help="the retry group's maxReconsumeTimes (2)")
    run.add_argument("--skew", default=f"{SKEW_DEFAULT[0]:g},{SKEW_DEFAULT[1]:g}", metavar="OFFSET_S,DRIFT_PPM",
                     help="largest clock offset and drift a skew-* fault picks (%(default)s)")
    run.add_argument("--crash-gate", choices=CRASH_GATES, default=None,
                     help="crash faults wait (up to their window's last second) until the newest acknowledged "
                          "message of each group they hit is not fsynced on any victim (all) or on victims making a "
                          "majority of the group (majority), then fire at that instant (default: at the window's "
                          "start)")
    run.add_argument("--plant", action="append", default=[], metavar="NAME",
                     help="TEST ONLY: plant a known defect (chaos plants lists them) to see the audit catch it")

    drill = sub.add_parser("drill", help="kill -9 the leader N rounds; time route change and first ack")
    drill.add_argument("--rounds", type=_bounded(int, 1, 1000), default=10)
    drill.add_argument("--dir", default=None, help="a cluster from `dledger-cluster up --dir DIR` (default: private)")
    drill.add_argument("--producers", type=_bounded(int, 1, 64), default=4)
    drill.add_argument("--rate", type=_bounded(float, 0, 100000), default=0.0,
                       help="sends/s per producer, 0 for as fast as acknowledged (0)")
    drill.add_argument("--steady", type=_bounded(float, 0, 600), default=2.0, help="seconds of load before each kill")
    drill.add_argument("--topic", default="ChaosDrill")
    drill.add_argument("--queues", type=_bounded(int, 1, 1024), default=8)
    drill.add_argument("--group", default=None, help="broker group to drill (default: the first)")
    drill.add_argument("--port-base", type=_port_base, default=DEFAULT_PORT_BASE,
                       help="ports of the private cluster (as chaos run)")
    drill.add_argument("--keep", action="store_true", help="leave the private cluster running")
    drill.add_argument("--json", action="store_true")

    cd = sub.add_parser("compose-drill", help="the drill against docker compose: docker kill, network cut, audit")
    cd.add_argument("--dir", required=True, help="the run directory (new or empty)")
    cd.add_argument("--rounds", type=_bounded(int, 1, 100), default=3, help="leader kills (3)")
    cd.add_argument("--cut-s", type=_bounded(float, 1, 600), default=10.0,
                    help="seconds one follower stays disconnected from the network (10)")
    cd.add_argument("--producers", type=_bounded(int, 1, 64), default=2)
    cd.add_argument("--consumers", type=_bounded(int, 0, 64), default=2)
    cd.add_argument("--rate", type=_bounded(float, 0, 100000), default=50.0, help="sends/s per producer (50)")
    cd.add_argument("--keep", action="store_true", help="leave the compose cluster running")
    cd.add_argument("--no-audit", action="store_true", help="skip the Spark audit")
    cd.add_argument("--fleet", action="store_true",
                    help="three groups (the compose profile 'fleet'): faults hit RaftNode00, the others are measured")

    rolling.add_parser(sub, _bounded, _port_base)  # chaos/rolling.py
    fleet.add_parser(sub, _bounded, _port_base)  # chaos/fleet.py
    replace.add_parser(sub, _bounded, _port_base)  # chaos/replace.py (issue 27 part 4)
    sub.add_parser("faults", help="list the fault names and the standard mix")
    sub.add_parser("plants", help="list the deliberate defects --plant can put in (sensitivity tests)")
    return parser


FLEET_COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "rolling-restart": rolling.run_from_args, "grow-shrink": fleet.run_from_args,
    "replace": replace.run_from_args}


def _skew(text: str) -> tuple[float, float]:
    try:
        offset, drift = (float(x) for x in text.split(","))
    except ValueError:
        raise UsageError(f"--skew takes OFFSET_S,DRIFT_PPM, got {text!r}") from None
    if not (0 <= offset <= 86_400 and 0 <= drift <= 100_000):
        raise UsageError("--skew: offset in 0..86400 s, drift in 0..100000 ppm")
    return offset, drift


def run_options(args: argparse.Namespace) -> RunOptions:
    faults = tuple(expand_faults([f.strip() for f in args.faults.split(",") if f.strip()]))
    if not faults:
        raise UsageError("--faults names no fault")
    for f in faults:
        try:
            make_fault(f)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    if args.crash_gate is not None and not any(part.startswith("crash-") for f in faults for part in f.split("+")):
        raise UsageError("--crash-gate needs a crash-* fault in --faults")
    if args.duration < 2 * args.interval:
        raise UsageError(f"--duration ({args.duration:g}) must hold one fault and one heal window "
                         f"(2 x --interval = {2 * args.interval:g})")
    keyed = args.producers // 2 if args.keyed_producers is None else args.keyed_producers
    if keyed > args.producers:
        raise UsageError("--keyed-producers cannot exceed --producers")
    try:
        toxic_params = parse_toxic_params(args.toxic)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if any("=" not in kv for kv in args.set):
        raise UsageError("--set takes KEY=VALUE")
    try:
        plants.lookup(args.plant)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if not args.no_audit and not audit_available():
        raise UsageError("the audit (spark_jobs.audit) is not installed: pass --no-audit, or install the "
                         "project with its spark extra (bash .ci/setup.sh)")
    seed = args.seed if args.seed is not None else random.randrange(1 << 31)
    return RunOptions(
        run_dir=args.dir, faults=faults, interval_s=args.interval, duration_s=args.duration,
        recovery_s=args.recovery, settle_s=args.settle,
        workload=WorkloadConfig(topic=args.topic, queues=args.queues, producers=args.producers, keyed=keyed,
                                consumers=args.consumers, rate=args.rate, body_bytes=args.body_bytes,
                                zombie_interval_s=args.zombie_interval, delayed_share=args.delayed_share,
                                fail_share=args.fail_share, max_reconsume_times=args.max_reconsume_times,
                                txn_share=args.txn_share),
        groups=args.groups, port_base=args.port_base, flush=args.flush, seed=seed, order=args.order,
        fixed_node=args.fixed_node, toxic_params=toxic_params,
        extra={**(TXN_BROKER_SETTINGS if args.txn_share > 0 else {}), **dict(kv.split("=", 1) for kv in args.set)},
        progress_s=args.progress, audit=not args.no_audit, toxiproxy_server=args.toxiproxy_server,
        plants=tuple(args.plant), sample_interval_s=args.sample_interval, skew=_skew(args.skew),
        crash_gate=args.crash_gate,
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        if args.command == "faults":
            print("\n".join(fault_names()))
            print("a+b[+c]: faults together; standard: " + ",".join(STANDARD_FAULTS))
            return 0
        if args.command == "plants":
            for p in plants.PLANTS.values():
                print(f"{p.name:<26} {p.side:<7} {p.defect}")
            return 0
        if args.command == "run":
            opts = run_options(args)
            find_server_binary(opts.toxiproxy_server)  # before anything starts: a clear message, exit 2
            return asyncio.run(Run(opts).execute())
        if args.command in FLEET_COMMANDS:
            if not args.no_audit and not audit_available():
                raise UsageError("the audit (spark_jobs.audit) is not installed: pass --no-audit")
            return FLEET_COMMANDS[args.command](args)
        if args.command == "compose-drill":
            from chaos.compose import ComposeDrillOptions, run_compose_drill

            if not args.no_audit and not audit_available():
                raise UsageError("the audit (spark_jobs.audit) is not installed: pass --no-audit")
            return asyncio.run(run_compose_drill(ComposeDrillOptions(
                run_dir=args.dir, rounds=args.rounds, cut_s=args.cut_s, producers=args.producers,
                consumers=args.consumers, rate=args.rate, keep=args.keep, audit=not args.no_audit, fleet=args.fleet)))
        opts_d = DrillOptions(rounds=args.rounds, dir=args.dir, producers=args.producers, rate=args.rate,
                              steady_s=args.steady, topic=args.topic, queues=args.queues, group=args.group,
                              port_base=args.port_base, keep=args.keep)
        return asyncio.run(run_drill(opts_d, as_json=args.json))
    except (UsageError, ToxiproxyMissing, DrillError) as exc:
        print(f"chaos: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("chaos: interrupted (every process it started was stopped)", file=sys.stderr)
        return 130
    except Exception as exc:
        logging.getLogger("chaos").exception("failed")
        print(f"chaos: {args.command} failed: {exc}", file=sys.stderr)
        return 1  # a failed run or drill (3 is kept for "compose drill not run: no engine")


if __name__ == "__main__":
    sys.exit(main())
