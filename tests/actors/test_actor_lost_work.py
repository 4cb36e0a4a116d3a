"""Lost client work is in the results: a failed local run is counted, drawn and reported.

DS-2's case through the real actors: on Synthetic(1,1)'s natural partition,
seed 3, one client holds 89 % of the data and they are separable; Delta-SGD
at delta = 1 grows its step past float32's range and that client's run
fails. The run goes on without it, and ``summary.json``, the CLI summary,
the timeline and :class:`fedsim.results.values.Summary` all say which client lost
its work and why.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

import pytest
from actor_scenarios import build, of

from fedsim.results.timeline import build_timeline
from fedsim.results.values import Summary
from fedsim.scenario import Scenario, parse
from fedsim.testing.federation import run_in_memory

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]


def _ds2(seed: int, delta: float, **client: object) -> dict:
    raw = tomllib.loads((ROOT / "scenarios/repro/ds2.toml").read_text())
    raw["seed"] = seed
    raw["client"]["delta"] = delta
    raw["client"].update(client)
    # the generator's natural sizes over 20 clients at batch 32 (ds2.toml caps them at the
    # paper's 500 samples; this is its ablation's case, as the earlier table ran it)
    raw["data"] = {"dataset": "synthetic", "num_clients": 20, "partition": "natural"}
    raw["client"]["batch_size"] = 32
    raw["algorithm"]["fraction"] = 1.0     # the dominant client trains in round 1
    raw["run"]["max_rounds"] = 2
    raw["eval"] = {"every_rounds": 1}
    return raw


def _dominant_client(sc: Scenario) -> int:
    from fedsim.actors.setup import build_data

    sizes = [len(c.y) for c in build_data(sc).clients]
    assert max(sizes) > 0.8 * sum(sizes)  # the case: one client holds most of the data
    return sizes.index(max(sizes))


def test_a_separable_client_overflowing_is_counted_by_client_and_cause(tmp_path: Path) -> None:
    sc = parse(_ds2(seed=3, delta=1.0), "ds2-seed3")
    run = run_in_memory(sc, tmp_path / "run")
    s = run.summary
    assert s["status"] == "completed", s["status"]
    big = _dominant_client(sc)
    lost = s["lost_work"]
    assert lost["runs"] == 1
    assert lost["by_reason"] == {"overflow": 1}
    assert lost["by_client"] == {str(big): {"overflow": 1}}
    assert "beyond torch.float32's range" in lost["first_reason"][str(big)]
    # the event log: the client's train_error and the server's client_failed, with the cause
    (err,) = of(run.events(), "train_error", client=big)
    assert err["cause"] == "overflow"
    (failed,) = of(run.events(), "client_failed", client=big)
    assert failed["cause"] == "overflow"
    # the others went on: round 2 aggregated without it
    rounds = of(run.events(), "aggregate")
    assert rounds
    assert big not in rounds[-1]["clients"]
    # the Python API and the timeline
    summary = Summary(s)
    assert summary.lost_work.by_client == {big: {"overflow": 1}}
    assert summary.lost_work
    tl = build_timeline(sorted(run.events(), key=lambda e: e["t"]))
    assert [c for _, c in tl.clients[big].failed] == ["overflow"]


def test_eta_max_opts_in_to_a_cap_and_no_work_is_lost(tmp_path: Path) -> None:
    sc = parse(_ds2(seed=3, delta=1.0, eta_max=10.0), "ds2-capped")
    run = run_in_memory(sc, tmp_path / "run")
    assert run.summary["lost_work"]["runs"] == 0
    assert not of(run.events(), "client_failed")


def test_a_non_finite_trained_model_is_a_failed_run_with_its_cause(tmp_path: Path) -> None:
    """An SGD step size of 1e30 sends the MLP's weights to infinity within a few steps:
    the worker refuses the result as the client's failed run (cause non_finite)."""
    sc = build({"name": "fedasync"}, client={"lr": 1e30, "local_steps": 5},
               run={"time_budget": 1.0})
    run = run_in_memory(sc, tmp_path / "run")
    lost = run.summary["lost_work"]
    assert lost["runs"] >= 1
    assert set(lost["by_reason"]) == {"non_finite"}
    assert run.summary["status"].startswith("failed: every client failed")


def test_a_clean_run_reports_no_lost_work(tmp_path: Path) -> None:
    run = run_in_memory(build({"name": "fedavg"}), tmp_path / "run")
    assert run.summary["lost_work"] == {"runs": 0, "by_reason": {}, "by_client": {},
                                        "clients": [], "first_reason": {}}
    assert not Summary(run.summary).lost_work


def test_an_exception_in_training_counts_as_error(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(os.environ, "FEDSIM_FAIL_TRAIN", "1")
    run = run_in_memory(build({"name": "fedasync"}), tmp_path / "run")
    assert run.summary["lost_work"]["by_client"] == {"1": {"error": 1}}
