"""FedOpt: parity with Reddi et al.'s Algorithm 2 and FedAvgM, hand-computed steps, state."""

from __future__ import annotations

import copy
import math

import fedopt_reference as ref
import pytest
import torch
from _fresh import fresh_python
from pydantic import ValidationError

from fedsim.algorithms import NonFiniteUpdate
from fedsim.algorithms.fedavg import fedavg_aggregate
from fedsim.algorithms.fedopt import (
    FEDOPT_OPTIMIZERS,
    AdaptiveServerOptimizer,
    FedOpt,
    FedOptConfig,
    fedopt_delta,
    fedopt_init,
    fedopt_moments,
    fedopt_step,
)
from fedsim.wire.messages import Update


def _rule(optimizer: str, **kwargs) -> FedOpt:
    """FedOpt with the server optimizer ``optimizer`` (``algorithm.name = "fed" + optimizer``)."""
    return FedOpt(FedOptConfig(name=f"fed{optimizer}", **kwargs))


F64 = torch.float64
TIGHT = {"rtol": 1e-12, "atol": 1e-14}


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _draw(gen: torch.Generator, x: torch.Tensor, version: int) -> list[Update]:
    """1-5 distinct clients, each a perturbed copy of ``x`` with 1-50 samples."""
    k = int(torch.randint(1, 6, (), generator=gen))
    clients = torch.randperm(10, generator=gen)[:k].tolist()
    return [
        Update.of(
            client=c,
            base_version=version,
            params=x + 0.3 * torch.randn(x.shape, generator=gen, dtype=x.dtype),
            num_samples=int(torch.randint(1, 51, (), generator=gen)),
        )
        for c in clients
    ]


def _one(x: torch.Tensor, delta: float, client: int = 0) -> list[Update]:
    return [Update.of(client=client, base_version=0, params=x + delta, num_samples=3)]


def _ref_kwargs(kwargs: dict) -> dict:
    """FedOpt's keywords in the reference's names (eta, beta)."""
    out = dict(kwargs)
    out["eta"] = out.pop("server_lr", 1.0 if kwargs["optimizer"] == "avgm" else 0.1)
    if "momentum" in out:
        out["beta"] = out.pop("momentum")
    return out


# The draw perturbs the rule's own x, so a rounding difference between rule and
# reference re-enters the next Delta with a gain of about eta (1 - beta1) / sqrt(v)
# per round; every case keeps that gain below 1 (yogi with eta = 1 and tau = 1e-5
# would amplify one ulp ~30x a round).
PARITY_CASES = [
    {"optimizer": "adam"},
    {"optimizer": "yogi"},
    {"optimizer": "adagrad"},
    {"optimizer": "avgm"},
    {"optimizer": "adam", "server_lr": 0.03, "beta1": 0.5, "beta2": 0.9, "tau": 0.1,
     "weighting": "samples"},
    {"optimizer": "yogi", "server_lr": 0.01, "beta1": 0.0, "tau": 1e-5, "weighting": "samples"},
    {"optimizer": "adagrad", "server_lr": 0.5, "beta1": 0.0, "tau": 1e-2},
    {"optimizer": "avgm", "server_lr": 0.7, "momentum": 0.5, "weighting": "samples"},
]


def _case_id(kwargs: dict) -> str:
    return "-".join(f"{k}={v}" for k, v in kwargs.items())


# --------------------------------------------------------------------------
# Parity with the reference.


@pytest.mark.parametrize("kwargs", PARITY_CASES, ids=_case_id)
def test_parity_with_reference_step_by_step(kwargs):
    gen = _gen(0)
    dim = 7
    x = torch.randn(dim, generator=gen, dtype=F64)
    rule = _rule(**kwargs)
    paper = ref.FedOptServer(x.tolist(), **_ref_kwargs(kwargs))
    for t in range(15):
        results = _draw(gen, x, t)
        new, info = rule.aggregate(x, results)
        expect = paper.round([r.params.tolist() for r in results], [r.num_samples for r in results])
        assert torch.allclose(new, torch.tensor(expect, dtype=F64), **TIGHT), f"round {t}"
        m, v = rule.moments()
        assert torch.allclose(m, torch.tensor(paper.m, dtype=F64), **TIGHT), f"round {t}"
        if kwargs["optimizer"] == "avgm":
            assert v is None
        else:
            assert torch.allclose(v, torch.tensor(paper.v, dtype=F64), **TIGHT), f"round {t}"
        assert info["clients"] == [r.client for r in results]
        x = new
    assert rule.rounds == paper.t == 15


