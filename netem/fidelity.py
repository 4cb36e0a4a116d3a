"""Self-measured emulation fidelity and a suggested time dilation.

What a run's verdict means and what to do when it fails: docs/netem.md#fidelity. It
records scheduled vs actual delivery, realised vs configured delay mean/std,
rate, loss rate and burst length, compute-deadline overruns, and judges them
(real = emulated x dilation, so real timer errors shrink by the dilation in
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

* ``lateness``: timers later than ``a = max(1 ms, 5 % x smallest configured
  mean one-way delay)`` (the "allowed lateness") are no evidence that more
  than 1 % of them were: at most :func:`~netem.fidelitystats.binomial_limit`
  ``(n, 1 %, 99 %)`` of ``n`` (4 of 100, 18 of 1,000; a p99 <= ``a`` read
  with its sampling error).
* ``overruns``: compute runs that overran their emulated budget, read the
  same way: at most ``binomial_limit(runs, 1 %, 99 %)``.
* ``delay_mean`` per link kind (realised one-way delay = propagation +
  lateness, vs the configured marginal's true mean): off by at most
  ``max(2 % x mean, 3 std / sqrt(n), allowed lateness)``.
* ``delay_std``: off by at most ``max(10 % x std, allowed lateness,
  3 std / sqrt(2 n))`` (tc netem is known to under-deliver jitter).
* ``rate`` per link kind with a rate: realised serialisation rate >= 95 % of
  the configured one, judged within the lateness allowance (below).
* ``loss_rate``: realised packet loss inside the model's two-sided 99 %
  interval ``mu +- z sqrt(mu (1 - mu) v / n)``, ``v`` the variance inflation
  of bursty models (plain binomial for Bernoulli). 99 % rather than 95 % so
  that a healthy run with a few link kinds rarely fails by chance.
* ``burst_length``: realised mean burst within ``z sd / sqrt(bursts) + 5 %``
  of the model's (geometric sd ``sqrt(b (b - 1))``).
* ``clock`` per host: its clock's uncertainty, in emulated seconds, <= the
  allowed lateness.
* ``send_times`` per host: no message of that host needed its claimed send
  time corrected (:meth:`FidelityMonitor.record_clamped`). A sender whose
  claims the receiver had to correct is not emulated faithfully, whatever
  its other numbers; no dilation fixes it.

Statistical checks need ``min_samples`` (30) observations; otherwise they are
listed as skipped.

**Counts, not point estimates.** The sample p99 of a short run's 100 to 800
timers is its second to eighth largest value, so one stall of the machine
that caught two timers failed a 20 s run whose other 98 were on time; the
same held for overruns (2 of 150 runs, 1.3 %). Like ``loss_rate``, the two
checks now ask for evidence at 99 %: a run fails when its count of late
timers (or overruns) is one that a run with exactly 1 % would reach less
than 1 % of the time. For a long run the limit tends to 1 % (1,074 of
100,000). The lateness p99 is still reported.

**Rate within the lateness allowance.** A message's lateness is when the
emulator delivered it minus when the model said; it is not time the link
spent serialising, and lateness up to the allowed lateness ``a`` is what the
``lateness`` check accepts. So for the ``n`` messages of a kind that had a
serialisation time, with nominal serialisation ``S = sum(ser_i)`` and
positive lateness ``P = sum(max(0, late_i))``::

    realised rate = sum(wire bytes) / (S + max(0, P - n a))

i.e. the link is charged only the lateness beyond the allowance, pooled over
its messages (throughput is a total over them). On a 1 Gbit/s link a 57 KB
message serialises in 0.46 ms; charging it ordinary lateness of 0.1-1.5 ms
(within the allowance) would put the rate at a third of nominal on an idle
host. A link that really is slower than configured delays each message by a
share of its serialisation time, which on the links where the rate matters
is far beyond ``a`` and fails the check. The pooled form needs only ``n``, ``S``
and ``P`` (exact under :meth:`FidelityMonitor.merge`) and uses the merging
monitor's ``a`` at report time: hosts record their links unconfigured.
``rate_realised_all_lateness`` (every message's whole lateness charged) is
reported for information.

**Suggested dilation.** ``suggested_dilation`` is the dilation in use when
the verdict passes. When it fails, it is strictly larger, and large enough
for every failing *timing* check (lateness, overruns, rate, delay mean and
std) to pass under the dilation model: real lateness and real compute time
do not depend on the dilation, so at ``D' = k D`` every recorded lateness
and every compute time, in emulated seconds, is divided by ``k``; the
configured delays, rates, budgets and the allowance are emulated quantities
and stay. For each failing timing check the smallest ``k`` from which it
passes for *every* larger ``k`` is:

* ``lateness``: with ``m`` the late timers the check allows, the ``(m +
  1)``-th largest lateness over ``a``: at ``k`` above it at most ``m`` timers
  are later than ``a`` (their lateness divides by ``k``).
* ``overruns``: with ``m`` the overruns the check allows (less those with no
  positive budget, which no dilation fixes), the ``(m + 1)``-th largest
  actual/budget ratio: above it at most ``m`` runs still overrun. Both are
  exact while the reservoir holds every observation.
* ``rate``: ``max(0, P / k - n a) <= S r / (1 - r)`` (``r`` = 5 %), so
  ``k = P / (S r / (1 - r) + n a)``.
* ``delay_mean``: the realised mean is ``prop_mean + late_mean / k``, which
  moves monotonically to the propagation mean; if that is within the
  tolerance, ``k`` is where the line enters it; otherwise no dilation helps.
* ``delay_std``: ``|std(prop + late / k) - std(prop)| <= std(late) / k``
  (Minkowski), so ``k = std(late) / (tol - |std(prop) - configured std|)``
  suffices when the propagation alone is within the tolerance.

The suggestion is ``D`` times the largest such ``k`` (times ``1 + 1e-9``, so
that a check landing exactly on its limit passes despite rounding) rounded
up to 1, 1.5, 2, 3, 5, 10, 15, 20, 30, 50, ...; since every required ``k``
holds for all larger values, rounding up keeps them passing. Failing checks
that no dilation fixes (``loss_rate``, ``burst_length``, or a timing check
whose cause is not lateness) are listed in ``unfixable_by_dilation``; they
do not raise the suggestion, which is then at least the next step above
``D``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict
from statistics import NormalDist
from typing import Any, Protocol

import numpy as np

from netem import _check
from netem.fidelitystats import KindStats, Reservoir, Thresholds, binomial_limit, nice_ceiling
from netem.link import Delivery
from netem.linkparams import LinkParams
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
        # host -> (offset, uncertainty), real seconds
        self._clocks: dict[str, tuple[float, float]] = {}
        self._clamped = 0
        # sender -> messages whose send time was corrected
        self._corrected: dict[str, int] = {}

    # -- configuration -------------------------------------------------------
    def _kind(self, kind: str) -> KindStats:
        k = self._kinds.get(kind)
        if k is None:  # not setdefault: that builds a KindStats per call (1.7 us)
            k = self._kinds[kind] = KindStats()
        return k

    def expect_delay(self, kind: str, mean: float, std: float) -> None:
        """Configured one-way delay moments of link kind ``kind`` (seconds)."""
        k = self._kind(kind)
        k.mean, k.std = float(mean), float(std)

    def expect_loss(self, kind: str, model: LossModel | None) -> None:
        """Configured loss model of link kind ``kind``."""
        self._kind(kind).loss = model

    def expect_link(self, kind: str, params: LinkParams) -> None:
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
        k.add_delay(d.propagation, late)
        if d.serialization > 0:
            k.add_serialised(d.wire_bytes, d.serialization, late)

    def record_delay(self, kind: str, seconds: float) -> None:
        """A realised one-way delay measured some other way (no lateness part:
        it is taken not to change with the dilation)."""
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
        process that merges sets its own. Neither are corrected send times
        (:meth:`record_clamped`): they are the receiver's own judgement of
        its senders, never taken from a sender's report. Lateness and
        compute ratios keep at most ``max_samples`` values each (uniformly
        thinned); counts, sums and maxima stay exact.
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

    def record_clock(self, host: str, offset: float, uncertainty: float) -> None:
        """A host's clock offset to this monitor's clock and its uncertainty (real s).

        Emulated time on two machines is one time only up to how well their
        clocks are known to agree: the verdict fails when a host's
        uncertainty, in emulated seconds, exceeds the allowed lateness
        (a larger dilation shrinks it).
        """
        self._clocks[host] = (float(offset), float(uncertainty))

    def record_clamped(self, n: int = 1, host: str | None = None) -> None:
        """Messages whose claimed send time was out of bounds and was corrected.

        They are not judged for lateness (their send time is not known); they
        are counted, and with ``host`` (the sender) they fail the verdict by
        that host's name: a correction means its messages did not take the
        emulated time they claim.
        """
        self._clamped += n
        if host is not None:
            self._corrected[host] = self._corrected.get(host, 0) + n

    # -- verdict -------------------------------------------------------------
    def allowed_lateness(self) -> float:
        """``max(floor, fraction x smallest configured mean delay > 0)``."""
        th = self.thresholds
        means = [k.mean for k in self._kinds.values() if k.mean]
        smallest = min(means) if means else 0.0
        return max(th.lateness_floor, th.lateness_fraction * smallest)

    def late_limit(self) -> int:
        """Most timers that may be later than :meth:`allowed_lateness` (``lateness``)."""
        th = self.thresholds
        return binomial_limit(self._late.count, th.late_fraction, th.count_confidence)

    def overrun_limit(self) -> int:
        """Most compute runs that may overrun their budget (``overruns``)."""
        th = self.thresholds
        return binomial_limit(self._ratio.count, th.overrun_fraction, th.count_confidence)

    def _overrun_scale(self, limit: int) -> float:
        """Smallest ``k`` from which ``overruns`` passes with compute times / k."""
        v, n = self._ratio.values(), self._ratio.count
        # overruns with no positive budget have no ratio and stay whatever k is
        stuck = max(0, self._overruns - _count_above(v, n, 1.0))
        return _scale_above(v, n, limit, stuck, 1.0)

    def report(self) -> dict[str, Any]:
        """JSON-able verdict, measurements, checks and thresholds."""
        th = self.thresholds
        z = NormalDist().inv_cdf(0.5 + th.loss_confidence / 2)
        allowed = self.allowed_lateness()
        checks: list[dict[str, Any]] = []
        # per failing check: the dilation factor from which it passes (inf:
        # no dilation does), see the module docstring
        needs: list[float] = []

        def check(
            name: str,
            kind: str | None,
            value: float,
            limit: str,
            ok: bool,
            scale: Callable[[], float] | None = None,
        ) -> None:
            k = None
            if not ok:
                need = scale() if scale is not None else math.inf
                needs.append(need)
                k = need if math.isfinite(need) else None
            checks.append(
                {"check": name, "kind": kind, "value": value, "limit": limit, "ok": ok,
                 "needs_factor": k}
            )

        lat = self._late
        p50, p99 = lat.quantile(0.5), lat.quantile(0.99)
        late = _count_above(lat.values(), lat.count, allowed)
        late_limit = self.late_limit()
        conf = f"{th.count_confidence * 100:g} %"
        if lat.count:
            check(
                "lateness", None, late,
                f"<= {late_limit} of {lat.count} timers later than {allowed:.6g} s "
                f"({th.late_fraction * 100:g} % at {conf})",
                late <= late_limit,
                lambda: _scale_above(lat.values(), lat.count, late_limit, 0, allowed),
            )
        n_runs = self._ratio.count
        overrun_limit = self.overrun_limit()
        if n_runs:
            check(
                "overruns",
                None,
                self._overruns,
                f"<= {overrun_limit} of {n_runs} compute runs "
                f"({th.overrun_fraction * 100:g} % at {conf})",
                self._overruns <= overrun_limit,
                lambda: self._overrun_scale(overrun_limit),
            )

        clocks: dict[str, Any] = {}
        for host, (offset, unc) in sorted(self._clocks.items()):
            unc_e = unc / self.dilation
            clocks[host] = {"offset_s": offset, "uncertainty_ms": unc * 1e3}
            need = unc_e / allowed if allowed > 0 else math.inf
            check("clock", host, unc_e, f"uncertainty <= {allowed:.6g} s",
                  unc_e <= allowed, _constant(need))
        for host, n in sorted(self._corrected.items()):
            clocks.setdefault(host, {})["send_times_corrected"] = n
            check("send_times", host, n, "0 corrected (claimed send times the receiver "
                  "had to correct)", n == 0)

        kinds_out: dict[str, Any] = {}
        for name, k in sorted(self._kinds.items()):
            kinds_out[name] = self._judge_kind(name, k, allowed, z, check)

        failed = [c for c in checks if not c["ok"]]
        reasons = [
            f"{c['check']}{'[' + c['kind'] + ']' if c['kind'] else ''}: "
            f"{c['value']:.6g} outside {c['limit']}"
            for c in failed
        ]
        unfixable = [
            f"{c['check']}{'[' + c['kind'] + ']' if c['kind'] else ''}"
            for c, need in zip(failed, needs, strict=True)
            if not math.isfinite(need)
        ]
        suggested = self.dilation
        if failed:
            factor = max([1.0, *(k for k in needs if math.isfinite(k))])
            suggested = nice_ceiling(self.dilation * factor * (1.0 + 1e-9))
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
                "late": late,
                "late_limit": late_limit,
            },
            "compute": {
                "runs": n_runs,
                "overruns": self._overruns,
                "overrun_limit": overrun_limit,
                "ratio_p99": self._ratio.quantile(0.99),
            },
            "links": kinds_out,
            "clocks": clocks,
            "send_times_clamped": self._clamped,
            "checks": checks,
            "dilation": self.dilation,
            "suggested_dilation": suggested,
            "unfixable_by_dilation": unfixable,
            "thresholds": asdict(self.thresholds),
        }

    def _judge_kind(
        self, name: str, k: KindStats, allowed: float, z: float, check: _Check
    ) -> dict[str, Any]:
        """One link kind's checks (through ``check``) and figures."""
        th = self.thresholds
        out: dict[str, Any] = {"n_delays": k.delay.n}
        n, realised = k.delay.n, k.delay
        if n:
            out.update(delay_mean=realised.mean, delay_std=realised.std)
        if k.mean is not None and k.std is not None and n >= th.min_samples:
            mean, std = k.mean, k.std
            out.update(configured_mean=mean, configured_std=std)
            tol_m = max(th.delay_mean_rel * mean, 3 * std / math.sqrt(n), allowed)

            def mean_scale() -> float:
                # realised mean at factor k: prop + late / k, monotone towards prop
                p, lm = k.prop.mean, k.late.mean
                if abs(p - mean) >= tol_m:
                    return math.inf
                if lm > 0:
                    return lm / (mean + tol_m - p)
                if lm < 0:
                    return -lm / (p - (mean - tol_m))
                return math.inf

            check(
                "delay_mean",
                name,
                realised.mean,
                f"{mean:.6g} +- {tol_m:.3g}",
                abs(realised.mean - mean) <= tol_m,
                mean_scale,
            )
            tol_s = max(th.delay_std_rel * std, allowed, 3 * std / math.sqrt(2 * n))

            def std_scale() -> float:
                # |std(prop + late / k) - std(prop)| <= std(late) / k
                gap = tol_s - abs(k.prop.std - std)
                sl = k.late.std
                return sl / gap if gap > 0 and sl > 0 else math.inf

            check(
                "delay_std",
                name,
                realised.std,
                f"{std:.6g} +- {tol_s:.3g}",
                abs(realised.std - std) <= tol_s,
                std_scale,
            )
        elif k.mean is not None and k.std is not None:
            out.update(configured_mean=k.mean, configured_std=k.std)
        if k.ser > 0:
            charged = max(0.0, k.ser_late - k.ser_n * allowed)
            ratio = k.ser / (k.ser + charged)
            out.update(
                rate_nominal=8 * k.bytes_ / k.ser,
                rate_realised=8 * k.bytes_ / (k.ser + charged),
                rate_realised_all_lateness=8 * k.bytes_ / (k.ser + k.ser_late),
            )
            rel = th.rate_rel

            def rate_scale() -> float:
                # charged at factor k: max(0, ser_late / k - n a) <= ser r / (1 - r)
                room = (k.ser * rel / (1 - rel) if rel < 1 else math.inf) + k.ser_n * allowed
                return k.ser_late / room if room > 0 else math.inf

            check(
                "rate",
                name,
                ratio,
                f"realised/nominal >= {1 - rel}",
                ratio >= 1 - rel,
                rate_scale,
            )
        ls = k.loss_stats
        if ls.packets:
            out.update(packets=ls.packets, loss_rate=ls.rate, mean_burst=ls.mean_burst)
        if k.loss is not None and ls.packets:
            mu = k.loss.mean_loss_rate()
            b = k.loss.mean_burst_length()
            out.update(configured_loss_rate=mu, configured_burst=b)
            if ls.packets >= th.min_samples:
                se = math.sqrt(mu * (1 - mu) * k.loss.variance_inflation() / ls.packets)
                tol = z * se + 0.5 / ls.packets
                check(
                    "loss_rate",
                    name,
                    ls.rate,
                    f"{mu:.6g} +- {tol:.3g}",
                    abs(ls.rate - mu) <= tol,
                )
            if ls.ended >= th.min_samples and math.isfinite(b):
                tol = z * math.sqrt(max(b * (b - 1), 0.0) / ls.ended) + th.burst_rel * b
                check(
                    "burst_length",
                    name,
                    ls.mean_burst,
                    f"{b:.6g} +- {tol:.3g}",
                    abs(ls.mean_burst - b) <= tol,
                )
        return out


