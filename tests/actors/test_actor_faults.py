"""Faults through the real actors: a lost host, hostile peers, a crashing reader.

Each test scripts the fault from ``during(run)``, a coroutine started with
the federation on the same virtual clock, and asserts what the run did
about it from its event log and summary.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import numpy as np
import pytest
from actor_scenarios import build, of

from fedsim.testing.federation import ADDRESS, InMemoryRun, run_in_memory
from fedsim.wire.codec import encode
from fedsim.wire.messages import Update
from fedsim.wire.tensors import Model

pytestmark = pytest.mark.timeout(60)

#: Emulated second at which a fault is injected (the run's clock starts a
#: hair after the loop's, so event times are close to, not equal to, it).
FAULT_AT = 1.0


async def _kill_host_1(run: InMemoryRun) -> None:
    await asyncio.sleep(FAULT_AT)
    run.kill_host(1)


def _check_host_1_lost(run: InMemoryRun) -> float:
    """The summary and the log name host-1 as lost; returns when it was lost."""
    (failure,) = run.summary["host_failures"]
    assert failure["host"] == "host-1"
    assert failure["clients"] == 3
    (lost,) = of(run.events(), "host_lost")
    assert lost["host"] == "host-1"
    assert lost["clients"] == 3
    assert run.summary["fidelity"]["hosts_unreported"] == ["host-1"]
    assert run.summary["fidelity"]["hosts_reported"] == 1
    assert run.host_codes == [0, None]
    # its three clients' work is lost work, by cause
    assert run.summary["lost_work"]["by_reason"] == {"host_lost": 3}
    assert run.summary["lost_work"]["clients"] == [1, 3, 5]
    return float(lost["t"])


def test_dga_rounds_keep_completing_after_a_host_is_lost(tmp_path: Path) -> None:
    """Old bug: after a client was lost, DGA's reducer waited for it forever."""
    sc = build({"name": "dga", "local_steps": 3}, run={"time_budget": 3.0},
               devices={"step_time": 0.01})
    run = run_in_memory(sc, tmp_path / "run", hosts=2, during=_kill_host_1)
    assert run.summary["status"] == "completed", run.summary["status"]
    t_lost = _check_host_1_lost(run)
    after = [e for e in of(run.events(), "aggregate") if e["t"] > t_lost]
    # rounds of 3 steps of 10 ms, 40 ms round trips: dozens in the remaining 2 s
    assert len(after) >= 10, len(after)
    assert {c for e in after[1:] for c in e["clients"]} == {0, 2, 4}
    assert after[-1]["t"] > 2.5  # still aggregating near the end of the budget


def test_fedasync_goes_on_with_the_other_host_after_a_host_is_lost(tmp_path: Path) -> None:
    sc = build({"name": "fedasync", "concurrency": 4}, run={"time_budget": 3.0})
    run = run_in_memory(sc, tmp_path / "run", hosts=2, during=_kill_host_1)
    assert run.summary["status"] == "completed", run.summary["status"]
    t_lost = _check_host_1_lost(run)
    events = run.events()
    after = [e for e in of(events, "aggregate") if e["t"] > t_lost + 0.1]
    assert len(after) >= 10, len(after)
    assert {c for e in after for c in e["clients"]} == {0, 2, 4}
    assert after[-1]["t"] > 2.5
    # the lost host's clients got no task after the loss
    sent = [e for e in of(events, "send", dir="down") if e["t"] > t_lost]
    assert {e["client"] for e in sent} <= {0, 2, 4}


def test_fedavg_rounds_go_on_without_a_lost_host(tmp_path: Path) -> None:
    """A synchronous round waiting for a dead host's clients closes without them."""
    sc = build({"name": "fedavg", "fraction": 1.0}, run={"time_budget": 3.0})
    run = run_in_memory(sc, tmp_path / "run", hosts=2, during=_kill_host_1)
    assert run.summary["status"] == "completed", run.summary["status"]
    t_lost = _check_host_1_lost(run)
    after = [e for e in of(run.events(), "aggregate") if e["t"] > t_lost]
    assert len(after) >= 10, len(after)
    assert all(set(e["clients"]) == {0, 2, 4} for e in after[1:])


def test_rejected_messages_are_counted_by_reason_and_the_run_goes_on(tmp_path: Path) -> None:
    sc = build({"name": "fedasync", "concurrency": 4}, run={"time_budget": 3.0})

    async def rogue(run: InMemoryRun) -> None:
        await asyncio.sleep(FAULT_AT)
        assert run.server is not None
        spec = run.server.update_spec
        n = spec.nbytes // 4

        def update(client: int, value: float) -> list[bytes | memoryview]:
            model = Model.from_flat(np.full(n, value, np.float32), spec)
            return encode(Update(client=client, task_id=1, base_version=0, round=0,
                                 num_samples=10, steps=1, loss=None, model=model))

        conn = run.network.connect(ADDRESS, b"rogue")
        await conn.send([b"\x00garbage"])       # not an envelope
        await conn.send(update(0, 0.0))         # client 0 runs on host-0, not here
        await conn.send(update(1, np.nan))      # NaN in the model

    run = run_in_memory(sc, tmp_path / "run", hosts=2, during=rogue)
    assert run.summary["status"] == "completed", run.summary["status"]
    rejected = run.summary["rejected_messages"]["server"]
    assert rejected == {"bad_envelope": 1, "unknown_client": 1, "non_finite": 1}, rejected
    events = run.events()
    rejects = of(events, "reject")
    assert sorted(e["reason"] for e in rejects) == ["bad_envelope", "non_finite",
                                                     "unknown_client"]
    assert all(e["sender"] == "rogue" and e["detail"] for e in rejects)
    t_last = max(e["t"] for e in rejects)
    assert t_last >= FAULT_AT - 0.1
    assert len([e for e in of(events, "aggregate") if e["t"] > t_last]) >= 10
    # nothing the rogue sent reached the algorithm: every update applied came
    # from a client that trained a task
    assert run.summary["updates"] <= len(of(events, "train_end"))


def test_a_crashing_reader_ends_the_run_with_an_error_and_a_summary(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    sc = build({"name": "fedasync", "concurrency": 4}, run={"time_budget": 60.0})

    async def break_reader(run: InMemoryRun) -> None:
        await asyncio.sleep(FAULT_AT)
        assert run.server is not None

        async def recv() -> None:
            raise RuntimeError("the reader broke")

        # the reader's next call (after the message it is waiting for) raises
        run.server.endpoint.recv = recv  # type: ignore[method-assign]

    with caplog.at_level(logging.ERROR, logger="fedsim.actors.server"):
        run = run_in_memory(sc, tmp_path / "run", hosts=2, during=break_reader)
    status = run.summary["status"]
    assert status.startswith("error"), status
    assert "the reader broke" in status
    assert (tmp_path / "run" / "summary.json").exists()
    errors = [r for r in caplog.records
              if r.levelno >= logging.ERROR and r.name == "fedsim.actors.server"]
    assert any("the reader broke" in r.getMessage() or
               (r.exc_info and "the reader broke" in str(r.exc_info[1])) for r in errors)
    (end,) = of(run.events(), "end")
    assert end["status"] == status
    # it ended at the crash (the next message after FAULT_AT), not at its
    # time budget nor after waiting for goodbyes a dead reader cannot read
    assert end["t"] < FAULT_AT + 1.0
    assert run.summary["emulated_seconds"] < FAULT_AT + 1.0
