"""FedOpt servers, written out as in the papers.

Reddi et al., "Adaptive Federated Optimization" (ICLR 2021), Algorithm 2,
server side, for FedAdagrad, FedYogi and FedAdam::

    Delta_t = sum_{i in S} w_i (y_i - x_t)
    m_t = beta1 m_{t-1} + (1 - beta1) Delta_t
    v_t = v_{t-1} + Delta_t^2                                         (FedAdagrad)
    v_t = v_{t-1} - (1 - beta2) Delta_t^2 sign(v_{t-1} - Delta_t^2)   (FedYogi)
    v_t = beta2 v_{t-1} + (1 - beta2) Delta_t^2                       (FedAdam)
    x_{t+1} = x_t + eta m_t / (sqrt(v_t) + tau)

with m_{-1} = 0, v_{-1} = tau^2 and no bias correction. Hsu, Qi and Brown's
FedAvgM (server momentum beta)::

    v_t = beta v_{t-1} + Delta_t ,   v_{-1} = 0
    x_{t+1} = x_t + eta v_t

w_i = 1/|S| ("uniform", Reddi et al.'s mean) or n_i / sum_j n_j ("samples").
Plain Python floats, one coordinate and one client at a time. Nothing here
imports fedsim.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence


def sign(a: float) -> float:
    """sign(a): -1, 0 or 1."""
    if a > 0:
        return 1.0
    if a < 0:
        return -1.0
    return 0.0


def weights(num_samples: Sequence[int], weighting: str = "uniform") -> list[float]:
    """The w_i of the rule above."""
    if weighting == "samples":
        total = 0
        for n in num_samples:
            total += n
        return [n / total for n in num_samples]
    if weighting == "uniform":
        return [1.0 / len(num_samples) for _ in num_samples]
    raise ValueError(weighting)


class FedOptServer:
    """Algorithm 2's server (adagrad, yogi, adam) or FedAvgM's (avgm)."""

    def __init__(
        self,
        x0: Iterable[float],
        optimizer: str,
        eta: float,
        beta1: float = 0.9,
        beta2: float = 0.99,
        tau: float = 1e-3,
        beta: float = 0.9,
        weighting: str = "uniform",
    ) -> None:
        self.x = [float(a) for a in x0]
        self.optimizer = optimizer
        self.eta = eta
        self.beta1 = beta1
        self.beta2 = beta2
        self.tau = tau
        self.beta = beta
        self.weighting = weighting
        self.t = 0
        # m_{-1} = 0 (FedAvgM's v_{-1} = 0 too); v_{-1} = tau^2.
        self.m = [0.0 for _ in self.x]
        self.v = [tau * tau for _ in self.x]

    def round(self, ys: Sequence[Sequence[float]], num_samples: Sequence[int]) -> list[float]:
        """One round over the clients' models y_i; return x_{t+1}."""
        w = weights(num_samples, self.weighting)
        for j in range(len(self.x)):
            delta = 0.0
            for i in range(len(ys)):
                delta += w[i] * (ys[i][j] - self.x[j])
            if self.optimizer == "avgm":
                self.m[j] = self.beta * self.m[j] + delta
                self.x[j] = self.x[j] + self.eta * self.m[j]
                continue
            self.m[j] = self.beta1 * self.m[j] + (1.0 - self.beta1) * delta
            d2 = delta * delta
            if self.optimizer == "adagrad":
                self.v[j] = self.v[j] + d2
            elif self.optimizer == "yogi":
                self.v[j] = self.v[j] - (1.0 - self.beta2) * d2 * sign(self.v[j] - d2)
            elif self.optimizer == "adam":
                self.v[j] = self.beta2 * self.v[j] + (1.0 - self.beta2) * d2
            else:
                raise ValueError(self.optimizer)
            self.x[j] = self.x[j] + self.eta * self.m[j] / (math.sqrt(self.v[j]) + self.tau)
        self.t = self.t + 1
        return list(self.x)
