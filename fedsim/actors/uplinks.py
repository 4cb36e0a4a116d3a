"""The server's uplinks: a client's message from its arrival to the server's queue.

:class:`Uplinks` is a part of :class:`~fedsim.actors.server.Server`. A
client's message that passed the reader's checks (:mod:`.host_sessions`)
arrives here with the send time its envelope claims. That claim is bounded
by what the server observed (:class:`~fedsim.actors.client_links.SendTimes`)
and, for an update, by the server's record of the task it answers
(:mod:`._server_tasks`: the task's earliest delivery plus the least compute
before the upload on the client's device); a correction is counted against
the host and fails the fidelity verdict by its name. The client's emulated
uplink (:class:`~fedsim.actors.client_links.ClientLinks`) then schedules
the message, the timer heap holds it until that time, and it is put on the
server's queue as a :class:`~fedsim.actors._server_queue.FromClient`
(or dropped, by the link or because the client was away meanwhile). Each
delivery is judged by netem's fidelity monitor unless its lateness is the
sender's (it arrived after its own delivery time).

An update's values (no NaN or infinity in the model) are checked off the
event loop from :data:`CHECK_OFF_LOOP_BYTES` (64 KiB): the reader decodes it
without that pass, :meth:`Uplinks.check` hands the pass to a thread of its
own while the update crosses its uplink, and at its delivery an update whose
values failed is rejected (the reader's rejection, with its reason) instead
of queued. The pass reads every byte of a model fresh from the socket (at
100 KB about 20 us on the loop, against about 10 us to hand it over; at
10 MB 0.6 ms against 0.1: ``tools/bench_wire.py``); a smaller update's pass
stays in the reader.
"""

from __future__ import annotations

import _thread
import asyncio
import queue
import threading
from collections.abc import Callable
from time import perf_counter

from fedsim.actors._refusal import Refusal
from fedsim.actors._server_queue import ClientMessage, FromClient, Item
from fedsim.actors._server_tasks import TOLERANCE, TaskBook, TaskRecord
from fedsim.actors._server_view import RunView
from fedsim.actors.client_links import ClientLinks, SendTimes
from fedsim.actors.hosts import HostInfo
from fedsim.algorithms.api import ServerAlgorithm
from fedsim.scenario.network import NetPlan
from fedsim.wire.codec import Meta, check_values
from fedsim.wire.errors import WireError
from fedsim.wire.messages import Update
from fedsim.wire.tensors import Model
from netem.fidelity import FidelityMonitor
from netem.link import Delivery

__all__ = ["CHECK_OFF_LOOP_BYTES", "Uplinks", "ValueCheck", "ValueChecks"]

#: updates of at least this many bytes have their values checked off the event loop
#: (measured in docs/benchmarks.md's wire section)
CHECK_OFF_LOOP_BYTES = 64 << 10


class ValueCheck:
    """One model's value checks, under way in :class:`ValueChecks`' thread."""

    __slots__ = ("_done", "error", "model")

    def __init__(self, model: Model) -> None:
        self.model: Model | None = model
        self.error: WireError | None = None
        self._done = _thread.allocate_lock()
        self._done.acquire()          # released by the checking thread

    def finish(self) -> None:
        """The checks are done (:attr:`error` says how): wake :meth:`result`'s waiter."""
        self.model = None
        self._done.release()

    def result(self) -> None:
        """Wait for the checks (they ran while the update crossed its uplink, as a
        rule); raise their :class:`~fedsim.wire.errors.WireError` if they failed."""
        self._done.acquire()
        self._done.release()
        if self.error is not None:
            raise self.error


class ValueChecks:
    """A thread that runs :func:`~fedsim.wire.codec.check_values` on the models
    handed to it, in order. Handing one over costs the event loop a lock and a
    queue's put (a thread pool's future cost it as much as the pass over a
    100 KB model: ``tools/bench_wire.py``)."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[ValueCheck | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def submit(self, model: Model) -> ValueCheck:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="fedsim-values",
                                            daemon=True)
            self._thread.start()
        check = ValueCheck(model)
        self._queue.put(check)
        return check

    def _run(self) -> None:
        while True:
            check = self._queue.get()
            if check is None:
                return
            try:
                assert check.model is not None
                check_values(check.model)
            except WireError as exc:
                check.error = exc
            except Exception as exc:  # never leave a delivery waiting
                check.error = WireError("bad_value", f"its values could not be checked: "
                                        f"{type(exc).__name__}: {exc}")
            finally:
                check.finish()

    def close(self) -> None:
        """End the thread once the checks handed over are done."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None


