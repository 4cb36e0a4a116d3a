"""Where a run's time goes: the bounded estimators behind ``summary["phases"]``.

:class:`Durations` keeps one stream of durations (exact count, sum and max,
quantiles from a uniform sample of bounded size); :class:`PhaseStats` holds
one per phase of :data:`PHASES`, merges what client hosts report, and is
saved in checkpoints (docs/run-directory.md, "Where time goes").
"""

from __future__ import annotations

import math
import random
from array import array
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

__all__ = ["PHASES", "Durations", "PhaseStats"]


#: Where a run's time goes: the distributions of ``summary["phases"]``, each named
#: ``<phase>.<part>`` (docs/run-directory.md, "Where time goes"). The parts
#: named ``hosts`` and both of ``compute`` are measured by the client hosts
#: (:data:`fedsim.wire.messages.HOST_PHASES`), the rest by the server.
PHASES: tuple[str, ...] = (
    "encode.server", "encode.hosts",
    "decode.server", "decode.hosts",
    "queueing.server", "queueing.hosts",
    "compute.real", "compute.budget",
    "aggregation.server",
    "evaluation.worker", "evaluation.round_trip",
)

_INF = math.inf


class Durations:
    """A bounded sample of a stream of durations (seconds): exact ``count``, ``sum``
    and ``max``, quantiles from a uniform sample of at most ``capacity`` values.

    The sample is Algorithm R (Vitter): the first ``capacity`` values fill it,
    each later one replaces a uniformly chosen slot with probability
    ``capacity / count``, so it stays a uniform sample of everything added
    however long the stream (a 10,000-client run keeps ``capacity`` floats).
    :meth:`add` is cheap enough for every message: a few comparisons, one
    ``random()`` once the sample is full, no allocation beyond its float
    (the sample is an ``array("d")`` that grows to ``capacity`` and stays).
    A negative or non-finite value is not a duration and is ignored.

    :meth:`merge` adds another sample's :meth:`export` (a client host's,
    a checkpoint's) in ``O(capacity)`` whatever count it claims.
    """

    __slots__ = ("_capacity", "_rng", "_sample", "count", "max", "sum")

    def __init__(self, capacity: int = 4096, seed: int = 0) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"Invalid Durations capacity {capacity!r}: must be an int >= 1")
        self._capacity = capacity
        self._rng = random.Random(seed)
        self._sample = array("d")
        self.count = 0
        self.sum = 0.0
        self.max = 0.0

    def add(self, x: float) -> None:
        """Record one duration."""
        if not 0.0 <= x < _INF:
            return
        n = self.count
        if n < self._capacity:
            self._sample.append(x)
        else:
            j = int(self._rng.random() * (n + 1))
            if j < self._capacity:
                self._sample[j] = x
        self.count = n + 1
        self.sum += x
        if x > self.max:
            self.max = x

    def values(self) -> tuple[float, ...]:
        """The sample (all values while ``count <= capacity``)."""
        return tuple(self._sample)

    def summary(self) -> dict[str, float | int | None]:
        """``n``, ``mean``, ``p50``, ``p95``, ``p99``, ``max`` (seconds; None when empty).

        ``n``, ``mean`` and ``max`` are exact; the quantiles are those of the
        sample (exact while ``n <= capacity``, linear interpolation).
        """
        if not self.count or not self._sample:
            return {"n": self.count, "mean": None, "p50": None, "p95": None, "p99": None,
                    "max": None}
        q = np.quantile(np.array(self._sample, dtype=np.float64), (0.5, 0.95, 0.99))
        return {"n": self.count, "mean": _s(self.sum / self.count), "p50": _s(q[0]),
                "p95": _s(q[1]), "p99": _s(q[2]), "max": _s(self.max)}

    def export(self) -> dict[str, Any]:
        """Plain data: ``count``, ``sum``, ``max`` and the sample's ``values``."""
        return {"count": self.count, "sum": self.sum, "max": self.max,
                "values": list(self._sample)}

    def reset(self) -> None:
        """Forget everything (a client host after sending its sample)."""
        del self._sample[:]
        self.count, self.sum, self.max = 0, 0.0, 0.0

    def merge(self, count: int, total: float, maximum: float,
              values: Sequence[float]) -> None:
        """Add ``count`` durations summing to ``total`` (largest ``maximum``) of which
        ``values`` is a uniform sample.

        The result is again a uniform sample of everything: of the final
        ``capacity`` slots, a share ``count / (self.count + count)`` (rounded
        at random) is drawn from ``values`` (with replacement if it has
        fewer), the rest kept at random from this sample. Costs
        ``O(k + len(values))`` for the ``k`` slots it draws (at most
        ``capacity``, whatever ``count`` claims).
        """
        vals = [float(v) for v in values if 0.0 <= v < _INF]
        if count <= 0 or not vals:
            return
        rng, cap, n = self._rng, self._capacity, self.count
        if n + count <= cap:
            new = vals if len(vals) == count else rng.choices(vals, k=count)
            self._sample.extend(new)
        else:
            share = cap * count / (n + count)
            k = min(cap, int(share) + (rng.random() < share - int(share)))
            keep = cap - k
            if keep > len(self._sample):
                keep = len(self._sample)
                k = cap - keep
            new = rng.sample(vals, k) if k <= len(vals) else rng.choices(vals, k=k)
            # Keep a uniform subset of ``keep``: the new values overwrite as
            # many slots, drawn at random, as must go, and the rest are
            # appended. O(k): a host's batch every 0.25 s had cost O(capacity),
            # a 2 ms stall of the server's loop each time.
            sample = self._sample
            drop = len(sample) - keep
            for j, v in zip(rng.sample(range(len(sample)), drop), new, strict=False):
                sample[j] = v
            sample.extend(new[drop:])
        self.count = n + count
        self.sum += float(total)
        self.max = max(self.max, float(maximum), max(vals))


