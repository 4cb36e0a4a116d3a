"""AsyncFedED: parity with the paper's Algorithm 1, its unit tests and edge cases."""

from __future__ import annotations

import copy
import math

import asyncfeded_reference as ref
import pytest
import torch
from pydantic import ValidationError

from fedsim.algorithms import NonFiniteUpdate
from fedsim.algorithms._kernels import pack_tensor, pseudo_gradient, unpack_tensor
from fedsim.algorithms.asyncfeded import (
    AsyncFedED,
    AsyncFedEDConfig,
    asyncfeded_step,
    clamp_k,
    euclidean_staleness,
    next_k_value,
)
from fedsim.wire.messages import Update

F64 = torch.float64


def _result(delta: torch.Tensor, base: int, client: int = 0) -> Update:
    return Update.of(client=client, base_version=base, params=delta, num_samples=10)


def _e(i: int, dim: int = 4, scale: float = 1.0) -> torch.Tensor:
    v = torch.zeros(dim, dtype=F64)
    v[i] = scale
    return v


def _rule(**kwargs) -> AsyncFedED:
    """The rule of ``AsyncFedEDConfig(**kwargs)``; K starts at the paper's 10 unless
    ``k_initial`` is given (the references here start there; the scenario's default
    is 1 pass over the data, R-AF5)."""
    return AsyncFedED(AsyncFedEDConfig(**{"k_initial": 10.0, **kwargs}))


def _rule_at(x0: torch.Tensor, version: int = 0, **kwargs) -> AsyncFedED:
    rule = _rule(**kwargs)
    rule.snapshot(version, x0)
    return rule


# -- parity with the paper-shaped reference ---------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "rounding"),
    [
        ({"lam": 5.0, "epsilon": 5.0, "gamma_bar": 3.0, "kappa": 1.0}, "floor"),
        ({"lam": 1.0, "epsilon": 1.0, "gamma_bar": 3.0, "kappa": 0.05}, "floor"),
        ({"lam": 5.0, "epsilon": 10.0, "gamma_bar": 3.0, "kappa": 1.0}, "accumulate"),
        ({"lam": 1.0, "epsilon": 1.0, "gamma_bar": 0.5, "kappa": 0.5}, "accumulate"),
        ({"lam": 3.0, "epsilon": 1.0, "gamma_bar": 1.0, "kappa": 2.0, "k_max": 14.0}, "floor"),
    ],
)
def test_parity_with_reference_step_by_step(kwargs, rounding):
    gen = torch.Generator().manual_seed(42)
    m, dim = 4, 7
    x = torch.randn(dim, generator=gen, dtype=F64)
    rule = _rule(k_rounding=rounding, **kwargs)
    paper = ref.AsyncFedEDServer(
        x.tolist(),
        lam=kwargs["lam"],
        epsilon=kwargs["epsilon"],
        gamma_bar=kwargs["gamma_bar"],
        kappa=kwargs["kappa"],
        k_initial=10,
        rounding=rounding,
        k_max=kwargs.get("k_max"),
        t1=1,
    )
    version = 1
    rule.snapshot(version, x)
    base = {}
    for c in range(m):
        rule.hold(version)
        base[c] = version
    gammas = []
    for step in range(120):
        c = int(torch.randint(0, m, (), generator=gen))
        scale = math.exp(float(torch.empty(()).uniform_(-2.5, 1.0, generator=gen)))
        delta = scale * torch.randn(dim, generator=gen, dtype=F64)
        assert rule.next_k(c) == pytest.approx(paper.K.get(c, 10), rel=1e-12)
        new, info = rule.aggregate(x, version, _result(delta, base[c], c))
        expected = paper.update(c, delta.tolist(), base[c])
        assert new is not None
        assert expected is not None
        gamma, eta_g, k_next = expected
        assert torch.allclose(new, torch.tensor(paper.x, dtype=F64), rtol=1e-12, atol=1e-12), (
            f"step {step}"
        )
        assert info["gamma"] == pytest.approx(gamma, rel=1e-12, abs=1e-15)
        assert info["eta_g"] == pytest.approx(eta_g, rel=1e-12)
        assert info["k_next"] == pytest.approx(k_next, rel=1e-12)
        assert info["staleness"] == version - base[c]
        gammas.append(info["gamma"])
        rule.release(base[c])
        x, version = new, version + 1
        rule.hold(version)  # the reply carries the new model (R-AF3)
        base[c] = version
        assert rule.history_size() <= m + 1
        assert version in rule.versions()
        assert paper.t == version
    assert rule.applied == 120
    assert min(gammas) == 0.0  # some updates were fresh
    assert max(gammas) > kwargs["gamma_bar"]


