"""Federations under netem: suspension, on/off availability, a 100 ms profile, dilation."""

from __future__ import annotations

import itertools
import json
import statistics
from pathlib import Path

import pytest

from fedsim.launch.runner import run_scenario
from fedsim.results.writer import read_events
from fedsim.scenario import load

from .conftest import SMALL

pytestmark = pytest.mark.timeout(240)

# SMALL's fixed [network.up]/[network.down] tables are replaced per test.
BASE = SMALL.split("[network.up]")[0]


def _run(tmp_path: Path, extra: str, dilation: float = 2.0,
         sets: list[str] | None = None) -> tuple[dict, list[dict]]:
    path = tmp_path / "s.toml"
    path.write_text(BASE + extra + "\n[deploy]\nhosts = 1\n")
    sc = load(path, sets)
    res = run_scenario(sc, tmp_path / "run", dilation=dilation, plots=False)
    return res.summary, list(read_events(res.run_dir / "events.jsonl"))


def _windows(events: list[dict], client: int) -> list[tuple[float, float]]:
    """(away, back) emulated times of one client."""
    out, start = [], None
    for e in events:
        if e.get("client") != client:
            continue
        if e["ev"] == "away":
            start = e["t"]
        elif e["ev"] == "back" and start is not None:
            out.append((start, e["t"]))
            start = None
    return out


# Over real processes one policy; all three, and AsyncFedED's suspension, run in
# memory on the fake clock (tests/actors/test_actor_availability.py).
@pytest.mark.parametrize("policy", ["reset"])
def test_onoff_clients_are_away_and_back(tmp_path: Path, policy: str) -> None:
    summary, events = _run(tmp_path, f"""
[algorithm]
name = "fedasync"
concurrency = 4
[availability]
model = "onoff"
mean_on = 1.5
mean_off = 0.5
[network]
in_flight = "{policy}"
[network.up]
delay = 0.02
[network.down]
delay = 0.02
""", sets=["run.time_budget=3"])  # 8 clients on/off every 2 s on average: ~12 away windows
    assert summary["status"] == "completed"
    assert summary["updates"] > 10
    total = 0
    for c in range(8):
        for t_away, t_back in _windows(events, c):
            total += 1
            inside = [x for x in events if x.get("client") == c and t_away < x["t"] < t_back]
            assert [x for x in inside if x["ev"] == "train_start"] == [], \
                f"client {c} trained while away"
            assert [x for x in inside if x["ev"] == "send" and x["dir"] == "up"] == [], \
                f"client {c} sent while away"
            if policy != "held":  # nothing reaches an away client
                assert [x for x in inside if x["ev"] == "deliver" and x["dir"] == "down"] == []
    assert total >= 3
    backs = [e for e in events if e["ev"] == "back"]
    sent = [e for e in events if e["ev"] == "send" and e["dir"] == "up"]
    registers = [e for e in sent if e["kind"] == "ready" and e["reset"]]
    readies = [e for e in sent if e["kind"] == "ready" and not e["reset"]]
    if policy != "held":
        assert all(e["held"] == 0 for e in backs)
    # Registration is set-up (the host's control path, before t = 0): no client
    # registers through the emulated network. Back from away, a client whose
    # connection was reset says so; the other policies say plain "ready".
    if policy == "reset":
        assert registers
        assert readies == []
    else:
        assert registers == []
        assert readies


def test_round_times_follow_a_100ms_profile_and_dilation(tmp_path: Path) -> None:
    """FedAvg over a 100 ms RTT profile: each round = RTT + compute + a little."""
    summary, events = _run(tmp_path, """
[algorithm]
name = "fedavg"
[network]
profile = "transpacific"
rtt = 0.1
""", sets=["devices.step_time=0.01", "run.max_rounds=12"])
    assert summary["status"] == "completed"
    closes = [e["t"] for e in events if e["ev"] == "aggregate"]
    assert len(closes) >= 10
    gaps = [b - a for a, b in itertools.pairwise(closes[1:])]  # the first round warms up
    compute = 10 * 0.01  # SMALL's local_steps = 10 at 10 ms a step
    # A round: task down (50 ms) + compute (100 ms) + update up (50 ms), the
    # slowest of 8 clients (1 ms normal jitter per direction). The model is
    # 18 KB = 13 segments; after 400 ms idle (> RTO) TCP restarts from
    # cwnd 10 (slow start after idle), so each direction takes one more RTT:
    # 0.05 + 0.1 + 0.05 + 2 x 0.1 = 0.4 s.
    expected = 0.1 + compute + 2 * 0.1
    median = statistics.median(gaps)
    assert expected <= median <= expected + 0.012, gaps
    assert sum(g < expected + 0.03 for g in gaps) >= len(gaps) // 2, gaps
    # Dilation 2: every event's real time is twice its emulated time.
    late = [e for e in events if e["ev"] == "aggregate"]
    ratios = [e["real"] / e["t"] for e in late if e["t"] > 1.0]
    assert statistics.median(ratios) == pytest.approx(2.0, rel=0.02)
    fid = summary["fidelity"]
    assert fid["links"]["default/down"]["configured_mean"] == pytest.approx(0.05)
    het = json.loads((tmp_path / "run" / "heterogeneity.json").read_text())
    assert len(het["clients"]) == 8
    assert het["clients"][0]["down"]["delay"] == pytest.approx(0.05)


ZERO_LATENCY = """
name = "zero-latency"
seed = 1
[data]
dataset = "synthetic"
num_clients = 40
[model]
name = "mlp"
hidden = [200]
[algorithm]
name = "fedavg"
fraction = 0.25
[client]
lr = 0.05
batch_size = 32
local_epochs = 1
[run]
max_rounds = 15
[devices]
step_time = 0.0
"""


def test_auto_dilation_makes_a_zero_latency_run_with_instant_devices_faithful(
        tmp_path: Path) -> None:
    """No link delay and instant devices: every real millisecond is lateness, and
    ``--dilation auto`` sizes the dilation from the turnaround and the compute
    it measures at start-up (tools/bench_overhead.py's task, smaller)."""
    path = tmp_path / "s.toml"
    path.write_text(ZERO_LATENCY)
    res = run_scenario(load(path), tmp_path / "run", dilation="auto", plots=False)
    fid = res.summary["fidelity"]
    used = json.loads((tmp_path / "run" / "scenario.json").read_text())["run"]["dilation"]
    assert res.summary["status"] == "completed"
    # 10 tasks a round on at most 2 hosts: the measured work is milliseconds
    # against a 1 ms allowance, so auto goes well beyond 1
    assert used == fid["dilation"] >= 8
    # instant devices' results are judged: 150 deliveries down, 150 results
    assert fid["lateness_ms"]["n"] >= 300
    assert fid["verdict"] == "pass", fid["reasons"]
