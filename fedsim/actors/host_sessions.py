"""The server's sessions with its client hosts: registration, the reader and its checks, goodbyes.

:class:`HostSessions` is a part of :class:`~fedsim.actors.server.Server`
that owns what it takes to talk to hosts safely: the gate, the rejections'
log, the per-client rates, the registration and goodbye events. Every
message a host sends is checked before it is unpacked (a routing id the
server assigned, the envelope, its sender's budgets, its
header's size: :mod:`.server_gate`), then decoded, checked (its host,
sequence number, rate and size) and routed: control messages
(registration, clock probes, event batches, goodbyes) are handled at once,
and a client's message goes to its uplink (:mod:`.uplinks`). A message that
breaks a rule is rejected with a stable reason code and the reader goes on.
It also notices the hosts' silence and, at the end, collects their
goodbyes. It sends through :mod:`.downlinks`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from time import perf_counter

from fedsim.actors import uplinks as uplinks_module
from fedsim.actors._refusal import Refusal
from fedsim.actors._server_queue import HostExited, HostJoined, Item
from fedsim.actors._server_view import RunView
from fedsim.actors.client_links import ClientLinks
from fedsim.actors.downlinks import Downlinks
from fedsim.actors.hosts import HostInfo, HostTable, RateLimit
from fedsim.actors.server_gate import Gate, RecordBudget, Rejections
from fedsim.actors.uplinks import Uplinks, ValueCheck
from fedsim.results.phases import PhaseStats
from fedsim.scenario import Scenario
from fedsim.scenario.ids import format_ids
from fedsim.wire.codec import Meta, decode, encode, peek
from fedsim.wire.errors import WireError
from fedsim.wire.messages import (
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
    Stop,
    Update,
)
from fedsim.wire.tensors import TensorSpec
from fedsim.wire.transport import Endpoint

__all__ = ["HostSessions"]

# the server actor's logger: its records keep their name wherever the code lives
log = logging.getLogger("fedsim.actors.server")

#: what a client sends (through its emulated uplink), as envelope kinds
_CLIENT_KINDS = frozenset({"Update", "Ready", "Failed", "Leave"})


class HostSessions:
    """The server's sessions with its client hosts (see the module)."""

    def __init__(self, sc: Scenario, run: RunView, queue: asyncio.Queue[Item], *,
                 endpoint: Endpoint, hosts: HostTable, links: ClientLinks, uplinks: Uplinks,
                 downlinks: Downlinks, records: RecordBudget, phases: PhaseStats,
                 update_spec: TensorSpec,
                 max_bytes: int, allowed: Mapping[str, tuple[int, ...]] | None,
                 real_clock: Callable[[], float], incarnation: str) -> None:
        self.sc = sc
        self.run = run
        self.queue = queue
        self.endpoint = endpoint
        self.hosts = hosts
        self.client_links = links
        self.uplinks = uplinks
        self.downlinks = downlinks
        self.phases = phases
        self.update_spec = update_spec
        self.max_bytes = max_bytes
        self.real_clock = real_clock
        self.incarnation = incarnation
        #: the checks before a message is unpacked, and the rejections' log
        self.gate = Gate(sc, update_spec, allowed)
        self.rejections = Rejections(sc.deploy.max_logged_rejects)
        #: each client's budget of event records (shared with the downlinks, which
        #: count what the server sent it)
        self.records = records
        #: set when every client registered (or the run is asked to stop before)
        self.registered = asyncio.Event()
        #: set by each goodbye and each host that ended
        self.bye = asyncio.Event()
        #: the hosts were told to stop (a goodbye is expected now, and no sooner)
        self.stopping = False
        #: the reader's task, once it runs
        self.reader: asyncio.Task[None] | None = None
        self._client_rates: dict[int, RateLimit] = {}

    # -- from the outside world --------------------------------------------------------
    def refused_connection(self, source: str, reason: str, why: str) -> None:
        """The transport refused a connection (a key not on the allow-list, a failed
        or timed-out handshake): counted, and logged within the per-source cap."""
        self.rejections.add(source, reason, why, what="a connection")

    def host_exited(self, host: str, why: str) -> None:
        """A host process ended (reported by whoever watches it)."""
        self.queue.put_nowait(HostExited(host, why))
        self.bye.set()

    def disconnected(self, source: str = "?") -> None:
        """libzmq dropped an established connection: how it refuses an oversize frame, or a
        peer left."""
        if self.run.started and not self.stopping:
            self.rejections.add(source, "connection_dropped",
                                "a connection was dropped (a frame over deploy.max_message_mb "
                                f"= {self.max_bytes / 1e6:g} MB, or a peer that went away)",
                                what="a connection")

    # -- receiving -----------------------------------------------------------------------
    async def read(self) -> None:
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
                # a large update's values are checked off the loop, while it crosses
                # its uplink (Uplinks.check): it is rejected at its delivery if they fail
                later = (envelope.kind == "Update"
                         and envelope.nbytes >= uplinks_module.CHECK_OFF_LOOP_BYTES)
                msg, meta = decode(frames, max_bytes=self.max_bytes, max_header=limit,
                                   spec=self.update_spec, check_finite=not later)
                values = (self.uplinks.check(msg.model) if later and isinstance(msg, Update)
                          and msg.model is not None else None)
                if isinstance(msg, Update | Ready | Failed | Leave):
                    self.phases.add("decode.server", perf_counter() - t0)
                await self._route(peer, msg, meta, host, values)
            except (WireError, Refusal) as exc:
                self.reject(peer, exc.reason, exc.detail)
            except Exception as exc:
                log.exception("a message from %r broke its handler", peer)
                self.reject(peer, "internal_error", f"{type(exc).__name__}: {exc}")
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

    def reject(self, peer: bytes, reason: str, detail: str) -> None:
        self.rejections.add(self._source(peer), reason, detail)

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
        if meta.kind == "HostBye" and (not self.stopping or host.bye is not None):
            raise Refusal("out_of_order", "a goodbye before the server said stop"
                          if not self.stopping else f"a second goodbye from {host.name}")
        if (meta.kind in ("EventBatch", "HostBye")
                and meta.nbytes > self.sc.deploy.max_control_mb * 1e6):
            raise Refusal("oversize", f"a {meta.kind} of {meta.nbytes} bytes (control messages: "
                          f"deploy.max_control_mb = {self.sc.deploy.max_control_mb:g})")
        return host

    async def _route(self, peer: bytes, msg: Message, meta: Meta, host: HostInfo | None,
                     values: ValueCheck | None = None) -> None:
        if isinstance(msg, HostHello):
            await self._hello(peer, msg, meta)
            return
        if isinstance(msg, ClockProbe):  # also a heartbeat; answered before registration too
            reply = ClockReply(seq=msg.seq, t_sent=msg.t_sent, t_server=self.real_clock(),
                               server=self.incarnation)
            await self.downlinks.to_host(peer, encode(reply))
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
            self.uplinks.receive(host, msg.client, msg, meta, values)
            return
        if isinstance(msg, EventBatch):
            if msg.host != host.name or self.run.state is None:
                raise Refusal("unknown_client", f"events from {msg.host!r} on {host.name}'s "
                              "connection" if msg.host != host.name else "events before the start")
            now = self.run.now()
            bad = self.run.state.write_events(
                msg.events, host.name, host.samples.keys(),
                budget=lambda client: self.records.take(host.name, client, now + 1.0))
            for why in bad:
                self.reject(peer, "bad_event", why)
            self.run.state.host_phases(msg.phases)
        elif isinstance(msg, HostBye):
            if msg.host != host.name or self.hosts.goodbye(peer, msg) is None:
                raise Refusal("out_of_order", f"a goodbye from {msg.host!r}, not expected")
            self.bye.set()
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
            if self.run.started:
                self.queue.put_nowait(HostJoined(msg.host))
            return
        old = self.hosts.hosts.get(msg.host)
        if (old is not None and old.alive and self.run.started and old.user == user
                and self.hosts.is_restart(old, msg)
                and (old.peer == peer or not await self.downlinks.connected(old.peer))):
            # its process was restarted before its silence gave it away (a new
            # connection, and the old one is gone: a live one is not displaced)
            restarted = "restarted (a new process registered under its name)"
            lost = self.hosts.lose(msg.host, restarted, self.run.now())
            self.queue.put_nowait(HostExited(msg.host, restarted, tuple(lost)))
        why = self.hosts.hello(peer, msg, user)
        if why is None and self.run.stop_reason is not None:
            why = "the federation is ending"
        if why is not None:
            self.reject(peer, "refused", f"client host {msg.host!r}: {why}")
            await self.downlinks.to_host(peer, encode(Refused(reason=why)))
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
        if self.run.started:  # a lost host restarted: it takes its clients back
            self.queue.put_nowait(HostJoined(msg.host))
        elif len(self.hosts.registered()) == self.sc.data.num_clients:
            self.registered.set()

    # -- liveness and the end ------------------------------------------------------------
    def check_silence(self) -> None:
        """Every host silent for over ``deploy.host_timeout`` real seconds is lost
        (reported once)."""
        timeout = self.sc.deploy.host_timeout
        for name in self.hosts.silent(self.real_clock(), timeout):
            self.hosts.hosts[name].last_seen = float("inf")  # reported once
            self.queue.put_nowait(HostExited(name, f"silent for over {timeout:g} s"))

    async def stop_hosts(self, reason: str) -> None:
        """Tell live hosts to stop; wait up to 10 real seconds for each one's goodbye."""
        stop = encode(Stop(reason=reason))
        self.stopping = True
        for h in self.hosts.hosts.values():
            if h.alive:
                await self.downlinks.to_host(h.peer, stop)
        deadline = self.real_clock() + 10.0
        # a reader that crashed can read no goodbye: do not wait for one
        while (self.hosts.waiting_for_bye() and self.real_clock() < deadline
               and not (self.reader is not None and self.reader.done())):
            self.bye.clear()
            try:
                await asyncio.wait_for(self.bye.wait(), max(0.0, deadline - self.real_clock()))
            except TimeoutError:
                break
            while not self.queue.empty():
                item = self.queue.get_nowait()
                if isinstance(item, HostExited):
                    self.hosts.lose(item.host, item.why, self.run.now())
        for name in self.hosts.waiting_for_bye():
            log.warning("client host %s sent no goodbye; its measurements are missing", name)
