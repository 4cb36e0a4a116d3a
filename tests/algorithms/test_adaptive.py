"""Delta-SGD, SPS and Adagrad as client optimizers (docs/algorithms.md#delta-sgd)."""

from __future__ import annotations

import math

import deltasgd_reference as dref
import local_reference as lref
import pytest
import torch
from torch import nn
from torch.nn import functional as F

from fedsim.algorithms import LocalConfig, local_train
from fedsim.algorithms.adaptive import (
    SPS,
    DeltaSGD,
    deltasgd_step_size,
    sps_step_size,
    step_size_stats,
)
from fedsim.algorithms.optim import OptimizerConfig, make_optimizer, optimizer_config

# Seven 3-feature samples, two classes; batch 3 gives batches of 3, 3 and 1.
XS = [
    [0.5, -1.0, 2.0],
    [1.5, 0.3, -0.7],
    [-0.2, 0.8, 0.1],
    [2.0, -0.5, 0.4],
    [-1.3, -0.9, 1.1],
    [0.0, 1.7, -1.5],
    [0.9, 0.2, 0.6],
]
LABELS = [0, 1, 1, 0, 1, 0, 1]
W0 = [0.1, -0.2, 0.3, -0.4, 0.5, 0.05]
BATCH = 3
SEED = 2024
DATA_X = torch.tensor(XS)
DATA_Y = torch.tensor(LABELS)
EPS = 1e-8
GROWTH = math.sqrt(1.1)  # sqrt(1 + delta * theta) at the defaults


def _gen(seed: int = SEED) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _batches(steps: int, seed: int = SEED) -> list[list[int]]:
    """The minibatch order local_train draws: a randperm per epoch, sliced."""
    gen = _gen(seed)
    out: list[list[int]] = []
    while len(out) < steps:
        perm = torch.randperm(len(XS), generator=gen).tolist()
        out.extend(perm[s : s + BATCH] for s in range(0, len(XS), BATCH))
    return out[:steps]


def _train(opt: OptimizerConfig, steps: int, prox_mu: float = 0.0, seed: int = SEED):
    cfg = LocalConfig(steps=steps, batch_size=BATCH, optimizer=opt, prox_mu=prox_mu)
    model = nn.Linear(3, 2, bias=False)
    return local_train(model, torch.tensor(W0), DATA_X, DATA_Y, cfg, _gen(seed))


def _quadratic(diag: list[float], x0: list[float], **kwargs):
    """f(x) = 0.5 x^T diag(a) x in float64, driven by DeltaSGD."""
    a = torch.tensor(diag, dtype=torch.float64)
    x = torch.tensor(x0, dtype=torch.float64, requires_grad=True)
    opt = DeltaSGD([x], **kwargs)

    def closure() -> float:
        opt.zero_grad()
        f = 0.5 * (a * x * x).sum()
        f.backward()
        return float(f.detach())

    return x, opt, closure


# ----------------------------------------------------------------- functional core


def test_step_size_takes_the_smaller_term_plus_eps():
    # curvature term gamma ||dx|| / (2 ||dg||) = 2 * 0.5 / 4 = 0.25 < growth sqrt(1.1)
    eta, theta = deltasgd_step_size(0.5, 2.0, 1.0, 1.0)
    assert eta == 0.25 + EPS
    assert theta == eta / 1.0
    # the growth term wins: sqrt(1 + 0.1 * 2) * 0.1, plus eps (both norms > 0)
    eta, theta = deltasgd_step_size(0.5, 1e-3, 0.1, 2.0)
    assert eta == pytest.approx(math.sqrt(1.2) * 0.1 + EPS, rel=1e-15)
    assert theta == pytest.approx(eta / 0.1, rel=1e-15)


@pytest.mark.parametrize("gamma", [0.5, 1.0, 2.0])
def test_gamma_scales_the_curvature_term(gamma):
    eta, _ = deltasgd_step_size(0.3, 1.5, 10.0, 1.0, gamma=gamma, eps=0.0)
    assert eta == pytest.approx(gamma * 0.3 / (2 * 1.5), rel=1e-15)


