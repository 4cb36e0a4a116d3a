"""SCAFFOLD: step-by-step parity with Algorithm 1, control-variate rounds, FedAvg path."""

from __future__ import annotations

import copy

import pytest
import scaffold_reference as ref
import torch
from pydantic import ValidationError
from torch import nn

from fedsim.algorithms import (
    FedAvg,
    LocalConfig,
    NonFiniteUpdate,
    get,
    local_train,
    optimizer_config,
)
from fedsim.algorithms.api import ServerContext
from fedsim.algorithms.fedavg import FedAvgConfig
from fedsim.algorithms.scaffold import (
    Scaffold,
    ScaffoldConfig,
    scaffold_control_update,
    scaffold_local_train,
    scaffold_server_step,
)
from fedsim.wire.messages import Update

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
THETA0 = [0.1, -0.2, 0.3, 0.05]
C = [0.3, -0.1, 0.2, -0.4]
C_I = [-0.2, 0.25, 0.1, 0.15]
BATCH = 3
SEED = 5
LR = 0.1

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


def _local(steps: int, wd: float = 0.0, batch: int = BATCH, name: str = "sgd") -> LocalConfig:
    return LocalConfig(
        steps=steps,
        batch_size=batch,
        optimizer=optimizer_config(name=name, lr=LR, weight_decay=wd),
    )


def _close(a: torch.Tensor, expected) -> bool:
    return torch.allclose(
        a.double(), torch.tensor(expected, dtype=torch.float64), rtol=1e-5, atol=1e-6
    )


@pytest.mark.parametrize("option", ["II", "I"])
@pytest.mark.parametrize("wd", [0.0, 0.02])
@pytest.mark.parametrize("k", [1, 2, 5])
def test_parity_with_reference_after_every_step(option, wd, k):
    y, c_new, stats = scaffold_local_train(
        _model(), torch.tensor(THETA0), torch.tensor(C), torch.tensor(C_I),
        DATA_X, DATA_Y, _local(k, wd), _gen(), MSE, option=option,
    )  # fmt: skip
    batches = mirrored_batches(len(XS), BATCH, k, SEED)
    trace, ref_y, ref_c = ref.scaffold_client(THETA0, C, C_I, XS, YS, batches, LR, option, wd)
    assert _close(y, trace[k - 1])
    assert _close(y, ref_y)
    assert _close(c_new, ref_c)
    assert stats["steps"] == k
    assert stats["samples"] == sum(len(b) for b in batches)
    assert stats["grad_evals"] == k + (option == "I")


@pytest.mark.parametrize("opt", ["sgd", "sgdm", "adam"])
def test_zero_or_equal_controls_is_exactly_local_training(opt):
    """With c - c_i = 0 the corrected step is the plain one (FedAvg's client)."""
    local = _local(6, wd=0.01, name=opt)
    plain, _ = local_train(_model(), torch.tensor(THETA0), DATA_X, DATA_Y, local, _gen(), MSE)
    for c, c_i in ((None, None), (torch.tensor(C), torch.tensor(C))):
        y, _, _ = scaffold_local_train(
            _model(), torch.tensor(THETA0), c, c_i, DATA_X, DATA_Y, local, _gen(), MSE
        )
        assert torch.equal(y, plain)


def test_rounds_with_partial_participation_match_reference():
    """x, c and every client's c_i over four rounds, |S| = 2 of N = 3."""
    shards = [[0, 1, 2], [3, 4], [5, 6]]
    n_clients = len(shards)
    server = Scaffold(ScaffoldConfig(server_lr=0.8), total_clients=n_clients)
    x, ref_x = torch.tensor(THETA0), list(THETA0)
    ref_c = [0.0] * 4
    cis: list[torch.Tensor | None] = [None] * n_clients
    ref_cis = [[0.0] * 4 for _ in range(n_clients)]
    gen = _gen(99)
    for rnd in range(4):
        active = sorted(torch.randperm(n_clients, generator=gen)[:2].tolist())
        c = server.control(x)
        assert _close(c, ref_c)
        results, deltas, ref_ys, ref_dcs = [], [], [], []
        for i in active:
            seed = 10 * rnd + i
            shard = shards[i]
            y, c_new, _ = scaffold_local_train(
                _model(), x, c, cis[i], DATA_X[shard], DATA_Y[shard], _local(4, batch=2),
                _gen(seed), MSE,
            )  # fmt: skip
            old = torch.zeros(4) if cis[i] is None else cis[i]
            deltas.append(c_new - old)
            cis[i] = c_new
            results.append(Update.of(client=i, base_version=rnd, params=y))
            batches = mirrored_batches(len(shard), 2, 4, seed)
            _, ref_y, ref_cnew = ref.scaffold_client(
                ref_x, ref_c, ref_cis[i], [XS[j] for j in shard], [YS[j] for j in shard],
                batches, LR,
            )  # fmt: skip
            ref_dcs.append([a - b for a, b in zip(ref_cnew, ref_cis[i], strict=True)])
            ref_cis[i] = ref_cnew
            ref_ys.append(ref_y)
        x, info = server.aggregate(x, results, deltas)
        ref_x, ref_c = ref.scaffold_server(ref_x, ref_c, ref_ys, ref_dcs, 0.8, n_clients)
        assert info == {"clients": active}
        assert _close(x, ref_x), f"round {rnd}"
        assert _close(server.control(x), ref_c)
        for i in range(n_clients):
            if cis[i] is not None:
                assert _close(cis[i], ref_cis[i])
    assert server.rounds == 4


