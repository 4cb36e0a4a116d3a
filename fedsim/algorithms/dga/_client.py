"""DGA's client state machine: what to do next, and the events that move it."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from fedsim.algorithms._kernels import check_finite, check_shape
from fedsim.algorithms.dga._core import (
    DGAConfig,
    DGAProtocolError,
    _check_positive,
    dga_c_beta,
    dga_correction,
    dga_direction,
    dga_split_delay,
)
from fedsim.lazy import lazy_module

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch")

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
    """A correction was applied: for the log (its effective delay in steps)."""

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
        self.base = self.w if config.correction in ("none", "overwrite") else None
        # none_per_step: each round's average, 1/K of it per local step ([incr, steps left])
        self._queue: list[list[Any]] = []
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
        elif cfg.correction == "none_per_step":
            self._drift(lr)
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
            c = 1.0  # FedAvg mode: the plain rule (R-DG2)
        elif cfg.c_beta == "paper":  # the configured D on every client, so that the
            c = dga_c_beta(cfg.momentum, cfg.delay)  # corrections cancel (Lemma A.1)
        else:
            c = float(cfg.c_beta)
        scale = lr if cfg.accumulate == "raw" else 1.0
        if cfg.correction == "full":
            w = self.w if d is None else self.w - lr * d
            self.w = w + dga_correction(own, mean, scale, c)
        elif cfg.correction == "none_per_step":  # R-DG4, step by step
            self._queue.append([mean / cfg.local_steps, cfg.local_steps])
            if d is not None:  # this step's move: the oldest average's next share
                self._drift(lr)
        else:  # R-DG4: jump to the synchronized model of round t0
            assert self.base is not None
            self.base = self.base - scale * mean
            self.w = self.base
        return Corrected(t0, delay, c)

    def _drift(self, lr: float, steps: int = 1) -> None:
        """``none_per_step``: take ``steps`` shares of the queued averages, oldest first.

        With ``accumulate="raw"`` a share is a direction (times this step's eta),
        with ``"displacement"`` already a displacement.
        """
        scale = lr if self.config.accumulate == "raw" else 1.0
        while steps > 0 and self._queue:
            head = self._queue[0]
            take = min(steps, int(head[1]))
            self.w = self.w - (scale * take) * head[0]
            head[1] -= take
            steps -= take
            if head[1] == 0:
                self._queue.pop(0)

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
            if new == "done" and self._queue:  # no step is coming: every share, now
                self._drift(self.lr, sum(int(q[1]) for q in self._queue))
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
        *("_acc", "_outbox", "_pending", "_held", "_stash", "_queue"),
    )

    def state_dict(self) -> dict[str, Any]:
        """A deep copy of everything needed to resume (pending sums, momentum)."""
        return copy.deepcopy({name.lstrip("_"): getattr(self, name) for name in self._STATE})

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore state saved by :meth:`state_dict` (under the same config)."""
        if state["state"] not in CLIENT_TRANSITIONS:
            raise ValueError(f"Invalid state: {state['state']!r}")
        for name in self._STATE:
            key = name.lstrip("_")
            # a state saved before none_per_step existed has no queue (nothing queued)
            value = state.get(key, []) if key == "queue" else state[key]
            setattr(self, name, copy.deepcopy(value))