@pytest.mark.parametrize(("dx", "dg"), [(0.5, 0.0), (0.0, 0.7), (0.0, 0.0)])
def test_zero_norms_give_the_growth_term_alone(dx, dg):
    eta, theta = deltasgd_step_size(dx, dg, 0.2, 1.0)
    assert eta == 0.2 * GROWTH  # no eps in the growth-only branch
    assert theta == pytest.approx(GROWTH, rel=1e-15)
    assert eta > 0
    assert math.isfinite(eta)


def test_infinite_theta0():
    # with a curvature estimate the min picks it: the first adaptive step is purely curvature
    eta, theta = deltasgd_step_size(0.5, 2.0, 0.2, math.inf)
    assert eta == 0.25 + EPS
    assert theta == pytest.approx(eta / 0.2)
    # without one the growth term is infinite: keep eta, theta becomes 1
    assert deltasgd_step_size(0.0, 0.0, 0.2, math.inf) == (0.2, 1.0)
    # delta = 0 never multiplies 0 by inf
    assert deltasgd_step_size(0.0, 0.0, 0.2, math.inf, delta=0.0) == (0.2, 1.0)


def test_eta_max_caps_both_branches():
    assert deltasgd_step_size(0.5, 2.0, 1.0, 1.0, eta_max=0.1)[0] == 0.1
    assert deltasgd_step_size(0.0, 0.0, 1.0, 1.0, eta_max=0.5) == (0.5, 0.5)


def test_sps_step_size_formula():
    # (f - f*) / (c ||g||^2 + eps)
    assert sps_step_size(2.0, 4.0) == 2.0 / (0.5 * 4.0 + 1e-8)
    assert sps_step_size(2.0, 4.0, c=0.2, f_star=0.5, eps=0.0) == pytest.approx(1.5 / 0.8)
    assert sps_step_size(2.0, 4.0, eta_max=0.3) == 0.3
    # smooth mode: capped by growth * eta_prev
    assert sps_step_size(2.0, 4.0, eta_prev=0.5, growth=1.5) == 0.75
    assert sps_step_size(2.0, 4.0, eta_prev=5.0, growth=1.5) == 2.0 / (2.0 + 1e-8)


def test_sps_guards():
    assert sps_step_size(3.0, 0.0) == 0.0  # zero gradient: no step, no division by eps
    assert sps_step_size(0.1, 4.0, f_star=0.5) == 0.0  # loss below f*: no step
    assert sps_step_size(0.5, 4.0, f_star=0.5) == 0.0


def test_step_size_stats():
    assert step_size_stats([0.2, 0.4, 0.3]) == {
        "lr_last": 0.3,
        "lr_mean": pytest.approx(0.3),
        "lr_min": 0.2,
        "lr_max": 0.4,
    }
    assert step_size_stats([]) == {}


# ------------------------------------------------------------ quadratics


@pytest.mark.parametrize("gamma", [1.0, 2.0])
def test_isotropic_quadratic_curvature_term_is_gamma_over_2L(gamma):
    """On (L/2)||x||^2, dg = L dx, so the curvature term is exactly gamma / (2L).

    gamma = 2 gives 1/L (R-DS1), gamma = 1 the 1/(2L) of the theory.
    Every adaptive step is then min(gamma/(2L), growth) + eps.
    """
    lip = 4.0
    x, opt, closure = _quadratic([lip] * 3, [1.0, -2.0, 0.5], eta0=0.01, gamma=gamma)
    eta_prev, theta_prev = 0.01, 1.0
    hit = None
    for k in range(120):
        before = x.detach().clone()
        opt.step(closure)
        eta = opt.step_sizes[-1]
        if k == 0:
            assert eta == 0.01
            continue
        growth = math.sqrt(1 + 0.1 * theta_prev) * eta_prev
        expected = min(gamma / (2 * lip), growth) + EPS
        assert eta == pytest.approx(expected, rel=1e-9), k
        theta_prev, eta_prev = eta / eta_prev, eta
        if growth > gamma / (2 * lip):
            hit = k
            break
    assert hit is not None, "the growth term never reached gamma / (2L)"
    assert opt.step_sizes[-1] == pytest.approx(gamma / (2 * lip) + EPS, rel=1e-9)
    # at eta = gamma/(2L) the step scales x by (1 - gamma/2): exactly 0 for gamma = 2
    shrink = float(x.detach().norm() / before.norm())
    assert shrink == pytest.approx(abs(1 - gamma / 2 - lip * EPS), abs=1e-7)


