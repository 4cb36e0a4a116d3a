"""Start-up through the real actors: registration, refusals, a run that cannot start.

Registration runs over the control path before t = 0, so a slow emulated
network delays no start; a host the server refuses is named, and a run in
which no round can start ends failed with its reason.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from actor_scenarios import build, of

from fedsim.actors.host import EXIT_REFUSED
from fedsim.testing.federation import run_in_memory

pytestmark = pytest.mark.timeout(60)

#: A 5 s one-way link each way: a round trip takes 10 emulated seconds.
SLOW = {"network": {"up": {"delay": 5.0}, "down": {"delay": 5.0}},
        "run": {"time_budget": 30.0}}

WRONG_HASH = "0" * 64


def test_fedavg_first_round_has_every_client_at_5s_latency(tmp_path: Path) -> None:
    """Old bug: a synchronous run waited a fixed 5 s for registrations that
    travelled over the emulated network; at 5 s latency FedAvg's first round
    had one client."""
    sc = build({"name": "fedavg"}, **SLOW)
    run = run_in_memory(sc, tmp_path / "run", hosts=2)
    events = run.events()
    assert run.summary["status"] == "completed", run.summary["status"]
    assert run.summary["clients_missing"] == []
    (start,) = of(events, "start")
    assert start["t"] == 0.0
    assert start["clients"] == 6
    aggregates = of(events, "aggregate")
    assert aggregates, "no round completed"
    assert sorted(aggregates[0]["clients"]) == list(range(6))
    # a round is at least one round trip: the first cannot close before t = 10
    assert aggregates[0]["t"] >= 10.0


def test_dga_starts_and_completes_rounds_at_5s_latency(tmp_path: Path) -> None:
    """Old bug: at 5 s latency DGA never started (and the run said completed/pass)."""
    sc = build({"name": "dga", "local_steps": 3}, **SLOW)
    run = run_in_memory(sc, tmp_path / "run", hosts=2)
    events = run.events()
    assert run.summary["status"] == "completed", run.summary["status"]
    assert of(events, "start")[0]["clients"] == 6
    aggregates = of(events, "aggregate")
    assert len(aggregates) >= 2
    assert run.summary["rounds"] >= 2
    assert run.summary["updates"] > 0
    assert sorted(aggregates[0]["clients"]) == list(range(6))


def test_a_run_in_which_no_round_can_start_ends_failed_with_its_reason(tmp_path: Path) -> None:
    sc = build({"name": "fedavg"})
    run = run_in_memory(sc, tmp_path / "run", hosts=2,
                        host_hashes={0: WRONG_HASH, 1: WRONG_HASH})
    status = run.summary["status"]
    assert status.startswith("failed"), status
    assert "no round could start" in status
    assert run.host_codes == [EXIT_REFUSED, EXIT_REFUSED]
    assert (tmp_path / "run" / "summary.json").exists()
    assert run.summary["clients_missing"] == list(range(6))
    assert run.summary["updates"] == 0
    # nothing was emulated, so netem has nothing to vouch for
    assert run.summary["fidelity"]["verdict"] != "pass", run.summary["fidelity"]
    events = run.events()
    assert of(events, "start") == []
    assert of(events, "end")[0]["status"] == status


def test_a_host_with_another_scenario_is_refused_and_its_clients_are_named(
        tmp_path: Path) -> None:
    sc = build({"name": "fedasync", "concurrency": 2})
    run = run_in_memory(sc, tmp_path / "run", hosts=2, host_hashes={1: WRONG_HASH})
    assert run.host_codes == [0, EXIT_REFUSED]
    assert run.summary["status"] == "completed", run.summary["status"]
    refused = [1, 3, 5]  # host-1's clients (dealt round-robin)
    assert run.summary["clients_missing"] == refused
    events = run.events()
    (missing,) = of(events, "missing")
    assert missing["clients"] == refused
    (reject,) = of(events, "reject", reason="refused")
    assert reject["sender"] == "host-1"
    assert "scenario hash" in reject["detail"]
    assert run.summary["rejected_messages"]["server"] == {"refused": 1}
    # the other host ran its clients, and only those
    trained = {e["client"] for e in of(events, "train_start")}
    assert trained == {0, 2, 4}
    assert run.summary["updates"] > 0
