"""Marginal delay distributions with inverse CDFs.

The families and how they compare with tc netem's tables: docs/netem.md#delay-and-jitter.

Conventions (all values in emulated **seconds**):

* Every distribution is a frozen dataclass with ``ppf(u)`` (inverse CDF),
  ``cdf(x)``, ``moments() -> (mean, std)`` of what is actually sampled, and
  ``sample(rng, size)``.
* The netem-style families are ``mean + jitter * S`` for a standardised
  variable ``S`` taken from netem's table generators (iproute2 ``netem/*.c``),
  **clipped** (not renormalised) to the table's range, exactly as netem's s16
  tables clip, and then clipped at 0 because a delay cannot be negative (netem
  sends a packet whose time_to_send is in the past at once). So ``mean`` is the
  centre and ``jitter`` the scale in netem's sense; ``moments()`` gives the true
  mean and std after clipping. The clip at 0 only matters when ``jitter`` is
  large compared with ``mean`` (thresholds below); it adds an atom at 0 and
  raises the mean.

============  ================================================  ==========
family        S (standardised)                                  clip of S
============  ================================================  ==========
constant      0                                                 -
uniform       U(-1, 1) (netem's default when no table is        [-1, 1]
              loaded); std = jitter / sqrt(3);
              no 0-clip if jitter <= mean
normal        N(0, 1) (``normal.c``); std = jitter (to 1e-4);   [-4, 4]
              no 0-clip if jitter <= mean / 4
pareto        (1/(1-u)^(1/3) - 1.5) * 4/3, a = 3                [-2/3, 4]
              (``pareto.c``); atom of 1.1 % at +4;
              mean = -0.033 * jitter, std = 0.82 * jitter;
              no 0-clip if jitter <= 1.5 mean
paretonormal  0.25 Phi^-1(u) + 0.75 min(pareto(u), 4), the      [-4, 4]
              comonotone quantile mix of ``paretonormal.c``;
              mean = -0.025 * jitter, std = 0.83 * jitter;
              no 0-clip if jitter <= mean / 2.6
============  ================================================  ==========

Two extra families: :class:`LogNormal` (``mean``/``jitter`` are its exact mean
and standard deviation; positive, never clipped; useful for long-tailed Wi-Fi
delay and device step times) and :class:`Empirical` (a table of samples,
inverse CDF by linear interpolation between order statistics).

The correlated sampler that keeps these marginals while correlating successive
draws is :class:`~netem.delayprocess.DelayProcess` (it depends on this module,
never the reverse); the standard normal helpers :func:`~netem.stdnormal.norm_cdf`
and :func:`~netem.stdnormal.norm_ppf` live in :mod:`netem.stdnormal` and the
table class :class:`~netem.empirical.Empirical` in :mod:`netem.empirical`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, Protocol, runtime_checkable

import numpy as np
from numpy.typing import ArrayLike, NDArray

from netem import _check
from netem.empirical import Empirical
from netem.stdnormal import norm_cdf, norm_ppf, norm_ppf1

__all__ = [
    "DISTRIBUTIONS",
    "Constant",
    "Dist",
    "LogNormal",
    "Normal",
    "Pareto",
    "ParetoNormal",
    "Uniform",
    "make_dist",
    "scalar_ppf",
]

FArray = NDArray[np.float64]

DISTRIBUTIONS = ("constant", "uniform", "normal", "pareto", "paretonormal", "lognormal")


@runtime_checkable
class Dist(Protocol):
    """What the link model needs from a delay distribution."""

    def ppf(self, u: ArrayLike) -> FArray:
        """Inverse CDF at ``u`` in [0, 1] (seconds)."""
        ...

    def cdf(self, x: ArrayLike) -> FArray:
        """CDF at ``x`` seconds."""
        ...

    def moments(self) -> tuple[float, float]:
        """``(mean, std)`` of the sampled values (after any clipping)."""
        ...

    def sample(self, rng: np.random.Generator, size: int) -> FArray:
        """``size`` independent draws."""
        ...


_MOMENT_POINTS = 1 << 15


def _midpoints(n: int = _MOMENT_POINTS) -> FArray:
    return (np.arange(n, dtype=np.float64) + 0.5) / n


def _moments_of(x: FArray) -> tuple[float, float]:
    m = float(np.mean(x))
    return m, float(np.sqrt(max(float(np.mean((x - m) ** 2)), 0.0)))


def _numeric_moments(
    ppf_fn: Callable[[FArray], FArray], n: int = _MOMENT_POINTS
) -> tuple[float, float]:
    # Midpoint rule on the (bounded, monotone) inverse CDF: E[X] = int_0^1 ppf.
    return _moments_of(ppf_fn(_midpoints(n)))


class _Scaled:
    """``max(0, mean + jitter * clip(S, LO, HI))`` for a standardised ``S``."""

    __slots__ = ()
    mean: float
    jitter: float
    LO: ClassVar[float]
    HI: ClassVar[float]

    def _validate(self) -> None:
        name = type(self).__name__
        _check.nonneg(name, "mean", self.mean, " s")
        _check.nonneg(name, "jitter", self.jitter, " s")

    @staticmethod
    def _s_ppf(u: FArray) -> FArray:
        raise NotImplementedError

    def _s_cdf(self, s: FArray) -> FArray:
        raise NotImplementedError

    def ppf(self, u: ArrayLike) -> FArray:
        ua = np.asarray(u, dtype=np.float64)
        if self.jitter == 0.0:
            return np.full(ua.shape, self.mean)
        s = np.clip(self._s_ppf(ua), self.LO, self.HI)
        return np.maximum(self.mean + self.jitter * s, 0.0)

    def cdf(self, x: ArrayLike) -> FArray:
        xa = np.asarray(x, dtype=np.float64)
        if self.jitter == 0.0:
            return np.where(xa >= self.mean, 1.0, 0.0)
        lower = max(0.0, self.mean + self.jitter * self.LO)
        upper = self.mean + self.jitter * self.HI
        s = np.clip((xa - self.mean) / self.jitter, self.LO, self.HI)
        f = self._s_cdf(s)
        return np.where(xa < lower, 0.0, np.where(xa >= upper, 1.0, f))

    def moments(self) -> tuple[float, float]:
        return _cached_moments(self)

    def sample(self, rng: np.random.Generator, size: int) -> FArray:
        return self.ppf(rng.random(size))


@functools.lru_cache(maxsize=512)
def _cached_moments(d: _Scaled) -> tuple[float, float]:
    # ppf(u) = max(mean + jitter * clip(S(u)), 0) on the midpoint grid, with
    # clip(S(u)) taken from the family's grid: the same values as
    # _numeric_moments(d.ppf) (same operations on the same numbers) for
    # 1/100 to 1/1000 of the cost (norm_ppf is elementwise Python), which
    # made 10,000 links with distinct delays take 20 s to build.
    # In place, commuted (IEEE + and * are commutative): 50 us, not 200.
    if d.jitter == 0.0 or type(d) not in _SCALAR_S:  # a subclass: its own ppf
        return _numeric_moments(d.ppf)
    x = np.multiply(_standard_grid(type(d)), d.jitter)
    x += d.mean
    np.maximum(x, 0.0, out=x)
    m = float(np.mean(x))
    x -= m
    np.square(x, out=x)  # what (x - m) ** 2 computes
    return m, float(np.sqrt(max(float(np.mean(x)), 0.0)))


_GRIDS: dict[type, FArray] = {}


def _standard_grid(family: type[_Scaled]) -> FArray:
    """``clip(S(u), LO, HI)`` on the moments' midpoint grid (read-only, one per family)."""
    s = _GRIDS.get(family)
    if s is None:
        s = _GRIDS[family] = np.clip(family._s_ppf(_midpoints()), family.LO, family.HI)
        s.setflags(write=False)
    return s


