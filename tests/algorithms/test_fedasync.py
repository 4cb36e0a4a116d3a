"""FedAsync: staleness functions, R-FA1, discards, decay, and parity with the paper."""

from __future__ import annotations

import itertools
import random

import fedasync_reference as ref
import pytest
import torch

from fedsim.algorithms import FedAsync, fedasync_mix, staleness_weight
from fedsim.algorithms.fedasync import FedAsyncConfig
from fedsim.wire.messages import Update


def _result(params: torch.Tensor, tau: int, client: int = 0) -> Update:
    return Update.of(client=client, base_version=tau, params=params, num_samples=10)


# -- worked values (docs/algorithms.md#fedasync) ----------------------------------


@pytest.mark.parametrize(("d", "expected"), [(0, 1.0), (3, 0.5), (15, 0.25)])
def test_poly_worked_values(d, expected):
    assert staleness_weight("poly", d, a=0.5) == pytest.approx(expected, rel=1e-12)
    assert ref.s_poly(d, 0.5) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
    ("d", "expected"), [(0, 1.0), (4, 1.0), (5, 1 / 11), (6, 1 / 21), (16, 1 / 121)]
)
def test_hinge_worked_values(d, expected):
    assert staleness_weight("hinge", d, a=10, b=4) == pytest.approx(expected, rel=1e-12)
    assert ref.s_hinge(d, 10, 4) == pytest.approx(expected, rel=1e-12)


def test_hinge_is_the_paper_formula_not_fedlab():
    # FedLab's 1 / (a (d - b + 1)) would give 1/20 at d = 5 (FedAsync hinge choice).
    assert staleness_weight("hinge", 5, a=10, b=4) != pytest.approx(1 / 20)


@pytest.mark.parametrize("d", range(8))
def test_poly_a1_is_remark_2(d):
    assert staleness_weight("poly", d, a=1.0) == pytest.approx(1 / (d + 1))


@pytest.mark.parametrize("d", range(10))
def test_const_is_one(d):
    assert staleness_weight("const", d) == 1.0


@pytest.mark.parametrize("fn", ["poly", "hinge"])
def test_staleness_weights_are_non_increasing_in_d(fn):
    w = [staleness_weight(fn, d, a=0.5, b=2) for d in range(30)]
    assert all(0 < later <= earlier <= 1 for earlier, later in itertools.pairwise(w))


def test_staleness_weight_rejects_negative_and_unknown():
    with pytest.raises(ValueError, match=r"Invalid staleness: -1"):
        staleness_weight("const", -1)
    with pytest.raises(ValueError, match=r"Invalid staleness function: 'exp'"):
        staleness_weight("exp", 1)


def test_hinge_with_b_at_max_staleness_equals_const():
    """The paper: with maximum staleness 4, Hinge with b = 4 is Const."""
    gen = torch.Generator().manual_seed(0)
    hinge = FedAsync(FedAsyncConfig(alpha=0.7, staleness="hinge", a=10, b=4))
    const = FedAsync(FedAsyncConfig(alpha=0.7, staleness="const"))
    x_h = x_c = torch.randn(8, generator=gen)
    for version in range(40):
        d = int(torch.randint(0, min(version, 4) + 1, (), generator=gen))
        y = torch.randn(8, generator=gen)
        x_h, info_h = hinge.aggregate(x_h, version, _result(y, version - d))
        x_c, info_c = const.aggregate(x_c, version, _result(y, version - d))
        assert info_h == info_c
        assert torch.equal(x_h, x_c)


# -- fedasync_mix ---------------------------------------------------------------


def test_mix_endpoints_and_midpoint():
    x = torch.tensor([1.0, -2.0, 4.0])
    y = torch.tensor([3.0, 2.0, 0.0])
    assert torch.equal(fedasync_mix(x, y, 0.0), x)
    assert torch.equal(fedasync_mix(x, y, 1.0), y)
    assert torch.allclose(fedasync_mix(x, y, 0.25), torch.tensor([1.5, -1.0, 3.0]))


@pytest.mark.parametrize("alpha_t", [-0.1, 1.01, float("nan")])
def test_mix_rejects_alpha_t_outside_unit_interval(alpha_t):
    with pytest.raises(ValueError, match="Invalid alpha_t"):
        fedasync_mix(torch.zeros(2), torch.ones(2), alpha_t)


