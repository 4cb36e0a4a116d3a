"""Delta-SGD's local loop (Kim et al.), written out by hand, float by float.

Algorithm 1, client side (docs/algorithms.md#delta-sgd), with the experiment changes
(delta inside the square root, R-DS2; both gradients on the same minibatch,
R-DS3) and the choices fedsim made from the authors' code:

    C1  x_0 <- x_t ; eta_0 <- eta0 ; theta_0 <- theta0
    C3  x_1 <- x_0 - eta_0 g_0                               (first_step "paper")
    C4  for k = 1..K-1:
    C6      g_k      <- grad f_i(x_k;     B_k)
    C7      g_prev_k <- grad f_i(x_{k-1}; B_k)              (batch_mode "same")
                        grad f_i(x_{k-1}; B_{k-1})           (batch_mode "previous")
    C8      num <- gamma ||x_k - x_{k-1}||
    C9      den <- 2 ||g_k - g_prev_k||
    C10     eta_k <- min(num / den, sqrt(1 + delta theta_{k-1}) eta_{k-1}) + eps
    C11     theta_k <- eta_k / eta_{k-1}
    C12     x_{k+1} <- x_k - eta_k g_k

Guards (docs/algorithms.md#delta-sgd-guards): ``eps`` (1e-8, the authors'
``lr_eps``) is added only when both norms are > 0; when either is 0 the step is
the growth term alone. A growth term that is infinite (theta_0 = inf) with no
curvature estimate keeps eta_{k-1}. ``eta_max`` caps every step.
``first_step = "code"`` starts the rule at k = 0 with x_{-1} = x_0 (so the
first step is growth-only: eta0 sqrt(1 + delta theta0)).

g is the gradient of the whole local objective: cross-entropy, plus the
FedProx term ``mu (x - anchor)`` and weight decay ``wd x`` when set. The model
is local_reference's bias-free linear classifier.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from local_reference import linear_softmax_ce, prox_gradient


def norm(v: Sequence[float]) -> float:
    """L2 norm of the whole vector."""
    total = 0.0
    for x in v:
        total += x * x
    return math.sqrt(total)


def step_size(
    num: float,
    den: float,
    eta_prev: float,
    theta_prev: float,
    delta: float,
    eps: float,
    eta_max: float,
) -> tuple[float, float]:
    """C10-C11 with the zero-denominator guards; returns (eta_k, theta_k)."""
    growth = eta_prev if delta == 0 else math.sqrt(1.0 + delta * theta_prev) * eta_prev
    eta = min(num / den, growth) + eps if num > 0 and den > 0 else growth
    if eta == math.inf:
        eta = eta_prev
    if eta > eta_max:
        eta = eta_max
    return eta, eta / eta_prev


def local_train(
    w0: Sequence[float],
    xs: Sequence[Sequence[float]],
    labels: Sequence[int],
    num_classes: int,
    batches: Sequence[Sequence[int]],
    *,
    eta0: float = 0.2,
    theta0: float = 1.0,
    gamma: float = 2.0,
    delta: float = 0.1,
    eps: float = 1e-8,
    eta_max: float = math.inf,
    first_step: str = "paper",
    batch_mode: str = "same",
    prox_mu: float = 0.0,
    weight_decay: float = 0.0,
) -> list[tuple[list[float], float, float]]:
    """One step per batch of indices, from ``w0`` (also the prox anchor).

    Returns, after every step, (x_{k+1}, eta_k, loss of B_k at x_k).
    """
    anchor = [float(v) for v in w0]

    def gradient(y: list[float], idx: Sequence[int]) -> tuple[float, list[float]]:
        loss, g = linear_softmax_ce(
            y, [xs[i] for i in idx], [labels[i] for i in idx], num_classes
        )
        if prox_mu > 0:
            g = prox_gradient(g, y, anchor, prox_mu)
        return loss, [g[j] + weight_decay * y[j] for j in range(len(g))]

    x = list(anchor)
    x_prev = list(anchor)  # x_{-1} = x_0 (used by first_step "code")
    g_last: list[float] | None = None
    eta, theta = eta0, theta0
    trajectory = []
    for k, idx in enumerate(batches):
        loss, g = gradient(x, idx)  # C6
        if k == 0 and first_step == "paper":
            eta_k, theta_k = min(eta0, eta_max), theta  # C3
        else:
            if batch_mode == "same":
                _, g_old = gradient(x_prev, idx)  # C7, same batch
            else:
                g_old = g_last if g_last is not None else g
            num = gamma * norm([x[j] - x_prev[j] for j in range(len(x))])  # C8
            den = 2.0 * norm([g[j] - g_old[j] for j in range(len(g))])  # C9
            eta_k, theta_k = step_size(num, den, eta, theta, delta, eps, eta_max)
        x_prev = x
        g_last = g
        x = [x[j] - eta_k * g[j] for j in range(len(x))]  # C12
        eta, theta = eta_k, theta_k
        trajectory.append((list(x), eta_k, loss))
    return trajectory
