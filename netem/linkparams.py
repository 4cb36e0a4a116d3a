"""Parameters of one link direction: :class:`LinkParams` and its validation.

tc netem's parameter set (delay, jitter, correlation, distribution, rate with
packet overhead, limit, loss); the scenario keys are in docs/netem.md.

A :class:`LinkParams` is an immutable, validated value: everything a
:class:`~netem.link.Link` needs to know about one direction at one moment,
plus the size arithmetic that depends only on it (packets, wire bytes,
serialisation time). Time-varying links swap whole values
(:class:`~netem.trace.Schedule`); the stages that use them, and what each
``loss_mode`` does, are described in :mod:`netem.link`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from netem import _check
from netem.dist import DISTRIBUTIONS, Dist, make_dist
from netem.empirical import Empirical
from netem.loss import LossModel
from netem.tcp import TcpParams, segments
from netem.trace import DeliveryTrace

__all__ = ["LOSS_MODES", "LinkParams"]

LOSS_MODES = ("tcp", "drop", "message")


@dataclass(frozen=True, slots=True)
class LinkParams:
    """Parameters of one link direction (all times in seconds).

    Parameters
    ----------
    delay
        Centre of the one-way propagation delay (netem ``delay TIME``).
    jitter
        Scale of the delay variation (netem ``JITTER``); see :mod:`netem.dist`
        for what it means per distribution.
    distribution
        One of ``constant, uniform, normal, pareto, paretonormal, lognormal,
        empirical``. Default ``uniform``: what netem does when no table is
        loaded.
    table
        The :class:`~netem.empirical.Empirical` table for ``"empirical"``; it is
        rescaled to ``delay`` / ``jitter`` (netem ``maketable`` semantics).
    delay_correlation
        Lag-1 correlation of the Gaussian copula, ``[0, 1)``.
    rate
        Bottleneck rate in bits/s; ``None`` = unlimited.
    trace
        Mahimahi delivery trace instead of ``rate`` (exclusive with it).
    mss
        Payload bytes per packet (1448: 1500 MTU - 52 B IPv4/TCP/timestamps).
    overhead
        Bytes per packet counted against the rate beyond the payload
        (90 = 52 header + 38 Ethernet framing: 1448/1538 = 94.1 %).
    queue_limit
        Bottleneck buffer in bytes; ``None`` = unbounded (Mahimahi default).
    loss
        Per-packet loss model, or ``None``.
    loss_mode
        ``"tcp"``, ``"drop"`` or ``"message"`` (see :mod:`netem.link`).
    reverse_delay
        One-way delay of the ACK path, for the RTT seen by TCP; ``None``:
        the mean of this direction's delay (RTT = 2 x one-way mean + the
        message's own jitter).
    tcp
        TCP constants.
    """

    delay: float = 0.0
    jitter: float = 0.0
    distribution: str = "uniform"
    table: Empirical | None = None
    delay_correlation: float = 0.0
    rate: float | None = None
    trace: DeliveryTrace | None = None
    mss: int = 1448
    overhead: int = 90
    queue_limit: int | None = None
    loss: LossModel | None = None
    loss_mode: str = "tcp"
    reverse_delay: float | None = None
    tcp: TcpParams = field(default_factory=TcpParams)

    def __post_init__(self) -> None:
        o = "LinkParams"
        _check.nonneg(o, "delay", self.delay, " s")
        _check.nonneg(o, "jitter", self.jitter, " s")
        _check.choice(
            o, "distribution", self.distribution, (*DISTRIBUTIONS, "empirical")
        )
        if self.distribution == "empirical" and not isinstance(self.table, Empirical):
            _check.fail(o, "table", self.table, "an Empirical table is required")
        _check.finite(o, "delay_correlation", self.delay_correlation)
        if not 0.0 <= self.delay_correlation < 1.0:
            _check.fail(
                o, "delay_correlation", self.delay_correlation, "must be in [0, 1)"
            )
        if self.rate is not None:
            _check.positive(o, "rate", self.rate, " bits/s or None")
        if self.trace is not None and self.rate is not None:
            _check.fail(o, "trace", self.trace.name or "<trace>", "exclusive with rate")
        _check.integer(o, "mss", self.mss, 1, 65535)
        _check.integer(o, "overhead", self.overhead, 0, 65535)
        if self.queue_limit is not None:
            _check.integer(o, "queue_limit", self.queue_limit, 1)
        _check.choice(o, "loss_mode", self.loss_mode, LOSS_MODES)
        if self.reverse_delay is not None:
            _check.nonneg(o, "reverse_delay", self.reverse_delay, " s or None")
        if self.tcp.mss != self.mss:
            object.__setattr__(self, "tcp", replace(self.tcp, mss=self.mss))

    def delay_dist(self) -> Dist:
        """The marginal distribution of the propagation delay."""
        return make_dist(self.distribution, self.delay, self.jitter, self.table)

    def packets(self, nbytes: int) -> int:
        """Packets for a message of ``nbytes`` (at least 1)."""
        return segments(nbytes, self.mss)

    def wire_bytes(self, nbytes: int) -> int:
        """``nbytes + packets * overhead``."""
        return int(nbytes) + self.packets(nbytes) * self.overhead

    def serialization(self, nbytes: int) -> float:
        """Seconds to serialise ``nbytes`` at ``rate`` (0 if unlimited)."""
        return 0.0 if self.rate is None else self.wire_bytes(nbytes) * 8.0 / self.rate

    def least_propagation(self) -> float:
        """The least propagation delay a message can draw (seconds): the delay
        marginal's ``ppf(0)``, the least its sampler can produce. netem's
        families are clipped, so theirs is ``max(0, delay + jitter x LO)``; a
        log-normal's is where :func:`~netem.stdnormal.norm_ppf` clips
        (``|z| <= 8.2``); an empirical table's is its smallest value."""
        floor = float(self.delay_dist().ppf(0.0))
        return floor if math.isfinite(floor) and floor > 0.0 else 0.0

    def least_delay(self, nbytes: int) -> float:
        """The least time a message of ``nbytes`` can take on this link (seconds).

        :meth:`least_propagation` plus its serialisation at ``rate`` (0 on a
        trace or an unlimited link). Queueing, a shared bottleneck, TCP's
        slow start and recovery, and head-of-line waits only add to it: every
        delivery :class:`~netem.link.Link` schedules with these parameters is
        at least this long after its send.
        """
        return self.least_propagation() + self.serialization(nbytes)