# -- unit tests that follow from the paper's equations ----------------------------


@pytest.mark.parametrize(
    ("lam", "epsilon"), [(5.0, 5.0), (1.0, 1.0), (5.0, 10.0), (3.0, 1.0), (1.0, 10.0)]
)
def test_gamma_zero_gives_eta_lambda_over_epsilon(lam, epsilon):
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(5, generator=gen, dtype=F64)
    delta = torch.randn(5, generator=gen, dtype=F64)
    rule = _rule(lam=lam, epsilon=epsilon)
    new, info = rule.aggregate(x, 3, _result(delta, 3))
    assert info["gamma"] == 0.0
    assert info["staleness"] == 0
    assert info["eta_g"] == lam / epsilon
    assert torch.allclose(new, x + (lam / epsilon) * delta, rtol=1e-15, atol=0)
    paper = ref.AsyncFedEDServer(x.tolist(), lam, epsilon, 3.0, 1.0)
    assert paper.update(0, delta.tolist(), 1)[1] == lam / epsilon


def test_gamma_zero_from_a_stale_base_that_did_not_move():
    """gamma measures distance, not versions: an unchanged model is fresh."""
    x = torch.ones(3, dtype=F64)
    rule = _rule_at(x, 0)
    rule.hold(0)
    rule.snapshot(1, x.clone())  # e.g. an update that changed nothing
    _, info = rule.aggregate(x, 1, _result(_e(0, 3), 0))
    assert info["staleness"] == 1
    assert info["gamma"] == 0.0
    assert info["eta_g"] == 1.0


def test_fresh_update_with_lambda_equal_epsilon_lands_on_the_local_model():
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(50, generator=gen)
    local = x + 0.1 * torch.randn(50, generator=gen)
    rule = _rule(lam=2.0, epsilon=2.0)
    new, _ = rule.aggregate(x, 0, _result(pseudo_gradient(x, local), 0))
    assert new.dtype == torch.float32
    assert torch.equal(new, local)


# The increment table of R-AF2 (gamma_bar = 3, kappa = 1): floor(3 - gamma).
FLOOR_TABLE = [
    (0.0, 3),
    (0.25, 2),
    (1.0, 2),
    (1.5, 1),
    (2.0, 1),
    (2.5, 0),
    (3.0, 0),
    (3.5, -1),
    (4.0, -1),
    (4.5, -2),
]


@pytest.mark.parametrize(("gamma", "increment"), FLOOR_TABLE)
def test_floor_increment_table(gamma, increment):
    assert next_k_value(10.0, gamma, 3.0, 1.0, "floor") == 10 + increment


@pytest.mark.parametrize(("gamma", "increment"), FLOOR_TABLE)
def test_floor_increment_table_through_aggregate(gamma, increment):
    x_base = torch.zeros(4, dtype=F64)
    rule = _rule_at(x_base, 0, gamma_bar=3.0, kappa=1.0, k_rounding="floor")
    rule.hold(0)
    x_t = _e(0, scale=gamma)  # ||x_t - x_base|| = gamma exactly
    rule.snapshot(1, x_t)
    new, info = rule.aggregate(x_t, 1, _result(_e(1), 0, client=7))  # ||Delta|| = 1
    assert info["gamma"] == gamma
    assert info["k_used"] == 10.0
    assert info["k_next"] == 10 + increment
    assert rule.next_k(7) == 10 + increment
    assert info["eta_g"] == 5.0 / (gamma + 5.0)
    assert torch.equal(new, x_t + info["eta_g"] * _e(1))


def test_floor_with_femnist_kappa_never_grows_k_but_accumulate_does():
    """R-AF2: at kappa = 0.05 the paper's floor rule cannot raise K."""
    x = torch.zeros(4, dtype=F64)
    floor = _rule(lam=1.0, epsilon=1.0, gamma_bar=3.0, kappa=0.05, k_rounding="floor")
    accumulate = _rule(lam=1.0, epsilon=1.0, gamma_bar=3.0, kappa=0.05)
    xf = xa = x
    for version in range(20):  # fresh updates: gamma = 0, the best case for growth
        xf, info_f = floor.aggregate(xf, version, _result(_e(version % 4), version))
        xa, info_a = accumulate.aggregate(xa, version, _result(_e(version % 4), version))
        assert info_f["k_next"] == 10.0
        assert info_a["k_next"] == pytest.approx(10.0 + 0.15 * (version + 1))
    assert floor.local_units(0) == 10
    assert accumulate.local_units(0) == 13  # floor(10 + 20 * 0.15)


