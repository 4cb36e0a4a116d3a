"""A client-host process: many client actors on one event loop.

One host runs a few thousand client actors on one asyncio loop (no thread
or process per client), one torch worker process that trains their tasks,
and a control connection to the server over which it announces itself,
learns the run's epoch and dilation, ships its event-log records and is
told to stop. Control traffic bypasses the emulated network.

Run as ``python -m fedsim.actors.host --control ADDR --data ADDR
--host-id N --clients 0,2,4 --scenario FILE``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from typing import Any

from fedsim import wire
from fedsim.actors import _proc
from fedsim.actors._setup import local_config
from fedsim.actors._workers import WorkerHandle
from fedsim.actors.client import ClientActor
from fedsim.algorithms import get
from fedsim.network import NetPlan
from fedsim.scenario import Scenario, parse
from fedsim.transport import Transport, ipc_address
from netem.clock import Clock, monotonic
from netem.fidelity import FidelityMonitor
from netem.timers import TimerHeap

__all__ = ["HostContext", "main", "run_host"]

log = logging.getLogger(__name__)


def boot_id() -> str:
    """This machine's boot id: equal ids share one CLOCK_MONOTONIC."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            return fh.read().strip()
    except OSError:
        return ""


class HostContext:
    """What the client actors of one host share."""

    def __init__(self, sc: Scenario, name: str, transport: Transport, data_address: str,
                 control: Any, trainer: WorkerHandle) -> None:
        self.sc = sc
        self.name = name
        self.transport = transport
        self.data_address = data_address
        self.control = control
        self.trainer = trainer
        self.clock = Clock()
        self.timers: TimerHeap | None = None  # type: ignore[assignment]
        self.spec: wire.TensorSpec | None = None
        self.max_bytes = int(sc.deploy.max_message_mb * 1e6)
        self.events: list[dict[str, Any]] = []
        self.overruns = 0
        self.compute_deadlines = 0
        self.plan = NetPlan(sc, host_step_time=sc.devices.host_step_time)
        self.local = local_config(sc)
        self.monitor = FidelityMonitor()

    def make_link(self, cid: int, direction: str) -> Any:
        return self.plan.make_link(cid, direction)

    def expected_steps(self, task: wire.Task, num_samples: int) -> int:
        """Local steps ``task`` will take on ``num_samples`` samples (its own budget first)."""
        local = self.local
        if "steps" in task.config:
            return int(task.config["steps"])
        if "epochs" in task.config:
            per_epoch = -(-num_samples // local.batch_size)
            return max(1, round(float(task.config["epochs"]) * per_epoch))
        return local.num_steps(num_samples)

    def compute_time(self, actor: Any, steps: int, run_index: int) -> float:
        """Emulated compute time of ``steps`` local steps on this client's device."""
        return actor.device.compute_time(steps, actor.device_rng, run_index)

    def emit(self, ev: str, **fields: Any) -> None:
        """Queue an event-log record for the server."""
        rec = {"t": round(self.clock.now(), 6),
               "real": round(monotonic() - self.clock.epoch, 6), "ev": ev}
        rec.update(fields)
        self.events.append(rec)

    async def flush_events(self) -> None:
        if self.events:
            batch, self.events = self.events, []
            await self.control.send_multipart(
                wire.encode(wire.EventBatch(host=self.name, events=tuple(batch))), copy=False)


async def _recv_control(sock: Any) -> Any:
    frames = await sock.recv_multipart(copy=False)
    msg, _ = wire.decode(frames, check_finite=False)
    return msg


async def run_host(sc: Scenario, host_id: int, clients: list[int], control_address: str,
                   data_address: str, scenario_file: str, run_id: str) -> int:
    """Run one client host until the server says stop."""
    name = f"host-{host_id}"
    transport = Transport(max_sockets=len(clients) + 16)
    control = transport.dealer(control_address, identity=name.encode())
    trainer = WorkerHandle(transport, ipc_address(run_id, f"{name}-trainer"), scenario_file,
                           "trainer", clients)
    ctx = HostContext(sc, name, transport, data_address, control, trainer)
    actors: list[ClientActor] = []
    try:
        t_hello = monotonic()
        await control.send_multipart(wire.encode(wire.HostHello(
            host=name, clients=tuple(clients), pid=os.getpid(),
            info={"boot_id": boot_id(), "mono": t_hello})), copy=False)
        hello = await trainer.start()
        samples = {int(k): int(v) for k, v in hello.args["samples"].items()}
        # The clients' connections are made before the host says it is ready,
        # so the server can send to every client from t = 0.
        actors = [ClientActor(c, ctx, samples[c]) for c in clients]
        await control.send_multipart(wire.encode(wire.Control(
            op="ready", args={"host": name, "samples": {str(k): v for k, v in samples.items()}})),
            copy=False)
        start = await _recv_control(control)
        if not isinstance(start, wire.Control) or start.op != "start":
            log.error("%s expected start, got %r", name, start)
            return 3
        args = start.args
        offset = 0.0 if args.get("boot_id") == boot_id() else float(args.get("offset", 0.0))
        ctx.clock = Clock(dilation=float(args["dilation"]), epoch=float(args["epoch"]) - offset)
        ctx.timers = TimerHeap(ctx.clock)
        ctx.monitor = FidelityMonitor(dilation=ctx.clock.dilation)
        ctx.spec = wire.TensorSpec([(tuple(s), "float32") for s in args["shapes"]])
        ctx.spec = ctx.spec.repeated(get(sc.algorithm.name).task_copies)
        await ctx.timers.sleep_until(0.0)
        tasks = [asyncio.create_task(a.run(), name=f"client-{a.cid}") for a in actors]

        async def flusher() -> None:
            while True:
                await asyncio.sleep(0.25)
                await ctx.flush_events()

        flush_task = asyncio.create_task(flusher())
        while True:
            msg = await _recv_control(control)
            if isinstance(msg, wire.Control) and msg.op == "stop":
                break
            if isinstance(msg, wire.Bye):
                break
        for a in actors:
            a.stop()
        _, pending = await asyncio.wait(tasks, timeout=5.0)
        for t in pending:
            t.cancel()
        flush_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await flush_task
        await ctx.flush_events()
        for a in actors:
            ctx.monitor.record_loss(a.kind, a.down.loss_stats)
        await control.send_multipart(wire.encode(wire.Control(op="bye", args={
            "host": name, "overruns": ctx.overruns, "compute_deadlines": ctx.compute_deadlines,
            "fidelity": ctx.monitor.export(),
            "rejected": sum(a.rejected for a in actors)})), copy=False)
        return 0
    finally:
        await trainer.close()
        if ctx.timers is not None:
            ctx.timers.close()
        transport.close(linger_ms=1000)


def main(argv: list[str] | None = None) -> int:
    """Entry point of a client-host process."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--control", required=True)
    ap.add_argument("--data", required=True)
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
    _proc.configure_child_logging(f"host-{args.host_id}")
    with open(args.scenario) as fh:
        sc = parse(json.load(fh), args.scenario)
    clients = [int(c) for c in args.clients.split(",") if c]
    coro = run_host(sc, args.host_id, clients, args.control, args.data, args.scenario,
                    args.run_id)
    if sc.deploy.loop == "uvloop":
        with contextlib.suppress(ImportError):
            import uvloop

            return uvloop.run(coro)
    return asyncio.run(coro)


if __name__ == "__main__":
    sys.exit(main())
