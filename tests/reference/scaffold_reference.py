"""SCAFFOLD written out from Karimireddy et al. 2020, Algorithm 1 (docs/algorithms.md#scaffold).

    client i:  y = x ;  for k = 1..K:  y = y - eta_l * (g_i(y) - c_i + c + wd * y)
               option I:   c_i+ = g_i(x)   (gradient over all local data at x)
               option II:  c_i+ = c_i - c + (1 / (K eta_l)) (x - y)
               send (y - x, c_i+ - c_i) ;  c_i = c_i+
    server:    x = x + eta_g * (1/|S|) sum_i (y_i - x)
               c = c + (|S| / N) * (1/|S|) sum_i (c_i+ - c_i)

The model is linear least squares, ``pred = w . x + b`` with the mean squared
error; parameters ``[w_1 .. w_d, b]``; gradient by hand. Plain Python floats.
"""

from __future__ import annotations

from collections.abc import Sequence


def least_squares(
    theta: Sequence[float], xs: Sequence[Sequence[float]], ys: Sequence[float]
) -> tuple[float, list[float]]:
    """Mean of (w . x + b - y)^2 over the batch, and its gradient."""
    dim = len(theta) - 1
    batch = len(xs)
    grad = [0.0] * (dim + 1)
    loss = 0.0
    for x, y in zip(xs, ys, strict=True):
        r = theta[dim] - y
        for j in range(dim):
            r += theta[j] * x[j]
        loss += r * r
        for j in range(dim):
            grad[j] += 2.0 * r * x[j] / batch
        grad[dim] += 2.0 * r / batch
    return loss / batch, grad


def scaffold_client(
    x: Sequence[float],
    c: Sequence[float],
    c_i: Sequence[float],
    xs: Sequence[Sequence[float]],
    ys: Sequence[float],
    batches: Sequence[Sequence[int]],
    lr: float,
    option: str = "II",
    weight_decay: float = 0.0,
) -> tuple[list[list[float]], list[float], list[float]]:
    """One local round. Returns (y after every step, y_K, c_i+)."""
    d = len(x)
    y = [float(v) for v in x]
    trace = []
    for idx in batches:
        _, g = least_squares(y, [xs[i] for i in idx], [ys[i] for i in idx])
        y = [y[j] - lr * (g[j] - c_i[j] + c[j] + weight_decay * y[j]) for j in range(d)]
        trace.append(list(y))
    if option == "I":
        _, c_new = least_squares(list(x), xs, ys)
    else:
        k_total = len(batches)
        c_new = [c_i[j] - c[j] + (x[j] - y[j]) / (k_total * lr) for j in range(d)]
    return trace, y, c_new


def scaffold_server(
    x: Sequence[float],
    c: Sequence[float],
    ys: Sequence[Sequence[float]],
    delta_cs: Sequence[Sequence[float]],
    server_lr: float,
    total_clients: int,
) -> tuple[list[float], list[float]]:
    """Return (x + eta_g mean(y_i - x), c + (|S|/N) mean(delta_c_i))."""
    d = len(x)
    s = len(ys)
    new_x = []
    new_c = []
    for j in range(d):
        dy = sum(y[j] - x[j] for y in ys) / s
        dc = sum(dc_i[j] for dc_i in delta_cs) / s
        new_x.append(x[j] + server_lr * dy)
        new_c.append(c[j] + (s / total_clients) * dc)
    return new_x, new_c
