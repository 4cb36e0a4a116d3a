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
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fedsim.actors._refusal import Refusal
from fedsim.actors._setup import local_config
from fedsim.actors._tensors import to_model, to_tensor
from fedsim.actors.hosts import HostTable
from fedsim.actors.runstate import Progress, RunState
from fedsim.algorithms import ClientResult, get
from fedsim.algorithms.api import ServerAlgorithm, ServerContext, Step
from fedsim.codec import decode, encode, encode_body, stamp
from fedsim.messages import (
    Average,
    ClockProbe,
    ClockReply,
    EventBatch,
    Failed,
    HostBye,
    HostHello,
    Leave,
    LocalWork,
    Ready,
    Refused,
    Start,
    Stop,
    Task,
    TensorSpec,
    Update,
    WireError,
)
from fedsim.network import NetPlan
from fedsim.scenario import Scenario
from fedsim.transport import Endpoint, PeerGone
from netem.clock import Clock, monotonic
from netem.fidelity import FidelityMonitor
from netem.timers import TimerHeap

__all__ = ["Server"]

log = logging.getLogger(__name__)

ClientMessage = Update | Ready | Failed | Leave


# -- what the event queue carries ------------------------------------------------------
@dataclass(frozen=True, slots=True)
class FromClient:
    client: int
    msg: ClientMessage


@dataclass(frozen=True, slots=True)
class AlgorithmTimer:
    at: float


@dataclass(frozen=True, slots=True)
class EvalTimer:
    period: float


@dataclass(frozen=True, slots=True)
class StopRun:
    reason: str


@dataclass(frozen=True, slots=True)
class HostExited:
    host: str
    why: str


@dataclass(frozen=True, slots=True)
class Tick:
    pass


Item = FromClient | AlgorithmTimer | EvalTimer | StopRun | HostExited | Tick


