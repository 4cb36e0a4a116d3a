"""The server's sending: a client's task or average stamped, charged and sent to its host.

:class:`Downlinks` is a part of :class:`~fedsim.actors.server.Server` that
owns the envelopes' sequence numbers and the sends under way. A task or an
average is encoded here, with its model when the client's host does not
hold that version yet (:mod:`fedsim.wire.payloads`: a task's by version,
an average's by round) and without it when it does; either way its size,
for the links and the counts, is the message's with its model. The host
delivers it through the client's emulated downlink; the server schedules
the same message on its copy of that link
(:class:`~fedsim.actors.client_links.ClientLinks`) to note each task's
emulated delivery in its record (:mod:`._server_tasks`). Where the
scenario has a shared downlink bottleneck at the server, a task waits here
until the shared stage has sent it, charged in full. What to send and when
is the server's decision (:mod:`fedsim.actors.server`).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable
from time import perf_counter
from typing import Any

from fedsim.actors._server_tasks import TaskBook, TaskRecord
from fedsim.actors._server_view import RunView
from fedsim.actors.client_links import ClientLinks
from fedsim.actors.hosts import HostTable
from fedsim.actors.server_gate import RecordBudget
from fedsim.algorithms.local import LocalConfig
from fedsim.results.phases import PhaseStats
from fedsim.scenario.network import NetPlan
from fedsim.wire.codec import Body, Frames, encode, encode_body, model_cost, stamp
from fedsim.wire.messages import Average, ClockReply, Task
from fedsim.wire.tensors import Model, TensorSpec
from fedsim.wire.transport import Endpoint, PeerGone

__all__ = ["Downlinks"]

# the server actor's logger: its records keep their name wherever the code lives
log = logging.getLogger("fedsim.actors.server")


class Downlinks:
    """What the server sends its hosts: to a client (stamped, charged) or to a host."""

    def __init__(self, run: RunView, endpoint: Endpoint, *, hosts: HostTable,
                 links: ClientLinks, tasks: TaskBook, plan: NetPlan, records: RecordBudget,
                 phases: PhaseStats, local: LocalConfig, partition: tuple[int, ...],
                 task_spec: TensorSpec, real_clock: Callable[[], float],
                 unreachable: Callable[[int], None], steps_known: bool = True) -> None:
        self.run = run
        self.endpoint = endpoint
        self.hosts = hosts
        self.links = links
        self.tasks = tasks
        self.plan = plan
        self.records = records
        self.phases = phases
        self.local = local
        self.partition = partition
        self.task_spec = task_spec
        #: whether a task's steps follow from [client] (no: clients with their own code)
        self.steps_known = steps_known
        self.real_clock = real_clock
        #: told of a client whose host cannot be reached (the server lets it go)
        self.unreachable = unreachable
        #: the envelopes' sequence numbers (a host refuses one it has seen)
        self.seq = itertools.count()
        #: sends waiting for the shared downlink bottleneck, until they are done
        self.pending: set[asyncio.Future[None]] = set()

    # -- to a host -----------------------------------------------------------------
    async def to_host(self, peer: bytes, frames: Frames) -> None:
        """Send ``frames`` to a host (logged if it is gone)."""
        try:
            await self.endpoint.send(peer, frames)
        except PeerGone:
            log.warning("host %r is gone", peer)

    async def connected(self, peer: bytes) -> bool:
        """Whether ``peer``'s connection is still there (a ClockReply no host can take
        for its own goes to it: the send fails when it is gone)."""
        try:
            await self.endpoint.send(peer, encode(ClockReply(seq=0, t_sent=-1e9,
                                                             t_server=self.real_clock())))
        except PeerGone:
            return False
        return True

    # -- to a client -----------------------------------------------------------------
    def encode(self, msg: Task | Average) -> Body:
        """``encode_body(msg)``, timed: the server's encode phase (real seconds)."""
        t0 = perf_counter()
        body = encode_body(msg)
        self.phases.add("encode.server", perf_counter() - t0)
        return body

    async def task(self, now: float, task: Task) -> None:
        """Send ``task`` to its client, through the server's downlink bottleneck if the
        scenario has one."""
        cid = task.client
        model = task.model
        assert model is not None
        if not self.task_spec.accepts(model.spec):  # a view, not a copy, in the wire's layout
            model = Model.from_flat(model.flat(), self.task_spec)
            task = task.with_model(model)
        fields = {"kind": "task", "version": task.version, "task_id": task.task_id,
                  "round": task.round}
        # the steps its client takes (as the client host counts them): its budget
        # on the client's partition; 0 where the algorithm's clients train with
        # code of their own, whose steps are known only afterwards
        steps = (self.local.with_work(task.work).num_steps(self.partition[cid])
                 if self.steps_known else 0)
        egress = self.links.egress
        if egress is not None:
            # A shared downlink bottleneck at the server: the message really
            # waits here until the shared stage has sent it (charged in full,
            # its model included, whether or not it goes with it).
            nbytes = self.encode(task.with_model(None)).nbytes + model_cost(model)
            p = self.plan.params(cid, "down")
            _, end = egress.reserve(now, nbytes + p.packets(nbytes) * p.overhead)
            if end > now:
                timers = self.run.timers
                assert timers is not None
                timers.call_at(end, self._send_later, cid, task, fields, steps)
                return
        await self.send(now, cid, task, steps=steps, **fields)

    def _send_later(self, cid: int, msg: Task, fields: dict[str, Any], steps: int) -> None:
        future = asyncio.ensure_future(self.send(self.run.now(), cid, msg, steps=steps,
                                                 **fields))
        self.pending.add(future)
        future.add_done_callback(self.pending.discard)

    async def send(self, now: float, cid: int, msg: Body | Task | Average, *,
                   steps: int | None = None, **fields: Any) -> None:
        """Stamp and send one message to a client through its host; log it.

        ``msg`` is an encoded message, or a task or an average: encoded
        here, with its model when the client's host does not hold it yet,
        without it when it does (see the module).
        A task (``steps``: its local work's steps) is noted in the record
        with its emulated delivery at the client, from the server's copy of
        the client's downlink; where that is not known, ``now`` (its
        stamped send time) plus the least its downlink can take for its size.
        """
        state = self.run.state
        assert state is not None
        peer = self.hosts.owner(cid)
        owner = self.hosts.owner_info(cid)
        if isinstance(msg, Task | Average):
            assert msg.model is not None
            inline = owner is not None and (
                owner.sent.needs(msg.version) if isinstance(msg, Task)
                else owner.sent_rounds.needs(msg.round))
            body = self.encode(msg if inline else msg.with_model(None))
            nbytes = body.nbytes if inline else body.nbytes + model_cost(msg.model)
        else:
            body, nbytes = msg, msg.nbytes
        frames = stamp(body, sent_at=now, seq=next(self.seq))
        # scheduled on the copy of the downlink now, in the order of the sends: the
        # host's link schedules the messages to a client in the order they arrive
        delivered = self.links.down_delivery(cid, now, nbytes)
        try:
            if peer is None:
                raise PeerGone(f"no host runs client {cid}")
            await self.endpoint.send(peer, frames)
        except PeerGone as exc:
            self.links.unknown([cid])
            state.event(now, "warning", client=cid, reason=f"send failed: {exc}")
            self.unreachable(cid)
            return
        if steps is not None:
            if delivered is None:
                delivered = now + self.plan.least_transfer(cid, "down", nbytes, now)
            self.tasks.sent(cid, TaskRecord(
                task_id=fields["task_id"], version=fields["version"], round=fields["round"],
                delivered=delivered, steps=steps))
        state.count_down(nbytes, body.nbytes)
        if owner is not None:
            self.records.sent(cid, owner.name)
        state.event(now, "send", client=cid, dir="down", bytes=nbytes, sent_at=now, **fields)
