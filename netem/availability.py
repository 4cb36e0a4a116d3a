"""Client availability: AsyncFedED suspension, Poisson on/off, availability traces.

What each model means in a run: docs/netem.md#availability. Sources: the AsyncFedED
authors' result logs for the suspension model (docs/algorithms.md#r-af6),
Mahimahi's ``mm-onoff`` ("a Poisson point process with specified average
durations spent on and off"), FedScale's availability traces (FLASH data:
``t mod finish_time``, active inside ``[active[i], inactive[i]]``).

Pure API, all times in emulated seconds:

* :class:`SuspensionModel` ``.draw_run(t_run, rng) -> Suspension | None``:
  per local run, independently with probability ``p``, the run is
  suspended. Default (as the authors' logs show it): the run's work
  is done and **wasted** (its update is discarded) and the client is
  unavailable for ``t_run + U(0, hang_factor * t_run)``, ``hang_factor =
  3``, ``t_run`` being the client's own normal run time; afterwards it
  fetches the newest model and starts again. Option ``hang="budget"``: the
  hang is ``U(0, budget_fraction * budget)`` (a reading of the paper's text
  before its logs were examined, e.g. 20 % of its 300 s budget). ``discard_update=False`` keeps
  the update (the client only hangs, nothing is wasted).
  Two uniforms are consumed per call whatever the outcome, so the draw for
  run ``k`` does not depend on earlier outcomes.
* :class:`OnOff` / :class:`OnOffProcess`: exponential on and off durations.
* :class:`AvailabilityTrace`: ``[start, end)`` active intervals, optionally
  periodic (FedScale-like, :meth:`AvailabilityTrace.from_fedscale`).

The last two answer ``is_available(t)`` and ``next_change(t) -> (t_next,
available_after)`` (``(inf, current)`` when nothing changes any more).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np

from netem import _check

__all__ = [
    "AlwaysAvailable",
    "Availability",
    "AvailabilityTrace",
    "OnOff",
    "OnOffProcess",
    "Suspension",
    "SuspensionModel",
]


@dataclass(frozen=True, slots=True)
class Suspension:
    """A suspended run: ``wasted`` run time plus ``hang`` (seconds)."""

    wasted: float
    hang: float
    discard_update: bool = True

    @property
    def unavailable_for(self) -> float:
        """How long the client is gone from the start of the run."""
        return self.wasted + self.hang


@dataclass(frozen=True, slots=True)
class SuspensionModel:
    """AsyncFedED suspension (docs/algorithms.md#r-af6)."""

    p: float
    hang_factor: float = 3.0
    hang: Literal["run", "budget"] = "run"
    budget: float | None = None
    budget_fraction: float = 0.2
    discard_update: bool = True

    def __post_init__(self) -> None:
        o = "SuspensionModel"
        _check.prob(o, "p", self.p)
        _check.nonneg(o, "hang_factor", self.hang_factor)
        _check.choice(o, "hang", self.hang, ("run", "budget"))
        _check.prob(o, "budget_fraction", self.budget_fraction)
        if self.hang == "budget":
            if self.budget is None:
                _check.fail(
                    o, "budget", None, "required (seconds > 0) when hang='budget'"
                )
            else:
                _check.positive(o, "budget", self.budget, " s")

    def draw_run(self, t_run: float, rng: np.random.Generator) -> Suspension | None:
        """Decide whether a run of normal duration ``t_run`` is suspended."""
        _check.nonneg("SuspensionModel.draw_run", "t_run", t_run, " s")
        u_susp, u_hang = rng.random(2).tolist()
        if u_susp >= self.p:
            return None
        if self.hang == "run":
            h_max = self.hang_factor * t_run
        else:
            h_max = self.budget_fraction * float(self.budget or 0.0)
        wasted = t_run if self.discard_update else 0.0
        return Suspension(
            wasted=wasted, hang=u_hang * h_max, discard_update=self.discard_update
        )


class Availability(Protocol):
    """What the emulator asks of an availability process."""

    def is_available(self, t: float) -> bool:
        """Whether the client is available at ``t``."""
        ...

    def next_change(self, t: float) -> tuple[float, bool]:
        """First time after ``t`` the state changes, and the state then."""
        ...


class AlwaysAvailable:
    """Never goes away."""

    __slots__ = ()

    def is_available(self, t: float) -> bool:
        return True

    def next_change(self, t: float) -> tuple[float, bool]:
        return math.inf, True


@dataclass(frozen=True, slots=True)
class OnOff:
    """Poisson on/off: exponential on and off durations with these means (s).

    ``start``: state at time 0; ``"stationary"`` draws it with
    P(on) = mean_on / (mean_on + mean_off).
    """

    mean_on: float
    mean_off: float
    start: Literal["on", "off", "stationary"] = "on"

    def __post_init__(self) -> None:
        _check.positive("OnOff", "mean_on", self.mean_on, " s")
        _check.positive("OnOff", "mean_off", self.mean_off, " s")
        _check.choice("OnOff", "start", self.start, ("on", "off", "stationary"))

    def process(self, rng: np.random.Generator) -> OnOffProcess:
        """A realisation driven by ``rng`` (its own stream)."""
        return OnOffProcess(self, rng)


class OnOffProcess:
    """Lazily drawn realisation of :class:`OnOff` from time 0."""

    __slots__ = ("_changes", "_on0", "_rng", "params")

    def __init__(self, params: OnOff, rng: np.random.Generator) -> None:
        self.params = params
        self._rng = rng
        if params.start == "stationary":
            p_on = params.mean_on / (params.mean_on + params.mean_off)
            self._on0 = bool(rng.random() < p_on)
        else:
            self._on0 = params.start == "on"
        self._changes: list[float] = []

    def _extend(self, t: float) -> None:
        ch = self._changes
        while not ch or ch[-1] <= t:
            on = self._on0 if len(ch) % 2 == 0 else not self._on0
            mean = self.params.mean_on if on else self.params.mean_off
            ch.append((ch[-1] if ch else 0.0) + float(self._rng.exponential(mean)))

    def _state(self, k: int) -> bool:
        return self._on0 if k % 2 == 0 else not self._on0

    def is_available(self, t: float) -> bool:
        if t < 0:
            return self._on0
        self._extend(t)
        return self._state(bisect.bisect_right(self._changes, t))

    def next_change(self, t: float) -> tuple[float, bool]:
        self._extend(max(t, 0.0))
        k = bisect.bisect_right(self._changes, max(t, 0.0))
        return self._changes[k], self._state(k + 1)


@dataclass(frozen=True, slots=True)
class AvailabilityTrace:
    """Active ``[start, end)`` intervals, optionally repeating every ``period``.

    Intervals are sorted and touching ones merged at construction. With a
    period, ``t`` is taken modulo it and every interval must lie in
    ``[0, period]``.
    """

    intervals: tuple[tuple[float, float], ...]
    period: float | None = None

    def __post_init__(self) -> None:
        o = "AvailabilityTrace"
        if self.period is not None:
            _check.positive(o, "period", self.period, " s")
        merged: list[tuple[float, float]] = []
        for i, (a, b) in enumerate(
            sorted((float(a), float(b)) for a, b in self.intervals)
        ):
            _check.finite(o, f"intervals[{i}].start", a)
            _check.finite(o, f"intervals[{i}].end", b)
            if b <= a:
                _check.fail(o, f"intervals[{i}]", (a, b), "end must be > start")
            if self.period is not None and (a < 0 or b > self.period):
                _check.fail(
                    o, f"intervals[{i}]", (a, b), f"must lie in [0, {self.period}]"
                )
            if merged and a <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], b))
            else:
                merged.append((a, b))
        object.__setattr__(self, "intervals", tuple(merged))

    @classmethod
    def from_fedscale(
        cls, record: Mapping[str, Any], unit: float = 1.0
    ) -> AvailabilityTrace:
        """From a FedScale ``client_behave_trace`` entry.

        ``{'active': [...], 'inactive': [...], 'finish_time': T}``: active
        inside ``[active[i], inactive[i])``, periodic with period ``T``;
        ``unit`` converts the trace's time unit to seconds.
        """
        act: Sequence[float] = record["active"]
        ina: Sequence[float] = record["inactive"]
        if len(act) != len(ina):
            _check.fail(
                "AvailabilityTrace.from_fedscale",
                "inactive",
                len(ina),
                f"needs as many entries as active ({len(act)})",
            )
        ivs = tuple(
            (a * unit, b * unit) for a, b in zip(act, ina, strict=True) if b > a
        )
        return cls(ivs, period=float(record["finish_time"]) * unit)

    def _local(self, t: float) -> tuple[float, float]:
        if self.period is None:
            return 0.0, t
        c = math.floor(t / self.period)
        return c * self.period, t - c * self.period

    def is_available(self, t: float) -> bool:
        _, x = self._local(t)
        starts = [a for a, _ in self.intervals]
        i = bisect.bisect_right(starts, x) - 1
        return i >= 0 and x < self.intervals[i][1]

    def _boundaries(self) -> list[float]:
        return sorted({v for iv in self.intervals for v in iv})

    def next_change(self, t: float) -> tuple[float, bool]:
        cur = self.is_available(t)
        bounds = self._boundaries()
        base, _ = self._local(t)
        cycles = 1 if self.period is None else 2
        for c in range(cycles + 1):
            off = base + c * (self.period or 0.0)
            for b in bounds:
                tb = off + b
                if tb > t and self.is_available(tb) != cur:
                    return tb, not cur
            if self.period is None:
                break
        return math.inf, cur