@pytest.mark.parametrize("gamma", [1.0, 2.0])
def test_quadratic_step_sizes_obey_the_curvature_bounds(gamma):
    """f = 0.5 x^T A x with spectrum [mu, L]: ||dx|| / ||A dx|| lies in [1/L, 1/mu].

    Hence every adaptive step with both norms > 0 satisfies
    min(gamma/(2L), growth) + eps <= eta <= min(gamma/(2 mu), growth) + eps.
    """
    mu, lip = 0.5, 8.0
    x0 = torch.randn(4, generator=_gen(7), dtype=torch.float64).tolist()
    x, opt, closure = _quadratic([mu, 1.0, 3.0, lip], x0, gamma=gamma)
    f0 = closure()
    for k in range(200):
        eta_prev = opt.step_sizes[-1] if k else None
        theta_prev = opt.state[x].get("theta")
        opt.step(closure)
        if k == 0:
            continue
        eta = opt.step_sizes[-1]
        growth = math.sqrt(1 + 0.1 * theta_prev) * eta_prev
        assert min(gamma / (2 * lip), growth) + EPS <= eta * (1 + 1e-12), k
        assert eta <= (min(gamma / (2 * mu), growth) + EPS) * (1 + 1e-12), k
    assert closure() < 1e-8 * f0


# ------------------------------------------------------- reference parity

CONFIGS = {
    "defaults": {},
    "code-first-step": {"first_step": "code"},
    "previous-batch": {"batch_mode": "previous"},
    "theta-inf": {"theta0": math.inf},
    "gamma1-delta1": {"gamma": 1.0, "delta": 1.0, "eta0": 0.5},
    "eta0-large": {"eta0": 5.0},  # curvature-limited from the first adaptive step
    "capped": {"eta0": 0.3, "eta_max": 0.25},
    "weight-decay": {"weight_decay": 0.1},
    "no-eps": {"lr_eps": 0.0, "eta0": 1.0},
}


def _reference(kwargs: dict, steps: int, prox_mu: float):
    kw = dict(kwargs)
    if "lr_eps" in kw:
        kw["eps"] = kw.pop("lr_eps")
    return dref.local_train(W0, XS, LABELS, 2, _batches(steps), prox_mu=prox_mu, **kw)


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("prox_mu", [0.0, 0.5])
def test_optimizer_matches_reference_after_every_step(name, prox_mu):
    """Drive DeltaSGD in float64 on the linear model; compare x and eta each step."""
    steps = 9
    reference = _reference(CONFIGS[name], steps, prox_mu)
    model = nn.Linear(3, 2, bias=False).double()
    with torch.no_grad():
        model.weight.copy_(torch.tensor(W0, dtype=torch.float64).view(2, 3))
    anchor = model.weight.detach().clone()
    opt = make_optimizer(optimizer_config(name="deltasgd", **CONFIGS[name]), model.parameters())
    xs, ys = torch.tensor(XS, dtype=torch.float64), DATA_Y
    batch: dict[str, list[int]] = {}

    def closure() -> float:
        opt.zero_grad()
        loss = F.cross_entropy(model(xs[batch["idx"]]), ys[batch["idx"]])
        loss.backward()
        if prox_mu:
            model.weight.grad.add_(model.weight.detach() - anchor, alpha=prox_mu)
        return float(loss.detach())

    for k, (idx, (x_ref, eta_ref, loss_ref)) in enumerate(
        zip(_batches(steps), reference, strict=True)
    ):
        batch["idx"] = idx
        loss = opt.step(closure)
        assert loss == pytest.approx(loss_ref, rel=1e-12), k
        assert opt.step_sizes[-1] == pytest.approx(eta_ref, rel=1e-9), k
        assert torch.allclose(
            model.weight.detach().reshape(-1),
            torch.tensor(x_ref, dtype=torch.float64),
            rtol=1e-9,
            atol=1e-12,
        ), k


