"""FedBuff: parity with the paper's Algorithm 1, buffering, staleness weights, state."""

from __future__ import annotations

import copy
import math

import fedbuff_reference as ref
import pytest
import torch

from fedsim.algorithms import NonFiniteUpdate
from fedsim.algorithms.fedbuff import FedBuff, FedBuffConfig, fedbuff_step
from fedsim.wire.messages import Update

F64 = torch.float64


def _result(delta: torch.Tensor, base: int, client: int = 0) -> Update:
    return Update.of(client=client, base_version=base, params=delta, num_samples=10)


@pytest.mark.parametrize(
    ("kwargs", "s"),
    [
        ({"buffer_size": 3, "server_lr": 1.0}, ref.s_sqrt),
        ({"buffer_size": 5, "server_lr": 0.7}, ref.s_sqrt),
        ({"buffer_size": 1, "server_lr": 1.3}, ref.s_sqrt),
        ({"buffer_size": 4, "server_lr": 1.0, "staleness": "const"}, lambda d: 1.0),
        (
            {"buffer_size": 2, "server_lr": 0.5, "staleness": "poly", "a": 1.0},
            lambda d: 1.0 / (1.0 + d),
        ),
    ],
)
def test_parity_with_reference_step_by_step(kwargs, s):
    gen = torch.Generator().manual_seed(0)
    dim = 6
    x = torch.randn(dim, generator=gen, dtype=F64)
    rule = FedBuff(FedBuffConfig(**kwargs))
    paper = ref.FedBuffServer(x.tolist(), K=kwargs["buffer_size"], eta_g=kwargs["server_lr"], s=s)
    version = 0
    flushes = 0
    for step in range(90):
        d = int(torch.randint(0, min(version, 6) + 1, (), generator=gen))
        delta = torch.randn(dim, generator=gen, dtype=F64)
        new, info = rule.aggregate(x, version, _result(delta, version - d, client=step % 7))
        stepped = paper.receive(delta.tolist(), version - d)
        assert (new is not None) == stepped, f"step {step}"
        assert info["staleness"] == d
        assert info["weight"] == pytest.approx(s(d), rel=1e-15)
        if new is not None:
            assert torch.allclose(new, torch.tensor(paper.x, dtype=F64), rtol=1e-12, atol=1e-12)
            x, version = new, version + 1
            flushes += 1
        assert info["buffered"] == len(paper.buffer) == rule.buffered()
        assert paper.t == version
    assert rule.flushes == flushes == 90 // kwargs["buffer_size"]


def test_buffer_fills_then_steps_with_the_mean_of_weighted_deltas():
    rule = FedBuff(FedBuffConfig(buffer_size=3, server_lr=1.0))
    x = torch.zeros(3, dtype=F64)
    e = torch.eye(3, dtype=F64)
    out1 = rule.aggregate(x, 8, _result(e[0], 8, client=4))  # d = 0, s = 1
    out2 = rule.aggregate(x, 8, _result(e[1], 5, client=2))  # d = 3, s = 1/2
    assert out1 == (None, {"staleness": 0, "weight": 1.0, "buffered": 1})
    assert out2 == (None, {"staleness": 3, "weight": 0.5, "buffered": 2})
    new, info = rule.aggregate(x, 8, _result(e[2], 0, client=9))  # d = 8, s = 1/3
    assert torch.allclose(new, torch.tensor([1.0, 0.5, 1.0 / 3.0], dtype=F64) / 3, rtol=1e-15)
    assert info == {
        "staleness": 8,
        "weight": pytest.approx(1 / 3),
        "buffered": 0,
        "clients": [4, 2, 9],
        "stalenesses": [0, 3, 8],
    }
    assert rule.buffered() == 0
    assert rule.flushes == 1


@pytest.mark.parametrize(("d", "w"), [(0, 1.0), (3, 0.5), (8, 1 / 3), (15, 0.25)])
def test_default_weight_is_one_over_sqrt_one_plus_staleness(d, w):
    assert FedBuff(FedBuffConfig()).weight(d) == pytest.approx(w, rel=1e-15)
    assert ref.s_sqrt(d) == pytest.approx(w, rel=1e-15)


def test_unit_buffer_fresh_update_is_the_client_model():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(40, generator=gen)
    local = x + torch.randn(40, generator=gen)
    rule = FedBuff(FedBuffConfig(buffer_size=1))
    new, _ = rule.aggregate(x, 0, _result(local.double() - x.double(), 0))
    assert new.dtype == torch.float32
    assert torch.equal(new, local)


