"""FedSpeed: step-by-step parity with Algorithm 1, Lemmas C.1/C.2, ablations, FedAvg path."""

from __future__ import annotations

import itertools

import fedspeed_reference as ref
import pytest
import torch
from torch import nn

from fedsim.algorithms import FedAvg, LocalConfig, local_train, optimizer_config
from fedsim.algorithms.fedavg import FedAvgConfig
from fedsim.algorithms.fedspeed import (
    FedSpeedConfig,
    FedSpeedScenarioConfig,
    FedSpeedServer,
    ascent_scale,
    fedspeed_amend,
    fedspeed_local_train,
    quasi_gradient,
)
from fedsim.wire.messages import Update

# Seven 3-feature samples with real targets; batch 3 gives batches 3, 3, 1.
XS = [
    [0.5, -1.0, 2.0],
    [1.5, 0.3, -0.7],
    [-0.2, 0.8, 0.1],
    [2.0, -0.5, 0.4],
    [-1.3, -0.9, 1.1],
    [0.0, 1.7, -1.5],
    [0.9, 0.2, 0.6],
]
YS = [1.0, -0.5, 0.3, 2.0, -1.2, 0.7, 0.1]
THETA0 = [0.1, -0.2, 0.3, 0.05]  # [w1, w2, w3, b]
GHAT0 = [0.2, -0.1, 0.05, 0.3]
BATCH = 3
SEED = 77
LR = 0.1
LAM = 0.5

DATA_X = torch.tensor(XS)
DATA_Y = torch.tensor(YS).unsqueeze(1)
MSE = nn.MSELoss()


def _model() -> nn.Module:
    return nn.Linear(3, 1)


def _gen(seed: int = SEED) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def mirrored_batches(n: int, batch_size: int, steps: int, seed: int) -> list[list[int]]:
    """The minibatch order of fedsim.algorithms.local.batches."""
    gen = _gen(seed)
    out: list[list[int]] = []
    while len(out) < steps:
        perm = torch.randperm(n, generator=gen).tolist()
        out.extend(perm[s : s + batch_size] for s in range(0, n, batch_size))
    return out[:steps]


def _local(steps: int, lr: float = LR, wd: float = 0.0, batch: int = BATCH) -> LocalConfig:
    return LocalConfig(
        steps=steps, batch_size=batch, optimizer=optimizer_config(lr=lr, weight_decay=wd)
    )


def _t(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def _close(a: torch.Tensor, expected) -> bool:
    return torch.allclose(a.double(), _t(expected), rtol=1e-5, atol=1e-6)


def _run(cfg: FedSpeedConfig, steps: int, ghat=GHAT0, theta=THETA0, wd=0.0, seed=SEED):
    g = None if ghat is None else torch.tensor(ghat)
    return fedspeed_local_train(
        _model(), torch.tensor(theta), DATA_X, DATA_Y, _local(steps, wd=wd), cfg, g,
        _gen(seed), MSE,
    )  # fmt: skip


def _reference(cfg: FedSpeedConfig, steps: int, ghat=GHAT0, theta=THETA0, wd=0.0, seed=SEED):
    batches = mirrored_batches(len(XS), BATCH, steps, seed)
    out = ref.fedspeed_client(
        theta, ghat or [0.0] * 4, XS, YS, batches, LR, cfg.prox_lambda, cfg.perturb_alpha,
        cfg.ascent_rho, cfg.ascent_mode, cfg.ascent_eps, cfg.prox, cfg.correction,
        cfg.perturbation, wd,
    )  # fmt: skip
    return batches, out


SWITCHES = list(itertools.product([True, False], repeat=3))


@pytest.mark.parametrize(("prox", "correction", "perturbation"), SWITCHES)
@pytest.mark.parametrize("k", [1, 2, 5])
def test_parity_with_reference_after_every_step(prox, correction, perturbation, k):
    cfg = FedSpeedConfig(
        prox_lambda=LAM, perturb_alpha=0.75, ascent_rho=0.2,
        prox=prox, correction=correction, perturbation=perturbation, upload="local",
    )  # fmt: skip
    x_k, ghat, stats = _run(cfg, k)
    batches, (trace, ref_xk, ref_ghat, _) = _reference(cfg, k)
    assert _close(x_k, trace[k - 1]["x"])
    assert _close(x_k, ref_xk)
    assert _close(ghat, ref_ghat)
    seen = sum(len(b) for b in batches)
    loss = sum(t["loss"] * len(b) for t, b in zip(trace, batches, strict=True)) / seen
    assert stats["loss"] == pytest.approx(loss, rel=1e-5)
    assert stats["steps"] == k
    assert stats["samples"] == seen
    assert stats["grad_evals"] == (2 * k if perturbation else k)
    mean_scale = sum(t["scale"] for t in trace) / k
    assert stats["ascent_scale"] == pytest.approx(mean_scale, rel=1e-5)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"ascent_mode": "constant", "ascent_rho": 0.05},
        {"perturb_alpha": 1.0},
        {"perturb_alpha": 0.0},
        {"ascent_rho": 0.0},
        {"ascent_eps": 1e-3},
    ],
    ids=["constant-rho", "alpha1", "alpha0", "rho0", "eps1e-3"],
)
@pytest.mark.parametrize("wd", [0.0, 0.01])
def test_parity_ascent_variants_and_weight_decay(kwargs, wd):
    cfg = FedSpeedConfig(prox_lambda=LAM, **{"perturb_alpha": 0.5, **kwargs})
    x_hat, ghat, _ = _run(cfg, 6, wd=wd)
    _, (_, _, ref_ghat, ref_upload) = _reference(cfg, 6, wd=wd)
    assert _close(x_hat, ref_upload)
    assert _close(ghat, ref_ghat)


