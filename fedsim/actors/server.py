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
import os
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fedsim._ids import format_ids
from fedsim.actors._refusal import Refusal
from fedsim.actors._setup import local_config
from fedsim.actors._tensors import to_model, to_tensor
from fedsim.actors.hosts import HostInfo, HostTable, RateLimit
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

__all__ = ["Server", "load_checkpoint"]

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
    #: its clients, when the host table already marked it lost (a restart)
    clients: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class HostJoined:
    host: str


@dataclass(frozen=True, slots=True)
class Tick:
    pass


Item = FromClient | AlgorithmTimer | EvalTimer | StopRun | HostExited | HostJoined | Tick


class Server:
    """Runs the server side of one federation.

    Parameters
    ----------
    endpoint
        Where hosts connect (:class:`~fedsim.transport.ZmqEndpoint`, or an
        in-memory one in tests).
    evaluator
        A torch worker handle with ``start()``, ``next_id()``, ``request()``, ``close()``.
    allowed
        With CURVE: each allowed host's name and the client ids it may
        speak for (the endpoint reports which name a connection
        authenticated as). None: no authentication (one machine).
    resume
        A checkpoint (:func:`load_checkpoint`) to continue from: emulated
        time, the model and the algorithm's state, counters and records
        (the run directory's logs already truncated to it).
    real_clock, use_timerfd
        The real monotonic clock and whether timers arm a Linux timerfd
        (tests pass a virtual clock and False).
    """

    def __init__(self, sc: Scenario, run_dir: Path, *, endpoint: Endpoint, evaluator: Any,
                 dilation: float, fedsim_version: str, scenario_hash: str,
                 model_x0: torch.Tensor, model_spec: TensorSpec,
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
        self.alg = get(sc.algorithm.name)
        self.model_spec = model_spec
        self.task_spec = model_spec.repeated(self.alg.task_copies)
        self.update_spec = model_spec.repeated(self.alg.update_copies)
        ctx = ServerContext(x0=model_x0, num_clients=sc.data.num_clients, seed=sc.seed,
                            local=local_config(sc))
        self.strategy: ServerAlgorithm = self.alg.server(sc.algorithm, ctx)
        self.hosts = HostTable(sc.data.num_clients, fedsim_version, scenario_hash, allowed)
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
        self.clamped = 0
        self._client_rates: dict[int, RateLimit] = {}
        self._stopping = False
        self.resume = resume
        self.fedsim_version, self.scenario_hash = fedsim_version, scenario_hash
        self._aggregations_since_checkpoint = 0
        self._checkpoint_real = real_clock()
        self._shared_up: Any = None
        self.availability: dict[int, Any] = {}
        if hasattr(endpoint, "on_disconnect"):
            endpoint.on_disconnect = self._disconnected
        if hasattr(endpoint, "on_refused"):
            endpoint.on_refused = self.refused_connection

    def refused_connection(self, address: str, why: str) -> None:
        """The transport refused a connection (a key not on the allow-list, a failed handshake)."""
        self._reject(address.encode() or b"?", "unauthenticated", why)

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
            log.warning("start timeout (%.0f s): %d of %d clients registered (%d hosts)",
                        self.sc.deploy.start_timeout, len(self.hosts.registered()),
                        self.sc.data.num_clients, len(self.hosts.hosts))
        t0 = float(self.resume["t"]) if self.resume is not None else 0.0
        self.clock = self._clock(0.05 - t0 * self.dilation)
        self.timers = TimerHeap(self.clock, use_timerfd=self.use_timerfd)
        self.state = state = self._new_state(self.clock)
        if self.resume is not None:
            self._restore(self.resume)
        for sender, reason, detail in self._early_rejects:
            state.rejected(t0, sender, reason, detail)
        if self.stop_reason is not None:
            return
        self.started = True
        self._shared_up = self.plan.bottleneck("up")
        registered = self.hosts.registered()
        self.clients = set(registered)
        for c in self.clients:
            self._add_link(c)
        start = self._start_message()
        for h in self.hosts.hosts.values():
            if h.alive:
                h.last_seen = self.real_clock()
                await self._to_host(h.peer, start)
        ticker = tg.create_task(self._ticker(), name="server-ticker")
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
            ticker.cancel()
            if state.stopped_at is None:  # an error ended it: the federation stopped now
                state.stopped_at = max(0.0, self.clock.now())
            await self._stop_hosts()

    def _start_message(self) -> list[Any]:
        assert self.clock is not None
        return encode(Start(epoch=self.clock.epoch, dilation=self.dilation,
                            spec=self.model_spec, task_copies=self.alg.task_copies,
                            host_step_time=self.sc.devices.host_step_time))

    def _add_link(self, cid: int) -> None:
        if cid not in self.links:
            self.links[cid] = self.plan.make_link(cid, "up", self._shared_up)
            self.availability[cid] = self.plan.availability(cid)

    def _clock(self, lead: float) -> Clock:
        clock = Clock(dilation=self.dilation, epoch=self.real_clock() + lead)
        clock._real_clock = self.real_clock
        return clock

    def _new_state(self, clock: Clock) -> RunState:
        return RunState(self.sc, self.run_dir, self.strategy.cadence, clock, self.evaluator,
                        fidelity=self.fidelity, totals=self._totals,
                        on_target=lambda: self.queue.put_nowait(StopRun("target_accuracy")),
                        fedsim_version=self.fedsim_version,
                        delays_ms={d: self.plan.mean_delay(d) * 1e3 for d in ("down", "up")})

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
        if not step.dispatch and self.strategy.in_flight() == 0:
            self.stop_reason = (f"failed: no round could start ({len(registered)} of "
                                f"{self.sc.data.num_clients} clients registered)")
            return
        self.began = True
        state.event(t0, "start", clients=len(registered))
        await self._apply(t0, step)

    # -- readers -------------------------------------------------------------------
    async def _read(self) -> None:
        """Decode and route every message; a bad one is rejected, logged and skipped.

        Total: whatever a peer sends, the reader goes on. A message that
        breaks a handler (a bug, since every message is validated first) is
        rejected as ``internal_error`` with its traceback in the log.
        """
        while True:
            peer, frames = await self.endpoint.recv()
            try:
                msg, meta = decode(frames, max_bytes=self.max_bytes, spec=self.update_spec)
                await self._route(peer, msg, meta)
            except (WireError, Refusal) as exc:
                self._reject(peer, exc.reason, exc.detail)
            except Exception as exc:
                log.exception("a message from %r broke its handler", peer)
                self._reject(peer, "internal_error", f"{type(exc).__name__}: {exc}")

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

    def _checked_host(self, peer: bytes, meta: Any) -> HostInfo | None:
        """The live host behind ``peer``, its sequence and rate checked (None: unregistered)."""
        host = self.hosts.by_peer(peer)
        if host is None or not host.alive:
            return None
        if self.endpoint.user(peer) != host.user:
            raise Refusal("unauthenticated",
                          f"this connection is not the one {host.name} registered with its key")
        now = self.real_clock()
        if not host.seen.add(meta.seq):
            raise Refusal("replay", f"sequence number {meta.seq} was already received")
        host.last_seen = now
        if host.rate is None:
            rate = self.sc.deploy.max_host_rate
            host.rate = RateLimit(rate, 5 * rate, now)
        if not host.rate.take(now):
            raise Refusal("rate_limited",
                          f"{host.name} sent over {self.sc.deploy.max_host_rate:g} messages/s")
        return host

    async def _route(self, peer: bytes, msg: Any, meta: Any) -> None:
        if isinstance(msg, HostHello):
            await self._hello(peer, msg, meta)
            return
        if isinstance(msg, ClockProbe):  # also a heartbeat; answered before registration too
            self._checked_host(peer, meta)
            reply = ClockReply(seq=msg.seq, t_sent=msg.t_sent, t_server=self.real_clock())
            await self._to_host(peer, encode(reply))
            return
        host = self._checked_host(peer, meta)
        if host is None:
            raise Refusal("unknown_client",
                          f"a {type(msg).__name__} from a connection no host registered")
        if isinstance(msg, Update | Ready | Failed | Leave):
            if msg.client not in host.samples or msg.client not in self.links:
                raise Refusal("unknown_client", f"client {msg.client} does not run on {host.name}")
            limit = self._client_rates.get(msg.client)
            if limit is None:
                rate = self.sc.deploy.max_client_rate
                limit = self._client_rates[msg.client] = RateLimit(rate, 5 * rate,
                                                                   self.real_clock())
            if not limit.take(self.real_clock()):
                raise Refusal("rate_limited", f"client {msg.client} sent over "
                              f"{self.sc.deploy.max_client_rate:g} messages/s")
            self._uplink(host, msg.client, msg, meta)
            return
        if meta.nbytes > self.sc.deploy.max_control_mb * 1e6:
            raise Refusal("oversize", f"a {meta.kind} of {meta.nbytes} bytes (control messages: "
                          f"deploy.max_control_mb = {self.sc.deploy.max_control_mb:g})")
        if isinstance(msg, EventBatch):
            if msg.host != host.name or self.state is None:
                raise Refusal("unknown_client", f"events from {msg.host!r} on {host.name}'s "
                              "connection" if msg.host != host.name else "events before the start")
            bad = self.state.write_events(msg.events, host.name, frozenset(host.clients))
            for why in bad:
                self._reject(peer, "bad_event", why)
        elif isinstance(msg, HostBye):
            if not self._stopping:
                raise Refusal("out_of_order", "a goodbye before the server said stop")
            if msg.host != host.name or self.hosts.goodbye(peer, msg) is None:
                raise Refusal("out_of_order", f"a goodbye from {msg.host!r}, not expected")
            self._bye.set()
        else:
            raise Refusal("unexpected_kind", f"a {type(msg).__name__} is not for the server")

    async def _hello(self, peer: bytes, msg: HostHello, meta: Any) -> None:
        user = self.endpoint.user(peer)
        old = self.hosts.hosts.get(msg.host)
        if (old is not None and old.alive and self.started and old.user == user
                and old.peer == peer and self.hosts.is_restart(old, msg)):
            # its process was restarted before its silence gave it away: a ROUTER
            # takes a connection under a routing id only once the old one is gone
            why = "restarted (a new process registered under its name)"
            lost = self.hosts.lose(msg.host, why, self._now())
            self.queue.put_nowait(HostExited(msg.host, why, tuple(lost)))
        why = self.hosts.hello(peer, msg, user)
        if why is None and self.stop_reason is not None:
            why = "the federation is ending"
        if why is not None:
            log.error("refused client host %s: %s", msg.host, why)
            self._reject(peer, "refused", why)
            await self._to_host(peer, encode(Refused(reason=why)))
            return
        info = self.hosts.hosts[msg.host]
        info.seen.add(meta.seq)
        info.last_seen = self.real_clock()
        log.info("client host %s registered: clients %s, clock offset %.6f s +- %.3f ms",
                 msg.host, format_ids(msg.clients), msg.clock_offset,
                 msg.clock_uncertainty * 1e3)
        if self.started:  # a lost host restarted: it takes its clients back
            self.queue.put_nowait(HostJoined(msg.host))
        elif len(self.hosts.registered()) == self.sc.data.num_clients:
            self._registered.set()

    async def _to_host(self, peer: bytes, frames: list[Any]) -> None:
        try:
            await self.endpoint.send(peer, frames)
        except PeerGone:
            log.warning("host %r is gone", peer)

    def _send_time(self, host: HostInfo, claimed: float) -> tuple[float, bool]:
        """The send time a message claims, bounded by what the server observed.

        A host's emulated clock agrees with the server's up to its clock
        uncertainty, and a message cannot have been in transit longer than
        ``deploy.max_transit_ms``: a claim outside ``[now - max transit, now +
        uncertainty]`` is clamped into it and the message is not judged for
        lateness. Inside those bounds, a message that arrives later than the
        link would have delivered it by more than the allowed lateness (its
        real transit was longer than its emulated delay, or its claimed send
        time is forged) is not judged either, but counted against its host
        (``late_arrivals``): so a forged timestamp can neither fail nor pass
        the verdict, and a real network slower than the emulated one shows.
        """
        now = self._now()
        hi = now + host.clock_uncertainty / self.dilation + 1e-6
        lo = now - self.sc.deploy.max_transit_ms / 1e3 / self.dilation
        if lo <= claimed <= hi:
            return claimed, False
        self.clamped += 1
        self.monitor.record_clamped()
        return min(max(claimed, lo), hi), True

    def _uplink(self, host: HostInfo, cid: int, msg: ClientMessage, meta: Any) -> None:
        assert self.timers is not None
        assert self.state is not None
        sent, clamped = self._send_time(host, meta.sent_at)
        if clamped:
            self.state.event(self._now(), "warning", client=cid, kind=meta.kind.lower(),
                             sent_at=meta.sent_at, reason="send time out of bounds: clamped")
        d = self.links[cid].schedule(sent, meta.nbytes)
        if d.dropped:
            self.state.event(self._now(), "drop", client=cid, kind=meta.kind.lower(), dir="up",
                             bytes=meta.nbytes, sent_at=sent, reason=d.reason)
            return
        received = self._now()
        if not clamped and received - d.t_deliver > self.monitor.allowed_lateness():
            host.late_arrivals += 1
            clamped = True
        self.timers.call_at(d.t_deliver, self._delivered, cid, msg, meta, d, sent, clamped)

    def _delivered(self, cid: int, msg: ClientMessage, meta: Any, d: Any, sent: float,
                   unjudged: bool) -> None:
        assert self.state is not None
        now = self._now()
        if not unjudged:
            self.monitor.record_delivery(self.plan.kind(cid, "up"), d, now)
        lost = self._away_between(cid, sent, now)
        self.state.event(now, "drop" if lost else "deliver", client=cid, kind=meta.kind.lower(),
                         dir="up", bytes=meta.nbytes, sent_at=sent,
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
            timeout = self.sc.deploy.host_timeout
            for name in self.hosts.silent(self.real_clock(), timeout):
                self.hosts.hosts[name].last_seen = float("inf")  # reported once
                self.queue.put_nowait(HostExited(name, f"silent for over {timeout:g} s"))

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
                case HostExited(host=host, why=why, clients=clients):
                    step = self._host_lost(now, host, why, clients)
                case HostJoined(host=host):
                    step = await self._host_joined(now, host)
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
                step.then(self._lose(now, cid, f"host {host} lost"))
        return step

    async def _host_joined(self, now: float, name: str) -> Step | None:
        """A host registered after the start (restarted): its clients rejoin."""
        assert self.state is not None
        info = self.hosts.hosts.get(name)
        if info is None or not info.alive or self.stop_reason is not None:
            return None
        await self._to_host(info.peer, self._start_message())
        self.state.event(now, "host_joined", host=name, clients=len(info.clients))
        log.warning("client host %s joined at t=%.2f: clients %s rejoin", name, now,
                    format_ids(info.clients))
        step = Step()
        for cid in info.clients:
            self._add_link(cid)
            self.clients.add(cid)
            self._failed.discard(cid)
            self.state.samples[cid] = info.samples[cid]
            step.then(self.strategy.rejoin(cid, now, reset=True))
        return step

    # -- checkpoints ------------------------------------------------------------------
    def checkpoint(self, now: float) -> Path:
        """Write ``checkpoint.pt`` atomically: all a resumed run continues from.

        The global model and the algorithm's state, the run's counters and
        records, the event log's and metrics' lengths (a resumed run
        truncates them back), the RNG states, the next task id. What happens
        after it (tasks in flight, updates not yet applied) is what a resume
        loses.
        """
        assert self.state is not None
        self.state.event(now, "checkpoint", version=self.strategy.version,
                         updates=self.state.updates, rounds=self.state.rounds)
        data = {
            "format": 1, "t": now, "fedsim_version": self.fedsim_version,
            "scenario_hash": self.scenario_hash, "version": self.strategy.version,
            "strategy": self.strategy.state_dict(), "run": self.state.checkpoint_state(),
            "next_task_id": next(self.task_ids), "clamped": self.clamped,
            "rng": {"python": random.getstate(), "torch": torch.get_rng_state()},
        }
        path = self.run_dir / "checkpoint.pt"
        tmp = path.with_suffix(".pt.tmp")
        with open(tmp, "wb") as fh:
            torch.save(data, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        self._aggregations_since_checkpoint = 0
        self._checkpoint_real = self.real_clock()
        return path

    def _maybe_checkpoint(self, now: float, step: Step) -> None:
        run = self.sc.run
        n = step.rounds_closed if self.strategy.cadence == "rounds" else sum(
            a.updates for a in step.applied)
        self._aggregations_since_checkpoint += n
        due = (run.checkpoint_every and self._aggregations_since_checkpoint >= run.checkpoint_every
               ) or (run.checkpoint_seconds and self._aggregations_since_checkpoint and
                     self.real_clock() - self._checkpoint_real >= run.checkpoint_seconds)
        if due:
            self.checkpoint(now)

    def _restore(self, ckpt: dict[str, Any]) -> None:
        assert self.state is not None
        self.strategy.load_state_dict(ckpt["strategy"])
        self.state.restore(ckpt["run"])
        self.task_ids = itertools.count(int(ckpt["next_task_id"]))
        self.clamped = int(ckpt.get("clamped", 0))
        random.setstate(ckpt["rng"]["python"])
        torch.set_rng_state(ckpt["rng"]["torch"])
        t = float(ckpt["t"])
        self.state.resumed.append({"t": t, "updates": self.state.updates,
                                   "rounds": self.state.rounds})
        self.state.event(t, "resume", version=self.strategy.version,
                         updates=self.state.updates, rounds=self.state.rounds)
        log.warning("resumed at t=%.2f (version %d, %d updates, %d rounds)", t,
                    self.strategy.version, self.state.updates, self.state.rounds)

    async def _apply(self, now: float, step: Step) -> None:
        assert self.state is not None
        assert self.timers is not None
        if self.state.applied(now, step):
            self._eval(now)
        if step.applied or step.rounds_closed:
            self._maybe_checkpoint(now, step)
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
        self.state.event(now, "send", client=cid, dir="down", bytes=body.nbytes, sent_at=now,
                         **fields)

    async def _stop_hosts(self) -> None:
        """Tell live hosts to stop; wait up to 10 real seconds for each one's goodbye."""
        stop = encode(Stop(reason=self.stop_reason or "completed"))
        self._stopping = True
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
        hosts = self.hosts.hosts.values()
        return {"overruns": sum(b.overruns for b in byes),
                "compute_deadlines": sum(b.compute_deadlines for b in byes),
                "rejected": sum(b.rejected for b in byes),
                "clamped": self.clamped,
                "late_arrivals": sum(h.late_arrivals for h in hosts),
                "hosts": {"registered": len(self.hosts.hosts), "reported": len(byes),
                          "lost": [h.name for h in hosts if not h.alive],
                          "unreported": [h.name for h in hosts if h.bye is None]}}

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
        for h in self.hosts.hosts.values():
            offsets = [h.clock_offset, *(h.bye.clock_offsets if h.bye is not None else ())]
            drift = max(abs(o - h.clock_offset) for o in offsets)
            mon.record_clock(h.name, h.clock_offset, h.clock_uncertainty + drift)
        report = mon.report()
        for h in self.hosts.hosts.values():  # the fastest probe's round trip at registration
            report["clocks"][h.name]["rtt_ms"] = 2e3 * h.clock_uncertainty
            report["clocks"][h.name]["late_arrivals"] = h.late_arrivals
        report["hosts_reported"] = len(self.hosts.byes())
        report["hosts_registered"] = len(self.hosts.hosts)
        lost = [h.name for h in self.hosts.hosts.values() if h.bye is None]
        if lost:
            report["hosts_unreported"] = lost
        return report


def load_checkpoint(run_dir: Path, fedsim_version: str, scenario_hash: str) -> dict[str, Any]:
    """A run directory's checkpoint, its event log and metrics truncated back to it.

    Raises ValueError naming what does not match (another fedsim version,
    another scenario) or FileNotFoundError if the run never checkpointed.
    """
    path = run_dir / "checkpoint.pt"
    if not path.exists():
        raise FileNotFoundError(f"{path}: the run wrote no checkpoint (nothing to resume)")
    ckpt: dict[str, Any] = torch.load(path, weights_only=False)
    if ckpt.get("format") != 1:
        raise ValueError(f"{path}: unknown checkpoint format {ckpt.get('format')!r}")
    if ckpt["fedsim_version"] != fedsim_version:
        raise ValueError(f"{path} was written by fedsim {ckpt['fedsim_version']}, "
                         f"this is {fedsim_version}")
    if ckpt["scenario_hash"] != scenario_hash:
        raise ValueError(f"{path} belongs to another scenario (hash "
                         f"{ckpt['scenario_hash'][:12]}, the run directory's is "
                         f"{scenario_hash[:12]})")
    for name, key in (("events.jsonl", "events_offset"), ("metrics.csv", "metrics_offset")):
        f = run_dir / name
        if f.exists():
            with open(f, "r+b") as fh:
                fh.truncate(int(ckpt["run"][key]))
    return ckpt
