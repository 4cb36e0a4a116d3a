"""Client optimizers, fresh for every local run (ALGORITHMS.md §6, §10.B).

``sgd`` is plain SGD, ``sgdm`` SGD with heavy-ball momentum in the PyTorch
convention (``u <- beta u + g; y <- y - eta u``), ``adam`` Adam with bias
correction. All are ``torch.optim`` optimizers, reused rather than rewritten.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

__all__ = ["OPTIMIZERS", "OptimizerConfig", "make_optimizer"]

OPTIMIZERS: tuple[str, ...] = ("sgd", "sgdm", "adam")


@dataclass(frozen=True, slots=True)
class OptimizerConfig:
    """A client optimizer and its hyperparameters."""

    name: str = "sgd"
    lr: float = 0.05
    momentum: float = 0.9
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0

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


def make_optimizer(
    cfg: OptimizerConfig, params: Iterable[torch.nn.Parameter]
) -> torch.optim.Optimizer:
    """Build a fresh optimizer for one local run."""
    if cfg.name == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    if cfg.name == "sgdm":
        return torch.optim.SGD(
            params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay
        )
    return torch.optim.Adam(
        params,
        lr=cfg.lr,
        betas=(cfg.beta1, cfg.beta2),
        eps=cfg.eps,
        weight_decay=cfg.weight_decay,
    )
