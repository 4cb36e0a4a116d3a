"""Empirical delay tables (netem ``maketable`` semantics), see :mod:`netem.dist`.

As tc netem's tables (iproute2's ``netem/README.distribution``: "a scaled,
translated, inverse to the cumulative distribution function"; ``maketable``
builds one from measured samples); see docs/netem.md#delay-and-jitter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from netem import _check

__all__ = ["Empirical"]

FArray = NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class Empirical:
    """An empirical delay table, inverse CDF by linear interpolation.

    The sorted values ``x_(0) <= ... <= x_(n-1)`` sit at probabilities
    ``k / (n - 1)``; ``ppf`` interpolates linearly between them, so ``ppf(0)``
    is the minimum and ``ppf(1)`` the maximum (no extrapolation).

    With ``mean`` and ``jitter`` both ``None`` (default) the values are used
    as they are (absolute one-way delays in seconds). With both set, the table
    is standardised to mean 0 and std 1 and mapped to ``mean + jitter * z``,
    then clipped at 0 -- netem's ``maketable`` semantics, so a measured
    shape can be moved and stretched.

    Parameters
    ----------
    values
        At least one finite sample; must be ``>= 0`` when used absolutely.
    """

    values: tuple[float, ...]
    mean: float | None = None
    jitter: float | None = None
    _xs: FArray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        vals = np.asarray(self.values, dtype=np.float64).ravel()
        if vals.size == 0:
            _check.fail("Empirical", "values", "()", "needs at least one sample")
        if not np.all(np.isfinite(vals)):
            _check.fail("Empirical", "values", "[...]", "all samples must be finite")
        if (self.mean is None) != (self.jitter is None):
            _check.fail(
                "Empirical", "jitter", self.jitter, "set mean and jitter together"
            )
        xs = np.sort(vals)
        if self.mean is None:
            if xs[0] < 0:
                _check.fail("Empirical", "values", float(xs[0]), "delays must be >= 0")
        elif self.jitter is not None:
            _check.nonneg("Empirical", "mean", self.mean, " s")
            _check.nonneg("Empirical", "jitter", self.jitter, " s")
            sd = float(np.std(xs))
            z = (xs - float(np.mean(xs))) / sd if sd > 0 else np.zeros_like(xs)
            xs = np.maximum(self.mean + self.jitter * z, 0.0)
        object.__setattr__(self, "values", tuple(float(v) for v in vals))
        object.__setattr__(self, "_xs", xs)

    @classmethod
    def from_file(
        cls, path: str | Path, unit: Literal["s", "ms", "us"] = "ms"
    ) -> Empirical:
        """Read one value per line (``#`` starts a comment); ``unit`` of the file.

        The default unit is milliseconds, the unit ``ping`` reports.
        """
        _check.choice("Empirical.from_file", "unit", unit, ("s", "ms", "us"))
        scale = {"s": 1.0, "ms": 1e-3, "us": 1e-6}[unit]
        vals: list[float] = []
        for lineno, line in enumerate(Path(path).read_text().splitlines(), 1):
            text = line.split("#", 1)[0].strip()
            if not text:
                continue
            try:
                vals.append(float(text) * scale)
            except ValueError:
                raise ValueError(f"{path}:{lineno}: {text!r} is not a number") from None
        return cls(tuple(vals))

    def rescaled(self, mean: float, jitter: float) -> Empirical:
        """The same shape with the given mean and std (netem ``maketable``)."""
        return Empirical(self.values, mean, jitter)

    def ppf(self, u: ArrayLike) -> FArray:
        ua = np.clip(np.asarray(u, dtype=np.float64), 0.0, 1.0)
        xs = self._xs
        if xs.size == 1:
            return np.full(ua.shape, xs[0])
        ps = np.linspace(0.0, 1.0, xs.size)
        return np.asarray(np.interp(ua, ps, xs), dtype=np.float64)

    def cdf(self, x: ArrayLike) -> FArray:
        xa = np.asarray(x, dtype=np.float64)
        xs = self._xs
        n = xs.size
        if n == 1:
            return np.where(xa >= xs[0], 1.0, 0.0)
        # i = number of table values <= x; interpolate on [x_(i-1), x_(i)).
        i = np.searchsorted(xs, xa, side="right")
        lo = np.clip(i - 1, 0, n - 1)
        hi = np.clip(i, 0, n - 1)
        gap = xs[hi] - xs[lo]
        with np.errstate(invalid="ignore", divide="ignore"):
            frac = np.where(gap > 0, (xa - xs[lo]) / gap, 0.0)
        f = (lo + frac) / (n - 1)
        return np.where(i == 0, 0.0, np.where(i >= n, 1.0, f))

    def moments(self) -> tuple[float, float]:
        # Exact for a piecewise-linear quantile function on equal steps.
        xs = self._xs
        if xs.size == 1:
            return float(xs[0]), 0.0
        a, b = xs[:-1], xs[1:]
        m = float(np.mean((a + b) / 2.0))
        ex2 = float(np.mean((a * a + a * b + b * b) / 3.0))
        return m, math.sqrt(max(ex2 - m * m, 0.0))

    def sample(self, rng: np.random.Generator, size: int) -> FArray:
        return self.ppf(rng.random(size))
