r"""Local training on one client: the client half of FedAvg, FedProx, FedAsync.

Each local step draws a minibatch (epoch-wise shuffling from the run's own
``torch.Generator``, no ``drop_last``) and descends

    f_i(y; z) + (mu / 2) ||y - x_anchor||^2

where ``mu`` is FedProx's ``mu`` or FedAsync's ``rho`` (Algorithm 1, W5) and
``x_anchor`` the model the run started from. The proximal gradient
``mu (y - x_anchor)`` is added to the parameter gradients directly, which is
the gradient of the loss term without building it.

Every optimizer but fedsim's own SGD is stepped with a closure over the
step's minibatch (:class:`_MinibatchObjective`), so the adaptive ones
(Delta-SGD, SPS) can re-evaluate it: the proximal term reaches every
gradient they see, and SPS sees the objective's value including
``(mu / 2) ||y - x_anchor||^2``. SGD, which needs only the gradient, is
stepped directly (:func:`_sgd_steps`), to the same iterates bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from pydantic import model_validator

from fedsim.algorithms._kernels import flatten
from fedsim.algorithms._sgd import SGD
from fedsim.algorithms.optim import OptimizerConfig, SGDOptions, make_optimizer
from fedsim.lazy import lazy_module
from fedsim.schema import AtLeastOne, Pos, SchemaModel

if TYPE_CHECKING:
    import torch
    from torch import nn
    from torch.nn import functional

    from fedsim.wire.messages import LocalWork
else:
    torch = lazy_module("torch")
    nn = lazy_module("torch.nn")
    functional = lazy_module("torch.nn.functional")

__all__ = ["LocalConfig", "LocalWorkKeys", "batches", "between_steps", "load_vector",
           "local_train"]

#: local steps per task when neither ``local_steps`` nor ``local_epochs`` is set
DEFAULT_STEPS = 10

#: Called after every local step of :func:`local_train` when set (a trainer
#: process sets it to let a more urgent run go first: see
#: fedsim.actors._requests.Preemption). Whatever it does, it must leave the model's
#: parameters as it found them.
_between_steps: Callable[[], None] | None = None


def between_steps(hook: Callable[[], None] | None) -> None:
    """Set (or clear, with None) the function :func:`local_train` calls after every step."""
    global _between_steps
    _between_steps = hook


class LocalWorkKeys(SchemaModel):
    """The local work of a task, declared once: the ``[client]`` table's
    ``batch_size``, ``local_steps`` and ``local_epochs``
    (:class:`fedsim.scenario.sections.ClientConfig` takes them from here) and
    the checks and defaults of :class:`LocalConfig`.

    Exactly one of ``local_steps`` (local minibatch steps, K) and
    ``local_epochs`` (passes over the client's data) is set; with neither
    given, ``local_steps`` is :data:`DEFAULT_STEPS`.
    """

    batch_size: AtLeastOne = 32
    local_steps: AtLeastOne | None = None
    local_epochs: Pos | None = None

    @model_validator(mode="before")
    @classmethod
    def _default_steps(cls, data: Any) -> Any:
        if (isinstance(data, dict) and data.get("local_epochs") is None
                and "local_steps" not in data):
            return {**data, "local_steps": DEFAULT_STEPS}
        return data

    @model_validator(mode="after")
    def _one_budget(self) -> LocalWorkKeys:
        if self.local_steps is not None and self.local_epochs is not None:
            raise ValueError(
                "set either local_steps or local_epochs, not both "
                f"(got local_steps={self.local_steps}, local_epochs={self.local_epochs})"
            )
        if self.local_steps is None and self.local_epochs is None:
            raise ValueError("set local_steps or local_epochs")
        return self


@dataclass(frozen=True, slots=True)
class LocalConfig:
    """How one local run trains: the ``[client]`` table's local work, its optimizer
    and the algorithm's proximal weight, in one frozen value built once per run
    (and per task with its own budget, :meth:`with_work`).

    ``steps``, ``epochs`` and ``batch_size`` are :class:`LocalWorkKeys`'
    ``local_steps``, ``local_epochs`` and ``batch_size``, with their defaults
    and checks (a ``ValueError`` naming the key): exactly one of ``steps`` and
    ``epochs`` may be set; with neither, ``steps`` is :data:`DEFAULT_STEPS`.
    """

    steps: int | None = None
    epochs: float | None = None
    batch_size: int = LocalWorkKeys.model_fields["batch_size"].default
    optimizer: OptimizerConfig = field(default_factory=SGDOptions)
    prox_mu: float = 0.0

    def __post_init__(self) -> None:
        given = {"local_steps": self.steps, "local_epochs": self.epochs,
                 "batch_size": self.batch_size}
        work = LocalWorkKeys.model_validate({k: v for k, v in given.items() if v is not None})
        object.__setattr__(self, "steps", work.local_steps)
        if not self.prox_mu >= 0:
            raise ValueError(f"Invalid prox_mu: {self.prox_mu} (must be >= 0)")

    def with_work(self, work: LocalWork | None) -> LocalConfig:
        """This config with a task's own budget in place of its own (unchanged for None
        or an empty budget). The budget was checked as the task's
        :class:`~fedsim.wire.messages.LocalWork` (one of steps >= 1 or epochs > 0),
        so it is not validated again: no pydantic per task."""
        if work is None or (work.steps is None and work.epochs is None):
            return self
        new = object.__new__(LocalConfig)
        for name in _LOCAL_FIELDS:
            object.__setattr__(new, name, getattr(self, name))
        object.__setattr__(new, "steps", work.steps)
        object.__setattr__(new, "epochs", work.epochs)
        return new

    def num_steps(self, num_samples: int) -> int:
        """Local steps this config takes on ``num_samples`` samples."""
        if self.steps is not None:
            return self.steps
        per_epoch = -(-num_samples // self.batch_size)
        return max(1, round(float(self.epochs or 0) * per_epoch))


#: every field of :class:`LocalConfig`, which :meth:`LocalConfig.with_work` copies
_LOCAL_FIELDS = tuple(f.name for f in fields(LocalConfig))


def load_vector(model: nn.Module, vec: torch.Tensor) -> None:
    """Copy a flat vector into the model's trainable parameters.

    The values are copied: the parameters never alias ``vec``, so training
    cannot change the caller's tensor.
    """
    _copy_into([p for p in model.parameters() if p.requires_grad], vec)


def _copy_into(params: Sequence[torch.Tensor], vec: torch.Tensor) -> None:
    total = sum(p.numel() for p in params)
    if vec.numel() != total:
        raise ValueError(f"Invalid vector length {vec.numel()}: the model has {total} parameters")
    offset = 0
    with torch.no_grad():
        for p in params:
            n = p.numel()
            p.copy_(vec[offset : offset + n].view_as(p))
            offset += n


def batches(n: int, batch_size: int, generator: torch.Generator) -> Iterator[torch.Tensor]:
    """Minibatches of indices into ``n`` samples, without end: each epoch a fresh
    permutation from ``generator``, cut into ``batch_size`` pieces (the last one
    shorter, no ``drop_last``)."""
    while True:
        perm = torch.randperm(n, generator=generator)
        for start in range(0, n, batch_size):
            yield perm[start : start + batch_size]


class _MinibatchObjective:
    """The local objective on the current minibatch, as an optimizer closure.

    A call zeroes the gradients, evaluates ``f_i(y; z)`` at the model's
    current parameters, back-propagates, adds ``mu (y - x_anchor)`` to the
    gradients and returns ``f_i(y; z) + (mu / 2) ||y - x_anchor||^2``.
    ``loss`` keeps the data loss ``f_i(y; z)`` of the latest call: the
    optimizers evaluate the current iterate last.
    """

    def __init__(
        self,
        model: nn.Module,
        loss_fn: Callable[..., torch.Tensor],
        opt: torch.optim.Optimizer | SGD,
        params: Sequence[torch.Tensor],
        anchor: list[torch.Tensor] | None,
        mu: float,
    ) -> None:
        self.model = model
        self.loss_fn = loss_fn
        self.opt = opt
        self.params = params
        self.anchor = anchor
        self.mu = mu
        self.inputs: torch.Tensor | None = None
        self.targets: torch.Tensor | None = None
        self.loss = 0.0

    def __call__(self) -> float:
        self.opt.zero_grad()
        loss = self.loss_fn(self.model(self.inputs), self.targets)
        loss.backward()  # type: ignore[no-untyped-call]
        self.loss = float(loss.detach())
        if self.anchor is None:
            return self.loss
        sq = torch.zeros((), dtype=torch.float64, device=self.params[0].device)
        with torch.no_grad():
            for p, a in zip(self.params, self.anchor, strict=True):
                diff = p - a
                p.grad.add_(diff, alpha=self.mu)  # type: ignore[union-attr,unused-ignore]
                sq += diff.to(torch.float64).square().sum()
        return self.loss + 0.5 * self.mu * float(sq)


def local_train(
    model: nn.Module,
    x0: torch.Tensor,
    data_x: torch.Tensor,
    data_y: torch.Tensor,
    cfg: LocalConfig,
    generator: torch.Generator,
    loss_fn: nn.Module | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Run one local training job from the flat model ``x0``.

    Returns the flat local model after the run and statistics: ``steps``,
    ``loss`` (mean training loss over the run, at the iterates stepped from),
    ``samples``; for optimizers that pick their own step size (``deltasgd``,
    ``sps``) also ``lr_last``, ``lr_mean``, ``lr_min`` and ``lr_max`` of the
    step sizes used.
    """
    from fedsim.algorithms.adaptive import (  # lazy: it imports torch; client hosts never do
        AdaptiveStepOptimizer,
        step_size_stats,
    )

    n = int(data_x.shape[0])
    if n == 0:
        raise ValueError("Invalid client data: no samples")
    params = [p for p in model.parameters() if p.requires_grad]
    _copy_into(params, x0)
    model.train()
    anchor = [p.detach().clone() for p in params] if cfg.prox_mu > 0 else None
    opt = make_optimizer(cfg.optimizer, params, buffers=list(model.buffers()))
    steps = cfg.num_steps(n)
    order = batches(n, cfg.batch_size, generator)
    loss = loss_fn or functional.cross_entropy   # nn.CrossEntropyLoss()'s computation
    if isinstance(opt, SGD):
        total, seen = _sgd_steps(model, loss, opt, params, anchor, cfg.prox_mu, data_x, data_y,
                                 order, steps)
    else:
        total, seen = _closure_steps(
            _MinibatchObjective(model, loss, opt, params, anchor, cfg.prox_mu),
            data_x, data_y, order, steps)
    stats: dict[str, Any] = {"steps": steps, "loss": total / seen, "samples": seen}
    if isinstance(opt, AdaptiveStepOptimizer):
        stats.update(step_size_stats(opt.step_sizes))
    return flatten(params), stats


