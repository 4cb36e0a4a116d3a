"""What the server does with each event, without doing any I/O.

A strategy composes a scheduler (who trains when) with a server rule (how
results change the global model) and answers each event with a
:class:`Step`: the clients to dispatch a task to now, and what was applied.
The server actor performs the sends, the timers and the logging.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from fedsim.algorithms import (
    AsyncScheduler,
    ClientResult,
    FedAsync,
    FedAvg,
    NonFiniteUpdate,
    RoundScheduler,
)
from fedsim.scenario import FedAsyncConfig, FedAvgConfig, Scenario

__all__ = ["AsyncStrategy", "Step", "SyncStrategy", "make_strategy"]


@dataclass(slots=True)
class Step:
    """The outcome of one event."""

    dispatch: list[int] = field(default_factory=list)
    applied: list[dict[str, Any]] = field(default_factory=list)
    rejected: list[tuple[int, str]] = field(default_factory=list)
    round_closed: int | None = None


class AsyncStrategy:
    """FedAsync: ``concurrency`` clients in flight; every result is mixed in."""

    kind = "async"

    def __init__(self, cfg: FedAsyncConfig, x0: torch.Tensor, seed: int) -> None:
        self.rule = FedAsync(
            alpha=cfg.alpha, staleness=cfg.staleness, a=cfg.a, b=cfg.b,
            staleness_offset=cfg.staleness_offset, alpha_decay=cfg.alpha_decay,
            max_staleness=cfg.max_staleness,
        )
        self.sched = AsyncScheduler(cfg.concurrency, task_timeout=cfg.task_timeout, seed=seed)
        self.x = x0
        self.version = 0
        self.round = 0

    def on_join(self, client: int, now: float) -> Step:
        self.sched.add(client)
        return Step(dispatch=self.sched.fill(now))

    def on_away(self, client: int, now: float, event: str = "suspend") -> Step:
        self.sched.remove(client, event)
        return Step(dispatch=self.sched.fill(now))

    def on_update(self, result: ClientResult, round_: int, now: float) -> Step:
        step = Step()
        self.sched.on_result(result.client, result.task_id)
        try:
            new, info = self.rule.aggregate(self.x, self.version, result)
        except (NonFiniteUpdate, ValueError) as exc:
            step.rejected.append((result.client, str(exc)))
            new, info = None, {}
        if new is not None:
            self.x = new
            self.version += 1
            info.update(client=result.client, base_version=result.base_version,
                        version=self.version)
            step.applied.append(info)
        elif not step.rejected:
            step.rejected.append((result.client, f"discarded: staleness {info['staleness']}"))
        step.dispatch = self.sched.fill(now)
        return step

    def bind(self, client: int, task_id: int) -> None:
        self.sched.bind(client, task_id)

    def on_timer(self, now: float) -> Step:
        self.sched.expire(now)
        return Step(dispatch=self.sched.fill(now))

    def next_timer(self) -> float | None:
        return self.sched.next_expiry()

    def in_flight(self) -> int:
        return len(self.sched.training())


class SyncStrategy:
    """FedAvg / FedProx: rounds with sampling, over-selection and a deadline."""

    kind = "sync"

    def __init__(self, cfg: FedAvgConfig, x0: torch.Tensor, seed: int, total: int) -> None:
        self.rule = FedAvg(server_lr=cfg.server_lr, weighting=cfg.weighting)
        self.sched = RoundScheduler(
            cfg.fraction, min_clients=cfg.min_clients, over_selection=cfg.over_selection,
            deadline=cfg.round_deadline, seed=seed,
        )
        self.total = total
        self.x = x0
        self.version = 0
        self.available: set[int] = set()
        self.busy: set[int] = set()
        self.results: list[ClientResult] = []
        self.started = False

    @property
    def round(self) -> int:
        return self.sched.round

    def _open(self, now: float) -> list[int]:
        pool = self.available - self.busy
        if not pool:
            return []
        plan = self.sched.open_round(now, pool, self.total)
        self.busy.update(plan.selected)
        self.results = []
        return list(plan.selected)

    def start(self, now: float) -> Step:
        """Open the first round (once every client joined, or at a join timeout)."""
        self.started = True
        return Step(dispatch=self._open(now))

    def on_join(self, client: int, now: float) -> Step:
        self.available.add(client)
        self.busy.discard(client)
        if self.started and self.sched.state == "closed":
            return Step(dispatch=self._open(now))
        return Step()

    def on_away(self, client: int, now: float, event: str = "suspend") -> Step:
        self.available.discard(client)
        self.busy.discard(client)
        self.sched.on_dropped(client)
        return self._maybe_close(now)

    def on_update(self, result: ClientResult, round_: int, now: float) -> Step:
        self.busy.discard(result.client)
        if not self.sched.on_result(round_, result.client):
            return Step(rejected=[(result.client, f"late for round {round_}")])
        self.results.append(result)
        return self._maybe_close(now)

    def _maybe_close(self, now: float) -> Step:
        if not self.sched.complete():
            return Step()
        return self._close(now)

    def _close(self, now: float) -> Step:
        step = Step(round_closed=self.sched.round)
        used = set(self.sched.close(now))
        results = [r for r in self.results if r.client in used]
        good = []
        for r in results:
            if not bool(torch.isfinite(r.params).all()):
                step.rejected.append((r.client, "non-finite update"))
            else:
                good.append(r)
        if good:
            self.x, info = self.rule.aggregate(self.x, good)
            self.version += 1
            info.update(version=self.version, round=step.round_closed, staleness=0)
            step.applied.append(info)
        step.dispatch = self._open(now)
        return step

    def on_timer(self, now: float) -> Step:
        if self.sched.deadline_passed(now):
            return self._close(now)
        if self.sched.state == "closed" and self.started:
            return Step(dispatch=self._open(now))
        return Step()

    def bind(self, client: int, task_id: int) -> None:
        """Synchronous rounds do not track task ids."""

    def next_timer(self) -> float | None:
        cur = self.sched.current
        return None if cur is None else cur.plan.deadline_at

    def in_flight(self) -> int:
        return len(self.busy)


def make_strategy(sc: Scenario, x0: torch.Tensor) -> AsyncStrategy | SyncStrategy:
    """The strategy a scenario's algorithm section asks for."""
    alg = sc.algorithm
    if isinstance(alg, FedAsyncConfig):
        return AsyncStrategy(alg, x0, seed=sc.seed)
    return SyncStrategy(alg, x0, seed=sc.seed, total=sc.data.num_clients)
