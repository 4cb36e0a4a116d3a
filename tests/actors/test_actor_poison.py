"""A poisoned client through the real actors: all weights 1000 on every update it sends.

Client 0 is authenticated and well-formed (its host's worker replaces its
trained model with 1000 everywhere, as a malicious client would). Without a
defence the global model is destroyed: its test loss grows by orders of
magnitude (its accuracy is the argmax of logits in the thousands, which
lands anywhere between chance and the clean run's, depending on the local
runs' random streams); the update guard (async and rounds) and the robust
aggregators (rounds) keep the accuracy within 0.03 of the clean run.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from actor_scenarios import build, of

from fedsim.actors import worker as worker_module
from fedsim.testing.federation import run_in_memory
from fedsim.wire.tensors import to_model

pytestmark = pytest.mark.timeout(120)

POISONED = 0


@pytest.fixture
def poison(monkeypatch: pytest.MonkeyPatch) -> dict[str, bool]:
    """Client 0's uploads become all 1000 while ``poison["on"]``."""
    switch = {"on": True}
    real = worker_module.Worker._handle

    def handle(self: Any, msg: Any) -> Any:
        reply, upload = real(self, msg)
        if switch["on"] and upload is not None and upload.client == POISONED:
            bad = torch.full((upload.model.spec.nbytes // 4,), 1000.0)
            upload = replace(upload, model=to_model(bad, upload.model.spec))
        return reply, upload

    monkeypatch.setattr(worker_module.Worker, "_handle", handle)
    return switch


_RUNS: dict[str, dict[str, Any]] = {}


def _run(tmp_path: Path, name: str, algorithm: dict[str, Any]) -> dict[str, Any]:
    """A run's summary; the clean and undefended references are run once per module."""
    key = f"{name}:{sorted(algorithm.items())}"
    if name in ("clean", "undefended") and key in _RUNS:
        return _RUNS[key]
    # IID clients: an honest client left out changes nothing, so the defended
    # run can be held to the clean one
    sc = build(algorithm, run={"time_budget": 4.0}, eval={"every_rounds": 5},
               data={"num_clients": 10, "synthetic_iid": True, "max_samples_per_client": 128})
    summary = run_in_memory(sc, tmp_path / name, hosts=2).summary
    _RUNS[key] = summary
    return summary


ROUNDS = {"name": "fedavg"}
ASYNC = {"name": "fedasync", "concurrency": 3}
GUARD = {"guard": {"max_norm": 50.0, "norm_factor": 3.0}}


@pytest.mark.parametrize(("base", "defence"), [
    (ROUNDS, GUARD),
    (ROUNDS, {"aggregator": "median"}),
    (ROUNDS, {"aggregator": "trimmed_mean", "trim": 0.2}),
    (ASYNC, GUARD),
], ids=["rounds-guard", "median", "trimmed-mean", "async-guard"])
def test_a_defence_holds_the_accuracy_against_a_poisoned_client(
        tmp_path: Path, poison: dict[str, bool], base: dict[str, Any],
        defence: dict[str, Any]) -> None:
    poison["on"] = False
    clean = _run(tmp_path, "clean", base)
    poison["on"] = True
    poisoned = _run(tmp_path, "undefended", base)
    defended = _run(tmp_path, "defended", {**base, **defence})
    assert poisoned["status"] == "completed"
    assert defended["status"] == "completed"
    assert poisoned["final_loss"] > 100 * clean["final_loss"], poisoned
    assert poisoned["final_accuracy"] < clean["final_accuracy"], poisoned
    assert defended["final_accuracy"] == pytest.approx(clean["final_accuracy"], abs=0.03)


def test_clipping_bounds_the_damage_but_does_not_remove_it(
        tmp_path: Path, poison: dict[str, bool]) -> None:
    # a clipped poison still pushes, every round, as far as the bound allows
    poisoned = _run(tmp_path, "undefended", ROUNDS)
    clipped = _run(tmp_path, "clipped", {**ROUNDS, "guard": {
        "max_norm": 50.0, "norm_factor": 1.5, "action": "clip"}})
    assert clipped["final_loss"] < poisoned["final_loss"] / 100
    # every clip is counted (the poisoned client's, one per round it took part in)
    assert clipped["guard"]["rejected"] == 0
    assert clipped["guard"]["clipped"] >= clipped["rounds"] - 1
    assert poisoned["guard"] is None  # no guard: nothing to count


def test_guard_rejections_are_logged_with_their_reason(tmp_path: Path,
                                                       poison: dict[str, bool]) -> None:
    sc = build({**ASYNC, "guard": {"max_norm": 50.0}}, run={"time_budget": 3.0})
    run = run_in_memory(sc, tmp_path / "run", hosts=2)
    events = run.events()
    discards = [e for e in of(events, "discard") if "guard" in e["reason"]]
    assert discards
    assert {e["client"] for e in discards} == {POISONED}
    assert all("over the bound 50" in e["reason"] for e in discards)
    # bounded from the first update on: the poisoned client never got in
    assert not [e for e in of(events, "aggregate") if POISONED in e["clients"]]
    assert run.summary["guard"] == {"rejected": len(discards), "clipped": 0}
