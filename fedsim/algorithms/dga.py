r"""DGA: Delayed Gradient Averaging, as a sans-I/O client and reducer.

Zhu, Lin, Lu, Lin and Han, "Delayed Gradient Averaging: Tolerate the
Communication Latency for Federated Learning" (NeurIPS 2021,
https://dga.hanlab.ai); ALGORITHMS.md §3 and §10. No authors' code exists
(§10.E), so every choice below cites the digest.

Client ``i`` runs rounds of ``K`` local steps. With ``D = s K + r``,
``r in [1, K]`` (R-DG1; ``D = 0`` gives ``s = -1, r = K``, R-DG2)::

    u <- beta u + g ;  d = u (momentum) or g ;  m_t <- m_t + d      C6-C8
    at k == r of round t, t0 = t - 1 - s >= 1:
        w <- w - eta d + eta c_beta (m_{t0} - mbar_{t0})            C12-C13
    else:
        w <- w - eta d                                              C16
    after k == K: send (t, m_t), keep m_t, keep stepping            C17

``c_beta = (1 - beta^D) / (1 - beta)`` (R-DG3; 1 without momentum and for
``D <= 1``). The corrections cancel in the client mean, so
``mean_i w^i`` follows ``- (eta / N) sum_i d_i`` exactly (Lemma A.1).

:class:`DGAClient` is a state machine: three events (``step``, ``average``,
``sent``) and one query, ``next_action()`` -> :class:`Step` | :class:`Send` |
:class:`Wait` | :class:`Done`. :class:`DGAServer` reduces per-round sums.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch

from fedsim.algorithms._kernels import check_finite, check_shape, weighted_average

__all__ = [
    "CLIENT_TRANSITIONS",
    "Corrected",
    "DGAClient",
    "DGAConfig",
    "DGAProtocolError",
    "DGAServer",
    "Done",
    "Send",
    "Step",
    "Wait",
    "dga_c_beta",
    "dga_correction",
    "dga_direction",
    "dga_final_average",
    "dga_split_delay",
]

MODES = ("paper", "auto")
ACCUMULATE = ("raw", "displacement")
CORRECTIONS = ("full", "none", "overwrite")


class DGAProtocolError(RuntimeError):
    """An event arrived that the client's or the reducer's state cannot handle."""


# ---------------------------------------------------------------- functional core


def dga_split_delay(delay: int, local_steps: int) -> tuple[int, int]:
    """Return ``(s, r)`` with ``D = s K + r`` and ``r in [1, K]`` (R-DG1).

    Python floor division on purpose: ``D = 0`` gives ``(-1, K)``, so the
    correction fires at step ``K`` of the *same* round (R-DG2, FedAvg mode).
    """
    s = (delay - 1) // local_steps
    return s, delay - s * local_steps


def dga_c_beta(beta: float, delay: int) -> float:
    """Momentum factor ``(1 - beta^D) / (1 - beta)`` of C13 (R-DG3).

    It is 1 for ``beta = 0`` and for ``D <= 1`` (the formula gives 0 at
    ``D = 0``, which would drop the averaging; §10 uses the plain rule there).
    """
    if beta == 0.0 or delay <= 1:
        return 1.0
    return (1.0 - beta**delay) / (1.0 - beta)


def dga_direction(
    u: torch.Tensor | None, grad: torch.Tensor, beta: float
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """C8: return the new momentum buffer (None without momentum) and ``d``."""
    if u is None:
        return None, grad
    u = beta * u + grad
    return u, u


def dga_correction(
    own: torch.Tensor, mean: torch.Tensor, lr: float = 1.0, c_beta: float = 1.0
) -> torch.Tensor:
    """The term ``lr c_beta (own - mean)`` that C12/C13 *add* to ``w``.

    ``lr`` is the current eta with ``accumulate="raw"`` and 1 with
    ``"displacement"``, whose accumulators already hold ``sum eta_k d_k``
    (R-DG7). Summed over the clients of a round it is zero.
    """
    return (lr * c_beta) * (own - mean)


def dga_final_average(models: Sequence[torch.Tensor]) -> torch.Tensor:
    """C18: the plain mean of the clients' final models (float64 accumulation)."""
    return weighted_average(list(models), [1.0] * len(models))


# ---------------------------------------------------------------- configuration


