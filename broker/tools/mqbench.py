"""``mq-bench produce|consume``: RocketMQ's benchmark/producer.sh and consumer.sh for this cluster.

produce: ``--threads`` asyncio senders share one ``Producer``; each send call (one message, or a
``send_batch`` of ``--batch``) is timed with ``time.perf_counter``. Without ``--rate`` the senders
run closed-loop (send, await, send). With ``--rate`` they are paced open-loop: send call *k* is due
at ``start + k * batch / rate`` whatever happened before, and its RT is measured from when it was
*due*, so a stalled cluster shows up as latency instead of silently lowering the offered load
(coordinated omission). Every message carries ``bench_ts_ns`` (``time.time_ns()`` at send) for
end-to-end latency; ``born_ts`` is set by the SDK.

consume: one ``PushConsumer``; B2C latency = receive time − ``bench_ts_ns`` (``born_ts`` when the
property is absent), S2C = receive time − ``store_ts``; both in wall-clock time, so producer and
consumer should share a host (or synchronised clocks).

Latencies go into ``LatencyHistogram`` (``dledger.apps.stats``, an HdrHistogram): memory stays constant however
long the run. Reports every ``--report-interval`` seconds; a summary at the end (``--json``: one
JSON object on stdout, the periodic lines on stderr); Ctrl-C ends a run early, summary included.
Exit codes: 0 done (failed sends are counted, not fatal), 1 the run could not start or not a single
send succeeded, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import itertools
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any, TextIO

from broker.client.admin import Admin
from broker.client.admin_checks import check_group, check_topic
from broker.client.admin_records import InvalidArgument
from broker.client.transport import ClientError, add_security_arguments, parse_addrs, security_kwargs
from broker.protocol.auth import CredentialsError
from broker.protocol.limits import MESSAGE_BYTES_MAX
from broker.tools.cli import add_namesrv_argument
from broker.tools.cpu_usage import CLIENT, CpuSampler, cluster_processes, parse_pids
from broker.tools.progress import StatusLine, progress_text
from dledger.apps.stats import LatencyHistogram

MAX_MESSAGE_BYTES = MESSAGE_BYTES_MAX  # the protocol's limit on one send's bodies
CONSUME_BATCH_MAX = 32  # messages per listener call: the bench listener is cheap
ERROR_CODES_MAX = 32  # distinct error codes kept; the rest count as OTHER
Clock = Callable[[], float]


# -- pacing -------------------------------------------------------------------------------------------
def due_offset_s(ticket: int, rate_msgs_s: float, batch: int) -> float:
    """Open-loop schedule: when send call ``ticket`` (0, 1, ...) is due, relative to the start."""
    assert rate_msgs_s > 0 and batch >= 1 and ticket >= 0
    return ticket * batch / rate_msgs_s


class Pacer:
    """Hands out send-call tickets and their due times; shared by all senders (one event loop)."""

    def __init__(self, rate_msgs_s: float, batch: int, start_s: float):
        self.rate_msgs_s = rate_msgs_s
        self.batch = batch
        self.start_s = start_s
        self._tickets = itertools.count()

    def next_due_s(self) -> float:
        return self.start_s + due_offset_s(next(self._tickets), self.rate_msgs_s, self.batch)


# -- statistics ---------------------------------------------------------------------------------------
class Stats:
    """Counters and histograms of one run: the whole run and the current report interval.
    ``record_*`` may be called from SDK threads (a consumer's listener): one lock guards it all."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # Each value is counted once, in its interval; an interval joins the whole run's when it
        # is taken (``take_interval``), and ``total`` is that plus the interval not taken yet.
        self._taken = LatencyHistogram()
        self.interval = LatencyHistogram()
        self._taken2 = LatencyHistogram()  # the consumer's S2C
        self.interval2 = LatencyHistogram()
        self.msgs = 0
        self.calls = 0
        self.interval_msgs = 0
        self.send_failed = 0  # no answer: timeouts, refused or lost connections, client errors
        self.response_failed = 0  # the broker answered an error, or a status other than SEND_OK
        self.errors: dict[str, int] = {}

    @property
    def total(self) -> LatencyHistogram:
        """The whole run so far."""
        with self._lock:
            return _merged(self._taken, self.interval)

    @property
    def total2(self) -> LatencyHistogram:
        with self._lock:
            return _merged(self._taken2, self.interval2)

    def record_ok(self, rt_s: float, msgs: int) -> None:
        with self._lock:
            self.interval.record_s(rt_s)
            self.msgs += msgs
            self.calls += 1
            self.interval_msgs += msgs

    def record_consumed(self, b2c_us: int, s2c_us: int | None) -> None:
        with self._lock:
            self.interval.record_us(b2c_us)
            if s2c_us is not None:
                self.interval2.record_us(s2c_us)
            self.msgs += 1
            self.interval_msgs += 1

    def record_error(self, code: str, answered: bool) -> None:
        with self._lock:
            self.calls += 1
            if answered:
                self.response_failed += 1
            else:
                self.send_failed += 1
            if code not in self.errors and len(self.errors) >= ERROR_CODES_MAX:
                code = "OTHER"
            self.errors[code] = self.errors.get(code, 0) + 1

    def take_interval(self) -> tuple[int, LatencyHistogram, LatencyHistogram]:
        """The interval's message count and histograms; starts a new interval."""
        with self._lock:
            out = (self.interval_msgs, self.interval, self.interval2)
            self._taken.merge(self.interval)
            self._taken2.merge(self.interval2)
            self.interval_msgs, self.interval, self.interval2 = 0, LatencyHistogram(), LatencyHistogram()
            return out


def _merged(a: LatencyHistogram, b: LatencyHistogram) -> LatencyHistogram:
    out = LatencyHistogram()
    out.merge(a)
    out.merge(b)
    return out


def classify_error(exc: BaseException) -> tuple[str, bool]:
    """(code, answered): ``answered`` when the broker replied (an HTTP status), else the send failed."""
    code = getattr(exc, "code", None)
    status = getattr(exc, "status", 0)
    return (str(code) if code else type(exc).__name__), bool(isinstance(status, int) and status > 0)


def end_to_end_us(msg: Any, now_ns: int) -> tuple[int, int | None]:
    """(B2C, S2C) of a received message in µs: now − ``bench_ts_ns`` (``born_ts`` without it), and
    now − ``store_ts`` (None when unknown)."""
    sent_ns = (getattr(msg, "properties", None) or {}).get("bench_ts_ns")
    if sent_ns is not None and str(sent_ns).isdigit():
        b2c_us = (now_ns - int(sent_ns)) // 1000
    else:
        b2c_us = (now_ns // 1_000_000 - int(getattr(msg, "born_ts", 0) or 0)) * 1000
    store_ts = getattr(msg, "store_ts", None)
    s2c_us = (now_ns // 1_000_000 - int(store_ts)) * 1000 if store_ts else None
    return b2c_us, s2c_us


def _now_text(now_s: float | None = None) -> str:
    dt = datetime.datetime.fromtimestamp(time.time() if now_s is None else now_s)
    return dt.strftime("%Y-%m-%d %H:%M:%S,") + f"{dt.microsecond // 1000:03d}"


def format_send_report(
    tps: float, h: LatencyHistogram, send_failed: int, response_failed: int, now_s: float | None = None
) -> str:
    return (
        f"Current Time: {_now_text(now_s)} | Send TPS: {tps:.0f} | Max RT(ms): {h.max_ms():.3f} | "
        f"Average RT(ms): {h.mean_ms():.3f} | p99 RT(ms): {h.percentile_ms(99):.3f} | "
        f"Send Failed: {send_failed} | Response Failed: {response_failed}"
    )


def format_consume_report(
    tps: float, b2c: LatencyHistogram, s2c: LatencyHistogram, now_s: float | None = None
) -> str:
    return (
        f"Current Time: {_now_text(now_s)} | Consume TPS: {tps:.0f} | Average(B2C) RT(ms): {b2c.mean_ms():.3f} | "
        f"Max(B2C) RT(ms): {b2c.max_ms():.3f} | p99(B2C) RT(ms): {b2c.percentile_ms(99):.3f} | "
        f"Average(S2C) RT(ms): {s2c.mean_ms():.3f} | Max(S2C) RT(ms): {s2c.max_ms():.3f}"
    )


def format_summary(summary: dict[str, Any]) -> str:
    rt = summary["rt_ms"]
    what = "Send" if summary["mode"] == "produce" else "Consume"
    lines = [
        f"{what} summary: {summary['messages']} msgs in {summary['elapsed_s']:.2f} s, TPS {summary['tps']:.1f}",
        f"{'RT' if what == 'Send' else 'B2C RT'}(ms): avg {rt['avg']:.3f} | p50 {rt['p50']:.3f} | "
        f"p99 {rt['p99']:.3f} | max {rt['max']:.3f}",
    ]
    if what == "Send":
        errors = ", ".join(f"{k}={v}" for k, v in sorted(summary["errors"].items())) or "none"
        lines.append(
            f"Send calls: {summary['calls']} | Send Failed: {summary['send_failed']} | "
            f"Response Failed: {summary['response_failed']} | Errors: {errors}"
        )
    else:
        s2c = summary["s2c_ms"]
        lines.append(f"S2C RT(ms): avg {s2c['avg']:.3f} | p99 {s2c['p99']:.3f} | max {s2c['max']:.3f}")
    for name, cpu in sorted(summary.get("cpu", {}).items()):
        spent = "?" if cpu["cpu_s"] is None else f"{cpu['cpu_s']:.2f} s"
        per = "?" if cpu["cpu_us_per_msg"] is None else f"{cpu['cpu_us_per_msg']:.1f} µs/msg"
        lines.append(f"CPU {name} (pid {cpu['pid']}): {spent}, {per}")
    return "\n".join(lines)


# -- running ------------------------------------------------------------------------------------------
def load_sdk() -> Any:
    """The producer/consumer SDK, imported only when a run needs it."""
    from broker.client import Message, Producer, PushConsumer, SendStatus

    return SimpleNamespace(Message=Message, Producer=Producer, PushConsumer=PushConsumer, SendStatus=SendStatus)


async def preflight(admin: Admin, topic: str, err: TextIO) -> None:
    """Fail fast when no NameServer answers. A missing topic is fine: a producer sends where the
    brokers auto-create it (4 read / 4 write queues, perm 6); a consumer waits for it."""
    try:
        await admin.topic_route(topic)
    except ClientError as exc:
        if exc.code != "TOPIC_NOT_EXIST":
            raise
        print(
            f"topic {topic} has no route yet: the brokers create it on the first send", file=err, flush=True
        )


async def checked_security(args: argparse.Namespace, err: TextIO) -> dict[str, Any]:
    """The run's security arguments for the SDK, once ``preflight`` found a NameServer with them."""
    security = security_kwargs(args)
    admin = Admin(args.namesrv, **security)
    try:
        await preflight(admin, args.topic, err)
    finally:
        await admin.close()
    return security


def stop_on_sigint(stop: asyncio.Event) -> Callable[[], None]:
    """Ctrl-C ends the run early (the summary still prints); returns the undo. Outside the main
    thread (tests calling ``run_*`` from a helper thread) there is no handler."""
    loop = asyncio.get_running_loop()
    try:
        loop.add_signal_handler(signal.SIGINT, stop.set)
    except (NotImplementedError, RuntimeError, ValueError):
        return lambda: None

    def undo() -> None:
        loop.remove_signal_handler(signal.SIGINT)

    return undo


STATUS_EVERY_S = 0.5  # the live status line's refresh on a terminal


async def _report_loop(
    interval_s: float,
    line: Callable[[float], str],
    out: TextIO,
    clock: Clock,
    status: Callable[[], str] | None = None,
) -> None:
    """A report line every ``interval_s``; on a terminal also a live status line (``status()``:
    count, rate, elapsed, ETA) refreshed every ``STATUS_EVERY_S``, kept below the report lines."""
    sl = StatusLine(out) if status is not None else StatusLine(out, live=False)
    last = next_status = clock()
    try:
        while True:
            next_report = last + interval_s
            if sl.live and status is not None:
                next_status += STATUS_EVERY_S
                await asyncio.sleep(max(0.0, min(next_status, next_report) - clock()))
            else:
                await asyncio.sleep(max(0.0, next_report - clock()))
            now = clock()
            if now >= next_report:
                sl.println(line(max(now - last, 1e-9)))
                last = now
            if sl.live and status is not None:
                sl.update(status())
    finally:
        sl.close()


async def run_produce(
    args: argparse.Namespace,
    *,
    sdk: Any = None,
    clock: Clock = time.perf_counter,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    report_out = err if args.json else out
    sdk = sdk or load_sdk()
    security = await checked_security(args, err)
    producer_kw: dict[str, Any] = {"batch_max_delay_ms": args.batch_delay_ms}
    http_transport = None
    if args.transport == "http":  # the SDK's default is the binary protocol where brokers advertise it
        from broker.client.transport import Transport

        http_transport = producer_kw["transport"] = Transport(args.timeout, protocol="http", **security)
    cpu = _cpu_sampler(args)
    producer = sdk.Producer("benchmark_producer", args.namesrv, send_timeout_s=args.timeout, **security,
                            **producer_kw)
    await producer.start()
    stats = Stats()
    stop = asyncio.Event()
    body = (b"0123456789abcdefghijklmnopqrstuvwxyz" * (args.size // 36 + 1))[: args.size]
    start = clock()
    deadline = start + args.duration
    pacer = Pacer(args.rate, args.batch, start) if args.rate else None

    send_ok = getattr(getattr(sdk, "SendStatus", None), "SEND_OK", None)

    def make() -> Any:
        return sdk.Message(args.topic, body, properties={"bench_ts_ns": str(time.time_ns())})

    async def sender() -> None:
        while True:
            if pacer is not None:
                t0 = pacer.next_due_s()
                if t0 >= deadline:
                    return
                while (delay := t0 - clock()) > 0 and not stop.is_set():
                    await asyncio.sleep(min(delay, 0.25))  # at low rates a ticket may be far ahead
            else:
                t0 = clock()
                if t0 >= deadline:
                    return
            if stop.is_set():
                return
            try:
                if args.batch == 1:
                    result = await producer.send(make(), timeout_s=args.timeout)
                else:
                    result = await producer.send_batch(
                        [make() for _ in range(args.batch)], timeout_s=args.timeout
                    )
            except Exception as exc:
                stats.record_error(*classify_error(exc))
                continue
            status = result.status  # the SDK's own SEND_OK member (its name is SEND_OK), else by name
            if status is not send_ok and (status := str(getattr(status, "name", status))) != "SEND_OK":
                stats.record_error(status, True)
            else:
                stats.record_ok(clock() - t0, args.batch)

    def line(elapsed_s: float) -> str:
        n, h, _ = stats.take_interval()
        return format_send_report(n / elapsed_s, h, stats.send_failed, stats.response_failed)

    def status() -> str:
        failed = f"failed {stats.send_failed + stats.response_failed}"
        return progress_text(stats.msgs, "msgs", clock() - start, args.duration, failed)

    reporter = asyncio.create_task(_report_loop(args.report_interval, line, report_out, clock, status))
    undo_sigint = stop_on_sigint(stop)
    try:
        await asyncio.gather(*(sender() for _ in range(args.threads)))
    finally:
        undo_sigint()
        reporter.cancel()
        await asyncio.gather(reporter, return_exceptions=True)  # its status line is cleared first
        elapsed = clock() - start
        if not stop.is_set():  # paced senders end at their last due time, before the deadline
            elapsed = max(elapsed, args.duration)
        await producer.shutdown()
        if http_transport is not None:
            await http_transport.close()
    summary = {
        "mode": "produce",
        "topic": args.topic,
        "threads": args.threads,
        "size": args.size,
        "batch": args.batch,
        "rate": args.rate,
        "duration_s": args.duration,
        "elapsed_s": round(elapsed, 3),
        "messages": stats.msgs,
        "calls": stats.calls,
        "tps": round(stats.msgs / elapsed, 1),
        "rt_ms": stats.total.summary_ms(),
        "send_failed": stats.send_failed,
        "response_failed": stats.response_failed,
        "errors": dict(stats.errors),
        "transport": args.transport,
        "batch_delay_ms": args.batch_delay_ms,
    }
    _add_cpu(summary, cpu, stats.msgs)
    print(json.dumps(summary) if args.json else format_summary(summary), file=out, flush=True)
    return 1 if stats.msgs == 0 and stats.errors else 0


def _cpu_sampler(args: argparse.Namespace) -> tuple[CpuSampler, set[str]]:
    """CPU time of every process of the run, started now: this client always, and the processes
    of ``--cpu-dir`` (brokers and NameServers) and ``--cpu-pids``. Also returns the names that are
    brokers (reported again under ``broker_cpu``)."""
    procs: dict[str, int] = {CLIENT: os.getpid()}
    brokers: set[str] = set()
    if getattr(args, "cpu_dir", None):
        found = cluster_processes(args.cpu_dir, kinds=("broker", "node"))
        brokers.update(found)
        procs.update(found)
        procs.update(cluster_processes(args.cpu_dir, kinds=("namesrv",)))
    if getattr(args, "cpu_pids", None):
        pids = parse_pids(args.cpu_pids)
        brokers.update(pids)
        procs.update(pids)
    sampler = CpuSampler(procs)
    sampler.start()
    return sampler, brokers


def _add_cpu(summary: dict[str, Any], sampled: tuple[CpuSampler, set[str]], messages: int) -> None:
    """``cpu``: every process (the client included), µs per message; ``broker_cpu``: the brokers
    (``--cpu-dir``, ``--cpu-pids``) of it, as before."""
    sampler, brokers = sampled
    cpu = sampler.stop(messages)
    summary["cpu"] = cpu
    if brokers:
        summary["broker_cpu"] = {name: c for name, c in cpu.items() if name in brokers}


async def run_consume(
    args: argparse.Namespace,
    *,
    sdk: Any = None,
    clock: Clock = time.perf_counter,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    report_out = err if args.json else out
    sdk = sdk or load_sdk()
    stats = Stats()

    # A drain's rate: messages after the first listener call over the time from it to the latest.
    span: dict[str, float] = {}

    async def listener(msgs: Sequence[Any], ctx: Any) -> str:
        # async: runs on the consumer's loop, no thread-pool hop per batch
        now_ns = time.time_ns()
        for m in msgs:
            stats.record_consumed(*end_to_end_us(m, now_ns))
        if not span:
            span.update(first=clock(), first_msgs=stats.msgs)
        span["last"] = clock()
        return "CONSUME_SUCCESS"

    security = await checked_security(args, err)
    cpu = _cpu_sampler(args)
    consumer = sdk.PushConsumer(
        args.group,
        args.namesrv,
        message_model=args.model,
        consume_from=args.from_,
        consume_batch_max=CONSUME_BATCH_MAX,
        read_from_followers=args.read_from_followers,
        **security,
    )
    consumer.subscribe(args.topic, "*")
    consumer.register_listener(listener)
    await consumer.start()
    start = clock()

    def line(elapsed_s: float) -> str:
        n, b2c, s2c = stats.take_interval()
        return format_consume_report(n / elapsed_s, b2c, s2c)

    def status() -> str:
        return progress_text(stats.msgs, "msgs", clock() - start, args.duration)

    reporter = asyncio.create_task(_report_loop(args.report_interval, line, report_out, clock, status))
    stop = asyncio.Event()
    undo_sigint = stop_on_sigint(stop)
    try:
        await asyncio.wait_for(stop.wait(), args.duration)
    except TimeoutError:
        pass
    finally:
        undo_sigint()
        reporter.cancel()
        await asyncio.gather(reporter, return_exceptions=True)  # its status line is cleared first
        elapsed = clock() - start
        await consumer.shutdown()
    summary = {
        "mode": "consume",
        "topic": args.topic,
        "group": args.group,
        "model": args.model,
        "from": args.from_,
        "duration_s": args.duration,
        "elapsed_s": round(elapsed, 3),
        "messages": stats.msgs,
        "tps": round(stats.msgs / elapsed, 1),
        "rt_ms": stats.total.summary_ms(),
        "s2c_ms": stats.total2.summary_ms(),
    }
    active_s = span.get("last", 0.0) - span.get("first", 0.0)
    if active_s > 0:  # from the first listener call to the latest: the rate while messages flowed
        summary["active_s"] = round(active_s, 3)
        summary["active_tps"] = round((stats.msgs - span["first_msgs"]) / active_s, 1)
    _add_cpu(summary, cpu, stats.msgs)
    print(json.dumps(summary) if args.json else format_summary(summary), file=out, flush=True)
    return 0


# -- the command line ---------------------------------------------------------------------------------
def _positive(kind: type, hi: float | None = None) -> Callable[[str], Any]:
    def parse(value: str) -> Any:
        try:
            x = kind(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a {kind.__name__}, got {value!r}") from None
        if not x > 0 or (hi is not None and x > hi):
            raise argparse.ArgumentTypeError(
                f"expected a value in (0, {hi}], got {value!r}"
                if hi
                else f"expected a value > 0, got {value!r}"
            )
        return x

    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mq-bench",
        description="Benchmark a DLedger-mode cluster (RocketMQ's benchmark/producer.sh and consumer.sh).",
    )
    sub = parser.add_subparsers(
        dest="command", metavar="produce|consume|failover|stability|versus-nats|transaction|hop-floor"
    )

    def common(p: argparse.ArgumentParser) -> None:
        add_namesrv_argument(p)
        p.add_argument("-t", "--topic", default="BenchmarkTest")
        p.add_argument("--duration", type=_positive(float), default=30.0, help="seconds (default 30)")
        p.add_argument(
            "--report-interval",
            dest="report_interval",
            type=_positive(float),
            default=5.0,
            help="seconds between report lines (default 5)",
        )
        p.add_argument("--json", action="store_true", help="one JSON summary on stdout; reports on stderr")
        p.add_argument("--cpu-dir", dest="cpu_dir", metavar="DIR", default=None,
                       help="also report the CPU of every process of the dledger-cluster in DIR (brokers, "
                            "NameServers; its cluster.json); this client's own CPU is always reported")
        p.add_argument("--cpu-pids", dest="cpu_pids", metavar="NAME=PID,...", default=None,
                       help="also report the CPU of these (broker) processes")
        add_security_arguments(p)

    p = sub.add_parser("produce", help="send messages as fast as allowed; report TPS and RT")
    common(p)
    p.add_argument(
        "-w", "--threads", type=_positive(int, 10_000), default=64, help="concurrent senders (default 64)"
    )
    p.add_argument(
        "-s", "--size", type=_positive(int, MAX_MESSAGE_BYTES), default=1024, help="body bytes (default 1024)"
    )
    p.add_argument(
        "--batch", type=_positive(int, 1024), default=1, help="messages per send_batch (default 1)"
    )
    p.add_argument(
        "--rate",
        type=_positive(float),
        default=None,
        help="total msgs/s, paced open-loop (default: unlimited, closed-loop)",
    )
    p.add_argument("--timeout", type=_positive(float), default=3.0, help="seconds per send (default 3)")
    p.add_argument("--transport", choices=("binary", "http"), default="binary",
                   help="binary: the brokers' binary protocol where routes advertise it (the SDK's default); "
                        "http: HTTP only")
    p.add_argument("--batch-delay-ms", dest="batch_delay_ms", type=float, default=1.0,
                   help="the producer's auto-batching linger (default 1; 0 = off)")
    p = sub.add_parser("consume", help="consume with a push consumer; report TPS and end-to-end latency")
    common(p)
    p.add_argument("-g", "--group", default="benchmark_consumer")
    p.add_argument("--model", choices=("CLUSTERING", "BROADCASTING"), default="CLUSTERING")
    p.add_argument("--from", dest="from_", choices=("FIRST", "LAST"), default="LAST")
    p.add_argument("--read-from-followers", dest="read_from_followers", action="store_true",
                   help="pull committed messages from a follower first (RocketMQ's slave read)")
    from broker.tools.failover_bench import add_parser as add_failover

    add_failover(sub, _positive)
    from broker.tools.group_failover_bench import add_parser as add_group_failover

    add_group_failover(sub, _positive)
    from broker.tools.stability_bench import add_parser as add_stability

    add_stability(sub, _positive)
    from broker.tools.versus_bench import add_parser as add_versus

    add_versus(sub, _positive)
    from broker.tools.txn_bench import add_parser as add_transaction

    add_transaction(sub, _positive)
    from broker.tools.hop_floor import add_parser as add_hop_floor

    add_hop_floor(sub, _positive)
    return parser


def run_loop(coro: Any) -> int:
    """uvloop when installed (less client CPU per send, so the broker gets the cores), else asyncio."""
    try:
        import uvloop
    except ImportError:
        return int(asyncio.run(coro))
    return int(uvloop.run(coro))


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    if args.command == "versus-nats":
        from broker.tools.versus_bench import run_versus

        return run_versus(args)
    if args.command == "hop-floor":
        from broker.tools.hop_floor import run_hop_floor

        return run_hop_floor(args)
    if args.command == "stability":
        from broker.tools.stability_bench import run_stability

        return run_loop(run_stability(args))
    if args.command == "transaction":
        from broker.tools.txn_bench import run_transaction

        return run_loop(run_transaction(args))
    if args.command == "group-failover":
        from broker.tools.group_failover_bench import run_group_failover

        if args.groups < 2:
            print("mq-bench group-failover: --groups must be at least 2 (one to fail, others to watch)",
                  file=sys.stderr)
            return 2
        try:
            return run_loop(run_group_failover(args))
        except KeyboardInterrupt:
            return 130
    if args.command == "failover":
        from broker.tools.failover_bench import run_failover

        try:
            return run_loop(run_failover(args))
        except KeyboardInterrupt:
            return 130
    try:
        check_topic(args.topic)
        if args.command == "consume":
            check_group(args.group)
        elif args.size * args.batch > MAX_MESSAGE_BYTES:
            raise InvalidArgument("INVALID_BODY", f"--size x --batch must be <= {MAX_MESSAGE_BYTES} bytes")
        try:
            parse_addrs(args.namesrv)
        except ValueError as exc:
            raise InvalidArgument("INVALID_ADDRESS", str(exc)) from None
        try:
            security_kwargs(args)
        except CredentialsError as exc:
            raise InvalidArgument("BAD_CREDENTIALS", str(exc)) from None
        if args.command in ("produce", "consume"):
            try:
                _cpu_sampler(args)
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise InvalidArgument("INVALID_CPU_PROCESSES", f"--cpu-dir/--cpu-pids: {exc}") from None
    except InvalidArgument as exc:
        print(f"mq-bench {args.command}: {exc}", file=sys.stderr)
        return 2
    runner = run_produce if args.command == "produce" else run_consume
    try:
        return run_loop(runner(args))
    except KeyboardInterrupt:
        return 130
    except ImportError as exc:
        print(
            f"mq-bench {args.command}: SDK_UNAVAILABLE: the client SDK cannot be imported: {exc}",
            file=sys.stderr,
        )
        return 1
    except Exception as exc:
        if not isinstance(getattr(exc, "code", None), str):  # not a typed client failure: a bug
            raise
        print(f"mq-bench {args.command}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
