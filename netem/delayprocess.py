"""Correlated delay sampler that keeps the configured marginal exactly.

Why it exists, and why tc netem's delay correlation does nothing:
docs/netem.md#correlation. The marginal distributions themselves are in
:mod:`netem.dist`; this module depends on it (for the :class:`~netem.dist.Dist`
protocol), never the reverse.

Correlation (tc netem's ``get_crandom`` correlation vanishes after its modulo
or table lookup): :class:`DelayProcess` uses a Gaussian-copula AR(1),
``z_n = rho z_{n-1} + sqrt(1 - rho^2) eps_n``, ``u_n = Phi(z_n)``,
``delay_n = ppf(u_n)``. Every ``z_n`` is exactly N(0, 1), so every delay has
exactly the configured marginal whatever ``rho`` is; lag-1 correlation of the
delays is close to ``rho`` (exactly ``rho`` for the normal family).
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

from netem import _check
from netem.dist import Dist, scalar_ppf
from netem.stdnormal import norm_cdf

__all__ = ["DelayProcess"]

FArray = NDArray[np.float64]

_SQRT1_2 = math.sqrt(0.5)


class DelayProcess:
    """Correlated delay sampler with an exact marginal (Gaussian-copula AR(1)).

    ``z_0 = eps_0``; ``z_n = rho z_{n-1} + sqrt(1 - rho^2) eps_n``;
    ``delay_n = dist.ppf(Phi(z_n))``. One standard normal is consumed per
    draw whatever ``rho`` and ``dist`` are, so changing the distribution
    mid-run (:meth:`set_dist`) keeps the stream aligned and the correlation
    state.

    The process owns its stream: it reads the normals ahead in blocks of
    :attr:`BLOCK` (a block costs about what one scalar draw does), which
    gives the same values in the same order as one draw per call (numpy's
    ``Generator.standard_normal(n)`` is ``n`` successive draws).

    Parameters
    ----------
    dist
        Marginal distribution of each delay.
    rho
        Lag-1 correlation of the latent Gaussian, in ``[0, 1)``.
    rng
        The process's own stream (see :func:`netem.rng.stream`), used by
        nothing else.
    """

    __slots__ = ("_buf", "_c", "_dist", "_ppf1", "_rng", "_z", "rho")

    BLOCK = 32

    def __init__(self, dist: Dist, rho: float, rng: np.random.Generator) -> None:
        _check.finite("DelayProcess", "rho", rho)
        if not 0.0 <= rho < 1.0:
            _check.fail("DelayProcess", "rho", rho, "must be in [0, 1)")
        self._dist = dist
        self._ppf1 = scalar_ppf(dist)
        self.rho = float(rho)
        self._c = math.sqrt(1.0 - self.rho * self.rho)
        self._rng = rng
        self._z: float | None = None
        self._buf: list[float] = []  # normals read ahead, next one last

    @property
    def dist(self) -> Dist:
        """The marginal distribution (change it with :meth:`set_dist`)."""
        return self._dist

    def set_dist(self, dist: Dist, rho: float | None = None) -> None:
        """Change the marginal (and optionally rho) without resetting the state."""
        if rho is not None and rho != self.rho:
            if not 0.0 <= rho < 1.0:
                _check.fail("DelayProcess", "rho", rho, "must be in [0, 1)")
            self.rho = float(rho)
            self._c = math.sqrt(1.0 - self.rho * self.rho)
        self._dist = dist
        self._ppf1 = scalar_ppf(dist)

    def next(self) -> float:
        """Draw the next delay (seconds)."""
        buf = self._buf
        if not buf:
            buf += reversed(self._rng.standard_normal(self.BLOCK).tolist())
        eps = buf.pop()
        prev = self._z
        z = eps if prev is None else self.rho * prev + self._c * eps
        self._z = z
        return self._ppf1(0.5 * math.erfc(-z * _SQRT1_2))

    def draw(self, n: int) -> FArray:
        """Draw the next ``n`` delays; same values as ``n`` calls of :meth:`next`."""
        buf = self._buf
        k = min(n, len(buf))
        eps = buf[len(buf) - k :][::-1]
        del buf[len(buf) - k :]
        if n > k:
            eps += self._rng.standard_normal(n - k).tolist()
        z = np.empty(n)
        prev = self._z
        rho, c = self.rho, self._c
        for i, e in enumerate(eps):
            prev = e if prev is None else rho * prev + c * e
            z[i] = prev
        self._z = prev
        return self._dist.ppf(norm_cdf(z))
