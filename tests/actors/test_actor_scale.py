"""What keeps thousands of clients cheap: the mechanisms, on small federations.

An idle client actor is a small object (no task, no timer, no link, no
random stream until it is used); the actors are built, and the heap frozen,
before the host registers (set-up, not emulated time); the server arms one
timer per algorithm deadline, makes an uplink on a client's first message
and still reports every link kind; a host sends its event records in batches
of at most 500; a checkpoint packs the per-client sample counts.
``python tools/bench_scale.py`` measures what they buy at 1,000-10,000 clients.
"""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from actor_scenarios import build, of

from fedsim.actors.host import ClientHost
from fedsim.actors.runstate import _pack_counts, _unpack_counts
from fedsim.algorithms.flows import AsyncFlow
from fedsim.testing.federation import InMemoryRun, run_in_memory
from fedsim.testing.memory_network import MemoryNetwork, Packet
from fedsim.wire.codec import decode
from fedsim.wire.messages import EventBatch, HostHello

pytestmark = pytest.mark.timeout(120)


def _crowd(n: int, **sections: Any) -> Any:
    return build({"name": "fedasync", "concurrency": 2},
                 data={"num_clients": n, "max_samples_per_client": 16},
                 **{"run": {"time_budget": 2.0}, **sections})


def test_idle_clients_hold_no_task_no_timer_no_link(tmp_path: Path) -> None:
    seen: dict[str, int] = {}

    async def look(run: InMemoryRun) -> None:
        host = run.hosts[0]
        await host.started.wait()
        await asyncio.sleep(1.0)  # mid-run: 2 clients at work, 38 idle
        actors = list(host.clients.values())
        seen["tasks"] = sum(a.task is not None for a in actors)
        seen["timers"] = len(host.timers)
        seen["links"] = sum(a.has_link for a in actors)
        seen["streams"] = sum(a._rngs is not None for a in actors)
        assert run.server is not None
        seen["uplinks"] = len(run.server.client_links.links)
        seen["admitted"] = len(run.server.client_links.admitted)

    run = run_in_memory(_crowd(40), tmp_path / "run", during=look)
    s = run.summary
    assert s["status"] == "completed"
    assert s["updates"] > 4
    tasked = {e["client"] for e in of(run.events(), "send", kind="task")}
    assert 4 < len(tasked) < 40
    assert seen["tasks"] <= 2                    # only the clients at work have a task
    assert seen["timers"] <= 4                   # their deliveries and compute, nobody else's
    assert seen["links"] <= len(tasked)          # a downlink once a message came
    assert seen["streams"] <= len(tasked)        # device streams once a task ran
    assert seen["uplinks"] <= len(tasked)        # the server's uplinks: once a client sent
    assert seen["admitted"] == 40
    assert "default/up" in s["fidelity"]["links"]  # the kind is reported all the same


def test_clients_are_built_and_the_heap_frozen_before_the_host_registers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at_hello: list[tuple[int, bool, int]] = []
    original = ClientHost._control

    async def spy(self: ClientHost, msg: Any) -> None:
        if isinstance(msg, HostHello):
            at_hello.append((len(self.clients), "_devices" in vars(self.plan),
                             gc.get_freeze_count()))
        await original(self, msg)

    monkeypatch.setattr(ClientHost, "_control", spy)
    frozen_during: list[int] = []

    async def look(run: InMemoryRun) -> None:
        await run.hosts[0].started.wait()
        frozen_during.append(gc.get_freeze_count())

    run = run_in_memory(_crowd(12), tmp_path / "run", hosts=2, during=look)
    assert run.summary["status"] == "completed"
    assert [n for n, _, _ in at_hello] == [6, 6]           # every actor exists already
    assert all(drawn for _, drawn, _ in at_hello)          # and every device is drawn
    assert all(frozen > 0 for _, _, frozen in at_hello)    # the set-up is out of gc's sight
    assert frozen_during
    assert frozen_during[0] > 0
    assert gc.get_freeze_count() == 0                      # handed back after the run


def test_one_timer_per_algorithm_deadline(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Every step asks again for the oldest task's timeout; each deadline fires once
    (it used to fire once per step that asked, and each firing scanned every client)."""
    fired: list[float] = []
    original = AsyncFlow.timer

    def spy(self: AsyncFlow, now: float) -> Any:
        fired.append(now)
        return original(self, now)

    monkeypatch.setattr(AsyncFlow, "timer", spy)
    sc = build({"name": "fedasync", "concurrency": 4, "task_timeout": 0.3},
               run={"time_budget": 3.0})
    run = run_in_memory(sc, tmp_path / "run")
    assert run.summary["updates"] > 10
    assert fired, "no timeout deadline came"
    assert len(fired) == len(set(fired))


def test_a_host_sends_its_records_in_batches_of_at_most_500(tmp_path: Path) -> None:
    """At t = 0 every client that starts away records it: 1,000 records here."""
    sizes: list[int] = []
    net = MemoryNetwork()

    def route(packet: Packet) -> None:
        if isinstance(packet.source, bytes):  # a host's message
            msg, _ = decode(list(packet.frames))
            if isinstance(msg, EventBatch):
                sizes.append(len(msg.events))
        net.deliver(packet)

    net.route = route
    sc = _crowd(1250, availability={"model": "onoff", "mean_on": 10.0, "mean_off": 40.0,
                                    "start": "stationary"},
                run={"time_budget": 0.5})
    run = run_in_memory(sc, tmp_path / "run", network=net)
    away0 = [e for e in of(run.events(), "away") if e["t"] < 0.01]
    assert len(away0) > 800
    assert sizes
    assert max(sizes) <= 500
    assert sum(sizes) >= len(away0)


def test_sample_counts_are_packed_in_a_checkpoint() -> None:
    counts = {c: 10 + c % 7 for c in range(0, 20_000, 2)}
    packed = _pack_counts(counts)
    assert set(packed) == {"ids", "counts"}
    assert all(isinstance(v, np.ndarray) for v in packed.values())
    assert _unpack_counts(packed) == counts
    assert _unpack_counts({"3": 5, 7: 2}) == {3: 5, 7: 2}  # a checkpoint written before
