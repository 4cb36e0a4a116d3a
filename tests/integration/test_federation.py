"""Small federations through real ZeroMQ sockets, real torch, real timing."""

from __future__ import annotations

import contextlib
import json
import math
import os
from pathlib import Path

import pytest

from fedsim.launch.runner import run_scenario
from fedsim.results.writer import read_events, read_metrics
from fedsim.scenario import load

from .conftest import write_scenario

pytestmark = pytest.mark.timeout(180)


def _check_run_dir(run_dir: Path) -> dict:
    for name in ("scenario.json", "scenario.toml", "events.jsonl", "metrics.csv",
                 "summary.json", "fedsim-run.json", "accuracy.png", "staleness.png",
                 "timeline.png"):
        assert (run_dir / name).exists(), name
    summary = json.loads((run_dir / "summary.json").read_text())
    for key in ("algorithm", "clients", "updates", "emulated_seconds", "real_seconds",
                "final_accuracy", "best_accuracy", "time_to_target_s", "bytes_up",
                "bytes_down", "staleness", "fidelity"):
        assert key in summary, key
    for key in ("mean", "p50", "p99", "max"):
        assert key in summary["staleness"]
    for key in ("verdict", "lateness_ms", "suggested_dilation"):
        assert key in summary["fidelity"]
    resolved = json.loads((run_dir / "scenario.json").read_text())
    assert resolved["client"]["batch_size"] == 32  # defaults filled in
    return summary


def test_fedasync_learns_and_staleness_emerges(tmp_path: Path) -> None:
    path = write_scenario(tmp_path, """
[algorithm]
name = "fedasync"
alpha = 0.6
staleness = "poly"
concurrency = 4
[eval]
every_updates = 8
""")
    result = run_scenario(load(path), tmp_path / "run")
    s = _check_run_dir(result.run_dir)
    assert s["status"] == "completed"
    assert s["stop_reason"] == "time_budget"
    assert s["final_accuracy"] > 0.5, s  # 10 classes: chance is ~0.1-0.3 with label skew
    assert s["updates"] >= 30
    assert s["staleness"]["max"] >= 1
    assert s["staleness"]["mean"] > 0.5
    events = list(read_events(result.run_dir / "events.jsonl"))
    aggregates = [e for e in events if e["ev"] == "aggregate"]
    assert any(e["staleness"] > 0 for e in aggregates)
    assert len(aggregates) == s["updates"]
    # staleness = server version before the update - the task's base version
    for e in aggregates:
        assert e["staleness"] == e["version"] - 1 - e["base_version"]
    kinds = {e["ev"] for e in events}
    assert {"send", "deliver", "train_start", "train_end", "aggregate", "evaluate"} <= kinds
    for e in events:
        assert "t" in e
        assert "real" in e
    # the constant 20 ms latency is honoured in both directions
    delivers = [e for e in events if e["ev"] == "deliver"]
    assert delivers
    assert all(e["scheduled"] - e["sent_at"] >= 0.02 - 1e-9 for e in delivers)
    assert all(e["t"] >= e["scheduled"] for e in delivers)
    rows = read_metrics(result.run_dir / "metrics.csv")
    assert len(rows) >= 3
    assert not math.isnan(rows[-1]["accuracy"])
    # where time went, measured in the real processes (the hosts' parts sent to the server)
    phases = s["phases"]
    for phase, parts in phases.items():
        for part, d in parts.items():
            assert d["n"] > 0, (phase, part)
            assert 0 <= d["p50"] <= d["p99"] <= d["max"], (phase, part, d)
    assert phases["evaluation"]["worker"]["n"] == phases["evaluation"]["round_trip"]["n"] \
        == len(rows)
    assert phases["aggregation"]["server"]["n"] == s["updates"]
    runs = [e for e in events if e["ev"] == "train_end" and "compute_real" in e]
    # a run under way when the hosts stopped was measured but logged no train_end
    assert len(runs) <= phases["compute"]["real"]["n"] <= len(runs) + s["clients"]
    assert phases["compute"]["budget"]["n"] == phases["compute"]["real"]["n"]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 usable CPUs")
def test_pinned_trainers_have_a_cpu_of_their_own(tmp_path: Path) -> None:
    """``deploy.pin_trainers``: the trainer (every thread of it) alone on the last
    CPU and out of the idle class, the rest of the run on the others (the
    evaluator still idle-class); this process's CPUs given back after."""
    import psutil

    from fedsim.actors.process import can_leave_idle

    mine = os.sched_getaffinity(0)
    cpus = sorted(mine)
    seen: dict[int, set[frozenset[int]]] = {}
    policies: dict[int, set[int]] = {}

    def look(_progress: object) -> None:
        for p in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error, ProcessLookupError):  # one that just ended
                seen[p.pid] = {frozenset(os.sched_getaffinity(t.id)) for t in p.threads()}
                policies[p.pid] = {os.sched_getscheduler(t.id) for t in p.threads()}

    path = write_scenario(tmp_path, "pin_trainers = true\n")  # [deploy] is the last table
    result = run_scenario(load(path), tmp_path / "run", on_progress=look)
    assert result.summary["status"] == "completed"
    assert os.sched_getaffinity(0) == mine
    trainer, rest = frozenset(cpus[-1:]), frozenset(cpus[:-1])
    assert len(seen) >= 4, seen   # zygote, host, trainer, evaluator
    assert [pid for pid, a in seen.items() if a == {trainer}] != [], seen
    assert sum(a == {trainer} for a in seen.values()) == 1, seen
    assert all(a == {rest} for a in seen.values() if a != {trainer}), seen
    if can_leave_idle():
        pinned = next(pid for pid, a in seen.items() if a == {trainer})
        assert policies[pinned] == {os.SCHED_OTHER}, policies
        assert any(p == {os.SCHED_IDLE} for p in policies.values()), policies  # the evaluator


def test_pinning_more_trainers_than_cpus_is_refused_before_the_run(tmp_path: Path) -> None:
    from fedsim.errors import DeployError

    n = len(os.sched_getaffinity(0))
    path = write_scenario(tmp_path, "pin_trainers = true\n")
    sc = load(path)
    sc = sc.model_copy(update={"deploy": sc.deploy.model_copy(update={"hosts": n}),
                               "data": sc.data.model_copy(update={"num_clients": max(8, n)})})
    with pytest.raises(DeployError, match=r"deploy.pin_trainers: .* need .* usable CPUs"):
        run_scenario(sc, tmp_path / "run")
    assert not (tmp_path / "run").exists()
