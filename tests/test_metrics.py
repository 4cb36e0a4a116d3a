"""Run-directory files stay readable when a run is killed mid-write; the bounded
estimator behind the summary's ``phases`` (:class:`fedsim.results.phases.Durations`)."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import numpy as np
import pytest

from fedsim.results.phases import PHASES, Durations, PhaseStats
from fedsim.results.writer import (
    EventLog,
    MetricsTable,
    read_events,
    read_metrics,
    write_json_atomic,
)


def test_torn_last_lines_are_skipped(tmp_path: Path) -> None:
    log = EventLog(tmp_path / "events.jsonl")
    for i in range(3):
        log.write({"t": i, "real": i, "ev": "x"})
    log.close()
    with open(tmp_path / "events.jsonl", "a") as fh:
        fh.write('{"t": 3, "real": 3, "ev": "x", "cli')  # killed mid-record
    assert [e["t"] for e in read_events(tmp_path / "events.jsonl")] == [0, 1, 2]

    table = MetricsTable(tmp_path / "metrics.csv")
    table.append({"t": 1.0, "accuracy": 0.5})
    table.append({"t": 2.0, "accuracy": 0.75})
    table.close()
    with open(tmp_path / "metrics.csv", "a") as fh:
        fh.write("3.0,1.2,4")
    rows = read_metrics(tmp_path / "metrics.csv")
    assert [r["accuracy"] for r in rows] == [0.5, 0.75]
    assert math.isnan(rows[0]["loss"])


def test_summary_is_replaced_atomically(tmp_path: Path) -> None:
    path = tmp_path / "summary.json"
    write_json_atomic(path, {"a": 1})
    write_json_atomic(path, {"a": 2}, durable=True)
    assert json.loads(path.read_text()) == {"a": 2}
    assert not list(tmp_path.glob("*.tmp"))




# -- Durations: the bounded estimator of summary["phases"] -------------------------------

def test_durations_are_exact_while_they_fit() -> None:
    d = Durations(capacity=200)
    xs = [i / 1000 for i in range(1, 101)]
    for x in reversed(xs):
        d.add(x)
    assert d.summary() == {
        "n": 100, "mean": round(sum(xs) / 100, 9),
        "p50": round(float(np.quantile(xs, 0.5)), 9),
        "p95": round(float(np.quantile(xs, 0.95)), 9),
        "p99": round(float(np.quantile(xs, 0.99)), 9), "max": 0.1}
    assert sorted(d.values()) == xs


def test_empty_durations_say_none_and_non_durations_are_ignored() -> None:
    d = Durations()
    for x in (-1e-6, math.nan, math.inf, -math.inf):
        d.add(x)
    assert d.summary() == {"n": 0, "mean": None, "p50": None, "p95": None, "p99": None,
                           "max": None}
    with pytest.raises(ValueError, match="Invalid Durations capacity 0: must be an int >= 1"):
        Durations(capacity=0)


def test_a_long_stream_keeps_a_bounded_uniform_sample() -> None:
    """200,000 values in increasing order (so a sample biased to early or late values
    shows): memory stays at the capacity, n/mean/max stay exact, quantiles close."""
    d = Durations(capacity=1000, seed=7)
    n = 200_000
    for i in range(n):
        d.add(i / n)
    assert len(d.values()) == 1000
    s = d.summary()
    assert s["n"] == n
    assert s["max"] == round((n - 1) / n, 9)
    assert s["mean"] == pytest.approx((n - 1) / 2 / n)
    assert s["p50"] == pytest.approx(0.5, abs=0.05)
    assert s["p95"] == pytest.approx(0.95, abs=0.02)
    assert s["p99"] == pytest.approx(0.99, abs=0.01)
    assert s["p50"] <= s["p95"] <= s["p99"] <= s["max"]


def test_a_merge_weighs_each_source_by_its_count() -> None:
    """A host that measured 150,000 durations in [1, 2) and sent 256 of them weighs
    three times the server's own 50,000 in [0, 1)."""
    rng = random.Random(1)
    server = Durations(capacity=1000, seed=2)
    for _ in range(50_000):
        server.add(rng.random())
    host = Durations(capacity=256, seed=3)
    for _ in range(150_000):
        host.add(1 + rng.random())
    e = host.export()
    assert len(e["values"]) == 256
    server.merge(e["count"], e["sum"], e["max"], e["values"])
    assert server.count == 200_000
    assert len(server.values()) == 1000
    assert server.max == host.max
    assert server.sum == pytest.approx(50_000 * 0.5 + 150_000 * 1.5, rel=0.01)
    above = sum(v >= 1 for v in server.values()) / 1000
    assert above == pytest.approx(0.75, abs=0.06)
    assert server.summary()["p50"] == pytest.approx(4 / 3, abs=0.1)  # sd about 0.03


def test_many_small_merges_into_a_full_sample_keep_it_uniform() -> None:
    """A host's batch every 0.25 s: 400 merges of 10 values standing for 2,500
    each, into a full sample of a million; the new half is half the sample."""
    rng = random.Random(4)
    d = Durations(capacity=1000, seed=5)
    for _ in range(1_000_000):
        d.add(rng.random())
    for _ in range(400):
        d.merge(2500, 2500 * 1.5, 2.0, [1 + rng.random() for _ in range(10)])
    assert d.count == 2_000_000
    assert len(d.values()) == 1000
    above = sum(v >= 1 for v in d.values()) / 1000
    assert above == pytest.approx(0.5, abs=0.06)


def test_a_merge_that_fits_keeps_every_value_and_one_that_claims_much_stays_bounded() -> None:
    d = Durations(capacity=100)
    d.add(0.5)
    d.merge(3, 0.6, 0.3, [0.1, 0.2, 0.3])
    assert sorted(d.values()) == [0.1, 0.2, 0.3, 0.5]
    assert (d.count, d.sum, d.max) == (4, pytest.approx(1.1), 0.5)
    d.merge(10, 1.0, 0.1, [0.1, 0.1])  # 10 durations, 2 of them sent: 10 drawn from those
    assert d.count == len(d.values()) == 14
    d.merge(10**15, 2e14, 0.2, [0.2, 0.2, 0.2])  # a claim of 10**15: O(capacity), no more
    assert d.count == 10**15 + 14
    assert len(d.values()) == 100
    assert d.summary()["p50"] == 0.2
    d.merge(0, 0.0, 0.0, [])
    d.merge(5, 1.0, 1.0, [math.nan, -1.0])  # nothing usable: nothing changes
    assert d.count == 10**15 + 14


def test_phase_stats_nest_by_phase_hand_over_their_samples_and_survive_a_checkpoint() -> None:
    server = PhaseStats()
    summary = server.summary()
    assert [f"{p}.{part}" for p, parts in summary.items() for part in parts] == list(PHASES)
    assert summary["compute"]["budget"]["n"] == 0

    host = PhaseStats(["decode.hosts", "compute.real"], capacity=4)
    for x in (0.1, 0.2, 0.3, 0.4, 0.5, 0.6):
        host.add("decode.hosts", x)
    taken = host.take()
    assert [name for name, _ in taken] == ["decode.hosts"]  # only what was measured
    name, e = taken[0]
    assert (e["count"], e["max"], len(e["values"])) == (6, 0.6, 4)
    assert host.take() == []  # it starts afresh
    server[name].merge(e["count"], e["sum"], e["max"], e["values"])
    server.add("aggregation.server", 0.01)

    again = PhaseStats()
    again.restore(json.loads(json.dumps(server.state())))  # what a checkpoint keeps
    assert again.summary() == server.summary()
    assert again.summary()["decode"]["hosts"]["n"] == 6