def _check_int(name: str, value: Any, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"Invalid {name}: {value!r} (must be an integer >= {low})")


def _check_choice(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"Invalid {name}: {value!r} (allowed: {', '.join(allowed)})")


def _check_positive(name: str, value: Any, hint: str = "must be finite and > 0") -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not (ok and math.isfinite(value) and value > 0):
        raise ValueError(f"Invalid {name}: {value!r} ({hint})")
    return float(value)


@dataclass(frozen=True, slots=True)
class DGAConfig:
    """Hyperparameters of one DGA run (paper defaults K = 5, D = 20, §3.4).

    Parameters
    ----------
    local_steps : int
        ``K``, local steps per round (>= 1).
    delay : int
        ``D``, local steps between sending a round and applying its average
        (>= 0). ``0`` is FedAvg mode in either mode: a barrier at the end of
        each round and the plain rule (R-DG2, §10). In auto mode ``D`` only
        sets the default ``max_pending``.
    lr : float
        Default learning rate ``eta`` (a step may pass its own, R-DG7).
    momentum : float
        ``beta`` in [0, 1); 0 is plain SGD. The buffer is never corrected.
    mode : {"paper", "auto"}
        ``paper``: correct at step ``r`` of round ``t0 + 1 + s``, waiting
        there if the average is late, holding it there if it is early.
        ``auto``: correct whenever the average arrives (§3.9).
    accumulate : {"raw", "displacement"}
        Send ``sum d`` and correct with the current eta (paper), or send
        ``sum eta d`` and correct with ``c_beta (M - Mbar)`` (R-DG7).
    correction : {"full", "none", "overwrite"}
        ``full``: C12/C13. ``none``: Table 1's "without correction", read as
        delayed-average SGD (R-DG4 ASSUMPTION): local gradients are sent but
        never applied, and ``w`` jumps to ``wbar_{t0} = w_1 - eta sum mbar``
        at each correction. ``overwrite``: local steps are applied, then
        discarded by the same jump (R-DG4's second variant).
    c_beta : "paper" or float
        ``"paper"``: :func:`dga_c_beta` at the configured ``D``, also in auto
        mode (a per-correction delay would differ between clients and break
        the cancellation); a float > 0 overrides it (R-DG3). Measured
        here: with momentum the printed factor over-corrects, because ``v``
        already carries the momentum; clients' deviations from the mean grow
        by about ``c_beta - 1`` per correction at any learning rate.
        ``c_beta = 1`` is the exact replacement of a round's displacement
        ``eta v`` by the average (the shipped DGA scenario uses it).
    max_pending : int or None
        Auto mode: block (``Wait``) while more than this many sent rounds
        await their average (§3.9). Default ``4 (s + 1)``.
    rounds : int or None
        ``T``. After round ``T`` the client drains: it waits for and applies
        every outstanding average, then reports ``Done``.
    """

    local_steps: int = 5
    delay: int = 20
    lr: float = 0.1
    momentum: float = 0.0
    mode: Literal["paper", "auto"] = "paper"
    accumulate: Literal["raw", "displacement"] = "raw"
    correction: Literal["full", "none", "overwrite"] = "full"
    c_beta: float | str = "paper"
    max_pending: int | None = None
    rounds: int | None = None

    def __post_init__(self) -> None:
        _check_int("local_steps", self.local_steps, 1)
        _check_int("delay", self.delay, 0)
        _check_positive("lr", self.lr)
        if not 0.0 <= self.momentum < 1.0:
            raise ValueError(f"Invalid momentum: {self.momentum} (must be in [0, 1))")
        _check_choice("mode", self.mode, MODES)
        _check_choice("accumulate", self.accumulate, ACCUMULATE)
        _check_choice("correction", self.correction, CORRECTIONS)
        if self.c_beta != "paper":
            _check_positive("c_beta", self.c_beta, "use 'paper' or a float > 0")
        if self.max_pending is not None:
            _check_int("max_pending", self.max_pending, 1)
        if self.rounds is not None:
            _check_int("rounds", self.rounds, 1)

    @property
    def pending_cap(self) -> int:
        """Auto mode's limit on rounds awaiting their average."""
        if self.max_pending is not None:
            return self.max_pending
        return max(1, 4 * (dga_split_delay(self.delay, self.local_steps)[0] + 1))


# ---------------------------------------------------------------- decisions