@dataclass(frozen=True, slots=True)
class Constant(_Scaled):
    """Always ``mean`` seconds."""

    mean: float
    jitter: float = 0.0
    LO: ClassVar[float] = 0.0
    HI: ClassVar[float] = 0.0

    def __post_init__(self) -> None:
        self._validate()
        if self.jitter != 0.0:
            _check.fail("Constant", "jitter", self.jitter, "must be 0 for a constant")

    def moments(self) -> tuple[float, float]:
        return (self.mean, 0.0)


@dataclass(frozen=True, slots=True)
class Uniform(_Scaled):
    """``U(mean - jitter, mean + jitter)``, netem's no-table default."""

    mean: float
    jitter: float
    LO: ClassVar[float] = -1.0
    HI: ClassVar[float] = 1.0

    def __post_init__(self) -> None:
        self._validate()

    @staticmethod
    def _s_ppf(u: FArray) -> FArray:
        return 2.0 * u - 1.0

    def _s_cdf(self, s: FArray) -> FArray:
        return (s + 1.0) / 2.0


@dataclass(frozen=True, slots=True)
class Normal(_Scaled):
    """``N(mean, jitter^2)`` clipped to ``mean +- 4 jitter`` (``normal.c``) and at 0."""

    mean: float
    jitter: float
    LO: ClassVar[float] = -4.0
    HI: ClassVar[float] = 4.0

    def __post_init__(self) -> None:
        self._validate()

    @staticmethod
    def _s_ppf(u: FArray) -> FArray:
        return norm_ppf(u)

    def _s_cdf(self, s: FArray) -> FArray:
        return norm_cdf(s)


