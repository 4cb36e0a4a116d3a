"""Two server sides most algorithms are made of: asynchronous updates and rounds.

:class:`AsyncFlow` keeps ``concurrency`` clients training and applies each
update as it arrives (FedAsync, AsyncFedED, FedBuff); :class:`RoundsFlow`
runs synchronous rounds with sampling, over-selection and a deadline
(FedAvg, FedProx, FedSpeed, SCAFFOLD, FedOpt). Each composes a scheduler
from :mod:`fedsim.algorithms.scheduling` with a *rule*, the algorithm's own
math, behind a small base class (:class:`AsyncRule`, :class:`RoundRule`);
an algorithm module supplies the rule and these do the bookkeeping.
"""

from __future__ import annotations

import math
import random
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, TypeAlias

from pydantic import Field

from fedsim.algorithms._kernels import all_finite, pack_tensor, pseudo_gradient, unpack_tensor
from fedsim.algorithms.api import (
    AlgorithmConfig,
    Applied,
    Discarded,
    Guarded,
    ServerAlgorithm,
    ServerContext,
    Step,
)
from fedsim.algorithms.base import NonFiniteUpdate
from fedsim.algorithms.robust import AggregatorKeys, GuardConfig, UpdateGuard, aggregate_models
from fedsim.algorithms.scheduling import AsyncScheduler, RoundScheduler
from fedsim.lazy import lazy_module
from fedsim.schema import AtLeastOne, FiniteNonNeg, FinitePos, Pos
from fedsim.wire.messages import LocalWork, Task, Update

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch")

__all__ = ["AsyncConfig", "AsyncFlow", "AsyncRule", "Concurrency", "RoundRule", "RoundsConfig",
           "RoundsFlow"]

Info = dict[str, Any]

#: ``concurrency``'s type and bounds, declared once: an algorithm whose default
#: differs (FedAsync's 4) declares the key again with this type and its own default
Concurrency: TypeAlias = AtLeastOne | None


def _metrics(info: Info, drop: tuple[str, ...]) -> dict[str, Any]:
    """A rule's info dict as log metrics: scalars only, bookkeeping keys dropped."""
    return {k: v for k, v in info.items()
            if k not in drop and (v is None or isinstance(v, bool | int | float))}


class AsyncConfig(AlgorithmConfig):
    """Keys every asynchronous algorithm shares.

    ``concurrency``: tasks in flight at once (None: every client, each
    training as soon as it is free); ``task_timeout``: emulated seconds after
    which a task that has not come back frees its client; ``guard``: an
    update guard (:class:`~fedsim.algorithms.robust.GuardConfig`).
    """

    concurrency: Concurrency = None
    task_timeout: Pos | None = None
    guard: GuardConfig | None = None

    def tasks_at_once(self, num_clients: int) -> int:
        return min(num_clients, self.concurrency or num_clients)


class RoundsConfig(AlgorithmConfig):
    """Keys every synchronous-round algorithm shares.

    ``fraction`` of all clients a round needs (at least ``min_clients``);
    ``over_selection`` asks that many more and closes on the first results;
    ``round_deadline`` (emulated s) closes a round with what arrived;
    ``server_lr`` and ``weighting`` of the average; ``guard``: an update
    guard (:class:`~fedsim.algorithms.robust.GuardConfig`).
    """

    fraction: Annotated[float, Field(gt=0, le=1)] = 1.0
    min_clients: AtLeastOne = 1
    over_selection: FiniteNonNeg = 0.0
    round_deadline: Pos | None = None
    server_lr: FinitePos = 1.0
    weighting: Literal["samples", "uniform"] = "uniform"
    guard: GuardConfig | None = None

    def tasks_at_once(self, num_clients: int) -> int:
        m = max(self.min_clients, math.ceil(self.fraction * num_clients - 1e-9))
        return min(num_clients, math.ceil(m * (1 + self.over_selection) - 1e-9))

    def sent_at_once(self, num_clients: int) -> int:
        """A round's tasks all leave when the round opens."""
        return self.tasks_at_once(num_clients)


