"""A run's summary as the terminal shows it (fedsim.results.report)."""

from __future__ import annotations

from typing import Any

from fedsim.results.report import format_duration, format_summary, format_value
from fedsim.results.values import Summary

SUMMARY: dict[str, Any] = {
    "status": "completed", "stop_reason": "time_budget", "algorithm": "fedasync",
    "clients": 20, "updates": 7, "emulated_seconds": 3.0, "real_seconds": 6.25,
    "final_accuracy": 0.5, "best_accuracy": None,
    "staleness": {"mean": 1.0, "p50": 1.0, "p99": 2.0, "max": 3, "count": 7},
    "transfer": {"down": {"messages": 9, "p50_ms": 250.2, "p95_ms": 281.0,
                          "mean_bytes": 56921, "configured_delay_ms": 50.0},
                 "up": {"messages": 7, "p50_ms": 249.8, "p95_ms": 300.4,
                        "mean_bytes": 56933, "configured_delay_ms": 80.0}},
    "fidelity": {"verdict": "fail", "lateness_ms": {"p50": 0.1, "p99": 0.5},
                 "reasons": ["lateness p99 0.5 ms"], "suggested_dilation": 2.0},
    "lost_work": {"runs": 2, "by_reason": {"non_finite": 1, "error": 1},
                  "by_client": {"0": {"error": 1}, "5": {"non_finite": 1}},
                  "clients": [0, 5]},
    "phases": {"compute": {"real": {"n": 4, "p50": 0.0091, "p99": 0.0153},
                           "budget": {"n": 4, "p50": 0.04, "p99": 0.04}},
               "evaluation": {"round_trip": {"n": 2, "p50": 1.5, "p99": 150.0}}},
}


def test_format_summary_gives_the_lines_the_terminal_shows() -> None:
    assert format_summary(SUMMARY, "runs/qs") == [
        "fedasync on 20 clients: completed (time_budget)",
        "  final accuracy   0.5000  (best -)",
        "  updates          7 in 3.0 emulated s (6.2 real s)",
        "  staleness        mean 1.00  p50 1  p99 2  max 3  (as it really occurred)",
        "  transfer         down p50 250 ms, p95 281 ms; up p50 250 ms, p95 300 ms per model "
        "message (57 KB; configured one-way delay down 50 ms, up 80 ms)",
        "  fidelity         fail: lateness p50 0.100 ms, p99 0.500 ms; 0 compute overruns",
        "    fail: lateness p99 0.5 ms",
        "    suggested dilation 2.0 (fedsim run --dilation 2)",
        "  lost work        2 client run(s) failed (error 1, non_finite 1); dropped: "
        "client(s) 0,5; see summary.json lost_work",
        "  where time went  p50 / p99 / n (real time unless marked emulated)",
        "    transfer       down 250 ms / 281 ms / 9; up 250 ms / 300 ms / 7 "
        "(emulated; p50 / p95 / n)",
        "    compute        real 9.1 ms / 15.3 ms / 4; budget 40 ms / 40 ms / 4 "
        "(budget: emulated)",
        "    evaluation     round trip 1.5 s / 150 s / 2",
        "  run directory    runs/qs",
    ]
    # a Summary reads the same as its mapping
    assert format_summary(Summary(SUMMARY), "runs/qs") == format_summary(SUMMARY, "runs/qs")


def test_a_bare_summary_shows_only_what_it_has() -> None:
    bare = {"status": "interrupted", "algorithm": "fedavg", "clients": 2, "updates": 0,
            "emulated_seconds": 0.0, "real_seconds": 1.0}
    assert format_summary(bare) == [
        "fedavg on 2 clients: interrupted",
        "  final accuracy   -  (best -)",
        "  updates          0 in 0.0 emulated s (1.0 real s)",
        "  fidelity         None: lateness p50 - ms, p99 - ms; 0 compute overruns",
    ]


def test_values_and_durations_are_formatted_in_the_unit_that_suits_them() -> None:
    assert [format_value(None), format_value(0.25), format_value(1.23456, ".3g")] == [
        "-", "0.2500", "1.23"]
    assert [format_duration(v) for v in (None, 2.1e-5, 0.0153, 4.567, 150.0)] == [
        "-", "21 us", "15.3 ms", "4.57 s", "150 s"]


def test_staleness_quantiles_read_as_the_figure_and_compare_give_them() -> None:
    """p99 of whole staleness values is interpolated (8.09): shown so, not rounded to 8;
    a whole one stays whole. A failing verdict with no suggestion (no verdict computed)
    has no suggestion line."""
    s = {**SUMMARY, "staleness": {"mean": 6.5, "p50": 7.0, "p99": 8.09, "max": 11, "count": 9},
         "fidelity": {"verdict": "fail", "lateness_ms": {}, "reasons": []}}
    lines = format_summary(s)
    assert "  staleness        mean 6.50  p50 7  p99 8.09  max 11  (as it really occurred)" \
        in lines
    assert not any("suggested dilation" in line for line in lines)
    rounds = format_summary({**SUMMARY, "algorithm": "dga", "updates": 152, "rounds": 19})
    assert "  updates          152 (19 rounds) in 3.0 emulated s (6.2 real s)" in rounds