def test_slightly_stale_update_drops_floor_k_by_one():
    assert next_k_value(10.0, 3.0001, 3.0, 0.05, "floor") == 9
    assert next_k_value(10.0, 3.0001, 3.0, 0.05, "trunc") == 10
    assert next_k_value(10.0, 3.0001, 3.0, 0.05, "accumulate") == pytest.approx(10 - 5e-6)


@pytest.mark.parametrize(
    ("rounding", "gamma", "expected"),
    [
        ("ceil", 2.5, 11),
        ("ceil", 3.5, 10),
        ("trunc", 3.5, 10),
        ("trunc", 0.5, 12),
        ("round", 2.5, 11),
        ("round", 3.7, 9),
    ],
)
def test_other_roundings(rounding, gamma, expected):
    assert next_k_value(10.0, gamma, 3.0, 1.0, rounding) == expected


def test_kappa_zero_is_constant_k_even_for_infinite_gamma():
    assert next_k_value(10.0, math.inf, 3.0, 0.0, "floor") == 10.0
    assert next_k_value(10.0, math.inf, 3.0, 1.0, "floor") == -math.inf
    assert clamp_k(-math.inf, 1.0, None) == (1.0, True)


@pytest.mark.parametrize(
    ("lam", "epsilon", "eta"), [(5.0, 5.0, 0.625), (1.0, 1.0, 0.25), (5.0, 10.0, 5 / 13)]
)
def test_r_af7_eta_at_the_target_staleness(lam, epsilon, eta):
    x_base = torch.zeros(4, dtype=F64)
    rule = _rule_at(x_base, 0, lam=lam, epsilon=epsilon)
    rule.hold(0)
    x_t = _e(0, scale=3.0)
    rule.snapshot(1, x_t)
    _, info = rule.aggregate(x_t, 1, _result(_e(1), 0))
    assert info["gamma"] == 3.0
    assert info["eta_g"] == pytest.approx(eta)


def test_euclidean_staleness_functions():
    x_t, x_b = torch.tensor([3.0, 4.0]), torch.zeros(2)
    assert euclidean_staleness(x_t, x_b, torch.tensor([0.0, 2.0])) == 2.5
    with pytest.raises(ValueError, match=r"\|\|Delta\|\| = 0"):
        euclidean_staleness(x_t, x_b, torch.zeros(2))
    assert torch.equal(
        asyncfeded_step(torch.ones(2), torch.tensor([2.0, -2.0]), 0.5),
        torch.tensor([2.0, 0.0]),
    )


# -- K clamps, reconnects, units ---------------------------------------------------


def test_k_clamps_at_k_min_and_has_no_upper_bound_by_default():
    x0 = torch.zeros(4, dtype=F64)
    rule = _rule_at(x0, 0, gamma_bar=3.0, kappa=1.0)
    rule.hold(0)
    rule.snapshot(1, _e(0, scale=100.0))
    _, info = rule.aggregate(_e(0, scale=100.0), 1, _result(_e(1), 0, client=3))
    assert info["k_next"] == 1.0
    assert info["k_clamped"] is True
    assert rule.local_units(3) == 1

    fast = _rule(gamma_bar=3.0, kappa=1.0)
    x = x0
    for version in range(40):  # fresh every time: +3 per update, no K_max
        x, info = fast.aggregate(x, version, _result(_e(1), version, client=1))
    assert fast.next_k(1) == 10.0 + 3 * 40
    assert info["k_clamped"] is False


def test_k_max_clamps_when_asked():
    rule = _rule(gamma_bar=3.0, kappa=1.0, k_max=14.0)
    x = torch.zeros(3, dtype=F64)
    ks = []
    for version in range(3):
        x, info = rule.aggregate(x, version, _result(_e(0, 3), version))
        ks.append((info["k_next"], info["k_clamped"]))
    assert ks == [(13.0, False), (14.0, True), (14.0, True)]