class AsyncRule(ABC):
    """An asynchronous server rule: one update in, maybe a new model out.

    ``takes`` says what :meth:`aggregate` expects in ``result.params``: the
    client's local model (``"model"``) or its pseudo-gradient
    ``x_local - x_base`` (``"delta"``), which the flow forms in float64 from
    the base model the task was sent with. The base models of tasks in
    flight are kept by :meth:`keep` / :meth:`base` / :meth:`drop`, a
    reference-counted history a rule may replace with its own (AsyncFedED's
    GMIS).
    """

    takes: ClassVar[Literal["model", "delta"]] = "model"

    def __init__(self) -> None:
        self._bases: dict[int, list[Any]] = {}  # version -> [model, holders]

    @abstractmethod
    def aggregate(
        self, x: torch.Tensor, version: int, result: Update
    ) -> tuple[torch.Tensor | None, Info]:
        """Apply one result; the new model, or None (buffered or discarded)."""

    def budget(self, client: int) -> LocalWork | None:
        """The local budget of ``client``'s next task (None: the scenario's)."""
        return None

    def rejoined(self, client: int) -> None:
        """``client`` is back from being away (its task, if any, was abandoned).

        Most rules keep nothing per client and ignore it.
        """
        return None

    def keep(self, version: int, x: torch.Tensor) -> None:
        """A task was dispatched from ``x`` at ``version``: hold it."""
        entry = self._bases.setdefault(version, [x, 0])
        entry[1] += 1

    def base(self, version: int) -> torch.Tensor:
        """The model a task at ``version`` was sent."""
        try:
            return self._bases[version][0]  # type: ignore[no-any-return]
        except KeyError:
            raise ValueError(f"Invalid base version {version}: not held") from None

    def drop(self, version: int) -> None:
        """Release one hold on ``version``."""
        entry = self._bases.get(version)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] <= 0:
            del self._bases[version]

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """The rule's state."""

    @abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""


