"""Packet-loss models: Bernoulli, Gilbert-Elliott and netem's 4-state model.

Reference: NETEM-REFERENCE.md §1.4 (netem's ``loss random``, ``loss gemodel``
and ``loss state``; the derived GE formulas; FlowEmu's separate PRNGs).

All three are hidden-Markov loss processes: a state chain with transition
matrix ``T`` and a loss probability ``l[s]`` per state. Per packet, as in the
kernel's ``loss_event``: **first** the state makes its transition (one uniform
from the *state* stream), **then** the loss is drawn in the new state (one
uniform from the *loss* stream). Both streams advance by exactly one value per
packet whatever happens, so the state sequence depends only on the state
stream ("a given seed for the transitions always results in the same sequence
of state lengths independent of the number of packets", FlowEmu, §1.4). The
chain starts in state 0 (the good / gap state), as netem does.

The chain's clock is the packet slot. netem's kernel chain only moves when a
packet is sent, so a burst outlives any silence: a TCP retransmission sent
after a 200 ms RTO would find the channel exactly as bad as the packet it
replaces, again and again, and a 2-packet mean burst would stall a link for
seconds of exponential backoff. :meth:`LossProcess.idle` lets the chain run
through the packet slots of a silence (``T^k``, or the stationary law once
the chain has mixed) with one draw from the state stream, so bursts are
correlated in time, not only in packet count.

netem's loss correlation (``loss random P C``) is deliberately not offered:
§1.4 [calc] shows it collapses the loss rate (1 % at 25 % correlation realises
~0 %). Use Gilbert-Elliott for bursty loss.

Theory used by fidelity checks (§5.1): stationary distribution ``pi``,
mean loss ``mu = sum pi_s l_s``; mean burst length (runs of consecutive lost
packets) ``mu / P(previous kept, current lost)``; and the variance inflation
``1 + 2 sum_k rho_k`` of the loss indicator, from the fundamental matrix
``(I - T + 1 pi^T)^-1``, which widens confidence intervals for bursty loss.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from netem import _check

__all__ = [
    "Bernoulli",
    "FourState",
    "GilbertElliott",
    "LossModel",
    "LossProcess",
    "LossStats",
    "MarkovLoss",
    "PacketLoss",
    "ScriptedLoss",
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
    """Gilbert-Elliott, netem ``loss gemodel p r 1-h 1-k`` (§1.4).

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

        str0m-netem style (§1.4): ``good=200, bad=2`` is about 1 % loss.
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


@dataclass(frozen=True, slots=True)
class LossStats:
    """Counts over a loss process's life: packets, lost packets, loss bursts.

    ``cut`` counts the bursts that a silence interrupted (:meth:`LossProcess.idle`
    while the last packet was lost): their true length is unknown, so the mean
    burst length is the censored-geometric estimate (:attr:`mean_burst`).
    """

    packets: int = 0
    lost: int = 0
    bursts: int = 0
    cut: int = 0

    def __add__(self, other: LossStats) -> LossStats:
        return LossStats(self.packets + other.packets, self.lost + other.lost,
                         self.bursts + other.bursts, self.cut + other.cut)

    @property
    def rate(self) -> float:
        """Realised loss rate (0 with no packets)."""
        return self.lost / self.packets if self.packets else 0.0

    @property
    def ended(self) -> int:
        """Bursts not cut short by a silence."""
        return self.bursts - self.cut

    @property
    def mean_burst(self) -> float:
        """Realised mean burst length (0 with no loss).

        Each lost packet but the last of a cut burst is an observed "does the
        burst go on?" trial, and each ended burst one "no": the mean of the
        geometric run length is ``(lost - cut) / ended``, which is
        ``lost / bursts`` when nothing was cut.
        """
        if self.ended > 0:
            return (self.lost - self.cut) / self.ended
        return self.lost / self.bursts if self.bursts else 0.0