def test_ghat_and_global_model_persist_over_two_rounds():
    """Client keeps ghat; the server averages xhat; round 2 starts from both."""
    cfg = FedSpeedConfig(prox_lambda=LAM, perturb_alpha=0.9375, ascent_rho=0.1)
    server = FedSpeedServer(FedSpeedScenarioConfig())
    shards = [[0, 1, 2, 3], [3, 4, 5, 6]]
    x, ref_x = torch.tensor(THETA0), list(THETA0)
    ghats = [None, None]
    ref_ghats = [[0.0] * 4, [0.0] * 4]
    for rnd in range(2):
        results, ref_uploads = [], []
        for i, shard in enumerate(shards):
            seed = 100 * rnd + i
            upload, ghats[i], _ = fedspeed_local_train(
                _model(), x, DATA_X[shard], DATA_Y[shard], _local(4, batch=2), cfg,
                ghats[i], _gen(seed), MSE,
            )  # fmt: skip
            batches = mirrored_batches(len(shard), 2, 4, seed)
            _, _, ref_ghats[i], ref_up = ref.fedspeed_client(
                ref_x, ref_ghats[i], [XS[j] for j in shard], [YS[j] for j in shard],
                batches, LR, LAM, 0.9375, 0.1,
            )  # fmt: skip
            results.append(Update.of(client=i, base_version=rnd, params=upload))
            ref_uploads.append(ref_up)
            assert _close(upload, ref_up), f"round {rnd} client {i}"
            assert _close(ghats[i], ref_ghats[i])
        x, _ = server.aggregate(x, results)
        ref_x = ref.server_paper(ref_uploads)
        assert _close(x, ref_x)
    assert all(not torch.equal(g, torch.zeros(4)) for g in ghats)


@pytest.mark.parametrize("perturbation", [True, False])
@pytest.mark.parametrize("ghat", [None, GHAT0], ids=["first-round", "later-round"])
def test_closed_forms_lemmas_c1_c2(perturbation, ghat):
    """Full-batch (deterministic) gradients: Delta, ghat and xhat match Lemmas C.1 / C.2."""
    cfg = FedSpeedConfig(prox_lambda=LAM, perturb_alpha=0.6, perturbation=perturbation)
    steps = 8
    g = None if ghat is None else torch.tensor(ghat)
    local = LocalConfig(steps=steps, batch_size=len(XS), optimizer=optimizer_config(lr=LR))
    model, x0 = _model(), torch.tensor(THETA0)
    x_hat, ghat_new, _ = fedspeed_local_train(model, x0, DATA_X, DATA_Y, local, cfg, g, _gen(), MSE)
    x_k = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    prev = ghat or [0.0] * 4
    trace, _, _, _ = ref.fedspeed_client(
        THETA0, prev, XS, YS, [list(range(len(XS)))] * steps, LR, LAM, 0.6, 0.1,
        perturbation=perturbation,
    )  # fmt: skip
    delta, ghat_cf, xhat_cf = ref.closed_form(THETA0, prev, [t["gtilde"] for t in trace], LR, LAM)
    assert _close(x_k - x0, delta)
    assert _close(ghat_new, ghat_cf)
    assert _close(x_hat, xhat_cf)
    # xhat = x^t + 2 Delta - lambda ghat^{t-1} (Lemma C.2), from production alone.
    assert torch.allclose(x_hat, x0 + 2 * (x_k - x0) - LAM * torch.tensor(prev), atol=1e-6)


