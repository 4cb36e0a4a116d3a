"""Emulated time and time dilation.

Every duration in netem and in the actors is in *emulated* seconds. The
mapping to the host's monotonic clock is::

    real = epoch + emulated * dilation

so a dilation of 10 gives every emulated second ten real seconds, which lets
a two-core host keep up with a thousand clients (docs/netem.md#emulated-time-timers-and-dilation).
Changing the dilation re-bases the epoch so that ``now()`` never jumps
(trio's ``MockClock`` does the same). The real clock is an attribute that
tests replace.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["Clock", "ManualClock", "monotonic"]


def monotonic() -> float:
    """Host-wide CLOCK_MONOTONIC in seconds (shared by every process)."""
    return time.clock_gettime(time.CLOCK_MONOTONIC)


class Clock:
    """Maps emulated seconds to the real monotonic clock.

    Parameters
    ----------
    dilation : float
        Real seconds per emulated second (> 0; 1 = real time).
    epoch : float or None
        Real monotonic time of emulated ``0``; ``None`` means "now".
    real_clock : callable, optional
        The real clock (default: ``CLOCK_MONOTONIC``); an event loop's
        ``time`` (a virtual-time loop's in tests), or a process's own clock.
    """

    def __init__(self, dilation: float = 1.0, epoch: float | None = None,
                 real_clock: Callable[[], float] = monotonic) -> None:
        if not dilation > 0:
            raise ValueError(f"Invalid dilation: {dilation} (must be > 0)")
        self._real_clock: Callable[[], float] = real_clock
        self.dilation = float(dilation)
        self.epoch = self._real_clock() if epoch is None else float(epoch)

    def real(self) -> float:
        """The real monotonic time."""
        return self._real_clock()

    def now(self) -> float:
        """Emulated seconds since the epoch."""
        return (self._real_clock() - self.epoch) / self.dilation

    def to_real(self, t: float) -> float:
        """Real monotonic deadline of emulated time ``t``."""
        return self.epoch + t * self.dilation

    def to_real_delay(self, t: float) -> float:
        """Real seconds from now until emulated time ``t`` (may be negative)."""
        return self.to_real(t) - self._real_clock()

    def set_dilation(self, dilation: float) -> None:
        """Change the dilation without making ``now()`` jump."""
        if not dilation > 0:
            raise ValueError(f"Invalid dilation: {dilation} (must be > 0)")
        now = self.now()
        self.dilation = float(dilation)
        self.epoch = self._real_clock() - now * self.dilation


class ManualClock(Clock):
    """A clock whose real time only moves when a test advances it."""

    def __init__(self, dilation: float = 1.0) -> None:
        self._t = 0.0
        super().__init__(dilation, epoch=0.0)
        self._real_clock = lambda: self._t

    def advance(self, real_seconds: float) -> None:
        """Move real time forward."""
        if real_seconds < 0:
            raise ValueError(f"Invalid advance: {real_seconds} (must be >= 0)")
        self._t += real_seconds