class _Check(Protocol):
    """The ``check`` recorder of :meth:`FidelityMonitor.report`."""

    def __call__(
        self,
        name: str,
        kind: str | None,
        value: float,
        limit: str,
        ok: bool,
        scale: Callable[[], float] | None = None,
    ) -> None: ...


def _count_above(values: np.ndarray, n: int, bound: float) -> int:
    """How many of ``n`` observations are above ``bound``, from ``values``, a
    uniform sample of them (exact while the sample holds all ``n``)."""
    if not values.size:
        return 0
    return round(int(np.count_nonzero(values > bound)) * n / values.size)


def _scale_above(values: np.ndarray, n: int, limit: int, stuck: int, bound: float) -> float:
    """Smallest ``k`` from which at most ``limit`` of ``n`` observations (``values``
    a uniform sample of them, ``stuck`` of them above ``bound`` whatever ``k``)
    stay above ``bound`` once divided by ``k``: the ``(m + 1)``-th largest
    sampled value over ``bound``, ``m`` the sampled values ``limit`` allows."""
    if not n or not values.size or bound <= 0:
        return math.inf
    w = n / values.size  # observations per sampled value (1 while the sample holds all)
    m = math.floor((limit - stuck) / w)
    if m < 0:
        return math.inf
    if m >= values.size:
        return 1.0
    v = np.sort(values)
    return max(1.0, float(v[v.size - m - 1]) / bound)  # at most m sampled values above it


def _constant(x: float) -> Callable[[], float]:
    """A function returning ``x`` (a check's dilation factor known up front)."""
    return lambda: x
