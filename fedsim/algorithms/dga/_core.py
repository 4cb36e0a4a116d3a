"""DGA's functional core and configuration (docs/algorithms.md#dga: R-DG1 to R-DG7)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field, StrictInt

from fedsim.algorithms._kernels import weighted_average
from fedsim.algorithms.optim import Beta
from fedsim.schema import FiniteNonNeg, FinitePos, SchemaModel

if TYPE_CHECKING:
    import torch

class DGAProtocolError(RuntimeError):
    """An event arrived that the client's or the reducer's state cannot handle."""


# ---------------------------------------------------------------- functional core


def dga_split_delay(delay: int, local_steps: int) -> tuple[int, int]:
    """Return ``(s, r)`` with ``D = s K + r`` and ``r in [1, K]`` (R-DG1).

    Python floor division on purpose: ``D = 0`` gives ``(-1, K)``, so the
    correction fires at step ``K`` of the *same* round (R-DG2, FedAvg mode).
    """
    s = (delay - 1) // local_steps
    return s, delay - s * local_steps


def dga_c_beta(beta: float, delay: int) -> float:
    """Momentum factor ``(1 - beta^D) / (1 - beta)`` of C13 (R-DG3).

    It is 1 for ``beta = 0`` and for ``D <= 1`` (the formula gives 0 at
    ``D = 0``, which would drop the averaging; FedAvg mode uses the plain rule, R-DG2).
    """
    if beta == 0.0 or delay <= 1:
        return 1.0
    return (1.0 - beta**delay) / (1.0 - beta)


def dga_direction(
    u: torch.Tensor | None, grad: torch.Tensor, beta: float
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """C8: return the new momentum buffer (None without momentum) and ``d``."""
    if u is None:
        return None, grad
    u = beta * u + grad
    return u, u


def dga_correction(
    own: torch.Tensor, mean: torch.Tensor, lr: float = 1.0, c_beta: float = 1.0
) -> torch.Tensor:
    """The term ``lr c_beta (own - mean)`` that C12/C13 *add* to ``w``.

    ``lr`` is the current eta with ``accumulate="raw"`` and 1 with
    ``"displacement"``, whose accumulators already hold ``sum eta_k d_k``
    (R-DG7). Summed over the clients of a round it is zero.
    """
    return (lr * c_beta) * (own - mean)


def dga_final_average(models: Sequence[torch.Tensor]) -> torch.Tensor:
    """C18: the plain mean of the clients' final models (float64 accumulation)."""
    return weighted_average(list(models), [1.0] * len(models))


# ---------------------------------------------------------------- configuration


def _check_int(name: str, value: Any, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"Invalid {name}: {value!r} (must be an integer >= {low})")


def _check_positive(name: str, value: Any, hint: str = "must be finite and > 0") -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not (ok and math.isfinite(value) and value > 0):
        raise ValueError(f"Invalid {name}: {value!r} ({hint})")
    return float(value)


class DGAKeys(SchemaModel):
    """DGA's hyperparameters, declared once: the ``[algorithm]`` table
    (:class:`~fedsim.algorithms.dga.DGAScenarioConfig`) and the core's
    :class:`DGAConfig` both take them from here (the scenario's defaults; the
    paper's experiments set K = 5, D = 20).

    Attributes
    ----------
    local_steps : int
        ``K``, local steps per round (>= 1).
    delay : int
        ``D``, local steps between sending a round and applying its average
        (>= 0). ``0`` is FedAvg mode in either mode: a barrier at the end of
        each round and the plain rule (R-DG2). In auto mode ``D`` only
        sets the default ``max_pending``.
    mode : {"paper", "auto"}
        ``paper``: correct at step ``r`` of round ``t0 + 1 + s``, waiting
        there if the average is late, holding it there if it is early.
        ``auto``: correct whenever the average arrives (docs/algorithms.md#dga-auto-mode).
    accumulate : {"raw", "displacement"}
        Send ``sum d`` and correct with the current eta (paper), or send
        ``sum eta d`` and correct with ``c_beta (M - Mbar)`` (R-DG7).
    correction : {"full", "none", "none_per_step", "overwrite"}
        ``full``: C12/C13. ``none``: Table 1's "without correction", read as
        delayed-average SGD (R-DG4 ASSUMPTION): local gradients are sent but
        never applied, and ``w`` jumps to ``wbar_{t0} = w_1 - eta sum mbar``
        at each correction (once per round). ``none_per_step``: the same
        reading step by step: the client's own direction is never applied;
        from the correction point of round ``t0`` on, each of the next ``K``
        local steps applies ``1/K`` of the round's average (``w -= eta
        mbar_t0 / K``), so every step moves along the all-client average of
        the round ``D`` steps back, with no once-per-round jump.
        ``overwrite``: local steps are applied, then discarded by the same
        jump (R-DG4's second variant).
    c_beta : "paper" or float
        ``"paper"``: :func:`dga_c_beta` at the configured ``D``, also in auto
        mode (a per-correction delay would differ between clients and break
        the cancellation); a float > 0 overrides it (R-DG3). Measured
        here: with momentum the printed factor over-corrects, because ``v``
        already carries the momentum; clients' deviations from the mean grow
        by about ``c_beta - 1`` per correction at any learning rate.
        ``c_beta = 1`` is the exact replacement of a round's displacement
        ``eta v`` by the average (the shipped DGA scenario uses it).
    max_pending : int or None
        Auto mode: block (``Wait``) while more than this many sent rounds
        await their average (R-DG5). Default ``4 (s + 1)``,
        ``s = (delay - 1) // local_steps``.
    """

    local_steps: Annotated[StrictInt, Field(ge=1)] = 10
    delay: Annotated[StrictInt, Field(ge=0)] = 5
    mode: Literal["paper", "auto"] = "paper"
    accumulate: Literal["raw", "displacement"] = "raw"
    correction: Literal["full", "none", "none_per_step", "overwrite"] = "full"
    c_beta: Literal["paper"] | FinitePos = "paper"
    max_pending: Annotated[StrictInt, Field(ge=1)] | None = None


class DGAConfig(DGAKeys):
    """One DGA client's hyperparameters: :class:`DGAKeys` and what the client's
    optimizer and the run decide.

    Attributes
    ----------
    lr : float
        Default learning rate ``eta`` (a step may pass its own, R-DG7).
    momentum : float
        ``beta`` in [0, 1); 0 is plain SGD. The buffer is never corrected.
    weight_decay : float
        L2 penalty added to each gradient, ``g + weight_decay * w``, before the
        momentum (as ``torch.optim.SGD``): the client optimizer's
        ``weight_decay``.
    rounds : int or None
        ``T``. After round ``T`` the client drains: it waits for and applies
        every outstanding average, then reports ``Done``.
    """

    lr: FinitePos = 0.1
    momentum: Beta = 0.0
    weight_decay: FiniteNonNeg = 0.0
    rounds: Annotated[StrictInt, Field(ge=1)] | None = None

    @property
    def pending_cap(self) -> int:
        """Auto mode's limit on rounds awaiting their average."""
        if self.max_pending is not None:
            return self.max_pending
        return max(1, 4 * (dga_split_delay(self.delay, self.local_steps)[0] + 1))