@pytest.mark.parametrize(
    "name", ["defaults", "code-first-step", "previous-batch", "theta-inf", "eta0-large"]
)
@pytest.mark.parametrize("prox_mu", [0.0, 0.5])
@pytest.mark.parametrize("k", [1, 2, 5, 8])
def test_local_train_matches_reference(name, prox_mu, k):
    reference = _reference(CONFIGS[name], k, prox_mu)
    vec, stats = _train(optimizer_config(name="deltasgd", **CONFIGS[name]), k, prox_mu)
    assert torch.allclose(
        vec.double(), torch.tensor(reference[-1][0], dtype=torch.float64), rtol=1e-4, atol=1e-6
    )
    etas = [eta for _, eta, _ in reference]
    assert stats["lr_last"] == pytest.approx(etas[-1], rel=1e-4)
    assert stats["lr_mean"] == pytest.approx(sum(etas) / k, rel=1e-4)
    assert stats["lr_min"] == pytest.approx(min(etas), rel=1e-4)
    assert stats["lr_max"] == pytest.approx(max(etas), rel=1e-4)
    seen = [len(b) for b in _batches(k)]
    mean_loss = sum(loss * n for (_, _, loss), n in zip(reference, seen, strict=True)) / sum(seen)
    assert stats["loss"] == pytest.approx(mean_loss, rel=1e-5)
    assert stats["steps"] == k


# ------------------------------------------------------------------- optimizer guards


@pytest.mark.parametrize("opt_cls", [DeltaSGD, SPS, torch.optim.Adam])
def test_optimizer_state_survives_the_state_file_format(opt_cls):
    """A client optimizer's state (Delta-SGD's previous point, gradient and step sizes, its
    int-keyed per-parameter dict) comes back exactly from a state file, unpickled."""
    from fedsim.wire import statefile

    a = torch.tensor([0.5, 1.0, 3.0], dtype=torch.float64)

    def run(x, opt, steps):
        def closure() -> float:
            opt.zero_grad()
            f = 0.5 * (a * x * x).sum()
            f.backward()
            return float(f.detach())

        for _ in range(steps):
            opt.step(closure)

    def make():
        x = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64, requires_grad=True)
        return x, opt_cls([x], lr=0.1) if opt_cls is torch.optim.Adam else opt_cls([x])

    x, opt = make()
    run(x, opt, 4)
    state = opt.state_dict()
    assert state["state"][0]   # per-parameter state under an int key
    back = statefile.loads(statefile.encode(state, "client-state").to_bytes(), "client-state")
    assert statefile.encode(back, "c").to_bytes() == statefile.encode(state, "c").to_bytes()
    y, fresh = make()
    with torch.no_grad():
        y.copy_(x)
    fresh.load_state_dict(back)
    run(x, opt, 3)
    run(y, fresh, 3)
    assert torch.equal(x, y)


def test_zero_gradient_never_stalls_or_divides_by_zero():
    x = torch.tensor([1.0, 2.0], dtype=torch.float64, requires_grad=True)
    opt = DeltaSGD([x], theta0=1.0)

    def closure() -> float:
        opt.zero_grad()
        (0.0 * x.sum()).backward()
        return 0.0

    for _ in range(4):
        opt.step(closure)
    assert torch.equal(x.detach(), torch.tensor([1.0, 2.0], dtype=torch.float64))
    etas = opt.step_sizes
    assert etas[0] == 0.2  # paper first step
    assert etas[1] == pytest.approx(0.2 * GROWTH)  # x did not move: growth only
    assert all(math.isfinite(e) and e > 0 for e in etas)
    assert etas == sorted(etas)