class Uplinks:
    """Every client's messages through its emulated uplink to the server's queue."""

    def __init__(self, run: RunView, queue: asyncio.Queue[Item], *, links: ClientLinks,
                 send_times: SendTimes, tasks: TaskBook, plan: NetPlan,
                 monitor: FidelityMonitor, strategy: ServerAlgorithm, in_flight: str) -> None:
        self.run = run
        self.queue = queue
        self.links = links
        self.send_times = send_times
        self.tasks = tasks
        self.plan = plan
        self.monitor = monitor
        self.strategy = strategy
        #: what a message in flight when its client goes away becomes (network.in_flight)
        self.in_flight = in_flight
        #: the thread that checks updates' values (started at the first update)
        self._checks = ValueChecks()
        #: how an update whose values failed is rejected (the reader's rejection)
        self.on_refused: Callable[[HostInfo, WireError], None] | None = None

    def check(self, model: Model) -> ValueCheck:
        """Start the value checks of an update's ``model`` off the event loop."""
        return self._checks.submit(model)

    def close(self) -> None:
        """The run is over: end the checking thread."""
        self._checks.close()

    def earliest(self, cid: int, task: TaskRecord, msg: Update) -> float:
        """The earliest emulated time ``cid`` can have sent ``msg``, answering ``task``:
        the task's earliest delivery plus the least compute of the work before
        the upload on the client's device (:mod:`._server_tasks`)."""
        steps = self.strategy.least_steps(task.steps, msg.round)
        return task.delivered + self.plan.least_compute(cid, steps)

    def receive(self, host: HostInfo, cid: int, msg: ClientMessage, meta: Meta,
                values: ValueCheck | None = None) -> None:
        """``cid``'s message arrived from ``host`` (checked, decoded): bound its send
        time, schedule it on the client's uplink and hold it until delivered;
        ``values``: its model's value checks, under way (:meth:`check`).
        :class:`~fedsim.actors._refusal.Refusal` (``unknown_task``): an update of a
        task the server did not send to ``cid``, or no longer remembers."""
        timers, state = self.run.timers, self.run.state
        assert timers is not None
        assert state is not None
        now = self.run.now()
        # the envelope's claim first (any client message), then an update's task
        sent, clamped = self.send_times.bounded(host.name, host.clock_uncertainty,
                                                meta.sent_at, now)
        if clamped:
            state.event(now, "warning", client=cid, kind=meta.kind.lower(),
                        sent_at=meta.sent_at, reason="send time out of bounds: clamped")
        task = None
        if isinstance(msg, Update):
            task = self.tasks.find(cid, msg.task_id)
            if task is None:
                raise Refusal("unknown_task", f"an update of task {msg.task_id}, which the "
                              f"server did not send to client {cid} (or long ago)")
            earliest = self.earliest(cid, task, msg)
            if sent < earliest - TOLERANCE:
                if not clamped:  # (a message is counted once)
                    self.send_times.corrected(host.name, "before_record")
                state.event(now, "warning", client=cid, kind=meta.kind.lower(),
                            sent_at=meta.sent_at, task_id=task.task_id,
                            reason="send time before the task's earliest delivery and "
                            f"compute: raised to {earliest:.6f}")
                sent, clamped = earliest, True
        d = self.links.uplink(cid).schedule(sent, meta.nbytes)
        if d.dropped:
            state.event(now, "drop", client=cid, kind=meta.kind.lower(), dir="up",
                        bytes=meta.nbytes, sent_at=sent, reason=d.reason)
            return
        if not clamped and now - d.t_deliver > self.monitor.allowed_lateness():
            host.late_arrivals += 1
            clamped = True
        timers.call_at(d.t_deliver, self._delivered, host, cid, msg, meta, d, sent, clamped,
                       task, values)

    def _delivered(self, host: HostInfo, cid: int, msg: ClientMessage, meta: Meta,
                   d: Delivery, sent: float, unjudged: bool, task: TaskRecord | None,
                   values: ValueCheck | None) -> None:
        state = self.run.state
        assert state is not None
        now = self.run.now()
        if not unjudged:
            self.monitor.record_delivery(self.plan.kind(cid, "up"), d, now)
        if values is not None:
            try:
                values.result()      # done while it crossed the link, or nearly
            except WireError as exc:
                if self.on_refused is not None:
                    self.on_refused(host, exc)
                return
        lost = self.links.away_between(cid, sent, now, self.in_flight)
        state.event(now, "drop" if lost else "deliver", client=cid, kind=meta.kind.lower(),
                    dir="up", bytes=meta.nbytes, sent_at=sent,
                    scheduled=d.t_deliver, version=None if task is None else task.version,
                    task_id=None if task is None else task.task_id, reason=lost)
        if lost:
            return
        if isinstance(msg, Update):
            state.count_up(meta.nbytes)
        self.queue.put_nowait(FromClient(cid, msg, perf_counter(), task))
