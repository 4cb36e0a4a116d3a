"""One timer heap per process, on absolute deadlines.

asyncio's own timers round to whole milliseconds (the epoll timeout is rounded
up) and fall behind with thousands pending; uvloop's fire up to 1.3 ms early
(docs/measurements.md#event-loop-timers-asyncio-and-uvloop). This heap keeps
every pending delivery in one ``heapq`` of ``(real_deadline, seq, entry)`` and
arms a single Linux ``timerfd`` (nanosecond resolution, 50 µs timer slack) at
the earliest deadline; the event loop watches its file descriptor, so a
deadline costs one heap push and the loop wakes once per due batch. Where
timerfd is not available the heap falls back to ``loop.call_at`` and re-arms
when woken early.

**Waking early and spinning.** A CPU that has been idle wakes late: on the
2-core VM this project is measured on, ``time.sleep(0.02)`` woke 0.22 ms late
at the median but ``time.sleep(0.25)`` 1.6 ms (p99 2.7 ms), and the same
lateness, in real time, whatever the dilation (a larger dilation only makes
the idle gaps longer). A synchronous round (deliveries after a quiet spell)
then fails the fidelity verdict at every dilation. With ``spin_max > 0`` the
heap arms its timerfd that much *before* a deadline (the margin: the largest
recent wake-up latency, decaying by 2 % a wake-up, at most ``spin_max``, and
at most 5 % of the time since the heap last woke) and busy-waits the rest, so
the wake-up's latency is paid before the deadline instead of after it. The
spin costs at most 5 % of a core: a heap woken every few milliseconds (a warm
CPU, whose wake-ups are prompt) hardly spins. Only the
timerfd path spins (its clock is the real monotonic one); the fallback and
virtual-time heaps never do.

Each firing measures its lateness (actual minus scheduled real time). The
heap keeps only a constant-size summary of it (count and maximum), however
long the run; a caller that wants the distribution passes a sink
(``on_lateness``), e.g. :meth:`netem.fidelitystats.Reservoir.add`, which
keeps a bounded uniform sample.
"""

from __future__ import annotations

import asyncio
import ctypes
import heapq
import itertools
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from netem.clock import Clock
from netem.libc import libc as load_libc

__all__ = ["SPIN_MAX", "TimerHandle", "TimerHeap"]

log = logging.getLogger(__name__)

_TFD_TIMER_ABSTIME = 1

#: What fedsim's actors pass as ``spin_max``: 5 ms of real time, above the p99
#: wake-up latency after a quarter second idle measured on a 2-core VM (2.7 ms).
SPIN_MAX = 0.005
#: A heap spins at most this share of the real time between its wake-ups.
SPIN_SHARE = 0.05


class _Itimerspec(ctypes.Structure):
    """``struct itimerspec`` (two ``struct timespec``) as four longs: one per
    heap, re-armed in place (a nested field makes a temporary per access)."""

    _fields_ = [
        ("interval_sec", ctypes.c_long),
        ("interval_nsec", ctypes.c_long),
        ("sec", ctypes.c_long),
        ("nsec", ctypes.c_long),
    ]


def _load_timerfd() -> Any:
    libc = load_libc()
    if libc is None:
        return None
    try:
        libc.timerfd_create.argtypes = [ctypes.c_int, ctypes.c_int]
        libc.timerfd_settime.argtypes = [
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_void_p,
            ctypes.c_void_p,
        ]
        return libc
    except (OSError, AttributeError):
        return None


_LIBC = _load_timerfd()


class TimerHandle:
    """A scheduled callback; :meth:`cancel` stops it from running."""

    __slots__ = ("args", "callback", "cancelled", "deadline", "emulated")

    def __init__(
        self,
        deadline: float,
        emulated: float,
        callback: Callable[..., Any],
        args: tuple[Any, ...],
    ) -> None:
        self.deadline = deadline
        self.emulated = emulated
        self.callback = callback
        self.args = args
        self.cancelled = False

    def cancel(self) -> None:
        """Do not run this callback."""
        self.cancelled = True