class AsyncFlow(ServerAlgorithm):
    """Asynchronous updates: ``concurrency`` clients in flight, every result applied.

    A client's task is abandoned when it comes back from being away, when
    its task times out (``task_timeout``) or when it is lost; a result of an
    abandoned task is discarded with the reason logged.
    """

    cadence = "updates"

    def __init__(self, rule: AsyncRule, cfg: AsyncConfig, ctx: ServerContext) -> None:
        """``rule`` applies the updates; ``cfg`` (validated) says how many tasks are in
        flight, when one times out and how updates are guarded; ``ctx`` gives the
        initial model, the clients, the seed and the task maker."""
        self.rule = rule
        self.make_task = ctx.tasks
        self.guard = UpdateGuard(cfg.guard) if cfg.guard is not None else None
        self.sched = AsyncScheduler(cfg.concurrency or ctx.num_clients,
                                    task_timeout=cfg.task_timeout, seed=ctx.seed)
        self.x = ctx.x0
        self.version = 0
        self.round = 0
        self.task_version: dict[int, int] = {}

    def model(self) -> torch.Tensor:
        return self.x

    def _release(self, client: int) -> None:
        v = self.task_version.pop(client, None)
        if v is not None and self.rule.takes == "delta":
            self.rule.drop(v)

    def start(self, clients: Sequence[int], now: float) -> Step:
        for c in clients:
            self.sched.add(c)
        return Step(tasks=self._fill(now))

    def rejoin(self, client: int, now: float, reset: bool) -> Step:
        self._release(client)
        self.rule.rejoined(client)
        self.sched.add(client)
        return Step(tasks=self._fill(now))

    def lost(self, client: int, now: float) -> Step:
        self._release(client)
        self.sched.remove(client, "lose")
        return Step(tasks=self._fill(now))

    def _fill(self, now: float) -> list[Task]:
        """Tasks for the clients the scheduler starts now."""
        return [self._task(c) for c in self.sched.fill(now)]

    def _task(self, client: int) -> Task:
        self._release(client)
        task = self.make_task(client, self.version, 0, self.x, self.rule.budget(client))
        self.sched.bind(client, task.task_id)
        self.task_version[client] = self.version
        if self.rule.takes == "delta":
            self.rule.keep(self.version, self.x)
        return task

    def update(self, upload: Update, now: float) -> Step:
        step = Step()
        current = self.sched.on_result(upload.client, upload.task_id)
        if not current:
            step.discarded.append(Discarded(upload.client,
                                            f"result of an abandoned task {upload.task_id}"))
            step.tasks = self._fill(now)
            return step
        if self.guard is not None:
            guarded = _guard(self.guard, upload, self.x, step)
            if guarded is None:
                self._release(upload.client)
                step.tasks = self._fill(now)
                return step
            upload = guarded
        try:
            result = upload
            if self.rule.takes == "delta":
                delta = pseudo_gradient(self.rule.base(upload.base_version), upload.params)
                result = upload.with_params(delta)
            new, info = self.rule.aggregate(self.x, self.version, result)
        except (NonFiniteUpdate, ValueError, KeyError) as exc:
            new, info = None, {}
            step.discarded.append(Discarded(upload.client, str(exc)))
        self._release(upload.client)
        if new is not None:
            self.x = new
            self.version += 1
            clients = tuple(info.get("clients") or (upload.client,))
            stale = tuple(int(s) for s in info.get("stalenesses") or (info["staleness"],))
            step.applied.append(Applied(
                version=self.version, clients=clients, staleness=stale,
                base_version=upload.base_version,
                metrics=_metrics(info, ("staleness", "clients", "stalenesses", "buffered"))))
        elif not step.discarded and info.get("discarded"):
            why = info.get("reason") or f"staleness {info.get('staleness')} above max_staleness"
            step.discarded.append(Discarded(upload.client, why, info.get("staleness")))
        step.tasks = self._fill(now)
        return step

    def timer(self, now: float) -> Step:
        for c in self.sched.expire(now):
            self._release(c)
        return Step(tasks=self._fill(now))

    def next_timer(self) -> float | None:
        return self.sched.next_expiry()

    def in_flight(self) -> int:
        return len(self.sched.training())

    def state_dict(self) -> dict[str, Any]:
        return {"x": pack_tensor(self.x), "version": self.version,
                "rule": self.rule.state_dict(), "sched_rng": _rng_state(self.sched.rng)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.x = unpack_tensor(state["x"])
        self.version = int(state["version"])
        self.rule.load_state_dict(state["rule"])
        if "sched_rng" in state:  # which idle client gets the next task
            self.sched.rng.setstate(_rng_restore(state["sched_rng"]))


class RoundRule(ABC):
    """A synchronous server rule: one round's results in, a new model out."""

    @abstractmethod
    def aggregate(
        self, x: torch.Tensor, results: Sequence[Update]
    ) -> tuple[torch.Tensor, Info]:
        """Aggregate one round; raise (NonFiniteUpdate, ValueError) before changing state."""

    def payload(self, x: torch.Tensor) -> torch.Tensor:
        """What a task carries (the model; SCAFFOLD appends its control variate)."""
        return x

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """The rule's state."""

    @abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""


class RoundsFlow(ServerAlgorithm):
    """Synchronous rounds with sampling, over-selection and a deadline.

    A round opens over the available clients, closes when it has the results
    it needs (or its deadline passes, or every selected client dropped out),
    aggregates what arrived, and the next one opens at once.
    """

    cadence = "rounds"

    def __init__(self, rule: RoundRule, cfg: RoundsConfig, ctx: ServerContext) -> None:
        """``rule`` aggregates a round; ``cfg`` (validated) says how rounds sample, wait
        and guard, and, when it takes
        :class:`~fedsim.algorithms.robust.AggregatorKeys`, how the round's models are
        combined; ``ctx`` gives the initial model, the clients, the seed and the task
        maker."""
        self.rule = rule
        self.guard = UpdateGuard(cfg.guard) if cfg.guard is not None else None
        #: the robust centre of a round's models, when the config asks for one (None:
        #: the rule gets the round's results themselves)
        self.robust: AggregatorKeys | None = (
            cfg if isinstance(cfg, AggregatorKeys) and cfg.aggregator != "mean" else None)
        self.sched = RoundScheduler(cfg.fraction, min_clients=cfg.min_clients,
                                    over_selection=cfg.over_selection,
                                    deadline=cfg.round_deadline, seed=ctx.seed)
        self.total = ctx.num_clients
        self.x = ctx.x0
        self.version = 0
        self.available: set[int] = set()
        self.busy: set[int] = set()
        self.results: list[Update] = []
        self.started = False
        self._payload: tuple[int, torch.Tensor] | None = None
        self.make_task = ctx.tasks

    @property
    def round(self) -> int:  # type: ignore[override]
        return self.sched.round

    def model(self) -> torch.Tensor:
        return self.x

    def _open(self, now: float) -> list[Task]:
        pool = self.available - self.busy
        if not pool or self.sched.state != "closed":
            return []
        plan = self.sched.open_round(now, pool, self.total)
        self.busy.update(plan.selected)
        self.results = []
        return [self._task(c) for c in plan.selected]

    def start(self, clients: Sequence[int], now: float) -> Step:
        self.started = True
        self.available.update(clients)
        return Step(tasks=self._open(now))

    def rejoin(self, client: int, now: float, reset: bool) -> Step:
        step = self._drop(client, now)
        self.available.add(client)
        if self.started and self.sched.state == "closed":
            step.tasks.extend(self._open(now))
        return step

    def lost(self, client: int, now: float) -> Step:
        self.available.discard(client)
        return self._drop(client, now)

    def _drop(self, client: int, now: float) -> Step:
        self.busy.discard(client)
        self.sched.on_dropped(client)
        return self._close(now) if self.sched.complete() else Step()

    def _task(self, client: int) -> Task:
        if self._payload is None or self._payload[0] != self.version:
            self._payload = (self.version, self.rule.payload(self.x))
        return self.make_task(client, self.version, self.sched.round, self._payload[1])

    def update(self, upload: Update, now: float) -> Step:
        self.busy.discard(upload.client)
        if not self.sched.on_result(upload.round, upload.client):
            return Step(discarded=[Discarded(upload.client, f"late for round {upload.round}")])
        step = Step()
        if self.guard is not None:
            guarded = _guard(self.guard, upload, self.x, step)
            if guarded is None:
                # a rejected result still counts as the client's answer to the round
                return step.then(self._close(now)) if self.sched.complete() else step
            upload = guarded
        self.results.append(upload)
        return step.then(self._close(now)) if self.sched.complete() else step

    def _close(self, now: float) -> Step:
        step = Step(rounds_closed=1)
        closed = self.sched.round
        used = set(self.sched.close(now))
        good = []
        for r in self.results:
            if r.client not in used:
                continue
            if not all_finite(r.params):
                step.discarded.append(Discarded(r.client, "non-finite update"))
            else:
                good.append(r)
        self.results = []
        robust = self.robust
        if good and robust is not None:
            # one robust centre of the round's models stands for them all
            center = aggregate_models([r.params for r in good], robust.aggregator, robust.trim)
            merged = good[0].with_params(center, num_samples=sum(r.num_samples for r in good),
                                         steps=max(r.steps for r in good))
            try:
                new, info = self.rule.aggregate(self.x, [merged])
            except (NonFiniteUpdate, ValueError) as exc:
                step.discarded.extend(Discarded(r.client, str(exc)) for r in good)
            else:
                info = {**info, "aggregator": robust.aggregator}
                self.x = new
                self.version += 1
                step.applied.append(Applied(
                    version=self.version, clients=tuple(r.client for r in good), round=closed,
                    metrics=_metrics(info, ("clients",))))
        elif good:
            try:
                new, info = self.rule.aggregate(self.x, good)
            except (NonFiniteUpdate, ValueError) as exc:
                step.discarded.extend(Discarded(r.client, str(exc)) for r in good)
            else:
                self.x = new
                self.version += 1
                step.applied.append(Applied(
                    version=self.version, clients=tuple(r.client for r in good), round=closed,
                    metrics=_metrics(info, ("clients",))))
        step.tasks = self._open(now)
        return step

    def timer(self, now: float) -> Step:
        if self.sched.deadline_passed(now):
            return self._close(now)
        return Step(tasks=self._open(now) if self.started else [])

    def next_timer(self) -> float | None:
        cur = self.sched.current
        return None if cur is None else cur.plan.deadline_at

    def in_flight(self) -> int:
        return len(self.busy)

    def state_dict(self) -> dict[str, Any]:
        return {"x": pack_tensor(self.x), "version": self.version,
                "rule": self.rule.state_dict(), "round": self.sched.round,
                "sched_rng": _rng_state(self.sched.rng)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.x = unpack_tensor(state["x"])
        self.version = int(state["version"])
        self.rule.load_state_dict(state["rule"])
        if "round" in state:  # the round numbers and the sampling go on where they were
            self.sched.round = int(state["round"])
            self.sched.rng.setstate(_rng_restore(state["sched_rng"]))


def _guard(guard: UpdateGuard, upload: Update, x: torch.Tensor,
           step: Step) -> Update | None:
    """``upload`` through the guard: as it is, clipped, or None (rejected, and
    discarded with the reason); a rejection or a clip is noted in ``step``."""
    r = guard.inspect(upload.params, x)
    if r.action is not None:
        step.guarded.append(Guarded(upload.client, r.action, r.norm, r.bound))
    if r.params is None:
        assert r.reason is not None
        step.discarded.append(Discarded(upload.client, r.reason))
        return None
    return upload if r.action is None else upload.with_params(r.params)


def _rng_state(rng: random.Random) -> list[Any]:
    """A ``random.Random``'s state as plain lists (a state_dict holds plain data)."""
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]


def _rng_restore(state: list[Any]) -> tuple[Any, ...]:
    """The inverse of :func:`_rng_state`, for ``random.Random.setstate``."""
    version, internal, gauss = state
    return (version, tuple(internal), gauss)
