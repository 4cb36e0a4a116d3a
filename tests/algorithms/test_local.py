"""local_train against a hand-written SGD / SGDM / Adam (+ proximal term)."""

from __future__ import annotations

import local_reference as ref
import pytest
import torch
from torch import nn

from fedsim.algorithms import LocalConfig, OptimizerConfig, local_train, optimizer_config

# Seven hand-made 3-feature samples, two classes; batch_size 3 gives batches of
# 3, 3 and 1 per epoch, so K = 5 crosses an epoch boundary and a short batch.
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
W0 = [0.1, -0.2, 0.3, -0.4, 0.5, 0.05]  # W (2 x 3) row by row
BATCH = 3
SEED = 2024

DATA_X = torch.tensor(XS)
DATA_Y = torch.tensor(LABELS)


def _model() -> nn.Module:
    return nn.Linear(3, 2, bias=False)


def _gen(seed: int = SEED) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def mirrored_batches(n: int, batch_size: int, steps: int, seed: int) -> list[list[int]]:
    """The minibatch order local_train draws: a randperm per epoch, sliced."""
    gen = _gen(seed)
    out: list[list[int]] = []
    while len(out) < steps:
        perm = torch.randperm(n, generator=gen).tolist()
        out.extend(perm[s : s + batch_size] for s in range(0, n, batch_size))
    return out[:steps]


OPTIMIZERS = {
    "sgd": optimizer_config(name="sgd", lr=0.3),
    "sgdm": optimizer_config(name="sgdm", lr=0.2, momentum=0.9),
    "adam": optimizer_config(name="adam", lr=0.05, beta1=0.9, beta2=0.999, eps=1e-8),
    "sgd-wd": optimizer_config(name="sgd", lr=0.3, weight_decay=0.1),
    "adam-wd": optimizer_config(name="adam", lr=0.05, weight_decay=0.05),
}


def _reference_trajectory(
    opt: OptimizerConfig, prox_mu: float, steps: int, batch: int = BATCH
):
    batches = mirrored_batches(len(XS), batch, steps, SEED)
    # the reference takes every option; an optimizer's config has only its own
    def get(key: str, neutral: float) -> float:
        return float(getattr(opt, key, neutral))

    optimizer = ref.make_optimizer(
        opt.name, get("lr", 0.0), get("momentum", 0.0), get("beta1", 0.9), get("beta2", 0.999),
        get("eps", 1e-8), opt.weight_decay
    )
    return batches, ref.local_train(W0, XS, LABELS, 2, batches, optimizer, prox_mu)


@pytest.mark.parametrize("opt_name", list(OPTIMIZERS))
@pytest.mark.parametrize("prox_mu", [0.0, 0.5])
@pytest.mark.parametrize("k", [1, 2, 5])
def test_parity_with_reference_after_k_steps(opt_name, prox_mu, k):
    opt = OPTIMIZERS[opt_name]
    batches, trajectory = _reference_trajectory(opt, prox_mu, k)
    cfg = LocalConfig(steps=k, batch_size=BATCH, optimizer=opt, prox_mu=prox_mu)
    vec, stats = local_train(_model(), torch.tensor(W0), DATA_X, DATA_Y, cfg, _gen())

    expected, _ = trajectory[k - 1]
    assert vec.dtype == torch.float32
    assert torch.allclose(
        vec.double(), torch.tensor(expected, dtype=torch.float64), rtol=1e-4, atol=1e-6
    )
    seen = sum(len(b) for b in batches)
    mean_loss = (
        sum(loss * len(b) for (_, loss), b in zip(trajectory, batches, strict=True))
        / seen
    )
    assert stats["steps"] == k
    assert stats["samples"] == seen
    assert stats["loss"] == pytest.approx(mean_loss, rel=1e-5)


@pytest.mark.parametrize("opt_name", ["sgd", "sgdm"])
def test_prox_term_pulls_toward_the_anchor(opt_name):
    """Larger mu keeps the local model closer to x0 (FedProx's point).

    lr * mu stays below 1: each step scales y - x0 by (1 - lr * mu).
    """
    opt = optimizer_config(opt_name, lr=0.05, **({"momentum": 0.5} if opt_name == "sgdm" else {}))
    dists = []
    for mu in (0.0, 1.0, 5.0):
        cfg = LocalConfig(steps=20, batch_size=BATCH, optimizer=opt, prox_mu=mu)
        vec, _ = local_train(_model(), torch.tensor(W0), DATA_X, DATA_Y, cfg, _gen())
        dists.append(float((vec - torch.tensor(W0)).norm()))
    assert dists[0] > dists[1] > dists[2]


