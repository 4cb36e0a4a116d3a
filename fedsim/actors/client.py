"""The client actor: one emulated device inside a client host.

A client has an inbox and speaks through its host's connection. Messages
from the server pass through the client's downlink on arrival: the host's
timer heap holds each one until the link delivers it, then puts it in the
inbox. A task's local work runs in the host's torch worker, piece by piece
(most algorithms need one piece; a pipelined one keeps asking
for more, passing on the round averages that arrived). The actor holds each
piece until the device's emulated compute time has passed and then sends
its upload. A piece that comes back after that deadline is a fidelity
violation: it is counted and logged, never hidden. A device that computes
instantly (``devices.step_time = 0``) has its deadline when the piece
began: its real compute, in emulated seconds, is recorded as lateness.

Availability: a client can be *away* (suspended for a while after a run, or
off in an on/off process or trace). Away, it computes nothing and sends
nothing; a single-piece run in progress is abandoned, a pipelined session
pauses. Messages that reach it while away are held until it returns
(``network.in_flight = "held"``) or lost (``"dropped"``, ``"reset"``). Back,
it announces itself with :class:`~fedsim.wire.messages.Ready` and the server
gives it fresh work.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import deque
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass
from time import perf_counter
from typing import Any, Protocol

import numpy as np

from fedsim.results.phases import PhaseStats
from fedsim.scenario import Scenario
from fedsim.scenario.network import ALWAYS, DeviceModel, NetPlan
from fedsim.wire.codec import Frame, Frames, Meta
from fedsim.wire.messages import (
    Advance,
    Average,
    Failed,
    Message,
    Ready,
    Task,
    Trained,
    WorkerFailed,
    WorkerReady,
)
from fedsim.wire.tensors import Model, TensorSpec
from netem.availability import Availability, Suspension
from netem.clock import Clock
from netem.fidelity import FidelityMonitor
from netem.link import Delivery, Link
from netem.timers import TimerHeap

__all__ = ["ClientActor", "HostServices", "Received", "Trainer"]


class Trainer(Protocol):
    """What a client host and its actors use of the host's trainer
    (:class:`fedsim.actors.workers.WorkerHandle`, or an in-process
    :class:`fedsim.actors.worker.InlineWorker`)."""

    async def start(self) -> WorkerReady:
        """Start it; its clients' sample counts and the model's spec."""
        ...

    def next_id(self) -> int:
        """A fresh request id."""
        ...

    async def train(self, frames: Frames) -> Trained | WorkerFailed:
        """Send a task's frames (due time and request id in the envelope); await the reply."""
        ...

    async def request(self, msg: Advance) -> Trained | WorkerFailed:
        """Send a request (an Advance); await the reply."""
        ...

    def upload(self, request_id: int) -> Frames | None:
        """The frames of the update the reply to ``request_id`` uploads (None: none)."""
        ...


class HostServices(Protocol):
    """What a client actor uses of its host (:class:`fedsim.actors.host.ClientHost`)."""

    sc: Scenario
    plan: NetPlan
    clock: Clock
    timers: TimerHeap
    monitor: FidelityMonitor
    trainer: Trainer
    model_spec: TensorSpec
    overruns: int
    compute_deadlines: int
    phases: PhaseStats

    def emit(self, ev: str, at: float | None = None, **fields: Any) -> None:
        """Record an event, at emulated time ``at`` (None: now)."""
        ...

    async def send(self, msg: Message) -> None:
        """Send a client's message to the server."""
        ...

    async def forward(self, frames: Frames, client: int) -> None:
        """Send a client's update, as its trainer encoded it, to the server."""
        ...

    def task_frames(self, rec: Received, due: float, request_id: int) -> list[Frame]:
        """A task's frames for the trainer, stamped with its due time and request id."""
        ...

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        """Run a client's work as a task of the host's (its failure is the host's)."""
        ...

    def expected_steps(self, task: Task, num_samples: int) -> int | None:
        """Local steps ``task`` will take (None: known only when done)."""
        ...

    def advance(self, client: int, averages: Mapping[int, Model], due: float,
                request_id: int) -> Advance:
        """A pipelined session's next piece for the trainer, with these round averages."""
        ...

