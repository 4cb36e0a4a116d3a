"""fedsim's SGD against torch.optim.SGD itself: the same parameters, bit for bit, every step."""

from __future__ import annotations

import pytest
import torch
from _fresh import fresh_python

from fedsim.algorithms._sgd import SGD
from fedsim.algorithms.local import LocalConfig, local_train
from fedsim.algorithms.optim import OptimizerConfig, make_optimizer, optimizer_config


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))


def _run(opt_factory, *, closure: bool, set_to_none: bool, steps: int = 25,
         lr_change: bool = False) -> list[torch.Tensor]:
    model = _model()
    opt = opt_factory(list(model.parameters()))
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(64, 6, generator=gen)
    y = torch.randint(0, 3, (64,), generator=gen)
    for step in range(steps):
        idx = torch.randint(0, 64, (8,), generator=gen)
        if lr_change and step == 10:
            opt.param_groups[0]["lr"] = 0.01

        def objective(idx: torch.Tensor = idx) -> float:
            opt.zero_grad(set_to_none=set_to_none)
            loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
            loss.backward()
            return float(loss.detach())

        if closure:
            opt.step(objective)
        else:
            objective()
            opt.step()
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("momentum", [0.0, 0.9])
@pytest.mark.parametrize("weight_decay", [0.0, 1e-3])
@pytest.mark.parametrize("closure", [True, False])
@pytest.mark.parametrize("set_to_none", [True, False])
def test_bit_identical_to_torch(momentum: float, weight_decay: float, closure: bool,
                                set_to_none: bool) -> None:
    ours = _run(lambda ps: SGD(ps, lr=0.1, momentum=momentum, weight_decay=weight_decay),
                closure=closure, set_to_none=set_to_none, lr_change=True)
    theirs = _run(lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=momentum,
                                             weight_decay=weight_decay),
                  closure=closure, set_to_none=set_to_none, lr_change=True)
    for a, b in zip(ours, theirs, strict=True):
        assert torch.equal(a, b)
    assert any(not torch.equal(a, b) for a, b in zip(ours, [p.detach() for p in
                                                            _model().parameters()], strict=True))


def test_parameters_without_gradient_are_left_alone() -> None:
    used, unused = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(3))
    opt = SGD([used, unused], lr=0.5, momentum=0.9)
    for _ in range(3):
        opt.zero_grad()
        (used * 2).sum().backward()
        opt.step()
    assert torch.equal(unused.detach(), torch.ones(3))
    assert unused.grad is None
    # u_1 = 2, u_2 = 3.8, u_3 = 5.42: y = 1 - 0.5 (2 + 3.8 + 5.42)
    assert torch.allclose(used.detach(), torch.full((3,), 1 - 0.5 * 11.22))


def test_zero_grad_keeps_or_drops_the_tensors() -> None:
    p = torch.nn.Parameter(torch.ones(2))
    opt = SGD([p], lr=0.1)
    (p * 3).sum().backward()
    g = p.grad
    opt.zero_grad(set_to_none=False)
    assert p.grad is g
    assert torch.equal(g, torch.zeros(2))
    opt.zero_grad()
    assert p.grad is None


@pytest.mark.parametrize("name", ["sgd", "sgdm"])
def test_local_run_matches_torch_optim(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A whole local run with fedsim's SGD ends where one with torch.optim.SGD does."""
    cfg = LocalConfig(steps=12, batch_size=8, prox_mu=0.01,
                      optimizer=optimizer_config(name=name, lr=0.05, weight_decay=1e-4))
    gen = torch.Generator().manual_seed(5)
    x, y = torch.randn(40, 6, generator=gen), torch.randint(0, 3, (40,), generator=gen)
    model = _model()
    x0 = torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()
    ours, stats = local_train(model, x0, x, y, cfg, torch.Generator().manual_seed(1))

    def torch_sgd(cfg: OptimizerConfig, params, buffers=()):  # type: ignore[no-untyped-def]
        momentum = getattr(cfg, "momentum", 0.0)
        return torch.optim.SGD(params, lr=cfg.lr, momentum=momentum,
                               weight_decay=cfg.weight_decay)

    monkeypatch.setattr("fedsim.algorithms.local.make_optimizer", torch_sgd)
    theirs, stats2 = local_train(model, x0, x, y, cfg, torch.Generator().manual_seed(1))
    assert torch.equal(ours, theirs)
    assert stats == stats2
    assert isinstance(make_optimizer(cfg.optimizer, [torch.nn.Parameter(torch.ones(1))]), SGD)


def test_training_with_sgd_does_not_import_dynamo() -> None:
    """The 0.8 s torch._dynamo import that torch.optim's first use costs is not paid."""
    code = (
        "import sys, torch\n"
        "from fedsim.algorithms.local import LocalConfig, local_train\n"
        "from fedsim.algorithms.optim import optimizer_config\n"
        "m = torch.nn.Linear(4, 2)\n"
        "x0 = torch.nn.utils.parameters_to_vector(m.parameters()).detach()\n"
        "for name in ('sgd', 'sgdm'):\n"
        "    cfg = LocalConfig(steps=3, batch_size=2, optimizer=optimizer_config(name=name))\n"
        "    local_train(m, x0, torch.randn(6, 4), torch.randint(0, 2, (6,)), cfg,\n"
        "                torch.Generator().manual_seed(0))\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    assert fresh_python(code) == ["False"]