def test_zero_gradient_with_infinite_theta0_keeps_eta():
    x = torch.zeros(2, requires_grad=True)
    opt = DeltaSGD([x], theta0=math.inf, first_step="code")

    def closure() -> float:
        opt.zero_grad()
        (0.0 * x.sum()).backward()
        return 0.0

    for _ in range(3):
        opt.step(closure)
    assert opt.step_sizes[0] == 0.2  # growth term inf -> keep eta0
    assert opt.step_sizes[1] == pytest.approx(0.2 * GROWTH)  # theta is 1 afterwards
    assert all(math.isfinite(e) for e in opt.step_sizes)


@pytest.mark.parametrize("batch_mode", ["same", "previous"])
def test_constant_gradient_takes_growth_steps_only(batch_mode):
    """f = c.x: g_k = g_{k-1}, so ||dg|| = 0 while x moves: eta grows by sqrt(1 + delta theta)."""
    c = torch.tensor([0.3, -0.4], dtype=torch.float64)
    x = torch.zeros(2, dtype=torch.float64, requires_grad=True)
    opt = DeltaSGD([x], batch_mode=batch_mode)

    def closure() -> float:
        opt.zero_grad()
        f = (c * x).sum()
        f.backward()
        return float(f.detach())

    for _ in range(6):
        opt.step(closure)
    eta, theta = 0.2, 1.0
    expected = [eta]
    for _ in range(5):
        eta, theta = math.sqrt(1 + 0.1 * theta) * eta, math.sqrt(1 + 0.1 * theta)
        expected.append(eta)
    assert opt.step_sizes == pytest.approx(expected, rel=1e-14)
    assert torch.allclose(x.detach(), -sum(expected) * c)


def test_code_first_step_is_growth_only():
    _, stats = _train(optimizer_config(name="deltasgd", first_step="code"), 1)
    assert stats["lr_last"] == pytest.approx(0.2 * GROWTH)
    _, stats = _train(optimizer_config(name="deltasgd"), 1)
    assert stats["lr_last"] == 0.2


def test_extra_pass_leaves_batchnorm_statistics_alone():
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 2))
    x0 = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    data_x = torch.tensor(XS[:6])  # batches of 3: BatchNorm needs more than 1 sample
    cfg = LocalConfig(steps=4, batch_size=3, optimizer=optimizer_config(name="deltasgd"))
    local_train(model, x0, data_x, DATA_Y[:6], cfg, _gen())
    assert int(model[1].num_batches_tracked) == 4  # one update per step, not seven


class _MaskRecorder(nn.Module):
    """Dropout-like layer that records every mask it draws from torch's global RNG."""

    def __init__(self) -> None:
        super().__init__()
        self.masks: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = (torch.rand(x.shape) < 0.5).to(x.dtype)
        self.masks.append(mask)
        return 2 * x * mask


def _masks(opt: OptimizerConfig) -> list[torch.Tensor]:
    rec = _MaskRecorder()
    model = nn.Sequential(nn.Linear(3, 4), rec, nn.Linear(4, 2))
    x0 = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    cfg = LocalConfig(steps=3, batch_size=BATCH, optimizer=opt)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(5)
        local_train(model, x0, DATA_X, DATA_Y, cfg, _gen())
    return rec.masks