def test_server_lr_scales_the_step():
    x = torch.ones(2)
    acc = torch.tensor([2.0, -4.0], dtype=F64)
    assert torch.equal(fedbuff_step(x, acc, 2, 0.5), torch.tensor([1.5, 0.0]))
    with pytest.raises(ValueError, match=r"Invalid count: 0"):
        fedbuff_step(x, acc, 0, 1.0)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_update_leaves_the_buffer_untouched(bad):
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(4, generator=gen)
    deltas = [torch.randn(4, generator=gen) for _ in range(3)]
    clean, poisoned = FedBuff(FedBuffConfig(buffer_size=3)), FedBuff(FedBuffConfig(buffer_size=3))
    for rule in (clean, poisoned):
        rule.aggregate(x, 2, _result(deltas[0], 1))
    state = copy.deepcopy(poisoned.state_dict())
    with pytest.raises(NonFiniteUpdate, match="non-finite"):
        poisoned.aggregate(x, 2, _result(torch.tensor([0.0, bad, 1.0, 2.0]), 2))
    assert poisoned.state_dict() == state
    for rule in (clean, poisoned):
        rule.aggregate(x, 2, _result(deltas[1], 0))
    a, _ = clean.aggregate(x, 2, _result(deltas[2], 2))
    b, _ = poisoned.aggregate(x, 2, _result(deltas[2], 2))
    assert torch.equal(a, b)


def test_max_staleness_discards_without_buffering():
    rule = FedBuff(FedBuffConfig(buffer_size=2, max_staleness=2))
    x = torch.zeros(2)
    new, info = rule.aggregate(x, 5, _result(torch.ones(2), 2))
    assert new is None
    assert info == {"staleness": 3, "weight": 0.0, "buffered": 0, "discarded": True}
    assert rule.buffered() == 0
    rule.aggregate(x, 5, _result(torch.ones(2), 3))
    new, _ = rule.aggregate(x, 5, _result(torch.ones(2), 5))
    assert new is not None


def test_invalid_results_are_rejected():
    rule = FedBuff(FedBuffConfig(buffer_size=2))
    with pytest.raises(ValueError, match=r"Invalid base version 4: newer"):
        rule.aggregate(torch.zeros(2), 3, _result(torch.ones(2), 4))
    with pytest.raises(ValueError, match="shape"):
        rule.aggregate(torch.zeros(2), 3, _result(torch.ones(3), 3))
    rule.aggregate(torch.zeros(2), 3, _result(torch.ones(2), 3))
    with pytest.raises(ValueError, match=r"buffer"):
        rule.aggregate(torch.zeros(3), 3, _result(torch.ones(3), 3))


def test_state_dict_mid_buffer_round_trip_resumes_identically():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(5, generator=gen)
    rule = FedBuff(FedBuffConfig(buffer_size=4, staleness="hinge", a=2.0, b=1.0))
    for d in (0, 2, 3):
        rule.aggregate(x, 3, _result(torch.randn(5, generator=gen), 3 - d, client=d))
    state = copy.deepcopy(rule.state_dict())
    assert len(state["entries"]) == 3
    fresh = FedBuff(FedBuffConfig(buffer_size=4, staleness="hinge", a=2.0, b=1.0))
    fresh.load_state_dict(state)
    assert fresh.state_dict() == rule.state_dict()
    last = _result(torch.randn(5, generator=gen), 3)
    a, ia = rule.aggregate(x, 3, last)
    b, ib = fresh.aggregate(x, 3, last)
    assert torch.equal(a, b)
    assert ia == ib
    assert ia["stalenesses"] == [0, 2, 3, 0]


def test_load_state_dict_rejects_inconsistent_buffers():
    rule = FedBuff(FedBuffConfig(buffer_size=2))
    rule.aggregate(torch.zeros(2), 0, _result(torch.ones(2), 0))
    state = rule.state_dict()
    with pytest.raises(ValueError, match=r"Invalid buffer in state: 0 entries"):
        FedBuff(FedBuffConfig(buffer_size=2)).load_state_dict({**state, "entries": []})
    with pytest.raises(ValueError, match=r"Invalid buffer in state: 2 entries"):
        FedBuff(FedBuffConfig(buffer_size=2)).load_state_dict(
            {**state, "entries": state["entries"] * 2})
    FedBuff(FedBuffConfig(buffer_size=3)).load_state_dict(state)


def test_weights_follow_fedasync_staleness_functions():
    hinge = FedBuff(FedBuffConfig(staleness="hinge", a=10.0, b=4.0))
    assert [hinge.weight(d) for d in (0, 4, 5)] == [1.0, 1.0, pytest.approx(1 / 11)]
    assert FedBuff(FedBuffConfig(staleness="const")).weight(100) == 1.0
    assert FedBuff(FedBuffConfig(a=1.0)).weight(3) == pytest.approx(0.25)
    assert not math.isnan(FedBuff(FedBuffConfig()).weight(10**9))
