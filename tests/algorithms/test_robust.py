"""Robust aggregation and the update guard: numpy references and defining properties."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedsim.algorithms.api import ServerContext, Step
from fedsim.algorithms.fedavg import FedAvg, FedAvgConfig
from fedsim.algorithms.flows import RoundsFlow
from fedsim.algorithms.local import LocalConfig
from fedsim.algorithms.robust import GuardConfig, UpdateGuard, aggregate_models
from fedsim.wire.messages import Update


def _models(n: int, d: int = 7, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(d, generator=g) for _ in range(n)]


@pytest.mark.parametrize("n", [1, 2, 5, 6])
def test_median_matches_numpy(n: int) -> None:
    ms = _models(n)
    want = np.median(np.stack([m.numpy() for m in ms]).astype(np.float64), axis=0)
    assert np.allclose(aggregate_models(ms, "median").numpy(), want, atol=1e-6)


@pytest.mark.parametrize(("n", "trim"), [(5, 0.2), (10, 0.1), (10, 0.25), (7, 0.4)])
def test_trimmed_mean_matches_a_sorted_cut(n: int, trim: float) -> None:
    ms = _models(n)
    a = np.sort(np.stack([m.numpy() for m in ms]).astype(np.float64), axis=0)
    k = int(np.floor(trim * n))
    want = a[k:n - k].mean(0)
    assert np.allclose(aggregate_models(ms, "trimmed_mean", trim).numpy(), want, atol=1e-6)


def test_trimmed_mean_without_trim_is_the_mean() -> None:
    ms = _models(6)
    assert torch.allclose(aggregate_models(ms, "trimmed_mean", 0.0), torch.stack(ms).mean(0),
                          atol=1e-6)


def test_one_outlier_moves_neither_the_median_nor_a_trimmed_mean_that_covers_it() -> None:
    honest = [torch.full((4,), float(v)) for v in (1.0, 2.0, 3.0, 4.0)]
    poisoned = [*honest, torch.full((4,), 1000.0)]
    assert torch.equal(aggregate_models(poisoned, "median"), torch.full((4,), 3.0))
    assert torch.equal(aggregate_models(poisoned, "trimmed_mean", 0.2), torch.full((4,), 3.0))
    # the mean is dragged: that is what the robust ones are for
    assert float(aggregate_models(poisoned, "mean")[0]) == pytest.approx(202.0)


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="no models"):
        aggregate_models([], "median")
    with pytest.raises(ValueError, match="trim must be in"):
        aggregate_models(_models(3), "trimmed_mean", 0.5)


def test_guard_rejects_or_clips_by_the_absolute_bound() -> None:
    ref = torch.zeros(4)
    far = torch.tensor([3.0, 4.0, 0.0, 0.0])  # norm 5
    rejecting = UpdateGuard(GuardConfig(max_norm=1.0))
    params, why = rejecting.check(far, ref)
    assert params is None
    assert "update norm 5 over the bound 1" in str(why)
    clipping = UpdateGuard(GuardConfig(max_norm=1.0, action="clip"))
    params, why = clipping.check(far, ref)
    assert params is not None
    assert torch.allclose(params, torch.tensor([0.6, 0.8, 0.0, 0.0]))
    assert "clipped" in str(why)
    near = torch.tensor([0.5, 0.0, 0.0, 0.0])
    assert clipping.check(near, ref) == (near, None)


def test_guard_clips_an_extra_payload_with_the_model_and_judges_only_the_model() -> None:
    ref = torch.zeros(2)
    upload = torch.tensor([3.0, 4.0, 10.0, 10.0])  # model part norm 5; extra part ignored
    params, _ = UpdateGuard(GuardConfig(max_norm=2.5, action="clip")).check(upload, ref)
    assert params is not None
    assert torch.allclose(params, torch.tensor([1.5, 2.0, 5.0, 5.0]))


def test_relative_bound_follows_the_run() -> None:
    g = UpdateGuard(GuardConfig(max_norm=100.0, norm_factor=3.0, window=10))
    ref = torch.zeros(3)
    assert g.bound() == 100.0  # the absolute bound until window // 2 are known
    for v in (1.0, 1.2, 0.8, 1.1, 0.9):
        assert g.check(torch.tensor([v, 0.0, 0.0]), ref)[1] is None
    assert g.bound() == pytest.approx(3.0)  # 3 x median(1.0)
    params, why = g.check(torch.tensor([1000.0, 0.0, 0.0]), ref)
    assert params is None
    assert "over the bound 3" in str(why)


def test_guard_needs_a_bound() -> None:
    with pytest.raises(ValueError, match="set max_norm, norm_factor or both"):
        GuardConfig()


def test_a_relative_bound_needs_an_absolute_one_for_the_first_updates() -> None:
    with pytest.raises(ValueError, match=r"norm_factor = 3 needs max_norm: .* until "
                                         r"window // 2 = 25 are seen"):
        GuardConfig(norm_factor=3.0)


def test_the_guard_bounds_the_first_update() -> None:
    # the first update, with no history to be relative to, is held to max_norm
    g = UpdateGuard(GuardConfig(max_norm=10.0, norm_factor=3.0))
    first = g.inspect(torch.full((4,), 1000.0), torch.zeros(4))
    assert (first.params, first.action, first.bound) == (None, "rejected", 10.0)
    assert first.norm == pytest.approx(2000.0)
    assert g.rejected == 1


def _ctx(x0: torch.Tensor, clients: int) -> ServerContext:
    return ServerContext(x0=x0, num_clients=clients, seed=0, local=LocalConfig())


def _round(flow: RoundsFlow, values: dict[int, float]) -> list[Step]:
    steps = [flow.start(sorted(values), 0.0)]
    tasks = {t.client: t for t in steps[0].tasks}
    for c, v in values.items():
        d = tasks[c]
        steps.append(flow.update(Update.of(client=c, base_version=0,
                                           params=torch.full((3,), v), num_samples=10,
                                           task_id=d.task_id, round=d.round), 1.0))
    return steps


@pytest.mark.parametrize("action", ["reject", "clip"])
def test_a_flow_reports_every_guarded_update(action: str) -> None:
    cfg = FedAvgConfig(server_lr=1.0, guard=GuardConfig(max_norm=5.0, action=action))
    flow = RoundsFlow(FedAvg(cfg), cfg, _ctx(torch.zeros(3), 3))
    steps = _round(flow, {0: 1000.0, 1: 1.0, 2: 2.0})
    guarded = [g for s in steps for g in s.guarded]
    past = "rejected" if action == "reject" else "clipped"
    assert [(g.client, g.action, g.bound) for g in guarded] == [(0, past, 5.0)]
    assert guarded[0].norm == pytest.approx(1000.0 * 3 ** 0.5)
    discarded = [d.client for s in steps for d in s.discarded]
    assert discarded == ([0] if action == "reject" else [])


def test_a_round_with_median_resists_one_poisoned_client() -> None:
    x0 = torch.zeros(3)
    cfg = FedAvgConfig(server_lr=1.0, weighting="samples", aggregator="median")
    flow = RoundsFlow(FedAvg(cfg), cfg, _ctx(x0, 5))
    step = flow.start(range(5), 0.0)
    tasks = {t.client: t for t in step.tasks}
    assert sorted(tasks) == [0, 1, 2, 3, 4]
    for c in range(5):
        value = 1000.0 if c == 0 else float(c)
        d = tasks[c]
        flow.update(Update.of(client=c, base_version=0, params=torch.full((3,), value),
                              num_samples=10_000 if c == 0 else 10, steps=1,
                              task_id=d.task_id, round=d.round), 1.0)
    assert torch.equal(flow.x, torch.full((3,), 3.0))  # median of 1000, 1, 2, 3, 4