@pytest.mark.parametrize(
    ("n", "batch", "epochs", "expected"),
    [
        (7, 3, 1, 3),  # 3 + 3 + 1: the short batch is kept (no drop_last)
        (7, 3, 2, 6),
        (6, 3, 1, 2),
        (6, 7, 1, 1),  # one batch larger than the data
        (100, 32, 3, 12),
        (8, 2, 0.5, 2),
        (8, 2, 0.75, 3),
        (7, 3, 0.01, 1),  # at least one step
    ],
)
def test_num_steps_for_epoch_configs(n, batch, epochs, expected):
    cfg = LocalConfig(steps=None, epochs=epochs, batch_size=batch)
    assert cfg.num_steps(n) == expected


def test_steps_and_epochs_are_exclusive():
    # steps defaults to 10 only when epochs is not set; setting both is an error.
    with pytest.raises(ValueError, match=r"local_steps=4, local_epochs=3\.0"):
        LocalConfig(steps=4, epochs=3.0, batch_size=2)
    assert LocalConfig(epochs=3.0, batch_size=2).num_steps(100) == 150
    assert LocalConfig(batch_size=2).num_steps(100) == 10


def test_epoch_config_parity_and_one_pass_per_epoch():
    opt = OPTIMIZERS["sgdm"]
    cfg = LocalConfig(steps=None, epochs=2, batch_size=BATCH, optimizer=opt)
    steps = cfg.num_steps(len(XS))
    batches, trajectory = _reference_trajectory(opt, 0.0, steps)
    # Each epoch visits every sample exactly once.
    per_epoch = -(-len(XS) // BATCH)
    for e in range(2):
        epoch = [i for b in batches[e * per_epoch : (e + 1) * per_epoch] for i in b]
        assert sorted(epoch) == list(range(len(XS)))
    vec, stats = local_train(_model(), torch.tensor(W0), DATA_X, DATA_Y, cfg, _gen())
    assert stats["steps"] == steps == 6
    assert stats["samples"] == 2 * len(XS)
    assert torch.allclose(
        vec.double(),
        torch.tensor(trajectory[-1][0], dtype=torch.float64),
        rtol=1e-4,
        atol=1e-6,
    )


@pytest.mark.parametrize("opt_name", ["sgd", "sgdm", "adam"])
def test_fresh_optimizer_per_call(opt_name):
    """Same model object, same x0, same seed: no optimizer state carries over."""
    model = _model()
    cfg = LocalConfig(
        steps=5, batch_size=BATCH, optimizer=OPTIMIZERS[opt_name], prox_mu=0.1
    )
    x0 = torch.tensor(W0)
    first, s1 = local_train(model, x0.clone(), DATA_X, DATA_Y, cfg, _gen())
    second, s2 = local_train(model, x0.clone(), DATA_X, DATA_Y, cfg, _gen())
    assert torch.equal(first, second)
    assert s1 == s2


def test_local_train_leaves_x0_untouched():
    x0 = torch.tensor(W0)
    cfg = LocalConfig(steps=3, batch_size=BATCH, optimizer=OPTIMIZERS["sgd"])
    model = _model()
    first, _ = local_train(model, x0, DATA_X, DATA_Y, cfg, _gen())
    assert torch.equal(x0, torch.tensor(W0)), "x0 was modified in place"
    second, _ = local_train(model, x0, DATA_X, DATA_Y, cfg, _gen())
    assert torch.equal(first, second)


def test_different_generator_seeds_give_different_batches():
    cfg = LocalConfig(steps=2, batch_size=2, optimizer=OPTIMIZERS["sgd"])
    a, _ = local_train(_model(), torch.tensor(W0), DATA_X, DATA_Y, cfg, _gen(1))
    b, _ = local_train(_model(), torch.tensor(W0), DATA_X, DATA_Y, cfg, _gen(2))
    assert not torch.equal(a, b)


def test_frozen_parameters_are_not_part_of_the_vector():
    model = nn.Linear(3, 2, bias=True)
    model.bias.requires_grad_(False)
    with torch.no_grad():
        model.bias.copy_(torch.tensor([0.0, 0.0]))
    cfg = LocalConfig(steps=2, batch_size=BATCH, optimizer=OPTIMIZERS["sgd"])
    vec, _ = local_train(model, torch.tensor(W0), DATA_X, DATA_Y, cfg, _gen())
    assert vec.shape == (6,)
    assert torch.equal(model.bias, torch.zeros(2))
    # With a zero frozen bias this is the bias-free model's run.
    expected, _ = local_train(_model(), torch.tensor(W0), DATA_X, DATA_Y, cfg, _gen())
    assert torch.allclose(vec, expected)


def test_empty_client_data_rejected():
    cfg = LocalConfig(steps=1)
    with pytest.raises(ValueError, match="no samples"):
        local_train(_model(), torch.tensor(W0), DATA_X[:0], DATA_Y[:0], cfg, _gen())


def _plain_loop(model, x0, cfg, generator):
    """local_train's loop before closures: zero_grad, forward, backward, prox, step()."""
    from fedsim.algorithms._kernels import flatten
    from fedsim.algorithms.local import batches, load_vector
    from fedsim.algorithms.optim import make_optimizer

    load_vector(model, x0)
    params = list(model.parameters())
    anchor = [p.detach().clone() for p in params]
    opt = make_optimizer(cfg.optimizer, params)
    order = batches(len(XS), cfg.batch_size, generator)
    losses = []
    for _ in range(cfg.num_steps(len(XS))):
        idx = next(order)
        opt.zero_grad(set_to_none=False)
        loss = nn.CrossEntropyLoss()(model(DATA_X[idx]), DATA_Y[idx])
        loss.backward()
        with torch.no_grad():
            for p, a in zip(params, anchor, strict=True):
                p.grad.add_(p - a, alpha=cfg.prox_mu)
        opt.step()
        losses.append(float(loss.detach()) * len(idx))
    return flatten(params), losses


@pytest.mark.parametrize("opt_name", list(OPTIMIZERS))
@pytest.mark.parametrize("prox_mu", [0.0, 0.5])
def test_closure_stepping_is_bit_identical_to_the_plain_loop(opt_name, prox_mu):
    """Stepping with a closure (needed by deltasgd/sps) changes nothing for torch optimizers."""
    cfg = LocalConfig(steps=9, batch_size=BATCH, optimizer=OPTIMIZERS[opt_name], prox_mu=prox_mu)
    expected, losses = _plain_loop(_model(), torch.tensor(W0), cfg, _gen())
    vec, stats = local_train(_model(), torch.tensor(W0), DATA_X, DATA_Y, cfg, _gen())
    assert torch.equal(vec, expected)
    assert stats == {"steps": 9, "loss": sum(losses) / 21, "samples": 21}


@pytest.mark.parametrize("opt_name", ["sgd", "sgdm", "sgd-wd"])
@pytest.mark.parametrize("prox_mu", [0.0, 0.5])
def test_sgd_without_closure_is_bit_identical_to_the_closure_path(monkeypatch, opt_name,
                                                                   prox_mu):
    """fedsim's SGD is stepped without the closure (_sgd_steps); the closure
    path, which every other optimizer takes, gives the same iterates and loss."""
    from fedsim.algorithms import local

    cfg = LocalConfig(steps=9, batch_size=BATCH, optimizer=OPTIMIZERS[opt_name], prox_mu=prox_mu)
    fast, fast_stats = local_train(_model(), torch.tensor(W0), DATA_X, DATA_Y, cfg, _gen())
    took = []
    monkeypatch.setattr(local, "_sgd_steps", lambda *a: took.append(a) or 1 / 0)
    monkeypatch.setattr(local, "SGD", type("NotFedsimSGD", (), {}))
    slow, slow_stats = local_train(_model(), torch.tensor(W0), DATA_X, DATA_Y, cfg, _gen())
    assert not took
    assert torch.equal(fast, slow)
    assert fast_stats == slow_stats


def test_with_work_keeps_every_other_field_and_validates_nothing_again():
    """A task's budget (checked as its LocalWork on the wire) replaces the config's,
    every other field is kept, and no pydantic model runs per task."""
    import dataclasses
    from unittest import mock

    from fedsim.algorithms.local import LocalConfig, LocalWorkKeys
    from fedsim.wire.messages import LocalWork

    base = LocalConfig(steps=5, batch_size=8, prox_mu=0.1)
    with mock.patch.object(LocalWorkKeys, "model_validate",
                           side_effect=AssertionError("validated again")):
        by_steps = base.with_work(LocalWork(steps=7))
        by_epochs = base.with_work(LocalWork(epochs=1.5))
        assert base.with_work(None) is base
        assert base.with_work(LocalWork()) is base
    assert by_steps == dataclasses.replace(base, steps=7)
    assert by_epochs == dataclasses.replace(base, steps=None, epochs=1.5)
    for f in dataclasses.fields(LocalConfig):
        if f.name not in ("steps", "epochs"):
            assert getattr(by_steps, f.name) == getattr(base, f.name), f.name
