"""Robust aggregation and an update guard: a valid key does not make an update honest.

Two defences against a client that sends a poisoned model (CURVE
authenticates who sent it, not what it says):

* :class:`UpdateGuard`, selectable in every algorithm's ``[algorithm.guard]``
  table: the distance ``||x_client - x_ref||`` between an update's model and
  the server's model is bounded from the first update on, by ``max_norm``,
  and tightened by ``norm_factor`` times the median distance of the last
  ``window`` accepted updates once ``window // 2`` of them are known (a
  bound that follows the run and needs no tuning, as in norm-bounding
  defences, Sun et al. 2019, "Can you really backdoor federated
  learning?"). A relative bound has nothing to be relative to at the
  start, so ``norm_factor`` needs ``max_norm``: the absolute bound holds
  the first updates, and every later one (the smaller bound applies). An
  update over the bound is rejected (``action = "reject"``) or scaled back
  onto it (``"clip"``); each is counted. Non-finite values and wrong shapes
  never get this far: the wire codec rejects them on receipt.
* :func:`aggregate_models`: the coordinate-wise median or trimmed mean of a
  synchronous round's client models (Yin et al. 2018, "Byzantine-robust
  distributed learning: towards optimal statistical rates"), selectable with
  ``aggregator`` for the algorithms whose round is a mean of client models
  (FedAvg, FedProx, the FedOpt family, whose configs take
  :class:`AggregatorKeys`). Both are unweighted, as in that paper: a robust
  statistic cannot let a client's claimed sample count buy it weight.

Pure: no I/O, no global state.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import Field, model_validator

from fedsim.lazy import lazy_module
from fedsim.schema import Pos, SchemaModel

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch")

__all__ = ["Aggregator", "AggregatorKeys", "GuardConfig", "GuardResult", "UpdateGuard",
           "aggregate_models"]

Aggregator = Literal["mean", "median", "trimmed_mean"]


class AggregatorKeys(SchemaModel):
    """``aggregator`` and ``trim`` of an ``[algorithm]`` table whose round is a mean of
    client models, declared once (FedAvg's, FedOpt's): the round's model is the
    (weighted) mean of the client models, or their robust coordinate-wise
    ``"median"`` or ``"trimmed_mean"`` (``trim``: the fraction cut from each end;
    :func:`aggregate_models`)."""

    aggregator: Aggregator = "mean"
    trim: Annotated[float, Field(ge=0, lt=0.5)] = 0.1


class GuardConfig(SchemaModel):
    """``[algorithm.guard]``: bound the distance of an update's model from the server's.

    ``max_norm``: an absolute bound, from the first update; ``norm_factor``:
    a bound of that many times the median distance of the last ``window``
    accepted updates, used once ``window // 2`` have been seen, and only
    with ``max_norm`` (which bounds the updates before that; with both, the
    smaller applies). ``action``: ``"reject"`` (discard the update, with the
    reason) or ``"clip"`` (scale its change back onto the bound and apply it).
    """

    max_norm: Pos | None = None
    norm_factor: Annotated[float, Field(gt=1)] | None = None
    window: Annotated[int, Field(ge=4)] = 50
    action: Literal["reject", "clip"] = "reject"

    @model_validator(mode="after")
    def _some_bound(self) -> GuardConfig:
        if self.max_norm is None and self.norm_factor is None:
            raise ValueError("set max_norm, norm_factor or both (or leave out [algorithm.guard])")
        if self.max_norm is None:
            raise ValueError(
                f"norm_factor = {self.norm_factor:g} needs max_norm: a bound relative to "
                f"the last accepted updates has none to go by until window // 2 = "
                f"{self.window // 2} are seen, and the first updates must be bounded too")
        return self


@dataclass(frozen=True, slots=True)
class GuardResult:
    """What :meth:`UpdateGuard.inspect` made of one update.

    ``params`` is the upload to use (None: rejected), ``action`` None (within
    the bound), ``"rejected"`` or ``"clipped"``; ``norm`` the update's
    distance and ``bound`` the bound it was held to; ``reason`` says why it
    was changed or rejected.
    """

    params: torch.Tensor | None
    action: Literal["rejected", "clipped"] | None
    norm: float
    bound: float
    reason: str | None


class UpdateGuard:
    """Checks each update's distance from the reference model (see the module docstring).

    ``check`` looks at the first ``reference.numel()`` values of the upload
    (the model; an algorithm whose upload carries more, like SCAFFOLD's
    control-variate change, keeps the rest as it is, scaled with the model
    part when clipped).
    """

    def __init__(self, cfg: GuardConfig) -> None:
        self.cfg = cfg
        self._norms: deque[float] = deque(maxlen=cfg.window)
        self.rejected = 0
        self.clipped = 0

    def bound(self) -> float:
        """The current bound: ``max_norm`` (inf without one, as a bare
        :class:`GuardConfig` built without validation may be), tightened by
        the relative bound once ``window // 2`` accepted distances are known."""
        b = math.inf if self.cfg.max_norm is None else self.cfg.max_norm
        if self.cfg.norm_factor is not None and len(self._norms) >= self.cfg.window // 2:
            b = min(b, self.cfg.norm_factor * statistics.median(self._norms))
        return b

    def inspect(self, params: torch.Tensor, reference: torch.Tensor) -> GuardResult:
        """Judge one upload against the bound; count it if rejected or clipped."""
        n = reference.numel()
        delta = params[:n].to(torch.float64) - reference.to(torch.float64)
        norm = float(torch.linalg.vector_norm(delta))
        bound = self.bound()
        if norm <= bound:
            self._norms.append(norm)
            return GuardResult(params, None, norm, bound, None)
        if self.cfg.action == "reject":
            self.rejected += 1
            return GuardResult(None, "rejected", norm, bound,
                               f"guard: update norm {norm:.4g} over the bound {bound:.4g}")
        self.clipped += 1
        scale = bound / norm
        out = params.clone()
        out[:n] = (reference.to(torch.float64) + delta * scale).to(params.dtype)
        if params.numel() > n:
            out[n:] = params[n:] * scale
        self._norms.append(bound)
        return GuardResult(out, "clipped", norm, bound,
                           f"guard: update norm {norm:.4g} clipped to {bound:.4g}")

    def check(self, params: torch.Tensor, reference: torch.Tensor
              ) -> tuple[torch.Tensor | None, str | None]:
        """``(params to use or None if rejected, why it was changed or rejected)``."""
        r = self.inspect(params, reference)
        return r.params, r.reason


