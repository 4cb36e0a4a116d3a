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

Each optimizer's options are declared once, in its own model below
(:data:`OPTIMIZER_MODELS`); the scenario's flat ``[client]`` table takes its
keys from the same declarations (:class:`fedsim.scenario.sections.ClientConfig`),
and :func:`optimizer_config` builds the chosen one, refusing a key it does not
read:

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

Delta-SGD's defaults are the paper's experiment settings with the authors'
code where the docs say so (docs/algorithms.md#delta-sgd): ``eta0 = 0.2``,
``theta0 = 1``, ``gamma = 2``, ``delta = 0.1``, ``lr_eps = 1e-8``, no cap
(``eta_max`` unset), first step ``eta0`` (``first_step = "code"``: ``eta0
sqrt(1 + delta theta0)``), both gradients on the same minibatch,
independent dropout masks. SPS's are the authors' runs: ``constant`` mode,
``c = 0.5``, ``f* = 0``, ``eps = 1e-8``, uncapped. Adagrad's are torch's
(``eps = 1e-10``, accumulator starting at 0), the authors' settings.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeAlias

from pydantic import Field, StrictInt

from fedsim.algorithms._sgd import SGD
from fedsim.lazy import lazy_module
from fedsim.schema import FiniteNonNeg, FinitePos, Pos, SchemaModel

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch")

__all__ = [
    "OPTIMIZERS", "OPTIMIZER_MODELS", "AdagradKeys", "AdagradOptions", "AdamKeys",
    "AdamOptions", "Beta", "DeltaSGDKeys", "DeltaSGDOptions", "OptimizerConfig",
    "OptimizerName", "SGDKeys", "SGDMKeys", "SGDMOptions", "SGDOptions", "SPSKeys",
    "SPSOptions", "fixed_lr", "make_optimizer", "optimizer_config",
]  # fmt: skip

# The options two or more optimizers share, each declared here once.


class _WeightDecay(SchemaModel):
    #: L2 penalty added to the gradient (every optimizer)
    weight_decay: FiniteNonNeg = 0.0


class _Lr(SchemaModel):
    #: the step size (sgd, sgdm, adam, adagrad; deltasgd and sps choose their own)
    lr: FinitePos = 0.05


class _Eps(SchemaModel):
    #: Adam's denominator guard; SPS's (adagrad has its own, ``adagrad_eps``)
    eps: FinitePos = 1e-8


class _EtaMax(SchemaModel):
    #: a cap on Delta-SGD's and SPS's step size (unset: none)
    eta_max: Pos | None = None


#: a decay rate in [0, 1): momentum, Adam's betas (and FedOpt's server betas and momentum)
Beta = Annotated[float, Field(ge=0, lt=1)]

# Each optimizer's keys (what the scenario's [client] table takes from it) ...
# pydantic orders a model's fields by its reversed MRO, so the shared bases are
# listed last first: lr, then weight_decay, then the optimizer's own keys.


class SGDKeys(_WeightDecay, _Lr):
    """Plain SGD's options."""


class SGDMKeys(_WeightDecay, _Lr):
    """Heavy-ball SGD's options."""

    momentum: Beta = 0.9


class AdamKeys(_WeightDecay, _Eps, _Lr):
    """Adam's options (torch's defaults)."""

    beta1: Beta = 0.9
    beta2: Beta = 0.999


class AdagradKeys(_WeightDecay, _Lr):
    """Adagrad's options (torch's defaults)."""

    initial_accumulator: FiniteNonNeg = 0.0
    adagrad_eps: FinitePos = 1e-10


class DeltaSGDKeys(_WeightDecay, _EtaMax):
    """Delta-SGD's options (docs/algorithms.md#delta-sgd)."""

    eta0: FinitePos = 0.2
    theta0: Pos = 1.0
    gamma: FinitePos = 2.0
    delta: FiniteNonNeg = 0.1
    lr_eps: FiniteNonNeg = 1e-8
    first_step: Literal["paper", "code"] = "paper"
    batch_mode: Literal["same", "previous"] = "same"
    mask_mode: Literal["independent", "shared"] = "independent"


class SPSKeys(_WeightDecay, _EtaMax, _Eps):
    """SPS's options (docs/algorithms.md#sps)."""

    sps_c: FinitePos = 0.5
    f_star: Annotated[float, Field(allow_inf_nan=False)] = 0.0
    sps_mode: Literal["constant", "smooth"] = "constant"
    sps_eta0: FinitePos = 1.0
    sps_n_batches: Annotated[StrictInt, Field(ge=1)] = 500


# ... and each optimizer's config: its keys and its name.


class SGDOptions(SGDKeys):
    name: Literal["sgd"] = "sgd"


class SGDMOptions(SGDMKeys):
    name: Literal["sgdm"] = "sgdm"


class AdamOptions(AdamKeys):
    name: Literal["adam"] = "adam"


class AdagradOptions(AdagradKeys):
    name: Literal["adagrad"] = "adagrad"


class DeltaSGDOptions(DeltaSGDKeys):
    name: Literal["deltasgd"] = "deltasgd"


class SPSOptions(SPSKeys):
    name: Literal["sps"] = "sps"


#: A client optimizer and its hyperparameters, one of the models above.
OptimizerConfig: TypeAlias = (SGDOptions | SGDMOptions | AdamOptions | AdagradOptions
                              | DeltaSGDOptions | SPSOptions)

_MODELS: tuple[type[OptimizerConfig], ...] = (
    SGDOptions, SGDMOptions, AdamOptions, AdagradOptions, DeltaSGDOptions, SPSOptions)
#: Each optimizer's config model, by name.
OPTIMIZER_MODELS: dict[str, type[OptimizerConfig]] = {
    str(m.model_fields["name"].default): m for m in _MODELS}
OPTIMIZERS: tuple[str, ...] = tuple(OPTIMIZER_MODELS)
if TYPE_CHECKING:
    OptimizerName: TypeAlias = str
else:
    #: ``[client] optimizer``: one of the names the models above declare
    OptimizerName = Literal[OPTIMIZERS]


def optimizer_config(name: str = "sgd", **options: Any) -> OptimizerConfig:
    """The optimizer ``name`` with ``options`` (its own keys only; the rest default).

    Raises
    ------
    ValueError
        For an unknown name; pydantic's ``ValidationError`` (a ValueError)
        naming the key and value for a bad value or a key ``name`` does not read.
    """
    model = OPTIMIZER_MODELS.get(name)
    if model is None:
        raise ValueError(f"Invalid optimizer: {name!r} (allowed: {', '.join(OPTIMIZERS)})")
    return model(**options)


def fixed_lr(cfg: OptimizerConfig) -> float:
    """The step size of an optimizer that has one (all but deltasgd and sps)."""
    if isinstance(cfg, DeltaSGDOptions | SPSOptions):
        raise ValueError(f"optimizer {cfg.name} chooses its own step size: it has no lr")
    return cfg.lr


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

    if isinstance(cfg, SGDOptions):
        return SGD(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    if isinstance(cfg, SGDMOptions):
        return SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    if isinstance(cfg, AdamOptions):
        return torch.optim.Adam(
            params,
            lr=cfg.lr,
            betas=(cfg.beta1, cfg.beta2),
            eps=cfg.eps,
            weight_decay=cfg.weight_decay,
        )
    if isinstance(cfg, AdagradOptions):
        return torch.optim.Adagrad(
            params,
            lr=cfg.lr,
            initial_accumulator_value=cfg.initial_accumulator,
            eps=cfg.adagrad_eps,
            weight_decay=cfg.weight_decay,
        )
    if isinstance(cfg, DeltaSGDOptions):
        return DeltaSGD(
            params,
            eta0=cfg.eta0,
            theta0=cfg.theta0,
            gamma=cfg.gamma,
            delta=cfg.delta,
            lr_eps=cfg.lr_eps,
            eta_max=math.inf if cfg.eta_max is None else cfg.eta_max,
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
        eta_max=math.inf if cfg.eta_max is None else cfg.eta_max,
        weight_decay=cfg.weight_decay,
        mode=cfg.sps_mode,
        eta0=cfg.sps_eta0,
        n_batches=cfg.sps_n_batches,
    )