@pytest.mark.parametrize("optimizer", FEDOPT_OPTIMIZERS)
def test_float32_model_keeps_float64_state(optimizer):
    """With a float32 model, m and v still follow the reference in float64.

    The reference is handed the float32 model the rule returned each round,
    as the server would; only the output cast rounds.
    """
    gen = _gen(1)
    x = torch.randn(5, generator=gen)
    rule = _rule(optimizer)
    paper = ref.FedOptServer(x.tolist(), optimizer, eta=rule.server_lr)
    for t in range(12):
        results = _draw(gen, x, t)
        new, _ = rule.aggregate(x, results)
        expect = paper.round([r.params.tolist() for r in results], [r.num_samples for r in results])
        assert new.dtype == torch.float32
        assert torch.equal(new, torch.tensor(expect, dtype=F64).to(torch.float32)), f"round {t}"
        m, v = rule.moments()
        assert m.dtype == F64
        assert torch.allclose(m, torch.tensor(paper.m, dtype=F64), **TIGHT)
        if v is not None:
            assert torch.allclose(v, torch.tensor(paper.v, dtype=F64), **TIGHT)
        x = new
        paper.x = new.tolist()


# --------------------------------------------------------------------------
# One coordinate by hand.


def test_first_fedadam_step_by_hand():
    # Delta = 0.5, tau = 0.1, eta = 0.1, beta1 = 0.9, beta2 = 0.99:
    # m = 0.1 * 0.5 = 0.05, v = 0.99 * 0.1^2 + 0.01 * 0.5^2 = 0.0124.
    rule = _rule("adam", server_lr=0.1, tau=0.1)
    x = torch.tensor([2.0], dtype=F64)
    new, info = rule.aggregate(x, _one(x, 0.5))
    m, v = rule.moments()
    assert m.item() == pytest.approx(0.05, rel=1e-15)
    assert v.item() == pytest.approx(0.99 * 0.01 + 0.01 * 0.25, rel=1e-15)
    assert v.item() == pytest.approx(0.0124, rel=1e-14)
    step = 0.1 * 0.05 / (math.sqrt(0.0124) + 0.1)
    assert new.item() == pytest.approx(2.0 + step, rel=1e-15)
    assert info["delta_norm"] == pytest.approx(0.5, rel=1e-15)
    assert info["step_norm"] == pytest.approx(step, rel=1e-12)


@pytest.mark.parametrize(
    ("optimizer", "v_expected"),
    [
        ("adam", 0.99 * 0.01 + 0.01 * 0.25),
        ("yogi", 0.01 + 0.01 * 0.25),  # v_{-1} = 0.01 < Delta^2: sign = -1, v grows
        ("adagrad", 0.01 + 0.25),
    ],
)
def test_first_adaptive_steps_by_hand(optimizer, v_expected):
    rule = _rule(optimizer, server_lr=0.1, tau=0.1)
    x = torch.tensor([-1.0], dtype=F64)
    new, _ = rule.aggregate(x, _one(x, 0.5))
    m, v = rule.moments()
    assert m.item() == pytest.approx(0.05, rel=1e-15)
    assert v.item() == pytest.approx(v_expected, rel=1e-15)
    assert new.item() == pytest.approx(-1.0 + 0.1 * 0.05 / (math.sqrt(v_expected) + 0.1), rel=1e-15)


