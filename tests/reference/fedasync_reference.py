"""FedAsync server updater, written out as in the paper.

Xie, Koyejo and Gupta, "Asynchronous Federated Optimization", Algorithm 1
and the staleness functions of its Section 5 (docs/algorithms.md#fedasync):

    S7   d       <- staleness of the pushed model
    S8   alpha_t <- alpha * s(d)
    S9   x       <- (1 - alpha_t) * x + alpha_t * x_new
    S10  version <- version + 1

Models are plain lists of Python floats (float64) and every update loops
over elements one at a time. Nothing here imports fedsim.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def s_const(d: float) -> float:
    """FedAsync+Const: every update counts fully."""
    return 1.0


def s_poly(d: float, a: float) -> float:
    """FedAsync+Poly: s_a(d) = (d + 1)^(-a)."""
    return (d + 1.0) ** (-a)


def s_hinge(d: float, a: float, b: float) -> float:
    """FedAsync+Hinge: 1 for d <= b, else 1 / (a (d - b) + 1).

    The paper's formula; not FedLab's 1 / (a (d - b + 1))
    (docs/algorithms.md#fedasync-hinge-the-papers-formula).
    """
    if d <= b:
        return 1.0
    return 1.0 / (a * (d - b) + 1.0)


def s(fn: str, d: float, a: float, b: float) -> float:
    """Dispatch on the staleness function's name."""
    if fn == "const":
        return s_const(d)
    if fn == "poly":
        return s_poly(d, a)
    if fn == "hinge":
        return s_hinge(d, a, b)
    raise ValueError(fn)


def mix(x: Sequence[float], x_new: Sequence[float], alpha_t: float) -> list[float]:
    """Line S9, one coordinate at a time."""
    out = []
    for j in range(len(x)):
        out.append((1.0 - alpha_t) * x[j] + alpha_t * x_new[j])
    return out


class FedAsyncServer:
    """The updater of Algorithm 1 with its global model and version counter.

    ``literal_staleness=True`` is Algorithm 1 as printed: the updater at
    global epoch ``t`` (one more than the updates already applied) weights by
    ``s(t - tau)``, so even the freshest model has staleness 1. The default
    is the resolution R-FA1: staleness = updates already applied - tau.

    ``max_staleness`` discards updates whose (R-FA1) staleness exceeds it
    (the theory's bounded delay); ``alpha_decay`` multiplies alpha after
    every applied update (R-FA3).
    """

    def __init__(
        self,
        x0: Iterable[float],
        alpha: float,
        fn: str = "const",
        a: float = 0.5,
        b: float = 4.0,
        literal_staleness: bool = False,
        alpha_decay: float = 1.0,
        max_staleness: int | None = None,
    ) -> None:
        self.x = [float(v) for v in x0]
        self.version = 0
        self.alpha = alpha
        self.fn = fn
        self.a = a
        self.b = b
        self.literal_staleness = literal_staleness
        self.alpha_decay = alpha_decay
        self.max_staleness = max_staleness

    def push(self, x_new: Iterable[float], tau: int) -> float | None:
        """Apply one pushed model; return alpha_t, or None if it was discarded."""
        x_new = [float(v) for v in x_new]
        staleness = self.version - tau
        if self.max_staleness is not None and staleness > self.max_staleness:
            return None
        if self.literal_staleness:
            t = self.version + 1  # Algorithm 1 counts epochs from 1
            d = t - tau
        else:
            d = staleness
        alpha_t = self.alpha * s(self.fn, d, self.a, self.b)
        self.x = mix(self.x, x_new, alpha_t)
        self.version += 1
        self.alpha = self.alpha * self.alpha_decay
        return alpha_t