def test_mask_modes():
    plain = _masks(optimizer_config(name="sgd"))  # one pass per step
    shared = _masks(optimizer_config(name="deltasgd", mask_mode="shared"))
    independent = _masks(optimizer_config(name="deltasgd"))
    assert len(plain) == 3
    assert len(shared) == len(independent) == 5
    # shared: both passes of a step draw the step's mask, and the RNG stream is
    # consumed as by a one-pass optimizer
    for got, want in zip(shared, [plain[0], plain[1], plain[1], plain[2], plain[2]], strict=True):
        assert torch.equal(got, want)
    assert not torch.equal(independent[1], independent[2])


# --------------------------------------------------------------------------- SPS


def test_sps_optimizer_on_hand_made_tensors():
    t = torch.tensor([0.5, 1.0, -1.0], dtype=torch.float64)
    x = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64, requires_grad=True)
    opt = SPS([x], weight_decay=0.1)

    def closure() -> float:
        opt.zero_grad()
        f = 0.5 * ((x - t) ** 2).sum() + 1.0
        f.backward()
        return float(f.detach())

    x_before = x.detach().clone()
    f = 0.5 * float(((x_before - t) ** 2).sum()) + 1.0 + 0.05 * float((x_before**2).sum())
    d = (x_before - t) + 0.1 * x_before
    eta = f / (0.5 * float((d**2).sum()) + 1e-8)
    opt.step(closure)
    assert opt.step_sizes == [pytest.approx(eta, rel=1e-14)]
    assert torch.allclose(x.detach(), x_before - eta * d, rtol=1e-14)


def test_sps_zero_gradient_takes_no_step():
    x = torch.ones(3, requires_grad=True)
    opt = SPS([x], mode="smooth")

    def closure() -> float:
        opt.zero_grad()
        (0.0 * x.sum()).backward()
        return 2.0

    opt.step(closure)
    assert opt.step_sizes == [0.0]
    assert torch.equal(x.detach(), torch.ones(3))
    assert "eta" not in opt.state[x]  # smooth memory untouched


def test_sps_smooth_mode_caps_growth():
    x = torch.tensor([3.0], dtype=torch.float64, requires_grad=True)
    opt = SPS([x], mode="smooth", eta0=0.01, n_batches=4)

    def closure() -> float:
        opt.zero_grad()
        f = 0.5 * x.square().sum()
        f.backward()
        return float(f.detach())

    for _ in range(3):
        opt.step(closure)
    growth = 2 ** (1 / 4)
    assert opt.step_sizes == pytest.approx([0.01 * growth, 0.01 * growth**2, 0.01 * growth**3])


@pytest.mark.parametrize("prox_mu", [0.0, 0.5])
def test_sps_local_train_matches_the_formula(prox_mu):
    steps = 5
    y = [float(v) for v in W0]
    etas = []
    for idx in _batches(steps):
        loss, g = lref.linear_softmax_ce(y, [XS[i] for i in idx], [LABELS[i] for i in idx], 2)
        value = loss + 0.5 * prox_mu * sum((a - b) ** 2 for a, b in zip(y, W0, strict=True))
        g = lref.prox_gradient(g, y, W0, prox_mu)
        eta = min(value / (0.5 * sum(v * v for v in g) + 1e-8), 10.0)
        etas.append(eta)
        y = [a - eta * b for a, b in zip(y, g, strict=True)]
    vec, stats = _train(optimizer_config(name="sps", eta_max=10.0), steps, prox_mu)
    assert torch.allclose(vec.double(), torch.tensor(y, dtype=torch.float64), rtol=1e-4, atol=1e-6)
    assert stats["lr_last"] == pytest.approx(etas[-1], rel=1e-4)
    assert stats["lr_max"] == pytest.approx(max(etas), rel=1e-4)


# ------------------------------------------------------------------------ Adagrad


def test_make_optimizer_builds_torch_adagrad():
    cfg = optimizer_config(name="adagrad", lr=0.01, weight_decay=1e-3, initial_accumulator=0.1)
    opt = make_optimizer(cfg, [nn.Parameter(torch.zeros(2))])
    assert isinstance(opt, torch.optim.Adagrad)
    group = opt.param_groups[0]
    assert group["lr"] == 0.01
    assert group["eps"] == 1e-10  # torch's default, the authors' setting
    assert group["initial_accumulator_value"] == 0.1
    assert group["weight_decay"] == 1e-3
    assert group["lr_decay"] == 0


