r"""FedOpt: a server optimizer stepping on the round's pseudo-gradient.

FedAdagrad, FedAdam and FedYogi follow Reddi, Charles, Zaheer, Garrett, Rush,
Konecny, Kumar and McMahan, "Adaptive Federated Optimization", ICLR 2021
(https://arxiv.org/abs/2003.00295), Algorithm 2 (server side). FedAvgM
follows Hsu, Qi and Brown, "Measuring the Effects of Non-Identical Data
Distribution for Federated Visual Classification"
(https://arxiv.org/abs/1909.06335): server momentum.

With ``x_t`` the global model and ``y_i`` the local models of the round's
clients ``S``::

    Delta_t = sum_{i in S} w_i (y_i - x_t),   w_i = 1/|S| ("uniform") or n_i / sum_j n_j ("samples")

    adam, yogi, adagrad (Reddi et al., Algorithm 2):
        m_t = beta1 m_{t-1} + (1 - beta1) Delta_t
        v_t = v_{t-1} + Delta_t^2                                          (adagrad)
        v_t = v_{t-1} - (1 - beta2) Delta_t^2 sign(v_{t-1} - Delta_t^2)    (yogi)
        v_t = beta2 v_{t-1} + (1 - beta2) Delta_t^2                        (adam)
        x_{t+1} = x_t + eta m_t / (sqrt(v_t) + tau)
        m_{-1} = 0,  v_{-1} = tau^2 (elementwise);  no bias correction

    avgm (Hsu et al.; the paper's v is called m here):
        m_t = beta m_{t-1} + Delta_t ,   m_{-1} = 0
        x_{t+1} = x_t + eta m_t

Squares, roots, divisions and ``sign`` are elementwise; ``sign(0) = 0``. With
``beta = 0`` and ``eta = 1`` FedAvgM is FedAvg with ``eta_g = 1``, and
:class:`FedOpt` then returns FedAvg's average bit for bit
(:meth:`FedOpt.is_fedavg`). Algorithm 2
applies the momentum ``beta1`` to all three adaptive rules, FedAdagrad
included; with ``beta1 = 0`` FedAdagrad is ``torch.optim.Adagrad(lr=eta,
initial_accumulator_value=tau**2, eps=tau)`` on ``g = -Delta``.

The server optimizer is a ``torch.optim.Optimizer`` over one
``torch.nn.Parameter`` holding ``x`` (float64, flattened), stepped on the
gradient ``g = -Delta_t``:

* FedAvgM is ``torch.optim.SGD(lr=eta, momentum=beta, dampening=0)``: its
  buffer is ``b_t = beta b_{t-1} + g_t`` (the first step sets ``b_0 = g_0``,
  which is ``beta * 0 + g_0``), so ``b_t = -m_t`` and ``p - eta b_t = x + eta m_t``.
* The adaptive rules are :class:`AdaptiveServerOptimizer` below, whose step
  is :func:`fedopt_moments` and :func:`fedopt_step`: ``torch.optim.Adam``
  bias-corrects and starts ``v`` at 0, ``torch.optim.Adagrad`` has no first
  moment, and torch has no Yogi.

``Delta`` is accumulated in float64 (order independent,
docs/algorithms.md#the-model-vector), and the optimizer state ``m``, ``v`` and
the stepped parameter are float64 as well: ``v`` starts at ``tau^2`` (1e-6 by
default) and moves by ``(1 - beta2) Delta^2``, increments float32 would round
away against a larger ``v``. The new model is cast back to ``x``'s dtype, the
only float32 rounding.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Literal

from fedsim.algorithms._kernels import (
    check_round,
    norm64,
    pack_tensor,
    pseudo_gradient,
    unpack_tensor,
    weighted_average,
)
from fedsim.algorithms.api import AlgorithmSpec, ServerContext
from fedsim.algorithms.flows import RoundRule, RoundsConfig, RoundsFlow
from fedsim.algorithms.optim import Beta
from fedsim.algorithms.robust import AggregatorKeys
from fedsim.algorithms.sgdclient import local_sgd_client
from fedsim.lazy import lazy_module
from fedsim.schema import FinitePos
from fedsim.wire.messages import Update

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch")

__all__ = [
    "FEDOPT_OPTIMIZERS",
    "SPEC",
    "AdaptiveServerOptimizer",
    "FedOpt",
    "FedOptConfig",
    "fedopt_delta",
    "fedopt_init",
    "fedopt_moments",
    "fedopt_step",
]

WEIGHTINGS = ("samples", "uniform")
ADAPTIVE = ("adam", "yogi", "adagrad")
DEFAULT_SERVER_LR = {"adam": 0.1, "yogi": 0.1, "adagrad": 0.1, "avgm": 1.0}


# --------------------------------------------------------------------------
# Functional core.


def fedopt_delta(
    x: torch.Tensor, results: Sequence[Update], weighting: str = "uniform"
) -> torch.Tensor:
    """Return the pseudo-gradient ``Delta = sum_i w_i (y_i - x)`` in float64."""
    weights = _weights(results, weighting)
    return weighted_average([pseudo_gradient(x, r.params) for r in results], weights)


def _weights(results: Sequence[Update], weighting: str) -> list[float]:
    """The unnormalized ``w_i``: ``n_i`` ("samples") or 1 ("uniform")."""
    if weighting not in WEIGHTINGS:
        raise ValueError(
            f"Invalid weighting: {weighting!r} (allowed: {', '.join(WEIGHTINGS)})"
        )
    if weighting == "samples":
        return [float(r.num_samples) for r in results]
    return [1.0] * len(results)


def fedopt_init(
    optimizer: str, like: torch.Tensor, tau: float
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Return ``(m_{-1}, v_{-1})``: zeros and ``tau^2`` (``None`` for avgm), shaped like ``like``.

    They take ``like``'s dtype (float64 in :class:`FedOpt`).
    """
    _check_optimizer(optimizer)
    m = torch.zeros_like(like)
    if optimizer == "avgm":
        return m, None
    return m, torch.full_like(like, float(tau) ** 2)


