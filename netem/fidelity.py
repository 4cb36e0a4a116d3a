"""Self-measured emulation fidelity and a suggested time dilation.

Reference: NETEM-REFERENCE.md §5.1 (what to record: scheduled vs actual
delivery, realised vs configured delay mean/std, rate, loss rate and burst
length, compute-deadline overruns; a run-level verdict), §5.2 (timer
lateness on this box: ~0.2-0.4 ms typical, several ms at 2,000 timers),
§5.3 (dilation: real = emulated x TDF, so timer errors shrink by the TDF in
emulated time).

All inputs are in **emulated** seconds (the emulator divides real lateness by
the dilation before recording it). The bounded accumulators that hold the
observations (:class:`~netem.fidelitystats.Reservoir`,
:class:`~netem.fidelitystats.KindStats`),
:class:`~netem.fidelitystats.Thresholds` and
:func:`~netem.fidelitystats.nice_ceiling` are in :mod:`netem.fidelitystats`;
this module records observations and judges them.

Checks and their default thresholds (:class:`Thresholds`), each failing one
adds a reason and makes the verdict ``"fail"``:

* ``lateness``: p99 lateness <= ``max(1 ms, 5 % x smallest configured mean
  one-way delay)`` (the "allowed lateness").
* ``overruns``: compute runs that overran their emulated budget <= 1 %.
* ``delay_mean`` per link kind (realised one-way delay = propagation +
  lateness, vs the configured marginal's true mean): off by at most
  ``max(2 % x mean, 3 std / sqrt(n), allowed lateness)``.
* ``delay_std``: off by at most ``max(10 % x std, allowed lateness,
  3 std / sqrt(2 n))`` (netem under-delivers jitter, §1.2).
* ``rate``: realised serialisation rate ``sum(bytes) / sum(serialisation +
  lateness)`` >= 95 % of the configured one.
* ``loss_rate``: realised packet loss inside the model's two-sided 99 %
  interval ``mu +- z sqrt(mu (1 - mu) v / n)``, ``v`` the variance inflation
  of bursty models (plain binomial for Bernoulli). 99 % rather than 95 % so
  that a healthy run with a few link kinds rarely fails by chance.
* ``burst_length``: realised mean burst within ``z sd / sqrt(bursts) + 5 %``
  of the model's (geometric sd ``sqrt(b (b - 1))``).

Statistical checks need ``min_samples`` (30) observations; otherwise they are
listed as skipped. ``suggested_dilation`` = current dilation x the largest of
(p99 lateness / allowed lateness, p99 of actual / budget compute time), rounded
up to 1, 1.5, 2, 3, 5, 10, 15, 20, 30, 50, ... -- or the current dilation when
everything passes.
"""

from __future__ import annotations

import math
from dataclasses import asdict
from statistics import NormalDist
from typing import Any

from netem import _check
from netem.fidelitystats import KindStats, Reservoir, Thresholds, nice_ceiling
from netem.link import Delivery
from netem.loss import LossModel
from netem.lossprocess import LossStats

__all__ = ["FidelityMonitor"]

# One shared default, as before (Thresholds is frozen, so sharing is safe).
_DEFAULT_THRESHOLDS = Thresholds()