def test_new_clients_start_at_k_initial_and_reconnect_policy():
    keep = _rule(k_initial=10.0, gamma_bar=3.0, kappa=1.0)
    reset = _rule(k_initial=10.0, gamma_bar=3.0, kappa=1.0, reset_k_on_reconnect=True)
    for rule in (keep, reset):
        assert rule.connect(5) == 10.0
        rule.aggregate(torch.zeros(2), 0, _result(torch.ones(2), 0, client=5))
        assert rule.next_k(5) == 13.0
        assert rule.next_k(6) == 10.0
    assert keep.connect(5) == 13.0
    assert reset.connect(5) == 10.0


def test_k_unit_and_local_units():
    assert _rule().cfg.k_unit == "epochs"
    rule = _rule(k_unit="steps", k_initial=2.7)
    assert rule.cfg.k_unit == "steps"
    assert rule.next_k(0) == 2.7
    assert rule.local_units(0) == 2


# -- edge cases (docs/algorithms.md#asyncfeded-zero-updates-are-discarded) --------


@pytest.mark.parametrize("scale", [0.0, 1e-14])
def test_zero_or_negligible_update_is_discarded_and_changes_nothing(scale):
    x = torch.ones(4, dtype=F64)
    rule = _rule_at(x, 2, lam=1.0, epsilon=1.0)
    rule.hold(2)
    state = copy.deepcopy(rule.state_dict())
    new, info = rule.aggregate(x, 2, _result(_e(0, scale=scale), 2, client=1))
    assert new is None
    assert info["discarded"] is True
    assert info["reason"] == "zero update"
    assert info["gamma"] is None
    assert info["k_next"] == info["k_used"] == 10.0
    assert rule.state_dict() == state


def test_zero_update_on_a_zero_model_is_discarded_without_dividing():
    new, info = _rule().aggregate(torch.zeros(3), 0, _result(torch.zeros(3), 0))
    assert new is None
    assert info["discarded"] is True


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_update_raises_and_changes_nothing(bad):
    x = torch.zeros(3, dtype=F64)
    rule = _rule_at(x, 0)
    rule.hold(0)
    state = copy.deepcopy(rule.state_dict())
    with pytest.raises(NonFiniteUpdate, match="non-finite"):
        rule.aggregate(x, 0, _result(torch.tensor([1.0, bad, 0.0], dtype=F64), 0))
    assert rule.state_dict() == state


def test_gamma_max_discards_but_still_adapts_k():
    x0 = torch.zeros(4, dtype=F64)
    rule = _rule_at(x0, 0, gamma_max=2.0, gamma_bar=3.0, kappa=1.0, k_rounding="floor")
    rule.hold(0)
    rule.snapshot(1, _e(0, scale=4.5))
    new, info = rule.aggregate(_e(0, scale=4.5), 1, _result(_e(1), 0, client=2))
    assert new is None
    assert info["discarded"] is True
    assert info["reason"] == "gamma above gamma_max"
    assert info["gamma"] == 4.5
    assert info["eta_g"] == 0.0
    assert rule.next_k(2) == 8.0
    assert rule.versions() == [0, 1]  # no new version
    assert rule.applied == 0


def test_unknown_or_future_base_version_is_rejected():
    x = torch.zeros(3)
    rule = _rule_at(x, 4)
    with pytest.raises(ValueError, match=r"Invalid base version 2: no snapshot"):
        rule.aggregate(x, 4, _result(torch.ones(3), 2))
    with pytest.raises(ValueError, match=r"Invalid base version 5: newer"):
        rule.aggregate(x, 4, _result(torch.ones(3), 5))
    with pytest.raises(ValueError, match=r"Invalid version 3: older than the current version 4"):
        rule.aggregate(x, 3, _result(torch.ones(3), 3))
    with pytest.raises(ValueError, match=r"shape"):
        rule.aggregate(x, 4, _result(torch.ones(2), 4))


# -- the model history (GMIS) -------------------------------------------------------