def test_amend_functional_core():
    x0, x_k, g = torch.tensor([1.0, 2.0]), torch.tensor([0.5, 2.5]), torch.tensor([0.1, -0.2])
    x_hat, g_new = fedspeed_amend(x_k, x0, g, 10.0)
    assert torch.allclose(g_new, torch.tensor([0.1 + 0.05, -0.2 - 0.05]))
    assert torch.allclose(x_hat, x0 + 2 * (x_k - x0) - 10.0 * g)


def test_ascent_scale_and_quasi_gradient():
    assert ascent_scale(2.0, 0.1) == pytest.approx(0.1 / (2.0 + 1e-7))
    assert ascent_scale(0.0, 0.1) == pytest.approx(0.1 / 1e-7)
    assert ascent_scale(2.0, 0.1, "constant") == 0.1
    with pytest.raises(ValueError, match="Invalid ascent_mode: 'sam'"):
        ascent_scale(1.0, 0.1, "sam")
    (q,) = quasi_gradient([torch.tensor([1.0, 0.0])], [torch.tensor([0.0, 4.0])], 0.25)
    assert torch.allclose(q, torch.tensor([0.75, 1.0]))


@pytest.mark.parametrize("opt", ["sgd", "sgdm"])
@pytest.mark.parametrize("wd", [0.0, 0.05])
def test_modules_off_is_exactly_local_sgd_and_fedavg(opt, wd):
    """With prox, correction and perturbation off FedSpeed is FedAvg."""
    cfg = FedSpeedConfig(prox=False, correction=False, perturbation=False, prox_lambda=0.01)
    local = LocalConfig(
        steps=7, batch_size=BATCH, optimizer=optimizer_config(name=opt, lr=0.2, weight_decay=wd)
    )
    uploads, fedavg_models = [], []
    for client in range(3):
        x0 = torch.tensor(THETA0)
        up, ghat, _ = fedspeed_local_train(
            _model(), x0, DATA_X, DATA_Y, local, cfg, torch.tensor(GHAT0), _gen(client), MSE
        )
        plain, _ = local_train(_model(), x0, DATA_X, DATA_Y, local, _gen(client), MSE)
        assert torch.equal(up, plain)
        assert torch.equal(ghat, torch.tensor(GHAT0)), "correction off leaves ghat as is"
        uploads.append(Update.of(client=client, base_version=0, params=up))
        fedavg_models.append(Update.of(client=client, base_version=0, params=plain))
    x = torch.tensor(THETA0)
    new, _ = FedSpeedServer(FedSpeedScenarioConfig()).aggregate(x, uploads)
    expected, _ = FedAvg(FedAvgConfig(weighting="uniform")).aggregate(x, fedavg_models)
    assert torch.equal(new, expected)


def test_zero_alpha_or_zero_rho_removes_the_perturbation():
    off, _, s_off = _run(FedSpeedConfig(prox_lambda=LAM, perturbation=False), 5)
    for kwargs in ({"perturb_alpha": 0.0}, {"ascent_rho": 0.0}):
        on, _, s_on = _run(FedSpeedConfig(prox_lambda=LAM, **kwargs), 5)
        assert torch.allclose(on, off, atol=1e-7), kwargs
        assert s_on["grad_evals"] == 2 * s_off["grad_evals"]