def _pareto_s_ppf(u: FArray) -> FArray:
    # pareto.c: (1/v^(1/a) - 1.5) * 4/3 with v = 1 - u, a = 3.
    with np.errstate(divide="ignore"):
        v = np.maximum(1.0 - u, 0.0)
        return (np.power(v, -1.0 / 3.0) - 1.5) * (4.0 / 3.0)


@dataclass(frozen=True, slots=True)
class Pareto(_Scaled):
    """netem's ``pareto`` table: shape a = 3, shifted to mean 0, clipped at +4."""

    mean: float
    jitter: float
    LO: ClassVar[float] = -2.0 / 3.0
    HI: ClassVar[float] = 4.0

    def __post_init__(self) -> None:
        self._validate()

    @staticmethod
    def _s_ppf(u: FArray) -> FArray:
        return _pareto_s_ppf(u)

    def _s_cdf(self, s: FArray) -> FArray:
        y = np.maximum(1.5 + 0.75 * s, 1.0)
        return 1.0 - np.power(y, -3.0)


@functools.cache
def _paretonormal_table() -> tuple[FArray, FArray]:
    u = np.linspace(0.0, 1.0, (1 << 16) + 1)
    u[0], u[-1] = 1e-15, 1.0 - 1e-15
    return _paretonormal_s_ppf(u), u


def _paretonormal_s_ppf(u: FArray) -> FArray:
    return 0.25 * norm_ppf(u) + 0.75 * np.minimum(_pareto_s_ppf(u), 4.0)


@dataclass(frozen=True, slots=True)
class ParetoNormal(_Scaled):
    """netem's ``paretonormal``: ``.25 * normal + .75 * pareto`` quantile-wise.

    ``paretonormal.c`` adds the two tables entry by entry (same u), so the
    result is the comonotone mix of the quantile functions, not a mixture
    of distributions. Its CDF is computed by interpolating a 65,537-point
    table of the (strictly increasing) quantile function.
    """

    mean: float
    jitter: float
    LO: ClassVar[float] = -4.0
    HI: ClassVar[float] = 4.0

    def __post_init__(self) -> None:
        self._validate()

    @staticmethod
    def _s_ppf(u: FArray) -> FArray:
        return _paretonormal_s_ppf(u)

    def _s_cdf(self, s: FArray) -> FArray:
        xs, us = _paretonormal_table()
        return np.asarray(np.interp(s, xs, us, left=0.0, right=1.0), dtype=np.float64)


@dataclass(frozen=True, slots=True)
class LogNormal:
    """Log-normal with exact mean ``mean`` and standard deviation ``jitter``.

    ``sigma^2 = ln(1 + (jitter/mean)^2)``, ``mu = ln(mean) - sigma^2 / 2``.
    Not a netem family; useful for long-tailed delays and step times
    (FedScale's ``get_completion_time_lognormal``).
    """

    mean: float
    jitter: float

    def __post_init__(self) -> None:
        _check.nonneg("LogNormal", "mean", self.mean, " s")
        _check.nonneg("LogNormal", "jitter", self.jitter, " s")
        if self.jitter > 0 and self.mean == 0:
            _check.fail("LogNormal", "mean", self.mean, "must be > 0 when jitter > 0")

    def _params(self) -> tuple[float, float]:
        s2 = math.log1p((self.jitter / self.mean) ** 2)
        return math.log(self.mean) - s2 / 2.0, math.sqrt(s2)

    def ppf(self, u: ArrayLike) -> FArray:
        ua = np.asarray(u, dtype=np.float64)
        if self.jitter == 0.0:
            return np.full(ua.shape, self.mean)
        mu, sigma = self._params()
        return np.exp(mu + sigma * norm_ppf(ua))

    def cdf(self, x: ArrayLike) -> FArray:
        xa = np.asarray(x, dtype=np.float64)
        if self.jitter == 0.0:
            return np.where(xa >= self.mean, 1.0, 0.0)
        mu, sigma = self._params()
        with np.errstate(divide="ignore"):
            z = (np.log(np.maximum(xa, 0.0)) - mu) / sigma
        return norm_cdf(z)

    def moments(self) -> tuple[float, float]:
        return (self.mean, self.jitter)

    def sample(self, rng: np.random.Generator, size: int) -> FArray:
        return self.ppf(rng.random(size))


