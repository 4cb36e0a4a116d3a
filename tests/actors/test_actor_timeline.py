"""The event log through the real actors is what the timeline and the plots need.

One federation per case on the fake clock: the run directory says its
format; every message ``kind`` is lower case; every send carries the
``sent_at`` its delivery (or drop) carries, so the two join exactly; and
the per-client timeline built from the log is consistent with the log
(a client never trains while away or waiting, each aggregation of its
update follows that update's arrival, the lanes stay inside the run).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from actor_scenarios import build, of

from fedsim.results.plots import plot_run
from fedsim.results.reader import load_run
from fedsim.results.timeline import build_timeline, merge
from fedsim.results.writer import RUN_FORMAT
from fedsim.testing.federation import run_in_memory

pytestmark = pytest.mark.timeout(60)

CASES = {
    # DGA's paper mode: a pipelined session, a real barrier, clients that go off
    "dga-paper-onoff": ({"name": "dga", "local_steps": 3, "mode": "paper"},
                        {"availability": {"model": "onoff", "mean_on": 0.6, "mean_off": 0.3}}),
    # FedAvg rounds over devices of unequal speed: fast clients wait for slow ones
    "fedavg-spread": ({"name": "fedavg", "fraction": 0.5},
                      {"devices": {"step_time": 0.01, "distribution": "lognormal",
                                   "spread": 0.008}}),
}


def _overlap(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    return sum(max(0.0, min(x1, y1) - max(x0, y0)) for x0, x1 in a for y0, y1 in b)


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_event_log_joins_and_the_timeline_agrees_with_it(tmp_path: Path,
                                                             case: str) -> None:
    algorithm, sections = CASES[case]
    sc = build(algorithm, run={"time_budget": 3.0}, **sections)
    mem = run_in_memory(sc, tmp_path / "run", hosts=2)
    assert mem.summary["status"] == "completed", mem.summary["status"]
    assert mem.summary["format"] == RUN_FORMAT
    run = load_run(tmp_path / "run")
    assert run.format == RUN_FORMAT
    events = run.events
    assert [e["t"] for e in events] == sorted(e["t"] for e in events)

    # one spelling per message kind, and sends join their deliveries on sent_at
    kinds = {e["kind"] for e in events if "kind" in e}
    assert kinds >= {"task", "update"}
    assert all(k == k.lower() for k in kinds), kinds

    def key(e: dict[str, Any]) -> tuple[Any, ...]:
        return e["client"], e["dir"], e["kind"], e["sent_at"]

    sends = Counter(key(e) for e in of(events, "send"))
    arrived = Counter(key(e) for e in events if e["ev"] in ("deliver", "drop"))
    assert sum(arrived.values()) > 50
    assert arrived - sends == Counter()  # every delivery has its send
    in_flight = sends - arrived           # and the rest were under way at the end
    end = next(e["t"] for e in events if e["ev"] == "end")
    assert all(k[3] > end - 0.5 for k in in_flight), in_flight

    tl = build_timeline(events, total_clients=sc.data.num_clients)
    assert sorted(tl.clients) == list(range(sc.data.num_clients))
    uploads = 0
    for c in tl.clients.values():
        lanes = [c.download, c.upload, c.training, c.waiting, c.away]
        assert all(0.0 <= a < b <= end for lane in lanes for a, b in lane)
        assert all(lane == sorted(lane) for lane in lanes[:2])  # one per message
        assert all(merge(lane) == lane for lane in lanes[2:])  # sorted, disjoint
        assert _overlap(c.training, c.away) == 0.0
        assert _overlap(c.training, c.waiting) == 0.0
        assert _overlap(c.waiting, c.away) == 0.0
        # by each aggregation of its update, as many of its updates had arrived
        arrivals = [e["t"] for e in of(events, "deliver", client=c.client, kind="update")]
        for i, (t, _) in enumerate(c.aggregated):
            assert sum(1 for a in arrivals if a <= t) >= i + 1, (c.client, t)
        uploads += len(c.upload)
    assert uploads > 0
    waited = sum(b - a for c in tl.clients.values() for a, b in c.waiting)
    assert waited > 0.05, waited  # the barrier is there to see
    if case == "dga-paper-onoff":
        assert any(c.away for c in tl.clients.values())
        assert len(of(events, "barrier_wait")) > 0

    paths = plot_run(run)
    # DGA's staleness plot counts its correction delays; FedAvg's rounds have none
    expected = {"accuracy.png", "timeline.png"} | (
        {"staleness.png"} if case.startswith("dga") else set())
    assert {p.name for p in paths} == expected
    assert all(p.stat().st_size > 10_000 for p in paths)