def test_ascent_pass_keeps_dropout_mask_and_batchnorm_statistics():
    """rho = 0 makes the ascent point x itself: with the mask replayed and the BN
    statistics restored, the run equals the unperturbed one bit for bit, and the
    global RNG stream advances by one forward pass per step."""

    def model() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(
            nn.Linear(3, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Dropout(0.5), nn.Linear(8, 1)
        )

    runs = []
    for perturbation in (False, True):
        cfg = FedSpeedConfig(prox_lambda=LAM, ascent_rho=0.0, perturbation=perturbation)
        m = model()
        x0 = torch.cat([p.detach().reshape(-1) for p in m.parameters()])
        torch.manual_seed(123)
        up, ghat, _ = fedspeed_local_train(
            m, x0, DATA_X[:6], DATA_Y[:6], _local(6), cfg, None, _gen(), MSE
        )
        after = torch.rand(3)
        runs.append((up, ghat, [b.clone() for b in m.buffers()], after))
    (u0, g0, b0, r0), (u1, g1, b1, r1) = runs
    assert torch.equal(u0, u1)
    assert torch.equal(g0, g1)
    assert all(torch.equal(a, b) for a, b in zip(b0, b1, strict=True))
    assert torch.equal(r0, r1)


def test_clip_bounds_the_descent_direction():
    cfg = FedSpeedConfig(prox_lambda=LAM, clip_norm=1e-3, upload="local")
    x_k, _, _ = _run(cfg, 1)
    assert float((x_k - torch.tensor(THETA0)).norm()) <= LR * 1e-3 * (1 + 1e-4)


def test_upload_local_returns_x_k_and_amended_returns_xhat():
    cfg = FedSpeedConfig(prox_lambda=LAM)
    x_hat, ghat, _ = _run(cfg, 4)
    x_k, ghat2, _ = _run(FedSpeedConfig(prox_lambda=LAM, upload="local"), 4)
    assert torch.equal(ghat, ghat2)
    assert torch.allclose(x_hat, x_k - LAM * ghat, atol=1e-6)


def test_inputs_untouched_and_half_precision_ghat_accepted():
    x0, g = torch.tensor(THETA0), torch.tensor(GHAT0)
    cfg = FedSpeedConfig(prox_lambda=LAM)
    local = _local(3)
    a, ga, _ = fedspeed_local_train(_model(), x0, DATA_X, DATA_Y, local, cfg, g, _gen(), MSE)
    assert torch.equal(x0, torch.tensor(THETA0))
    assert torch.equal(g, torch.tensor(GHAT0))
    assert ga.dtype == torch.float32
    assert ga.data_ptr() != g.data_ptr()
    half = g.half()
    b, _, _ = fedspeed_local_train(_model(), x0, DATA_X, DATA_Y, local, cfg, half, _gen(), MSE)
    assert torch.allclose(a, b, atol=1e-3)


def test_client_validation_errors():
    cfg = FedSpeedConfig(prox_lambda=LAM)
    x0 = torch.tensor(THETA0)
    prox = LocalConfig(steps=2, prox_mu=0.1)
    with pytest.raises(ValueError, match=r"Invalid prox_mu: 0\.1"):
        fedspeed_local_train(_model(), x0, DATA_X, DATA_Y, prox, cfg, None, _gen(), MSE)
    with pytest.raises(ValueError, match=r"Invalid lr: 0\.8 > prox_lambda 0\.5"):
        fedspeed_local_train(
            _model(), x0, DATA_X, DATA_Y, _local(2, lr=0.8), cfg, None, _gen(), MSE
        )
    # Without the prox term the (1 - lr/lambda) recursion does not arise.
    no_prox = FedSpeedConfig(prox_lambda=LAM, prox=False)
    fedspeed_local_train(_model(), x0, DATA_X, DATA_Y, _local(2, lr=0.8), no_prox, None,
                         _gen(), MSE)  # fmt: skip
    with pytest.raises(ValueError, match=r"Invalid g_hat: shape \(3,\)"):
        fedspeed_local_train(
            _model(), x0, DATA_X, DATA_Y, _local(2), cfg, torch.zeros(3), _gen(), MSE
        )
    with pytest.raises(ValueError, match="no samples"):
        fedspeed_local_train(
            _model(), x0, DATA_X[:0], DATA_Y[:0], _local(2), cfg, None, _gen(), MSE
        )


# --------------------------------------------------------------------------
# Server.


def _uploads(gen: torch.Generator, x: torch.Tensor, clients: list[int]) -> list[Update]:
    return [
        Update.of(client=c, base_version=0, params=x + torch.randn(x.shape, generator=gen))
        for c in clients
    ]


def test_fl_simulator_aggregation_matches_reference_under_partial_participation():
    gen = _gen(3)
    rule = FedSpeedServer(FedSpeedScenarioConfig(server_rule="fl_simulator"), total_clients=6)
    x = torch.randn(5, generator=gen)
    h: dict[int, list[float]] = {}
    for rnd in range(6):
        clients = torch.randperm(6, generator=gen)[:2].tolist()
        results = _uploads(gen, x, clients)
        expected = ref.server_fl_simulator(
            x.tolist(), {r.client: r.params.tolist() for r in results}, h, 6
        )
        x, info = rule.aggregate(x, results)
        assert _close(x, expected), f"round {rnd}"
        assert info == {"clients": clients}
    state = rule.state_dict()
    assert state["rounds"] == 6
    assert set(state["h"]) == set(h)


def test_paper_and_fl_simulator_agree_under_full_participation():
    """The paper's and the authors' code's placements give the same model when all clients run."""
    shards = [[0, 1, 2], [3, 4], [5, 6]]
    cfg_paper = FedSpeedConfig(prox_lambda=LAM)
    cfg_sim = FedSpeedConfig(prox_lambda=LAM, upload="local")
    paper = FedSpeedServer(FedSpeedScenarioConfig())
    sim = FedSpeedServer(FedSpeedScenarioConfig(server_rule="fl_simulator"), total_clients=3)
    xp = xs = torch.tensor(THETA0)
    gp: list = [None] * 3
    gs: list = [None] * 3
    for rnd in range(3):
        rp, rs = [], []
        for i, shard in enumerate(shards):
            args = (DATA_X[shard], DATA_Y[shard], _local(3, batch=2))
            up, gp[i], _ = fedspeed_local_train(_model(), xp, *args, cfg_paper, gp[i],
                                                _gen(10 * rnd + i), MSE)  # fmt: skip
            uk, gs[i], _ = fedspeed_local_train(_model(), xs, *args, cfg_sim, gs[i],
                                                _gen(10 * rnd + i), MSE)  # fmt: skip
            rp.append(Update.of(client=i, base_version=rnd, params=up))
            rs.append(Update.of(client=i, base_version=rnd, params=uk))
        xp, _ = paper.aggregate(xp, rp)
        xs, _ = sim.aggregate(xs, rs)
        assert torch.allclose(xp, xs, atol=1e-5), f"round {rnd}"


def test_server_rejects_bad_rounds_without_changing_state():
    rule = FedSpeedServer(FedSpeedScenarioConfig(server_rule="fl_simulator"), total_clients=2)
    x = torch.zeros(3)
    rule.aggregate(x, _uploads(_gen(1), x, [0]))
    state = rule.state_dict()
    with pytest.raises(ValueError, match="appears twice"):
        rule.aggregate(x, _uploads(_gen(2), x, [1, 1]))
    with pytest.raises(ValueError, match="3 distinct clients > total_clients 2"):
        rule.aggregate(x, _uploads(_gen(2), x, [1, 2]))
    with pytest.raises(ValueError, match="no results"):
        rule.aggregate(x, [])
    assert rule.state_dict() == state


def test_server_state_dict_round_trip_restores_h():
    gen = _gen(4)
    rule = FedSpeedServer(FedSpeedScenarioConfig(server_rule="fl_simulator"), total_clients=4)
    x = torch.randn(4, generator=gen)
    for _ in range(3):
        x, _ = rule.aggregate(x, _uploads(gen, x, [0, 2]))
    fresh = FedSpeedServer(FedSpeedScenarioConfig(server_rule="fl_simulator"), total_clients=4)
    fresh.load_state_dict(rule.state_dict())
    results = _uploads(gen, x, [1, 2])
    a, _ = rule.aggregate(x, results)
    b, _ = fresh.aggregate(x, results)
    assert torch.equal(a, b)


# -- the scenario key: one switch for the whole server rule --------------------------

def _built(**algorithm):
    """The server and client side a scenario's [algorithm] table builds."""
    from fedsim.algorithms import get
    from fedsim.algorithms.api import ServerContext
    from fedsim.scenario import parse

    sc = parse({"name": "t", "data": {"dataset": "synthetic", "num_clients": 7},
                "algorithm": {"name": "fedspeed", **algorithm}}, "t")
    spec = get("fedspeed")
    server = spec.server(sc.algorithm, ServerContext(x0=torch.zeros(3), num_clients=7, seed=0,
                                                     local=_local(1)))
    return server.rule, sc.algorithm.client_config()


def test_server_rule_paper_is_the_default():
    rule, client = _built()
    assert rule.aggregation == "paper"
    assert client.upload == "amended"


def test_server_rule_fl_simulator_selects_the_authors_rule_as_a_whole():
    rule, client = _built(server_rule="fl_simulator", fraction=0.3)
    assert rule.aggregation == "fl_simulator"
    assert rule.total_clients == 7        # h_i averaged over every client, not the round's
    assert client.upload == "local"       # clients upload x_K; the server keeps h_i


def test_fl_simulator_without_the_correction_is_the_plain_mean_of_x_k():
    """The server's h_i term is the authors' correction: switched off, it goes too."""
    rule, client = _built(server_rule="fl_simulator", correction=False)
    assert rule.aggregation == "paper"
    assert client.upload == "local"


def test_a_mixed_server_rule_is_refused_with_the_reason():
    from fedsim.errors import ScenarioError

    with pytest.raises(ScenarioError, match="server_rule = 'fl_simulator' averages"):
        _built(server_rule="fl_simulator", weighting="samples")
    with pytest.raises(ScenarioError, match="server_rule"):
        _built(server_rule="authors")
    for extra in ({"round_deadline": 2.0}, {"over_selection": 0.3},
                  {"guard": {"max_norm": 10.0}}):
        with pytest.raises(ScenarioError, match="h_i on the server"):
            _built(server_rule="fl_simulator", **extra)