class Server:
    """Runs the server side of one federation.

    Parameters
    ----------
    endpoint
        Where hosts connect (:class:`~fedsim.transport.ZmqEndpoint`, or an
        in-memory one in tests).
    evaluator
        A torch worker handle with ``start()``, ``next_id()``, ``request()``, ``close()``.
    hosts
        How many client hosts to wait for.
    real_clock, use_timerfd
        The real monotonic clock and whether timers arm a Linux timerfd
        (tests pass a virtual clock and False).
    """

    def __init__(self, sc: Scenario, run_dir: Path, *, endpoint: Endpoint, evaluator: Any,
                 hosts: int, dilation: float, fedsim_version: str, scenario_hash: str,
                 model_x0: torch.Tensor, model_spec: TensorSpec,
                 real_clock: Callable[[], float] = monotonic, use_timerfd: bool = True) -> None:
        self.sc = sc
        self.run_dir = run_dir
        self.endpoint = endpoint
        self.evaluator = evaluator
        self.expected_hosts = hosts
        self.dilation = dilation
        self.real_clock = real_clock
        self.use_timerfd = use_timerfd
        self.alg = get(sc.algorithm.name)
        self.model_spec = model_spec
        self.task_spec = model_spec.repeated(self.alg.task_copies)
        self.update_spec = model_spec.repeated(self.alg.update_copies)
        ctx = ServerContext(x0=model_x0, num_clients=sc.data.num_clients, seed=sc.seed,
                            local=local_config(sc))
        self.strategy: ServerAlgorithm = self.alg.server(sc.algorithm, ctx)
        self.hosts = HostTable(sc.data.num_clients, fedsim_version, scenario_hash)
        self.queue: asyncio.Queue[Item] = asyncio.Queue()
        self.clients: set[int] = set()
        self._failed: set[int] = set()
        self.max_bytes = int(sc.deploy.max_message_mb * 1e6)
        self.task_ids = itertools.count(1)
        self.seq = itertools.count()
        self.stop_reason: str | None = None
        self.on_progress: Callable[[Progress], None] | None = None
        self.started = False
        # a round could start at t = 0 (set by _begin): netem has something to judge
        self.began = False
        self.plan = NetPlan(sc, host_step_time=sc.devices.host_step_time)
        self.monitor = FidelityMonitor(dilation=dilation)
        for kind, params in self.plan.expectations().items():
            self.monitor.expect_link(kind, params)
        self.links: dict[int, Any] = {}
        self.egress = self.plan.bottleneck("down")
        self.clock: Clock | None = None
        self.timers: TimerHeap | None = None
        self.state: RunState | None = None
        self._registered = asyncio.Event()
        self._bye = asyncio.Event()
        self._early_rejects: list[tuple[str, str, str]] = []
        self._sends: set[asyncio.Future[None]] = set()
        self._reader: asyncio.Task[None] | None = None
        if hasattr(endpoint, "on_disconnect"):
            endpoint.on_disconnect = self._disconnected

    # -- outside world ---------------------------------------------------------------
    def host_exited(self, host: str, why: str) -> None:
        """A host process ended (reported by whoever watches it)."""
        self.queue.put_nowait(HostExited(host, why))
        self._bye.set()

    def request_stop(self, reason: str) -> None:
        """End the run as soon as possible (Ctrl-C)."""
        self.queue.put_nowait(StopRun(reason))
        self._registered.set()

    # -- the run -------------------------------------------------------------------
    async def run(self) -> dict[str, Any]:
        """Run the federation to its end; return the summary."""
        try:
            async with asyncio.TaskGroup() as tg:
                reader = self._reader = tg.create_task(self._read(), name="server-reader")
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
            if self.timers is not None:
                self.timers.close()
            if self.state is None:
                self.state = self._new_state(self._clock(0.0))
            self.state.finish(self.stop_reason or "completed")
        return self.state.summary

    async def _federation(self, tg: asyncio.TaskGroup) -> None:
        await self.evaluator.start()
        try:
            await asyncio.wait_for(self._registered.wait(), self.sc.deploy.start_timeout)
        except TimeoutError:
            log.warning("start timeout (%.0f s): %d of %d client hosts registered",
                        self.sc.deploy.start_timeout, len(self.hosts.hosts), self.expected_hosts)
        self.clock = self._clock(0.05)
        self.timers = TimerHeap(self.clock, use_timerfd=self.use_timerfd)
        self.state = state = self._new_state(self.clock)
        for sender, reason, detail in self._early_rejects:
            state.rejected(0.0, sender, reason, detail)
        if self.stop_reason is not None:
            return
        self.started = True
        shared_up = self.plan.bottleneck("up")
        registered = self.hosts.registered()
        self.clients = set(registered)
        self.links = {c: self.plan.make_link(c, "up", shared_up) for c in self.clients}
        self.availability = {c: self.plan.availability(c) for c in self.clients}
        start = encode(Start(epoch=self.clock.epoch, dilation=self.dilation,
                             spec=self.model_spec, task_copies=self.alg.task_copies))
        for h in self.hosts.hosts.values():
            await self._to_host(h.peer, start)
        ticker = tg.create_task(self._ticker(), name="server-ticker")
        try:
            if self.sc.run.time_budget is not None:
                self.timers.call_at(self.sc.run.time_budget, self.queue.put_nowait,
                                    StopRun("time_budget"))
            if self.sc.eval.every_seconds:
                self._arm_eval_timer(self.sc.eval.every_seconds)
            self._eval(0.0)
            await self._begin(registered)
            await self._loop()
            state.stopped_at = max(0.0, self.clock.now())
            if state.updates == 0 and self.stop_reason in (None, "time_budget"):
                self.stop_reason = "failed: no update was applied"
            self._eval(state.stopped_at, final=True)
            await state.drain_evals()
        finally:
            ticker.cancel()
            if state.stopped_at is None:  # an error ended it: the federation stopped now
                state.stopped_at = max(0.0, self.clock.now())
            await self._stop_hosts()

    def _clock(self, lead: float) -> Clock:
        clock = Clock(dilation=self.dilation, epoch=self.real_clock() + lead)
        clock._real_clock = self.real_clock
        return clock

    def _new_state(self, clock: Clock) -> RunState:
        return RunState(self.sc, self.run_dir, self.strategy.cadence, clock, self.evaluator,
                        fidelity=self.fidelity, totals=self._totals,
                        on_target=lambda: self.queue.put_nowait(StopRun("target_accuracy")))

    async def _begin(self, registered: dict[int, int]) -> None:
        """t = 0: the federation begins with the clients that registered."""
        assert self.state is not None
        state = self.state
        missing = sorted(set(range(self.sc.data.num_clients)) - set(registered))
        if missing:
            log.warning("%d of %d clients never registered: %s", len(missing),
                        self.sc.data.num_clients, _ranges(missing))
            state.missing = missing
            state.event(0.0, "missing", clients=missing)
        state.samples.update(registered)
        step = self.strategy.start(sorted(registered), 0.0)
        if not step.dispatch and self.strategy.in_flight() == 0:
            self.stop_reason = (f"failed: no round could start ({len(registered)} of "
                                f"{self.sc.data.num_clients} clients registered)")
            return
        self.began = True
        state.event(0.0, "start", clients=len(registered))
        await self._apply(0.0, step)

    # -- readers -------------------------------------------------------------------
    async def _read(self) -> None:
        """Decode and route every message; a bad one is rejected, logged and skipped."""
        while True:
            peer, frames = await self.endpoint.recv()
            try:
                msg, meta = decode(frames, max_bytes=self.max_bytes, spec=self.update_spec)
                await self._route(peer, msg, meta)
            except (WireError, Refusal) as exc:
                self._reject(peer, exc.reason, exc.detail)

    def _reject(self, peer: bytes, reason: str, detail: str) -> None:
        sender = peer.decode(errors="replace")
        if self.state is None:
            log.warning("rejected a message from %s: %s: %s", sender, reason, detail)
            self._early_rejects.append((sender, reason, detail))
        else:
            self.state.rejected(self._now(), sender, reason, detail)

    def _disconnected(self) -> None:
        """libzmq dropped a connection: how it refuses an oversize message, or a peer left."""
        if self.started and self.stop_reason is None:
            self._reject(b"?", "connection_dropped",
                         "a connection was dropped (a message over deploy.max_message_mb, "
                         "or a peer that went away)")

    def _now(self) -> float:
        return self.clock.now() if self.clock is not None else 0.0

    async def _route(self, peer: bytes, msg: Any, meta: Any) -> None:
        if isinstance(msg, Update | Ready | Failed | Leave):
            if self.hosts.owner(msg.client) != peer or msg.client not in self.links:
                raise Refusal("unknown_client", f"client {msg.client} does not run there")
            self._uplink(msg.client, msg, meta)
        elif isinstance(msg, HostHello):
            await self._hello(peer, msg)
        elif isinstance(msg, EventBatch):
            host = self.hosts.by_peer(peer)
            if host is None or host.name != msg.host or self.state is None:
                raise Refusal("unknown_client", f"events from an unregistered host {msg.host!r}")
            self.state.write_events(msg.events, host.name)
        elif isinstance(msg, HostBye):
            if self.hosts.goodbye(peer, msg) is None:
                raise Refusal("unknown_client", f"a goodbye from {msg.host!r}, not expected")
            self._bye.set()
        elif isinstance(msg, ClockProbe):
            reply = ClockReply(seq=msg.seq, t_sent=msg.t_sent, t_server=monotonic())
            await self._to_host(peer, encode(reply))
        else:
            raise Refusal("unexpected_kind", f"a {type(msg).__name__} is not for the server")

    async def _hello(self, peer: bytes, msg: HostHello) -> None:
        why = "the federation has already started" if self.started else self.hosts.hello(peer, msg)
        if why is not None:
            log.error("refused client host %s: %s", msg.host, why)
            self._reject(peer, "refused", why)
            await self._to_host(peer, encode(Refused(reason=why)))
            return
        if len(self.hosts.hosts) >= self.expected_hosts:
            self._registered.set()

    async def _to_host(self, peer: bytes, frames: list[Any]) -> None:
        try:
            await self.endpoint.send(peer, frames)
        except PeerGone:
            log.warning("host %r is gone", peer)

    def _uplink(self, cid: int, msg: ClientMessage, meta: Any) -> None:
        assert self.timers is not None
        assert self.state is not None
        d = self.links[cid].schedule(meta.sent_at, meta.nbytes)
        if d.dropped:
            self.state.event(self._now(), "drop", client=cid, kind=meta.kind, dir="up",
                             bytes=meta.nbytes, reason=d.reason)
            return
        self.timers.call_at(d.t_deliver, self._delivered, cid, msg, meta, d)

    def _delivered(self, cid: int, msg: ClientMessage, meta: Any, d: Any) -> None:
        assert self.state is not None
        now = self._now()
        self.monitor.record_delivery(self.plan.kind(cid, "up"), d, now)
        lost = self._away_between(cid, meta.sent_at, now)
        self.state.event(now, "drop" if lost else "deliver", client=cid, kind=meta.kind,
                         dir="up", bytes=meta.nbytes, sent_at=meta.sent_at,
                         scheduled=d.t_deliver, version=getattr(msg, "base_version", None),
                         reason=lost)
        if lost:
            return
        if isinstance(msg, Update):
            self.state.bytes_up += meta.nbytes
        self.queue.put_nowait(FromClient(cid, msg))

    def _away_between(self, cid: int, t_send: float, t_now: float) -> str | None:
        """Whether the in-flight policy loses a message of an away client."""
        policy = self.sc.network.in_flight
        if policy == "held":
            return None
        av = self.availability[cid]
        if not av.is_available(t_now):
            return f"away ({policy})"
        if policy == "reset" and av.next_change(t_send)[0] <= t_now:
            return "connection reset"
        return None

    async def _ticker(self) -> None:
        while True:
            await asyncio.sleep(0.5)
            self.queue.put_nowait(Tick())

    def _arm_eval_timer(self, period: float) -> None:
        assert self.timers is not None
        self.timers.call_later(period, self.queue.put_nowait, EvalTimer(period))

    # -- the event loop ----------------------------------------------------------------
    async def _loop(self) -> None:
        assert self.state is not None
        state, strategy = self.state, self.strategy
        while self.stop_reason is None:
            item = await self.queue.get()
            now = self._now()
            step: Step | None = None
            match item:
                case FromClient(client=cid, msg=msg):
                    step = self._on_client(now, cid, msg)
                case AlgorithmTimer():
                    step = strategy.timer(now)
                case EvalTimer(period=period):
                    self._eval(now)
                    self._arm_eval_timer(period)
                case StopRun(reason=reason):
                    self.stop_reason = reason
                case HostExited(host=host, why=why):
                    step = self._host_lost(now, host, why)
                case Tick():
                    if self.on_progress is not None:
                        self.on_progress(state.progress(now, strategy.version,
                                                        strategy.in_flight()))
                    state.flush()
            if step is not None:
                await self._apply(now, step)
            reason = state.should_stop()
            if reason and self.stop_reason is None:
                self.stop_reason = reason

    def _on_client(self, now: float, cid: int, msg: ClientMessage) -> Step | None:
        assert self.state is not None
        if cid not in self.clients:
            return None
        try:
            if isinstance(msg, Update):
                result = ClientResult(
                    client=cid, base_version=msg.base_version, params=to_tensor(msg.model),
                    num_samples=msg.num_samples, steps=msg.steps, task_id=msg.task_id,
                    round=msg.round, stats={"loss": msg.loss})
                return self.strategy.update(result, now)
            if isinstance(msg, Ready):
                return self.strategy.rejoin(cid, now, reset=msg.reset)
            if isinstance(msg, Failed):
                log.error("client %d failed: %s", cid, msg.reason)
                self.state.event(now, "client_failed", client=cid, reason=msg.reason)
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

    def _host_lost(self, now: float, host: str, why: str) -> Step | None:
        assert self.state is not None
        if self.stop_reason is not None:
            return None
        lost = self.hosts.lose(host, why, now)
        if not lost:
            return None
        self.state.host_failures.append({"host": host, "reason": why, "t": now,
                                         "clients": len(lost)})
        self.state.event(now, "host_lost", host=host, reason=why, clients=len(lost))
        step = Step()
        for cid in lost:
            if cid in self.clients:
                step.then(self._lose(now, cid, f"host {host} lost"))
        return step

    async def _apply(self, now: float, step: Step) -> None:
        assert self.state is not None
        assert self.timers is not None
        if self.state.applied(now, step):
            self._eval(now)
        for cid in step.dispatch:
            await self._dispatch(now, cid)
        for b in step.broadcasts:
            model = to_model(b.payload, self.model_spec)
            for cid in b.clients:
                msg = Average(client=cid, round=b.round, version=self.strategy.version,
                              model=model)
                await self._send(now, cid, encode_body(msg), kind="average", round=b.round)
        nxt = self.strategy.next_timer()
        if nxt is not None:
            self.timers.call_at(nxt, self.queue.put_nowait, AlgorithmTimer(nxt))

    def _eval(self, now: float, final: bool = False) -> None:
        assert self.state is not None
        s = self.strategy
        self.state.request_eval(now, s.version, s.round, to_model(s.model(), self.model_spec),
                                final=final)

    async def _dispatch(self, now: float, cid: int) -> None:
        d = self.strategy.task(cid, next(self.task_ids))
        work = None
        if d.budget is not None:
            work = LocalWork(steps=d.budget.steps, epochs=d.budget.epochs)
        body = encode_body(Task(client=cid, task_id=d.task_id, version=d.version,
                                round=d.round, work=work,
                                model=to_model(d.payload, self.task_spec)))
        fields = {"kind": "task", "version": d.version, "task_id": d.task_id, "round": d.round}
        if self.egress is not None:
            # A shared downlink bottleneck at the server: the message really
            # waits here until the shared stage has sent it.
            p = self.plan.params(cid, "down")
            _, end = self.egress.reserve(now, body.nbytes + p.packets(body.nbytes) * p.overhead)
            if end > now:
                assert self.timers is not None
                self.timers.call_at(end, self._send_later, cid, body, fields)
                return
        await self._send(now, cid, body, **fields)

    def _send_later(self, cid: int, body: Any, fields: dict[str, Any]) -> None:
        task = asyncio.ensure_future(self._send(self._now(), cid, body, **fields))
        self._sends.add(task)
        task.add_done_callback(self._sends.discard)

    async def _send(self, now: float, cid: int, body: Any, **fields: Any) -> None:
        """Stamp and send one message to a client through its host; log it."""
        assert self.state is not None
        peer = self.hosts.owner(cid)
        try:
            if peer is None:
                raise PeerGone(f"no host runs client {cid}")
            await self.endpoint.send(peer, stamp(body, sent_at=now, seq=next(self.seq)))
        except PeerGone as exc:
            self.state.event(now, "warning", client=cid, reason=f"send failed: {exc}")
            if cid in self.clients:
                self.queue.put_nowait(FromClient(cid, Leave(client=cid, reason="unreachable")))
            return
        self.state.bytes_down += body.nbytes
        self.state.event(now, "send", client=cid, dir="down", bytes=body.nbytes, **fields)

    async def _stop_hosts(self) -> None:
        """Tell live hosts to stop; wait up to 10 real seconds for each one's goodbye."""
        stop = encode(Stop(reason=self.stop_reason or "completed"))
        for h in self.hosts.hosts.values():
            if h.alive:
                await self._to_host(h.peer, stop)
        deadline = self.real_clock() + 10.0
        # a reader that crashed can read no goodbye: do not wait for one
        while (self.hosts.waiting_for_bye() and self.real_clock() < deadline
               and not (self._reader is not None and self._reader.done())):
            self._bye.clear()
            try:
                await asyncio.wait_for(self._bye.wait(), max(0.0, deadline - self.real_clock()))
            except TimeoutError:
                break
            while not self.queue.empty():
                item = self.queue.get_nowait()
                if isinstance(item, HostExited):
                    self.hosts.lose(item.host, item.why, self._now())
        for name in self.hosts.waiting_for_bye():
            log.warning("client host %s sent no goodbye; its measurements are missing", name)

    # -- measurements ---------------------------------------------------------------
    def _totals(self) -> dict[str, Any]:
        byes = self.hosts.byes()
        return {"overruns": sum(b.overruns for b in byes),
                "compute_deadlines": sum(b.compute_deadlines for b in byes),
                "rejected": sum(b.rejected for b in byes)}

    def fidelity(self) -> dict[str, Any]:
        """netem's verdict over the server's uplinks and every host's downlinks and compute.

        Merged into a copy, so it can be called while the run goes on; hosts
        that never said goodbye (lost) are named, since the verdict then
        covers only the others.
        """
        if self.clock is None or not self.began:
            return {"verdict": "fail", "reasons": ["the run never started"],
                    "lateness_ms": {"p50": None, "p99": None, "max": None},
                    "suggested_dilation": None}
        mon = copy.deepcopy(self.monitor)
        for cid, link in self.links.items():
            mon.record_loss(self.plan.kind(cid, "up"), link.loss_stats)
        for bye in self.hosts.byes():
            try:
                mon.merge(bye.fidelity)
            except (KeyError, TypeError, ValueError) as exc:
                log.warning("host %s: unreadable fidelity data (%s)", bye.host, exc)
        report = mon.report()
        report["hosts_reported"] = len(self.hosts.byes())
        lost = [h.name for h in self.hosts.hosts.values() if h.bye is None]
        if lost:
            report["hosts_unreported"] = lost
        return report


def _ranges(ids: list[int]) -> str:
    """``[0, 1, 2, 5]`` as ``"0-2, 5"``."""
    out: list[list[int]] = []
    for i in ids:
        if out and out[-1][1] == i - 1:
            out[-1][1] = i
        else:
            out.append([i, i])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in out)