def test_full_participation_keeps_c_the_mean_of_client_controls():
    shards = [[0, 1, 2, 3], [4, 5, 6]]
    server = Scaffold(ScaffoldConfig(), total_clients=2)
    x = torch.tensor(THETA0)
    cis = [torch.zeros(4), torch.zeros(4)]
    for rnd in range(3):
        c = server.control(x)
        results, deltas = [], []
        for i, shard in enumerate(shards):
            y, c_new, _ = scaffold_local_train(
                _model(), x, c, cis[i], DATA_X[shard], DATA_Y[shard], _local(3, batch=2),
                _gen(rnd * 7 + i), MSE,
            )  # fmt: skip
            deltas.append(c_new - cis[i])
            cis[i] = c_new
            results.append(Update.of(client=i, base_version=rnd, params=y))
        x, _ = server.aggregate(x, results, deltas)
        assert torch.allclose(server.control(x), (cis[0] + cis[1]) / 2, atol=1e-6)


def test_server_step_matches_reference_and_fedavg():
    gen = _gen(1)
    x, c = torch.randn(6, generator=gen), torch.randn(6, generator=gen)
    ys = [x + torch.randn(6, generator=gen) for _ in range(3)]
    dcs = [torch.randn(6, generator=gen) for _ in range(3)]
    for lr in (1.0, 0.5, 1.5):
        new_x, new_c = scaffold_server_step(x, c, ys, dcs, lr, 10)
        ref_x, ref_c = ref.scaffold_server(
            x.tolist(), c.tolist(), [y.tolist() for y in ys], [d.tolist() for d in dcs], lr, 10
        )
        assert _close(new_x, ref_x)
        assert _close(new_c, ref_c)
    results = [Update.of(client=i, base_version=0, params=y) for i, y in enumerate(ys)]
    avg, _ = FedAvg(FedAvgConfig(weighting="uniform")).aggregate(x, results)
    assert torch.equal(scaffold_server_step(x, c, ys, dcs, 1.0, 10)[0], avg)


def test_weighting_samples_weights_the_model_mean_but_not_the_control_step():
    """Bug: SCAFFOLD accepted ``algorithm.weighting`` and ignored it."""
    gen = _gen(2)
    x = torch.randn(6, generator=gen)
    ys = [x + torch.randn(6, generator=gen) for _ in range(3)]
    dcs = [torch.randn(6, generator=gen) for _ in range(3)]
    results = [Update.of(client=i, base_version=0, params=y, num_samples=n)
               for i, (y, n) in enumerate(zip(ys, (10, 30, 60), strict=True))]
    uniform = Scaffold(ScaffoldConfig(), total_clients=3)
    weighted = Scaffold(ScaffoldConfig(weighting="samples"), total_clients=3)
    xu, _ = uniform.aggregate(x, results, dcs)
    xw, _ = weighted.aggregate(x, results, dcs)
    assert torch.allclose(xu, (ys[0] + ys[1] + ys[2]) / 3, atol=1e-6)
    assert torch.allclose(xw, 0.1 * ys[0] + 0.3 * ys[1] + 0.6 * ys[2], atol=1e-6)
    assert torch.equal(uniform.control(x), weighted.control(x))
    fedavg, _ = FedAvg(FedAvgConfig(weighting="samples")).aggregate(x, results)
    assert torch.allclose(xw, fedavg, atol=1e-6)
    spec = get("scaffold")
    cfg = spec.config.model_validate({"name": "scaffold", "weighting": "samples"})
    assert spec.server(cfg, ServerContext(x0=x, num_clients=3, seed=0, local=_local(1)))\
        .rule.rule.cfg.weighting == "samples"
    with pytest.raises(ValidationError, match="weighting"):
        ScaffoldConfig(weighting="median")


