"""Time across machines, on the fake clock: a skewed host clock and real transit.

A host whose monotonic clock is 500 s ahead measures the offset from its
clock probes and maps the server's epoch onto its own clock: its emulated
time is the server's, to within its uncertainty. Real transit shorter than
the emulated link delay is absorbed (each message is delivered at its
emulated send time plus the link's delay: nothing is added twice); transit
longer than the delay shows, as late arrivals of that host, not judged.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from actor_scenarios import build, of

from fedsim.testing.federation import run_in_memory
from fedsim.testing.memory_network import MemoryNetwork, Packet

pytestmark = pytest.mark.timeout(60)


def _slow_path(net: MemoryNetwork, host: bytes, transit: float) -> None:
    """Every packet between the server and ``host`` takes ``transit`` more (both ways)."""

    def route(packet: Packet) -> None:
        if host in (packet.source, packet.destination):
            asyncio.get_running_loop().call_later(transit, net.deliver, packet)
        else:
            net.deliver(packet)

    net.route = route


def _sc() -> object:
    return build({"name": "fedasync", "concurrency": 4}, run={"time_budget": 3.0},
                 network={"up": {"delay": 0.05}, "down": {"delay": 0.05}})


def test_a_skewed_clock_is_measured_and_emulated_time_agrees(tmp_path: Path) -> None:
    run = run_in_memory(_sc(), tmp_path / "run", hosts=2, clock_skew={1: 500.0})
    s = run.summary
    assert s["status"] == "completed"
    clocks = s["fidelity"]["clocks"]
    assert clocks["host-0"]["offset_s"] == pytest.approx(0.0, abs=1e-9)
    assert clocks["host-1"]["offset_s"] == pytest.approx(-500.0, abs=1e-9)
    assert s["fidelity"]["verdict"] == "pass", s["fidelity"]["reasons"]
    # host-1's sends are stamped in the server's time: its uplink deliveries
    # come exactly one link delay after them
    events = run.events()
    ups = [e for e in of(events, "deliver", dir="up") if e["client"] % 2 == 1]
    assert ups
    assert all(e["t"] - e["sent_at"] == pytest.approx(0.05, abs=1e-6) for e in ups)
    assert s["late_arrivals"] == 0


def test_real_transit_shorter_than_the_link_is_absorbed(tmp_path: Path) -> None:
    net = MemoryNetwork()
    _slow_path(net, b"host-1", 0.02)  # 20 ms of real transit under a 50 ms link
    # at dilation 10 the clock's +-20 ms real is +-2 ms emulated: within the allowance
    run = run_in_memory(_sc(), tmp_path / "run", hosts=2, network=net, dilation=10.0)
    s = run.summary
    assert s["status"] == "completed"
    assert s["late_arrivals"] == 0
    assert s["fidelity"]["verdict"] == "pass", s["fidelity"]["reasons"]
    # the round trip of host-1's clock probes saw the transit; its uncertainty says so
    # (and at dilation 1 the same +-20 ms would fail the verdict: the next test)
    clock = s["fidelity"]["clocks"]["host-1"]
    assert clock["rtt_ms"] == pytest.approx(40.0, abs=0.5)
    assert clock["offset_s"] == pytest.approx(0.0, abs=1e-6)  # symmetric: no bias
    # every uplink delivery still one link delay after its send: not 50 + 2 ms
    ups = [e for e in of(run.events(), "deliver", dir="up") if e["client"] % 2 == 1]
    assert ups
    assert all(e["t"] - e["sent_at"] == pytest.approx(0.05, abs=1e-6) for e in ups)


def test_real_transit_longer_than_the_link_shows_as_late_arrivals(tmp_path: Path) -> None:
    net = MemoryNetwork()
    _slow_path(net, b"host-1", 0.08)  # 80 ms of real transit under a 50 ms link
    run = run_in_memory(_sc(), tmp_path / "run", hosts=2, network=net)
    s = run.summary
    assert s["status"] == "completed"
    assert s["fidelity"]["clocks"]["host-1"]["late_arrivals"] > 10
    assert s["fidelity"]["clocks"]["host-0"]["late_arrivals"] == 0
    assert s["late_arrivals"] == s["fidelity"]["clocks"]["host-1"]["late_arrivals"]
    # and its clock, known only to +-80 ms, fails the verdict by name
    assert s["fidelity"]["verdict"] == "fail"
    assert any("clock[host-1]" in r for r in s["fidelity"]["reasons"])