class FidelityMonitor:
    """Accumulates fidelity observations for one run; :meth:`report` judges them.

    Parameters
    ----------
    thresholds
        Limits of the checks.
    dilation
        The run's time dilation factor (real = emulated x dilation).
    capacity
        Samples kept for lateness and compute-ratio quantiles.
    seed
        Seed of the reservoir's own generator.
    """

    def __init__(
        self,
        thresholds: Thresholds = _DEFAULT_THRESHOLDS,
        dilation: float = 1.0,
        capacity: int = 1 << 17,
        seed: int = 0,
    ) -> None:
        _check.positive("FidelityMonitor", "dilation", dilation)
        _check.integer("FidelityMonitor", "capacity", capacity, 1)
        self.thresholds = thresholds
        self.dilation = float(dilation)
        self._late = Reservoir(capacity, seed)
        self._ratio = Reservoir(capacity, seed + 1)
        self._overruns = 0
        self._kinds: dict[str, KindStats] = {}

    # -- configuration -------------------------------------------------------
    def _kind(self, kind: str) -> KindStats:
        return self._kinds.setdefault(kind, KindStats())

    def expect_delay(self, kind: str, mean: float, std: float) -> None:
        """Configured one-way delay moments of link kind ``kind`` (seconds)."""
        k = self._kind(kind)
        k.mean, k.std = float(mean), float(std)

    def expect_loss(self, kind: str, model: LossModel | None) -> None:
        """Configured loss model of link kind ``kind``."""
        self._kind(kind).loss = model

    def expect_link(self, kind: str, params: Any) -> None:
        """Shortcut from a :class:`~netem.linkparams.LinkParams`."""
        m, s = params.delay_dist().moments()
        self.expect_delay(kind, m, s)
        self.expect_loss(kind, params.loss)

    # -- observations --------------------------------------------------------
    def record_lateness(self, lateness: float) -> None:
        """Actual minus scheduled time of one timer/delivery (emulated s)."""
        self._late.add(float(lateness))

    def record_delivery(self, kind: str, d: Delivery, t_actual: float) -> None:
        """A delivered message and when it was actually delivered.

        Dropped messages carry no timing and are ignored.
        """
        if d.dropped:
            return
        late = float(t_actual) - d.t_deliver
        self.record_lateness(late)
        k = self._kind(kind)
        k.add_delay(d.propagation + late)
        if d.serialization > 0:
            k.bytes_ += d.wire_bytes
            k.ser += d.serialization
            k.ser_actual += d.serialization + max(late, 0.0)

    def record_delay(self, kind: str, seconds: float) -> None:
        """A realised one-way delay measured some other way."""
        self._kind(kind).add_delay(float(seconds))

    def record_loss(self, kind: str, stats: LossStats) -> None:
        """Add a link's final :class:`LossStats` (call once per link)."""
        k = self._kind(kind)
        s = k.loss_stats
        k.loss_stats = s + stats

    def record_compute(self, budget: float, actual: float) -> None:
        """A compute run: emulated budget and the emulated time it really took."""
        if budget > 0:
            self._ratio.add(float(actual) / float(budget))
        if actual > budget:
            self._overruns += 1

    # -- merging monitors of several processes --------------------------------
    def export(self, max_samples: int = 20000) -> dict[str, Any]:
        """Observations as plain data (msgpack/JSON-able), for :meth:`merge`.

        Configuration (expected delays and loss models) is not exported: the
        process that merges sets its own. Lateness and compute ratios keep at
        most ``max_samples`` values each (uniformly thinned); counts, sums and
        maxima stay exact.
        """
        kinds = {name: k.export() for name, k in self._kinds.items()}
        return {"lateness": self._late.export(max_samples),
                "ratio": self._ratio.export(max_samples),
                "overruns": self._overruns, "kinds": kinds}

    def merge(self, data: dict[str, Any]) -> None:
        """Add another monitor's :meth:`export` to this one.

        Sample values are added one by one; when the other side thinned its
        samples, its quantiles weigh less than its count (count, mean and max
        remain exact).
        """
        self._late.merge(data["lateness"])
        self._ratio.merge(data["ratio"])
        self._overruns += int(data["overruns"])
        for name, o in data["kinds"].items():
            self._kind(name).merge(o)

    # -- verdict -------------------------------------------------------------
    def allowed_lateness(self) -> float:
        """``max(floor, fraction x smallest configured mean delay > 0)``."""
        th = self.thresholds
        means = [k.mean for k in self._kinds.values() if k.mean]
        smallest = min(means) if means else 0.0
        return max(th.lateness_floor, th.lateness_fraction * smallest)

    def report(self) -> dict[str, Any]:
        """JSON-able verdict, measurements, checks and thresholds."""
        th = self.thresholds
        z = NormalDist().inv_cdf(0.5 + th.loss_confidence / 2)
        allowed = self.allowed_lateness()
        checks: list[dict[str, Any]] = []

        def check(
            name: str, kind: str | None, value: float, limit: str, ok: bool
        ) -> None:
            checks.append(
                {"check": name, "kind": kind, "value": value, "limit": limit, "ok": ok}
            )

        lat = self._late
        p50, p99 = lat.quantile(0.5), lat.quantile(0.99)
        if lat.count:
            check("lateness", None, p99, f"p99 <= {allowed:.6g} s", p99 <= allowed)
        n_runs = self._ratio.count
        if n_runs:
            frac = self._overruns / n_runs
            check(
                "overruns",
                None,
                frac,
                f"<= {th.overrun_fraction}",
                frac <= th.overrun_fraction,
            )

        kinds_out: dict[str, Any] = {}
        for name, k in sorted(self._kinds.items()):
            out: dict[str, Any] = {"n_delays": k.n}
            std = math.sqrt(k.m2 / (k.n - 1)) if k.n > 1 else 0.0
            if k.n:
                out.update(delay_mean=k.m, delay_std=std)
            if k.mean is not None and k.std is not None:
                out.update(configured_mean=k.mean, configured_std=k.std)
                if k.n >= th.min_samples:
                    tol = max(
                        th.delay_mean_rel * k.mean, 3 * k.std / math.sqrt(k.n), allowed
                    )
                    check(
                        "delay_mean",
                        name,
                        k.m,
                        f"{k.mean:.6g} +- {tol:.3g}",
                        abs(k.m - k.mean) <= tol,
                    )
                    tol = max(
                        th.delay_std_rel * k.std,
                        allowed,
                        3 * k.std / math.sqrt(2 * k.n),
                    )
                    check(
                        "delay_std",
                        name,
                        std,
                        f"{k.std:.6g} +- {tol:.3g}",
                        abs(std - k.std) <= tol,
                    )
            if k.ser > 0:
                ratio = k.ser / k.ser_actual
                out.update(
                    rate_nominal=8 * k.bytes_ / k.ser,
                    rate_realised=8 * k.bytes_ / k.ser_actual,
                )
                check(
                    "rate",
                    name,
                    ratio,
                    f"realised/nominal >= {1 - th.rate_rel}",
                    ratio >= 1 - th.rate_rel,
                )
            ls = k.loss_stats
            if ls.packets:
                out.update(
                    packets=ls.packets, loss_rate=ls.rate, mean_burst=ls.mean_burst
                )
            if k.loss is not None and ls.packets:
                mu = k.loss.mean_loss_rate()
                b = k.loss.mean_burst_length()
                out.update(configured_loss_rate=mu, configured_burst=b)
                if ls.packets >= th.min_samples:
                    se = math.sqrt(
                        mu * (1 - mu) * k.loss.variance_inflation() / ls.packets
                    )
                    tol = z * se + 0.5 / ls.packets
                    check(
                        "loss_rate",
                        name,
                        ls.rate,
                        f"{mu:.6g} +- {tol:.3g}",
                        abs(ls.rate - mu) <= tol,
                    )
                if ls.ended >= th.min_samples and math.isfinite(b):
                    tol = (
                        z * math.sqrt(max(b * (b - 1), 0.0) / ls.ended)
                        + th.burst_rel * b
                    )
                    check(
                        "burst_length",
                        name,
                        ls.mean_burst,
                        f"{b:.6g} +- {tol:.3g}",
                        abs(ls.mean_burst - b) <= tol,
                    )
            kinds_out[name] = out

        failed = [c for c in checks if not c["ok"]]
        reasons = [
            f"{c['check']}{'[' + c['kind'] + ']' if c['kind'] else ''}: "
            f"{c['value']:.6g} outside {c['limit']}"
            for c in failed
        ]
        factor = 1.0
        if failed:
            if lat.count and p99 > allowed:
                factor = max(factor, p99 / allowed)
            if n_runs and self._overruns / n_runs > th.overrun_fraction:
                factor = max(factor, self._ratio.quantile(0.99))
        suggested = (
            nice_ceiling(self.dilation * factor) if factor > 1 else self.dilation
        )
        return {
            "verdict": "fail" if failed else "pass",
            "reasons": reasons,
            "lateness_ms": {
                "n": lat.count,
                "p50": p50 * 1e3,
                "p99": p99 * 1e3,
                "max": (lat.max if lat.count else 0.0) * 1e3,
                "mean": (lat.sum / lat.count if lat.count else 0.0) * 1e3,
                "allowed_p99": allowed * 1e3,
            },
            "compute": {
                "runs": n_runs,
                "overruns": self._overruns,
                "ratio_p99": self._ratio.quantile(0.99),
            },
            "links": kinds_out,
            "checks": checks,
            "dilation": self.dilation,
            "suggested_dilation": suggested,
            "thresholds": asdict(self.thresholds),
        }
