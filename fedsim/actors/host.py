"""A client host: many client actors on one event loop, one connection to the server.

The host builds its torch worker (which loads the clients' data), registers
its clients and their sample counts with a :class:`~fedsim.wire.messages.HostHello`
(set-up, before the emulated clock starts), and waits for the server's
:class:`~fedsim.wire.messages.Start` (the clock's epoch and dilation, the model's
tensor spec). It then demultiplexes the connection: each Task or Average
goes to its client's downlink, then to the client's inbox; clients send
through :meth:`ClientHost.send`. Event-log records go to the server in
batches, with the host's phase durations (encode, decode, queueing,
compute: :data:`~fedsim.wire.messages.HOST_PHASES`) since the previous batch;
on :class:`~fedsim.wire.messages.Stop` the host stops its clients and
says goodbye with its own measurements (downlink fidelity, compute
overruns, rejected messages). Its tasks run in one ``asyncio.TaskGroup``.
A server that restarts (``fedsim server --resume`` after it died) answers
the host's clock probes with a new incarnation (:class:`~fedsim.wire.messages.Start`):
the host then drops its clients' work under way and registers them again,
as at a start, keeping its worker and the clients' algorithm state.

It says what is happening: one INFO line per phase (connected, registered,
started, done). Over ZeroMQ its connection's monitor tells it within
milliseconds when the server refuses its key, or a handshake fails for a
protocol error: it logs the cause and exits 4 (:data:`EXIT_REFUSED`);
handshakes that keep being closed (a wrong ``server.key``, or a server not
listening yet behind a proxy) it warns about at once, and tries on. When the connection
drops and comes back, the server knows it under a new routing id: the host
registers again over it.

Run as ``python -m fedsim.actors.host --connect ADDR --host-id N --clients
0,2,4 --scenario FILE`` (``--clients 0:10000:2``: every second id below 10,000).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import logging
import os
import sys
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import replace
from time import perf_counter
from typing import Any, TypeVar

import numpy as np

from fedsim.actors import process
from fedsim.actors._refusal import Refusal
from fedsim.actors.client import ClientActor, Received, Trainer
from fedsim.actors.host_clock import ServerClock
from fedsim.actors.host_events import CHUNK, EventOutbox
from fedsim.actors.server_gate import BYE_HEADER_BYTES
from fedsim.actors.setup import local_config
from fedsim.actors.workers import WorkerDied, WorkerHandle
from fedsim.results.writer import boot_id
from fedsim.scenario import Scenario, parse, scenario_hash
from fedsim.scenario.ids import format_ids, parse_id_list
from fedsim.scenario.network import NetPlan
from fedsim.wire.codec import (
    DEFAULT_MAX_BYTES,
    Frame,
    Frames,
    decode,
    encode,
    encode_body,
    frame_view,
    header_bound,
    max_message_bytes,
    model_cost,
    restamp,
    stamp,
)
from fedsim.wire.curve import ClientKeys
from fedsim.wire.errors import WireError
from fedsim.wire.messages import (
    Advance,
    Average,
    ClockProbe,
    ClockReply,
    HostBye,
    HostHello,
    Message,
    Ready,
    Refused,
    Start,
    Stop,
    Task,
)
from fedsim.wire.payloads import WINDOW, HeldVersions, SentVersions
from fedsim.wire.tensors import BytesUpTo, Model, TensorSpec
from fedsim.wire.transport import Connection, ZmqContext, ipc_address
from netem.clock import Clock, monotonic
from netem.fidelity import FidelityMonitor
from netem.lossprocess import LossStats
from netem.timers import SPIN_MAX, TimerHeap

__all__ = ["ClientHost", "main", "serve_host"]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Exit code of a host the server refused.
EXIT_REFUSED = 4
#: Exit code of a host whose torch worker did not start (its log says why: a
#: ``--state`` file it must not read, data it cannot build).
EXIT_NO_WORKER = 2

#: Clients started between two returns to the event loop (as event records sent)
_CHUNK = CHUNK


class ClientHost:
    """The client actors of one host and what they share."""

    def __init__(self, sc: Scenario, name: str, clients: list[int], conn: Connection,
                 trainer: Trainer, *, fedsim_version: str, scenario_hash: str,
                 real_clock: Callable[[], float] = monotonic, use_timerfd: bool = True) -> None:
        self.sc = sc
        self.name = name
        self.client_ids = clients
        self.conn = conn
        self.trainer = trainer
        self.fedsim_version = fedsim_version
        self.scenario_hash = scenario_hash
        self.real_clock = real_clock
        self.use_timerfd = use_timerfd
        self.plan = NetPlan(sc, host_step_time=sc.devices.host_step_time)
        self.local = local_config(sc)
        #: what the server may send: any size before the start (it is trusted:
        #: its key is known), then the largest task of the model (or the scenario's
        #: deploy.max_message_mb)
        self.max_bytes = (DEFAULT_MAX_BYTES if sc.deploy.max_message_mb is None
                          else int(sc.deploy.max_message_mb * 1e6))
        self.max_header: int | None = None
        self.clock = Clock()
        self.timers: TimerHeap = None  # type: ignore[assignment]  # set at Start
        self.monitor = FidelityMonitor()
        self.model_spec = TensorSpec(())
        self.task_spec = TensorSpec(())
        self.clients: dict[int, ClientActor] = {}
        #: the models of the versions the server's tasks train from (each version's
        #: crosses once), and the versions whose model the trainer holds
        self.held = HeldVersions()
        self.held_rounds = HeldVersions()
        self.to_trainer = SentVersions()
        #: the rounds whose average the trainer holds (a pipelined session can have
        #: several rounds under way at once: a longer window than the versions')
        self.rounds_to_trainer = SentVersions(2 * WINDOW)
        #: the event-log records and phase durations on their way to the server (its
        #: sends go through the host's control channel, whatever it is at the time)
        self.outbox = EventOutbox(name, lambda msg: self._control(msg))
        self.phases = self.outbox.phases
        self.overruns = 0
        self.compute_deadlines = 0
        self.rejected = 0
        self.seq = itertools.count()
        self._stop = asyncio.Event()
        self._tg: asyncio.TaskGroup | None = None
        #: set once the server's Start has arrived and the clients run
        self.started = asyncio.Event()
        #: the server's clock as this host measures it (offset, drift, heartbeat)
        self.server_clock = ServerClock(real_clock, lambda msg: self._control(msg),
                                        lambda wait: self._recv_control(wait))
        self.exit_code = 0
        #: the incarnation of the server that started this host's clients (its Start),
        #: and whether a reply from another one came (it restarted: register again)
        self.server_id = ""
        self.server_restarted = False
        #: why the server refused this host's connection (its monitor said so)
        self.refused: str | None = None
        self._refused = asyncio.Event()
        self._hello: HostHello | None = None
        #: its connection came back: register again once a reply shows the server is
        #: the same incarnation (a restarted one gets a fresh registration instead)
        self._hello_again = False
        self._again: set[asyncio.Future[None]] = set()
        self.stop_reason = ""

    # -- what client actors use ------------------------------------------------------
    def emit(self, ev: str, at: float | None = None, **fields: Any) -> None:
        """Queue an event-log record for the server, at emulated time ``at`` (None: now)."""
        self.outbox.emit(self.clock, ev, at, **fields)

    async def send(self, msg: Message) -> None:
        """Stamp a client's message with the emulated send time and send it."""
        sent_at = self.clock.now()
        t0 = perf_counter()
        body = encode_body(msg)
        self.phases.add("encode.hosts", perf_counter() - t0)
        frames = stamp(body, sent_at=sent_at, seq=next(self.seq))
        await self.conn.send(frames)
        self.emit("send", client=getattr(msg, "client", None), kind=type(msg).__name__.lower(),
                  dir="up", bytes=sum(frame_view(f).nbytes for f in frames), sent_at=sent_at,
                  reset=msg.reset if isinstance(msg, Ready) else None)

    async def forward(self, frames: Frames, client: int) -> None:
        """Send a client's update, as its trainer encoded it, stamped with the emulated
        send time (its header and model are not unpacked or packed again)."""
        sent_at = self.clock.now()
        t0 = perf_counter()
        out = restamp(frames, sent_at=sent_at, seq=next(self.seq))
        self.phases.add("encode.hosts", perf_counter() - t0)
        await self.conn.send(out)
        self.emit("send", client=client, kind="update", dir="up",
                  bytes=sum(frame_view(f).nbytes for f in out), sent_at=sent_at)

    def task_frames(self, rec: Received, due: float, request_id: int) -> list[Frame]:
        """A task's frames for the trainer, stamped with when its result is due and its
        request id: as they came from the server, unless the trainer holds the model the
        server sent with it (left out) or lacks one the server left out (put back)."""
        needs = self.to_trainer.needs(rec.task.version)
        if needs == rec.inline:
            return restamp(rec.frames, sent_at=due, seq=request_id)
        task = rec.task if needs else rec.task.with_model(None)
        return stamp(encode_body(task), sent_at=due, seq=request_id)

    def advance(self, client: int, averages: Mapping[int, Model], due: float,
                request_id: int) -> Advance:
        """A pipelined session's next piece for the trainer, with the round averages
        that arrived: those the trainer does not hold yet go with it (back to back),
        the others are named in ``held``."""
        rounds = sorted(averages)
        carried = tuple(r for r in rounds if self.rounds_to_trainer.needs(r))
        model = None
        if carried:
            flat = (averages[carried[0]].flat() if len(carried) == 1
                    else np.concatenate([averages[r].flat() for r in carried]))
            model = Model.from_flat(flat, self.model_spec.repeated(len(carried)))
        return Advance(request_id=request_id, client=client, rounds=carried, model=model,
                       due=due, held=tuple(r for r in rounds if r not in carried))

    def expected_steps(self, task: Task, num_samples: int) -> int | None:
        """Local steps ``task`` will take on ``num_samples`` samples (its own budget first);
        None when the algorithm's clients train with code of their own, whose
        work is known only when it is done."""
        if task.work is None and self.sc.algorithm.client_table() is not None:
            return None
        local = self.local
        if task.work is not None and task.work.steps is not None:
            return task.work.steps
        if task.work is not None and task.work.epochs is not None:
            per_epoch = -(-num_samples // local.batch_size)
            return max(1, round(task.work.epochs * per_epoch))
        return local.num_steps(num_samples)

    # -- the host's life ---------------------------------------------------------------
    async def _control(self, msg: Message) -> None:
        """Send a control message (not emulated), numbered like every other send."""
        await self.conn.send(encode(msg, seq=next(self.seq)))

    async def sync_clock(self, probes: int = 8, first_timeout: float | None = None) -> None:
        """Measure the server's clock (:meth:`ServerClock.sync`); the first probe waits
        ``first_timeout`` (default ``deploy.start_timeout``: the server may not be up yet)."""
        await self.server_clock.sync(probes, first_timeout or self.sc.deploy.start_timeout)

    # -- the connection's state (a ZeroMQ connection's monitor) ----------------------
    def connection_state(self, state: str, detail: str) -> None:
        """What the connection's monitor reports: ``refused`` (why), ``connected``
        (``again`` after a drop: register again), ``disconnected``."""
        if state == "refused" and self.refused is None:
            self.refused = detail
            self._refused.set()
        elif state == "disconnected":
            log.warning("%s: lost the connection to the server; connecting again", self.name)
        elif state == "failing":
            log.warning("%s: %s; trying on", self.name, detail)
        elif state == "connected" and detail == "again" and self._hello is not None \
                and not self._stop.is_set():
            # a new connection has a new routing id: the server knows this host by its
            # registration (and its key), so it registers again over it; but first a
            # probe: a server that restarted meanwhile (another incarnation in its
            # reply) knows nothing of the old registration, and gets a fresh one
            # (_on_server_restart), never this one
            log.warning("%s: connected to the server again; registering again", self.name)
            self._hello_again = True
            self._in_background(self._control(ClockProbe(seq=999, t_sent=self.real_clock())))

    def _in_background(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._again.add(task)
        task.add_done_callback(self._again.discard)

    async def _unless_refused(self, aw: Coroutine[Any, Any, T]) -> T:
        """``await aw``, unless the server refuses this host first (ConnectionRefusedError)."""
        task = asyncio.ensure_future(aw)
        refused = asyncio.ensure_future(self._refused.wait())
        try:
            await asyncio.wait({task, refused}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # cancelled (a timeout around it): so is what it waits for
            task.cancel()
            raise
        finally:
            refused.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            raise ConnectionRefusedError(self.refused)
        return task.result()

    async def _recv_control(self, wait: float) -> Message | None:
        try:
            frames = await asyncio.wait_for(self._unless_refused(self.conn.recv()), wait)
        except TimeoutError:
            return None
        try:
            msg, _ = decode(frames, max_bytes=self.max_bytes, max_header=self.max_header)
        except WireError as exc:
            log.warning("%s: rejected a message before the start: %s", self.name, exc)
            return None
        return msg

    async def _prober(self) -> None:
        """Probe the server's clock (drift, and a heartbeat); a server silent for
        ``deploy.host_timeout`` real seconds is gone: the host stops."""
        await self.server_clock.probe(self.sc.deploy.host_timeout)
        log.error("%s: the server has been silent for %.0f s; stopping", self.name,
                  self.server_clock.silent_for())
        self.exit_code = 3
        self._stop.set()

    async def run(self) -> int:
        """Register, run the clients until the server says stop, say goodbye."""
        try:
            ready = await self._unless_refused(self.trainer.start())
        except WorkerDied as exc:
            log.error("%s: %s (its own error is logged above)", self.name, exc)
            return EXIT_NO_WORKER
        except ConnectionRefusedError as exc:
            log.error("%s: the server refused this host: %s", self.name, exc)
            return EXIT_REFUSED
        samples = dict(zip(self.client_ids, ready.samples, strict=True))
        self.build_clients(samples)
        process.freeze_heap()  # set-up done: no collection of the run walks it
        try:
            return await self._run(samples)
        finally:
            process.thaw_heap()

    async def _run(self, samples: dict[int, int]) -> int:
        """Register, wait for the start, run the clients, say goodbye (after the set-up).

        If the server restarts meanwhile (``fedsim server --resume`` after it
        died: its replies carry another incarnation), the host drops what its
        clients were doing and registers them again, as at a start; the
        worker's client state stays as it is.
        """
        process.to_foreground()   # the clock probes' round trips and the run keep time
        while True:
            start = await self._join(samples)
            if start is None:
                return EXIT_REFUSED
            if not await self._session(start):
                return self.exit_code
            self._reset(samples)

    async def _join(self, samples: dict[int, int]) -> Start | None:
        """Measure the clock, register the clients, wait for the Start (None: refused)."""
        try:
            await self.sync_clock()
        except TimeoutError:
            log.error("%s: no answer from the server (not up, a wrong address or server key, "
                      "or this host's key is not on its allow-list)", self.name)
            return None
        except ConnectionRefusedError as exc:
            log.error("%s: the server refused this host: %s", self.name, exc)
            return None
        log.info("%s: connected to the server (clock offset %+.6f s +- %.3f ms)", self.name,
                 self.server_clock.offset, self.server_clock.uncertainty * 1e3)
        self._hello_again = False  # registered afresh now
        self._hello = HostHello(
            host=self.name, pid=os.getpid(), clients=tuple(self.client_ids),
            samples=tuple(samples[c] for c in self.client_ids), boot_id=boot_id(),
            fedsim_version=self.fedsim_version, scenario_hash=self.scenario_hash,
            clock_offset=self.server_clock.offset,
            clock_uncertainty=self.server_clock.uncertainty)
        await self._control(self._hello)
        log.info("%s: registered clients %s; waiting for the federation to start",
                 self.name, format_ids(self.client_ids))
        try:
            return await self._await_start()
        except ConnectionRefusedError as exc:
            log.error("%s: the server refused this host: %s", self.name, exc)
            return None

    async def _session(self, start: Start) -> bool:
        """Run the clients from ``start`` until the server says stop (then say goodbye:
        False) or turns out to have restarted (True)."""
        self.server_clock.heard_now()
        self.begin(start)
        log.info("%s: the federation started (dilation %g): %d clients", self.name,
                 start.dilation, len(self.clients))
        try:
            async with asyncio.TaskGroup() as tg:
                self._tg = tg
                reader = tg.create_task(self._read(), name=f"{self.name}-reader")
                flusher = tg.create_task(self.outbox.run(), name=f"{self.name}-events")
                prober = tg.create_task(self._prober(), name=f"{self.name}-clock")
                watcher = tg.create_task(self._watch_refusal(), name=f"{self.name}-refusal")
                await self.timers.sleep_until(start.t0)
                for i, a in enumerate(self.clients.values(), 1):
                    a.start(start.t0)   # not from 0: no replay of the absences before
                    if i % _CHUNK == 0:
                        await asyncio.sleep(0)  # let timers due meanwhile run
                # what t = 0 recorded (every client that starts away): sent now, while
                # nothing is due, not with the first batch when deliveries are
                await self.outbox.flush()
                await self._stop.wait()
                # a restarted server knows nothing of the work under way: drop it now
                await self.stop_clients(wait=0.0 if self.server_restarted else 5.0)
                flusher.cancel()
                prober.cancel()
                reader.cancel()
                watcher.cancel()
            if self.server_restarted:
                return True
            await self.outbox.flush()
            kinds: set[str] = set()
            for a in self.clients.values():
                if a.has_link:
                    self.monitor.record_loss(a.kind, a.down.loss_stats)
                elif a.kind not in kinds:  # its kind is known, even if no message came
                    self.monitor.record_loss(a.kind, LossStats())
                kinds.add(a.kind)
            rejected = self.rejected + sum(a.rejected for a in self.clients.values())
            if self.refused is None:
                await self._control(self._goodbye(rejected))
                log.info("%s: done (%s): measurements sent; %d messages rejected", self.name,
                         self.stop_reason or "stopped", rejected)
        finally:
            self.timers.close()
        return False

    def _on_server_restart(self, incarnation: str) -> None:
        """A reply from another server incarnation: end this session, register again."""
        if self.server_restarted:
            return
        log.warning("%s: the server restarted (incarnation %s, was %s): registering "
                    "clients %s again", self.name, incarnation or "?", self.server_id,
                    format_ids(self.client_ids))
        self.server_restarted = True
        self._stop.set()

    def _reset(self, samples: dict[int, int]) -> None:
        """After a server restart: fresh client actors and counters, as a host at its
        start (what the clients did since the server's checkpoint is redone)."""
        self._stop.clear()
        self.started.clear()
        self.server_restarted = False
        self.server_id = ""
        self.outbox.clear()
        self.overruns = self.compute_deadlines = self.rejected = 0
        # the restarted server numbers its versions again from its checkpoint: a
        # version's model may differ from the one of that number before
        self.held.clear()
        self.held_rounds.clear()
        self.to_trainer.clear()
        self.rounds_to_trainer.clear()
        self.build_clients(samples)

    def _goodbye(self, rejected: int) -> HostBye:
        """The goodbye, its fidelity samples thinned until its header fits the server's limit."""
        samples = 20000
        while True:
            bye = HostBye(host=self.name, overruns=self.overruns,
                          compute_deadlines=self.compute_deadlines, rejected=rejected,
                          fidelity=self.monitor.export(samples),
                          clock_offsets=tuple(self.server_clock.offsets))
            if samples <= 16 or encode_body(bye).nbytes < BYE_HEADER_BYTES - 1024:
                return bye
            samples //= 2

    async def _watch_refusal(self) -> None:
        """The server refused this host's connection during the run: stop (exit 4)."""
        await self._refused.wait()
        log.error("%s: the server refused this host: %s", self.name, self.refused)
        self.exit_code = EXIT_REFUSED
        self._stop.set()

    def build_clients(self, samples: dict[int, int]) -> None:
        """Build the client actors (set-up: before the host registers, so that none
        of this work falls after the emulated clock starts)."""
        self.clients = {c: ClientActor(c, self, samples[c]) for c in self.client_ids}
        self.plan.draw_devices()

    def begin(self, start: Start) -> None:
        """The server's Start: the emulated clock, the timer heap and the model's shape."""
        if start.host_step_time is not None:
            self.sc = self.sc.model_copy(update={"devices": self.sc.devices.model_copy(
                update={"host_step_time": start.host_step_time})})
            self.plan = NetPlan(self.sc, host_step_time=start.host_step_time)
            self.plan.draw_devices()
        # the server's epoch on our clock
        clock = self.server_clock.emulated(start)
        self.clock = clock
        self.timers = TimerHeap(clock, use_timerfd=self.use_timerfd, spin_max=SPIN_MAX)
        self.monitor = FidelityMonitor(dilation=start.dilation)
        self.server_id = start.server
        self.model_spec = start.spec
        # byte payloads of any length up to a limit, or model copies
        self.task_spec = (BytesUpTo(start.payload_bytes) if start.payload_bytes
                          else start.spec.repeated(start.task_copies))
        if self.sc.deploy.max_message_mb is None:
            self.max_bytes = max(max_message_bytes(start.spec, max(1, start.task_copies)),
                                 max_message_bytes(self.task_spec))
        self.max_header = header_bound(self.task_spec)
        self.started.set()

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        """Run a client's work in the host's task group (a client that fails fails the host)."""
        assert self._tg is not None, "a client works only while its host runs"
        return self._tg.create_task(coro, name=name)

    async def stop_clients(self, wait: float = 5.0) -> None:
        """Stop every client: wait ``wait`` real seconds for those at work, cancel the rest."""
        for a in self.clients.values():
            a.stop()
        running = [a.task for a in self.clients.values() if a.task is not None]
        if running:
            _, pending = await asyncio.wait(running, timeout=wait)
            for t in pending:
                t.cancel()
        for a in self.clients.values():  # a cancelled one too: nothing starts any more
            a.stopped = True

    async def _await_start(self) -> Start | None:
        while True:
            msg = await self._recv_control(3600.0)
            if isinstance(msg, Start):
                return msg
            if isinstance(msg, Refused):
                log.error("%s: the server refused this host: %s", self.name, msg.reason)
                return None
            if isinstance(msg, Stop):
                log.error("%s: the run ended before it started: %s", self.name, msg.reason)
                return None

    async def _read(self) -> None:
        """Route every message: a client's to its downlink, control messages here."""
        while True:
            frames = await self.conn.recv()
            self.server_clock.heard_now()
            try:
                t0 = perf_counter()
                msg, meta = decode(frames, max_bytes=self.max_bytes, max_header=self.max_header)
                if isinstance(msg, Task | Average):
                    self.phases.add("decode.hosts", perf_counter() - t0)
                    want = self.task_spec if isinstance(msg, Task) else self.model_spec
                    if msg.model is not None and not want.accepts(msg.model.spec):
                        raise Refusal("shape_mismatch", f"{meta.kind}: model spec differs")
                    inline = msg.model is not None
                    # a model the host holds came without it: put back, and its link
                    # carries the message as it would have with it
                    msg = (self.held.bind(msg) if isinstance(msg, Task)
                           else self.held_rounds.bind(msg))
                    if not inline:
                        assert msg.model is not None
                        meta = replace(meta, nbytes=meta.nbytes + model_cost(msg.model))
                    actor = self.clients.get(msg.client)
                    if actor is None:
                        raise Refusal("unknown_client", f"client {msg.client} is not here")
                    actor.arrived(Received(msg, frames, inline) if isinstance(msg, Task)
                                  else msg, meta)
                elif isinstance(msg, Stop):
                    self.stop_reason = msg.reason
                    self._stop.set()
                elif isinstance(msg, ClockReply):
                    if msg.server != self.server_id:
                        self._on_server_restart(msg.server)
                    else:
                        if self._hello_again and self._hello is not None:
                            self._hello_again = False
                            self._in_background(self._control(self._hello))
                        self.server_clock.sample(msg)
                else:
                    raise Refusal("unexpected_kind", f"a {type(msg).__name__} is not for a host")
            except (WireError, Refusal) as exc:
                self.rejected += 1
                log.warning("%s rejected a message: %s", self.name, exc)
                self.emit("reject", reason=exc.reason, detail=str(exc)[:300])


async def serve_host(sc: Scenario, scenario_file: str, raw: dict[str, Any], *, connect: str,
                     name: str, clients: list[int], run_id: str,
                     keys: ClientKeys | None = None, state_dir: str | None = None,
                     zygote: str | None = None, trainer_cpu: int | None = None,
                     cpus: set[int] | None = None) -> int:
    """Run one client host against the server at ``connect``; its exit code.

    ``scenario_file`` holds the resolved scenario ``raw`` (the torch worker
    reads it); ``keys`` make the connection a CURVE client; with
    ``state_dir`` the clients' algorithm state survives a restart of the host.
    With ``zygote`` the trainer is forked from that zygote
    (:mod:`fedsim.actors.zygote`) instead of started from scratch; with
    ``trainer_cpu`` the trainer runs on that CPU alone, and with ``cpus`` the
    host (every thread it makes from here) on those (``deploy.pin_trainers``).
    """
    if cpus:
        process.pin_process(os.getpid(), cpus)
    zmq_ctx = ZmqContext(max_message_bytes=-1 if sc.deploy.max_message_mb is None
                         else int(sc.deploy.max_message_mb * 1e6))
    hosts: list[ClientHost] = []   # the host, once made: the connection's state goes to it
    early: list[tuple[str, str]] = []

    def on_state(state: str, detail: str) -> None:
        if hosts:
            hosts[0].connection_state(state, detail)
        else:
            early.append((state, detail))

    # no routing id: the server's ROUTER assigns one to each connection
    conn = zmq_ctx.connect(connect, None, keys, on_state=on_state)
    state = None
    if state_dir is not None:
        os.makedirs(state_dir, exist_ok=True)
        state = os.path.join(state_dir, f"{name}-clients.pt")
    trainer = WorkerHandle(zmq_ctx, ipc_address(run_id, f"{name}-trainer"),
                           scenario_file, "trainer", clients, state, zygote=zygote,
                           cpus=None if trainer_cpu is None else {trainer_cpu})
    host = ClientHost(sc, name, clients, conn, trainer,
                      fedsim_version=process.fedsim_version(),
                      scenario_hash=scenario_hash(raw))
    hosts.append(host)
    for item in early:
        host.connection_state(*item)
    try:
        return await host.run()
    finally:
        await trainer.close()
        zmq_ctx.close(linger_ms=1000)


def main(argv: list[str] | None = None) -> int:
    """Entry point of a client-host process started by ``fedsim run``."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--connect", required=True, help="the server's address")
    ap.add_argument("--host-id", type=int, required=True)
    ap.add_argument("--clients", required=True)
    ap.add_argument("--scenario", required=True, help="resolved scenario JSON")
    ap.add_argument("--run-id", default=str(os.getpid()))
    ap.add_argument("--parent", type=int, default=None)
    ap.add_argument("--zygote", default=None, help="zygote to fork the trainer from")
    ap.add_argument("--trainer-cpu", type=int, default=None, help="the trainer's own CPU")
    ap.add_argument("--cpus", default=None, help="CPUs for this host (comma-separated)")
    args = ap.parse_args(argv)
    name = f"host-{args.host_id}"
    if not process.become_child(args.parent, name):
        return 0
    with open(args.scenario) as fh:
        raw = json.load(fh)
    sc = parse(raw, args.scenario)
    clients = parse_id_list(args.clients)
    return process.run_loop(serve_host(sc, args.scenario, raw, connect=args.connect, name=name,
                                     clients=clients, run_id=args.run_id,
                                     zygote=args.zygote, trainer_cpu=args.trainer_cpu,
                                     cpus=None if args.cpus is None else
                                     {int(c) for c in args.cpus.split(",")}),
                             sc.deploy.loop)


if __name__ == "__main__":
    sys.exit(main())
