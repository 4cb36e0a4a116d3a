"""What the server's parts read of the run they serve: whether it started, why it ends, its clock.

:class:`RunView` is the typed face of :class:`~fedsim.actors.server.Server`
that its parts (:mod:`.host_sessions`, :mod:`.uplinks`, :mod:`.downlinks`)
are given: they own their own state and read the run's through it, never
the server's private attributes. ``timers`` and ``state`` exist from the
moment the emulated clock starts (None before).
"""

from __future__ import annotations

from typing import Protocol

from fedsim.actors.runstate import RunState
from netem.timers import TimerHeap

__all__ = ["RunView"]


class RunView(Protocol):
    """The run as the server's parts see it (the server satisfies it)."""

    @property
    def started(self) -> bool:
        """The federation has begun (the clients were told to start)."""

    @property
    def stop_reason(self) -> str | None:
        """Why the run ends (None: it goes on)."""

    @property
    def timers(self) -> TimerHeap | None:
        """The emulated clock's timer heap."""

    @property
    def state(self) -> RunState | None:
        """The run's records (events, counts, the summary)."""

    def now(self) -> float:
        """Emulated seconds (0 before the clock starts)."""