def aggregate_models(models: list[torch.Tensor], how: Aggregator,
                     trim: float = AggregatorKeys.model_fields["trim"].default) -> torch.Tensor:
    """The coordinate-wise ``"median"``, ``"trimmed_mean"`` or ``"mean"`` of ``models``.

    ``trim`` is the fraction cut from each end per coordinate (``floor(trim
    * n)`` values) before averaging; with ``trim = 0`` the trimmed mean is
    the mean. The median of an even count is the mean of the two middle
    values. Computed in float64, returned in the models' dtype.
    """
    if not models:
        raise ValueError("no models to aggregate")
    if not 0 <= trim < 0.5:
        raise ValueError(f"trim must be in [0, 0.5), got {trim}")
    stack = torch.stack([m.to(torch.float64) for m in models])
    if how == "mean":
        out = stack.mean(0)
    elif how == "median":
        s = stack.sort(0).values
        k = s.shape[0]
        out = s[k // 2] if k % 2 else (s[k // 2 - 1] + s[k // 2]) / 2
    elif how == "trimmed_mean":
        k = stack.shape[0]
        cut = math.floor(trim * k)
        out = stack.sort(0).values[cut:k - cut].mean(0)
    else:
        raise ValueError(f"unknown aggregator {how!r} (mean, median, trimmed_mean)")
    return out.to(models[0].dtype)