def test_first_fedavgm_steps_by_hand():
    # v_0 = 0.5, x_1 = x_0 + 0.5 * 0.5; v_1 = 0.9 * 0.5 + (-0.2) = 0.25, x_2 = x_1 + 0.5 * 0.25.
    rule = _rule("avgm", server_lr=0.5, momentum=0.9)
    x = torch.tensor([1.0], dtype=F64)
    x, _ = rule.aggregate(x, _one(x, 0.5))
    assert x.item() == pytest.approx(1.25, rel=1e-15)
    x, _ = rule.aggregate(x, _one(x, -0.2))
    assert rule.moments()[0].item() == pytest.approx(0.25, rel=1e-15)
    assert x.item() == pytest.approx(1.25 + 0.125, rel=1e-15)


# --------------------------------------------------------------------------
# Properties of the rules.


@pytest.mark.parametrize("weighting", ["samples", "uniform"])
def test_fedavgm_without_momentum_and_unit_lr_is_fedavg(weighting):
    gen = _gen(2)
    x = torch.randn(9, generator=gen)
    rule = _rule("avgm", server_lr=1.0, momentum=0.0, weighting=weighting)
    for t in range(12):
        results = _draw(gen, x, t)
        new, _ = rule.aggregate(x, results)
        assert torch.equal(new, fedavg_aggregate(x, results, 1.0, weighting)), f"round {t}"
        x = new
    assert rule.state_dict()["m"] is None


def test_no_bias_correction():
    """Three rounds of Delta = 0.5: the uncorrected step, far from Adam's corrected one."""
    eta, b1, b2, tau = 0.1, 0.9, 0.99, 1e-3
    rule = _rule("adam", server_lr=eta, beta1=b1, beta2=b2, tau=tau)
    x = torch.zeros(1, dtype=F64)
    m, v = 0.0, tau**2
    for t in range(1, 4):
        x_before = x.item()
        x, _ = rule.aggregate(x, _one(x, 0.5))
        m = b1 * m + (1 - b1) * 0.5
        v = b2 * v + (1 - b2) * 0.25
        plain = eta * m / (math.sqrt(v) + tau)
        corrected = eta * (m / (1 - b1**t)) / (math.sqrt(v / (1 - b2**t)) + tau)
        assert x.item() - x_before == pytest.approx(plain, rel=1e-12)
        assert abs(plain - corrected) > 0.01 * abs(corrected)


def test_no_bias_correction_unlike_torch_adam():
    """torch.optim.Adam bias-corrects and starts v at 0; FedAdam does not."""
    x = torch.tensor([0.0], dtype=F64)
    new, _ = _rule("adam", server_lr=0.1, tau=1e-3).aggregate(x, _one(x, 0.5))
    p = torch.nn.Parameter(x.clone())
    opt = torch.optim.Adam([p], lr=0.1, betas=(0.9, 0.99), eps=1e-3)
    p.grad = torch.tensor([-0.5], dtype=F64)
    opt.step()
    assert not torch.allclose(new, p.detach(), rtol=1e-3)


@pytest.mark.parametrize("optimizer", ["adam", "yogi", "adagrad"])
def test_v_starts_at_tau_squared(optimizer):
    tau = 0.03
    m0, v0 = fedopt_init(optimizer, torch.zeros(4, dtype=F64), tau)
    assert torch.equal(m0, torch.zeros(4, dtype=F64))
    assert torch.equal(v0, torch.full((4,), tau**2, dtype=F64))
    # A round with Delta = 0 leaves x and m alone and shows v_{-1}.
    rule = _rule(optimizer, tau=tau)
    x = torch.tensor([1.0, -2.0, 3.0], dtype=F64)
    new, info = rule.aggregate(x, _one(x, 0.0))
    assert torch.equal(new, x)
    assert info["step_norm"] == 0.0
    m, v = rule.moments()
    assert torch.equal(m, torch.zeros(3, dtype=F64))
    v_expected = rule.cfg.beta2 * tau**2 if optimizer == "adam" else tau**2
    assert torch.allclose(v, torch.full((3,), v_expected, dtype=F64), rtol=1e-15, atol=0)