def test_adagrad_follows_its_update_rule():
    """G <- G + g^2 ; y <- y - lr g / (sqrt(G) + eps)."""
    cfg = optimizer_config(name="adagrad", lr=0.1, initial_accumulator=0.5, adagrad_eps=1e-6)
    p = nn.Parameter(torch.tensor([1.0, -1.0, 0.0], dtype=torch.float64))
    opt = make_optimizer(cfg, [p])
    y = [1.0, -1.0, 0.0]
    acc = [0.5, 0.5, 0.5]
    for g in ([0.3, -0.2, 0.0], [1.0, 0.5, -2.0]):
        p.grad = torch.tensor(g, dtype=torch.float64)
        opt.step()
        for j in range(3):
            acc[j] += g[j] ** 2
            y[j] -= 0.1 * g[j] / (math.sqrt(acc[j]) + 1e-6)
        assert torch.allclose(p.detach(), torch.tensor(y, dtype=torch.float64), rtol=1e-14)


# -------------------------------------------------------------------- integration

ADAPTIVE = {
    "deltasgd": optimizer_config(name="deltasgd"),
    "sps": optimizer_config(name="sps", eta_max=1.0),
    "adagrad": optimizer_config(name="adagrad", lr=0.1),
}


@pytest.mark.parametrize("name", list(ADAPTIVE))
def test_prox_term_pulls_toward_the_anchor(name):
    dists = []
    for mu in (0.0, 1.0, 5.0):
        vec, _ = _train(ADAPTIVE[name], 20, prox_mu=mu)
        dists.append(float((vec - torch.tensor(W0)).norm()))
    assert dists[0] > dists[1] > dists[2]


@pytest.mark.parametrize("name", list(ADAPTIVE))
def test_deterministic_under_a_seed(name):
    a, sa = _train(ADAPTIVE[name], 6, prox_mu=0.1)
    b, sb = _train(ADAPTIVE[name], 6, prox_mu=0.1)
    c, _ = _train(ADAPTIVE[name], 6, prox_mu=0.1, seed=SEED + 1)
    assert torch.equal(a, b)
    assert sa == sb
    assert not torch.equal(a, c)


@pytest.mark.parametrize("name", ["sgd", "sgdm", "adam", "adagrad", "deltasgd", "sps"])
def test_stats_keys(name):
    _, stats = _train(optimizer_config(name=name), 4)
    base = {"steps", "loss", "samples"}
    if name in ("deltasgd", "sps"):
        assert set(stats) == base | {"lr_last", "lr_mean", "lr_min", "lr_max"}
        assert stats["lr_min"] <= stats["lr_mean"] <= stats["lr_max"]
        assert all(isinstance(stats[k], float) for k in set(stats) - base)
    else:
        assert set(stats) == base


def test_state_dict_round_trip_continues_identically():
    x0 = [1.0, -2.0, 0.5]
    x, opt, closure = _quadratic([0.5, 2.0, 4.0], x0)
    for _ in range(3):
        opt.step(closure)
    y, twin, twin_closure = _quadratic([0.5, 2.0, 4.0], x.detach().tolist())
    twin.load_state_dict(opt.state_dict())
    for _ in range(3):
        opt.step(closure)
        twin.step(twin_closure)
    assert torch.equal(x.detach(), y.detach())
    assert opt.step_sizes[-3:] == twin.step_sizes


def test_closure_is_required():
    p = nn.Parameter(torch.zeros(2))
    for opt in (DeltaSGD([p]), SPS([p])):
        with pytest.raises(ValueError, match="Invalid closure"):
            opt.step()


def test_one_parameter_group_only():
    groups = [{"params": [nn.Parameter(torch.zeros(1))]} for _ in range(2)]
    with pytest.raises(ValueError, match="Invalid parameter groups: 2"):
        DeltaSGD(groups)


