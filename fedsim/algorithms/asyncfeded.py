r"""AsyncFedED: Euclidean-distance staleness and adaptive local work.

Implementation of Wang, Yang, He, Shi and Chen, "AsyncFedED: Asynchronous
Federated Learning with Euclidean Distance based Adaptive Weight Aggregation"
(https://arxiv.org/abs/2205.13797). The choices fedsim made where the paper is
ambiguous or the authors' logs disagree with it (the ``R-AF`` ids below) are
in docs/algorithms.md#asyncfeded.

The client trains from the global model ``x_{t-tau}`` (version ``tau``) and
uploads its local model; the server forms the pseudo-gradient
``Delta = x_{t-tau,K} - x_{t-tau}`` in float64 from the base it kept
(docs/algorithms.md#pseudo-gradients-are-formed-on-the-server). The server,
holding ``x_t`` at version ``t``, applies (S4-S10)::

    gamma   = ||x_t - x_{t-tau}|| / ||Delta||           eq. (6), float64 norms
    eta_g   = lambda / (gamma + epsilon)                 eq. (7)
    x_{t+1} = x_t + eta_g * Delta                        eq. (5)
    K_i    <- K_i + kappa * (gamma_bar - gamma)          "accumulate" (default, R-AF2)
    K_i    <- K_i + floor(kappa * (gamma_bar - gamma))   eq. (8), "floor" (R-AF2)
    K_i    <- clamp(K_i, K_min = 1, K_max = inf)         (the clamps)

and the client's next task carries the *new* model ``x_{t+1}`` and its
version (R-AF3). A
fresh update (``gamma = 0``) gets ``eta_g = lambda / epsilon``; with
``lambda = epsilon`` it lands exactly on the client's local model.
``fixed_eta_g`` replaces eq. (7) by one constant for every update (the
ablation of the adaptive weight; gamma is still measured and still adapts K).

The server needs ``x_{t-tau}`` for every update, so it keeps snapshots of
past global models (the paper's GMIS). They are reference-counted
(docs/algorithms.md#asyncfeded-model-history):
:meth:`AsyncFedED.hold` a version when a task is dispatched from it,
:meth:`AsyncFedED.release` it when that task's result arrives or the task is
abandoned. Only held versions and the current one are kept, so with ``m``
clients the history holds at most ``m + 1`` models.

K counts passes over the client's local data by default
(docs/algorithms.md#r-af5); ``k_unit="steps"`` is the literal
one-minibatch-step reading.
The rule only returns the number: a client runs ``floor(K_i)`` units
(:meth:`AsyncFedED.local_units`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field, model_validator

from fedsim.algorithms._kernels import check_async_update, norm64, pack_tensor, unpack_tensor
from fedsim.algorithms.api import AlgorithmSpec, ServerContext
from fedsim.algorithms.flows import AsyncConfig, AsyncFlow, AsyncRule
from fedsim.algorithms.sgdclient import local_sgd_client
from fedsim.lazy import lazy_module
from fedsim.schema import FiniteNonNeg, FinitePos
from fedsim.wire.messages import LocalWork, Update

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch")

__all__ = [
    "K_ROUNDINGS",
    "K_UNITS",
    "SPEC",
    "AsyncFedED",
    "AsyncFedEDConfig",
    "asyncfeded_step",
    "clamp_k",
    "euclidean_staleness",
    "next_k_value",
]

KRounding = Literal["accumulate", "floor", "ceil", "round", "trunc"]
K_ROUNDINGS: tuple[str, ...] = ("accumulate", "floor", "ceil", "round", "trunc")
KUnit = Literal["epochs", "steps"]
K_UNITS: tuple[str, ...] = ("epochs", "steps")

_ROUNDERS: dict[str, Callable[[float], int]] = {
    "floor": math.floor,
    "ceil": math.ceil,
    "trunc": math.trunc,
    "round": lambda v: math.floor(v + 0.5),  # half up
}


# -- functional core --------------------------------------------------------------


def euclidean_staleness(x_t: torch.Tensor, x_base: torch.Tensor, delta: torch.Tensor) -> float:
    """Return ``gamma = ||x_t - x_base|| / ||delta||`` (eq. 6), in float64.

    Raises ValueError when ``||delta|| = 0``: gamma is then undefined
    (``inf``, or ``0/0`` for a fresh update;
    docs/algorithms.md#asyncfeded-zero-updates-are-discarded) and is never computed.
    """
    den = norm64(delta)
    if den == 0.0:
        raise ValueError("Invalid update: ||Delta|| = 0, Euclidean staleness undefined")
    return norm64(x_t.to(torch.float64) - x_base.to(torch.float64)) / den


def asyncfeded_step(x: torch.Tensor, delta: torch.Tensor, eta_g: float) -> torch.Tensor:
    """Return ``x + eta_g * delta`` (eq. 5), computed in float64, in ``x``'s dtype."""
    return x.to(torch.float64).add(delta.to(torch.float64), alpha=float(eta_g)).to(x.dtype)


def next_k_value(
    k_used: float, gamma: float, gamma_bar: float, kappa: float, rounding: str
) -> float:
    """Return the unclamped next ``K_i`` (eq. 8 and docs/algorithms.md#r-af2).

    ``accumulate`` adds ``kappa * (gamma_bar - gamma)`` as a real number;
    ``floor``/``ceil``/``trunc`` round that increment before adding it
    (``floor`` is the paper's E[.], R-AF2); ``round`` rounds half up. A
    non-finite increment (gamma overflowed) returns ``-inf``: clamp it.

    >>> [next_k_value(10, g, 3.0, 1.0, "floor") for g in (0.0, 0.5, 1.5, 2.5, 3.5)]
    [13, 12, 11, 10, 9]
    """
    if kappa == 0.0:
        return k_used
    step = kappa * (gamma_bar - gamma)
    if not math.isfinite(step):
        return -math.inf
    if rounding == "accumulate":
        return k_used + step
    if rounding not in _ROUNDERS:
        raise ValueError(f"Invalid k_rounding: {rounding!r} (allowed: {K_ROUNDINGS})")
    return k_used + _ROUNDERS[rounding](step)


def clamp_k(k: float, k_min: float, k_max: float | None) -> tuple[float, bool]:
    """Return ``(clamp(k, k_min, k_max), whether it was clamped)``."""
    if k < k_min:
        return float(k_min), True
    if k_max is not None and k > k_max:
        return float(k_max), True
    return float(k), False


# -- the rule -----------------------------------------------------------------------


class AsyncFedEDConfig(AsyncConfig):
    """``[algorithm]`` of AsyncFedED: Euclidean-distance staleness, adaptive K.

    ``concurrency`` defaults to every client (each trains as soon as it is
    free, as in the paper).

    Attributes
    ----------
    lam : float
        ``lambda``, the numerator of ``eta_g`` (> 0). Default 5 with
        ``epsilon = 5``: the Synthetic-1-1 row of Table 4 (R-AF7).
    epsilon : float
        Offset in ``eta_g = lam / (gamma + epsilon)`` (> 0); the largest
        ``eta_g`` is ``lam / epsilon``.
    gamma_bar : float
        Target staleness (>= 0).
    kappa : float
        K adaptation step (>= 0; 0 = constant K, the paper's ablation).
    k_initial : float
        K of a never-seen client (R-AF8); in ``[k_min, k_max]``.
    k_min, k_max : float, float or None
        Clamp of K (1 and no upper bound,
        docs/algorithms.md#asyncfeded-k-clamps). ``k_min >= 1`` so a client
        always runs at least one unit.
    k_rounding : {"accumulate", "floor", "ceil", "round", "trunc"}
        ``accumulate`` (default, R-AF2) keeps K real-valued; the others round
        the increment (``floor`` = the paper's eq. 8). Outside
        ``accumulate``, ``k_initial``, ``k_min`` and ``k_max`` must be whole.
    k_unit : {"epochs", "steps"}
        What one unit of K is: a pass over the client's data (default,
        R-AF5) or one minibatch step (literal Algorithm 2).
    reset_k_on_reconnect : bool
        Make :meth:`AsyncFedED.connect` reset a known client's K to
        ``k_initial`` (R-AF8; default keeps K per client id).
    gamma_max : float or None
        Discard updates with ``gamma > gamma_max`` (the theory's Assumption 4);
        ``None`` (default, as in the experiments) applies them all.
    zero_tol : float
        An update with ``||Delta|| == 0`` or ``||Delta|| < zero_tol * ||x_t||``
        is discarded.
    fixed_eta_g : float or None
        ``None`` (default): the adaptive weight ``eta_g = lam / (gamma +
        epsilon)`` of eq. (7). A number > 0: every applied update gets this
        ``eta_g`` whatever its staleness, which switches the adaptive weight
        off (an ablation; ``lam / (gamma_bar + epsilon)`` is the weight the
        rule gives at its target staleness). ``gamma`` is still computed, and
        K still adapts from it.
    """

    name: Literal["asyncfeded"] = "asyncfeded"
    lam: FinitePos = 5.0
    epsilon: FinitePos = 5.0
    gamma_bar: FiniteNonNeg = 3.0
    kappa: FiniteNonNeg = 1.0
    k_initial: FinitePos = 1.0
    k_min: Annotated[float, Field(ge=1, allow_inf_nan=False)] = 1.0
    k_max: FinitePos | None = None
    k_rounding: KRounding = "accumulate"
    k_unit: KUnit = "epochs"
    reset_k_on_reconnect: bool = False
    gamma_max: FinitePos | None = None
    zero_tol: FiniteNonNeg = 1e-12
    fixed_eta_g: FinitePos | None = None

    @model_validator(mode="after")
    def _k_bounds(self) -> AsyncFedEDConfig:
        k_min, k_max = self.k_min, self.k_max
        hi = math.inf if k_max is None else k_max
        if k_max is not None and k_max < k_min:
            raise ValueError(f"Invalid k_max: {k_max!r} (must be finite and >= k_min = {k_min})")
        if not k_min <= self.k_initial <= hi:
            raise ValueError(f"Invalid k_initial: {self.k_initial!r} "
                             f"(must lie in [k_min, k_max] = [{k_min}, {hi}])")
        for key, value in (("k_initial", self.k_initial), ("k_min", k_min), ("k_max", k_max)):
            if self.k_rounding != "accumulate" and value is not None \
                    and value != math.floor(value):
                raise ValueError(f"Invalid {key}: {value!r} "
                                 f"(must be whole with k_rounding={self.k_rounding!r})")
        return self

    def local_work(self) -> str:
        return (f"AsyncFedED's adaptive K, per client: from algorithm.k_initial = "
                f"{self.k_initial:g} {self.k_unit}, within [k_min, k_max]")


class AsyncFedED(AsyncRule):
    """AsyncFedED server rule with its model history and per-client K.

    Its parameters are ``cfg``'s (:class:`AsyncFedEDConfig`); its state is
    the model history, the holds on it and every client's K.
    """

    def __init__(self, cfg: AsyncFedEDConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.applied = 0
        self._history: dict[int, torch.Tensor] = {}
        self._holds: dict[int, int] = {}
        self._current: int | None = None
        self._k: dict[int, float] = {}

    takes = "delta"

    # -- per-client K ---------------------------------------------------------

    def budget(self, client: int) -> LocalWork:
        """The next task of ``client`` runs ``floor(K_i)`` epochs or steps."""
        k = self.local_units(client)
        return LocalWork(epochs=k) if self.cfg.k_unit == "epochs" else LocalWork(steps=k)

    def keep(self, version: int, x: torch.Tensor) -> None:
        """A task left from ``version``: hold its snapshot (the GMIS)."""
        self.hold(version)

    def base(self, version: int) -> torch.Tensor:
        """The snapshot of ``version``."""
        return self.model(version)

    def drop(self, version: int) -> None:
        """The task from ``version`` is answered or abandoned."""
        self.release(version)

    def next_k(self, client: int) -> float:
        """Return ``K_i`` to dispatch to ``client`` (``k_initial`` if never seen)."""
        return self._k.get(client, self.cfg.k_initial)

    def local_units(self, client: int) -> int:
        """Return ``floor(K_i)``: the whole number of ``k_unit`` to run (>= 1)."""
        return max(1, math.floor(self.next_k(client)))

    def connect(self, client: int) -> float:
        """Note that ``client`` (re)connected; return its K (R-AF8).

        With ``reset_k_on_reconnect`` a known client starts over at
        ``k_initial``; otherwise its K is kept.
        """
        if self.cfg.reset_k_on_reconnect:
            self._k.pop(client, None)
        return self.next_k(client)

    def rejoined(self, client: int) -> None:
        """The asynchronous flow's hook: a client came back from being away."""
        self.connect(client)

    # -- model history (GMIS) --------------------------------------------------

    def snapshot(self, version: int, x: torch.Tensor) -> None:
        """Record ``x`` as the global model at ``version``, which becomes current.

        Call once with the initial model; :meth:`aggregate` records every
        later version itself.
        """
        if self._current is not None and version < self._current:
            raise ValueError(
                f"Invalid version {version}: older than the current version {self._current}"
            )
        self._history[version] = x.detach().clone()
        self._current = version
        self._evict()

    def hold(self, version: int) -> None:
        """Keep ``version``'s snapshot: a task was dispatched from it."""
        self._require(version, "snapshot() the model before dispatching it")
        self._holds[version] = self._holds.get(version, 0) + 1

    def release(self, version: int) -> None:
        """Drop one hold on ``version`` (result arrived or task abandoned)."""
        count = self._holds.pop(version, 0)
        if count == 0:
            raise ValueError(f"Invalid release of version {version}: it is not held")
        if count > 1:
            self._holds[version] = count - 1
        self._evict()

    def refcount(self, version: int) -> int:
        """Return how many tasks hold ``version``."""
        return self._holds.get(version, 0)

    def versions(self) -> list[int]:
        """Return the versions whose snapshots are kept, oldest first."""
        return sorted(self._history)

    def history_size(self) -> int:
        """Return the number of kept snapshots (held versions plus the current one)."""
        return len(self._history)

    def model(self, version: int) -> torch.Tensor:
        """Return a copy of the snapshot of ``version``."""
        self._require(version, "it was never recorded or is no longer held")
        return self._history[version].clone()

    def _require(self, version: int, fix: str, what: str = "version") -> None:
        if version not in self._history:
            raise ValueError(
                f"Invalid {what} {version}: no snapshot is kept (kept: {self.versions()}); {fix}"
            )

    def _evict(self) -> None:
        for v in [v for v in self._history if v != self._current and v not in self._holds]:
            del self._history[v]

    # -- the update --------------------------------------------------------------

    def aggregate(
        self, x: torch.Tensor, version: int, result: Update
    ) -> tuple[torch.Tensor | None, dict[str, Any]]:
        """Apply one client's pseudo-gradient to ``x`` (version ``version``).

        ``result.params`` is ``Delta = x_local - x_base`` (see
        :func:`pseudo_gradient`) and ``result.base_version`` the version it
        was trained from: equal to ``version``, or a version kept by
        :meth:`hold`. Returns ``x_{t+1}`` (to send back, R-AF3; it is recorded
        as version ``version + 1``) or ``None`` when the update is discarded,
        plus an info dict: ``staleness`` (``version - base_version``),
        ``gamma``, ``eta_g``, ``k_used``, ``k_next``, ``k_clamped``, and
        ``discarded``/``reason`` on a discard. Holds are not touched:
        :meth:`release` the base version afterwards.

        A discarded zero update (``||Delta|| = 0``) leaves all state
        unchanged, K included; a ``gamma_max`` discard still adapts K.

        Raises
        ------
        NonFiniteUpdate
            If ``Delta`` holds NaN or infinite values (nothing changes).
        ValueError
            On a shape mismatch, a base version newer than ``version``, an
            unknown base version, or ``version`` older than the current one.
        """
        delta = result.params
        d = check_async_update(x, result, version)
        if self._current is not None and version < self._current:
            raise ValueError(
                f"Invalid version {version}: older than the current version {self._current}"
            )
        if d == 0:
            x_base = x
        else:
            self._require(
                result.base_version, "hold() a version when dispatching from it", "base version"
            )
            x_base = self._history[result.base_version]
        k_used = self.next_k(result.client)
        info: dict[str, Any] = {"staleness": d, "k_used": k_used}

        norm_delta = norm64(delta)
        if norm_delta == 0.0 or norm_delta < self.cfg.zero_tol * norm64(x):
            info.update(gamma=None, eta_g=0.0, k_next=k_used, k_clamped=False)
            return None, {**info, "discarded": True, "reason": "zero update"}

        gamma = euclidean_staleness(x, x_base, delta)
        cfg = self.cfg
        raw_k = next_k_value(k_used, gamma, cfg.gamma_bar, cfg.kappa, cfg.k_rounding)
        k_next, clamped = clamp_k(raw_k, cfg.k_min, cfg.k_max)
        info.update(gamma=gamma, k_next=k_next, k_clamped=clamped)
        if cfg.gamma_max is not None and gamma > cfg.gamma_max:
            self._k[result.client] = k_next
            info["eta_g"] = 0.0
            return None, {**info, "discarded": True, "reason": "gamma above gamma_max"}

        eta_g = cfg.lam / (gamma + cfg.epsilon) if cfg.fixed_eta_g is None else cfg.fixed_eta_g
        new = asyncfeded_step(x, delta, eta_g)
        self._history[version + 1] = new.detach().clone()
        self._current = version + 1
        self._evict()
        self._k[result.client] = k_next
        self.applied += 1
        info["eta_g"] = eta_g
        return new, info

    # -- checkpointing ------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Return the rule's mutable state as plain, comparable data."""
        return {
            "applied": self.applied,
            "current": self._current,
            "history": {v: pack_tensor(self._history[v]) for v in sorted(self._history)},
            "holds": dict(sorted(self._holds.items())),
            "k": dict(sorted(self._k.items())),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore state saved by :meth:`state_dict`."""
        history = {int(v): unpack_tensor(p) for v, p in state["history"].items()}
        holds = {int(v): int(n) for v, n in state["holds"].items()}
        current = None if state["current"] is None else int(state["current"])
        if current is not None and current not in history:
            raise ValueError(f"Invalid state: current version {current} has no snapshot")
        for v, n in holds.items():
            if n < 1 or v not in history:
                raise ValueError(f"Invalid state: hold {n} on version {v} without snapshot")
        ks = {int(c): float(k) for c, k in state["k"].items()}
        for c, k in ks.items():
            if not (math.isfinite(k) and k >= self.cfg.k_min):
                raise ValueError(f"Invalid K in state for client {c}: {k}")
        self.applied = int(state["applied"])
        self._history, self._holds, self._current, self._k = history, holds, current, ks


def _server(cfg: AsyncFedEDConfig, ctx: ServerContext) -> AsyncFlow:
    rule = AsyncFedED(cfg)
    rule.snapshot(0, ctx.x0)
    return AsyncFlow(rule, cfg, ctx)


SPEC = AlgorithmSpec(
    names=("asyncfeded",), config=AsyncFedEDConfig, server=_server, client=local_sgd_client,
    summary="gamma = ||x_t - x_tau|| / ||Delta||, eta_g = lambda / (gamma + eps), adaptive K")