def test_history_keeps_only_held_versions_and_the_current_one():
    x0 = torch.zeros(3, dtype=F64)
    rule = _rule_at(x0, 0)
    assert rule.versions() == [0]
    rule.hold(0)
    rule.hold(0)
    x1, _ = rule.aggregate(x0, 0, _result(_e(0, 3), 0, client=0))
    rule.release(0)
    rule.hold(1)
    assert rule.versions() == [0, 1]  # 0 is still held by the second task
    assert torch.equal(rule.model(1), x1)  # R-AF3: the new model is what is kept and sent
    x2, _ = rule.aggregate(x1, 1, _result(_e(1, 3), 0, client=1))
    rule.release(0)
    assert rule.versions() == [1, 2]
    rule.release(1)
    assert rule.versions() == [2]  # the current version is always kept
    assert rule.history_size() == 1
    assert torch.equal(rule.model(2), x2)
    with pytest.raises(ValueError, match=r"Invalid release of version 1: it is not held"):
        rule.release(1)
    with pytest.raises(ValueError, match=r"Invalid version 1: no snapshot is kept"):
        rule.hold(1)
    with pytest.raises(ValueError, match=r"Invalid version 0: older than the current"):
        rule.snapshot(0, x0)


def test_history_stays_bounded_over_a_long_async_run():
    gen = torch.Generator().manual_seed(9)
    m = 10
    x = torch.randn(6, generator=gen)
    rule = _rule_at(x, 0)
    base = {}
    for c in range(m):
        rule.hold(0)
        base[c] = 0
    version = 0
    sizes = []
    for _ in range(500):
        c = int(torch.randint(0, m, (), generator=gen))
        if float(torch.rand((), generator=gen)) < 0.05:  # task abandoned (timeout)
            rule.release(base[c])
        else:
            delta = 0.1 * torch.randn(6, generator=gen)
            new, _ = rule.aggregate(x, version, _result(delta, base[c], c))
            rule.release(base[c])
            x, version = new, version + 1
        rule.hold(version)
        base[c] = version
        sizes.append(rule.history_size())
        assert version in rule.versions()
        assert set(rule.versions()) == set(base.values()) | {version}
    assert max(sizes) <= m + 1
    for c in range(m):
        rule.release(base[c])
    assert rule.versions() == [version]


# -- state and helpers -------------------------------------------------------------


def test_state_dict_round_trip_keeps_history_holds_and_k():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(5, generator=gen)
    rule = _rule_at(x, 0, k_rounding="floor", gamma_bar=2.0, kappa=1.0)
    rule.hold(0)
    rule.hold(0)
    x1, _ = rule.aggregate(x, 0, _result(torch.randn(5, generator=gen), 0, client=1))
    rule.release(0)
    rule.hold(1)
    state = copy.deepcopy(rule.state_dict())
    assert set(state["history"]) == {0, 1}
    assert state["holds"] == {0: 1, 1: 1}
    assert state["k"] == {1: rule.next_k(1)}
    fresh = _rule(k_rounding="floor", gamma_bar=2.0, kappa=1.0)
    fresh.load_state_dict(state)
    assert fresh.state_dict() == rule.state_dict()
    delta = torch.randn(5, generator=gen)
    a = rule.aggregate(x1, 1, _result(delta, 0, client=2))
    b = fresh.aggregate(x1, 1, _result(delta, 0, client=2))
    assert torch.equal(a[0], b[0])
    assert a[1] == b[1]


def test_load_state_dict_rejects_inconsistent_state():
    rule = _rule_at(torch.zeros(2), 0)
    rule.hold(0)
    state = rule.state_dict()
    with pytest.raises(ValueError, match=r"hold 1 on version 9"):
        _rule().load_state_dict({**state, "holds": {9: 1}})
    with pytest.raises(ValueError, match=r"current version 3 has no snapshot"):
        _rule().load_state_dict({**state, "current": 3})
    with pytest.raises(ValueError, match=r"Invalid K in state for client 0: nan"):
        _rule().load_state_dict({**state, "k": {0: float("nan")}})


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
@pytest.mark.parametrize("shape", [(), (0,), (3,), (2, 3)])
def test_pack_round_trip_is_bit_exact(dtype, shape):
    t = torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(dtype)
    back = unpack_tensor(copy.deepcopy(pack_tensor(t)))
    assert back.dtype == dtype
    assert back.shape == t.shape
    assert torch.equal(back, t)
    assert pack_tensor(back) == pack_tensor(t)


def test_pseudo_gradient_is_exact_and_checks_shape():
    gen = torch.Generator().manual_seed(4)
    base = torch.randn(100, generator=gen)
    local = base + torch.randn(100, generator=gen)
    delta = pseudo_gradient(base, local)
    assert delta.dtype == F64
    assert torch.equal((base.double() + delta).float(), local)
    with pytest.raises(ValueError, match="shape"):
        pseudo_gradient(base, torch.ones(3))