@dataclass(frozen=True, slots=True)
class Step:
    """Compute the minibatch gradient at ``client.w`` and call ``step(g)``."""

    round: int
    k: int


@dataclass(frozen=True, slots=True)
class Send:
    """Send ``(round, m)`` to the reducer, then call ``sent(round)``.

    ``m`` is ``m_t`` (``v_t`` with momentum, ``M_t`` with displacement).
    """

    round: int
    m: torch.Tensor


@dataclass(frozen=True, slots=True)
class Wait:
    """Block until the average of ``round`` arrives; call ``apply_average``."""

    round: int


@dataclass(frozen=True, slots=True)
class Done:
    """Every round is trained and corrected; upload ``w`` for C18."""


@dataclass(frozen=True, slots=True)
class Corrected:
    """A correction was applied: for the log (§3.9, "effective delay")."""

    round: int
    delay: int
    c_beta: float


Action = Step | Send | Wait | Done

# state -> event -> the states the event may lead to (h11 style).
CLIENT_TRANSITIONS: dict[str, dict[str, tuple[str, ...]]] = {
    "ready": {"step": ("ready", "blocked", "draining"), "average": ("ready",), "sent": ("ready",)},
    "blocked": {"average": ("ready", "blocked", "draining", "done"), "sent": ("blocked",)},
    "draining": {"average": ("draining", "done"), "sent": ("draining",)},
    "done": {},
}


# ---------------------------------------------------------------- client


