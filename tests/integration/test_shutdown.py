"""Clean shutdown: Ctrl-C, and a crashed client host in a run that ends normally.

Each test runs ``fedsim run`` as its own process group and checks that it
exits, leaves readable results, and leaves no process behind. (The run with
a crashed host also stands for a normal end: it completes, prints its
summary and leaves no process.)
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from fedsim.results.writer import read_events, read_metrics

from .conftest import assert_no_orphans, fedsim, finish, wait_for, wait_for_events, write_scenario

pytestmark = pytest.mark.timeout(180)

ASYNC = """
[algorithm]
name = "fedasync"
concurrency = 4
[eval]
every_updates = 4
"""


def test_ctrl_c_stops_cleanly_and_keeps_results(tmp_path: Path) -> None:
    path = write_scenario(tmp_path, ASYNC)
    out = tmp_path / "run"
    proc = fedsim("run", str(path), "--out", str(out), "--no-progress", "--no-plots",
                  "--set", "run.time_budget=600")
    endpoints = wait_for(out / "endpoints.json")
    wait_for_events(out, "aggregate", count=5)
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
    code, _, stderr = finish(proc, timeout=60)
    assert code == 130, stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "interrupted"
    assert summary["updates"] >= 5
    assert read_metrics(out / "metrics.csv")
    events = list(read_events(out / "events.jsonl"))
    assert events[-1]["ev"] == "end"
    assert_no_orphans(endpoints["run_id"])


def test_crashed_client_host_is_survived(tmp_path: Path) -> None:
    path = write_scenario(tmp_path, ASYNC)
    out = tmp_path / "run"
    proc = fedsim("run", str(path), "--out", str(out), "--no-progress", "--no-plots",
                  "--set", "deploy.hosts=2", "--set", "run.time_budget=8")
    endpoints = wait_for(out / "endpoints.json")
    wait_for_events(out, "aggregate", count=5)
    victim = endpoints["hosts"]["host-1"]["pid"]
    os.kill(victim, signal.SIGKILL)
    code, stdout, stderr = finish(proc)
    assert code == 0, stderr[-2000:]
    assert "final accuracy" in stdout
    assert str(out) in stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert [f["host"] for f in summary["host_failures"]] == ["host-1"]
    lost = set(endpoints["hosts"]["host-1"]["clients"])
    events = list(read_events(out / "events.jsonl"))
    assert any(e["ev"] == "host_lost" for e in events)
    t_lost = next(e["t"] for e in events if e["ev"] == "host_lost")
    # no task is sent to a lost client after the loss is noticed
    assert not [e for e in events if e["ev"] == "send" and e.get("dir") == "down"
                and e["client"] in lost and e["t"] > t_lost + 1e-3]
    assert_no_orphans(endpoints["run_id"])
