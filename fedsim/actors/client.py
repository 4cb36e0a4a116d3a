"""The client actor: one emulated device inside a client host.

Each client owns a DEALER connection to the server (its own socket, as a
device has) and an inbox. Messages from the server pass through the
client's downlink on arrival: the host's timer heap holds each one until the
link delivers it, then puts it in the inbox. A task is trained by the host's
torch worker process; the actor then holds the result until the device's
emulated compute time has passed and sends it. A result that comes back
after that deadline is a fidelity violation: it is counted and logged,
never hidden.

Availability: a client can be *away* (suspended for a while after a run, or off in
an on/off process or trace). Away, it computes nothing and sends nothing;
a run in progress is abandoned. Messages that reach it while away are held
until it returns (``network.in_flight = "held"``) or lost (``"dropped"``,
``"reset"``). Back, it announces itself with ``Heartbeat(status="ready")``,
or re-registers after a reset, and the server gives it fresh work.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
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
        self.kind = host.plan.kind(cid, "down")
        self.seq = itertools.count()
        self.sock = host.transport.dealer(host.data_address, identity=f"c{cid}".encode())
        self.rejected = 0
        self.overruns = 0
        self.stopped = False
        self.device = host.plan.device(cid)
        self.device_rng = host.plan.device_rng(cid)
        self.runs = 0
        self.suspension = host.plan.suspension(cid)
        self.suspension_rng = host.plan.suspension_rng(cid)
        self.availability = host.plan.availability(cid)
        self.away = False
        self.available = asyncio.Event()
        self.available.set()
        self.generation = 0
        self.held: list[Any] = []

    # -- lifecycle ------------------------------------------------------------
    async def run(self) -> None:
        """Serve the inbox until a Bye or a stop (registration was done by the host)."""
        reader = asyncio.create_task(self._read(), name=f"client-{self.cid}-reader")
        try:
            self._watch_availability(0.0)
            while True:
                msg = await self.inbox.get()
                if msg is None or isinstance(msg, wire.Bye):
                    break
                if isinstance(msg, wire.Task):
                    await self.on_task(msg)
                elif isinstance(msg, _Back):
                    await self._announce(msg.reset)
                elif isinstance(msg, wire.Aggregate):  # an average after its session ended
                    log.debug("client %d: late %s", self.cid, type(msg).__name__)
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

    def drain_inbox(self) -> list[Any]:
        """Everything delivered so far, without waiting."""
        out = []
        while not self.inbox.empty():
            out.append(self.inbox.get_nowait())
        return out

    def _register(self) -> wire.Register:
        return wire.Register(client=self.cid, host=self.host.name,
                             num_samples=self.num_samples, info={})

    # -- availability -----------------------------------------------------------
    def _watch_availability(self, t: float) -> None:
        """Follow an on/off process or trace: go away and come back on its changes."""
        av = self.availability
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
        self.available.clear()
        self.away = True
        self.generation += 1
        self.host.emit("away", client=self.cid, why=why, until=until)

    def _come_back(self, why: str) -> None:
        self.away = False
        self.available.set()
        policy = self.host.sc.network.in_flight
        self.host.emit("back", client=self.cid, why=why, held=len(self.held))
        has_task = any(isinstance(m, wire.Task) for m in self.held)
        for msg in self.held:
            self.inbox.put_nowait(msg)
        self.held = []
        if not has_task:  # a held task is the work; its update will say the client is back
            self.inbox.put_nowait(_Back(reset=policy == "reset"))

    async def _announce(self, reset: bool) -> None:
        if self.away:
            return
        if reset:
            await self.send(self._register())
        else:
            await self.send(wire.Heartbeat(sender=self.cid, status="ready", info={}))

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
            host.timers.call_at(d.t_deliver, self._deliver, msg, meta, d, self.generation)

    def _deliver(self, msg: Any, meta: Any, d: Any, generation: int) -> None:
        host = self.host
        now = host.clock.now()
        host.monitor.record_delivery(self.kind, d, now)
        policy = host.sc.network.in_flight
        lost = (self.away and policy != "held") or (
            policy == "reset" and generation != self.generation)
        host.emit("drop" if lost else "deliver", client=self.cid, kind=meta.kind, dir="down",
                  bytes=meta.nbytes, sent_at=meta.sent_at, scheduled=d.t_deliver,
                  version=getattr(msg, "version", None),
                  **({"reason": f"away ({policy})"} if lost else {}))
        if lost:
            return
        if self.away:
            self.held.append(msg)
        else:
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
        """Run a task's local work (a session of one or more pieces) and send its updates.

        Each piece is trained by the host's torch worker; the actor holds its
        result until the device's emulated compute time has passed, sends its
        upload, and either stops, asks for the next piece, or first waits for
        a round's average (pipelined algorithms). While the client is away it
        neither computes nor sends.
        """
        host = self.host
        t0 = host.clock.now()
        gen = self.generation
        run_index, self.runs = self.runs, self.runs + 1
        host.emit("train_start", client=self.cid, version=task.version,
                  task_id=task.task_id, round=task.round)
        susp = None
        if self.suspension is not None:
            t_run = host.compute_time(self, host.expected_steps(task, self.num_samples),
                                      run_index)
            susp = self.suspension.draw_run(t_run, self.suspension_rng)
        if susp is not None and susp.discard_update:
            # The run is wasted and the client hangs; it computes and
            # sends nothing until it comes back.
            until = t0 + susp.unavailable_for
            self._go_away("suspend", until=until)
            host.emit("train_end", client=self.cid, version=task.version,
                      task_id=task.task_id, discarded="suspended")
            await host.timers.sleep_until(until)
            if self.away and gen + 1 == self.generation:
                self._come_back("resume")
            return
        reply = await host.trainer.request(wire.Task(
            client=self.cid, version=task.version, round=task.round, task_id=task.task_id,
            tensors=task.tensors, config={**task.config, "op": "begin"}))
        while True:
            if not isinstance(reply, wire.Update):
                reason = getattr(reply, "reason", repr(reply))
                log.error("client %d: trainer failed: %s", self.cid, reason)
                host.emit("train_error", client=self.cid, task_id=task.task_id, reason=reason)
                # a device whose training fails is out: say so, so the server does not wait
                await self.send(wire.Error(sender=self.cid, reason=f"training failed: {reason}"))
                return
            st = reply.stats
            steps = int(st.get("steps", 0))
            for corr in st.get("corrections", []):
                host.emit("correction", client=self.cid, round=corr[0], delay=corr[1])
            budget = host.compute_time(self, steps, run_index) if steps else 0.0
            deadline = t0 + budget
            done = host.clock.now()
            if budget > 0:
                host.monitor.record_compute(budget, done - t0)
                if done > deadline:
                    self.overruns += 1
                    host.overruns += 1
                else:
                    await host.timers.sleep_until(deadline)
                host.compute_deadlines += 1
            if st.get("next") == "done" and gen != self.generation:
                host.emit("train_end", client=self.cid, version=task.version,
                          task_id=task.task_id, steps=steps, discarded="went away")
                return
            if st.get("next") == "done":
                host.emit("train_end", client=self.cid, version=task.version,
                          task_id=task.task_id, steps=steps, deadline=deadline,
                          overrun=round(max(0.0, done - deadline), 6),
                          compute_real=st.get("compute_s"), **_lr_stats(st))
            if susp is not None and st.get("next") == "done":
                until = host.clock.now() + susp.hang  # suspended, work kept: hang, then send
                self._go_away("suspend", until=until)
                await host.timers.sleep_until(until)
                self.away = False
                self.available.set()
                host.emit("back", client=self.cid, why="resume", held=len(self.held))
                for msg in self.held:
                    self.inbox.put_nowait(msg)
                self.held = []
            await self.available.wait()  # away: no compute, no traffic until back
            if reply.tensors:
                r = st.get("upload_round")
                rnd = task.round if r is None else int(r)
                await self.send(wire.Update(
                    client=self.cid, task_id=task.task_id,
                    base_version=task.version if r is None else rnd, round=rnd,
                    num_samples=self.num_samples, tensors=reply.tensors,
                    stats={"steps": steps, "loss": st.get("loss")}))
            if st.get("next") == "done":
                return
            averages: dict[int, Any] = {}
            if st.get("next") == "wait":
                r = int(st["wait_round"])
                host.emit("barrier_wait", client=self.cid, round=r)
                while r not in averages:
                    msg = await self.inbox.get()
                    if msg is None or isinstance(msg, wire.Bye):
                        return
                    if isinstance(msg, wire.Aggregate):
                        averages[msg.round] = msg.tensors
                host.emit("barrier_resume", client=self.cid, round=r)
            for msg in self.drain_inbox():
                if isinstance(msg, wire.Aggregate):
                    averages[msg.round] = msg.tensors
                elif msg is None or isinstance(msg, wire.Bye):
                    return
                elif isinstance(msg, _Back):
                    await self._announce(msg.reset)
            await self.available.wait()
            rounds = sorted(averages)
            t0 = host.clock.now()
            run_index, self.runs = self.runs, self.runs + 1
            reply = await host.trainer.request(wire.Task(
                client=self.cid, version=0, round=0, task_id=task.task_id,
                tensors=tuple(a for r in rounds for a in averages[r]),
                config={"op": "advance", "rounds": rounds}))


class _Back:
    """Inbox marker: the client is available again."""

    __slots__ = ("reset",)

    def __init__(self, reset: bool) -> None:
        self.reset = reset


def _lr_stats(stats: Any) -> dict[str, Any]:
    """Per-run step sizes of adaptive optimizers, when the trainer reports them."""
    return {k: stats[k] for k in ("lr_last", "lr_mean", "lr_min", "lr_max") if k in stats}
