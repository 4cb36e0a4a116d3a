"""Where a run's time goes: the summary's ``phases``, measured by the real actors.

Every phase is there with durations in it, and each counts what it says it
counts: an evaluation per evaluation done, a compute duration per local
run, an aggregation per update applied (FedAsync) or per round (FedAvg), an
encode per message sent and a decode per message received, on both sides;
the hosts' parts travel to the server with their event batches.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from actor_scenarios import build, of

from fedsim.results.phases import PHASES
from fedsim.results.values import Phase, RunResult
from fedsim.testing.federation import run_in_memory

MODEL_KINDS = ("task", "average", "update")


@pytest.mark.parametrize("algorithm", [{"name": "fedasync", "concurrency": 3},
                                       {"name": "fedavg"}], ids=lambda a: a["name"])
def test_every_phase_is_measured_and_counts_what_it_says(tmp_path: Path,
                                                         algorithm: dict[str, object]) -> None:
    sc = build(algorithm, run={"time_budget": 2.0},
               eval={"every_updates": 5, "every_rounds": 2})
    run = run_in_memory(sc, tmp_path, hosts=2)
    s, events = run.summary, run.events()
    phases = s["phases"]
    assert [f"{p}.{part}" for p, parts in phases.items() for part in parts] == list(PHASES)
    for name in PHASES:
        phase, _, part = name.partition(".")
        d = phases[phase][part]
        assert d["n"] > 0, name
        assert 0 <= d["p50"] <= d["p95"] <= d["p99"] <= d["max"], (name, d)
        assert 0 <= d["mean"] <= d["max"], (name, d)

    # evaluation: one per evaluation done, the worker's time within the round trip
    evaluations = of(events, "evaluate")
    ev = phases["evaluation"]
    assert ev["worker"]["n"] == ev["round_trip"]["n"] == len(evaluations) > 2
    assert ev["worker"]["mean"] <= ev["round_trip"]["mean"]

    # compute: one per local run, each with its emulated budget (3 steps of 4 ms)
    runs = [e for e in of(events, "train_end") if "compute_real" in e]
    compute = phases["compute"]
    assert compute["real"]["n"] == compute["budget"]["n"] == len(runs) > 0
    assert compute["budget"]["p50"] == compute["budget"]["max"] == pytest.approx(0.012)
    assert compute["real"]["max"] == pytest.approx(max(e["compute_real"] for e in runs))

    # aggregation: one per call of the algorithm that applied updates or closed a round
    aggregations = of(events, "aggregate")
    expected = s["updates"] if algorithm["name"] == "fedasync" else s["rounds"]
    assert phases["aggregation"]["server"]["n"] == len(aggregations) == expected > 0

    # encode: one per message sent, by the server (down) and by the hosts (up)
    sent_down = [e for e in of(events, "send", dir="down") if "host" not in e]
    sent_up = [e for e in of(events, "send", dir="up") if "host" in e]
    assert phases["encode"]["server"]["n"] == len(sent_down)
    assert phases["encode"]["hosts"]["n"] == len(sent_up)

    # decode: every message that arrived, delivered by its link or still on it at the end
    for direction, where in (("down", "hosts"), ("up", "server")):
        delivered = [e for e in events if e["ev"] in ("deliver", "drop")
                     and e.get("dir") == direction]
        sent = of(events, "send", dir=direction)
        assert len(delivered) <= phases["decode"][where]["n"] <= len(sent), direction

    # queueing: the server's for each client message its loop took (every update applied
    # was), the hosts' for each message a waiting client took
    delivered_up = of(events, "deliver", dir="up")
    assert s["updates"] <= phases["queueing"]["server"]["n"] <= len(delivered_up)
    delivered_down = [e for e in of(events, "deliver", dir="down") if e["kind"] in MODEL_KINDS]
    assert 0 < phases["queueing"]["hosts"]["n"] <= len(delivered_down)

    # the typed accessor reads the same numbers back from the run directory
    result = RunResult.of(tmp_path)
    got = result.phases
    assert got == result.summary.phases
    assert got["compute"]["budget"] == Phase(**compute["budget"])
    assert {p: set(parts) for p, parts in got.items()} == {
        p: set(parts) for p, parts in phases.items()}


def test_a_run_without_phases_reads_as_none_measured(tmp_path: Path) -> None:
    """A summary written before phases existed: the accessor says so, it does not fail."""
    result = RunResult.of(tmp_path, {"status": "completed", "phases": None})
    assert result.phases == {}
    got = RunResult.of(tmp_path, {"phases": {"encode": {"server": {"n": 0}}}}).phases
    assert got == {"encode": {"server": Phase(0, None, None, None, None, None)}}
