"""Synchronous rounds through the real actors on the fake clock: FedAvg and FedProx.

(They ran over real processes before; the deployment and smoke tiers keep
real sockets covered, and on virtual time the round arithmetic is exact.)
"""

from __future__ import annotations

import itertools
import sys
import tomllib
from pathlib import Path

import pytest

from fedsim.scenario import Scenario, apply_overrides, parse
from fedsim.testing.federation import run_in_memory

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from integration.conftest import SMALL

pytestmark = pytest.mark.timeout(120)


def _load(extra: str, sets: list[str]) -> Scenario:
    return parse(apply_overrides(tomllib.loads(SMALL + extra), sets), "rounds")


def test_fedavg_rounds_learn(tmp_path: Path) -> None:
    extra = """
[algorithm]
name = "fedavg"
fraction = 0.5
"""
    sc = _load(extra, ["run.time_budget=60.0", "run.max_rounds=12"])
    run = run_in_memory(sc, tmp_path / "run", hosts=1)
    s = run.summary
    assert s["stop_reason"] == "max_rounds"
    assert s["rounds"] == 12
    assert s["final_accuracy"] > 0.5, s
    events = run.events()
    aggregates = [e for e in events if e["ev"] == "aggregate"]
    assert len(aggregates) == 12
    assert all(len(e["clients"]) == 4 for e in aggregates)  # ceil(0.5 * 8)
    # a round takes at least down + compute + up = 0.02 + 10 * 0.004 + 0.02
    times = [e["t"] for e in aggregates]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert min(gaps) >= 0.08 - 1e-3


def test_fedprox_with_deadline_and_overselection(tmp_path: Path) -> None:
    extra = """
[algorithm]
name = "fedprox"
mu = 0.1
fraction = 0.25
over_selection = 0.5
round_deadline = 1.0
"""
    sc = _load(extra, ["run.time_budget=60.0", "run.max_rounds=5"])
    run = run_in_memory(sc, tmp_path / "run", hosts=1)
    s = run.summary
    events = run.events()
    aggregates = [e for e in events if e["ev"] == "aggregate"]
    # over-selection asks ceil(2 * 1.5) = 3 clients and uses the first 2 results
    assert all(len(e["clients"]) == 2 for e in aggregates)
    assert s["rounds"] == 5
