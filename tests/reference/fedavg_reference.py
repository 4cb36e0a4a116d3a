"""FedAvg server step, written out as in docs/algorithms.md#fedavg-and-fedprox.

McMahan et al.; with a server learning rate eta_g:

    x <- x + eta_g * sum_{i in S} w_i (y_i - x),
    w_i = n_i / sum_{j in S} n_j      ("samples")   or   1 / |S|   ("uniform")

Plain Python floats, one coordinate and one client at a time.
"""

from __future__ import annotations

from collections.abc import Sequence


def weights(num_samples: Sequence[int], weighting: str = "samples") -> list[float]:
    """The w_i of the rule above."""
    if weighting == "samples":
        total = 0
        for n in num_samples:
            total += n
        return [n / total for n in num_samples]
    if weighting == "uniform":
        return [1.0 / len(num_samples) for _ in num_samples]
    raise ValueError(weighting)


def fedavg(
    x: Sequence[float],
    ys: Sequence[Sequence[float]],
    num_samples: Sequence[int],
    server_lr: float = 1.0,
    weighting: str = "samples",
) -> list[float]:
    """Return x + eta_g * sum_i w_i (y_i - x)."""
    w = weights(num_samples, weighting)
    out = []
    for j in range(len(x)):
        step = 0.0
        for i in range(len(ys)):
            step += w[i] * (ys[i][j] - x[j])
        out.append(x[j] + server_lr * step)
    return out