def test_avgm_has_no_second_moment():
    assert fedopt_init("avgm", torch.zeros(3), 0.1)[1] is None
    rule = _rule("avgm")
    x = torch.zeros(3)
    rule.aggregate(x, _one(x, 1.0))
    assert rule.moments()[1] is None
    assert rule.state_dict()["v"] is None


def test_yogi_sign_rule():
    """v moves by (1 - beta2) Delta^2 towards Delta^2: down, up, or not at all."""
    delta = torch.tensor([0.5, 0.5, 0.5], dtype=F64)
    v_prev = torch.tensor([1.0, 0.01, 0.25], dtype=F64)  # > Delta^2, < Delta^2, = Delta^2
    m0 = torch.zeros(3, dtype=F64)
    _, v = fedopt_moments("yogi", delta, m0, v_prev, beta2=0.99)
    assert v.tolist() == pytest.approx([1.0 - 0.0025, 0.01 + 0.0025, 0.25], rel=1e-15)
    _, v_adam = fedopt_moments("adam", delta, m0, v_prev, beta2=0.99)
    assert v_adam.tolist() == pytest.approx([0.99 + 0.0025, 0.0099 + 0.0025, 0.25], rel=1e-15)
    # Through the rule: tau = 1 puts v_{-1} = 1 above Delta^2 = 0.25, so v shrinks.
    rule = _rule("yogi", tau=1.0)
    x = torch.zeros(1, dtype=F64)
    rule.aggregate(x, _one(x, 0.5))
    assert rule.moments()[1].item() == pytest.approx(0.9975, rel=1e-15)


def test_fedadagrad_with_beta1_zero_is_torch_adagrad():
    gen = _gen(3)
    tau, lr = 0.01, 0.3
    x = torch.randn(6, generator=gen, dtype=F64)
    rule = _rule("adagrad", server_lr=lr, beta1=0.0, tau=tau)
    p = torch.nn.Parameter(x.clone())
    opt = torch.optim.Adagrad([p], lr=lr, initial_accumulator_value=tau**2, eps=tau)
    for t in range(10):
        results = _draw(gen, x, t)
        new, _ = rule.aggregate(x, results)
        p.grad = -fedopt_delta(x, results)
        opt.step()
        assert torch.allclose(new, p.detach(), **TIGHT), f"round {t}"
        x = new


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_avgm_sgd_matches_the_functional_core_bit_for_bit(momentum):
    gen = _gen(4)
    x = torch.randn(8, generator=gen, dtype=F64)
    rule = _rule("avgm", server_lr=0.7, momentum=momentum)
    m, _ = fedopt_init("avgm", x, 1e-3)
    for t in range(10):
        results = _draw(gen, x, t)
        new, _ = rule.aggregate(x, results)
        m, _ = fedopt_moments("avgm", fedopt_delta(x, results), m, None, momentum=momentum)
        assert torch.equal(new, fedopt_step("avgm", x, m, None, 0.7, 1e-3)), f"round {t}"
        x = new


def test_adaptive_server_optimizer_on_a_tensor():
    p = torch.nn.Parameter(torch.tensor([1.0, 2.0], dtype=F64))
    opt = AdaptiveServerOptimizer([p], lr=0.1, rule="adam", beta1=0.9, beta2=0.99, tau=0.1)
    p.grad = torch.tensor([-0.5, 0.5], dtype=F64)  # Delta = (0.5, -0.5)
    opt.step()
    step = 0.1 * 0.05 / (math.sqrt(0.0124) + 0.1)
    assert p.detach().tolist() == pytest.approx([1.0 + step, 2.0 - step], rel=1e-15)
    with pytest.raises(ValueError, match=r"Invalid rule: 'avgm'"):
        AdaptiveServerOptimizer([p], lr=0.1, rule="avgm", beta1=0.9, beta2=0.99, tau=0.1)