def _s(x: float) -> float:
    """Seconds, to the nanosecond (a JSON-friendly float)."""
    return round(float(x), 9)


class PhaseStats:
    """Named :class:`Durations` (``<phase>.<part>``, e.g. :data:`PHASES`).

    The server keeps one for the summary's ``phases``; each client host keeps
    one of its own phases (:data:`fedsim.wire.messages.HOST_PHASES`), sends its
    samples to the server with each event batch and starts afresh
    (:meth:`take`).
    """

    def __init__(self, names: Iterable[str] = PHASES, capacity: int = 4096) -> None:
        self._d = {name: Durations(capacity, seed=i) for i, name in enumerate(names)}

    def __getitem__(self, name: str) -> Durations:
        return self._d[name]

    @property
    def names(self) -> tuple[str, ...]:
        """Every name, in order."""
        return tuple(self._d)

    def add(self, name: str, seconds: float) -> None:
        """Record one duration of ``name``."""
        self._d[name].add(seconds)

    def take(self) -> list[tuple[str, dict[str, Any]]]:
        """The :meth:`Durations.export` of each non-empty sample, which then starts afresh."""
        out = []
        for name, d in self._d.items():
            if d.count:
                out.append((name, d.export()))
                d.reset()
        return out

    def summary(self) -> dict[str, dict[str, dict[str, float | int | None]]]:
        """``{phase: {part: Durations.summary()}}``."""
        out: dict[str, dict[str, dict[str, float | int | None]]] = {}
        for name, d in self._d.items():
            phase, _, part = name.partition(".")
            out.setdefault(phase, {})[part] = d.summary()
        return out

    def state(self) -> dict[str, Any]:
        """Plain data for a checkpoint."""
        return {name: d.export() for name, d in self._d.items()}

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state` (names it does not know are skipped)."""
        for name, s in state.items():
            if name in self._d:
                self._d[name].merge(int(s["count"]), float(s["sum"]), float(s["max"]),
                                    s["values"])