class DGAClient:
    """One DGA client: ``w``, the momentum buffer and the pending rounds.

    ``w`` is a snapshot: the client never modifies a tensor it handed out or
    was handed, it replaces them. ``step`` and ``apply_average`` return the
    corrections they applied (a tuple of :class:`Corrected`).
    """

    def __init__(self, config: DGAConfig, w0: torch.Tensor, client: int = 0) -> None:
        if not w0.is_floating_point():
            raise ValueError(f"Invalid w0: dtype {w0.dtype} (must be floating point)")
        check_finite(w0, "w0")
        self.config = config
        self.client = client
        self.w = w0.detach().clone()
        self.u = torch.zeros_like(self.w) if config.momentum > 0 else None
        # R-DG4 variants: the synchronized model w_1 - eta sum_{t'} mbar_{t'}.
        self.base = self.w if config.correction != "full" else None
        self.round, self.k, self.steps = 1, 1, 0
        self.lr = config.lr
        self.state = "ready"
        self._s, self._r = dga_split_delay(config.delay, config.local_steps)
        self._paper = config.mode == "paper" or config.delay == 0
        self._acc = torch.zeros_like(self.w)
        self._outbox: list[int] = []
        self._pending: dict[int, tuple[torch.Tensor, int]] = {}  # t: (m_t, sent at)
        self._held: dict[int, torch.Tensor] = {}  # paper mode: early averages
        self._stash: tuple[torch.Tensor, float, int] | None = None  # (d, lr, t0)

    # -- the query

    def next_action(self) -> Action:
        """What the driver must do next (idempotent until an event)."""
        if self._outbox:
            t = self._outbox[0]
            return Send(t, self._pending[t][0])
        if self.state == "blocked":
            return Wait(self._stash[2] if self._stash else min(self._pending))
        if self.state == "draining":
            return Wait(min(self._pending))
        if self.state == "done":
            return Done()
        return Step(self.round, self.k)

    # -- events

    def step(self, grad: torch.Tensor, lr: float | None = None) -> tuple[Corrected, ...]:
        """One local step with the gradient ``grad`` taken at ``self.w``.

        ``lr`` is this step's eta (default ``config.lr``); it stays the
        current eta for corrections applied between steps.
        """
        self._fire("step", f"round {self.round}, k={self.k}")
        if self._outbox:
            self._illegal("step", f"round {self.round}, k={self.k}", f"{self.next_action()} first")
        check_shape(self.w, grad, "gradient")
        check_finite(grad, "gradient")
        lr = self.config.lr if lr is None else _check_positive("lr", lr)
        cfg = self.config
        self.lr = lr
        self.u, d = dga_direction(self.u, grad.to(self.w.dtype), cfg.momentum)
        self._acc = self._acc + (d if cfg.accumulate == "raw" else lr * d)
        t, k = self.round, self.k
        self.steps += 1
        if k == cfg.local_steps:  # C17, before any wait (R-DG2)
            self._pending[t] = (self._acc, self.steps)
            self._outbox.append(t)
            self._acc = torch.zeros_like(self.w)
            self.round, self.k = t + 1, 1
        else:
            self.k = k + 1
        t0 = t - 1 - self._s
        done: tuple[Corrected, ...] = ()
        if self._paper and k == self._r and t0 >= 1:  # C10
            if t0 in self._held:
                done = (self._correct(t0, self._held.pop(t0), d, lr),)
            else:  # C11: wait, with this step's gradient already taken
                self._stash = (d.clone(), lr, t0)
        elif cfg.correction != "none":  # C16
            self.w = self.w - lr * d
        return done + self._settle("step")

    def apply_average(self, round_id: int, mean: torch.Tensor) -> tuple[Corrected, ...]:
        """The reducer's average of ``round_id`` arrived."""
        self._fire("average", f"round {round_id}")
        why = None
        if round_id in self._held:
            why = "its average already arrived"
        elif round_id in self._outbox:
            why = f"it was never sent (call sent({round_id}) first)"
        elif round_id not in self._pending:
            sent = 1 <= round_id < self.round
            why = "it was already applied" if sent else "it was never sent"
        if why is not None:
            self._illegal("average", f"round {round_id}", why)
        check_shape(self.w, mean, f"average of round {round_id}")
        check_finite(mean, f"average of round {round_id}")
        mean = mean.detach().to(self.w.dtype)
        done: tuple[Corrected, ...] = ()
        if self._stash is not None and self._stash[2] == round_id:
            d, lr, _ = self._stash
            self._stash = None
            done = (self._correct(round_id, mean, d, lr),)
        elif self._paper and self.state != "draining":
            self._held[round_id] = mean.clone()
        else:
            done = (self._correct(round_id, mean, None, self.lr),)
        return done + self._settle("average")

    def sent(self, round_id: int) -> None:
        """The driver handed the :class:`Send` for ``round_id`` to the transport."""
        self._fire("sent", f"round {round_id}")
        if not self._outbox or self._outbox[0] != round_id:
            head = f"round {self._outbox[0]} is next" if self._outbox else "nothing to send"
            self._illegal("sent", f"round {round_id}", head)
        self._outbox.pop(0)
        self._settle("sent")

    # -- internals

    def _correct(self, t0: int, mean: torch.Tensor, d: torch.Tensor | None, lr: float) -> Corrected:
        """C12/C13 (with ``d``) or a bare correction between steps (``d=None``)."""
        cfg = self.config
        own, sent_at = self._pending.pop(t0)
        delay = self.steps - sent_at
        if cfg.delay == 0:
            c = 1.0  # FedAvg mode: the plain rule (§10)
        elif cfg.c_beta == "paper":  # the configured D on every client, so that the
            c = dga_c_beta(cfg.momentum, cfg.delay)  # corrections cancel (Lemma A.1)
        else:
            c = float(cfg.c_beta)
        scale = lr if cfg.accumulate == "raw" else 1.0
        if cfg.correction == "full":
            w = self.w if d is None else self.w - lr * d
            self.w = w + dga_correction(own, mean, scale, c)
        else:  # R-DG4: jump to the synchronized model of round t0
            assert self.base is not None
            self.base = self.base - scale * mean
            self.w = self.base
        return Corrected(t0, delay, c)

    def _settle(self, event: str) -> tuple[Corrected, ...]:
        """Derive the new state from the data; check it against the table."""
        cfg, before = self.config, self.state
        flushed: list[Corrected] = []
        if self._stash is not None:
            new = "blocked"
        elif cfg.rounds is not None and self.round > cfg.rounds:
            for t in sorted(self._held):  # paper mode: no step r is coming
                flushed.append(self._correct(t, self._held.pop(t), None, self.lr))
            new = "draining" if self._pending else "done"
        elif not self._paper and len(self._pending) > cfg.pending_cap:
            new = "blocked"
        else:
            new = "ready"
        if new not in CLIENT_TRANSITIONS[before][event]:  # a bug here, not the caller's
            raise DGAProtocolError(f"internal: {event!r} moved {before!r} to {new!r}")
        self.state = new
        return tuple(flushed)

    def _fire(self, event: str, detail: str) -> None:
        if event not in CLIENT_TRANSITIONS[self.state]:
            self._illegal(event, detail, f"next action is {self.next_action()}")

    def _illegal(self, event: str, detail: str, why: str) -> None:
        raise DGAProtocolError(
            f"can't handle event {event!r} ({detail}) when client={self.client} "
            f"and state={self.state!r}: {why}"
        )

    # -- persistence

    _STATE: ClassVar[tuple[str, ...]] = (
        *("w", "u", "base", "round", "k", "steps", "lr", "state"),
        *("_acc", "_outbox", "_pending", "_held", "_stash"),
    )

    def state_dict(self) -> dict[str, Any]:
        """A deep copy of everything needed to resume (§8.3: pending m, momentum)."""
        return copy.deepcopy({name.lstrip("_"): getattr(self, name) for name in self._STATE})

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore state saved by :meth:`state_dict` (under the same config)."""
        if state["state"] not in CLIENT_TRANSITIONS:
            raise ValueError(f"Invalid state: {state['state']!r}")
        for name in self._STATE:
            setattr(self, name, copy.deepcopy(state[name.lstrip("_")]))


# ---------------------------------------------------------------- reducer


@dataclass(slots=True)
class _Partial:
    total: torch.Tensor  # float64
    clients: list[int]
    expected: int
    dtype: torch.dtype


class DGAServer:
    """The reducer (R1-R2): per-round partial sums, the mean once all report.

    ``num_clients`` is ``N``, the reports that complete a round;
    ``add(..., expected=n)`` overrides it per round (e.g. a subset reduced
    by a deadline, §3.9 option 2), and must then agree for the whole round.
    """

    def __init__(self, num_clients: int | None = None) -> None:
        if num_clients is not None:
            _check_int("num_clients", num_clients, 1)
        self.num_clients = num_clients
        self._open: dict[int, _Partial] = {}
        self._closed: set[int] = set()

    def check(
        self, round_id: int, client: int, m: torch.Tensor, expected: int | None = None
    ) -> int:
        """Raise unless :meth:`add` would accept ``m``; return the round's N."""
        n = self.num_clients if expected is None else expected
        if n is None:
            raise ValueError("Invalid expected: None (set num_clients or pass expected)")
        _check_int("expected", n, 1)
        _check_int("round_id", round_id, 0)
        what = f"update from client {client} for round {round_id}"
        refused = f"can't handle event 'add' ({what})"
        part = self._open.get(round_id)
        if round_id in self._closed:
            raise DGAProtocolError(f"{refused} when round={round_id} and state='complete'")
        if part is not None and client in part.clients:
            raise DGAProtocolError(
                f"{refused} when round={round_id} and state='collecting': "
                f"client {client} already reported"
            )
        if part is not None:
            if n != part.expected:
                raise ValueError(
                    f"Invalid expected: {n} (round {round_id} expects {part.expected})"
                )
            check_shape(part.total, m, what)
        if not m.is_floating_point():
            raise ValueError(f"Invalid {what}: dtype {m.dtype} (must be floating point)")
        check_finite(m, what)
        return n

    def add(
        self, round_id: int, client: int, m: torch.Tensor, *, expected: int | None = None
    ) -> torch.Tensor | None:
        """Add one client's ``m`` (R1); return ``mbar`` once the round is complete (R2)."""
        n = self.check(round_id, client, m, expected)
        part = self._open.get(round_id)
        if part is None:
            zero = torch.zeros(m.shape, dtype=torch.float64)
            part = self._open[round_id] = _Partial(zero, [], n, m.dtype)
        part.total = part.total + m.detach().to(torch.float64)
        part.clients.append(client)
        if len(part.clients) < part.expected:
            return None
        del self._open[round_id]
        self._closed.add(round_id)
        return (part.total / part.expected).to(part.dtype)

    @staticmethod
    def final_average(models: Sequence[torch.Tensor]) -> torch.Tensor:
        """C18: the mean of the clients' final models."""
        return dga_final_average(models)

    def state_dict(self) -> dict[str, Any]:
        """Open partial sums (deep copies) and the ids of completed rounds."""
        open_ = {t: dataclasses.asdict(p) for t, p in self._open.items()}
        return {"open": open_, "closed": sorted(self._closed)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore state saved by :meth:`state_dict`."""
        self._open = {t: _Partial(**copy.deepcopy(p)) for t, p in state["open"].items()}
        self._closed = set(state["closed"])