@pytest.mark.parametrize("optimizer", FEDOPT_OPTIMIZERS)
def test_order_of_results_does_not_matter(optimizer):
    gen = _gen(5)
    x = torch.randn(6, generator=gen)
    results = _draw(gen, x, 0) + _draw(gen, x, 0)
    a, _ = _rule(optimizer, weighting="samples").aggregate(x, results)
    b, _ = _rule(optimizer, weighting="samples").aggregate(x, results[::-1])
    assert torch.equal(a, b)


def test_info_norms():
    gen = _gen(6)
    x = torch.randn(5, generator=gen)
    results = _draw(gen, x, 0)
    new, info = _rule("yogi").aggregate(x, results)
    delta = fedopt_delta(x, results)
    assert info["delta_norm"] == pytest.approx(float(delta.norm()), rel=1e-12)
    assert info["step_norm"] == pytest.approx(float((new.double() - x.double()).norm()), rel=1e-6)
    assert set(info) == {"clients", "delta_norm", "step_norm"}


def test_weighting_by_samples():
    x = torch.zeros(1, dtype=F64)
    results = [
        Update.of(client=0, base_version=0, params=x + 1.0, num_samples=1),
        Update.of(client=1, base_version=0, params=x + 4.0, num_samples=3),
    ]
    assert fedopt_delta(x, results, "samples").item() == pytest.approx(3.25, rel=1e-15)
    assert fedopt_delta(x, results, "uniform").item() == pytest.approx(2.5, rel=1e-15)
    new, _ = _rule("avgm", momentum=0.0, weighting="samples").aggregate(x, results)
    assert new.item() == pytest.approx(3.25, rel=1e-15)


def test_defaults():
    adam, avgm = _rule("adam"), _rule("avgm")
    assert (adam.server_lr, adam.cfg.beta1, adam.cfg.beta2, adam.cfg.tau) == (0.1, 0.9, 0.99, 1e-3)
    assert adam.cfg.weighting == "uniform"
    assert (avgm.server_lr, avgm.cfg.momentum) == (1.0, 0.9)
    assert FEDOPT_OPTIMIZERS == ("adam", "yogi", "adagrad", "avgm")


# --------------------------------------------------------------------------
# Shapes, dtypes, aliasing.


@pytest.mark.parametrize("optimizer", FEDOPT_OPTIMIZERS)
def test_output_is_a_new_tensor_shaped_like_x(optimizer):
    gen = _gen(7)
    rule = _rule(optimizer)
    x = torch.randn(6, generator=gen, dtype=F64)
    first, _ = rule.aggregate(x, _draw(gen, x, 0))
    kept = first.clone()
    assert first.shape == (6,)
    assert first.dtype == F64
    assert first.data_ptr() != x.data_ptr()
    rule.aggregate(first, _draw(gen, first, 1))
    assert torch.equal(first, kept), "a later round rewrote an earlier output"


def test_model_of_another_size_is_rejected_state_unchanged():
    rule = _rule("adam")
    x = torch.zeros(4)
    rule.aggregate(x, _one(x, 0.5))
    state = copy.deepcopy(rule.state_dict())
    y = torch.zeros(5)
    with pytest.raises(ValueError, match=r"Invalid model: 5 elements"):
        rule.aggregate(y, _one(y, 0.5))
    assert rule.state_dict() == state


# --------------------------------------------------------------------------
# State.


@pytest.mark.parametrize("kwargs", PARITY_CASES, ids=_case_id)
def test_state_dict_round_trip_mid_run_continues_identically(kwargs):
    gen = _gen(8)
    x = torch.randn(6, generator=gen)
    original = _rule(**kwargs)
    for t in range(7):
        x, _ = original.aggregate(x, _draw(gen, x, t))
    saved = copy.deepcopy(original.state_dict())
    assert saved["rounds"] == 7
    assert saved["m"] is not None
    assert (saved["v"] is None) == (kwargs["optimizer"] == "avgm")
    fresh = _rule(**kwargs)
    fresh.load_state_dict(saved)
    assert fresh.state_dict() == saved
    xa = xb = x
    for t in range(7, 15):
        results = _draw(gen, xa, t)
        xa, ia = original.aggregate(xa, results)
        xb, ib = fresh.aggregate(xb, results)
        assert torch.equal(xa, xb), f"round {t}"
        assert ia == ib
    assert fresh.state_dict() == original.state_dict()