# -- fixed_eta_g: the adaptive weight switched off (an ablation) --------------------


@pytest.mark.parametrize("gamma", [0.0, 0.5, 3.0, 40.0])
def test_fixed_eta_g_applies_the_same_weight_at_any_staleness(gamma):
    x_base = torch.zeros(4, dtype=F64)
    x_t = _e(0, scale=gamma)
    delta = _e(1, scale=2.0)
    adaptive = _rule_at(x_base, 0, lam=5.0, epsilon=5.0)
    fixed = _rule_at(x_base, 0, lam=5.0, epsilon=5.0, fixed_eta_g=0.625)
    for rule in (adaptive, fixed):
        rule.hold(0)
        rule.snapshot(1, x_t)
    _, info_a = adaptive.aggregate(x_t, 1, _result(delta, 0, client=3))
    new, info_f = fixed.aggregate(x_t, 1, _result(delta, 0, client=3))
    assert info_a["eta_g"] == pytest.approx(5.0 / (gamma / 2.0 + 5.0))
    assert info_f["eta_g"] == 0.625
    assert torch.allclose(new, x_t + 0.625 * delta, rtol=1e-15, atol=0)
    # gamma is still measured and K still adapts from it, exactly as when adaptive
    assert info_f["gamma"] == info_a["gamma"] == gamma / 2.0
    assert fixed.next_k(3) == adaptive.next_k(3) == info_a["k_next"]


@pytest.mark.parametrize("bad", [0.0, -1.0, math.inf, math.nan])
def test_fixed_eta_g_must_be_positive_and_finite(bad):
    with pytest.raises(ValidationError, match="fixed_eta_g"):
        AsyncFedEDConfig(fixed_eta_g=bad)


def test_fixed_eta_g_is_a_scenario_key_validated_on_load():
    from fedsim.errors import ScenarioError
    from fedsim.scenario import parse

    sc = parse({"algorithm": {"name": "asyncfeded", "fixed_eta_g": 0.5}})
    assert sc.algorithm.fixed_eta_g == 0.5  # type: ignore[attr-defined]
    assert parse({"algorithm": {"name": "asyncfeded"}}).algorithm.fixed_eta_g is None  # type: ignore[attr-defined]
    with pytest.raises(ScenarioError, match=r"algorithm\.fixed_eta_g"):
        parse({"algorithm": {"name": "asyncfeded", "fixed_eta_g": 0}})


@pytest.mark.parametrize(
    ("table", "match"),
    [
        ({"k_min": 0.5}, r"algorithm\.k_min: Input should be greater than or equal to 1"),
        ({"k_initial": 20.0, "k_max": 15.0}, r"Invalid k_initial: 20\.0 \(must lie in"),
        ({"k_min": 5.0, "k_max": 4.0, "k_initial": 5.0}, r"Invalid k_max: 4\.0"),
        ({"k_rounding": "floor", "k_initial": 2.5}, r"must be whole with k_rounding='floor'"),
        ({"lam": math.inf}, r"algorithm\.lam: Input should be a finite number"),
    ],
)
def test_k_bounds_are_checked_on_load_not_when_the_server_builds_the_rule(table, match):
    """These were the constructor's checks, met only when a run's server built the
    rule: ``fedsim check`` passed such a scenario. The config holds them now."""
    from fedsim.errors import ScenarioError
    from fedsim.scenario import parse

    with pytest.raises(ScenarioError, match=match):
        parse({"algorithm": {"name": "asyncfeded", **table}})


def test_gamma_max_and_zero_tol_are_scenario_keys():
    """The rule's two parameters no scenario could set are config keys like the rest."""
    from fedsim.algorithms import get
    from fedsim.algorithms.api import ServerContext
    from fedsim.algorithms.local import LocalConfig
    from fedsim.scenario import parse

    cfg = parse({"algorithm": {"name": "asyncfeded", "gamma_max": 2.0,
                               "zero_tol": 1e-9}}).algorithm
    flow = get("asyncfeded").server(cfg, ServerContext(x0=torch.zeros(4), num_clients=2,
                                                       seed=0, local=LocalConfig()))
    assert (flow.rule.cfg.gamma_max, flow.rule.cfg.zero_tol) == (2.0, 1e-9)
    assert _rule().cfg.gamma_max is None
    assert _rule().cfg.zero_tol == 1e-12
