"""Device compute time per local run, and heterogeneity across clients.

What the scenario's ``[devices]`` does with these: docs/netem.md#devices. Precedents:
FedScale's compute model (a per-sample latency times ``3 x batch x steps``, or
``device_speed ~ lognormal``); a device's compute time comes from its
profile (per-step time, or a speed factor against a calibrated host step).

A device answers ``compute_time(steps, rng, run_index=0)`` in emulated
seconds, and ``least_time(steps)``: the least any run of ``steps`` steps
can take on it (the floor of its distribution; a receiver bounds what a
sender may claim by it). ``steps`` is whatever unit the caller counts (minibatch steps, or
samples when a local epoch costs time proportional to the client's data, as
the AsyncFedED authors' logs show, docs/algorithms.md#r-af5). Models:

* :class:`StepTime` -- per-step time from a distribution of :mod:`netem.dist`.
  ``per="run"`` (default): one draw per run times ``steps`` (run-to-run
  variation, e.g. background load); ``per="step"``: the sum of ``steps``
  independent draws (variation averages out over long runs).
* :class:`RunTrace` -- measured run times, cycled by ``run_index``, scaled
  by ``steps / steps_per_run``.
* :class:`SpeedFactor` -- ``factor x host_step_time`` per step, where the
  host step time is calibrated by the caller (factor 2 = twice as slow).

:func:`draw_devices` draws per-client parameters from a distribution and
returns the devices plus a JSON-able record of the draw, so that a run's
heterogeneity is written down (``heterogeneity.json``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from netem import _check
from netem.dist import Constant, Dist, LogNormal
from netem.empirical import Empirical

__all__ = [
    "Device",
    "RunTrace",
    "SpeedFactor",
    "StepTime",
    "dist_record",
    "draw_devices",
]


@dataclass(frozen=True, slots=True)
class StepTime:
    """Per-step compute time drawn from ``dist`` (seconds per step)."""

    dist: Dist
    per: Literal["run", "step"] = "run"

    def __post_init__(self) -> None:
        _check.choice("StepTime", "per", self.per, ("run", "step"))

    def compute_time(
        self, steps: int, rng: np.random.Generator, run_index: int = 0
    ) -> float:
        """Emulated seconds for ``steps`` steps."""
        _check.integer("StepTime.compute_time", "steps", steps, 0)
        if steps == 0:
            return 0.0
        if self.per == "run":
            return float(self.dist.sample(rng, 1)[0]) * steps
        return float(np.sum(self.dist.sample(rng, steps)))

    def least_time(self, steps: int) -> float:
        """The least ``compute_time(steps)`` can be: ``steps`` x the distribution's
        floor (``ppf(0)``, the least its sampler draws: a constant's value; a
        log-normal's, far below its mean, where the normal quantile is
        clipped at ``|z| <= 8.2``)."""
        floor = float(self.dist.ppf(0.0))
        return steps * floor if math.isfinite(floor) and floor > 0.0 else 0.0

    def mean_step(self) -> float:
        """Expected seconds per step."""
        return self.dist.moments()[0]


@dataclass(frozen=True, slots=True)
class RunTrace:
    """Measured run times (seconds) for ``steps_per_run`` steps, cycled."""

    run_times: tuple[float, ...]
    steps_per_run: int

    def __post_init__(self) -> None:
        if not self.run_times:
            _check.fail(
                "RunTrace", "run_times", self.run_times, "needs at least one run"
            )
        for i, v in enumerate(self.run_times):
            _check.nonneg("RunTrace", f"run_times[{i}]", v, " s")
        _check.integer("RunTrace", "steps_per_run", self.steps_per_run, 1)
        object.__setattr__(self, "run_times", tuple(float(v) for v in self.run_times))

    def compute_time(
        self, steps: int, rng: np.random.Generator, run_index: int = 0
    ) -> float:
        """Run ``run_index`` (mod the trace length) scaled to ``steps``."""
        _check.integer("RunTrace.compute_time", "steps", steps, 0)
        t = self.run_times[run_index % len(self.run_times)]
        return t * steps / self.steps_per_run

    def least_time(self, steps: int) -> float:
        """The shortest run of the trace, scaled to ``steps``."""
        return min(self.run_times) * steps / self.steps_per_run

    def mean_step(self) -> float:
        """Expected seconds per step."""
        return float(np.mean(self.run_times)) / self.steps_per_run


@dataclass(frozen=True, slots=True)
class SpeedFactor:
    """``factor x host_step_time`` seconds per step (``factor`` > 1 is slower)."""

    factor: float
    host_step_time: float

    def __post_init__(self) -> None:
        _check.positive("SpeedFactor", "factor", self.factor)
        _check.positive("SpeedFactor", "host_step_time", self.host_step_time, " s")

    def compute_time(
        self, steps: int, rng: np.random.Generator, run_index: int = 0
    ) -> float:
        """Deterministic: ``steps x factor x host_step_time``."""
        _check.integer("SpeedFactor.compute_time", "steps", steps, 0)
        return steps * self.factor * self.host_step_time

    def least_time(self, steps: int) -> float:
        """Deterministic: the same as :meth:`compute_time`."""
        return steps * self.factor * self.host_step_time

    def mean_step(self) -> float:
        """Seconds per step."""
        return self.factor * self.host_step_time


Device = StepTime | RunTrace | SpeedFactor


def dist_record(d: Dist) -> dict[str, Any]:
    """JSON-able description of a distribution (Empirical: size and moments)."""
    rec: dict[str, Any] = {"family": type(d).__name__}
    if isinstance(d, Empirical):
        m, s = d.moments()
        rec.update(n=len(d.values), mean=m, std=s)
    elif dataclasses.is_dataclass(d):
        for f in dataclasses.fields(d):
            if not f.name.startswith("_"):
                rec[f.name] = getattr(d, f.name)
    return rec


def draw_devices(
    n_clients: int,
    rng: np.random.Generator,
    *,
    step_time: Dist | None = None,
    speed_factor: Dist | None = None,
    host_step_time: float | None = None,
    within_cv: float = 0.0,
    per: Literal["run", "step"] = "run",
) -> tuple[list[Device], dict[str, Any]]:
    """Draw heterogeneous devices, one per client, and record the draw.

    Exactly one of ``step_time`` (per-client mean step time, seconds) or
    ``speed_factor`` (per-client factor; needs ``host_step_time``) is given.
    Example: ``step_time=LogNormal(0.05, 0.05)`` gives step times spread
    over an order of magnitude; FedScale's alternative is a log-normal
    speed factor (``get_completion_time_lognormal``).

    Parameters
    ----------
    within_cv
        Run-to-run coefficient of variation inside each client: 0 gives a
        constant step time per client, > 0 a ``LogNormal`` around it.
    per
        With ``within_cv > 0``: ``"run"`` draws the step time once per run
        (a whole run is slow or fast), ``"step"`` once per step (the
        variation averages out over long runs); see :class:`StepTime`.

    Returns
    -------
    devices, record
        ``record = {"kind", "distribution", "within_cv", "per", "host_step_time",
        "clients": [{"client": i, "step_time": s}, ...]}`` (JSON-able).
    """
    _check.integer("draw_devices", "n_clients", n_clients, 0)
    _check.nonneg("draw_devices", "within_cv", within_cv)
    _check.choice("draw_devices", "per", per, ("run", "step"))
    if (step_time is None) == (speed_factor is None):
        raise ValueError(
            "draw_devices: give exactly one of step_time= or speed_factor="
        )
    scale = 1.0
    if speed_factor is not None:
        if host_step_time is None:
            raise ValueError(
                "draw_devices.host_step_time = None: needed with speed_factor"
            )
        _check.positive("draw_devices", "host_step_time", host_step_time, " s")
        kind, across, scale = "speed_factor", speed_factor, host_step_time
    elif step_time is not None:
        kind, across = "step_time", step_time
    draws = across.sample(rng, n_clients) if n_clients else np.zeros(0)
    devices: list[Device] = []
    clients: list[dict[str, Any]] = []
    for i, v in enumerate(draws.tolist()):
        step = v * scale
        if not math.isfinite(step) or step <= 0:
            raise ValueError(
                f"draw_devices: client {i} drew step time {step!r}; "
                "use a distribution of positive values"
            )
        dev: Device
        entry: dict[str, Any] = {"client": i, "step_time": step}
        if kind == "speed_factor":
            entry["factor"] = v
        if within_cv > 0:
            dev = StepTime(LogNormal(step, within_cv * step), per=per)
        elif kind == "speed_factor":
            dev = SpeedFactor(v, scale)
        else:
            dev = StepTime(Constant(step))
        devices.append(dev)
        clients.append(entry)
    record = {
        "kind": kind,
        "distribution": dist_record(across),
        "within_cv": within_cv,
        "per": per,
        "host_step_time": host_step_time,
        "clients": clients,
    }
    return devices, record
