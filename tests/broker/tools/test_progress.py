"""Progress of long-running commands: the live status line on a terminal (rate, elapsed, ETA), plain
report lines elsewhere; ``mq-bench produce`` with a terminal-like and a plain stdout against the
in-process cluster's NameServer (the sends go to a scripted producer)."""

from __future__ import annotations

import io
from typing import Any

from broker.tools.mqbench import build_parser, run_produce
from broker.tools.progress import CLEAR, StatusLine, format_eta, progress_text
from tests.broker.inproc_cluster import InProcBrokerCluster
from tests.broker.tools.test_mqbench import FakeProducer, fake_sdk


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_text_and_eta() -> None:
    assert format_eta(5) == "00:05" and format_eta(3725) == "1:02:05" and format_eta(-3) == "00:00"
    assert progress_text(12345, "msgs", 10.0, 30.0, "failed 0") == (
        "12,345 msgs | 1,234 msgs/s | 00:10 / 00:30 | ETA 00:20 | failed 0"
    )
    assert progress_text(0, "checks", 0.0, None) == "0 checks | 0 checks/s | 00:00"


def test_status_line_on_a_terminal_and_elsewhere() -> None:
    tty = Terminal()
    sl = StatusLine(tty)
    assert sl.live
    sl.update("1 msgs")
    sl.println("report line")
    sl.update("2 msgs")
    sl.close()
    assert tty.getvalue() == f"{CLEAR}1 msgs{CLEAR}report line\n1 msgs{CLEAR}2 msgs{CLEAR}"
    plain = io.StringIO()
    sl = StatusLine(plain)
    assert not sl.live
    sl.update("1 msgs")
    sl.println("report line")
    sl.close()
    assert plain.getvalue() == "report line\n"


async def test_mq_bench_shows_a_live_line_only_on_a_terminal(cluster: InProcBrokerCluster) -> None:
    argv = ["produce", "-n", cluster.namesrv_addr, "--rate", "200", "--duration", "1.2", "--report-interval", "0.5"]
    tty = Terminal()
    assert await run_produce(build_parser().parse_args(argv), sdk=fake_sdk(FakeProducer()), out=tty,
                             err=io.StringIO()) == 0
    text = tty.getvalue()
    live = [part for part in text.split(CLEAR) if "ETA" in part]
    assert live, text
    assert " / 00:01 | ETA 00:0" in live[-1] and "msgs/s" in live[-1] and "failed" in live[-1]
    # the report lines and the summary stay whole lines, and the live line is gone at the end
    final = text.split(CLEAR)[-1]
    assert final.startswith("Send summary:") or "Send summary:" in final, final
    assert "Send TPS:" in text
    plain = io.StringIO()
    assert await run_produce(build_parser().parse_args(argv), sdk=fake_sdk(FakeProducer()), out=plain,
                             err=io.StringIO()) == 0
    assert "\r" not in plain.getvalue() and "ETA" not in plain.getvalue()
    assert "Send TPS:" in plain.getvalue() and "Send summary:" in plain.getvalue()


def test_chaos_progress_line_names_the_eta() -> None:
    from chaos.runner import progress_line
    from chaos.schedule import Window

    counts = {"ok": 10, "fail": 0, "unknown": 1, "receipts": 9}
    line = progress_line(42.2, "kill-leader", Window(40, 50, "kill-leader"), 99.5, counts, {"RaftNode00": "b-n1"},
                         total_s=120)
    assert line.endswith("| leader RaftNode00=n1 | ETA 01:18"), line
    assert "ETA" not in progress_line(1, None, None, 0, counts, {})


async def test_chaos_run_progress_on_a_terminal(tmp_path: Any) -> None:
    """``Run._progress`` with stand-ins for the cluster and the workload: a live line each second
    (elapsed / total, ETA) below the plain lines on a terminal; only the plain lines elsewhere."""
    import asyncio
    from types import SimpleNamespace

    from chaos.faults import STANDARD_FAULTS
    from chaos.runner import Run, RunOptions

    counters = SimpleNamespace(sends=0, ok=0, fail=0, unknown=0)
    counters.snapshot = lambda: {"ok": counters.ok, "fail": 0, "unknown": 0, "receipts": 0}
    workload: Any = SimpleNamespace(counters=counters, flush=lambda: None)
    target: Any = SimpleNamespace(members=lambda: [])
    opts = RunOptions(str(tmp_path), (STANDARD_FAULTS[0],), interval_s=1, duration_s=3, recovery_s=1,
                      progress_s=1.5)
    for out, live in ((Terminal(), True), (io.StringIO(), False)):
        run = Run(opts, out=out)
        loop = asyncio.get_running_loop()
        task = asyncio.create_task(run._progress(loop.time(), workload, target))
        for _ in range(12):  # ~2.4 s of sends
            counters.sends += 10
            counters.ok += 10
            await asyncio.sleep(0.2)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        text = out.getvalue()
        plain = [line for line in text.replace(CLEAR, "\n").splitlines() if line.startswith("[")]
        assert plain and "ETA 00:0" in plain[0], text
        if live:
            assert any(p.startswith("chaos run 00:0") and "/ 00:04 | ETA" in p for p in text.split(CLEAR)), text
            assert text.endswith(CLEAR)  # the live line is cleared when the progress ends
        else:
            assert "\r" not in text


def test_chaos_drill_status_line() -> None:
    from chaos.drill import drill_status

    assert drill_status(1, 5, "steady load", 10, 4.0, []) == "drill round 1/5 | 00:04 | steady load | acks 10"
    line = drill_status(3, 5, "checking", 900, 41.0, [20.0, 22.0])
    assert line == "drill round 3/5 | 00:41 | ETA 01:04 | checking | acks 900"  # 5 x 21 s - 41 s
