"""The server actor's side of its client hosts: registration, receiving, sending.

:class:`HostSide` is a part of :class:`~fedsim.actors.server.Server` (a
mixin: it holds no state of its own and declares what of the server's it
uses). Every message a host sends is checked before it is unpacked (a
routing id the server assigned, the envelope, its sender's budgets, its
header's size: :mod:`.server_gate`), then decoded, checked (its host,
sequence number, rate and size) and routed here: control messages (registration,
clock probes, event batches, goodbyes) are handled at once, and a client's
message is held by the timer heap until that client's emulated uplink
delivers it, then put on the server's queue as a
:class:`~fedsim.actors._server_queue.FromClient`. The send time a message
claims is bounded by what the server observed and, for an update, by its
record of the task it answers (:mod:`._server_tasks`); a correction is
counted against the host and fails the fidelity verdict by its name. A
message that breaks a rule is rejected with a stable reason code and the
reader goes on. It also sends (``Start``, a client's task or average
stamped with its send time, each task noted in the record), watches the
hosts' silence and, at the end, collects their goodbyes. What to send and
when is the server's decision (:mod:`fedsim.actors.server`).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable
from time import perf_counter
from typing import Any

from fedsim.actors._refusal import Refusal
from fedsim.actors._server_queue import (
    ClientMessage,
    FromClient,
    HostExited,
    HostJoined,
    Item,
    Tick,
)
from fedsim.actors._server_tasks import TOLERANCE, TaskBook, TaskRecord
from fedsim.actors.client_links import ClientLinks, SendTimes
from fedsim.actors.hosts import HostInfo, HostTable, RateLimit
from fedsim.actors.runstate import RunState
from fedsim.actors.server_gate import Gate, RecordBudget, Rejections
from fedsim.algorithms.api import AlgorithmSpec, ServerAlgorithm
from fedsim.results.phases import PhaseStats
from fedsim.scenario import Scenario
from fedsim.scenario.ids import format_ids
from fedsim.scenario.network import NetPlan
from fedsim.wire.codec import Body, Meta, decode, encode, encode_body, model_cost, peek, stamp
from fedsim.wire.errors import WireError
from fedsim.wire.messages import (
    Average,
    ClockProbe,
    ClockReply,
    EventBatch,
    Failed,
    HostBye,
    HostHello,
    Leave,
    Message,
    Ready,
    Refused,
    Start,
    Stop,
    Task,
    Update,
)
from fedsim.wire.tensors import TensorSpec
from fedsim.wire.transport import Endpoint, PeerGone
from netem.clock import Clock
from netem.fidelity import FidelityMonitor
from netem.link import Delivery
from netem.timers import TimerHeap

__all__ = ["HostSide"]

# the server actor's logger: its records keep their name wherever the code lives
log = logging.getLogger("fedsim.actors.server")

#: what a client sends (through its emulated uplink), as envelope kinds
_CLIENT_KINDS = frozenset({"Update", "Ready", "Failed", "Leave"})


class HostSide:
    """The server's traffic with its client hosts, both ways (a mixin of Server)."""

    # what of the server's state it reads and writes (set by Server.__init__)
    sc: Scenario
    alg: AlgorithmSpec
    endpoint: Endpoint
    real_clock: Callable[[], float]
    incarnation: str
    dilation: float
    max_bytes: int
    model_spec: TensorSpec
    update_spec: TensorSpec
    hosts: HostTable
    queue: asyncio.Queue[Item]
    clients: set[int]
    seq: itertools.count[int]
    started: bool
    stop_reason: str | None
    clock: Clock | None
    timers: TimerHeap | None
    state: RunState | None
    plan: NetPlan
    monitor: FidelityMonitor
    strategy: ServerAlgorithm
    tasks: TaskBook
    client_links: ClientLinks
    send_times: SendTimes
    phases: PhaseStats
    _registered: asyncio.Event
    _bye: asyncio.Event
    _stopping: bool
    _reader: asyncio.Task[None] | None
    _sends: set[asyncio.Future[None]]
    _client_rates: dict[int, RateLimit]
    gate: Gate
    records: RecordBudget
    rejections: Rejections

    # -- from the outside world --------------------------------------------------------
    def refused_connection(self, source: str, reason: str, why: str) -> None:
        """The transport refused a connection (a key not on the allow-list, a failed
        or timed-out handshake): counted, and logged within the per-source cap."""
        self.rejections.add(source, reason, why, what="a connection")

    def host_exited(self, host: str, why: str) -> None:
        """A host process ended (reported by whoever watches it)."""
        self.queue.put_nowait(HostExited(host, why))
        self._bye.set()

    # -- receiving -----------------------------------------------------------------------
    async def _read(self) -> None:
        """Check, decode and route every message; a bad one is rejected, logged and skipped.

        Total: whatever a peer sends, the reader goes on. A message that
        breaks a handler (a bug, since every message is validated first) is
        rejected as ``internal_error`` with its traceback in the log. What a
        registered host's message took (checks, decoding, handling) is
        charged to its budget of the server's time; after a millisecond of
        work the reader lets the loop run what is due (timers, deliveries).
        """
        chosen = getattr(self.endpoint, "assigned", None)
        worked = 0.0
        while True:
            peer, frames = await self.endpoint.recv()
            t0 = perf_counter()
            host: HostInfo | None = None
            try:
                if chosen is not None and not chosen(peer):
                    raise Refusal("routing_id", f"routing id {peer[:32]!r} was chosen by the "
                                  "peer (a fedsim host lets the server assign its own)")
                envelope = peek(frames, max_bytes=self.max_bytes)
                host = self._admit(peer, envelope)
                limit = self.gate.header_limit(envelope.kind, self.endpoint.user(peer))
                msg, meta = decode(frames, max_bytes=self.max_bytes, max_header=limit,
                                   spec=self.update_spec)
                if isinstance(msg, Update | Ready | Failed | Leave):
                    self.phases.add("decode.server", perf_counter() - t0)
                await self._route(peer, msg, meta, host)
            except (WireError, Refusal) as exc:
                self._reject(peer, exc.reason, exc.detail)
            except Exception as exc:
                log.exception("a message from %r broke its handler", peer)
                self._reject(peer, "internal_error", f"{type(exc).__name__}: {exc}")
            took = perf_counter() - t0
            if host is not None:
                self.gate.charge(host.name, self.real_clock(), took)
            worked += took
            if worked > 1e-3:
                worked = 0.0
                await asyncio.sleep(0)

    def _source(self, peer: bytes) -> str:
        """Who ``peer`` is, for the log and the per-source caps: its host, its key, or
        where it connected from."""
        host = self.hosts.by_peer(peer)
        if host is not None:
            return host.name
        user = self.endpoint.user(peer)
        if user is not None:
            return f"key {user}"
        address = getattr(self.endpoint, "peer_address", None)
        where = address(peer) if address is not None else None
        if where:  # every connection from one address is one source
            return str(where)
        text = peer.decode("ascii", errors="replace")
        return text if text.isprintable() and text else peer.hex()

    def _reject(self, peer: bytes, reason: str, detail: str) -> None:
        self.rejections.add(self._source(peer), reason, detail)

    def _disconnected(self, source: str = "?") -> None:
        """libzmq dropped an established connection: how it refuses an oversize frame, or a
        peer left."""
        if self.started and not self._stopping:
            self.rejections.add(source, "connection_dropped",
                                "a connection was dropped (a frame over deploy.max_message_mb "
                                f"= {self.max_bytes / 1e6:g} MB, or a peer that went away)",
                                what="a connection")

    def _now(self) -> float:
        return self.clock.now() if self.clock is not None else 0.0

    def _admit(self, peer: bytes, meta: Meta) -> HostInfo | None:
        """Checks before a message is unpacked: its sender, from its envelope and size.

        A connection that has not registered may send ``deploy.max_unregistered_rate``
        messages a second (per key with CURVE; per connection without). A
        registered host's connection must be the one it registered with its
        key; its sequence numbers must be new, its rate within
        ``deploy.max_host_rate`` and, for its control messages, its share of
        the server's time (every message it sent counts) within
        ``deploy.max_host_cpu``; its goodbye comes once, after the stop; a
        message without a model is at most ``deploy.max_control_mb``.
        Returns the live host (None: not registered).
        """
        now = self.real_clock()
        host = self.hosts.by_peer(peer)
        if host is None or not host.alive:
            user = self.endpoint.user(peer)
            source = f"key {user}" if user is not None else repr(peer)
            if not self.gate.unregistered(source, now):
                raise Refusal("rate_limited", f"over {self.sc.deploy.max_unregistered_rate:g} "
                              "messages/s from a connection that has not registered")
            return None
        if self.endpoint.user(peer) != host.user:
            raise Refusal("unauthenticated",
                          f"this connection is not the one {host.name} registered with its key")
        if not host.seen.add(meta.seq):
            raise Refusal("replay", f"sequence number {meta.seq} was already received")
        host.last_seen = now
        if host.rate is None:
            rate = self.sc.deploy.max_host_rate
            host.rate = RateLimit(rate, 5 * rate, now)
        if not host.rate.take(now):
            raise Refusal("rate_limited",
                          f"{host.name} sent over {self.sc.deploy.max_host_rate:g} messages/s")
        if meta.kind not in _CLIENT_KINDS and not self.gate.host_ready(host.name, now):
            # its control messages wait; its clients' (rate-limited per client) go on
            raise Refusal("rate_limited", f"{host.name}'s messages took over "
                          f"{self.sc.deploy.max_host_cpu * 100:g} % of the server's time")
        if meta.kind == "HostBye" and (not self._stopping or host.bye is not None):
            raise Refusal("out_of_order", "a goodbye before the server said stop"
                          if not self._stopping else f"a second goodbye from {host.name}")
        if (meta.kind in ("EventBatch", "HostBye")
                and meta.nbytes > self.sc.deploy.max_control_mb * 1e6):
            raise Refusal("oversize", f"a {meta.kind} of {meta.nbytes} bytes (control messages: "
                          f"deploy.max_control_mb = {self.sc.deploy.max_control_mb:g})")
        return host

    async def _route(self, peer: bytes, msg: Message, meta: Meta, host: HostInfo | None) -> None:
        if isinstance(msg, HostHello):
            await self._hello(peer, msg, meta)
            return
        if isinstance(msg, ClockProbe):  # also a heartbeat; answered before registration too
            reply = ClockReply(seq=msg.seq, t_sent=msg.t_sent, t_server=self.real_clock(),
                               server=self.incarnation)
            await self._to_host(peer, encode(reply))
            return
        if host is None:
            raise Refusal("unknown_client",
                          f"a {type(msg).__name__} from a connection no host registered")
        if isinstance(msg, Update | Ready | Failed | Leave):
            if msg.client not in host.samples or msg.client not in self.client_links.admitted:
                raise Refusal("unknown_client", f"client {msg.client} does not run on {host.name}")
            limit = self._client_rates.get(msg.client)
            if limit is None:
                rate = self.sc.deploy.max_client_rate
                limit = self._client_rates[msg.client] = RateLimit(rate, 5 * rate,
                                                                   self.real_clock())
            if not limit.take(self.real_clock()):
                raise Refusal("rate_limited", f"client {msg.client} sent over "
                              f"{self.sc.deploy.max_client_rate:g} messages/s")
            self.records.received(msg.client)
            self._uplink(host, msg.client, msg, meta)
            return
        if isinstance(msg, EventBatch):
            if msg.host != host.name or self.state is None:
                raise Refusal("unknown_client", f"events from {msg.host!r} on {host.name}'s "
                              "connection" if msg.host != host.name else "events before the start")
            now = self._now()
            bad = self.state.write_events(
                msg.events, host.name, host.samples.keys(),
                budget=lambda client: self.records.take(host.name, client, now + 1.0))
            for why in bad:
                self._reject(peer, "bad_event", why)
            self.state.host_phases(msg.phases)
        elif isinstance(msg, HostBye):
            if msg.host != host.name or self.hosts.goodbye(peer, msg) is None:
                raise Refusal("out_of_order", f"a goodbye from {msg.host!r}, not expected")
            self._bye.set()
        else:
            raise Refusal("unexpected_kind", f"a {type(msg).__name__} is not for the server")

    async def _hello(self, peer: bytes, msg: HostHello, meta: Meta) -> None:
        user = self.endpoint.user(peer)
        moved = self.hosts.reconnect(peer, msg, user)
        if moved is not None:  # its connection dropped and came back: the same host
            # (what was under way when it dropped may never have reached it)
            self.client_links.unknown(moved.clients)
            moved.seen.add(meta.seq)
            moved.last_seen = self.real_clock()
            log.warning("client host %s connected again (a new connection); it goes on",
                        msg.host)
            return
        repeat = self.hosts.repeat(peer, msg, user)
        if repeat is not None:
            # the same process registering again over its connection: it started its
            # session over (it heard a restarted server's incarnation after its
            # connection had already come back and registered): its clients rejoin,
            # with links made afresh, which the server's copies no longer follow
            repeat.seen.add(meta.seq)
            repeat.last_seen = self.real_clock()
            self.client_links.unknown(msg.clients)
            log.info("client host %s registered again: clients %s", msg.host,
                     format_ids(msg.clients))
            if self.started:
                self.queue.put_nowait(HostJoined(msg.host))
            return
        old = self.hosts.hosts.get(msg.host)
        if (old is not None and old.alive and self.started and old.user == user
                and self.hosts.is_restart(old, msg)
                and (old.peer == peer or not await self._connected(old.peer))):
            # its process was restarted before its silence gave it away (a new
            # connection, and the old one is gone: a live one is not displaced)
            restarted = "restarted (a new process registered under its name)"
            lost = self.hosts.lose(msg.host, restarted, self._now())
            self.queue.put_nowait(HostExited(msg.host, restarted, tuple(lost)))
        why = self.hosts.hello(peer, msg, user)
        if why is None and self.stop_reason is not None:
            why = "the federation is ending"
        if why is not None:
            self._reject(peer, "refused", f"client host {msg.host!r}: {why}")
            await self._to_host(peer, encode(Refused(reason=why)))
            return
        info = self.hosts.hosts[msg.host]
        # a new process's clients make their downlinks afresh, and so does the copy; a
        # process registering again (it was taken for lost) keeps its links as they are
        again = old is not None and old.pid == msg.pid and old.boot_id == msg.boot_id
        if again:
            self.client_links.unknown(msg.clients)
        else:
            self.client_links.afresh(msg.clients)
        info.seen.add(meta.seq)
        info.last_seen = self.real_clock()
        log.info("client host %s registered: clients %s, clock offset %.6f s +- %.3f ms",
                 msg.host, format_ids(msg.clients), msg.clock_offset,
                 msg.clock_uncertainty * 1e3)
        if self.started:  # a lost host restarted: it takes its clients back
            self.queue.put_nowait(HostJoined(msg.host))
        elif len(self.hosts.registered()) == self.sc.data.num_clients:
            self._registered.set()

    def _earliest(self, cid: int, task: TaskRecord, msg: Update) -> float:
        """The earliest emulated time ``cid`` can have sent ``msg``, answering ``task``:
        the task's earliest delivery plus the least compute of the work before
        the upload on the client's device (:mod:`._server_tasks`)."""
        steps = self.strategy.least_steps(task.steps, msg.round)
        return task.delivered + self.plan.least_compute(cid, steps)

    def _uplink(self, host: HostInfo, cid: int, msg: ClientMessage, meta: Meta) -> None:
        assert self.timers is not None
        assert self.state is not None
        # the envelope's claim first (any client message), then an update's task
        sent, clamped = self.send_times.bounded(host.name, host.clock_uncertainty,
                                                meta.sent_at, self._now())
        if clamped:
            self.state.event(self._now(), "warning", client=cid, kind=meta.kind.lower(),
                             sent_at=meta.sent_at, reason="send time out of bounds: clamped")
        task = None
        if isinstance(msg, Update):
            task = self.tasks.find(cid, msg.task_id)
            if task is None:
                raise Refusal("unknown_task", f"an update of task {msg.task_id}, which the "
                              f"server did not send to client {cid} (or long ago)")
            earliest = self._earliest(cid, task, msg)
            if sent < earliest - TOLERANCE:
                if not clamped:  # (a message is counted once)
                    self.send_times.corrected(host.name, "before_record")
                self.state.event(self._now(), "warning", client=cid, kind=meta.kind.lower(),
                                 sent_at=meta.sent_at, task_id=task.task_id,
                                 reason="send time before the task's earliest delivery and "
                                 f"compute: raised to {earliest:.6f}")
                sent, clamped = earliest, True
        d = self.client_links.uplink(cid).schedule(sent, meta.nbytes)
        if d.dropped:
            self.state.event(self._now(), "drop", client=cid, kind=meta.kind.lower(), dir="up",
                             bytes=meta.nbytes, sent_at=sent, reason=d.reason)
            return
        received = self._now()
        if not clamped and received - d.t_deliver > self.monitor.allowed_lateness():
            host.late_arrivals += 1
            clamped = True
        self.timers.call_at(d.t_deliver, self._delivered, cid, msg, meta, d, sent, clamped, task)

    def _delivered(self, cid: int, msg: ClientMessage, meta: Meta, d: Delivery, sent: float,
                   unjudged: bool, task: TaskRecord | None) -> None:
        assert self.state is not None
        now = self._now()
        if not unjudged:
            self.monitor.record_delivery(self.plan.kind(cid, "up"), d, now)
        lost = self.client_links.away_between(cid, sent, now, self.sc.network.in_flight)
        self.state.event(now, "drop" if lost else "deliver", client=cid, kind=meta.kind.lower(),
                         dir="up", bytes=meta.nbytes, sent_at=sent,
                         scheduled=d.t_deliver, version=None if task is None else task.version,
                         task_id=None if task is None else task.task_id, reason=lost)
        if lost:
            return
        if isinstance(msg, Update):
            self.state.bytes_up += meta.nbytes
        self.queue.put_nowait(FromClient(cid, msg, perf_counter(), task))

    # -- sending -------------------------------------------------------------------------
    def _encode(self, msg: Task | Average) -> Body:
        """``encode_body(msg)``, timed: the server's encode phase (real seconds)."""
        t0 = perf_counter()
        body = encode_body(msg)
        self.phases.add("encode.server", perf_counter() - t0)
        return body

    async def _connected(self, peer: bytes) -> bool:
        """Whether ``peer``'s connection is still there (a ClockReply no host can take
        for its own goes to it: the send fails when it is gone)."""
        try:
            await self.endpoint.send(peer, encode(ClockReply(seq=0, t_sent=-1e9,
                                                             t_server=self.real_clock())))
        except PeerGone:
            return False
        return True

    async def _to_host(self, peer: bytes, frames: list[Any]) -> None:
        try:
            await self.endpoint.send(peer, frames)
        except PeerGone:
            log.warning("host %r is gone", peer)

    def _start_message(self, t0: float) -> list[Any]:
        """The Start of a host whose clients begin at emulated ``t0``."""
        assert self.clock is not None
        return encode(Start(epoch=self.clock.epoch, dilation=self.dilation,
                            spec=self.model_spec, task_copies=self.alg.task_copies,
                            host_step_time=self.sc.devices.host_step_time,
                            server=self.incarnation, t0=t0))

    def _send_later(self, cid: int, msg: Body | Task | Average, fields: dict[str, Any],
                    steps: int | None = None) -> None:
        task = asyncio.ensure_future(self._send(self._now(), cid, msg, steps=steps, **fields))
        self._sends.add(task)
        task.add_done_callback(self._sends.discard)

    async def _send(self, now: float, cid: int, msg: Body | Task | Average, *,
                    steps: int | None = None, **fields: Any) -> None:
        """Stamp and send one message to a client through its host; log it.

        ``msg`` is an encoded message, or a task or an average: encoded
        here, with its model when the client's host does not hold it yet
        (:mod:`fedsim.wire.payloads`: a task's by version, an average's by
        round), without it when it does; either way its size, for the links
        and the counts, is the message's with its model.
        A task (``steps``: its local work's steps) is noted in the record
        with its emulated delivery at the client, from the server's copy of
        the client's downlink (:meth:`_down_delivery`); where that is not
        known, ``now`` (its stamped send time) plus the least its downlink
        can take for its size.
        """
        assert self.state is not None
        peer = self.hosts.owner(cid)
        owner = self.hosts.owner_info(cid)
        if isinstance(msg, Task | Average):
            assert msg.model is not None
            inline = owner is not None and (
                owner.sent.needs(msg.version) if isinstance(msg, Task)
                else owner.sent_rounds.needs(msg.round))
            body = self._encode(msg if inline else msg.with_model(None))
            nbytes = body.nbytes if inline else body.nbytes + model_cost(msg.model)
        else:
            body, nbytes = msg, msg.nbytes
        frames = stamp(body, sent_at=now, seq=next(self.seq))
        # scheduled on the copy of the downlink now, in the order of the sends: the
        # host's link schedules the messages to a client in the order they arrive
        delivered = self.client_links.down_delivery(cid, now, nbytes)
        try:
            if peer is None:
                raise PeerGone(f"no host runs client {cid}")
            await self.endpoint.send(peer, frames)
        except PeerGone as exc:
            self.client_links.unknown([cid])
            self.state.event(now, "warning", client=cid, reason=f"send failed: {exc}")
            if cid in self.clients:
                self.queue.put_nowait(FromClient(cid, Leave(client=cid, reason="unreachable")))
            return
        if steps is not None:
            if delivered is None:
                delivered = now + self.plan.least_transfer(cid, "down", nbytes, now)
            self.tasks.sent(cid, TaskRecord(
                task_id=fields["task_id"], version=fields["version"], round=fields["round"],
                delivered=delivered, steps=steps))
        self.state.bytes_down += nbytes
        self.state.wire_bytes_down += body.nbytes
        if owner is not None:
            self.records.sent(cid, owner.name)
        self.state.event(now, "send", client=cid, dir="down", bytes=nbytes, sent_at=now,
                         **fields)

    # -- liveness and the end ------------------------------------------------------------
    async def _ticker(self) -> None:
        while True:
            await asyncio.sleep(0.5)
            self.queue.put_nowait(Tick())
            timeout = self.sc.deploy.host_timeout
            for name in self.hosts.silent(self.real_clock(), timeout):
                self.hosts.hosts[name].last_seen = float("inf")  # reported once
                self.queue.put_nowait(HostExited(name, f"silent for over {timeout:g} s"))

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
