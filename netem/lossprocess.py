"""Stateful packet-loss processes: the per-link chain, scripted loss, counters.

As tc netem's per-packet ``loss_event``, with FlowEmu's separate random
streams; docs/netem.md#the-loss-chain-runs-through-silences. The models
themselves and their theory are in :mod:`netem.loss`; this module runs them,
one :class:`LossProcess` per link direction, and counts what they drew
(:class:`LossStats`). It knows a model only through :class:`ChainModel` (what
the process needs of it) and imports nothing from :mod:`netem.loss`, which
depends on this module.

The chain's clock is the packet slot. netem's kernel chain only moves when a
packet is sent, so a burst outlives any silence: a TCP retransmission sent
after a 200 ms RTO would find the channel exactly as bad as the packet it
replaces, again and again, and a 2-packet mean burst would stall a link for
seconds of exponential backoff. :meth:`LossProcess.idle` lets the chain run
through the packet slots of a silence (``T^k``, or the stationary law once
the chain has mixed) with one draw from the state stream, so bursts are
correlated in time, not only in packet count.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import Protocol, cast

import numpy as np
from numpy.typing import NDArray

__all__ = ["ChainModel", "LossProcess", "LossStats", "PacketLoss", "ScriptedLoss"]

FArray = NDArray[np.float64]


class ChainModel(Protocol):
    """What a :class:`LossProcess` runs: a hidden Markov chain with a loss
    probability per state (every model of :mod:`netem.loss` is one)."""

    def transition_matrix(self) -> FArray:
        """Row-stochastic ``T[s, s']``."""
        ...

    def state_loss(self) -> FArray:
        """Loss probability in each state."""
        ...

    def stationary(self) -> FArray:
        """Long-run state distribution started from state 0."""
        ...


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
        "_count", "_cum", "_ell", "_loss_rng", "_mix", "_p0", "_pi", "_s", "_state_rng", "_t",
        "model",
    )

    def __init__(
        self,
        model: ChainModel,
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
        self._p0 = math.nan
        self.model: ChainModel = model
        self.set_model(model)

    def set_model(self, model: ChainModel) -> None:
        """Switch model (time-varying links).

        The chain keeps its state if the new model has as many states as the
        old one, else restarts in state 0.
        """
        try:
            chain = _chain_cached(cast(Hashable, model))
        except TypeError:  # an unhashable model
            chain = _chain(model)
        t = chain.t
        if len(t) != len(self._cum):
            self._s = 0
        self.model = model
        self._cum, self._ell, self._t, self._pi, self._mix = (
            chain.cum, chain.ell, t, chain.pi, chain.mix
        )
        self._p0 = float(chain.ell[0]) if len(t) == 1 else math.nan

    def draw(self, n: int) -> NDArray[np.bool_]:
        """Loss indicators for the next ``n`` packets."""
        if n <= 0:
            return np.zeros(0, dtype=bool)
        u_loss = self._loss_rng.random(n)
        lost: NDArray[np.bool_]
        if len(self._cum) == 1:
            lost = u_loss < self._p0
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


@dataclass(frozen=True, slots=True)
class _Chain:
    """What a :class:`LossProcess` derives from its model (arrays read-only)."""

    t: FArray
    cum: list[list[float]]
    ell: FArray
    pi: FArray
    mix: float


def _chain(model: ChainModel) -> _Chain:
    # copies: the model's own arrays are not ours to freeze
    t, ell, pi = (np.array(a) for a in (model.transition_matrix(), model.state_loss(),
                                        model.stationary()))
    cum = np.cumsum(t, axis=1)
    cum[:, -1] = 1.0  # guard against rounding
    for a in (t, ell, pi):
        a.setflags(write=False)
    return _Chain(t, [row.tolist() for row in cum], ell, pi, _mixing_slots(t))


# Models are frozen values: every link with the same one shares its chain
# (the stationary law and the mixing time cost ~0.2 ms per link otherwise).
_chain_cached = functools.lru_cache(maxsize=256)(_chain)


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
        k = int(np.count_nonzero(lost))  # a fifth of what .sum() or .any() cost
        if k == 0 and lost.size:  # the usual case: one numpy call, not five
            self.n += lost.size
            self.last = False
            return
        self.n += lost.size
        self.lost += k
        self.bursts += int(np.count_nonzero(lost[1:] & ~lost[:-1]))
        self.bursts += int(bool(lost[0]) and not self.last)
        self.last = bool(lost[-1])

    def silence(self) -> None:
        """A silence ends the run of packets: a burst in progress is censored."""
        self.cut += int(self.last)
        self.last = False

    def stats(self) -> LossStats:
        return LossStats(self.n, self.lost, self.bursts, self.cut)
