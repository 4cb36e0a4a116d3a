"""FedSpeed written out from Algorithm 1 (docs/algorithms.md#fedspeed), loop by loop.

Client i in round t, from x^t, with its persistent ghat_i (zero at first):

    for k = 0 .. K-1, on minibatch eps_k:
        g1     = grad F_i(x; eps_k)
        rho_k  = rho0 / (||g1|| + eps)          (normalized)  or  rho  (constant)
        xcheck = x + rho_k * g1
        g2     = grad F_i(xcheck; eps_k)
        gtilde = (1 - alpha) * g1 + alpha * g2
        x      = x - eta_l * (gtilde - ghat_i + (1/lambda) * (x - x^t) + wd * x)
    ghat_i = ghat_i - (1/lambda) * (x - x^t)
    send xhat_i = x - lambda * ghat_i

Server (paper):       x^{t+1} = (1/|S|) sum_{i in S} xhat_i
Server (FL-Simulator): h_i += x_{i,K} - x^t ;  x^{t+1} = mean_S x_{i,K} + (1/m) sum_all h_i

The model is linear least squares, ``pred = w . x + b`` with the mean squared
error over the batch; parameters are ``[w_1 .. w_d, b]`` and the gradient is
written by hand. Plain Python floats throughout.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def least_squares(
    theta: Sequence[float], xs: Sequence[Sequence[float]], ys: Sequence[float]
) -> tuple[float, list[float]]:
    """Mean of (w . x + b - y)^2 over the batch and its gradient.

    d/dw_j = (2/B) sum_b r_b x_b[j],  d/db = (2/B) sum_b r_b,  r_b = w . x_b + b - y_b.
    """
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


def fedspeed_client(
    x0: Sequence[float],
    ghat: Sequence[float],
    xs: Sequence[Sequence[float]],
    ys: Sequence[float],
    batches: Sequence[Sequence[int]],
    lr: float,
    lam: float,
    alpha: float,
    rho: float,
    mode: str = "normalized",
    eps: float = 1e-7,
    prox: bool = True,
    correction: bool = True,
    perturbation: bool = True,
    weight_decay: float = 0.0,
) -> tuple[list[dict[str, object]], list[float], list[float], list[float]]:
    """One local round. Returns (per-step trace, x_K, new ghat, upload).

    Each trace entry holds ``x`` after the step, ``gtilde``, ``loss`` (at the
    descent point) and ``scale`` (rho_k).
    """
    d = len(x0)
    x = [float(v) for v in x0]
    trace: list[dict[str, object]] = []
    for idx in batches:
        bx = [xs[i] for i in idx]
        by = [ys[i] for i in idx]
        loss, g1 = least_squares(x, bx, by)
        scale = 0.0
        if perturbation:
            norm = math.sqrt(sum(g * g for g in g1))
            scale = rho / (norm + eps) if mode == "normalized" else rho
            xcheck = [x[j] + scale * g1[j] for j in range(d)]
            _, g2 = least_squares(xcheck, bx, by)
            gtilde = [(1.0 - alpha) * g1[j] + alpha * g2[j] for j in range(d)]
        else:
            gtilde = list(g1)
        new = []
        for j in range(d):
            direction = gtilde[j]
            if correction:
                direction -= ghat[j]
            if prox:
                direction += (1.0 / lam) * (x[j] - x0[j])
            direction += weight_decay * x[j]
            new.append(x[j] - lr * direction)
        x = new
        trace.append({"x": list(x), "gtilde": gtilde, "loss": loss, "scale": scale})
    if correction:
        ghat_new = [ghat[j] - (1.0 / lam) * (x[j] - x0[j]) for j in range(d)]
        upload = [x[j] - lam * ghat_new[j] for j in range(d)]
    else:
        ghat_new = [float(v) for v in ghat]
        upload = list(x)
    return trace, x, ghat_new, upload


def closed_form(
    x0: Sequence[float],
    ghat_prev: Sequence[float],
    gtildes: Sequence[Sequence[float]],
    lr: float,
    lam: float,
) -> tuple[list[float], list[float], list[float]]:
    """Lemmas C.1 / C.2 of the paper: (Delta, ghat_new, xhat) from the gtilde sequence.

    gamma_k = (lr/lam)(1 - lr/lam)^(K-1-k), gamma = sum_k gamma_k = 1 - (1 - lr/lam)^K;
    Delta = -lam sum_k gamma_k gtilde_k + gamma lam ghat_prev;
    ghat_new = (1 - gamma) ghat_prev + sum_k gamma_k gtilde_k;
    xhat = x0 + 2 Delta - lam ghat_prev.
    """
    k_total = len(gtildes)
    q = lr / lam
    gammas = [q * (1.0 - q) ** (k_total - 1 - k) for k in range(k_total)]
    gamma = 1.0 - (1.0 - q) ** k_total
    d = len(x0)
    mix = [sum(gammas[k] * gtildes[k][j] for k in range(k_total)) for j in range(d)]
    delta = [-lam * mix[j] + gamma * lam * ghat_prev[j] for j in range(d)]
    ghat_new = [(1.0 - gamma) * ghat_prev[j] + mix[j] for j in range(d)]
    xhat = [x0[j] + 2.0 * delta[j] - lam * ghat_prev[j] for j in range(d)]
    return delta, ghat_new, xhat


def server_paper(uploads: Sequence[Sequence[float]]) -> list[float]:
    """x^{t+1} = (1/|S|) sum_i xhat_i."""
    d = len(uploads[0])
    return [sum(u[j] for u in uploads) / len(uploads) for j in range(d)]


def server_fl_simulator(
    x: Sequence[float],
    local_models: dict[int, Sequence[float]],
    h: dict[int, list[float]],
    total_clients: int,
) -> list[float]:
    """h_i += x_{i,K} - x (in place) ; return mean_S x_{i,K} + (1/m) sum_all h_i."""
    d = len(x)
    for i, xk in local_models.items():
        old = h.get(i, [0.0] * d)
        h[i] = [old[j] + xk[j] - x[j] for j in range(d)]
    out = []
    for j in range(d):
        avg = sum(xk[j] for xk in local_models.values()) / len(local_models)
        out.append(avg + sum(hi[j] for hi in h.values()) / total_clients)
    return out
