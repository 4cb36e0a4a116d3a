"""A client host's event-log records and phase durations, on their way to the server in batches.

Client actors record what they do (:meth:`EventOutbox.emit`: sends,
trainings, absences, rejections) stamped with emulated and real time; the
host's phases (encode, decode, queueing, compute) are timed into
:attr:`EventOutbox.phases`. Every 0.25 real seconds (:meth:`EventOutbox.run`)
the records go to the server as :class:`~fedsim.wire.messages.EventBatch`
messages with the phases since the previous batch, at most ``_CHUNK``
records between two returns to the event loop, each batch split until its
header fits the server's limit.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from fedsim.results.phases import PHASES, PhaseStats
from fedsim.wire.codec import MAX_HEADER_BYTES, encode_body
from fedsim.wire.messages import HOST_PHASES, Event, EventBatch, Message, PhaseSample
from netem.clock import Clock

__all__ = ["CHUNK", "EventOutbox", "fitting"]

#: Clients started, or event records sent in one batch, between two returns to the event
#: loop: t = 0 starts every client, and each away one records it, so at 50,000 clients a
#: host's start and its first batch held the loop for 80-90 ms; 500 at a time, 2-4 ms.
CHUNK = 500
#: real seconds between two batches
PERIOD = 0.25


class EventOutbox:
    """The records and phase durations of host ``host`` not yet sent; ``send`` sends
    a control message to the server."""

    def __init__(self, host: str, send: Callable[[Message], Awaitable[None]]) -> None:
        self.host = host
        self._send = send
        self.events: list[Event] = []
        #: this host's phases since its last event batch (sent with the next one)
        self.phases = PhaseStats([p for p in PHASES if p in HOST_PHASES], capacity=256)

    def emit(self, clock: Clock, ev: str, at: float | None = None, **fields: Any) -> None:
        """Queue an event-log record, stamped with ``clock``'s emulated time (``at``
        if given: the instant the record is about, read before) and real time."""
        t = clock.now() if at is None else at
        self.events.append(Event.of(round(t, 6), round(clock.real() - clock.epoch, 6),
                                    ev, **fields))

    def clear(self) -> None:
        """Forget what is pending (a restarted server starts a fresh log)."""
        self.events = []
        self.phases.take()

    async def run(self) -> None:
        """Send what is pending every :data:`PERIOD` real seconds, until cancelled."""
        while True:
            await asyncio.sleep(PERIOD)
            await self.flush()

    async def flush(self) -> None:
        """Send the pending records, and the phase durations since the last batch."""
        phases = tuple(PhaseSample(phase=name, count=d["count"], sum=d["sum"], max=d["max"],
                                   values=tuple(d["values"]))
                       for name, d in self.phases.take())
        events, self.events = self.events, []
        for i in range(0, max(1, len(events)), CHUNK):
            if i:
                await asyncio.sleep(0)  # let timers due meanwhile run
            batch = tuple(events[i:i + CHUNK])
            if batch or phases:
                for part in fitting(EventBatch(host=self.host, events=batch, phases=phases)):
                    await self._send(part)
            phases = ()


def fitting(batch: EventBatch) -> list[EventBatch]:
    """``batch``, split until each part's header is within the server's limit."""
    if len(batch.events) <= 1 or encode_body(batch).nbytes < MAX_HEADER_BYTES - 1024:
        return [batch]
    half = len(batch.events) // 2
    return [*fitting(EventBatch(host=batch.host, events=batch.events[:half],
                                phases=batch.phases)),
            *fitting(EventBatch(host=batch.host, events=batch.events[half:]))]