def make_dist(
    name: str, mean: float, jitter: float, table: Empirical | None = None
) -> Dist:
    """Build a distribution from netem-style ``(name, mean, jitter)``.

    ``jitter == 0`` always gives :class:`Constant`. ``name == "empirical"``
    needs ``table`` and rescales it to ``(mean, jitter)``.
    """
    if jitter == 0 and name != "empirical":
        return Constant(mean)
    families: dict[str, type] = {
        "constant": Constant,
        "uniform": Uniform,
        "normal": Normal,
        "pareto": Pareto,
        "paretonormal": ParetoNormal,
        "lognormal": LogNormal,
    }
    if name == "empirical":
        if table is None:
            raise ValueError("make_dist.table = None: 'empirical' needs an Empirical")
        return table.rescaled(mean, jitter)
    _check.choice("make_dist", "name", name, (*DISTRIBUTIONS, "empirical"))
    d: Dist = families[name](mean, jitter)
    return d



# -- one value at a time -------------------------------------------------------
_THIRD = -1.0 / 3.0


def _pareto_s1(u: float) -> float:
    # _pareto_s_ppf of one float; np.power itself (numpy may use its own SIMD
    # kernel for it, which need not agree with libm's pow to the last ulp).
    v = 1.0 - u
    v = v if v >= 0.0 else 0.0
    p = math.inf if v == 0.0 else float(np.power(v, _THIRD))
    return (p - 1.5) * (4.0 / 3.0)


def _paretonormal_s1(u: float) -> float:
    p = _pareto_s1(u)
    return 0.25 * norm_ppf1(u) + 0.75 * (p if p <= 4.0 else 4.0)


_SCALAR_S: dict[type, Callable[[float], float]] = {}  # filled below the classes


def scalar_ppf(d: Dist) -> Callable[[float], float]:
    """``u -> float(d.ppf(u))`` for one ``u`` in [0, 1], as a plain function.

    :class:`~netem.delayprocess.DelayProcess` draws one delay per message;
    ``ppf`` on a 0-d array spent about 10 us of numpy call overhead on it.
    For the netem families (and :class:`LogNormal`) this function does the
    same IEEE operations on Python floats, so the value is the same to the
    last bit (tests/netem/test_link_pinned.py pins it); any other
    distribution (:class:`~netem.empirical.Empirical`, a subclass, a user's
    ``Dist``) falls back to ``float(d.ppf(u))``.
    """
    kind = type(d)
    if kind is LogNormal:
        assert isinstance(d, LogNormal)
        if d.jitter == 0.0:
            c = float(d.mean)
            return lambda u: c
        mu, sigma = d._params()
        return lambda u: float(np.exp(mu + sigma * norm_ppf1(u)))
    s_of = _SCALAR_S.get(kind)
    if s_of is None or not isinstance(d, _Scaled):
        return lambda u: float(d.ppf(u))
    mean, jitter, lo, hi = d.mean, d.jitter, d.LO, d.HI
    if jitter == 0.0:
        c = float(mean)
        return lambda u: c

    def ppf1(u: float) -> float:
        s = s_of(u)
        s = lo if s < lo else hi if s > hi else s  # np.clip
        x = mean + jitter * s
        return x if x >= 0.0 else 0.0  # np.maximum(x, 0.0)

    return ppf1


_SCALAR_S.update(
    {
        Constant: lambda u: 0.0,
        Uniform: lambda u: 2.0 * u - 1.0,
        Normal: norm_ppf1,
        Pareto: _pareto_s1,
        ParetoNormal: _paretonormal_s1,
    }
)
