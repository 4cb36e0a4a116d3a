"""Client optimizers, fresh for every local run (docs/algorithms.md#sgd-sgdm-adam-adagrad).

``sgd`` is plain SGD, ``sgdm`` SGD with heavy-ball momentum in the PyTorch
convention (``u <- beta u + g; y <- y - eta u``), ``adam`` Adam with bias
correction, ``adagrad`` Adagrad (``G <- G + g^2; y <- y - eta g / (sqrt(G) + eps)``).
``adam`` and ``adagrad`` are ``torch.optim`` optimizers, reused rather than
rewritten; ``sgd`` and ``sgdm`` are :class:`fedsim.algorithms._sgd.SGD`, which
computes ``torch.optim.SGD``'s update bit for bit without its 0.8 s first-use
import and its ~60 us per-step dispatch (measured in that module).

``deltasgd`` (Delta-SGD, docs/algorithms.md#delta-sgd) and ``sps`` (stochastic
Polyak step, docs/algorithms.md#sps) choose their own step size every step;
they live in :mod:`fedsim.algorithms.adaptive` and ignore ``lr``. Because every
run builds a fresh optimizer, their step sizes reset every round.

All fields are validated whatever ``name`` is, so a config is valid or not on
its own; each optimizer reads only its own fields:

============  =====================================================================
sgd           lr, weight_decay
sgdm          lr, momentum, weight_decay
adam          lr, beta1, beta2, eps, weight_decay
adagrad       lr, initial_accumulator, adagrad_eps, weight_decay
deltasgd      eta0, theta0, gamma, delta, lr_eps, eta_max, first_step, batch_mode,
              mask_mode, weight_decay
sps           sps_c, f_star, eps, eta_max, sps_mode, sps_eta0, sps_n_batches,
              weight_decay
============  =====================================================================
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fedsim.algorithms._optcheck import (
    BATCH_MODES,
    FIRST_STEPS,
    MASK_MODES,
    SPS_MODES,
    check_choice,
    check_count,
    check_finite,
    check_nonnegative,
    check_positive,
)
from fedsim.algorithms._sgd import SGD
from fedsim.lazy import lazy_module

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch")

__all__ = ["OPTIMIZERS", "OptimizerConfig", "make_optimizer"]

OPTIMIZERS: tuple[str, ...] = ("sgd", "sgdm", "adam", "adagrad", "deltasgd", "sps")


@dataclass(frozen=True, slots=True)
class OptimizerConfig:
    """A client optimizer and its hyperparameters.

    Delta-SGD defaults are the paper's experiment settings with the authors'
    code where the docs say so (docs/algorithms.md#delta-sgd): ``eta0 = 0.2``,
    ``theta0 = 1``, ``gamma = 2``, ``delta = 0.1``, ``lr_eps = 1e-8``, no cap
    (``eta_max = inf``), first step ``eta0`` (``first_step = "code"``: ``eta0
    sqrt(1 + delta theta0)``), both gradients on the same minibatch,
    independent dropout masks. SPS defaults are the authors' runs: ``constant``
    mode, ``c = 0.5``, ``f* = 0``, ``eps = 1e-8``, uncapped. Adagrad defaults
    are torch's (``eps = 1e-10``, accumulator starting at 0), the authors'
    settings.
    """

    name: str = "sgd"
    lr: float = 0.05
    momentum: float = 0.9
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0
    # adagrad
    initial_accumulator: float = 0.0
    adagrad_eps: float = 1e-10
    # deltasgd (eta_max is shared with sps)
    eta0: float = 0.2
    theta0: float = 1.0
    gamma: float = 2.0
    delta: float = 0.1
    lr_eps: float = 1e-8
    eta_max: float = math.inf
    first_step: str = "paper"
    batch_mode: str = "same"
    mask_mode: str = "independent"
    # sps (eps and eta_max shared)
    sps_c: float = 0.5
    f_star: float = 0.0
    sps_mode: str = "constant"
    sps_eta0: float = 1.0
    sps_n_batches: int = 500

    def __post_init__(self) -> None:
        if self.name not in OPTIMIZERS:
            raise ValueError(
                f"Invalid optimizer: {self.name!r} (allowed: {', '.join(OPTIMIZERS)})"
            )
        if not self.lr > 0:
            raise ValueError(f"Invalid lr: {self.lr} (must be > 0)")
        if not 0.0 <= self.momentum < 1.0:
            raise ValueError(f"Invalid momentum: {self.momentum} (must be in [0, 1))")
        for name in ("beta1", "beta2"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ValueError(f"Invalid {name}: {value} (must be in [0, 1))")
        if not self.eps > 0:
            raise ValueError(f"Invalid eps: {self.eps} (must be > 0)")
        if not self.weight_decay >= 0:
            raise ValueError(f"Invalid weight_decay: {self.weight_decay} (must be >= 0)")
        check_nonnegative("initial_accumulator", self.initial_accumulator)
        check_positive("adagrad_eps", self.adagrad_eps)
        check_positive("eta0", self.eta0)
        check_positive("theta0", self.theta0, allow_inf=True)
        check_positive("gamma", self.gamma)
        check_nonnegative("delta", self.delta)
        check_nonnegative("lr_eps", self.lr_eps)
        check_positive("eta_max", self.eta_max, allow_inf=True)
        check_choice("first_step", self.first_step, FIRST_STEPS)
        check_choice("batch_mode", self.batch_mode, BATCH_MODES)
        check_choice("mask_mode", self.mask_mode, MASK_MODES)
        check_positive("sps_c", self.sps_c)
        check_finite("f_star", self.f_star)
        check_choice("sps_mode", self.sps_mode, SPS_MODES)
        check_positive("sps_eta0", self.sps_eta0)
        check_count("sps_n_batches", self.sps_n_batches)


def make_optimizer(
    cfg: OptimizerConfig,
    params: Iterable[torch.nn.Parameter],
    buffers: Iterable[torch.Tensor] = (),
) -> torch.optim.Optimizer | SGD:
    """Build a fresh optimizer for one local run.

    ``buffers`` (the model's BatchNorm statistics) are restored after
    Delta-SGD's extra evaluation at the previous iterate; others ignore them.
    ``deltasgd`` and ``sps`` must be stepped with a closure.
    """
    from fedsim.algorithms.adaptive import SPS, DeltaSGD  # lazy: it imports torch; hosts never do

    if cfg.name == "sgd":
        return SGD(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    if cfg.name == "sgdm":
        return SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    if cfg.name == "adam":
        return torch.optim.Adam(
            params,
            lr=cfg.lr,
            betas=(cfg.beta1, cfg.beta2),
            eps=cfg.eps,
            weight_decay=cfg.weight_decay,
        )
    if cfg.name == "adagrad":
        return torch.optim.Adagrad(
            params,
            lr=cfg.lr,
            initial_accumulator_value=cfg.initial_accumulator,
            eps=cfg.adagrad_eps,
            weight_decay=cfg.weight_decay,
        )
    if cfg.name == "deltasgd":
        return DeltaSGD(
            params,
            eta0=cfg.eta0,
            theta0=cfg.theta0,
            gamma=cfg.gamma,
            delta=cfg.delta,
            lr_eps=cfg.lr_eps,
            eta_max=cfg.eta_max,
            weight_decay=cfg.weight_decay,
            first_step=cfg.first_step,
            batch_mode=cfg.batch_mode,
            mask_mode=cfg.mask_mode,
            buffers=buffers,
        )
    return SPS(
        params,
        c=cfg.sps_c,
        f_star=cfg.f_star,
        eps=cfg.eps,
        eta_max=cfg.eta_max,
        weight_decay=cfg.weight_decay,
        mode=cfg.sps_mode,
        eta0=cfg.sps_eta0,
        n_batches=cfg.sps_n_batches,
    )
