"""The server actor: one endpoint for every client host, one event queue.

Client hosts register over the control path before the emulated clock
starts (:mod:`.hosts`); the federation begins at t = 0 with the clients
that registered, or after ``deploy.start_timeout`` real seconds with those
present (the missing ones are named). Every client message then passes
through that client's uplink on arrival: the timer heap holds it until the
link delivers it, and the actor's single queue hands it to the algorithm
(:class:`~fedsim.algorithms.api.ServerAlgorithm`), one event at a time, so
updates are applied strictly in delivery order and staleness is whatever
really happened. The algorithm answers with decisions (a
:class:`~fedsim.algorithms.api.Step`); the actor sends, times and logs.
Every queue item is a frozen value dispatched by type. The actor's tasks
run in one ``asyncio.TaskGroup``: a reader that crashes ends the run with a
logged error and a written summary.

:class:`Server` is this module's run, event loop and decisions, with its
parts in their own modules, each owning its state:
:class:`~fedsim.actors.host_sessions.HostSessions` (registration, the
reader and its checks, the hosts' silence and goodbyes; the limits it
applies before it unpacks a message are in :mod:`.server_gate`),
:class:`~fedsim.actors.uplinks.Uplinks` (a client's message through its
emulated uplink to the queue), :class:`~fedsim.actors.downlinks.Downlinks`
(a task or an average stamped, charged and sent),
:class:`~fedsim.actors.client_links.ClientLinks` and
:class:`~fedsim.actors.client_links.SendTimes` (the server's copies of the
clients' links, the check of claimed send times),
:class:`~fedsim.actors.checkpoint.Checkpointer` (when a checkpoint is due,
its writer thread, a restore; its home also holds
:func:`~fedsim.actors.checkpoint.load_checkpoint`, which a resumed run
calls before the server exists) and
:class:`~fedsim.actors._server_measure.RunMeasures` (the fidelity verdict
and the totals, read from the parts it is given). The parts read the run
through :class:`~fedsim.actors._server_view.RunView`, never the server's
private attributes. What the queue carries is in :mod:`._server_queue`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from time import perf_counter
from typing import Any

import torch

from fedsim.actors._server_measure import RunMeasures
from fedsim.actors._server_queue import (
    AlgorithmTimer,
    ClientMessage,
    EvalTimer,
    FromClient,
    HostExited,
    HostJoined,
    Item,
    StopRun,
    Tick,
    Wake,
)
from fedsim.actors._server_tasks import TaskBook, TaskRecord
from fedsim.actors.checkpoint import Checkpointer
from fedsim.actors.client_links import ClientLinks, SendTimes
from fedsim.actors.downlinks import Downlinks
from fedsim.actors.host_sessions import HostSessions
from fedsim.actors.hosts import HostTable
from fedsim.actors.process import freeze_heap, process_age, thaw_heap, to_foreground
from fedsim.actors.runstate import Evaluator, Progress, RunState
from fedsim.actors.server_gate import RecordBudget, message_limit
from fedsim.actors.setup import local_config
from fedsim.actors.uplinks import Uplinks
from fedsim.algorithms.api import ServerAlgorithm, ServerContext, Step, TaskMaker, Waker
from fedsim.results.phases import PhaseStats
from fedsim.scenario import Scenario
from fedsim.scenario.ids import format_ids
from fedsim.scenario.network import NetPlan
from fedsim.wire.codec import Frame, encode, max_message_bytes
from fedsim.wire.messages import Average, Failed, Leave, Ready, Start, Update
from fedsim.wire.tensors import BytesUpTo, TensorSpec, to_model
from fedsim.wire.transport import Endpoint
from netem.clock import Clock, monotonic
from netem.fidelity import FidelityMonitor
from netem.timers import SPIN_MAX, TimerHeap

__all__ = ["Server"]

log = logging.getLogger(__name__)


class Server:
    """Runs the server side of one federation.

    Parameters
    ----------
    endpoint
        Where hosts connect (:class:`~fedsim.wire.transport.ZmqEndpoint`, or an
        in-memory one in tests).
    evaluator
        A torch worker handle with ``start()``, ``next_id()``, ``request()``, ``close()``.
    partition
        Each client's number of training samples, as the scenario's seed
        partitions the data (from the data built at the start): a host's
        registered counts must equal them, and they, never an update's
        claim, weigh its updates.
    allowed
        With CURVE: each allowed host's name and the client ids it may
        speak for (the endpoint reports which name a connection
        authenticated as). None: no authentication (one machine).
    resume
        A checkpoint (:func:`~fedsim.actors.checkpoint.load_checkpoint`)
        to continue from: emulated time, the model and the algorithm's
        state, counters and records (the run directory's logs already
        truncated to it).
    real_clock, use_timerfd
        The real monotonic clock and whether timers arm a Linux timerfd
        (tests pass a virtual clock and False).
    """

    def __init__(self, sc: Scenario, run_dir: Path, *, endpoint: Endpoint, evaluator: Evaluator,
                 dilation: float, fedsim_version: str, scenario_hash: str,
                 model_x0: torch.Tensor, model_spec: TensorSpec, partition: Sequence[int],
                 allowed: Mapping[str, tuple[int, ...]] | None = None,
                 resume: dict[str, Any] | None = None,
                 real_clock: Callable[[], float] = monotonic, use_timerfd: bool = True) -> None:
        self.sc = sc
        self.run_dir = run_dir
        self.endpoint = endpoint
        self.evaluator = evaluator
        self.dilation = dilation
        self.real_clock = real_clock
        self.use_timerfd = use_timerfd
        self.alg = sc.algorithm.spec
        self.model_spec = model_spec
        #: 0, or the most bytes of a task's or update's byte payload
        self.payload_bytes = (self.alg.payload_bytes(sc.algorithm, model_spec)
                              if self.alg.payload_bytes is not None else 0)
        if self.payload_bytes:
            self.task_spec: TensorSpec = BytesUpTo(self.payload_bytes)
            self.update_spec: TensorSpec = self.task_spec
        else:
            self.task_spec = model_spec.repeated(self.alg.task_copies)
            self.update_spec = model_spec.repeated(self.alg.update_copies)
        #: numbers the algorithm's tasks and wraps their payloads in the task's layout
        self.make_task = TaskMaker(None if self.payload_bytes else self.task_spec)
        #: lets the algorithm's other thread wake this loop
        self.waker = Waker()
        ctx = ServerContext(x0=model_x0, num_clients=sc.data.num_clients, seed=sc.seed,
                            local=local_config(sc), tasks=self.make_task, wake=self.waker,
                            scenario=sc)
        self.strategy: ServerAlgorithm = self.alg.server(sc.algorithm, ctx)
        self.local = ctx.local
        self.hosts = HostTable(sc.data.num_clients, fedsim_version, scenario_hash, allowed,
                               partition)
        self.partition: tuple[int, ...] = self.hosts.partition or ()
        #: the tasks sent: what an update may claim about its time and version
        self.tasks = TaskBook()
        self.queue: asyncio.Queue[Item] = asyncio.Queue()
        self.clients: set[int] = set()
        self._failed: set[int] = set()
        self.max_bytes = message_limit(sc, model_spec,
                                       max(self.alg.task_copies, self.alg.update_copies))
        if self.payload_bytes and sc.deploy.max_message_mb is None:
            self.max_bytes = max(self.max_bytes, max_message_bytes(self.task_spec))
        self.plan = NetPlan(sc, host_step_time=sc.devices.host_step_time)
        self.monitor = FidelityMonitor(dilation=dilation)
        #: the server's side of the clients' links, and its check of claimed send times
        self.client_links = ClientLinks(self.plan)
        self.send_times = SendTimes(self.monitor, dilation, sc.deploy.max_transit_ms)
        self.stop_reason: str | None = None
        self.on_progress: Callable[[Progress], None] | None = None
        self.started = False
        # a round could start at t = 0 (set by _begin): netem has something to judge
        self.began = False
        for kind, params in self.plan.expectations().items():
            self.monitor.expect_link(kind, params)
        # O(clients): computed here, in the set-up, not when the clock starts
        self._delays_ms: dict[str, float | None] = {
            d: self.plan.mean_delay(d) * 1e3 for d in ("down", "up")}
        self.clock: Clock | None = None
        self.timers: TimerHeap | None = None
        self.state: RunState | None = None
        #: where the run's time goes (summary["phases"]); the hosts' parts arrive
        #: with their event batches
        self.phases = PhaseStats()
        self.resume = resume
        #: this server's incarnation, in its Start and ClockReplies: a host that hears
        #: another one knows the server restarted (a resumed run) and registers again
        self.incarnation = secrets.token_hex(8)
        #: each client's budget of event records: what was sent to it, what it sent
        records = RecordBudget(self.client_links.availability_changes)
        #: a client's message through its emulated uplink to the queue
        self.uplinks = Uplinks(self, self.queue, links=self.client_links,
                               send_times=self.send_times, tasks=self.tasks, plan=self.plan,
                               monitor=self.monitor, strategy=self.strategy,
                               in_flight=sc.network.in_flight)
        #: a task or an average stamped, charged and sent to its client's host
        self.downlinks = Downlinks(self, endpoint, hosts=self.hosts, links=self.client_links,
                                   tasks=self.tasks, plan=self.plan, records=records,
                                   phases=self.phases, local=self.local,
                                   partition=self.partition, task_spec=self.task_spec,
                                   real_clock=real_clock, unreachable=self._unreachable,
                                   steps_known=sc.algorithm.client_table() is None)
        #: registration, the reader and its checks, the hosts' silence and goodbyes
        self.sessions = HostSessions(sc, self, self.queue, endpoint=endpoint, hosts=self.hosts,
                                     links=self.client_links, uplinks=self.uplinks,
                                     downlinks=self.downlinks, records=records,
                                     phases=self.phases, update_spec=self.update_spec,
                                     max_bytes=self.max_bytes, allowed=allowed,
                                     real_clock=real_clock, incarnation=self.incarnation)
        # an update whose values fail the checks made off the loop is the reader's to reject
        self.uplinks.on_refused = lambda host, exc: self.sessions.reject(host.peer, exc.reason,
                                                                        exc.detail)
        #: the fidelity verdict and the run's totals, read from the parts above
        self.measures = RunMeasures(self.monitor, self.plan, self.client_links, self.hosts,
                                    self.send_times, self.sessions.rejections,
                                    self.sessions.gate)
        self.fedsim_version, self.scenario_hash = fedsim_version, scenario_hash
        #: writes the checkpoints (its own thread) and restores one
        # no checkpoints of an algorithm that could not resume from them
        resumable = sc.algorithm.resumable() is None
        self.checkpointer = Checkpointer(run_dir, sc.run.checkpoint_every if resumable else 0,
                                         sc.run.checkpoint_seconds if resumable else 0.0,
                                         self.strategy.cadence, real_clock)
        #: deadlines of the AlgorithmTimers on the heap: one timer per deadline,
        #: however many steps ask for it
        self._algorithm_timers: set[float] = set()
        if hasattr(endpoint, "on_disconnect"):
            endpoint.on_disconnect = self.sessions.disconnected
        if hasattr(endpoint, "on_refused"):
            endpoint.on_refused = self.sessions.refused_connection

    # -- outside world ---------------------------------------------------------------
    def request_stop(self, reason: str) -> None:
        """End the run as soon as possible (Ctrl-C)."""
        self.queue.put_nowait(StopRun(reason))
        self.sessions.registered.set()

    def host_exited(self, host: str, why: str) -> None:
        """A host process ended (reported by whoever watches it)."""
        self.sessions.host_exited(host, why)

    def now(self) -> float:
        """Emulated seconds (0 before the clock starts)."""
        return self.clock.now() if self.clock is not None else 0.0

    # -- the run -------------------------------------------------------------------
    async def run(self) -> dict[str, Any]:
        """Run the federation to its end; return the summary."""
        to_foreground()   # from here on the loop answers clock probes and keeps time
        try:
            async with asyncio.TaskGroup() as tg:
                reader = self.sessions.reader = tg.create_task(self.sessions.read(),
                                                               name="server-reader")
                try:
                    await self._federation(tg)
                finally:
                    reader.cancel()
        except BaseException as exc:
            errors = exc.exceptions if isinstance(exc, BaseExceptionGroup) else (exc,)
            for e in errors:
                if not isinstance(e, asyncio.CancelledError | KeyboardInterrupt):
                    log.error("the server failed: %s: %s", type(e).__name__, e,
                              exc_info=(type(e), e, e.__traceback__))
            first = errors[0]
            self.stop_reason = self.stop_reason or f"error: {type(first).__name__}: {first}"
            if not isinstance(exc, BaseExceptionGroup) or not all(
                    isinstance(e, Exception) for e in errors):
                raise
        finally:
            thaw_heap()
            # what the server side holds (a process of its own, say) is released
            # however the run ended, also before its clock started (close is idempotent)
            self.strategy.close()
            self.uplinks.close()
            self.checkpointer.wait()
            if self.timers is not None:
                self.timers.close()
            if self.state is None:
                self.state = state = self._new_state(self._clock(0.0))
                self.sessions.rejections.attach(
                    state.rejects, lambda source, reason, detail: state.event(
                        0.0, "reject", reason=reason, sender=source, detail=detail))
            for line in self.sessions.rejections.summarise():
                self.state.event(self.state.stopped_at or max(0.0, self.now()), "warning",
                                 reason=line)
            self.state.finish(self.stop_reason or "completed")
        return self.state.summary

    async def _federation(self, tg: asyncio.TaskGroup) -> None:
        await self.evaluator.start()
        try:
            await asyncio.wait_for(self.sessions.registered.wait(),
                                   self.sc.deploy.start_timeout)
        except TimeoutError:
            log.warning("start timeout (%.0f s): %d of %d clients registered (%d hosts)",
                        self.sc.deploy.start_timeout, len(self.hosts.registered()),
                        self.sc.data.num_clients, len(self.hosts.hosts))
        t0 = float(self.resume["t"]) if self.resume is not None else 0.0
        # the per-client set-up, before the clock starts (no await until the start:
        # no host registers in between)
        self.client_links.start()
        registered = self.hosts.registered()
        for c in registered:
            self.client_links.admit(c)
        freeze_heap()  # the set-up's objects: no collection of the run walks them
        self.clock = self._clock(0.05 - t0 * self.dilation)
        self.timers = TimerHeap(self.clock, use_timerfd=self.use_timerfd, spin_max=SPIN_MAX)
        self.state = state = self._new_state(self.clock)
        age = process_age()   # launch to t0 (the clock starts 50 ms from now)
        state.startup_s = None if age is None else round(age + 0.05, 3)
        state.t0_wall = time.time() + 0.05
        if self.resume is not None:
            Checkpointer.restore(self.resume, self.strategy, state)
            self.make_task.next_id = int(self.resume["next_task_id"])
            self.send_times.clamped = int(self.resume.get("clamped", 0))
        self.sessions.rejections.attach(
            state.rejects, lambda source, reason, detail: state.event(
                max(t0, self.now()), "reject", reason=reason, sender=source, detail=detail))
        if self.stop_reason is not None:
            return
        self.started = True
        self.clients = set(registered)
        start = self._start_message(t0)
        for h in self.hosts.hosts.values():
            if h.alive:
                h.last_seen = self.real_clock()
                await self.downlinks.to_host(h.peer, start)
        ticker = tg.create_task(self._ticker(), name="server-ticker")
        loop, queue = asyncio.get_running_loop(), self.queue

        def wake() -> None:          # any thread: look at the algorithm soon
            with contextlib.suppress(RuntimeError):   # a closed loop: the run is over
                loop.call_soon_threadsafe(queue.put_nowait, Wake())

        self.waker.bind(wake)
        try:
            if self.sc.run.time_budget is not None:
                self.timers.call_at(self.sc.run.time_budget, self.queue.put_nowait,
                                    StopRun("time_budget"))
            if self.sc.eval.every_seconds:
                self._arm_eval_timer(self.sc.eval.every_seconds)
            self._eval(t0)
            await self._begin(registered, t0)
            await self._loop()
            state.stopped_at = max(0.0, self.clock.now())
            if state.updates == 0 and self.stop_reason in (None, "time_budget"):
                self.stop_reason = "failed: no update was applied"
            self._eval(state.stopped_at, final=True)
            await state.drain_evals()
        finally:
            self.waker.bind(None)
            self.strategy.close()
            ticker.cancel()
            if state.stopped_at is None:  # an error ended it: the federation stopped now
                state.stopped_at = max(0.0, self.clock.now())
            await self.sessions.stop_hosts(self.stop_reason or "completed")

    def _clock(self, lead: float) -> Clock:
        return Clock(dilation=self.dilation, epoch=self.real_clock() + lead,
                     real_clock=self.real_clock)

    def _new_state(self, clock: Clock) -> RunState:
        return RunState(self.sc, self.run_dir, self.strategy.cadence, clock, self.evaluator,
                        fidelity=self.fidelity, totals=self.measures.totals,
                        on_target=lambda: self.queue.put_nowait(StopRun("target_accuracy")),
                        fedsim_version=self.fedsim_version,
                        delays_ms=self._delays_ms,
                        phases=self.phases)

    async def _begin(self, registered: dict[int, int], t0: float) -> None:
        """t = t0 (0, or a checkpoint's time): the federation begins with those registered."""
        assert self.state is not None
        state = self.state
        missing = sorted(set(range(self.sc.data.num_clients)) - set(registered))
        if missing:
            log.warning("%d of %d clients never registered: %s", len(missing),
                        self.sc.data.num_clients, format_ids(missing))
            state.missing = missing
            state.event(t0, "missing", clients=missing)
        state.samples.update(registered)
        step = self.strategy.start(sorted(registered), t0)
        if step.stop:
            self.stop_reason = step.stop
            return
        if not step.tasks and self.strategy.in_flight() == 0 and not self.strategy.waiting():
            self.stop_reason = (f"failed: no round could start ({len(registered)} of "
                                f"{self.sc.data.num_clients} clients registered)")
            return
        self.began = True
        state.event(t0, "start", clients=len(registered), wall=round(state.t0_wall, 3))
        await self._apply(t0, step)

    def _arm_eval_timer(self, period: float) -> None:
        assert self.timers is not None
        self.timers.call_later(period, self.queue.put_nowait, EvalTimer(period))

    # -- the event loop ----------------------------------------------------------------
    async def _loop(self) -> None:
        assert self.state is not None
        state, strategy = self.state, self.strategy
        phases = self.phases
        while self.stop_reason is None:
            item = await self.queue.get()
            now = self.now()
            step: Step | None = None
            t0 = perf_counter()
            match item:
                case FromClient(client=cid, msg=msg, queued=queued, task=task):
                    if queued is not None:
                        phases.add("queueing.server", t0 - queued)
                    step = self._on_client(now, cid, msg, task)
                case AlgorithmTimer(at=at):
                    self._algorithm_timers.discard(at)
                    step = strategy.timer(now)
                case Wake():
                    step = strategy.timer(now)
                case EvalTimer(period=period):
                    self._eval(now)
                    self._arm_eval_timer(period)
                case StopRun(reason=reason):
                    self.stop_reason = reason
                case HostExited(host=host, why=why, clients=clients):
                    step = self._host_lost(now, host, why, clients)
                case HostJoined(host=host):
                    step = await self._host_joined(now, host)
                case Tick():
                    if self.on_progress is not None:
                        self.on_progress(state.progress(now, strategy.version,
                                                        strategy.in_flight()))
                    state.flush()
            if (step is not None and (step.applied or step.rounds_closed)
                    and isinstance(item, FromClient | AlgorithmTimer | Wake | HostExited)):
                # the algorithm applied updates or closed a round (aggregation phase)
                phases.add("aggregation.server", perf_counter() - t0)
            if step is not None:
                await self._apply(now, step)
                if step.stop and self.stop_reason is None:
                    self.stop_reason = step.stop
            ended = state.should_stop()
            if ended and self.stop_reason is None:
                self.stop_reason = ended

    def _on_client(self, now: float, cid: int, msg: ClientMessage,
                   task: TaskRecord | None = None) -> Step | None:
        assert self.state is not None
        if cid not in self.clients:
            return None
        try:
            if isinstance(msg, Update):
                # the server's record, never the update's claim: the base version
                # the task was sent with (its round too, when one upload answers
                # it), and the client's partition size as its weight
                assert task is not None  # the reader found it (or refused the update)
                upload = replace(msg, base_version=task.version,
                                 num_samples=self.partition[cid],
                                 round=task.round if self.strategy.one_upload else msg.round)
                return self.strategy.update(upload, now)
            if isinstance(msg, Ready):
                return self.strategy.rejoin(cid, now, reset=msg.reset)
            if isinstance(msg, Failed):
                log.error("client %d failed (%s): %s; it is dropped", cid, msg.cause, msg.reason)
                self.state.event(now, "client_failed", client=cid, cause=msg.cause,
                                 reason=msg.reason[:300])
                self.state.lose_work(now, cid, msg.cause, msg.reason)
                self._failed.add(cid)
            return self._lose(now, cid, msg.reason)
        except Exception as exc:  # an algorithm error must not end the run
            log.exception("the algorithm failed on %s from client %d", type(msg).__name__, cid)
            self.state.event(now, "discard", client=cid,
                             reason=f"algorithm error: {type(exc).__name__}: {exc}")
            return None

    def _lose(self, now: float, cid: int, why: str) -> Step:
        self.clients.discard(cid)
        step = self.strategy.lost(cid, now)
        if not self.clients and self.stop_reason is None:
            every = "every client failed" if self._failed else "every client is gone"
            self.stop_reason = f"failed: {every} (last: {why})"
        return step

    def _host_lost(self, now: float, host: str, why: str,
                   clients: tuple[int, ...] | None = None) -> Step | None:
        assert self.state is not None
        if self.stop_reason is not None:
            return None
        lost = list(clients) if clients is not None else self.hosts.lose(host, why, now)
        if not lost:
            return None
        self.state.host_failures.append({"host": host, "reason": why, "t": now,
                                         "clients": len(lost)})
        self.state.event(now, "host_lost", host=host, reason=why, clients=len(lost))
        step = Step()
        for cid in lost:
            if cid in self.clients:
                self.state.lose_work(now, cid, "host_lost", f"host {host} lost: {why}")
                step.then(self._lose(now, cid, f"host {host} lost"))
        return step

    async def _host_joined(self, now: float, name: str) -> Step | None:
        """A host registered after the start (restarted): its clients rejoin."""
        assert self.state is not None
        info = self.hosts.hosts.get(name)
        if info is None or not info.alive or self.stop_reason is not None:
            return None
        await self.downlinks.to_host(info.peer, self._start_message(now))
        self.state.event(now, "host_joined", host=name, clients=len(info.clients))
        log.warning("client host %s joined at t=%.2f: clients %s rejoin", name, now,
                    format_ids(info.clients))
        step = Step()
        for cid in info.clients:
            self.client_links.admit(cid)
            self.clients.add(cid)
            self._failed.discard(cid)
            self.state.samples[cid] = info.samples[cid]
            step.then(self.strategy.rejoin(cid, now, reset=True))
        return step

    async def _apply(self, now: float, step: Step) -> None:
        assert self.state is not None
        assert self.timers is not None
        if self.state.applied(now, step):
            self._eval(now)
        if (step.applied or step.rounds_closed) and self.checkpointer.due(step):
            self.checkpoint(now)
        for task in step.tasks:
            await self.downlinks.task(now, task)
        for b in step.broadcasts:
            model = to_model(b.payload, self.model_spec)
            for cid in b.clients:
                msg = Average(client=cid, round=b.round, version=self.strategy.version,
                              model=model)
                await self.downlinks.send(now, cid, msg, kind="average", round=b.round)
        nxt = self.strategy.next_timer()
        if nxt is not None and nxt not in self._algorithm_timers:
            # every step asks again for the same deadline (the oldest task's
            # timeout): one timer for it, not one per step
            self._algorithm_timers.add(nxt)
            self.timers.call_at(nxt, self.queue.put_nowait, AlgorithmTimer(nxt))

    def fidelity(self) -> dict[str, Any]:
        """netem's verdict so far (a copy: callable while the run goes on)."""
        return self.measures.fidelity(self.clock is not None and self.began)

    def checkpoint(self, now: float) -> Path:
        """Take a checkpoint now (written by the checkpointer's thread); its path."""
        assert self.state is not None
        return self.checkpointer.take(Checkpointer.snapshot(
            now, self.fedsim_version, self.scenario_hash, self.strategy, self.state,
            self.make_task.next_id, self.send_times.clamped))

    def _eval(self, now: float, final: bool = False) -> None:
        assert self.state is not None
        s = self.strategy
        self.state.request_eval(now, s.version, s.round, to_model(s.model(), self.model_spec),
                                final=final)

    def _start_message(self, t0: float) -> list[Frame]:
        """The Start of a host whose clients begin at emulated ``t0``."""
        assert self.clock is not None
        return encode(Start(epoch=self.clock.epoch, dilation=self.dilation,
                            spec=self.model_spec, task_copies=self.alg.task_copies,
                            host_step_time=self.sc.devices.host_step_time,
                            server=self.incarnation, t0=t0, payload_bytes=self.payload_bytes))

    def _unreachable(self, cid: int) -> None:
        """No send reaches ``cid`` (its host is gone): it leaves."""
        if cid in self.clients:
            self.queue.put_nowait(FromClient(cid, Leave(client=cid, reason="unreachable")))

    async def _ticker(self) -> None:
        """Every half a real second: report progress, flush the logs, look for silent
        hosts."""
        while True:
            await asyncio.sleep(0.5)
            self.queue.put_nowait(Tick())
            self.sessions.check_silence()