# -- R-FA1: where staleness starts -----------------------------------------------


@pytest.mark.parametrize(
    ("staleness", "kw"),
    [("const", {}), ("poly", {"a": 0.5}), ("hinge", {"a": 10, "b": 4})],
)
@pytest.mark.parametrize("d", [0, 1, 4, 5, 9])
def test_staleness_offset_shifts_d_by_one(staleness, kw, d):
    resolved = FedAsync(FedAsyncConfig(alpha=0.5, staleness=staleness, **kw))
    literal = FedAsync(FedAsyncConfig(alpha=0.5, staleness=staleness, staleness_offset=1, **kw))
    a, b = kw.get("a", 0.5), kw.get("b", 4.0)
    assert resolved.weight(d) == pytest.approx(0.5 * ref.s(staleness, d, a, b))
    assert literal.weight(d) == pytest.approx(0.5 * ref.s(staleness, d + 1, a, b))


def test_fresh_update_has_staleness_zero_and_full_weight():
    rule = FedAsync(FedAsyncConfig(alpha=0.6, staleness="poly", a=0.5))
    x, y = torch.zeros(3), torch.ones(3)
    new, info = rule.aggregate(x, 7, _result(y, 7))
    assert info["staleness"] == 0
    assert info["alpha_t"] == pytest.approx(0.6)
    assert torch.allclose(new, torch.full((3,), 0.6))


def test_literal_offset_weights_a_fresh_update_by_s_of_one():
    rule = FedAsync(FedAsyncConfig(alpha=0.6, staleness="poly", a=0.5, staleness_offset=1))
    new, info = rule.aggregate(torch.zeros(3), 7, _result(torch.ones(3), 7))
    # info reports the R-FA1 staleness; the weight uses the literal t - tau = 1.
    assert info["staleness"] == 0
    assert info["alpha_t"] == pytest.approx(0.6 * 2**-0.5)
    assert torch.allclose(new, torch.full((3,), 0.6 * 2**-0.5))


def test_literal_offset_moves_the_hinge_knee():
    resolved = FedAsync(FedAsyncConfig(alpha=1.0, staleness="hinge", a=10, b=4))
    literal = FedAsync(FedAsyncConfig(alpha=1.0, staleness="hinge", a=10, b=4, staleness_offset=1))
    assert resolved.weight(4) == 1.0
    assert literal.weight(4) == pytest.approx(1 / 11)
    assert literal.weight(3) == 1.0


def test_base_version_newer_than_server_is_rejected():
    rule = FedAsync(FedAsyncConfig())
    with pytest.raises(ValueError, match=r"Invalid base version 6.*version 5"):
        rule.aggregate(torch.zeros(2), 5, _result(torch.ones(2), 6))
    assert rule.state_dict() == {"alpha": 0.6, "applied": 0}


# -- max_staleness and alpha_decay ---------------------------------------------


def test_max_staleness_discards_only_beyond_the_bound():
    rule = FedAsync(FedAsyncConfig(alpha=0.5, alpha_decay=0.5, max_staleness=2))
    x = torch.zeros(4)
    kept, info = rule.aggregate(x, 10, _result(torch.ones(4), 8))  # d = 2: kept
    assert kept is not None
    assert info["staleness"] == 2
    assert rule.state_dict() == {"alpha": 0.25, "applied": 1}

    dropped, info = rule.aggregate(kept, 11, _result(torch.ones(4), 8))  # d = 3
    assert dropped is None
    assert info == {"staleness": 3, "alpha_t": 0.0, "discarded": True}
    # A discarded update neither counts nor decays alpha.
    assert rule.state_dict() == {"alpha": 0.25, "applied": 1}


def test_max_staleness_zero_keeps_only_fresh_updates():
    rule = FedAsync(FedAsyncConfig(max_staleness=0))
    assert rule.aggregate(torch.zeros(2), 3, _result(torch.ones(2), 3))[0] is not None
    assert rule.aggregate(torch.zeros(2), 3, _result(torch.ones(2), 2))[0] is None


