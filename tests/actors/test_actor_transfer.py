"""The summary's realised transfer time per model message, next to the configured delay.

The quickstart's link is 50 ms each way; a 57 KB model after an idle period
takes two extra round trips of TCP slow start (netem's model), so it is
delivered about 250 ms after it was sent. The summary says so.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from actor_scenarios import build, of

from fedsim.results.writer import TransferStats
from fedsim.scenario.network import NetPlan
from fedsim.testing.federation import run_in_memory


def test_the_summary_reports_each_directions_transfer_time_and_the_configured_delay(
        tmp_path: Path) -> None:
    sc = build({"name": "fedasync", "concurrency": 3}, run={"time_budget": 3.0},
               model={"hidden": [200]},  # 57 KB, as in the quickstart
               network={"up": {"delay": 0.05}, "down": {"delay": 0.05}})
    run = run_in_memory(sc, tmp_path)
    events = run.events()
    transfer = run.summary["transfer"]
    for direction, kind in (("down", "task"), ("up", "update")):
        delivered = of(events, "deliver", dir=direction, kind=kind)
        took = [e["t"] - e["sent_at"] for e in delivered]
        t = transfer[direction]
        assert t["messages"] == len(delivered) > 5
        assert t["configured_delay_ms"] == 50.0
        assert t["p50_ms"] == round(1e3 * statistics.median(took), 6)
        assert t["mean_bytes"] == round(statistics.mean(e["bytes"] for e in delivered))
        # netem's own answer for this message on an idle link: slow start, not 50 ms
        expected = NetPlan(sc).make_link(0, direction).schedule(0.0, t["mean_bytes"]).delay
        assert t["p50_ms"] == 1e3 * expected
        assert t["p50_ms"] > 4 * t["configured_delay_ms"]


def test_transfer_stats_count_only_model_messages_and_survive_a_checkpoint() -> None:
    stats = TransferStats()
    for i in range(20):  # run directories of format 1 name kinds by class (Task)
        stats.record({"ev": "deliver", "kind": "Task" if i % 2 else "task", "dir": "down",
                      "t": 1.0 + i / 1000, "sent_at": 1.0, "bytes": 1000})
    stats.record({"ev": "deliver", "kind": "ready", "dir": "up", "t": 2.0, "sent_at": 1.0,
                  "bytes": 10})
    stats.record({"ev": "drop", "kind": "update", "dir": "up", "t": 2.0, "sent_at": 1.0})
    again = TransferStats()
    again.restore(stats.state())
    for s in (stats, again):
        out = s.summary({"down": 50.0})
        assert out["up"] == {"messages": 0, "p50_ms": None, "p95_ms": None, "max_ms": None,
                             "mean_bytes": None, "configured_delay_ms": None}
        assert out["down"]["messages"] == 20
        assert out["down"]["p50_ms"] == 9.5
        assert out["down"]["max_ms"] == 19.0
        assert out["down"]["configured_delay_ms"] == 50.0