def test_state_dict_before_any_round():
    rule = _rule("yogi")
    state = rule.state_dict()
    assert state == {"optimizer": "yogi", "rounds": 0, "m": None, "v": None}
    other = _rule("yogi")
    other.load_state_dict(state)
    assert other.state_dict() == state


def test_load_state_dict_rejects_another_optimizer_or_broken_moments():
    rule = _rule("adam")
    x = torch.zeros(3)
    rule.aggregate(x, _one(x, 0.5))
    state = rule.state_dict()
    with pytest.raises(ValueError, match=r"Invalid optimizer in state: 'adam'"):
        _rule("yogi").load_state_dict(state)
    with pytest.raises(ValueError, match=r"Invalid moments in state"):
        _rule("adam").load_state_dict({**state, "v": None})
    with pytest.raises(ValueError, match=r"Invalid moments in state"):
        _rule("adam").load_state_dict({**state, "m": _rule("adam").state_dict()["m"]})
    bad = _rule("adam")
    with pytest.raises(ValueError, match=r"Invalid v in state: values <= 0"):
        bad.load_state_dict({**state, "v": state["m"] | {"data": bytes(24)}})
    assert bad.state_dict() == _rule("adam").state_dict()


@pytest.mark.parametrize("optimizer", FEDOPT_OPTIMIZERS)
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_update_raises_state_unchanged(optimizer, bad):
    gen = _gen(9)
    rule = _rule(optimizer)
    x = torch.randn(5, generator=gen)
    for t in range(3):
        x, _ = rule.aggregate(x, _draw(gen, x, t))
    results = _draw(gen, x, 3)
    poisoned = results[0].params.clone()
    poisoned[1] = bad
    results[0] = results[0].with_params(poisoned)
    state = copy.deepcopy(rule.state_dict())
    with pytest.raises(NonFiniteUpdate, match="non-finite"):
        rule.aggregate(x, results)
    assert rule.state_dict() == state
    assert rule.rounds == 3


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"optimizer": "rmsprop"}, r"\nname\n  Input should be 'fedadam', .*'fedrmsprop'"),
        ({"optimizer": "adam", "server_lr": 0.0},
         r"\nserver_lr\n  Input should be greater than 0 .*input_value=0\.0"),
        ({"optimizer": "adam", "beta1": 1.0},
         r"\nbeta1\n  Input should be less than 1 .*input_value=1\.0"),
        ({"optimizer": "yogi", "beta2": 1.5},
         r"\nbeta2\n  Input should be less than 1 .*input_value=1\.5"),
        ({"optimizer": "adagrad", "tau": 0.0},
         r"\ntau\n  Input should be greater than 0 .*input_value=0\.0"),
        ({"optimizer": "avgm", "momentum": 1.0},
         r"\nmomentum\n  Input should be less than 1 .*input_value=1\.0"),
        ({"optimizer": "avgm", "weighting": "median"},
         r"\nweighting\n  Input should be 'samples' or 'uniform' .*input_value='median'"),
    ],
)
def test_invalid_arguments_name_the_value(kwargs, match):
    with pytest.raises(ValidationError, match=match):
        _rule(**kwargs)


def test_a_server_rule_imports_at_set_up_what_its_first_aggregation_needs() -> None:
    """torch.optim's first optimizer imports torch._dynamo (0.8 s): an adaptive
    rule pays it when built (before the emulated clock starts), not when it
    first aggregates; plain FedAvg (FedAvgM at momentum 0, lr 1) never does."""
    code = (
        "import sys, torch\n"
        "from fedsim.algorithms.fedopt import FedOpt, FedOptConfig\n"
        "FedOpt(FedOptConfig(name='fedavgm', momentum=0.0, server_lr=1.0))\n"
        "print('torch._dynamo' in sys.modules)\n"
        "FedOpt(FedOptConfig(name='fedadam'))\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    assert fresh_python(code) == ["False", "True"]