def test_alpha_decay_is_geometric_per_applied_update():
    rule = FedAsync(FedAsyncConfig(alpha=0.9, alpha_decay=0.8))
    x = torch.zeros(2)
    for k in range(6):
        new, info = rule.aggregate(x, k, _result(torch.ones(2), k))
        # The update uses the alpha before this step's decay.
        assert info["alpha_t"] == pytest.approx(0.9 * 0.8**k)
        x = new
    assert rule.state_dict()["alpha"] == pytest.approx(0.9 * 0.8**6)
    assert rule.state_dict()["applied"] == 6


def test_no_decay_keeps_alpha_constant():
    rule = FedAsync(FedAsyncConfig(alpha=0.3))
    x = torch.zeros(2)
    for k in range(5):
        x, info = rule.aggregate(x, k, _result(torch.ones(2), k))
        assert info["alpha_t"] == 0.3


@pytest.mark.parametrize("alpha", [0.0, 1.5, float("nan"), float("inf")])
def test_load_state_dict_rejects_invalid_alpha(alpha):
    rule = FedAsync(FedAsyncConfig())
    with pytest.raises(ValueError, match=f"Invalid alpha in state: {alpha}"):
        rule.load_state_dict({"alpha": alpha, "applied": 0})
    assert rule.state_dict() == {"alpha": 0.6, "applied": 0}


# -- parity with the paper, step by step ---------------------------------------

PARITY_CONFIGS = [
    {"alpha": 0.6, "staleness": "const"},
    {"alpha": 0.9, "staleness": "poly", "a": 0.5},
    {"alpha": 0.9, "staleness": "hinge", "a": 10, "b": 4},
    {"alpha": 0.9, "staleness": "hinge", "a": 10, "b": 2},
    {"alpha": 0.9, "staleness": "poly", "a": 0.5, "staleness_offset": 1},
    {"alpha": 1.0, "staleness": "hinge", "a": 2.0, "b": 1.0, "staleness_offset": 1},
    {"alpha": 0.9, "staleness": "poly", "a": 1.0, "alpha_decay": 0.97},
    {"alpha": 0.8, "staleness": "hinge", "a": 10, "b": 4, "max_staleness": 6},
    {
        "alpha": 0.7,
        "staleness": "poly",
        "a": 0.5,
        "staleness_offset": 1,
        "alpha_decay": 0.99,
        "max_staleness": 3,
    },
]


def _reference_server(x0: torch.Tensor, cfg: dict) -> ref.FedAsyncServer:
    return ref.FedAsyncServer(
        x0.tolist(),
        alpha=cfg["alpha"],
        fn=cfg.get("staleness", "const"),
        a=cfg.get("a", 0.5),
        b=cfg.get("b", 4.0),
        literal_staleness=cfg.get("staleness_offset", 0) == 1,
        alpha_decay=cfg.get("alpha_decay", 1.0),
        max_staleness=cfg.get("max_staleness"),
    )


@pytest.mark.parametrize(
    "cfg", PARITY_CONFIGS, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items())
)
@pytest.mark.parametrize("seed", [0, 1])
def test_parity_with_reference_every_step(cfg, seed):
    """50 pushes with random staleness through FedAsync and through Algorithm 1."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    dim = 7
    x = torch.randn(dim, generator=gen)
    server = _reference_server(x, cfg)
    rule = FedAsync(FedAsyncConfig(**cfg))
    version = 0
    discarded = 0
    for step in range(50):
        d = rng.randint(0, min(version, 10))
        tau = version - d
        x_new = x + torch.randn(dim, generator=gen)
        new, info = rule.aggregate(x, version, _result(x_new, tau, client=step % 5))
        alpha_ref = server.push(x_new.tolist(), tau)
        assert info["staleness"] == d
        if alpha_ref is None:
            assert new is None
            discarded += 1
            continue
        assert new is not None
        assert info["alpha_t"] == pytest.approx(alpha_ref, rel=1e-12)
        x, version = new, version + 1
        assert version == server.version
        expected = torch.tensor(server.x, dtype=torch.float64)
        assert torch.allclose(x.double(), expected, rtol=1e-5, atol=1e-6), (
            f"step {step}"
        )
    assert rule.state_dict()["applied"] == version
    assert rule.state_dict()["alpha"] == pytest.approx(server.alpha, rel=1e-12)
    # The configs with a bound do exercise the discard path, the others never do.
    assert (discarded > 0) == ("max_staleness" in cfg)