@pytest.mark.parametrize(
    ("factory", "kwargs", "match"),
    [
        (DeltaSGD, {"eta0": -1.0}, r"Invalid eta0: -1\.0"),
        (DeltaSGD, {"theta0": 0.0}, r"Invalid theta0: 0\.0"),
        (DeltaSGD, {"batch_mode": "x"}, r"Invalid batch_mode: 'x'"),
        (SPS, {"c": 0.0}, r"Invalid c: 0\.0"),
        (SPS, {"mode": "smooth_iter"}, r"Invalid mode: 'smooth_iter'"),
        (SPS, {"n_batches": 0}, r"Invalid n_batches: 0"),
    ],
)
def test_optimizer_classes_validate(factory, kwargs, match):
    with pytest.raises(ValueError, match=match):
        factory([nn.Parameter(torch.zeros(1))], **kwargs)


def test_config_defaults_follow_the_spec():
    cfg = optimizer_config(name="deltasgd")
    assert (cfg.eta0, cfg.theta0, cfg.gamma, cfg.delta, cfg.lr_eps) == (0.2, 1.0, 2.0, 0.1, 1e-8)
    assert (cfg.first_step, cfg.batch_mode, cfg.mask_mode) == ("paper", "same", "independent")
    assert cfg.eta_max is None      # no cap: make_optimizer passes inf
    assert make_optimizer(cfg, [nn.Parameter(torch.zeros(1))]).defaults["eta_max"] == math.inf
    sps = optimizer_config(name="sps")
    assert (sps.sps_mode, sps.sps_c, sps.f_star, sps.eps) == ("constant", 0.5, 0.0, 1e-8)
    # the plain optimizers' defaults
    assert optimizer_config() == optimizer_config(name="sgd", lr=0.05)
    assert optimizer_config("sgdm").momentum == 0.9
    assert optimizer_config("adam").eps == 1e-8


# -- a separable client: the step grows past the parameters' dtype -----------------

def _separable_run(delta: float, steps: int, dtype: torch.dtype = torch.float32,
                   eta_max: float = math.inf) -> DeltaSGD:
    """Logistic regression on two separable points: once both are classified, the
    gradients (and their differences) vanish and only the growth term is left."""
    x = torch.tensor([[1.0, 0.0], [-1.0, 0.0]], dtype=dtype)
    y = torch.tensor([0, 1])
    w = torch.zeros(2, 2, dtype=dtype, requires_grad=True)
    opt = DeltaSGD([w], delta=delta, eta_max=eta_max)

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = F.cross_entropy(x @ w, y)
        loss.backward()
        return loss

    for _ in range(steps):
        opt.step(closure)
    return opt


def test_separable_client_step_passes_float32_and_the_run_fails_with_the_cause():
    """DS-2's case (Synthetic(1,1), seed 3): a separable client's step size grows every
    step at delta = 1 (by about the golden ratio) until float32 cannot hold it. The
    authors' code caps nothing; fedsim says so as a StepOverflow (cause "overflow")
    before the step is taken, instead of p.add_'s bare RuntimeError."""
    from fedsim.algorithms import StepOverflow, failure_cause

    with pytest.raises(StepOverflow, match=r"beyond torch\.float32's range") as err:
        _separable_run(delta=1.0, steps=400)
    assert failure_cause(err.value) == "overflow"


def test_the_overflow_is_judged_in_the_parameters_dtype():
    opt = _separable_run(delta=1.0, steps=250, dtype=torch.float64)  # float32 would fail
    assert max(opt.step_sizes) > torch.finfo(torch.float32).max
    assert all(math.isfinite(e) for e in opt.step_sizes)


def test_eta_max_is_an_opt_in_cap_that_keeps_the_run_going():
    opt = _separable_run(delta=1.0, steps=400, eta_max=10.0)
    assert max(opt.step_sizes) == 10.0
