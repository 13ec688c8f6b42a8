"""The workload's achieved rate in the audit's report (issue 28, evidence 4): from the sends, next to
what ``run.json`` says the run asked and its fault mix needs; a warning when it fell short."""

from __future__ import annotations

from spark_jobs.report import text, workload_figures

SPAN = {"first_invoke_us": 1_000_000_000, "last_complete_us": 1_100_000_000, "sends": 1200, "ok": 1100}


def test_the_achieved_rate_against_the_need_recorded_by_the_run() -> None:
    run = {"workload_rate": {"offered_per_s": 200.0, "needed_ok_per_s": 25.0,
                             "acked_in_fault_windows": [{"fault": "crash-all", "start_s": 0.0, "acked": 3}]}}
    figures, warnings = workload_figures(SPAN, run)
    assert figures["achieved_ok_per_s"] == 11.0 and figures["sends_per_s"] == 12.0 and figures["seconds"] == 100.0
    assert figures["needed_ok_per_s"] == 25.0 and figures["acked_in_fault_windows"][0]["acked"] == 3
    (warning,) = warnings
    assert "11.0 acknowledged sends/s, below the 25.0/s" in warning
    summary = {"run_dir": "r", "verdict": "PASS", "findings": {}, "workload": figures, "warnings": warnings,
               "timings_s": {"total": 1.0}}
    lines = text(summary, "/tmp/out")
    assert "workload: 11.0 acknowledged sends/s (asked 200/s); the fault mix needs >= 25.0/s" in lines
    assert "warning: the workload achieved 11.0" in lines


def test_a_run_that_recorded_no_need_gets_its_rate_and_no_warning() -> None:
    figures, warnings = workload_figures(SPAN, {})
    assert figures["achieved_ok_per_s"] == 11.0 and figures["needed_ok_per_s"] is None and warnings == []
    assert workload_figures({}, {}) == ({"achieved_ok_per_s": None, "sends_per_s": None, "seconds": None,
                                         "offered_per_s": None, "needed_ok_per_s": None,
                                         "acked_in_fault_windows": []}, [])
