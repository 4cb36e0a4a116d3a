"""Local training of FedAvg / FedProx / FedAsync clients, written out by hand.

The local problem (FedProx, Li et al.; FedAsync Algorithm 1, W5) is

    min_y  f_i(y) + (mu / 2) ||y - anchor||^2,

so one local step feeds the optimizer the gradient ``g + mu (y - anchor)``
(docs/algorithms.md#fedavg-and-fedprox). The client optimizers are the ones of
docs/algorithms.md#sgd-sgdm-adam-adagrad:

    SGD   y <- y - lr * g
    SGDM  u <- beta * u + g ;  y <- y - lr * u                  (PyTorch convention)
    Adam  m <- b1 m + (1 - b1) g ;  v <- b2 v + (1 - b2) g^2 ;
          y <- y - lr * (m / (1 - b1^k)) / (sqrt(v / (1 - b2^k)) + eps)

with L2 weight decay (when set) added to the gradient first, as in
``torch.optim``: g <- g + wd * y. The model is a bias-free linear classifier
``logits = W x`` with mean softmax cross-entropy, its gradient derived by
hand. Parameters are a flat list of floats, W stored row by row (class by
class). Every loop runs over single floats.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def linear_softmax_ce(
    w: Sequence[float],
    xs: Sequence[Sequence[float]],
    labels: Sequence[int],
    num_classes: int,
) -> tuple[float, list[float]]:
    """Mean cross-entropy of ``softmax(W x)`` over a batch, and its gradient.

    d loss / d W[c][j] = (1/B) sum_b (p_b[c] - [c == y_b]) x_b[j].
    """
    dim = len(xs[0])
    batch = len(xs)
    grad = [0.0] * (num_classes * dim)
    loss = 0.0
    for x, y in zip(xs, labels, strict=True):
        logits = []
        for c in range(num_classes):
            z = 0.0
            for j in range(dim):
                z += w[c * dim + j] * x[j]
            logits.append(z)
        top = max(logits)
        exps = [math.exp(z - top) for z in logits]
        total = sum(exps)
        probs = [e / total for e in exps]
        loss += -math.log(probs[y])
        for c in range(num_classes):
            coeff = probs[c] - (1.0 if c == y else 0.0)
            for j in range(dim):
                grad[c * dim + j] += coeff * x[j] / batch
    return loss / batch, grad


def prox_gradient(
    g: Sequence[float], y: Sequence[float], anchor: Sequence[float], mu: float
) -> list[float]:
    """Gradient of f + (mu/2)||y - anchor||^2: g + mu (y - anchor)."""
    return [g[j] + mu * (y[j] - anchor[j]) for j in range(len(g))]


class SGD:
    """y <- y - lr * g (with momentum 0)."""

    def __init__(self, lr: float, weight_decay: float = 0.0) -> None:
        self.lr = lr
        self.weight_decay = weight_decay

    def step(self, y: list[float], g: Sequence[float]) -> list[float]:
        out = []
        for j in range(len(y)):
            gj = g[j] + self.weight_decay * y[j]
            out.append(y[j] - self.lr * gj)
        return out


class SGDM:
    """Heavy ball, PyTorch convention: u <- beta u + g; y <- y - lr u (u_0 = 0)."""

    def __init__(self, lr: float, beta: float, weight_decay: float = 0.0) -> None:
        self.lr = lr
        self.beta = beta
        self.weight_decay = weight_decay
        self.u: list[float] | None = None

    def step(self, y: list[float], g: Sequence[float]) -> list[float]:
        if self.u is None:
            self.u = [0.0] * len(y)
        out = []
        for j in range(len(y)):
            gj = g[j] + self.weight_decay * y[j]
            self.u[j] = self.beta * self.u[j] + gj
            out.append(y[j] - self.lr * self.u[j])
        return out


class Adam:
    """Adam (Kingma and Ba) with bias correction; k counts steps from 1."""

    def __init__(
        self,
        lr: float,
        beta1: float = 0.9,
        beta2: float = 0.999,
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ) -> None:
        self.lr = lr
        self.beta1 = beta1
        self.beta2 = beta2
        self.eps = eps
        self.weight_decay = weight_decay
        self.m: list[float] | None = None
        self.v: list[float] | None = None
        self.k = 0

    def step(self, y: list[float], g: Sequence[float]) -> list[float]:
        if self.m is None or self.v is None:
            self.m = [0.0] * len(y)
            self.v = [0.0] * len(y)
        self.k += 1
        out = []
        for j in range(len(y)):
            gj = g[j] + self.weight_decay * y[j]
            self.m[j] = self.beta1 * self.m[j] + (1.0 - self.beta1) * gj
            self.v[j] = self.beta2 * self.v[j] + (1.0 - self.beta2) * gj * gj
            m_hat = self.m[j] / (1.0 - self.beta1**self.k)
            v_hat = self.v[j] / (1.0 - self.beta2**self.k)
            out.append(y[j] - self.lr * m_hat / (math.sqrt(v_hat) + self.eps))
        return out


def make_optimizer(
    name: str,
    lr: float,
    momentum: float = 0.9,
    beta1: float = 0.9,
    beta2: float = 0.999,
    eps: float = 1e-8,
    weight_decay: float = 0.0,
) -> SGD | SGDM | Adam:
    """A fresh reference optimizer by fedsim's names (sgd, sgdm, adam)."""
    if name == "sgd":
        return SGD(lr, weight_decay)
    if name == "sgdm":
        return SGDM(lr, momentum, weight_decay)
    if name == "adam":
        return Adam(lr, beta1, beta2, eps, weight_decay)
    raise ValueError(name)


def local_train(
    w0: Sequence[float],
    xs: Sequence[Sequence[float]],
    labels: Sequence[int],
    num_classes: int,
    batches: Sequence[Sequence[int]],
    optimizer: SGD | SGDM | Adam,
    prox_mu: float = 0.0,
) -> list[tuple[list[float], float]]:
    """Run one local step per batch of indices, from ``w0`` (also the anchor).

    Returns, after every step, the parameters and the loss of that step's
    minibatch at the parameters it started from.
    """
    anchor = [float(v) for v in w0]
    y = list(anchor)
    trajectory = []
    for idx in batches:
        loss, g = linear_softmax_ce(
            y, [xs[i] for i in idx], [labels[i] for i in idx], num_classes
        )
        if prox_mu > 0:
            g = prox_gradient(g, y, anchor, prox_mu)
        y = optimizer.step(y, g)
        trajectory.append((list(y), loss))
    return trajectory
