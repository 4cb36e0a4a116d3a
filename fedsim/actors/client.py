"""The client actor: one emulated device inside a client host.

Each client owns a DEALER connection to the server (its own socket, as a
device has) and an inbox. Messages from the server pass through the
client's downlink on arrival: the host's timer heap holds each one until the
link delivers it, then puts it in the inbox. A task is trained by the host's
torch worker process; the actor then holds the result until the device's
emulated compute time has passed (``steps x step_time``) and sends it.
A result that comes back after that deadline is a fidelity violation: it
is counted and logged, never hidden.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from typing import TYPE_CHECKING, Any

from fedsim import wire

if TYPE_CHECKING:
    from fedsim.actors.host import HostContext

__all__ = ["ActorStopped", "ClientActor"]

log = logging.getLogger(__name__)


class ActorStopped(RuntimeError):
    """The actor stopped while a request was pending."""


class ClientActor:
    """Protocol of one client: register, train tasks, send updates."""

    def __init__(self, cid: int, host: HostContext, num_samples: int) -> None:
        self.cid = cid
        self.host = host
        self.num_samples = num_samples
        self.inbox: asyncio.Queue[Any] = asyncio.Queue()
        self.down = host.make_link(cid, "down")
        self.seq = itertools.count()
        self.sock = host.transport.dealer(host.data_address, identity=f"c{cid}".encode())
        self.rejected = 0
        self.overruns = 0
        self.stopped = False

    # -- lifecycle ------------------------------------------------------------
    async def run(self) -> None:
        """Register, then serve the inbox until a Bye or a stop."""
        reader = asyncio.create_task(self._read(), name=f"client-{self.cid}-reader")
        try:
            await self.send(wire.Register(client=self.cid, host=self.host.name,
                                          num_samples=self.num_samples, info={}))
            while True:
                msg = await self.inbox.get()
                if msg is None or isinstance(msg, wire.Bye):
                    break
                if isinstance(msg, wire.Task):
                    await self.on_task(msg)
                else:
                    log.warning("client %d ignores %s", self.cid, type(msg).__name__)
        finally:
            self.stopped = True
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
            self.host.transport.close_socket(self.sock, linger_ms=200)

    def stop(self) -> None:
        """Ask the actor to finish (after the task it is running)."""
        self.inbox.put_nowait(None)

    # -- network --------------------------------------------------------------
    async def _read(self) -> None:
        host = self.host
        while True:
            frames = await self.sock.recv_multipart(copy=False)
            try:
                msg, meta = wire.decode(frames, max_bytes=host.max_bytes, spec=host.spec)
            except wire.WireError as exc:
                self.rejected += 1
                log.warning("client %d rejected a message: %s", self.cid, exc)
                host.emit("reject", client=self.cid, reason=exc.reason, detail=str(exc))
                continue
            d = self.down.schedule(meta.sent_at, meta.nbytes)
            if d.dropped:
                host.emit("drop", client=self.cid, kind=meta.kind, bytes=meta.nbytes,
                          dir="down", reason=d.reason)
                continue
            host.timers.call_at(d.t_deliver, self._deliver, msg, meta, d.t_deliver)

    def _deliver(self, msg: Any, meta: Any, scheduled: float) -> None:
        now = self.host.clock.now()
        self.host.lateness.append(now - scheduled)
        self.host.emit("deliver", client=self.cid, kind=meta.kind, dir="down",
                       bytes=meta.nbytes, sent_at=meta.sent_at, scheduled=scheduled,
                       version=getattr(msg, "version", None))
        self.inbox.put_nowait(msg)

    async def send(self, msg: Any) -> int:
        """Stamp the emulated send time and send; returns the payload bytes."""
        frames = wire.encode(msg, sent_at=self.host.clock.now(), seq=next(self.seq))
        nbytes = sum(len(memoryview(f)) for f in frames)
        await self.sock.send_multipart(frames, copy=False)
        self.host.emit("send", client=self.cid, kind=type(msg).__name__.lower(),
                       dir="up", bytes=nbytes)
        return nbytes

    # -- work -----------------------------------------------------------------
    async def on_task(self, task: wire.Task) -> None:
        """Train, hold until the emulated compute deadline, send the update."""
        host = self.host
        t0 = host.clock.now()
        host.emit("train_start", client=self.cid, version=task.version,
                  task_id=task.task_id, round=task.round)
        reply = await host.trainer.request(task)
        if not isinstance(reply, wire.Update):
            log.error("client %d: trainer failed: %s", self.cid, reply)
            host.emit("train_error", client=self.cid, task_id=task.task_id,
                      reason=getattr(reply, "reason", repr(reply)))
            return
        steps = int(reply.stats.get("steps", 0))
        deadline = t0 + host.compute_time(self.cid, steps)
        done = host.clock.now()
        overrun = done > deadline
        if overrun:
            self.overruns += 1
            host.overruns += 1
        else:
            await host.timers.sleep_until(deadline)
        host.compute_deadlines += 1
        host.emit("train_end", client=self.cid, version=task.version, task_id=task.task_id,
                  steps=steps, deadline=deadline, overrun=round(max(0.0, done - deadline), 6),
                  compute_real=reply.stats.get("compute_s"))
        await self.send(reply)