def fedopt_moments(
    optimizer: str,
    delta: torch.Tensor,
    m: torch.Tensor,
    v: torch.Tensor | None,
    *,
    beta1: float = 0.9,
    beta2: float = 0.99,
    momentum: float = 0.9,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Return ``(m_t, v_t)`` from ``(m_{t-1}, v_{t-1})`` and ``Delta_t`` (new tensors).

    ``adam``, ``yogi`` and ``adagrad`` use ``beta1`` (and ``beta2``, not read
    by adagrad); ``avgm`` uses ``momentum`` and has no ``v``.
    """
    _check_optimizer(optimizer)
    if optimizer == "avgm":
        return m.mul(momentum).add(delta), None
    if v is None:
        raise ValueError(f"Invalid v: None (optimizer {optimizer!r} needs a second moment)")
    m_new = m.mul(beta1).add(delta, alpha=1.0 - beta1)
    d2 = delta * delta
    if optimizer == "adagrad":
        v_new = v + d2
    elif optimizer == "yogi":
        v_new = v - (1.0 - beta2) * d2 * torch.sign(v - d2)
    else:
        v_new = v.mul(beta2).add(d2, alpha=1.0 - beta2)
    return m_new, v_new


def fedopt_step(
    optimizer: str,
    x: torch.Tensor,
    m: torch.Tensor,
    v: torch.Tensor | None,
    server_lr: float,
    tau: float,
) -> torch.Tensor:
    """Return ``x + eta m / (sqrt(v) + tau)`` (``x + eta m`` for avgm), a new tensor."""
    _check_optimizer(optimizer)
    if optimizer == "avgm":
        return x.add(m, alpha=server_lr)
    if v is None:
        raise ValueError(f"Invalid v: None (optimizer {optimizer!r} needs a second moment)")
    return x.addcdiv(m, v.sqrt().add(tau), value=server_lr)


def _check_optimizer(optimizer: str) -> None:
    if optimizer not in FEDOPT_OPTIMIZERS:
        raise ValueError(
            f"Invalid optimizer: {optimizer!r} (allowed: {', '.join(FEDOPT_OPTIMIZERS)})"
        )


# --------------------------------------------------------------------------
# torch.optim shell.


@functools.cache
def _import_torch_optim() -> None:
    """Build and drop one torch optimizer, so that what its first construction
    imports is imported now.

    The first ``torch.optim.Optimizer`` a process builds imports
    ``torch._dynamo``: 0.8 s of a core here. A rule is built while the
    server sets up, before the emulated clock starts; its optimizer only at
    the first aggregation, with the clock running: a FedAdam server's loop
    then stood still for 0.2-0.8 real seconds, and every task it sent in
    that time arrived late (a run's fidelity verdict failed on it, alone on
    the machine, at dilation 4).
    """
    torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.0)


@functools.cache
def _server_optimizer_class() -> type[torch.optim.Optimizer]:
    """:class:`AdaptiveServerOptimizer`, defined on first use.

    Its base class is torch's, so defining it at import time would import
    torch in every process that parses a scenario, client hosts included
    (docs/architecture.md#processes). ``fedopt.AdaptiveServerOptimizer``
    reaches it through the module's ``__getattr__``; it is one class for the
    life of the process.
    """

    class AdaptiveServerOptimizer(torch.optim.Optimizer):
        """Reddi et al.'s Algorithm 2 as a ``torch.optim.Optimizer``.

        Steps each parameter ``p`` on ``Delta = -p.grad`` with
        :func:`fedopt_moments` and :func:`fedopt_step`. The state of ``p`` is
        ``{"m": m, "v": v}`` in ``Delta``'s sign (the paper's ``m_t``), created
        at the first step as :func:`fedopt_init` (in ``p``'s dtype).

        Parameters
        ----------
        params : iterable of torch.nn.Parameter
        lr : float
            ``eta``.
        rule : {"adam", "yogi", "adagrad"}
        beta1, beta2 : float
            Decay rates in [0, 1) (adagrad ignores ``beta2``).
        tau : float
            Adaptivity ``tau`` > 0.
        """

        def __init__(
            self,
            params: Iterable[torch.nn.Parameter],
            lr: float,
            rule: Literal["adam", "yogi", "adagrad"],
            beta1: float,
            beta2: float,
            tau: float,
        ) -> None:
            if rule not in ADAPTIVE:
                raise ValueError(f"Invalid rule: {rule!r} (allowed: {', '.join(ADAPTIVE)})")
            defaults = {"lr": lr, "rule": rule, "beta1": beta1, "beta2": beta2, "tau": tau}
            super().__init__(params, defaults)

        @torch.no_grad()
        def step(self, closure: Callable[[], Any] | None = None) -> Any:
            """Take one server step on every parameter with a gradient."""
            loss = None
            if closure is not None:
                with torch.enable_grad():
                    loss = closure()
            for group in self.param_groups:
                rule = group["rule"]
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    state = self.state[p]
                    if not state:
                        state["m"], state["v"] = fedopt_init(rule, p.detach(), group["tau"])
                    m, v = fedopt_moments(
                        rule, -p.grad, state["m"], state["v"],
                        beta1=group["beta1"], beta2=group["beta2"],
                    )
                    p.copy_(fedopt_step(rule, p, m, v, group["lr"], group["tau"]))
                    state["m"], state["v"] = m, v
            return loss

    AdaptiveServerOptimizer.__qualname__ = "AdaptiveServerOptimizer"
    return AdaptiveServerOptimizer


if TYPE_CHECKING:
    AdaptiveServerOptimizer: type[torch.optim.Optimizer]
else:

    def __getattr__(name: str) -> Any:
        """``AdaptiveServerOptimizer``, created on first access (PEP 562)."""
        if name == "AdaptiveServerOptimizer":
            return _server_optimizer_class()
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# --------------------------------------------------------------------------
# The algorithm's home: ``algorithm.name`` picks the server optimizer.

_BY_NAME: dict[str, Literal["adam", "yogi", "adagrad", "avgm"]] = {
    "fedadam": "adam", "fedyogi": "yogi", "fedadagrad": "adagrad", "fedavgm": "avgm"}


class FedOptConfig(AggregatorKeys, RoundsConfig):
    """``[algorithm]`` of FedAdam, FedYogi, FedAdagrad and FedAvgM.

    ``name`` picks the server optimizer (it has no default: there is no
    FedOpt without one).

    Attributes
    ----------
    server_lr : float or None
        ``eta`` (> 0, finite). ``None`` picks 0.1 for the adaptive rules
        (Flower's FedAdam/FedYogi/FedAdagrad default, inside Reddi et al.'s
        grid) and 1.0 for FedAvgM (Hsu et al.'s; with ``momentum = 0`` it is
        then FedAvg).
    beta1 : float
        First-moment decay in [0, 1); 0.9 as in Reddi et al.'s experiments.
    beta2 : float
        Second-moment decay in [0, 1) (adam, yogi); 0.99 as in Reddi et al.'s
        experiments and Flower.
    tau : float
        Adaptivity ``tau`` > 0 (finite), which also sets ``v_{-1} = tau^2`` (a
        larger ``tau`` is less adaptive). Default 1e-3, the middle of Reddi et
        al.'s grid 1e-1 ... 1e-5, not Flower's 1e-9. A coordinate's first step is
        ``eta (1 - beta1) Delta / (sqrt(beta2 tau^2 + (1 - beta2) Delta^2) + tau)``:
        about ``eta sign(Delta)`` (defaults) where ``|Delta| >> tau / sqrt(1 - beta2)``,
        about ``eta (1 - beta1) Delta / (2 tau)`` where ``|Delta| << tau``. With
        1e-9 nearly every coordinate, however small its ``Delta``, moves by
        ``eta``; 1e-3 damps the ones that barely moved.
    momentum : float
        FedAvgM's server momentum ``beta`` in [0, 1) (default 0.9).
    weighting : {"uniform", "samples"}
        ``uniform`` (default) is Reddi et al.'s plain mean; ``samples``
        weights by ``n_i``.
    aggregator, trim
        The pseudo-gradient from the mean of the client models, or from a
        robust centre of them (:class:`~fedsim.algorithms.robust.AggregatorKeys`).
    """

    name: Literal["fedadam", "fedyogi", "fedadagrad", "fedavgm"]
    server_lr: FinitePos | None = None  # type: ignore[assignment]
    beta1: Beta = 0.9
    beta2: Beta = 0.99
    tau: FinitePos = 1e-3
    momentum: Beta = 0.9


# --------------------------------------------------------------------------
# Server rule.


class FedOpt(RoundRule):
    """FedOpt server rule over one round's results (FedAdam, FedYogi, FedAdagrad, FedAvgM).

    Its parameters are ``cfg``'s (:class:`FedOptConfig`): the optimizer its
    ``name`` stands for, and ``server_lr`` resolved from it when unset. The
    optimizer state (float64, see the module docstring) is created at the
    first round, shaped like that round's ``x``; every later ``x`` must have
    as many elements.
    """

    def __init__(self, cfg: FedOptConfig) -> None:
        self.cfg = cfg
        self.optimizer = _BY_NAME[cfg.name]
        self.server_lr = (DEFAULT_SERVER_LR[self.optimizer] if cfg.server_lr is None
                          else cfg.server_lr)
        self.rounds = 0
        self._param: torch.nn.Parameter | None = None
        self._opt: torch.optim.Optimizer | None = None
        if not self.is_fedavg():
            _import_torch_optim()

    def _build(
        self, numel: int, device: torch.device | None = None
    ) -> tuple[torch.nn.Parameter, torch.optim.Optimizer]:
        """Create (and keep) the parameter holding ``x`` and the torch optimizer over it."""
        param = torch.nn.Parameter(torch.zeros(numel, dtype=torch.float64, device=device))
        opt: torch.optim.Optimizer
        if self.optimizer == "avgm":
            opt = torch.optim.SGD(
                [param], lr=self.server_lr, momentum=self.cfg.momentum,
                dampening=0.0, nesterov=False, foreach=False,
            )
        else:
            adaptive: Callable[..., torch.optim.Optimizer] = _server_optimizer_class()
            opt = adaptive(
                [param], lr=self.server_lr, rule=self.optimizer,
                beta1=self.cfg.beta1, beta2=self.cfg.beta2, tau=self.cfg.tau,
            )
        self._param, self._opt = param, opt
        return param, opt

    def _check_size(self, x: torch.Tensor) -> None:
        if self._param is not None and x.numel() != self._param.numel():
            raise ValueError(
                f"Invalid model: {x.numel()} elements, the optimizer state has "
                f"{self._param.numel()}"
            )

    def is_fedavg(self) -> bool:
        """True for FedAvgM with ``momentum = 0`` and ``server_lr = 1``: plain FedAvg.

        Such a rule keeps no optimizer state and returns FedAvg's average
        (:func:`fedsim.algorithms.fedavg.fedavg_aggregate` with ``eta_g = 1``)
        bit for bit.
        """
        return self.optimizer == "avgm" and self.cfg.momentum == 0 and self.server_lr == 1.0

    def moments(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Return copies of the paper's ``(m_t, v_t)`` (flat float64; None before round 0).

        For avgm, ``m`` is Hsu et al.'s momentum ``v_t`` (None with
        ``momentum = 0``) and ``v`` is None.
        """
        if self._opt is None or self._param is None:
            return None, None
        state = self._opt.state.get(self._param, {})
        if self.optimizer == "avgm":
            buf = state.get("momentum_buffer")
            return (None if buf is None else buf.neg()), None
        m, v = state.get("m"), state.get("v")
        return (None if m is None else m.clone()), (None if v is None else v.clone())

    def aggregate(
        self, x: torch.Tensor, results: Sequence[Update]
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """Aggregate one round; invalid or non-finite results raise before anything changes.

        Returns the new model (a new tensor with ``x``'s dtype and shape) and
        ``{"clients", "delta_norm", "step_norm"}``: the norms of ``Delta_t``
        and of the float64 step ``x_{t+1} - x_t`` before the cast.
        """
        clients = check_round(x, results)
        self._check_size(x)
        x64 = x.detach().reshape(-1).to(torch.float64)
        delta = fedopt_delta(x.detach(), results, self.cfg.weighting).reshape(-1)
        if self.is_fedavg():
            # x + Delta in float64 equals the average up to float64 rounding,
            # which can tip a float32 rounding tie the other way: take
            # FedAvg's own average (weighted_average of the y_i) instead.
            avg = weighted_average(
                [r.params.detach().reshape(-1).to(torch.float64) for r in results],
                _weights(results, self.cfg.weighting),
            )
            self.rounds += 1
            return avg.to(x.dtype).reshape(x.shape), {
                "clients": clients,
                "delta_norm": norm64(delta),
                "step_norm": norm64(avg - x64),
            }
        if self._param is None or self._opt is None:
            param, opt = self._build(x64.numel(), x64.device)
        else:
            param, opt = self._param, self._opt
        with torch.no_grad():
            param.copy_(x64)
        param.grad = delta.neg()
        opt.step()
        param.grad = None
        stepped = param.detach().clone()
        self.rounds += 1
        new = stepped.to(x.dtype).reshape(x.shape)
        return new, {
            "clients": clients,
            "delta_norm": norm64(delta),
            "step_norm": norm64(stepped - x64),
        }

    def state_dict(self) -> dict[str, Any]:
        """Return the rule's mutable state: the round count and ``m``, ``v`` (exact bits)."""
        m, v = self.moments()
        return {
            "optimizer": self.optimizer,
            "rounds": self.rounds,
            "m": None if m is None else pack_tensor(m),
            "v": None if v is None else pack_tensor(v),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore state saved by :meth:`state_dict` (same ``optimizer``)."""
        if state["optimizer"] != self.optimizer:
            raise ValueError(
                f"Invalid optimizer in state: {state['optimizer']!r} (this rule is "
                f"{self.optimizer!r})"
            )
        m = None if state["m"] is None else unpack_tensor(state["m"])
        v = None if state["v"] is None else unpack_tensor(state["v"])
        if self.optimizer == "avgm":
            ok = v is None and (m is None or self.cfg.momentum > 0)
        else:
            ok = (m is None) == (v is None)
        if not ok:
            raise ValueError(
                f"Invalid moments in state: m {'absent' if m is None else 'present'}, "
                f"v {'absent' if v is None else 'present'} for optimizer {self.optimizer!r}"
            )
        for name, t in (("m", m), ("v", v)):
            if t is None:
                continue
            if t.dtype != torch.float64 or t.dim() != 1:
                raise ValueError(
                    f"Invalid {name} in state: {t.dtype} of shape {tuple(t.shape)} "
                    "(need a flat float64 vector)"
                )
            if not bool(torch.isfinite(t).all()):
                raise ValueError(f"Invalid {name} in state: non-finite values")
        if m is not None and v is not None and m.shape != v.shape:
            raise ValueError(
                f"Invalid moments in state: m has shape {tuple(m.shape)}, v {tuple(v.shape)}"
            )
        if v is not None and not bool((v > 0).all()):
            raise ValueError("Invalid v in state: values <= 0")
        self.rounds = int(state["rounds"])
        self._param = self._opt = None
        if m is None:
            return
        param, opt = self._build(m.numel())
        if self.optimizer == "avgm":
            opt.state[param]["momentum_buffer"] = m.neg()
        else:
            opt.state[param].update({"m": m, "v": v})


FEDOPT_OPTIMIZERS: tuple[str, ...] = ("adam", "yogi", "adagrad", "avgm")


def _server(cfg: FedOptConfig, ctx: ServerContext) -> RoundsFlow:
    return RoundsFlow(FedOpt(cfg), cfg, ctx)


SPEC = AlgorithmSpec(
    names=tuple(_BY_NAME), config=FedOptConfig, server=_server, client=local_sgd_client,
    summary="FedAvg rounds with a server optimizer on the pseudo-gradient: FedAdam, FedYogi, "
            "FedAdagrad (Reddi et al. 2021, no bias correction, v starts at tau^2), FedAvgM")
