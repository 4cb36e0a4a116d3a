"""A client host: many client actors on one event loop, one connection to the server.

The host builds its torch worker (which loads the clients' data), registers
its clients and their sample counts with a :class:`~fedsim.messages.HostHello`
(set-up, before the emulated clock starts), and waits for the server's
:class:`~fedsim.messages.Start` (the clock's epoch and dilation, the model's
tensor spec). It then demultiplexes the connection: each Task or Average
goes to its client's downlink, then to the client's inbox; clients send
through :meth:`ClientHost.send`. Event-log records go to the server in
batches; on :class:`~fedsim.messages.Stop` the host stops its clients and
says goodbye with its own measurements (downlink fidelity, compute
overruns, rejected messages). Its tasks run in one ``asyncio.TaskGroup``.

Run as ``python -m fedsim.actors.host --connect ADDR --host-id N --clients
0,2,4 --scenario FILE``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import logging
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

from fedsim.actors import _proc
from fedsim.actors._refusal import Refusal
from fedsim.actors._setup import local_config
from fedsim.actors.client import ClientActor
from fedsim.codec import decode, encode
from fedsim.messages import (
    Average,
    ClockReply,
    Event,
    EventBatch,
    HostBye,
    HostHello,
    Message,
    Ready,
    Refused,
    Start,
    Stop,
    Task,
    TensorSpec,
    WireError,
)
from fedsim.network import NetPlan
from fedsim.scenario import Scenario
from fedsim.transport import Connection
from netem.clock import Clock, monotonic
from netem.fidelity import FidelityMonitor
from netem.timers import TimerHeap

__all__ = ["ClientHost", "boot_id", "main"]

log = logging.getLogger(__name__)

#: Exit code of a host the server refused.
EXIT_REFUSED = 4


def boot_id() -> str:
    """This machine's boot id: equal ids share one CLOCK_MONOTONIC."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            return fh.read().strip()
    except OSError:
        return ""