class TimerHeap:
    """Absolute-deadline timers in emulated time, for one event loop.

    Parameters
    ----------
    clock : Clock
        The emulated clock deadlines are expressed in.
    loop : asyncio.AbstractEventLoop or None
        The loop to run callbacks on (default: the running loop).
    use_timerfd : bool
        Use a Linux timerfd when available (default True).
    spin_max : float
        Real seconds the heap may wake before a deadline and busy-wait to it
        (0, the default: never; see the module's docstring). fedsim's actors
        pass :data:`SPIN_MAX`.
    on_lateness : callable or None
        Called with the lateness of every fired timer (real seconds, >= 0),
        before its callback; the heap itself keeps only :attr:`fired` and
        :attr:`lateness_max`. Memory is then bounded
        by what the sink keeps (a :class:`netem.fidelitystats.Reservoir` keeps
        a fixed number of samples). An exception in the sink is logged.

    Attributes
    ----------
    fired : int
        Timers fired (cancelled ones are not counted).
    wakeups : int
        Times the loop woke the heap (``fired / wakeups`` timers per wake-up).
    lateness_max : float
        Largest lateness of a fired timer, real seconds (0 before any).
    spun : float
        Real seconds spent busy-waiting for deadlines (CPU the spin cost).
    wake_latency_max : float
        Largest real lateness of a wake-up against the time the timerfd was
        armed for (what spinning hides; 0 without spinning).

    Notes
    -----
    Cost per timer: one heap push (``call_at``) and one pop. Per wake-up: the
    loop's dispatch of the fd and one ``timerfd_settime`` at the end, for the
    new earliest deadline (or to disarm), which also resets the fd's expiry
    count, so no ``read`` is needed. A ``call_at`` from a callback never
    re-arms (the wake-up in progress does it once): a wake-up that runs k
    callbacks scheduling 2k timers makes one system call, not 2k + 2. Arming
    a deadline less than a tick away reprograms the host's timer hardware;
    in a VM that is an exit to the hypervisor, 10-20 us on the development
    VM, where a whole wake-up costs about 22 us of CPU whatever the
    callbacks do (docs/measurements.md#netem-at-10000-links;
    tools/bench_netem.py prints the wake-ups per second).
    """

    def __init__(
        self,
        clock: Clock,
        loop: asyncio.AbstractEventLoop | None = None,
        *,
        use_timerfd: bool = True,
        spin_max: float = 0.0,
        on_lateness: Callable[[float], object] | None = None,
    ) -> None:
        if not spin_max >= 0:
            raise ValueError(f"Invalid spin_max: {spin_max} (must be >= 0 seconds)")
        self.clock = clock
        self.loop = loop or asyncio.get_running_loop()
        self._heap: list[tuple[float, int, TimerHandle]] = []
        self._seq = itertools.count()
        self._armed: float | None = None
        self._running = False  # inside _run_due, which arms when it is done
        self._fallback: asyncio.TimerHandle | None = None
        self._fd = -1
        self._spec = _Itimerspec()
        self._spec_ref = ctypes.addressof(self._spec)
        self.on_lateness = on_lateness
        self.fired = 0
        self.wakeups = 0
        self.lateness_max = 0.0
        self.spun = 0.0
        self.wake_latency_max = 0.0
        self._spin_max = float(spin_max)
        #: how long before a deadline the timerfd fires (learnt, <= spin_max)
        self._margin = self._spin_max / 2
        self._wake_at = 0.0  # the real time the timerfd was last armed for
        self._last_wake = self.clock.real()  # when the heap last ran its due timers
        if use_timerfd and _LIBC is not None:
            fd = _LIBC.timerfd_create(time.CLOCK_MONOTONIC, os.O_NONBLOCK | os.O_CLOEXEC)
            if fd >= 0:
                self._fd = fd
                self.loop.add_reader(fd, self._on_fd)
        self.kind = "timerfd" if self._fd >= 0 else "call_at"
        if self._fd < 0:
            self._spin_max = self._margin = 0.0

    # -- scheduling ---------------------------------------------------------
    def call_at(self, t: float, callback: Callable[..., Any], *args: Any) -> TimerHandle:
        """Run ``callback(*args)`` at emulated time ``t``."""
        deadline = self.clock.to_real(t)
        handle = TimerHandle(deadline, t, callback, args)
        heapq.heappush(self._heap, (deadline, next(self._seq), handle))
        if not self._running and (self._armed is None or deadline < self._armed):
            self._arm(deadline)
        return handle

    def call_later(self, delay: float, callback: Callable[..., Any], *args: Any) -> TimerHandle:
        """Run ``callback(*args)`` ``delay`` emulated seconds from now."""
        return self.call_at(self.clock.now() + delay, callback, *args)

    async def sleep_until(self, t: float) -> None:
        """Wait until emulated time ``t`` on this heap."""
        if self.clock.to_real(t) <= self.clock.real():
            return
        fut: asyncio.Future[None] = self.loop.create_future()
        handle = self.call_at(t, _set_result, fut)
        try:
            await fut
        finally:
            handle.cancel()

    def __len__(self) -> int:
        return len(self._heap)

    # -- arming -------------------------------------------------------------
    def _arm(self, deadline: float) -> None:
        self._armed = deadline
        if self._fd >= 0:
            # spin at most SPIN_SHARE of the time since the last wake-up: a heap
            # woken every few ms (a warm CPU) hardly spins, one after a quiet
            # spell (a cold CPU, a late wake-up) spins up to the margin
            wake = deadline - min(self._margin, SPIN_SHARE * max(0.0, deadline - self._last_wake))
            # a wake-up already due fires at once: its latency is counted from now
            self._wake_at = max(wake, self.clock.real()) if self._spin_max > 0 else wake
            sec = int(wake)
            nsec = int((wake - sec) * 1e9)
            spec = self._spec
            spec.sec = sec
            spec.nsec = max(nsec, 1) if sec == 0 else nsec  # all zero would disarm
            if _LIBC.timerfd_settime(self._fd, _TFD_TIMER_ABSTIME, self._spec_ref, None):
                err = ctypes.get_errno()
                raise OSError(err, f"timerfd_settime failed: {os.strerror(err)}")
            return
        if self._fallback is not None:
            self._fallback.cancel()
        # loop.time() is the same monotonic clock for the stdlib loop; uvloop's
        # is millisecond-cached, so convert through a relative delay.
        delay = max(0.0, deadline - self.clock.real())
        self._fallback = self.loop.call_later(delay, self._run_due)

    def _on_fd(self) -> None:
        # No read(): _run_due ends with timerfd_settime (arm or disarm), which
        # resets the expiry count, so the fd is no longer readable.
        self._run_due()

    def _disarm(self) -> None:
        self._armed = None
        if self._fd >= 0:
            spec = self._spec
            spec.sec = spec.nsec = 0
            _LIBC.timerfd_settime(self._fd, _TFD_TIMER_ABSTIME, self._spec_ref, None)

    def _run_due(self) -> None:
        self._armed = None
        self.wakeups += 1
        if self._fallback is not None:
            # A no-op when the fallback is what woke us; otherwise (woken some
            # other way) it must not stay pending in the loop.
            self._fallback.cancel()
            self._fallback = None
        real = self.clock.real
        now = real()
        heap = self._heap
        if self._spin_max > 0:
            now = self._spin(now)
            self._last_wake = now
        sink = self.on_lateness
        # The summary is kept in locals on this hot path (a small per-wake-up
        # count allocates nothing) and written back even if a callback raises
        # a BaseException through the heap.
        fired, worst = 0, self.lateness_max
        self._running = True
        try:
            while heap and heap[0][0] <= now:
                deadline, _, handle = heapq.heappop(heap)
                if handle.cancelled:
                    continue
                late = now - deadline
                fired += 1
                if late > worst:
                    worst = late
                if sink is not None:
                    try:
                        sink(late)
                    except Exception:  # a faulty sink must not stop the heap
                        log.exception("lateness sink %r failed", sink)
                try:
                    handle.callback(*handle.args)
                except Exception:  # a faulty callback must not stop the heap
                    log.exception("timer callback %r failed", handle.callback)
                now = real()
        finally:
            self._running = False
            self.fired += fired
            self.lateness_max = worst
            while heap and heap[0][2].cancelled:
                heapq.heappop(heap)
            if heap:
                self._arm(heap[0][0])
            else:
                self._disarm()

    def _spin(self, now: float) -> float:
        """Learn this wake-up's latency, then busy-wait for the earliest
        deadline if it is within the margin; the real time after."""
        late = now - self._wake_at
        if late > self.wake_latency_max:
            self.wake_latency_max = late
        # fast attack, slow decay: the margin covers the recent worst wake-up
        self._margin = min(self._spin_max, max(late, self._margin * 0.98))
        heap = self._heap
        while heap and heap[0][2].cancelled:
            heapq.heappop(heap)
        if not heap:
            return now
        deadline = heap[0][0]
        if now < deadline <= now + self._spin_max:
            real = self.clock.real
            start = now
            while now < deadline:
                now = real()
            self.spun += now - start
        return now

    def close(self) -> None:
        """Stop watching the timerfd and drop pending timers."""
        if self._fd >= 0:
            self.loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = -1
        if self._fallback is not None:
            self._fallback.cancel()
        self._heap.clear()


def _set_result(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
