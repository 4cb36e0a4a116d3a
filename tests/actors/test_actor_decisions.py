"""Algorithm decisions through the real actors: every update is applied, buffered
or discarded with a logged reason, and an algorithm's error is a discard.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import pytest
import torch
from actor_scenarios import build, of

from fedsim.algorithms import api as algorithms_api
from fedsim.algorithms.api import AlgorithmSpec, ServerContext, register
from fedsim.algorithms.fedavg import fedavg_aggregate
from fedsim.algorithms.fedbuff import FedBuff
from fedsim.algorithms.flows import RoundRule, RoundsConfig, RoundsFlow
from fedsim.algorithms.sgdclient import local_sgd_client
from fedsim.testing.federation import run_in_memory
from fedsim.wire.messages import Update

pytestmark = pytest.mark.timeout(60)


def test_fedbuff_reports_every_max_staleness_discard_even_with_a_buffered_update(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Old bug: FedBuff dropped an update over max_staleness silently when
    its buffer held other updates."""
    seen: list[dict[str, Any]] = []  # the rule's own answer to each discarded update
    aggregate = FedBuff.aggregate

    def spy(self: FedBuff, x: torch.Tensor, version: int,
            result: Update) -> tuple[torch.Tensor | None, dict[str, Any]]:
        new, info = aggregate(self, x, version, result)
        if info.get("discarded"):
            seen.append(info)
        return new, info

    monkeypatch.setattr(FedBuff, "aggregate", spy)
    # jittery links: results come back out of dispatch order, so a stale one
    # often arrives while a fresh one waits in the buffer
    jittery = {"delay": 0.02, "jitter": 0.02}
    sc = build({"name": "fedbuff", "buffer_size": 2, "max_staleness": 0, "concurrency": 4},
               run={"time_budget": 2.0}, network={"up": jittery, "down": jittery})
    run = run_in_memory(sc, tmp_path / "run", hosts=2)
    assert run.summary["status"] == "completed", run.summary["status"]
    events = run.events()
    discards = of(events, "discard")
    assert len(discards) >= 10, len(discards)
    assert all("max_staleness" in e["reason"] and e["staleness"] >= 1 for e in discards)
    # some of them came while the buffer held an update (the old silent case)
    assert len(seen) == len(discards)
    assert sum(1 for info in seen if info["buffered"] > 0) >= 5
    # every update delivered before the stop is accounted for: applied,
    # discarded, or still in the buffer at the end (one delivered after the
    # stop, while the server waits for the hosts' goodbyes, reaches no algorithm)
    stop = run.summary["emulated_seconds"]
    delivered = [e for e in of(events, "deliver", dir="up", kind="update") if e["t"] <= stop]
    applied = sum(len(e["clients"]) for e in of(events, "aggregate"))
    assert run.server is not None
    buffered = run.server.strategy.rule.buffered()  # type: ignore[attr-defined]
    assert applied == run.summary["updates"]
    assert buffered < 2
    assert len(delivered) == applied + len(discards) + buffered, (
        len(delivered), applied, len(discards), buffered)


# -- an algorithm whose aggregation fails in round 2 --------------------------------

FAILING = "failing_round_two"


class _FailingConfig(RoundsConfig):
    name: Literal["failing_round_two"]


class _FailsInRoundTwo(RoundRule):
    """FedAvg, except that round 2's aggregation raises."""

    def aggregate(self, x: torch.Tensor,
                  results: Sequence[Update]) -> tuple[torch.Tensor, dict[str, Any]]:
        if results[0].round == 2:
            raise ValueError("Invalid round 2: this rule refuses it")
        return fedavg_aggregate(x, results), {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


def _failing_server(cfg: _FailingConfig, ctx: ServerContext) -> RoundsFlow:
    return RoundsFlow(_FailsInRoundTwo(), cfg, ctx)


@pytest.fixture
def failing_algorithm(monkeypatch: pytest.MonkeyPatch) -> str:
    """Register the failing algorithm for this test only (the registry is restored)."""
    monkeypatch.setattr(algorithms_api, "_REGISTRY", dict(algorithms_api._REGISTRY))
    register(AlgorithmSpec(names=(FAILING,), config=_FailingConfig, server=_failing_server,
                           client=local_sgd_client), replace=True)
    return FAILING


def test_an_aggregation_error_in_a_round_is_a_discard_and_later_rounds_go_on(
        tmp_path: Path, failing_algorithm: str) -> None:
    """Old bug: an aggregation error in a synchronous round crashed the server."""
    sc = build({"name": failing_algorithm}, run={"time_budget": 1.0})
    run = run_in_memory(sc, tmp_path / "run", hosts=2)
    assert run.summary["status"] == "completed", run.summary["status"]
    events = run.events()
    discards = of(events, "discard")
    assert sorted(e["client"] for e in discards) == list(range(6))
    assert all("this rule refuses it" in e["reason"] for e in discards)
    rounds = [e["round"] for e in of(events, "aggregate")]
    assert rounds[0] == 1
    assert 2 not in rounds
    assert [r for r in rounds if r > 2], rounds  # later rounds aggregate
    t_error = discards[0]["t"]
    assert all(e["t"] == t_error for e in discards)
    assert any(e["t"] > t_error for e in of(events, "aggregate"))
    assert run.summary["rounds"] == len(rounds) + 1  # round 2 closed, without a model
