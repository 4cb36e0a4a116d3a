"""Building blocks of the fidelity monitor: limits and bounded accumulators.

See docs/netem.md#fidelity for the checks. The
checks and the verdict that use these pieces are in :mod:`netem.fidelity`,
which depends on this module (never the reverse); import :class:`Thresholds`
and :func:`nice_ceiling` from here.

All values are in **emulated** seconds. Cheap by construction: scalars go into
preallocated numpy buffers that turn into a reservoir sample (Algorithm R,
own seeded generator) when full, with exact count, mean and max kept aside
(:class:`Reservoir`); delay moments are streamed (Welford, :class:`Moments`,
per link kind in :class:`KindStats`).
Both export themselves as plain data (msgpack/JSON-able) and merge such an
export into themselves, so monitors of several processes can be combined.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from netem import _check
from netem.loss import LossModel
from netem.lossprocess import LossStats

__all__ = ["KindStats", "Moments", "Reservoir", "Thresholds", "binomial_limit", "nice_ceiling"]


@dataclass(frozen=True, slots=True)
class Thresholds:
    """Pass/fail limits; see :mod:`netem.fidelity`.

    ``late_fraction`` and ``overrun_fraction`` are the shares of timers later
    than the allowed lateness and of compute runs past their budget that a
    faithful run may have; ``count_confidence`` is how sure the verdict must
    be that a run had more before it fails (a one-sided binomial test of the
    count, :func:`binomial_limit`).
    """

    lateness_floor: float = 1e-3
    lateness_fraction: float = 0.05
    late_fraction: float = 0.01
    overrun_fraction: float = 0.01
    count_confidence: float = 0.99
    delay_mean_rel: float = 0.02
    delay_std_rel: float = 0.10
    rate_rel: float = 0.05
    loss_confidence: float = 0.99
    burst_rel: float = 0.05
    min_samples: int = 30

    def __post_init__(self) -> None:
        for name in (
            "lateness_floor",
            "lateness_fraction",
            "late_fraction",
            "overrun_fraction",
            "delay_mean_rel",
            "delay_std_rel",
            "rate_rel",
            "burst_rel",
        ):
            _check.nonneg("Thresholds", name, getattr(self, name))
        for name in ("late_fraction", "overrun_fraction"):
            if getattr(self, name) >= 1.0:
                _check.fail("Thresholds", name, getattr(self, name), "must be < 1")
        for name in ("loss_confidence", "count_confidence"):
            value = getattr(self, name)
            _check.finite("Thresholds", name, value)
            if not 0.5 < value < 1.0:
                _check.fail("Thresholds", name, value, "must be in (0.5, 1)")
        _check.integer("Thresholds", "min_samples", self.min_samples, 1)


def binomial_limit(n: int, p: float, confidence: float) -> int:
    """The largest count of ``n`` trials that is no evidence of a rate above ``p``.

    The smallest ``c`` with ``P(X > c) <= 1 - confidence`` for ``X ~
    Binomial(n, p)``: a count above ``c`` says, at ``confidence`` (one-sided),
    that the rate was above ``p``. With ``p = 1 %`` at 99 %: 4 of 100, 9 of
    400, 18 of 1,000, 1,074 of 100,000; the share tends to ``p`` as ``n``
    grows. Exact: the upper tail is summed from where it is negligible
    (``n p`` plus 12 standard deviations and 20), in double precision.
    """
    if n <= 0 or p <= 0.0:
        return 0
    if p >= 1.0:
        return n
    alpha = 1.0 - confidence
    lp, lq, ln = math.log(p), math.log1p(-p), math.lgamma(n + 1)
    top = min(n, math.ceil(n * p + 12.0 * math.sqrt(n * p * (1.0 - p)) + 20.0))
    tail = 0.0  # P(X > k)
    for k in range(top, 0, -1):
        pmf = math.exp(ln - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * lp + (n - k) * lq)
        if tail + pmf > alpha:
            return k
        tail += pmf
    return 0


_NICE = (1.0, 1.5, 2.0, 3.0, 5.0)


def nice_ceiling(x: float) -> float:
    """Smallest of 1, 1.5, 2, 3, 5, 10, 15, 20, 30, 50, 100, ... that is >= x."""
    if not math.isfinite(x) or x <= 1.0:
        return 1.0
    decade = 10.0 ** math.floor(math.log10(x))
    for m in (*_NICE, 10.0):
        if m * decade >= x * (1 - 1e-12):
            return m * decade
    return 10.0 * decade


class Reservoir:
    """A bounded sample of a stream of floats: exact count/sum/max, quantiles.

    Memory is fixed at construction: ``cap`` float64 slots, filled in order
    and then replaced uniformly (Algorithm R, own generator seeded with
    ``seed``), so :meth:`quantile` estimates the quantiles of everything
    added, however long the stream. :meth:`add` is the sink to hand to
    anything that reports values one at a time (e.g. a
    :class:`~netem.timers.TimerHeap`'s ``on_lateness``).

    ``count`` is every sample recorded, merged ones included; the buffer holds
    a uniform sample of them (``_seen`` counts what was offered to it). A
    merged export stands for ``count`` samples with fewer values, so each of
    its values is offered ``count / len(values)`` times (stochastically
    rounded): the quantiles of a merge weigh every source by its real count.
    """

    __slots__ = ("_buf", "_cap", "_rng", "_seen", "_u", "count", "max", "sum")

    def __init__(self, cap: int, seed: int = 0) -> None:
        _check.integer("Reservoir", "cap", cap, 1)
        self._buf = np.empty(cap)
        self._cap = cap
        self._rng = np.random.default_rng(seed)
        self._u: list[float] = []  # uniforms drawn ahead in blocks, next one last
        self._seen = 0
        self.count, self.sum, self.max = 0, 0.0, -math.inf

    def add(self, x: float) -> None:
        """Record one value."""
        n, cap = self._seen, self._cap
        if n < cap:
            self._buf[n] = x
        else:
            # slot floor(U * (n + 1)), as _offer draws it; the uniforms come in
            # blocks (a scalar Generator.integers call cost 2 us per value)
            u = self._u
            if not u:
                u += reversed(self._rng.random(256).tolist())
            j = int(u.pop() * (n + 1))
            if j < cap:
                self._buf[j] = x
        self._seen = n + 1
        self.count += 1
        self.sum += x
        if x > self.max:
            self.max = x

    def _offer(self, xs: np.ndarray) -> None:
        """Offer ``xs`` to the reservoir in order (vectorised :meth:`add` of the buffer)."""
        n, cap = self._seen, self._buf.size
        k = max(0, min(cap - n, xs.size))
        self._buf[n : n + k] = xs[:k]
        rest = xs[k:]
        if rest.size:
            seen = np.arange(n + k, n + k + rest.size)
            j = np.floor(self._rng.random(rest.size) * (seen + 1)).astype(np.int64)
            keep = j < cap
            self._buf[j[keep]] = rest[keep]  # repeated slots: the later value wins, as in add()
        self._seen = n + xs.size

    def values(self) -> np.ndarray:
        return self._buf[: min(self._seen, self._buf.size)]

    def quantile(self, q: float) -> float:
        v = self.values()
        return float(np.quantile(v, q)) if v.size else 0.0

    def export(self, max_samples: int) -> dict[str, Any]:
        """Plain data; at most ``max_samples`` values (uniformly thinned)."""
        v = self.values()
        if v.size > max_samples:
            v = v[:: -(-v.size // max_samples)]
        return {"values": [float(x) for x in v], "count": self.count, "sum": self.sum,
                "max": self.max if self.count else 0.0}

    def merge(self, theirs: dict[str, Any]) -> None:
        """Add another reservoir's :meth:`export` (count, sum and max stay exact)."""
        vals = np.asarray(theirs["values"], dtype=np.float64)
        n = int(theirs["count"])
        if vals.size and n:
            w = n / vals.size
            reps = int(w) + (self._rng.random(vals.size) < w - int(w))
            self._offer(np.repeat(vals, reps))
        self.count += n
        self.sum += float(theirs["sum"])
        if n:
            self.max = max(self.max, float(theirs["max"]))


@dataclass(slots=True)
class Moments:
    """Streamed count, mean and sum of squared deviations (Welford); mergeable."""

    n: int = 0
    mean: float = 0.0
    m2: float = 0.0

    def add(self, x: float) -> None:
        """Record one value."""
        self.n += 1
        d = x - self.mean
        self.mean += d / self.n
        self.m2 += d * (x - self.mean)

    @property
    def std(self) -> float:
        """Sample standard deviation (0 with fewer than two values)."""
        return math.sqrt(max(self.m2, 0.0) / (self.n - 1)) if self.n > 1 else 0.0

    def export(self) -> list[float]:
        """``[n, mean, m2]``."""
        return [self.n, self.mean, self.m2]

    def merge(self, o: list[float]) -> None:
        """Add another accumulator's :meth:`export` (pooled moments, Chan et al.)."""
        n_o = int(o[0])
        n = self.n + n_o
        if n_o:
            delta = float(o[1]) - self.mean
            self.m2 += float(o[2]) + delta * delta * self.n * n_o / n
            self.mean += delta * n_o / n
            self.n = n


@dataclass(slots=True)
class KindStats:
    """Per link kind: configuration and streamed observations (one link kind of a
    :class:`~netem.fidelity.FidelityMonitor`).

    Each realised one-way delay is propagation + lateness; their moments are
    kept together (:attr:`delay`, what the delay checks judge) and apart
    (:attr:`prop`, :attr:`late`), so that the verdict can tell how the delay
    would look with lateness scaled by another dilation. Messages with a
    serialisation time feed the rate figures: their wire bytes, nominal
    serialisation seconds, count and summed positive lateness.
    """

    mean: float | None = None
    std: float | None = None
    loss: LossModel | None = None
    delay: Moments = field(default_factory=Moments)
    prop: Moments = field(default_factory=Moments)
    late: Moments = field(default_factory=Moments)
    bytes_: float = 0.0
    ser: float = 0.0
    ser_n: int = 0
    ser_late: float = 0.0
    loss_stats: LossStats = field(default_factory=LossStats)

    def add_delay(self, propagation: float, lateness: float = 0.0) -> None:
        """One realised delay, ``propagation + lateness`` seconds."""
        self.delay.add(propagation + lateness)
        self.prop.add(propagation)
        self.late.add(lateness)

    def add_serialised(self, wire_bytes: int, serialization: float, lateness: float) -> None:
        """One message that took ``serialization`` nominal seconds on the link."""
        self.bytes_ += wire_bytes
        self.ser += serialization
        self.ser_n += 1
        self.ser_late += max(lateness, 0.0)

    def export(self) -> dict[str, Any]:
        """Observations as plain data (the configuration is not exported)."""
        return {"delay": self.delay.export(), "prop": self.prop.export(),
                "late": self.late.export(), "bytes": self.bytes_, "ser": self.ser,
                "ser_n": self.ser_n, "ser_late": self.ser_late,
                "packets": self.loss_stats.packets, "lost": self.loss_stats.lost,
                "bursts": self.loss_stats.bursts, "cut": self.loss_stats.cut}

    def merge(self, o: dict[str, Any]) -> None:
        """Add another accumulator's :meth:`export`."""
        self.delay.merge(o["delay"])
        self.prop.merge(o["prop"])
        self.late.merge(o["late"])
        self.bytes_ += float(o["bytes"])
        self.ser += float(o["ser"])
        self.ser_n += int(o["ser_n"])
        self.ser_late += float(o["ser_late"])
        s = self.loss_stats
        self.loss_stats = s + LossStats(int(o["packets"]), int(o["lost"]), int(o["bursts"]),
                                        int(o["cut"]))
