"""Packet-loss models: Bernoulli, Gilbert-Elliott and netem's 4-state model.

The models of tc netem's ``loss random``, ``loss gemodel`` and ``loss state``
(Salsano et al.'s 4-state model), with FlowEmu's separate random streams for
the chain and the draws; docs/netem.md#loss.

All three are hidden-Markov loss processes: a state chain with transition
matrix ``T`` and a loss probability ``l[s]`` per state. Per packet, as in the
kernel's ``loss_event``: **first** the state makes its transition (one uniform
from the *state* stream), **then** the loss is drawn in the new state (one
uniform from the *loss* stream). Both streams advance by exactly one value per
packet whatever happens, so the state sequence depends only on the state
stream ("a given seed for the transitions always results in the same sequence
of state lengths independent of the number of packets", FlowEmu). The
chain starts in state 0 (the good / gap state), as netem does.

This module holds the models (stateless values) and their theory.
:meth:`MarkovLoss.process` runs one: it returns a stateful
:class:`~netem.lossprocess.LossProcess`. That class,
:class:`~netem.lossprocess.LossStats`, :class:`~netem.lossprocess.PacketLoss`
and :class:`~netem.lossprocess.ScriptedLoss` live in :mod:`netem.lossprocess`,
with the chain's clock and how it runs through silences. The dependency runs
one way: this module imports that one, which knows a model only through its
:class:`~netem.lossprocess.ChainModel` protocol.

netem's loss correlation (``loss random P C``) is deliberately not offered:
simulating the kernel's algorithm shows it collapses the loss rate (1 % at
25 % correlation realises ~0 %). Use Gilbert-Elliott for bursty loss.

Theory used by fidelity checks: stationary distribution ``pi``,
mean loss ``mu = sum pi_s l_s``; mean burst length (runs of consecutive lost
packets) ``mu / P(previous kept, current lost)``; and the variance inflation
``1 + 2 sum_k rho_k`` of the loss indicator, from the fundamental matrix
``(I - T + 1 pi^T)^-1``, which widens confidence intervals for bursty loss.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from netem import _check
from netem.lossprocess import LossProcess

__all__ = [
    "Bernoulli",
    "FourState",
    "GilbertElliott",
    "LossModel",
    "MarkovLoss",
]

FArray = NDArray[np.float64]


class MarkovLoss:
    """Shared theory for hidden-Markov loss models."""

    __slots__ = ()

    def transition_matrix(self) -> FArray:
        """Row-stochastic ``T[s, s']``."""
        raise NotImplementedError

    def state_loss(self) -> FArray:
        """Loss probability in each state."""
        raise NotImplementedError

    def stationary(self) -> FArray:
        """Long-run state distribution started from state 0.

        Computed by repeated squaring of the lazy chain ``(I + T) / 2``
        (same stationary law, aperiodic), so reducible or periodic chains
        give the Cesaro limit from the start state instead of failing.
        """
        t = self.transition_matrix()
        lazy = (np.eye(len(t)) + t) / 2.0
        for _ in range(64):
            lazy = lazy @ lazy
            lazy /= lazy.sum(axis=1, keepdims=True)  # keep rows stochastic
        pi = lazy[0]
        return np.asarray(pi / pi.sum(), dtype=np.float64)

    def mean_loss_rate(self) -> float:
        """Long-run fraction of packets lost."""
        return float(self.stationary() @ self.state_loss())

    def mean_burst_length(self) -> float:
        """Mean length of runs of consecutive lost packets (0 if no loss)."""
        pi, t, ell = self.stationary(), self.transition_matrix(), self.state_loss()
        mu = float(pi @ ell)
        if mu == 0.0:
            return 0.0
        starts = float((pi * (1.0 - ell)) @ t @ ell)
        return float("inf") if starts <= 0.0 else mu / starts

    def variance_inflation(self) -> float:
        """``Var(mean of n indicators) * n / (mu (1 - mu))`` for large ``n``."""
        pi, t, ell = self.stationary(), self.transition_matrix(), self.state_loss()
        mu = float(pi @ ell)
        if mu <= 0.0 or mu >= 1.0:
            return 1.0
        k = len(t)
        z = np.linalg.pinv(np.eye(k) - t + np.outer(np.ones(k), pi))
        cov_sum = float((pi * ell) @ (z - np.eye(k)) @ ell)
        return max(1.0 + 2.0 * cov_sum / (mu * (1.0 - mu)), 1e-9)

    def process(
        self, state_rng: np.random.Generator, loss_rng: np.random.Generator
    ) -> LossProcess:
        """A stateful packet-loss sequence drawing from the two streams."""
        return LossProcess(self, state_rng, loss_rng)


@dataclass(frozen=True, slots=True)
class Bernoulli(MarkovLoss):
    """Independent loss with probability ``p`` per packet (``loss random P``)."""

    p: float

    def __post_init__(self) -> None:
        _check.prob("Bernoulli", "p", self.p)

    def transition_matrix(self) -> FArray:
        return np.ones((1, 1))

    def state_loss(self) -> FArray:
        return np.array([self.p])

    def mean_loss_rate(self) -> float:
        return float(self.p)

    def mean_burst_length(self) -> float:
        if self.p == 0:
            return 0.0
        return float("inf") if self.p == 1 else 1.0 / (1.0 - self.p)


@dataclass(frozen=True, slots=True)
class GilbertElliott(MarkovLoss):
    """Gilbert-Elliott, netem ``loss gemodel p r 1-h 1-k``.

    Parameters
    ----------
    p
        P(good -> bad) per packet.
    r
        P(bad -> good) per packet.
    loss_bad
        ``1 - h``, loss probability in the bad state (default 1: simple Gilbert).
    loss_good
        ``1 - k``, loss probability in the good state (default 0).

    With ``loss_bad = 1`` and ``loss_good = 0``: mean loss ``p / (p + r)``,
    mean burst ``1 / r`` packets, mean gap ``1 / p`` packets.
    """

    p: float
    r: float
    loss_bad: float = 1.0
    loss_good: float = 0.0

    def __post_init__(self) -> None:
        for name in ("p", "r", "loss_bad", "loss_good"):
            _check.prob("GilbertElliott", name, getattr(self, name))

    @classmethod
    def from_durations(cls, good: float, bad: float) -> GilbertElliott:
        """Simple Gilbert from mean good and bad run lengths in packets.

        str0m-netem style: ``good=200, bad=2`` is about 1 % loss.
        """
        _check.positive("GilbertElliott.from_durations", "good", good, " packets")
        _check.positive("GilbertElliott.from_durations", "bad", bad, " packets")
        if good < 1 or bad < 1:
            raise ValueError(
                f"GilbertElliott.from_durations: good={good!r}, bad={bad!r}: "
                "mean run lengths must be >= 1 packet"
            )
        return cls(p=1.0 / good, r=1.0 / bad)

    def transition_matrix(self) -> FArray:
        return np.array([[1.0 - self.p, self.p], [self.r, 1.0 - self.r]])

    def state_loss(self) -> FArray:
        return np.array([self.loss_good, self.loss_bad])


@dataclass(frozen=True, slots=True)
class FourState(MarkovLoss):
    """netem's 4-state model ``loss state p13 p31 p32 p23 p14`` (Salsano et al.).

    States (man-page numbering, stored 0-based): 1 good (gap, kept), 2 good
    within a burst (kept), 3 lost within a burst, 4 isolated loss. From 1: to
    3 w.p. ``p13``, to 4 w.p. ``p14``; from 2: to 3 w.p. ``p23``; from 3: to 2
    w.p. ``p32``, to 1 w.p. ``p31``; from 4: always to 1. A packet is lost in
    states 3 and 4. Omitted parameters take tc's defaults
    (``p31 = 1 - p13, p32 = 0, p23 = 1, p14 = 0``: Bernoulli(p13)).
    """

    p13: float
    p31: float | None = None
    p32: float = 0.0
    p23: float = 1.0
    p14: float = 0.0

    def __post_init__(self) -> None:
        _check.prob("FourState", "p13", self.p13)
        p31 = 1.0 - self.p13 if self.p31 is None else self.p31
        object.__setattr__(self, "p31", p31)
        for name in ("p31", "p32", "p23", "p14"):
            _check.prob("FourState", name, getattr(self, name))
        if self.p13 + self.p14 > 1.0:
            _check.fail(
                "FourState",
                "p14",
                self.p14,
                f"p13 + p14 must be <= 1 (p13 = {self.p13})",
            )
        if p31 + self.p32 > 1.0:
            _check.fail(
                "FourState", "p32", self.p32, f"p31 + p32 must be <= 1 (p31 = {p31})"
            )

    def transition_matrix(self) -> FArray:
        p31 = float(self.p31 or 0.0)
        return np.array(
            [
                [1.0 - self.p13 - self.p14, 0.0, self.p13, self.p14],
                [0.0, 1.0 - self.p23, self.p23, 0.0],
                [p31, self.p32, 1.0 - p31 - self.p32, 0.0],
                [1.0, 0.0, 0.0, 0.0],
            ]
        )

    def state_loss(self) -> FArray:
        return np.array([0.0, 0.0, 1.0, 1.0])


LossModel = Bernoulli | GilbertElliott | FourState
