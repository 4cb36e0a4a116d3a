r"""FedAsync: staleness-weighted asynchronous mixing.

Implementation of Xie, Koyejo and Gupta, "Asynchronous Federated
Optimization" (https://arxiv.org/abs/1903.03934); the choices fedsim made
(the ``R-FA`` ids) are in docs/algorithms.md#fedasync.

Server update for one arriving local model ``x_new`` trained from version
``tau`` while the server holds version ``t`` (updates already applied)::

    d       = t - tau                       (staleness; 0 for a fresh update, R-FA1)
    alpha_t = alpha * s(d)
    x      <- (1 - alpha_t) * x + alpha_t * x_new

with ``s`` one of

* const: ``s(d) = 1``
* poly:  ``s(d) = (d + 1) ** (-a)``
* hinge: ``s(d) = 1`` if ``d <= b`` else ``1 / (a * (d - b) + 1)``

(the paper's hinge; FedLab's misplaced parenthesis is *not* ported,
docs/algorithms.md#fedasync-hinge-the-papers-formula).
The client side is local SGD on ``f(x) + rho/2 ||x - x_tau||^2``: see
:func:`fedsim.algorithms.local.local_train` with ``prox_mu = rho``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Annotated, Any, Literal, get_args

from pydantic import Field

from fedsim.algorithms._kernels import check_async_update, lerp
from fedsim.algorithms.api import AlgorithmSpec, ServerContext
from fedsim.algorithms.flows import AsyncConfig, AsyncFlow, AsyncRule, Concurrency
from fedsim.algorithms.sgdclient import local_sgd_client
from fedsim.schema import FiniteNonNeg, FinitePos, NonNegInt, SchemaModel
from fedsim.wire.messages import Update

if TYPE_CHECKING:
    import torch

__all__ = [
    "SPEC",
    "STALENESS_FUNCTIONS",
    "FedAsync",
    "FedAsyncConfig",
    "StalenessKeys",
    "fedasync_mix",
    "staleness_weight",
]

StalenessFn = Literal["const", "poly", "hinge"]
STALENESS_FUNCTIONS: tuple[str, ...] = get_args(StalenessFn)


class StalenessKeys(SchemaModel):
    """How an asynchronous rule weighs an update by its staleness ``d``, declared once
    (FedAsync's and FedBuff's ``[algorithm]`` keys).

    Attributes
    ----------
    staleness : {"const", "poly", "hinge"}
        Staleness function ``s`` (:func:`staleness_weight`).
    a, b : float
        Parameters of ``poly`` (a) and ``hinge`` (a, b); finite, ``a > 0``, ``b >= 0``.
    max_staleness : int or None
        Discard updates with ``d > max_staleness`` (the theory's bounded
        delay; not in the papers' experiments). ``None`` keeps all.
    """

    staleness: StalenessFn = "const"
    a: FinitePos = 0.5
    b: FiniteNonNeg = 4.0
    max_staleness: NonNegInt | None = None


_STALENESS = StalenessKeys.model_fields


def staleness_weight(fn: str, d: float, a: float = _STALENESS["a"].default,
                     b: float = _STALENESS["b"].default) -> float:
    """Return ``s(d)`` for staleness ``d >= 0`` (``a``, ``b``: :class:`StalenessKeys`').

    >>> staleness_weight("poly", 3, a=0.5)
    0.5
    >>> round(staleness_weight("hinge", 5, a=10, b=4), 4)
    0.0909
    """
    if d < 0:
        raise ValueError(f"Invalid staleness: {d} (must be >= 0)")
    if fn == "const":
        return 1.0
    if fn == "poly":
        return float((d + 1.0) ** (-a))
    if fn == "hinge":
        return 1.0 if d <= b else 1.0 / (a * (d - b) + 1.0)
    raise ValueError(
        f"Invalid staleness function: {fn!r} (allowed: {', '.join(STALENESS_FUNCTIONS)})"
    )


def fedasync_mix(
    global_: torch.Tensor, local: torch.Tensor, alpha_t: float
) -> torch.Tensor:
    """Return ``(1 - alpha_t) * global_ + alpha_t * local`` (Algorithm 1, S9)."""
    if not 0.0 <= alpha_t <= 1.0:
        raise ValueError(f"Invalid alpha_t: {alpha_t} (must be in [0, 1])")
    return lerp(global_, local, alpha_t)


class FedAsyncConfig(StalenessKeys, AsyncConfig):
    """``[algorithm]`` of FedAsync: :class:`FedAsync`'s parameters and the client's ``rho``.

    ``staleness`` (default ``const``), ``a``, ``b`` and ``max_staleness`` are
    :class:`StalenessKeys`; ``concurrency`` defaults to 4 here.

    Attributes
    ----------
    alpha : float
        Mixing weight in (0, 1].
    rho : float
        The client's proximal weight (W5; local SGD on ``f(x) + rho/2 ||x - x_tau||^2``).
    staleness_offset : {0, 1}
        0 (default) makes a fresh update's staleness 0 (R-FA1); 1 is the
        literal Algorithm 1 (``t - tau`` counted after the increment).
    alpha_decay : float
        Multiply ``alpha`` by this after every applied update (R-FA3; 1.0 =
        constant alpha, the default).
    """

    name: Literal["fedasync"] = "fedasync"
    concurrency: Concurrency = 4
    alpha: Annotated[float, Field(gt=0, le=1)] = 0.6
    rho: FiniteNonNeg = 0.0
    staleness_offset: Literal[0, 1] = 0
    alpha_decay: Annotated[float, Field(gt=0, le=1)] = 1.0

    def prox_mu(self) -> float:
        return self.rho


class FedAsync(AsyncRule):
    """FedAsync server rule: mix each arriving model into the global one.

    Its parameters are ``cfg``'s (:class:`FedAsyncConfig`); ``alpha`` is
    the one that changes during a run (``alpha_decay``), so the rule holds
    its current value.
    """

    def __init__(self, cfg: FedAsyncConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.alpha = cfg.alpha
        self.applied = 0

    def weight(self, d: int) -> float:
        """Return ``alpha_t`` for staleness ``d`` at the current alpha."""
        cfg = self.cfg
        return self.alpha * staleness_weight(cfg.staleness, d + cfg.staleness_offset, cfg.a, cfg.b)

    def aggregate(
        self, x: torch.Tensor, version: int, result: Update
    ) -> tuple[torch.Tensor | None, dict[str, Any]]:
        """Apply one client result to the global model ``x`` at ``version``.

        Returns the new global vector, or ``None`` when the update is
        discarded (``max_staleness`` exceeded), plus an info dict with the
        realized ``staleness`` and ``alpha_t``.

        Raises
        ------
        NonFiniteUpdate
            If the update holds NaN or infinite values.
        """
        d = check_async_update(x, result, version)
        if self.cfg.max_staleness is not None and d > self.cfg.max_staleness:
            return None, {"staleness": d, "alpha_t": 0.0, "discarded": True}
        alpha_t = self.weight(d)
        new = fedasync_mix(x, result.params, alpha_t)
        self.applied += 1
        self.alpha *= self.cfg.alpha_decay
        return new, {"staleness": d, "alpha_t": alpha_t}

    def state_dict(self) -> dict[str, Any]:
        """Return the rule's mutable state."""
        return {"alpha": self.alpha, "applied": self.applied}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore state saved by :meth:`state_dict`."""
        alpha = float(state["alpha"])
        if not (0.0 < alpha <= 1.0 and math.isfinite(alpha)):
            raise ValueError(f"Invalid alpha in state: {alpha}")
        self.alpha = alpha
        self.applied = int(state["applied"])


def _server(cfg: FedAsyncConfig, ctx: ServerContext) -> AsyncFlow:
    return AsyncFlow(FedAsync(cfg), cfg, ctx)


SPEC = AlgorithmSpec(
    names=("fedasync",), config=FedAsyncConfig, server=_server, client=local_sgd_client,
    summary="staleness-weighted mixing (const, poly, hinge; rho)")