def _closure_steps(objective: _MinibatchObjective, data_x: torch.Tensor, data_y: torch.Tensor,
                   order: Iterator[torch.Tensor], steps: int) -> tuple[float, int]:
    """Step an optimizer through the closure (Delta-SGD and SPS evaluate the objective
    themselves; Adam and Adagrad take it too): the summed data loss over the
    steps' minibatches and their size."""
    opt = objective.opt
    total = 0.0
    seen = 0
    for step in range(steps):
        idx = next(order)
        objective.inputs, objective.targets = data_x[idx], data_y[idx]
        opt.step(objective)
        total += objective.loss * len(idx)
        seen += len(idx)
        if _between_steps is not None and step + 1 < steps:
            _between_steps()
    return total, seen


def _sgd_steps(model: nn.Module, loss_fn: Callable[..., torch.Tensor], opt: SGD,
               params: Sequence[torch.Tensor], anchor: list[torch.Tensor] | None, mu: float,
               data_x: torch.Tensor, data_y: torch.Tensor, order: Iterator[torch.Tensor],
               steps: int) -> tuple[float, int]:
    """The same steps for fedsim's own SGD, without the closure.

    SGD needs only the gradient and the data loss, so a step here does what
    :class:`_MinibatchObjective` and ``SGD.step(closure)`` do minus what only
    the adaptive optimizers use: the closure's grad-mode switches, and the
    value of the proximal term (a float64 reduction over every parameter).
    The gradient, and so every iterate, is the same bit for bit
    (``tests/algorithms/test_local.py`` holds both paths to it); on the
    60-200-10 MLP a step costs 135 us here against 145 through the closure.
    """
    total = 0.0
    seen = 0
    with torch.enable_grad():
        for step in range(steps):
            idx = next(order)
            for p in params:
                p.grad = None
            loss = loss_fn(model(data_x.index_select(0, idx)), data_y.index_select(0, idx))
            loss.backward()  # type: ignore[no-untyped-call]
            if anchor is not None:
                with torch.no_grad():
                    for p, a in zip(params, anchor, strict=True):
                        p.grad.add_(p - a, alpha=mu)  # type: ignore[union-attr,unused-ignore]
            opt.step()
            total += loss.item() * len(idx)
            seen += len(idx)
            if _between_steps is not None and step + 1 < steps:
                _between_steps()
    return total, seen
