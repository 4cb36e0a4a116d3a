"""One direction of one client's connection, at message level.

tc netem's parameter set (delay, jitter, correlation, distribution, rate with
packet overhead, limit, loss) applied to whole messages: a TCP stream never
reorders, the rate runs on a virtual clock, and loss on TCP is delay.
docs/netem.md#one-message-through-a-link explains it for users.

``Link.schedule(t_send, nbytes)`` is pure arithmetic on emulated seconds and
returns a :class:`Delivery`; an emulator turns it into a timer. Stages, in
order (cf. SimPy's ``Cable`` and FLSim's channel stages):

1. **Shared bottleneck** (optional :class:`Bottleneck`, e.g. a home router
   shared by several clients): rate + queue on its own virtual clock.
2. **Own link**: ``start = max(ready, link_free)``; serialisation
   ``wire_bytes * 8 / rate`` (or a Mahimahi trace's drain,
   :mod:`netem.trace`); ``link_free`` advances, so serialisation and
   queueing delay emerge from sizes and load. With a bottleneck the two
   stages overlap (cut-through): the message is out when both are done.
   ``wire_bytes = nbytes + ceil(nbytes / mss) * overhead``.
3. **Loss**, by ``loss_mode``:

   * ``"tcp"`` (default; ZeroMQ runs over TCP): every packet goes through
     the loss process and :class:`~netem.tcp.TcpConnection` turns losses,
     slow start after idle and the window into ``slow_start`` + ``recovery``
     delay; the stream stays busy meanwhile. Never dropped unless a
     segment is lost ``max_retries`` times in a row (``"tcp-timeout"``). The
     queue limit does not drop here: TCP's window keeps at most
     BDP + queue_limit in flight and the rest waits in the sender's buffer,
     so the limit caps cwnd (no self-inflicted loss is modelled).
   * ``"drop"`` (datagram-like): the message is lost if *any* of its packets
     is lost (``"loss"``), and tail-dropped (``"queue"``) if the bytes queued
     at ``t_send`` plus its own would exceed ``queue_limit`` -- so a message
     larger than the queue is always dropped in this mode. A lost message
     still occupied the link.
   * ``"message"``: one loss draw per message (the loss model applies to
     messages, not packets), otherwise as ``"drop"``.

4. **Propagation**: one draw of the (correlated) delay process per message.
5. **route hook** (trio ``FakeNet.route_packet``): ``route(delivery)`` may
   return it unchanged, ``delivery.dropped_by(reason)`` or
   ``delivery.delayed_by(seconds)``, to script the fate of given messages.
6. **FIFO**: ``t_deliver = max(previous t_deliver, computed)``; the wait is
   reported as ``hol``. A TCP stream never reorders, whatever the jitter.

The parameters themselves (:class:`~netem.linkparams.LinkParams`, validated
on construction, and ``LOSS_MODES``) live in :mod:`netem.linkparams`; import
them from there.

Invariant for a delivered message: ``t_deliver - t_send = queueing +
serialization + slow_start + recovery + propagation + scripted + hol``.
A dropped one has ``t_deliver = inf`` and does not move the FIFO clock.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, cast

import numpy as np

from netem import _check
from netem.delayprocess import DelayProcess
from netem.linkparams import LinkParams
from netem.lossprocess import LossProcess, LossStats
from netem.rng import Key, stream
from netem.tcp import TcpConnection
from netem.trace import Schedule, TraceServer

__all__ = ["Bottleneck", "Delivery", "Link", "Route"]

# The loss chain's clock is the packet slot: one segment's serialisation
# time; on an unlimited link, a 1,500-byte packet at 1 Gbit/s.
_NOMINAL_SLOT = 1500 * 8 / 1e9


class Bottleneck:
    """A rate + byte queue shared by several links, on its own virtual clock.

    Parameters
    ----------
    rate
        Bits/s.
    queue_limit
        Bytes; ``None`` = unbounded. Only drop-mode links are tail-dropped.
    """

    __slots__ = ("free_at", "name", "queue_limit", "rate")

    def __init__(
        self, rate: float, queue_limit: int | None = None, name: str = ""
    ) -> None:
        _check.positive("Bottleneck", "rate", rate, " bits/s")
        if queue_limit is not None:
            _check.integer("Bottleneck", "queue_limit", queue_limit, 1)
        self.rate = float(rate)
        self.queue_limit = queue_limit
        self.name = name
        self.free_at = -math.inf

    def backlog(self, t: float) -> float:
        """Bytes still queued at ``t``."""
        return max(self.free_at - t, 0.0) * self.rate / 8.0

    def fits(self, t: float, wire_bytes: int) -> bool:
        """Whether ``wire_bytes`` more fit in the queue at ``t``."""
        return (
            self.queue_limit is None or self.backlog(t) + wire_bytes <= self.queue_limit
        )

    def reserve(self, t: float, wire_bytes: int) -> tuple[float, float]:
        """Occupy the bottleneck; return ``(start, end)`` of service."""
        start = max(t, self.free_at)
        end = start + wire_bytes * 8.0 / self.rate
        self.free_at = end
        return start, end


@dataclass(frozen=True, slots=True)
class Delivery:
    """Fate of one message. ``t_deliver`` is ``inf`` when ``dropped``."""

    index: int
    t_send: float
    t_deliver: float
    nbytes: int
    wire_bytes: int
    packets: int
    dropped: bool = False
    reason: str = ""
    queueing: float = 0.0
    serialization: float = 0.0
    slow_start: float = 0.0
    recovery: float = 0.0
    propagation: float = 0.0
    scripted: float = 0.0
    hol: float = 0.0
    n_lost: int = 0
    tag: object = None

    @property
    def delay(self) -> float:
        """``t_deliver - t_send``."""
        return self.t_deliver - self.t_send

    def dropped_by(self, reason: str) -> Delivery:
        """This message, dropped with ``reason`` (for route hooks)."""
        return replace(self, dropped=True, reason=reason, t_deliver=math.inf)

    def delayed_by(self, seconds: float) -> Delivery:
        """This message, ``seconds`` later (for route hooks)."""
        _check.nonneg("Delivery.delayed_by", "seconds", seconds, " s")
        return replace(
            self, t_deliver=self.t_deliver + seconds, scripted=self.scripted + seconds
        )


Route = Callable[[Delivery], Delivery]


class _Unfrozen:
    """Delivery's slots without the frozen ``__setattr__``: :func:`_delivery`
    fills one with plain attribute stores, then makes it a :class:`Delivery`
    (same layout, so ``__class__`` can be assigned). The frozen dataclass's
    ``__init__`` calls ``object.__setattr__`` once per field: 1.4 us a
    message, against 0.3 us this way."""

    __slots__ = Delivery.__slots__


def _delivery(
    index: int,
    t_send: float,
    t_deliver: float,
    nbytes: int,
    wire_bytes: int,
    packets: int,
    dropped: bool,
    reason: str,
    queueing: float,
    serialization: float,
    slow_start: float,
    recovery: float,
    propagation: float,
    hol: float,
    n_lost: int,
    tag: object,
) -> Delivery:
    """``Delivery(...)`` with every field given (``scripted`` is 0), built fast."""
    d: Any = object.__new__(_Unfrozen)
    d.index = index
    d.t_send = t_send
    d.t_deliver = t_deliver
    d.nbytes = nbytes
    d.wire_bytes = wire_bytes
    d.packets = packets
    d.dropped = dropped
    d.reason = reason
    d.queueing = queueing
    d.serialization = serialization
    d.slow_start = slow_start
    d.recovery = recovery
    d.propagation = propagation
    d.scripted = 0.0
    d.hol = hol
    d.n_lost = n_lost
    d.tag = tag
    d.__class__ = Delivery
    return cast(Delivery, d)


class Link:
    """Stateful model of one link direction; see the module docstring.

    Parameters
    ----------
    params
        Parameters at time 0.
    seed, key
        Streams are ``stream(seed, *key, "delay" | "loss-state" | "loss-draw")``,
        e.g. ``key=("link", client_id, "down")``: the same seed gives the same
        delays and losses on this link whatever other links do.
    changes
        Time-varying parameters (:class:`~netem.trace.Schedule`).
    bottleneck
        Shared stage passed before this link's own.
    route
        Hook applied to every :class:`Delivery` before the FIFO clamp.
    """

    __slots__ = (
        "_delay",
        "_free",
        "_index",
        "_last",
        "_loss",
        "_loss_clock",
        "_mean",
        "_params",
        "_seed",
        "_server",
        "_static",
        "_tcp",
        "_timeline",
        "_times",
        "bottleneck",
        "key",
        "route",
    )

    def __init__(
        self,
        params: LinkParams,
        *,
        seed: int = 0,
        key: tuple[Key, ...] = ("link",),
        changes: Schedule | None = None,
        bottleneck: Bottleneck | None = None,
        route: Route | None = None,
    ) -> None:
        self._seed, self.key = seed, tuple(key)
        self._timeline = (changes or Schedule(())).timeline(params)
        self._times = [t for t, _ in self._timeline]
        self._static = len(self._timeline) == 1  # no changes: params_at is params
        self._params = params
        dist = params.delay_dist()
        self._delay = DelayProcess(
            dist, params.delay_correlation, stream(seed, *key, "delay")
        )
        self._mean = dist.moments()[0]
        self._loss: LossProcess | None = None
        self._server = TraceServer(params.trace) if params.trace is not None else None
        self._tcp = TcpConnection(params.tcp)
        self._free = -math.inf
        self._loss_clock = math.inf  # no silence before the first message
        self._last = -math.inf
        self._index = 0
        self.bottleneck = bottleneck
        self.route = route
        self._apply(params)

    # -- parameters ----------------------------------------------------------
    def params_at(self, t: float) -> LinkParams:
        """Parameters in force at emulated time ``t``."""
        return self._timeline[max(bisect.bisect_right(self._times, t) - 1, 0)][1]

    def _apply(self, p: LinkParams) -> None:
        old, self._params = self._params, p
        if (p.distribution, p.delay, p.jitter, p.table, p.delay_correlation) != (
            old.distribution,
            old.delay,
            old.jitter,
            old.table,
            old.delay_correlation,
        ):
            dist = p.delay_dist()
            self._delay.set_dist(dist, p.delay_correlation)
            self._mean = dist.moments()[0]
        if p.loss is not None:
            if self._loss is None:
                s, k = self._seed, self.key
                self._loss = LossProcess(
                    p.loss, stream(s, *k, "loss-state"), stream(s, *k, "loss-draw")
                )
            elif self._loss.model != p.loss:
                self._loss.set_model(p.loss)
        if p.trace is not (self._server.trace if self._server else None):
            self._server = TraceServer(p.trace) if p.trace is not None else None
        self._tcp.params = p.tcp

    @property
    def params(self) -> LinkParams:
        """Parameters used for the last message (initially those at time 0)."""
        return self._params

    @property
    def loss_stats(self) -> LossStats:
        """Packets drawn through the loss process so far (retransmissions included)."""
        return self._loss.stats if self._loss is not None else LossStats()

    @property
    def connection(self) -> TcpConnection:
        """This direction's TCP sender state (srtt, rttvar, cwnd, ...)."""
        return self._tcp

    @property
    def busy_until(self) -> float:
        """When the link's own stage is free again."""
        return self._free

    @property
    def last_delivery(self) -> float:
        """FIFO clock: delivery time of the last delivered message."""
        return self._last

    # -- the model -----------------------------------------------------------
    def _backlog(self, t: float, p: LinkParams) -> float:
        if self._free <= t:
            return 0.0
        if self._server is not None:
            return float(self._server.backlog(t, self._free))
        return 0.0 if p.rate is None else (self._free - t) * p.rate / 8.0

    def schedule(self, t_send: float, nbytes: int, tag: object = None) -> Delivery:
        """Schedule one message of ``nbytes`` payload sent at ``t_send``."""
        # The hot path of an emulator (one call per message): the checks and
        # the parameter lookup are skipped when they cannot matter, and the
        # Delivery is built once. Same operations on the same numbers as the
        # stages in the module docstring (tests/netem/test_link_pinned.py).
        if type(t_send) is not float or not -math.inf < t_send < math.inf:
            _check.finite("Link.schedule", "t_send", t_send)
        if type(nbytes) is not int or nbytes < 0:
            _check.integer("Link.schedule", "nbytes", nbytes, 0)
            nbytes = int(nbytes)
        p = self._params if self._static else self.params_at(t_send)
        if p is not self._params:
            self._apply(p)
        index = self._index
        self._index = index + 1
        npk = -(-nbytes // p.mss) or 1  # segments(): at least 1
        wire = nbytes + npk * p.overhead
        prop = self._delay.next()  # one draw per message, dropped or not
        mode = p.loss_mode
        b = self.bottleneck
        if mode != "tcp":  # datagram: tail drops
            reason = ""
            if b is not None and not b.fits(t_send, wire):
                reason = "bottleneck-queue"
            elif p.queue_limit is not None and self._backlog(t_send, p) + wire > p.queue_limit:
                reason = "queue"
            if reason:
                d = _delivery(index, t_send, math.inf, nbytes, wire, npk, True, reason,
                              0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0, tag)
                return d if self.route is None else self._finish(d)

        ready, b_end = t_send, -math.inf
        if b is not None:
            ready, b_end = b.reserve(t_send, wire)
        start = max(ready, self._free)
        if self._server is not None:
            end = self._server.serve(start, wire)
        else:
            end = start if p.rate is None else start + wire * 8.0 / p.rate
        end = max(end, b_end)
        ser = end - start

        slow = rec = 0.0
        n_lost, reason = 0, ""
        loss = self._loss if p.loss is not None else None
        if loss is not None:
            # the loss chain runs through the silence since this direction last sent
            slot = ser / npk if ser > 0 else _NOMINAL_SLOT
            loss.idle((start - self._loss_clock) / slot)
        if mode == "tcp":
            rtt = prop + (
                p.reverse_delay if p.reverse_delay is not None else self._mean
            )
            tau = ser / npk
            cap = None
            if tau > 0:
                qseg = (
                    math.inf
                    if p.queue_limit is None
                    else p.queue_limit / (p.mss + p.overhead)
                )
                cap = rtt / tau + qseg
                cap = None if math.isinf(cap) else cap
            tr = self._tcp.transfer(start, npk, tau, rtt, loss, cap)
            slow, rec, n_lost = tr.slow_start, tr.recovery, tr.n_lost
            reason = "tcp-timeout" if tr.failed else ""
        elif loss is not None:
            n_lost = int(np.count_nonzero(loss.draw(npk if mode == "drop" else 1)))
            reason = "loss" if n_lost else ""
        self._free = self._loss_clock = end + slow + rec
        t_deliver = self._free + prop
        queueing = start - t_send
        if reason:  # lost: the link was occupied all the same
            d = _delivery(index, t_send, math.inf, nbytes, wire, npk, True, reason,
                          queueing, ser, slow, rec, prop, 0.0, n_lost, tag)
            return d if self.route is None else self._finish(d)
        if self.route is not None:
            return self._finish(_delivery(index, t_send, t_deliver, nbytes, wire, npk, False, "",
                                          queueing, ser, slow, rec, prop, 0.0, n_lost, tag))
        # FIFO: a stream never reorders (_finish without a route)
        hol, last = 0.0, self._last
        if t_deliver < last:
            hol, t_deliver = last - t_deliver, last  # 0.0 + last - t_deliver, as _finish
        self._last = t_deliver
        return _delivery(index, t_send, t_deliver, nbytes, wire, npk, False, "",
                         queueing, ser, slow, rec, prop, hol, n_lost, tag)

    def _finish(self, d: Delivery) -> Delivery:
        if self.route is not None:
            d = self.route(d)
        if d.dropped:
            return d
        if d.t_deliver < self._last:
            d = replace(d, hol=d.hol + self._last - d.t_deliver, t_deliver=self._last)
        self._last = d.t_deliver
        return d
