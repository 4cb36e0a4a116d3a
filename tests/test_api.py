"""The Python API (fedsim.load, run, arun, open_run): values back, typed errors, event loops."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import fedsim
from fedsim.errors import OverrideError, RunFailed, RunInterrupted, ScenarioError
from fedsim.launch import runner
from fedsim.results.values import Metrics, RunResult, Summary
from fedsim.results.writer import read_summary

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "scenarios" / "quickstart.toml"

#: A federation small enough to start and run in a few real seconds.
TINY: dict[str, Any] = {
    "name": "tiny", "seed": 3,
    "data": {"dataset": "synthetic", "num_clients": 4, "max_samples_per_client": 64},
    "model": {"name": "mlp", "hidden": [16]},
    "algorithm": {"name": "fedasync", "concurrency": 2},
    "client": {"lr": 0.05, "batch_size": 16, "local_steps": 3},
    "run": {"time_budget": 1.0},
    "eval": {"every_updates": 4},
    "devices": {"step_time": 0.004},
    "network": {"up": {"delay": 0.02}, "down": {"delay": 0.02}},
    "deploy": {"hosts": 1},
}


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """Train in this process on one thread, as a torch worker does (tests/actors/conftest.py)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_import_fedsim_is_cheap_and_its_names_come_on_first_use() -> None:
    code = ("import sys, fedsim\n"
            "heavy = lambda: sorted({'torch', 'pydantic', 'numpy'} & set(sys.modules))\n"
            "print(heavy(), fedsim.ScenarioError.__module__, heavy())\n"
            "print(fedsim.load.__module__, fedsim.RunResult.__module__, heavy())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert out == ["[] fedsim.errors []", "fedsim.api fedsim.results.values []"]
    assert set(fedsim.__all__) <= set(dir(fedsim))
    with pytest.raises(AttributeError, match="no attribute 'lod'"):
        fedsim.lod  # noqa: B018


def test_load_takes_a_file_a_mapping_or_a_scenario_with_overrides() -> None:
    sc = fedsim.load(QUICKSTART, overrides={"run.time_budget": 5, "model": {"hidden": (8, 4)}})
    assert (sc.run.time_budget, sc.model.hidden, sc.algorithm.name) == (5.0, [8, 4], "fedasync")
    assert fedsim.load(QUICKSTART, overrides=["run.time_budget=5", "model.hidden=[8, 4]"]) == sc
    derived = fedsim.load(sc, overrides={"algorithm.alpha": 0.3})
    assert derived.algorithm.alpha == 0.3  # type: ignore[attr-defined]
    assert derived.run.time_budget == 5.0
    tiny = fedsim.load(TINY)
    assert tiny.data.num_clients == 4
    with pytest.raises(OverrideError, match=r"run\.time_budget: Input should be greater than 0"):
        fedsim.load(TINY, overrides={"run.time_budget": 0})
    with pytest.raises(ScenarioError, match=r"network \(client 0, up\)|network\.up\.table"):
        fedsim.load(TINY, overrides={"network.up": {"distribution": "empirical",
                                                    "table": "/nonexistent/table.txt"}})
    assert 'name = "fedasync"' in fedsim.as_toml(tiny)


def test_a_runs_result_holds_its_summary_metrics_events_and_plots(
        tmp_path: Path, one_torch_thread: None) -> None:
    from fedsim.testing.federation import run_in_memory

    sc = fedsim.load(TINY, overrides={"run.time_budget": 2.0})
    run_in_memory(sc, tmp_path)
    result = fedsim.open_run(tmp_path)
    s = result.summary
    assert isinstance(s, Summary)
    assert s.completed
    assert (s.status, s.stop_reason, s.algorithm, s.clients) == (
        "completed", "time_budget", "fedasync", 4)
    assert s.updates == s["updates"] > 0
    assert s.staleness.count == s.updates
    assert s.final_accuracy == s["final_accuracy"]
    down = s.transfer_down
    assert down is not None
    assert down.messages > 0
    assert down.configured_delay_ms == pytest.approx(20.0)
    assert s.fidelity == "pass"  # virtual time: no lateness
    m = result.metrics
    assert isinstance(m, Metrics)
    assert len(m) >= 3
    assert m["accuracy"] == m.columns["accuracy"] == [r["accuracy"] for r in m]
    assert m.names[:3] == ("t", "real", "version")
    with pytest.raises(KeyError, match="no column 'acc'"):
        m["acc"]
    aggregates = list(result.events("aggregate"))
    assert len(aggregates) == s.updates
    assert {"accuracy.png", "staleness.png"} <= {p.name for p in result.plot()}
    assert result.scenario() == sc


def _fake_runner(status: str, seen: dict[str, Any]) -> Any:
    def run_scenario(sc: Any, out: Any, **kw: Any) -> RunResult:
        # a real run calls asyncio.run: it fails in a thread whose loop is running
        seen["result"] = asyncio.run(asyncio.sleep(0, result=threading.get_ident()))
        return RunResult.of(out, {"status": status, "algorithm": "fedasync"})

    return run_scenario


@pytest.mark.parametrize(("status", "raised"), [
    ("failed: no update was applied", RunFailed), ("error: ValueError: x", RunFailed),
    ("interrupted", RunInterrupted)])
def test_a_run_that_did_not_complete_raises_with_its_result(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, status: str,
        raised: type[Exception]) -> None:
    monkeypatch.setattr(runner, "run_scenario", _fake_runner(status, {}))
    with pytest.raises(raised) as info:
        fedsim.run(fedsim.load(TINY), out=tmp_path)
    result = info.value.result  # type: ignore[attr-defined]
    assert result.run_dir == tmp_path
    assert result.status == status


def test_run_inside_a_running_loop_runs_on_a_thread_of_its_own(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}
    monkeypatch.setattr(runner, "run_scenario", _fake_runner("completed", seen))

    async def notebook_cell() -> RunResult:
        return fedsim.run(fedsim.load(TINY), out=tmp_path)

    assert asyncio.run(notebook_cell()).status == "completed"
    assert seen["result"] != threading.get_ident()
    fedsim.run(fedsim.load(TINY), out=tmp_path)  # no loop running: this thread
    assert seen["result"] == threading.get_ident()


def test_a_real_run_inside_a_running_event_loop(tmp_path: Path) -> None:
    """As in Jupyter: ``fedsim.arun`` awaited while the loop goes on (client hosts,
    torch workers, netem: the real path), then stopped by cancelling its task."""
    sc = fedsim.load(TINY, overrides={"run.time_budget": 120.0})

    async def notebook() -> int:
        ticks = 0

        async def heartbeat() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.02)
                ticks += 1

        beat = asyncio.create_task(heartbeat())
        task = asyncio.create_task(fedsim.arun(sc, out=tmp_path))
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not task.done():
            s = read_summary(tmp_path)
            if s is not None and s["updates"] >= 8:
                break
            await asyncio.sleep(0.1)
        ticks_during = ticks
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        beat.cancel()
        return ticks_during

    assert asyncio.run(notebook()) >= 10  # the loop kept running while the run did
    result = fedsim.open_run(tmp_path)
    assert result.status == "interrupted"  # stopped cleanly: its results are written
    assert result.summary.updates >= 8
    assert len(result.metrics) >= 1
    assert (tmp_path / "accuracy.png").exists()
