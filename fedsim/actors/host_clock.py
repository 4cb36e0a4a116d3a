"""The server's clock as a client host measures it: NTP-style probes, drift samples, a heartbeat.

A host measures its offset to the server's clock before it registers (the
fastest of eight probe round trips: offset = t_server - (t_sent +
t_received) / 2, uncertainty half that round trip; never assumed zero, even
on one machine), then probes every 2 real seconds during the run: the
answers whose round trip is near the best keep sampling the offset (drift,
reported in the host's goodbye), and any message from the server counts as
its heartbeat. A server silent for ``deploy.host_timeout`` real seconds is
gone. :meth:`ServerClock.emulated` turns the server's
:class:`~fedsim.wire.messages.Start` into this host's emulated
:class:`~netem.clock.Clock`.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable

from fedsim.wire.messages import ClockProbe, ClockReply, Message, Refused, Start, Stop
from netem.clock import Clock

__all__ = ["ServerClock"]

#: offset samples a run keeps (the first, the registration's, always)
_KEEP = 1000


class ServerClock:
    """This host's estimate of the server's clock (see the module docstring).

    ``send`` sends a control message; ``recv(wait)`` the next control message
    within ``wait`` real seconds (None: none came)."""

    def __init__(self, real_clock: Callable[[], float],
                 send: Callable[[Message], Awaitable[None]],
                 recv: Callable[[float], Awaitable[Message | None]]) -> None:
        self.real_clock = real_clock
        self._send = send
        self._recv = recv
        #: server monotonic - ours, real seconds, and half the round trip it came from
        self.offset = 0.0
        self.uncertainty = 0.0
        #: the registration's offset, then the run's near-best samples
        self.offsets: list[float] = []
        self._best_rtt = float("inf")
        #: when the server was last heard from (any message)
        self.heard = real_clock()

    async def sync(self, probes: int, first_timeout: float) -> None:
        """Estimate the server's clock from the fastest of ``probes`` round trips.

        Raises TimeoutError if the server does not answer (the first probe
        waits ``first_timeout``: the server may not be up yet), and
        ConnectionRefusedError if it refuses or stops this host."""
        best: tuple[float, float] | None = None
        for i in range(probes):
            t0 = self.real_clock()
            await self._send(ClockProbe(seq=i, t_sent=t0))
            deadline = self.real_clock() + (first_timeout if i == 0 else 5.0)
            while True:
                left = deadline - self.real_clock()
                if left <= 0:
                    raise TimeoutError
                msg = await self._recv(left)
                if isinstance(msg, ClockReply) and msg.seq == i and msg.t_sent == t0:
                    break
                if isinstance(msg, Refused | Stop):
                    raise ConnectionRefusedError(msg.reason)
            t1 = self.real_clock()
            rtt = t1 - t0
            if best is None or rtt < best[0]:
                best = (rtt, msg.t_server - (t0 + t1) / 2)
        assert best is not None
        self._best_rtt = best[0]
        self.offset, self.uncertainty = best[1], best[0] / 2
        self.offsets = [best[1]]

    def sample(self, reply: ClockReply) -> None:
        """A periodic probe's answer: keep offsets measured with a near-best round trip."""
        t1 = self.real_clock()
        rtt = t1 - reply.t_sent
        if 0 <= rtt <= max(2 * self._best_rtt, self._best_rtt + 1e-3):
            self.offsets.append(reply.t_server - (reply.t_sent + t1) / 2)
            if len(self.offsets) > _KEEP:
                del self.offsets[1:2]

    def heard_now(self) -> None:
        """A message from the server arrived: it is alive."""
        self.heard = self.real_clock()

    def silent_for(self) -> float:
        """Real seconds since the server was last heard from."""
        return self.real_clock() - self.heard

    async def probe(self, host_timeout: float) -> None:
        """Probe the server's clock every 2 real seconds (drift, and a heartbeat);
        return once the server has been silent for ``host_timeout`` real seconds."""
        seq = itertools.count(1000)
        while True:
            await asyncio.sleep(2.0)
            await self._send(ClockProbe(seq=next(seq), t_sent=self.real_clock()))
            if self.silent_for() > host_timeout:
                return

    def emulated(self, start: Start) -> Clock:
        """The emulated clock the server's ``start`` sets: its epoch on this host's clock."""
        return Clock(dilation=start.dilation, epoch=start.epoch - self.offset,
                     real_clock=self.real_clock)