class LossProcess:
    """Stateful per-packet loss sequence of one link direction.

    ``draw(n)`` returns the next ``n`` loss indicators; drawing ``n`` at once
    or one at a time gives the same sequence.
    """

    __slots__ = (
        "_count", "_cum", "_ell", "_loss_rng", "_mix", "_pi", "_s", "_state_rng", "_t", "model",
    )

    def __init__(
        self,
        model: MarkovLoss,
        state_rng: np.random.Generator,
        loss_rng: np.random.Generator,
    ) -> None:
        self._state_rng = state_rng
        self._loss_rng = loss_rng
        self._s = 0
        self._count = _Counter()
        self._cum: list[list[float]] = []
        self._ell: FArray = np.zeros(0)
        self._t: FArray = np.zeros((0, 0))
        self._pi: FArray = np.zeros(0)
        self._mix = math.inf
        self.model: MarkovLoss = model
        self.set_model(model)

    def set_model(self, model: MarkovLoss) -> None:
        """Switch model (time-varying links).

        The chain keeps its state if the new model has as many states as the
        old one, else restarts in state 0.
        """
        t = model.transition_matrix()
        cum = np.cumsum(t, axis=1)
        cum[:, -1] = 1.0  # guard against rounding
        if len(t) != len(self._cum):
            self._s = 0
        self.model = model
        self._cum = [row.tolist() for row in cum]
        self._ell = model.state_loss()
        self._t = t
        self._pi = model.stationary()
        self._mix = _mixing_slots(t)

    def draw(self, n: int) -> NDArray[np.bool_]:
        """Loss indicators for the next ``n`` packets."""
        if n <= 0:
            return np.zeros(0, dtype=bool)
        u_loss = self._loss_rng.random(n)
        lost: NDArray[np.bool_]
        if len(self._cum) == 1:
            lost = u_loss < self._ell[0]
        else:
            states = np.empty(n, dtype=np.intp)
            s, cum = self._s, self._cum
            for i, u in enumerate(self._state_rng.random(n).tolist()):
                row = cum[s]
                s = 0
                while u >= row[s]:
                    s += 1
                states[i] = s
            self._s = s
            lost = u_loss < self._ell[states]
        self._count.add(lost)
        return lost

    def idle(self, slots: float) -> None:
        """Let the hidden chain run through ``slots`` packet slots with nothing sent.

        One uniform from the state stream picks the state from row ``s`` of
        ``T^k`` (``k = floor(slots)``), or from the stationary law once ``k``
        is past the chain's mixing time (``|lambda_2|^k < 1e-12``). Nothing is
        counted. Memoryless models (one state) and ``slots < 1`` are no-ops.
        """
        if not slots >= 1.0:
            return
        self._count.silence()
        if len(self._cum) == 1:
            return
        if slots >= self._mix:
            row = self._pi
        else:
            row = np.linalg.matrix_power(self._t, int(slots))[self._s]
        u = float(self._state_rng.random())
        cum = np.cumsum(row)
        self._s = min(int(np.searchsorted(cum, u * cum[-1], side="right")), len(row) - 1)

    @property
    def stats(self) -> LossStats:
        """Packets, lost packets and bursts drawn so far."""
        return self._count.stats()


def _mixing_slots(t: FArray) -> float:
    """Steps after which ``T^k`` is within ``1e-12`` of its limit (inf if it never mixes)."""
    if len(t) <= 1:
        return 0.0
    lam = sorted(np.abs(np.linalg.eigvals(t)))[-2]
    if lam >= 1.0 - 1e-12:
        return math.inf
    if lam <= 1e-12:
        return 1.0
    return math.ceil(math.log(1e-12) / math.log(lam))


class PacketLoss(Protocol):
    """Anything that yields per-packet loss indicators (tcp.py, link.py)."""

    def draw(self, n: int) -> NDArray[np.bool_]:
        """Loss indicators for the next ``n`` packets."""
        ...

    def idle(self, slots: float) -> None:
        """Let time pass: ``slots`` packet slots with nothing sent."""
        ...

    @property
    def stats(self) -> LossStats:
        """Counts so far."""
        ...


class ScriptedLoss:
    """Deterministic loss for tests: packets whose 0-based index is in ``lost``.

    The index counts every packet drawn through this object (first
    transmissions and retransmissions alike), in drawing order.
    """

    __slots__ = ("_i", "_lost", "_proc")

    def __init__(self, lost: Iterable[int]) -> None:
        self._lost = frozenset(int(i) for i in lost)
        self._i = 0
        self._proc = _Counter()

    def draw(self, n: int) -> NDArray[np.bool_]:
        n = max(n, 0)
        out: NDArray[np.bool_] = np.array(
            [(self._i + j) in self._lost for j in range(n)], dtype=bool
        )
        self._i += n
        if out.size:
            self._proc.add(out)
        return out

    def idle(self, slots: float) -> None:
        """Scripted losses are indexed by packet; silence changes nothing."""

    @property
    def stats(self) -> LossStats:
        return self._proc.stats()


class _Counter:
    __slots__ = ("bursts", "cut", "last", "lost", "n")

    def __init__(self) -> None:
        self.n = self.lost = self.bursts = self.cut = 0
        self.last = False

    def add(self, lost: NDArray[np.bool_]) -> None:
        self.n += lost.size
        self.lost += int(lost.sum())
        self.bursts += int(np.count_nonzero(lost[1:] & ~lost[:-1]))
        self.bursts += int(bool(lost[0]) and not self.last)
        self.last = bool(lost[-1])

    def silence(self) -> None:
        """A silence ends the run of packets: a burst in progress is censored."""
        self.cut += int(self.last)
        self.last = False

    def stats(self) -> LossStats:
        return LossStats(self.n, self.lost, self.bursts, self.cut)
