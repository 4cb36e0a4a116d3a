"""Availability through the real actors: away clients compute and send nothing.

A client is away while it is off (``availability.model = "onoff"``) or
suspended (AsyncFedED's model). The event log shows each absence as an
``away`` record and a ``back`` record; between the two, the client must not
start training, apply a correction or send anything, and under the
``dropped`` and ``reset`` in-flight policies nothing reaches it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from actor_scenarios import away_intervals, build, of

from fedsim.testing.federation import run_in_memory

pytestmark = pytest.mark.timeout(60)

#: Short on and off periods: every client goes away a few times in 3 s.
ONOFF = {"model": "onoff", "mean_on": 0.4, "mean_off": 0.3}


def _while_away(events: list[dict[str, Any]], *, ev: str, **match: Any) -> list[dict[str, Any]]:
    """Records ``ev`` (matching ``match``) of a client strictly inside one of its absences."""
    intervals = away_intervals(events)
    return [e for e in of(events, ev, **match)
            if any(a < e["t"] < b for a, b in intervals.get(e.get("client"), ()))]


def _check_idle_while_away(events: list[dict[str, Any]]) -> None:
    intervals = away_intervals(events)
    assert sum(len(v) for v in intervals.values()) >= 10, "too few absences to test"
    assert _while_away(events, ev="send", dir="up") == []
    assert _while_away(events, ev="train_start") == []
    assert _while_away(events, ev="correction") == []


@pytest.mark.parametrize("mode", ["paper", "auto"])
def test_dga_client_computes_and_sends_nothing_while_away(tmp_path: Path, mode: str) -> None:
    sc = build({"name": "dga", "local_steps": 3, "mode": mode}, run={"time_budget": 3.0},
               availability=ONOFF)
    run = run_in_memory(sc, tmp_path / "run", hosts=2)
    assert run.summary["status"] == "completed", run.summary["status"]
    events = run.events()
    _check_idle_while_away(events)
    assert len(of(events, "correction")) >= 10
    assert len(of(events, "aggregate")) >= 3


@pytest.mark.parametrize("policy", ["held", "dropped", "reset"])
def test_fedasync_away_clients_under_each_in_flight_policy(tmp_path: Path, policy: str) -> None:
    sc = build({"name": "fedasync", "concurrency": 4}, run={"time_budget": 3.0},
               availability=ONOFF, network={"in_flight": policy})
    run = run_in_memory(sc, tmp_path / "run", hosts=2)
    assert run.summary["status"] == "completed", run.summary["status"]
    events = run.events()
    _check_idle_while_away(events)
    assert len(of(events, "aggregate")) >= 10
    readies = of(events, "send", kind="ready")
    if policy == "held":
        # what reached an away client waited for it (a held task is its work
        # on return, so few clients need to announce themselves with Ready)
        assert sum(1 for e in of(events, "back") if e["held"] > 0) >= 3
        assert all(e["reset"] is False for e in readies)
        return
    assert len(readies) >= 3, "too few clients announced their return"
    assert all(e["held"] == 0 for e in of(events, "back"))
    # dropped / reset: nothing reaches an away client; what arrives then is lost
    assert _while_away(events, ev="deliver", dir="down") == []
    lost_down = [e for e in of(events, "drop", dir="down")
                 if e["reason"] == f"away ({policy})"]
    assert lost_down, "no message to an away client was lost: the policy was not exercised"
    if policy == "reset":
        assert all(e["reset"] is True for e in readies)
    else:
        assert all(e["reset"] is False for e in readies)


def test_asyncfeded_suspension_lasts_the_task_k_steps_not_local_steps(tmp_path: Path) -> None:
    """Old bug: a suspended run's length came from the scenario's local_steps,
    not the task's own budget (AsyncFedED's K)."""
    k, local_steps, step_time = 8, 1, 0.004
    sc = build({"name": "asyncfeded", "k_unit": "steps", "k_initial": k, "k_min": k,
                "k_max": k, "k_rounding": "floor", "lam": 1.0, "epsilon": 1.0},
               client={"local_steps": local_steps}, devices={"step_time": step_time},
               availability={"model": "suspension", "p": 0.5}, run={"time_budget": 2.0})
    run = run_in_memory(sc, tmp_path / "run", hosts=2)
    assert run.summary["status"] == "completed", run.summary["status"]
    events = run.events()
    suspended = of(events, "away", why="suspend")
    assert len(suspended) >= 10, len(suspended)
    # the run wasted is K steps, then a hang of U(0, 3 x run):
    # away for t_run + U(0, 3 t_run), t_run = K x step_time
    t_run = k * step_time
    hangs = [e["until"] - e["t"] for e in suspended]
    assert min(hangs) >= t_run - 1e-5, (min(hangs), t_run)
    assert max(hangs) <= 4 * t_run + 1e-5, (max(hangs), t_run)
    # local_steps would have allowed at most 4 x its run, far below the least seen
    assert min(hangs) > 4 * local_steps * step_time
    # the runs that were not suspended took K steps too
    steps = {e["steps"] for e in of(events, "train_end") if e.get("steps") is not None}
    assert steps == {k}