log = logging.getLogger(__name__)

_STEP_SIZES = ("lr_last", "lr_mean", "lr_min", "lr_max", "ascent_scale")


@dataclass(frozen=True, slots=True)
class _Back:
    """Inbox marker: the client is available again."""

    reset: bool


@dataclass(frozen=True, slots=True)
class _Stop:
    """Inbox marker: the host is stopping."""


@dataclass(frozen=True, slots=True)
class Received:
    """A task as it reached its host: the task (with its version's model), the frames it
    came in (forwarded to the trainer as they are) and whether they carry the model."""

    task: Task
    frames: Frames
    inline: bool

    @property
    def version(self) -> int:
        return self.task.version


Inbox = Received | Average | _Back | _Stop


@dataclass(frozen=True, slots=True)
class _Start:
    """When a piece of a task's work began: the emulated instant its compute is charged
    from, the client's time away by then (:meth:`ClientActor._away_total`), and the
    index of the run (the device's draws are keyed by it)."""

    t0: float
    away0: float
    run_index: int


class ClientActor:
    """Protocol of one client: train tasks, send updates, follow its availability.

    An idle client is a small object and nothing else: no asyncio task, no
    timer (but its next availability change, if it has an availability
    process), no queue, no link. Its downlink and random streams are made on
    first use (each is keyed by the client's id, so when it is made does not
    change what it draws), and a task runs only while there is something in
    its inbox: putting an item there starts one, which serves the inbox and
    ends when it is empty. The host builds its actors before it registers
    (set-up, before the emulated clock starts) and starts them at t = 0.
    """

    __slots__ = ("_back", "_down", "_rngs", "_task", "_waiter", "availability", "away",
                 "away_since", "cid", "generation", "held", "host", "inbox", "last_budget",
                 "num_samples", "overruns", "rejected", "runs", "stopped", "suspension",
                 "time_away")

    def __init__(self, cid: int, host: HostServices, num_samples: int) -> None:
        self.cid = cid
        self.host = host
        self.num_samples = num_samples
        # each item with the real time it was put there (perf_counter), or None if
        # the actor was busy then (not counted as queueing); made on first use
        self.inbox: deque[tuple[Inbox, float | None]] | None = None
        self._task: asyncio.Task[None] | None = None
        self._waiter: asyncio.Future[None] | None = None  # the task waits for an item
        self._back: asyncio.Future[None] | None = None  # the task waits to be back
        self._down: Link | None = None
        self._rngs: tuple[np.random.Generator, np.random.Generator] | None = None
        self.suspension = host.plan.suspension(cid)
        self.availability: Availability = host.plan.availability(cid)
        self.rejected = 0
        self.overruns = 0
        self.runs = 0
        #: the emulated compute of the client's last piece of work
        self.last_budget = 0.0
        self.stopped = False
        self.away = False
        self.generation = 0
        self.held: list[Received | Average] = []
        self.away_since = 0.0  # when the current absence began
        self.time_away = 0.0  # emulated seconds away, in absences that ended

    # -- what is made on first use ----------------------------------------------
    @property
    def down(self) -> Link:
        """The client's downlink (made when the first message reaches it)."""
        if self._down is None:
            self._down = self.host.plan.make_link(self.cid, "down")
        return self._down

    @property
    def has_link(self) -> bool:
        """Whether a message has reached the client (its downlink exists)."""
        return self._down is not None

    @property
    def kind(self) -> str:
        """Fidelity bucket of the downlink."""
        return self.host.plan.kind(self.cid, "down")

    @property
    def device(self) -> DeviceModel:
        return self.host.plan.device(self.cid)

    def _streams(self) -> tuple[np.random.Generator, np.random.Generator]:
        if self._rngs is None:
            plan = self.host.plan
            self._rngs = (plan.device_rng(self.cid), plan.suspension_rng(self.cid))
        return self._rngs

    @property
    def device_rng(self) -> np.random.Generator:
        return self._streams()[0]

    @property
    def suspension_rng(self) -> np.random.Generator:
        return self._streams()[1]

    # -- lifecycle ------------------------------------------------------------
    def start(self, t: float = 0.0) -> None:
        """Emulated ``t`` (0, or when the host joined a running or resumed federation):
        follow the client's availability from then on (an idle client then just waits)."""
        self._watch_availability(t)

    @property
    def task(self) -> asyncio.Task[None] | None:
        """The task serving the inbox, if the actor has work."""
        return self._task

    async def _serve(self) -> None:
        """Serve the inbox until it is empty (or the host stops)."""
        try:
            while self.inbox:
                msg = self._take()
                if isinstance(msg, _Stop):
                    self.stopped = True
                    break
                if isinstance(msg, Received) and self.away:
                    self.held.append(msg)  # it went away with the task in its inbox
                elif isinstance(msg, Received):
                    await self.on_task(msg)
                elif isinstance(msg, _Back):
                    await self._announce(msg.reset)
                # an Average after its session ended is nothing to act on
        finally:
            self._task = None

    def stop(self) -> None:
        """Ask the actor to finish (after the piece of work it is running)."""
        if self._task is None:
            self.stopped = True  # idle: nothing to finish
        else:
            self._post(_Stop())

    # -- availability -----------------------------------------------------------
    def _watch_availability(self, t: float) -> None:
        """Follow an on/off process or trace: go away and come back on its changes."""
        av = self.availability
        if av is ALWAYS:
            return
        if not av.is_available(t) and not self.away:
            self._go_away("off")
        t_next, on_after = av.next_change(t)
        if math.isfinite(t_next):
            self.host.timers.call_at(t_next, self._availability_changed, t_next, on_after)

    def _availability_changed(self, t: float, on: bool) -> None:
        if self.stopped:
            return
        if on and self.away:
            self._come_back("on")
        elif not on and not self.away:
            self._go_away("off")
        self._watch_availability(t)

    def _go_away(self, why: str, until: float | None = None) -> None:
        if not self.away:
            self.away_since = self.host.clock.now()
        self.away = True
        self.generation += 1
        self.host.emit("away", client=self.cid, why=why, until=until)

    def _come_back(self, why: str, announce: bool = True) -> None:
        if self.away:
            self.time_away += self.host.clock.now() - self.away_since
        self.away = False
        back, self._back = self._back, None
        if back is not None and not back.done():
            back.set_result(None)
        self.host.emit("back", client=self.cid, why=why, held=len(self.held))
        has_task = any(isinstance(m, Received) for m in self.held)
        for msg in self.held:
            self._post(msg)
        self.held = []
        if announce and not has_task:  # a held task is the work; its update says "back"
            self._post(_Back(reset=self.host.sc.network.in_flight == "reset"))

    async def _until_back(self) -> None:
        """Wait while the client is away (return at once if it is not)."""
        if not self.away:
            return
        if self._back is None or self._back.done():
            self._back = asyncio.get_running_loop().create_future()
        await self._back

    def _away_total(self) -> float:
        """Emulated seconds this client has been away, the current absence included."""
        now = self.host.clock.now()
        return self.time_away + (now - self.away_since if self.away else 0.0)

    async def _compute(self, t0: float, away0: float, budget: float) -> None:
        """Wait until the device has computed ``budget`` seconds since ``t0``, away time excluded.

        A pipelined session pauses while its client is away (``away0`` is
        :meth:`_away_total` at ``t0``): a piece under way when the client
        goes off finishes that much later after it comes back, and nothing
        of it (corrections, upload) happens while it is away.
        """
        clock = self.host.clock
        while True:
            await self._until_back()
            left = budget - (clock.now() - t0 - (self._away_total() - away0))
            if left <= 1e-9:
                return
            await self.host.timers.sleep_until(clock.now() + left)

    async def _announce(self, reset: bool) -> None:
        if not self.away:
            await self.host.send(Ready(client=self.cid, reset=reset))

    # -- network --------------------------------------------------------------
    def arrived(self, msg: Received | Average, meta: Meta) -> None:
        """A message for this client reached its host: schedule it on the downlink."""
        d = self.down.schedule(meta.sent_at, meta.nbytes)
        if d.dropped:
            self.host.emit("drop", client=self.cid, kind=meta.kind.lower(), bytes=meta.nbytes,
                           dir="down", sent_at=meta.sent_at, reason=d.reason)
            return
        self.host.timers.call_at(d.t_deliver, self._deliver, msg, meta, d, self.generation)

    def _deliver(self, msg: Received | Average, meta: Meta, d: Delivery, generation: int) -> None:
        host = self.host
        now = host.clock.now()
        host.monitor.record_delivery(self.kind, d, now)
        policy = host.sc.network.in_flight
        lost = (self.away and policy != "held") or (
            policy == "reset" and generation != self.generation)
        host.emit("drop" if lost else "deliver", client=self.cid, kind=meta.kind.lower(),
                  dir="down",
                  bytes=meta.nbytes, sent_at=meta.sent_at, scheduled=d.t_deliver,
                  version=msg.version, reason=f"away ({policy})" if lost else None)
        if lost:
            return
        if self.away:
            self.held.append(msg)
        else:
            self._post(msg)

    def _post(self, item: Inbox) -> None:
        """Put ``item`` in the inbox, stamped with the real time it arrived there.

        An idle actor gets a task to serve it; one waiting for an item is
        woken; a stopped one takes nothing more.
        """
        if self.stopped:
            return
        waiting = self._waiter is not None or self._task is None
        if self.inbox is None:
            self.inbox = deque()
        self.inbox.append((item, perf_counter() if waiting else None))
        if self._waiter is not None:
            waiter, self._waiter = self._waiter, None
            if not waiter.done():
                waiter.set_result(None)
        elif self._task is None:
            self._task = self.host.spawn(self._serve(), f"client-{self.cid}")

    def _take(self) -> Inbox:
        """The next inbox item (there is one).

        A message that arrived while the actor waited for it (idle, or
        waiting for its next item) counts in the host's queueing phase: the
        real seconds from its delivery into the inbox until the actor runs
        with it (how long the host's event loop took to get to it). One that
        arrived while the actor was busy (a piece of a pipelined session
        under way) waited for the protocol, not for the process, and is not
        counted.
        """
        assert self.inbox
        item, posted = self.inbox.popleft()
        if posted is not None and isinstance(item, Received | Average):
            self.host.phases.add("queueing.hosts", perf_counter() - posted)
        return item

    async def _next(self) -> Inbox:
        """The next inbox item, waiting for one."""
        while not self.inbox:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._take()

    # -- work -----------------------------------------------------------------
    async def on_task(self, rec: Received) -> None:
        """Run a task's local work, piece by piece, and send its uploads.

        Its steps each have a method: the start of the run (:meth:`_begin`),
        the suspension drawn for it (:meth:`_draw_suspension`; one that
        discards the update wastes the run, :meth:`_wasted`), the time the
        trainer's first piece is due (:meth:`_due`), and the pieces, each held
        until the device has computed it and then uploaded (:meth:`_pipeline`).
        Within a piece: the trainer's failure (:meth:`_failed`), the device's
        compute time and the fidelity accounting (:meth:`_account`), the wait
        for that compute (:meth:`_hold`), the end of a task's work
        (:meth:`_finish`) and a pipelined session's next piece (:meth:`_advance`).
        """
        host = self.host
        task = rec.task
        start = self._begin()
        gen = self.generation
        # stamped t0, the instant its compute is charged from (a stall before the
        # record would otherwise date the start after a short piece's deadline)
        host.emit("train_start", at=start.t0, client=self.cid, version=task.version,
                  task_id=task.task_id, round=task.round)
        expected = host.expected_steps(task, self.num_samples)
        susp = self._draw_suspension(expected, start.run_index)
        if susp is not None and susp.discard_update:
            await self._wasted(task, start.t0 + susp.unavailable_for, gen)
            return
        due = self._due(start.t0, expected)
        rid = host.trainer.next_id()
        reply = await host.trainer.train(host.task_frames(rec, due, rid))
        await self._pipeline(task, start, rid, reply, gen, susp)

    def _begin(self) -> _Start:
        """A piece of work starts now, as the client's next run."""
        t0 = self.host.clock.now()
        away0 = self._away_total()
        run_index, self.runs = self.runs, self.runs + 1
        return _Start(t0, away0, run_index)

    def _draw_suspension(self, expected: int | None, run_index: int) -> Suspension | None:
        """The suspension drawn for a run of ``expected`` steps (None: it is not suspended)."""
        if self.suspension is None:
            return None
        # a run of unknown length (its client's own code) is expected to take
        # what the client's previous one did
        t_run = (self.device.compute_time(expected, self.device_rng, run_index)
                 if expected is not None else self.last_budget)
        return self.suspension.draw_run(t_run, self.suspension_rng)

    def _due(self, t0: float, expected: int | None) -> float:
        """When a task begun at ``t0`` is due: its mean compute, else the last run's budget."""
        return t0 + (self.device.mean_step() * expected if expected is not None
                     else self.last_budget)

    async def _pipeline(self, task: Task, start: _Start, rid: int,
                        reply: Trained | WorkerFailed, gen: int,
                        susp: Suspension | None) -> None:
        """Each piece in turn: held for its device compute, then uploaded; then the next, if any."""
        host = self.host
        while True:
            upload = host.trainer.upload(rid)   # the update's frames, if the piece uploads
            if not isinstance(reply, Trained):
                await self._failed(task, reply)
                return
            done, budget = self._account(reply, start.t0, start.run_index)
            self.last_budget = budget
            deadline = start.t0 + budget
            await self._hold(reply, start, done, budget, deadline)
            for r, delay in reply.notes.get("corrections", []):
                host.emit("correction", client=self.cid, round=r, delay=delay)
            if reply.next == "done" and not await self._finish(task, reply, done, deadline,
                                                               gen, susp):
                return
            await self._until_back()  # away: no compute, no traffic until back
            if upload is not None:
                await host.forward(upload, self.cid)
            if reply.next == "done":
                return
            averages = await self._averages(reply.wait_round if reply.next == "wait" else None)
            if averages is None:
                return
            await self._until_back()
            start = self._begin()
            rid, reply = await self._advance(averages, start.t0)

    async def _hold(self, reply: Trained, start: _Start, done: float, budget: float,
                    deadline: float) -> None:
        """Wait until the device has computed, in ``budget`` s (by ``deadline``), the piece
        back at ``done``."""
        if reply.next != "done":  # a pipelined session: time away does not compute
            await self._compute(start.t0, start.away0, budget)
        elif budget > 0 and done <= deadline:
            await self.host.timers.sleep_until(deadline)

    async def _wasted(self, task: Task, until: float, gen: int) -> None:
        """A suspension wastes the run and the client hangs until ``until``: nothing
        computed, nothing sent."""
        host = self.host
        self._go_away("suspend", until=until)
        host.emit("train_end", client=self.cid, version=task.version, task_id=task.task_id,
                  reason="suspended")
        await host.timers.sleep_until(until)
        if self.away and gen + 1 == self.generation:
            self._come_back("resume")

    async def _failed(self, task: Task, reply: WorkerFailed) -> None:
        """The trainer failed the task: the device is out, and says so (the server
        does not wait for it)."""
        host = self.host
        reason, cause = reply.reason, reply.cause
        log.error("client %d: training failed (%s): %s", self.cid, cause, reason)
        host.emit("train_error", client=self.cid, task_id=task.task_id, cause=cause,
                  reason=reason[:300])
        await host.send(Failed(client=self.cid, cause=cause,
                               reason=f"training failed: {reason}"))

    def _cpu_speed(self) -> float:
        """How much slower than this machine the client's device computes: its speed
        factor (``devices.model = "speed_factor"``), else its mean step time over the
        scenario's ``devices.step_time`` (1 when that is 0: CPU time as measured)."""
        factor = getattr(self.device, "factor", None)
        if isinstance(factor, float | int):
            return float(factor)
        step = self.host.sc.devices.step_time
        return float(self.device.mean_step()) / step if step > 0 else 1.0

    def _account(self, reply: Trained, t0: float, run_index: int) -> tuple[float, float]:
        """A piece's compute: its device time (its budget, due at ``t0`` + budget) and
        the fidelity accounting of the real one; (when it came back, the budget)."""
        host = self.host
        done = host.clock.now()
        if reply.cpu_s is not None:   # charged by the CPU time of the client's own code
            budget = reply.cpu_s * self._cpu_speed()
        else:
            budget = self.device.compute_time(reply.steps, self.device_rng, run_index) \
                if reply.steps else 0.0
        worked = bool(reply.steps) or reply.cpu_s is not None
        if worked:  # one local run (or piece): its real compute, its emulated budget
            host.phases.add("compute.real", reply.compute_s)
            host.phases.add("compute.budget", budget)
        if budget > 0:
            host.monitor.record_compute(budget, done - t0)
            host.compute_deadlines += 1
            if done > t0 + budget:
                self.overruns += 1
                host.overruns += 1
        elif worked:
            # An instant device's result is due the moment its work began:
            # the real compute, in emulated seconds, is how late it came
            # (judged like a late delivery, not silently taken as time).
            host.monitor.record_lateness(done - t0)
        return done, budget

    async def _finish(self, task: Task, reply: Trained, done: float, deadline: float,
                      gen: int, susp: Suspension | None) -> bool:
        """A task's work is done: log it; a suspension that keeps the work hangs
        first. False: the client went away meanwhile (its update is not sent)."""
        host = self.host
        if gen != self.generation and susp is None:
            host.emit("train_end", client=self.cid, version=task.version, task_id=task.task_id,
                      steps=reply.steps, reason="went away")
            return False
        host.emit("train_end", client=self.cid, version=task.version, task_id=task.task_id,
                  steps=reply.steps, deadline=deadline,
                  overrun=round(max(0.0, done - deadline), 6), compute_real=reply.compute_s,
                  **{k: reply.notes[k] for k in _STEP_SIZES if k in reply.notes})
        if susp is not None:  # suspended with the work kept: hang, then send
            until = host.clock.now() + susp.hang
            self._go_away("suspend", until=until)
            await host.timers.sleep_until(until)
            self._come_back("resume", announce=False)
        return True

    async def _advance(self, averages: dict[int, Average], t0: float
                       ) -> tuple[int, Trained | WorkerFailed]:
        """A pipelined session's next piece, with the round averages that arrived
        (one model of the rounds' averages back to back); its request id and reply."""
        host = self.host
        rid = host.trainer.next_id()
        msg = host.advance(self.cid, {r: _held(a) for r, a in averages.items()}, t0, rid)
        reply = await host.trainer.request(msg)
        return rid, reply

    async def _averages(self, wait_round: int | None) -> dict[int, Average] | None:
        """Round averages that arrived (waiting for ``wait_round`` first); None: stop."""
        averages: dict[int, Average] = {}
        if wait_round is not None:
            self.host.emit("barrier_wait", client=self.cid, round=wait_round)
            while wait_round not in averages:
                msg = await self._next()
                if isinstance(msg, _Stop):
                    self.stopped = True
                    return None
                if isinstance(msg, Average):
                    averages[msg.round] = msg
                elif isinstance(msg, _Back):
                    await self._announce(msg.reset)
            self.host.emit("barrier_resume", client=self.cid, round=wait_round)
        while self.inbox:
            msg, _ = self.inbox.popleft()
            if isinstance(msg, _Stop):
                self.stopped = True
                return None
            if isinstance(msg, Average):
                averages[msg.round] = msg
            elif isinstance(msg, _Back):
                await self._announce(msg.reset)
        return averages


def _held(average: Average) -> Model:
    """An average's model (its host put back any it held: none reaches an actor without)."""
    assert average.model is not None
    return average.model