class ClientHost:
    """The client actors of one host and what they share."""

    def __init__(self, sc: Scenario, name: str, clients: list[int], conn: Connection,
                 trainer: Any, *, fedsim_version: str, scenario_hash: str,
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
        self.max_bytes = int(sc.deploy.max_message_mb * 1e6)
        self.clock = Clock()
        self.timers: TimerHeap = None  # type: ignore[assignment]  # set at Start
        self.monitor = FidelityMonitor()
        self.model_spec = TensorSpec(())
        self.task_spec = TensorSpec(())
        self.clients: dict[int, ClientActor] = {}
        self.events: list[Event] = []
        self.overruns = 0
        self.compute_deadlines = 0
        self.rejected = 0
        self.seq = itertools.count()
        self._stop = asyncio.Event()

    # -- what client actors use ------------------------------------------------------
    def emit(self, ev: str, **fields: Any) -> None:
        """Queue an event-log record for the server."""
        self.events.append(Event.of(round(self.clock.now(), 6),
                                    round(self.clock.real() - self.clock.epoch, 6), ev,
                                    **fields))

    async def send(self, msg: Message) -> None:
        """Stamp a client's message with the emulated send time and send it."""
        frames = encode(msg, sent_at=self.clock.now(), seq=next(self.seq))
        await self.conn.send(frames)
        self.emit("send", client=getattr(msg, "client", None), kind=type(msg).__name__.lower(),
                  dir="up", bytes=sum(memoryview(f).nbytes for f in frames),
                  reset=msg.reset if isinstance(msg, Ready) else None)

    def expected_steps(self, task: Task, num_samples: int) -> int:
        """Local steps ``task`` will take on ``num_samples`` samples (its own budget first)."""
        local = self.local
        if task.work is not None and task.work.steps is not None:
            return task.work.steps
        if task.work is not None and task.work.epochs is not None:
            per_epoch = -(-num_samples // local.batch_size)
            return max(1, round(task.work.epochs * per_epoch))
        return local.num_steps(num_samples)

    # -- the host's life ---------------------------------------------------------------
    async def run(self) -> int:
        """Register, run the clients until the server says stop, say goodbye."""
        ready = await self.trainer.start()
        samples = dict(zip(self.client_ids, ready.samples, strict=True))
        await self.conn.send(encode(HostHello(
            host=self.name, pid=os.getpid(), clients=tuple(self.client_ids),
            samples=tuple(samples[c] for c in self.client_ids), boot_id=boot_id(),
            fedsim_version=self.fedsim_version, scenario_hash=self.scenario_hash)))
        start = await self._await_start()
        if start is None:
            return EXIT_REFUSED
        clock = Clock(dilation=start.dilation, epoch=start.epoch)
        clock._real_clock = self.real_clock
        self.clock = clock
        self.timers = TimerHeap(clock, use_timerfd=self.use_timerfd)
        self.monitor = FidelityMonitor(dilation=start.dilation)
        self.model_spec = start.spec
        self.task_spec = start.spec.repeated(start.task_copies)
        self.clients = {c: ClientActor(c, self, samples[c]) for c in self.client_ids}
        try:
            async with asyncio.TaskGroup() as tg:
                reader = tg.create_task(self._read(), name=f"{self.name}-reader")
                flusher = tg.create_task(self._flusher(), name=f"{self.name}-events")
                await self.timers.sleep_until(0.0)
                runs = [tg.create_task(a.run(), name=f"client-{a.cid}")
                        for a in self.clients.values()]
                await self._stop.wait()
                for a in self.clients.values():
                    a.stop()
                _, pending = await asyncio.wait(runs, timeout=5.0)
                for t in pending:
                    t.cancel()
                flusher.cancel()
                reader.cancel()
            await self.flush_events()
            for a in self.clients.values():
                self.monitor.record_loss(a.kind, a.down.loss_stats)
            await self.conn.send(encode(HostBye(
                host=self.name, overruns=self.overruns,
                compute_deadlines=self.compute_deadlines,
                rejected=self.rejected + sum(a.rejected for a in self.clients.values()),
                fidelity=self.monitor.export())))
        finally:
            self.timers.close()
        return 0

    async def _await_start(self) -> Start | None:
        while True:
            try:
                msg, _ = decode(await self.conn.recv(), max_bytes=self.max_bytes)
            except WireError as exc:
                log.warning("%s: rejected a message before the start: %s", self.name, exc)
                continue
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
            try:
                msg, meta = decode(frames, max_bytes=self.max_bytes)
                if isinstance(msg, Task | Average):
                    want = self.task_spec if isinstance(msg, Task) else self.model_spec
                    if msg.model.spec != want:
                        raise Refusal("shape_mismatch", f"{meta.kind}: model spec differs")
                    actor = self.clients.get(msg.client)
                    if actor is None:
                        raise Refusal("unknown_client", f"client {msg.client} is not here")
                    actor.arrived(msg, meta)
                elif isinstance(msg, Stop):
                    self._stop.set()
                elif not isinstance(msg, ClockReply):
                    raise Refusal("unexpected_kind", f"a {type(msg).__name__} is not for a host")
            except (WireError, Refusal) as exc:
                self.rejected += 1
                log.warning("%s rejected a message: %s", self.name, exc)
                self.emit("reject", reason=exc.reason, detail=str(exc)[:300])

    async def _flusher(self) -> None:
        while True:
            await asyncio.sleep(0.25)
            await self.flush_events()

    async def flush_events(self) -> None:
        while self.events:
            batch, self.events = self.events[:5000], self.events[5000:]
            await self.conn.send(encode(EventBatch(host=self.name, events=tuple(batch))))


def main(argv: list[str] | None = None) -> int:
    """Entry point of a client-host process."""
    from fedsim.actors._workers import WorkerHandle
    from fedsim.scenario import parse, scenario_hash
    from fedsim.transport import ZmqContext, ipc_address

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--connect", required=True, help="the server's address")
    ap.add_argument("--host-id", type=int, required=True)
    ap.add_argument("--clients", required=True)
    ap.add_argument("--scenario", required=True, help="resolved scenario JSON")
    ap.add_argument("--run-id", default=str(os.getpid()))
    ap.add_argument("--parent", type=int, default=None)
    args = ap.parse_args(argv)
    if args.parent is not None:
        _proc.die_with_parent(args.parent)
    _proc.ignore_sigint()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    name = f"host-{args.host_id}"
    _proc.configure_child_logging(name)
    with open(args.scenario) as fh:
        raw = json.load(fh)
    sc = parse(raw, args.scenario)
    clients = [int(c) for c in args.clients.split(",") if c]

    async def go() -> int:
        zmq_ctx = ZmqContext(max_message_bytes=int(sc.deploy.max_message_mb * 1e6))
        conn = zmq_ctx.connect(args.connect, name.encode())
        trainer = WorkerHandle(zmq_ctx, ipc_address(args.run_id, f"{name}-trainer"),
                               args.scenario, "trainer", clients)
        host = ClientHost(sc, name, clients, conn, trainer,
                          fedsim_version=_proc.fedsim_version(),
                          scenario_hash=scenario_hash(raw))
        try:
            return await host.run()
        finally:
            await trainer.close()
            zmq_ctx.close(linger_ms=1000)

    return _proc.run_loop(go(), sc.deploy.loop)


if __name__ == "__main__":
    sys.exit(main())
