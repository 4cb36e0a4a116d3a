"""AsyncFedED server, written out as in the paper.

Wang et al., "AsyncFedED", Algorithm 1 with eqs. (5)-(8), read as R-AF2 and
R-AF3 of docs/algorithms.md#asyncfeded say::

    S4  x_base  <- GMIS[t_base]
    S5  gamma   <- ||x_t - x_base|| / ||Delta_i||
    S6  eta_g   <- lambda / (gamma + epsilon)
    S7  x_{t+1} <- x_t + eta_g * Delta_i
    S8  GMIS[t+1] <- x_{t+1} ; t <- t + 1
    S9  K_next  <- K_used + floor((gamma_bar - gamma) * kappa)      (paper)
        K_next  <- K_used + (gamma_bar - gamma) * kappa             (accumulate)
    S10 K_next  <- max(K_next, K_min)  (and min(., K_max) if given)

GMIS keeps every model, as the paper does (no eviction). Models are lists of
Python floats and every norm and update loops over coordinates. Nothing here
imports fedsim.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence


def norm(v: Sequence[float]) -> float:
    """||v||: square root of the sum of squares, one coordinate at a time."""
    total = 0.0
    for value in v:
        total += value * value
    return math.sqrt(total)


def distance(u: Sequence[float], v: Sequence[float]) -> float:
    """||u - v||."""
    return norm([u[j] - v[j] for j in range(len(u))])


class AsyncFedEDServer:
    """Algorithm 1's server: the global model, GMIS and K per client."""

    def __init__(
        self,
        x1: Iterable[float],
        lam: float,
        epsilon: float,
        gamma_bar: float,
        kappa: float,
        k_initial: float = 10,
        rounding: str = "floor",
        k_min: float = 1,
        k_max: float | None = None,
        t1: int = 1,
    ) -> None:
        self.x = [float(v) for v in x1]
        self.t = t1
        self.gmis = {t1: list(self.x)}
        self.lam = lam
        self.epsilon = epsilon
        self.gamma_bar = gamma_bar
        self.kappa = kappa
        self.k_initial = k_initial
        self.rounding = rounding
        self.k_min = k_min
        self.k_max = k_max
        self.K: dict[int, float] = {}

    def update(
        self, client: int, delta: Iterable[float], t_base: int
    ) -> tuple[float, float, float] | None:
        """Lines S3-S10 for one upload; None when ||Delta|| = 0."""
        delta = [float(v) for v in delta]
        x_base = self.gmis[t_base]
        if norm(delta) == 0.0:
            return None
        gamma = distance(self.x, x_base) / norm(delta)
        eta_g = self.lam / (gamma + self.epsilon)
        x_next = []
        for j in range(len(self.x)):
            x_next.append(self.x[j] + eta_g * delta[j])
        self.t = self.t + 1
        self.gmis[self.t] = x_next
        self.x = x_next
        k_used = self.K.get(client, self.k_initial)
        if self.rounding == "floor":
            k_next = k_used + math.floor((self.gamma_bar - gamma) * self.kappa)
        elif self.rounding == "accumulate":
            k_next = k_used + (self.gamma_bar - gamma) * self.kappa
        else:
            raise ValueError(self.rounding)
        k_next = max(k_next, self.k_min)
        if self.k_max is not None:
            k_next = min(k_next, self.k_max)
        self.K[client] = k_next
        return gamma, eta_g, k_next