def test_control_update_option_ii_and_validation():
    x, y = torch.tensor([1.0, 2.0]), torch.tensor([0.5, 2.5])
    out = scaffold_control_update(torch.tensor([0.1, 0.1]), torch.tensor([0.2, 0.0]), x, y, 5, 0.1)
    assert torch.allclose(out, torch.tensor([0.1 - 0.2 + 1.0, 0.1 - 1.0]))
    with pytest.raises(ValueError, match="Invalid steps/lr"):
        scaffold_control_update(x, x, x, y, 0, 0.1)


def _round(x: torch.Tensor, clients: list[int]):
    gen = _gen(sum(clients) + 1)
    results = [
        Update.of(client=c, base_version=0, params=x + torch.randn(x.shape, generator=gen))
        for c in clients
    ]
    return results, [torch.randn(x.shape, generator=gen) for _ in clients]


def test_server_rejects_bad_input_without_changing_state():
    rule = Scaffold(ScaffoldConfig(), total_clients=3)
    x = torch.zeros(4)
    rule.aggregate(x, *_round(x, [0, 1]))
    state = copy.deepcopy(rule.state_dict())
    results, deltas = _round(x, [0, 2])
    bad = deltas[1].clone()
    bad[1] = float("nan")
    with pytest.raises(NonFiniteUpdate, match="delta_c from client 2: 1 non-finite"):
        rule.aggregate(x, results, [deltas[0], bad])
    with pytest.raises(ValueError, match="1 control updates for 2 results"):
        rule.aggregate(x, results, deltas[:1])
    with pytest.raises(ValueError, match=r"Invalid delta_c from client 0: shape \(3,\)"):
        rule.aggregate(x, results, [torch.zeros(3), deltas[1]])
    with pytest.raises(ValueError, match="appears twice"):
        rule.aggregate(x, *_round(x, [1, 1]))
    with pytest.raises(ValueError, match="4 clients > total_clients 3"):
        rule.aggregate(x, *_round(x, [0, 1, 2, 3]))
    with pytest.raises(ValueError, match="no results"):
        rule.aggregate(x, [], [])
    assert rule.state_dict() == state


def test_control_is_zero_first_then_a_copy_and_state_round_trips():
    rule = Scaffold(ScaffoldConfig(), total_clients=4)
    x = torch.ones(6, dtype=torch.float64)
    c0 = rule.control(x)
    assert torch.equal(c0, torch.zeros(6, dtype=torch.float64))
    assert rule.state_dict() == {"rounds": 0, "c": None, "shape": None, "dtype": None}
    rule.aggregate(x, *_round(x, [1, 3]))
    c1 = rule.control(x)
    c1.add_(100.0)
    assert not torch.equal(rule.control(x), c1), "control() must return a copy"
    fresh = Scaffold(ScaffoldConfig(), total_clients=4)
    fresh.load_state_dict(copy.deepcopy(rule.state_dict()))
    assert torch.equal(fresh.control(x), rule.control(x))
    assert fresh.control(x).dtype == torch.float64
    with pytest.raises(ValueError, match="Invalid control variate"):
        rule.control(torch.zeros(5))


def test_client_validation_errors():
    x0 = torch.tensor(THETA0)
    with pytest.raises(ValueError, match="Invalid option: 'III'"):
        scaffold_local_train(_model(), x0, None, None, DATA_X, DATA_Y, _local(1), _gen(), MSE,
                             option="III")  # fmt: skip
    with pytest.raises(ValueError, match=r"Invalid c_i: shape \(2,\)"):
        scaffold_local_train(
            _model(), x0, None, torch.zeros(2), DATA_X, DATA_Y, _local(1), _gen(), MSE
        )
    with pytest.raises(ValueError, match="no samples"):
        scaffold_local_train(
            _model(), x0, None, None, DATA_X[:0], DATA_Y[:0], _local(1), _gen(), MSE
        )


def test_inputs_untouched():
    x0, c, ci = torch.tensor(THETA0), torch.tensor(C), torch.tensor(C_I)
    _, c_new, _ = scaffold_local_train(_model(), x0, c, ci, DATA_X, DATA_Y, _local(3), _gen(), MSE)
    assert torch.equal(x0, torch.tensor(THETA0))
    assert torch.equal(c, torch.tensor(C))
    assert torch.equal(ci, torch.tensor(C_I))
    assert c_new.data_ptr() not in (c.data_ptr(), ci.data_ptr())
