"""What a client host restarted mid-run takes back: its clients' algorithm state, if kept.

SCAFFOLD's client control variates live in the host's torch worker. A host
that crashes loses them; restarted with a state directory (``fedsim
clients --state DIR``) it loads what its worker saved after each task.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from actor_scenarios import build, of

from fedsim.testing.federation import InMemoryRun, run_in_memory

pytestmark = pytest.mark.timeout(60)


def _scaffold_restart(tmp_path: Path, state_dir: Path | None) -> tuple[InMemoryRun, Any, Any]:
    sc = build({"name": "scaffold", "fraction": 0.67}, run={"time_budget": 4.0})
    seen: dict[str, Any] = {}

    async def crash_and_restart(run: InMemoryRun) -> None:
        await asyncio.sleep(1.5)
        seen["before"] = run.hosts[1].trainer.worker.client.state_dict()
        run.kill_host(1)
        await asyncio.sleep(0.5)
        run.restart_host(1)
        await asyncio.sleep(0.01)
        seen["after"] = run.hosts[1].trainer.worker.client.state_dict()
        seen["restored"] = run.hosts[1].trainer.worker.restored

    run = run_in_memory(sc, tmp_path / "run", hosts=2, during=crash_and_restart,
                        state_dir=state_dir)
    assert run.summary["status"] == "completed", run.summary["status"]
    assert of(run.events(), "host_joined")
    return run, seen["before"], (seen["after"], seen["restored"])


def test_a_restarted_host_without_state_starts_its_clients_afresh(tmp_path: Path) -> None:
    _, before, (after, restored) = _scaffold_restart(tmp_path, None)
    assert not restored
    assert before != after  # the control variates learned before the crash are gone


def test_a_restarted_host_with_its_state_directory_takes_its_clients_state_back(
        tmp_path: Path) -> None:
    _, before, (after, restored) = _scaffold_restart(tmp_path, tmp_path / "state")
    assert restored
    assert before == after
