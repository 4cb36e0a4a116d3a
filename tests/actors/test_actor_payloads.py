"""Each version's model crosses to a host, and from it to the trainer, once
(fedsim/wire/payloads.py), and nothing emulated changes for it.

Through the real actors on virtual time: every frame the server sends to a
host and every request a host sends to its trainer is seen; a run where
every task and average carries its model (the record of what a receiver
holds made to forget everything) gives the same emulated run, byte for byte
charged to the links, event for event.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from actor_scenarios import build

from fedsim.actors import worker as worker_module
from fedsim.testing.federation import run_in_memory
from fedsim.wire import payloads
from fedsim.wire.codec import decode
from fedsim.wire.messages import Advance

pytestmark = pytest.mark.timeout(120)

FEDAVG = ({"name": "fedavg"}, {"data": {"num_clients": 10}, "run": {"time_budget": 2.0}})
DGA = ({"name": "dga", "local_steps": 2, "delay": 2},
       {"data": {"num_clients": 6}, "run": {"time_budget": 1.5}})


def _spy(monkeypatch: pytest.MonkeyPatch) -> Counter[tuple[str, int, bool]]:
    """Counts, per (kind, version or round, model carried), the requests that reached
    a trainer: a task's frames and each average an Advance was built from."""
    seen: Counter[tuple[str, int, bool]] = Counter()
    train = worker_module.InlineWorker.train

    async def spied(self: Any, frames: list[Any]) -> Any:
        task, _ = decode(frames, check_finite=False)
        seen[("task", task.version, task.model is not None)] += 1  # type: ignore[union-attr]
        return await train(self, frames)

    monkeypatch.setattr(worker_module.InlineWorker, "train", spied)
    return seen


def _run(tmp_path: Path, case: tuple[dict[str, Any], dict[str, Any]], name: str) -> Any:
    algorithm, sections = case
    return run_in_memory(build(algorithm, **sections), tmp_path / name, hosts=2)


def _emulated(run: Any) -> list[tuple[Any, ...]]:
    """What the run did in emulated time: every event's time, kind, client and bytes."""
    return sorted((e["t"], e["ev"], e.get("client"), e.get("kind"), e.get("bytes"),
                   e.get("version"), e.get("round")) for e in run.events())


@pytest.mark.parametrize("case", [FEDAVG, DGA], ids=["fedavg", "dga"])
def test_leaving_out_held_models_changes_nothing_emulated(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: Any) -> None:
    once = _run(tmp_path, case, "once")
    with monkeypatch.context() as m:
        m.setattr(payloads.SentVersions, "needs", lambda self, version: True)
        every = _run(tmp_path, case, "every")
    a, b = once.summary, every.summary
    for key in ("updates", "rounds", "bytes_up", "bytes_down", "final_accuracy", "staleness",
                "emulated_seconds"):
        assert a[key] == b[key], key
    assert _emulated(once) == _emulated(every)
    # what really crossed: far less when the hosts keep what they hold
    assert a["wire_bytes_down"] < 0.6 * b["wire_bytes_down"]
    assert b["wire_bytes_down"] == b["bytes_down"]


def test_each_version_crosses_to_a_host_and_to_its_trainer_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _spy(monkeypatch)
    run = _run(tmp_path, FEDAVG, "fedavg")
    s = run.summary
    assert s["rounds"] >= 3
    # every round's 10 tasks: 5 to each of 2 hosts; the model goes with one per host
    versions = {v for (_, v, _) in seen}
    for v in versions:
        assert seen[("task", v, True)] == 2, (v, seen)
        assert seen[("task", v, True)] + seen[("task", v, False)] == 10
    # the server's real bytes: per round 2 tasks with the model and 8 without
    per_task = s["bytes_down"] / (10 * len(versions))
    assert s["wire_bytes_down"] < s["bytes_down"] * (2 / 10) + 8 * len(versions) * 0.05 * per_task


def test_each_round_average_crosses_to_a_trainer_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """DGA: every client of a host continues with the same round's average; the first
    Advance to the host's trainer carries it, the others name it as held."""
    seen: Counter[tuple[int, bool]] = Counter()
    request = worker_module.InlineWorker.request

    async def spied(self: Any, msg: Any) -> Any:
        if isinstance(msg, Advance):
            for r in msg.rounds:
                seen[(r, True)] += 1
            for r in msg.held:
                seen[(r, False)] += 1
        return await request(self, msg)

    monkeypatch.setattr(worker_module.InlineWorker, "request", spied)
    run = _run(tmp_path, DGA, "dga")
    assert run.summary["rounds"] >= 3
    rounds = sorted({r for (r, _) in seen})
    assert len(rounds) >= 3
    # 6 clients on 2 hosts (3 each): each round's average carried once per trainer,
    # named as held by the host's other clients
    for r in rounds[:-1]:   # (the last round may end the run half way)
        assert seen[(r, True)] == 2, (r, seen)
        assert seen[(r, False)] == 4, (r, seen)
