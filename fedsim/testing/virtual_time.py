"""Virtual time for the actors: an event loop whose clock jumps to the next timer.

With it, the whole actor system (server, client hosts, client actors and
their timers) runs in one process, on one event loop, in milliseconds of real
time and with no sleeps, and a run is reproducible step by step
(:mod:`fedsim.testing.memory_network` joins the actors without sockets).

:class:`VirtualTimeLoop` is an :class:`asyncio.SelectorEventLoop` whose
:meth:`~VirtualTimeLoop.time` is a virtual clock starting at ``0.0``.
Whenever the loop would block (no callback is ready), it does not sleep: it
jumps the virtual clock straight to the next scheduled timer ("autojump",
like trio's ``MockClock(autojump_threshold=0)``). Callbacks and coroutines
take no virtual time at all; virtual time moves only while every task waits.
If every task waits and no timer is scheduled, nothing can ever happen
again, and the loop raises :class:`VirtualTimeDeadlock` instead of hanging.

Everything that takes its time from the loop works unchanged on virtual time:
:func:`asyncio.sleep`, :meth:`~asyncio.loop.call_later` and
:meth:`~asyncio.loop.call_at`, :func:`asyncio.wait_for`,
:func:`asyncio.timeout`, :class:`asyncio.Event`, :class:`asyncio.Queue`.
Code that reads a clock of its own does not: the actors must take time from a
:class:`netem.clock.Clock` made by :func:`virtual_clock` (never from
:func:`time.monotonic` or :func:`netem.clock.monotonic`), and schedule on a
:class:`netem.timers.TimerHeap` built with ``use_timerfd=False`` (a timerfd
is armed on the kernel's real clock): :func:`make_timers` picks the right
kind for the running loop, and the virtual loop refuses to watch a timerfd.

Real I/O is polled, never waited for: each iteration of the loop first polls
the real selector (asyncio's self-pipe, and any real socket) without
blocking. The one exception is real work asyncio knows about: while a job
submitted with :meth:`~asyncio.loop.run_in_executor` (hence
:func:`asyncio.to_thread`) or the default executor's shutdown is under way,
virtual time stands still and the loop blocks on the real selector until the
job finishes. A thread job therefore takes no virtual time, and a run does
not depend on how fast the threads are. Threads started any other way, real
sockets (ZeroMQ) and subprocesses cannot be used on virtual time.

What the virtual loop relies on
-------------------------------
Public hooks: :meth:`~asyncio.loop.time` (all of asyncio's scheduling goes
through it) and the ``selector`` argument of
:class:`asyncio.SelectorEventLoop` (its ``select(timeout)`` is where the
loop blocks, and ``timeout`` is ``None`` when nothing is scheduled). Two
internals of :class:`asyncio.BaseEventLoop`, both in every CPython since
3.4: the heap of scheduled handles ``_scheduled``, read (never written) to
jump *exactly* to the next deadline rather than to ``time() + timeout``,
which can be off by a rounding error; and ``_clock_resolution``, which
``_run_once`` adds to ``time()`` to decide which timers are due: the virtual
loop makes it the gap to the next float, so that a timer runs when its
deadline is reached and not up to a nanosecond early as on the real clock.
``test_timers_run_in_deadline_order_at_exactly_their_deadlines`` fails if
either changes meaning.
On Linux, ``/proc/self/fd`` tells a timerfd apart in
:meth:`~VirtualTimeLoop.add_reader`.

Examples
--------
>>> import asyncio
>>> from fedsim.testing.virtual_time import run_virtual
>>> async def main() -> float:
...     await asyncio.sleep(3600)
...     return asyncio.get_running_loop().time()
>>> run_virtual(main())  # an hour, at once
3600.0
"""

from __future__ import annotations

import asyncio
import math
import os
import selectors
import sys
from collections.abc import Callable, Coroutine
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Any, TypeVar

from netem.clock import Clock
from netem.timers import TimerHeap

if TYPE_CHECKING:
    from typing import TypeVarTuple

    from _typeshed import FileDescriptorLike

    _Ts = TypeVarTuple("_Ts")

__all__ = [
    "VirtualTimeDeadlock",
    "VirtualTimeLoop",
    "make_timers",
    "run_virtual",
    "virtual_clock",
]

T = TypeVar("T")


class VirtualTimeDeadlock(RuntimeError):
    """Every task waits, no timer is scheduled and no real work is under way.

    Nothing can ever wake the loop again; the message lists the waiting
    tasks.
    """


class _VirtualSelector(selectors.BaseSelector):
    """A real selector that is polled, never waited on (see the module doc).

    Registration goes to the real selector, which asyncio's own file
    descriptors (the self-pipe) need; :meth:`select` asks the loop what to do
    when the real poll finds nothing.
    """

    def __init__(self, idle: Callable[[float | None], bool]) -> None:
        self._real = selectors.DefaultSelector()
        # Called when nothing real is ready: advances virtual time, raises on
        # deadlock, or returns True to block on the real selector.
        self._idle = idle

    def register(
        self, fileobj: FileDescriptorLike, events: int, data: Any = None
    ) -> selectors.SelectorKey:
        return self._real.register(fileobj, events, data)

    def unregister(self, fileobj: FileDescriptorLike) -> selectors.SelectorKey:
        return self._real.unregister(fileobj)

    def modify(
        self, fileobj: FileDescriptorLike, events: int, data: Any = None
    ) -> selectors.SelectorKey:
        return self._real.modify(fileobj, events, data)

    def get_map(self) -> Any:
        return self._real.get_map()

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = self._real.select(0)
        if ready or timeout == 0:
            return ready
        if self._idle(timeout):
            return self._real.select(None)
        return []

    def close(self) -> None:
        self._real.close()


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop on virtual time that jumps over every wait.

    Parameters
    ----------
    start : float
        Virtual time of the loop's creation (seconds, default 0).

    Notes
    -----
    The loop's :meth:`time` only moves when the loop would otherwise block:
    then it jumps to the earliest scheduled timer, exactly. When nothing is
    scheduled and no executor job is under way, the loop raises
    :class:`VirtualTimeDeadlock` out of ``run_until_complete``. See the module
    documentation for what it relies on and what cannot run on it.
    """

    # An asyncio internal read (never written) by _idle; declared here so
    # that the reliance is visible and type-checked.
    _scheduled: list[asyncio.TimerHandle]

    def __init__(self, start: float = 0.0) -> None:
        self._virtual_now = float(start)
        self._real_jobs = 0
        super().__init__(_VirtualSelector(self._idle))

    def time(self) -> float:
        """The virtual time in seconds."""
        return self._virtual_now

    # asyncio's _run_once runs the timers whose deadline is below
    # ``time() + _clock_resolution`` (the real clock's resolution, 1 ns, set
    # by BaseEventLoop.__init__). On virtual time the gap to the next float
    # makes that "deadline <= now": a timer never runs early, even by 1 ns.
    @property
    def _clock_resolution(self) -> float:
        now = self._virtual_now
        return math.nextafter(now, math.inf) - now

    @_clock_resolution.setter
    def _clock_resolution(self, _: float) -> None:
        pass

    @property
    def real_jobs(self) -> int:
        """Executor jobs under way, during which virtual time stands still."""
        return self._real_jobs

    # -- the one place where the loop would block ---------------------------
    def _idle(self, timeout: float | None) -> bool:
        """Nothing is ready: jump, block on real work, or report a deadlock.

        Returns True when the selector must block on the real selector (an
        executor job will wake the loop through the self-pipe).
        """
        if self._real_jobs:
            return True
        if timeout is None:
            raise VirtualTimeDeadlock(self._deadlock_message())
        now = self._virtual_now
        target = now + timeout
        if self._scheduled:
            # asyncio computed timeout = head - now; jump to the head itself,
            # so that a deadline is met with no rounding error. (The timeout
            # is capped at one day: then the head is further and we only
            # move by the timeout.)
            head = self._scheduled[0].when()
            if head <= target + 4 * math.ulp(target):
                target = head
        self._virtual_now = max(now, target)
        return False

    def _deadlock_message(self) -> str:
        tasks = [t for t in asyncio.all_tasks(self) if not t.done()]
        lines = [
            "virtual time: every task is blocked and no timer is scheduled "
            f"(at t = {self._virtual_now:.9g} s; {len(tasks)} task(s) waiting)"
        ]
        for task in sorted(tasks, key=lambda t: t.get_name())[:20]:
            lines.append(f"  {task.get_name()}: {_await_chain(task.get_coro())}")
        return "\n".join(lines)

    # -- real work that virtual time waits for -------------------------------
    def run_in_executor(
        self,
        executor: Executor | None,
        func: Callable[[*_Ts], T],
        *args: *_Ts,
    ) -> asyncio.Future[T]:
        """As :meth:`asyncio.loop.run_in_executor`; virtual time waits for it."""
        fut = super().run_in_executor(executor, func, *args)
        self._real_jobs += 1
        fut.add_done_callback(self._real_job_done)
        return fut

    def _real_job_done(self, _: asyncio.Future[Any]) -> None:
        self._real_jobs -= 1

    if sys.version_info >= (3, 12):

        async def shutdown_default_executor(
            self,
            timeout: float | None = None,  # noqa: ASYNC109 (asyncio's signature)
        ) -> None:
            """As asyncio's; virtual time waits for the threads to join."""
            self._real_jobs += 1
            try:
                await super().shutdown_default_executor(timeout)
            finally:
                self._real_jobs -= 1

    else:

        async def shutdown_default_executor(self) -> None:
            """As asyncio's; virtual time waits for the threads to join."""
            self._real_jobs += 1
            try:
                await super().shutdown_default_executor()
            finally:
                self._real_jobs -= 1

    # -- real clocks that cannot follow virtual time -------------------------
    def add_reader(
        self,
        fd: FileDescriptorLike,
        callback: Callable[[*_Ts], Any],
        *args: *_Ts,
    ) -> None:
        """As asyncio's, but a timerfd (armed on real time) is refused.

        Raises
        ------
        RuntimeError
            If ``fd`` is a Linux timerfd, e.g. from
            ``netem.timers.TimerHeap(clock)``: pass ``use_timerfd=False`` or
            use :func:`make_timers`.
        """
        if _is_timerfd(fd):
            raise RuntimeError(
                "virtual time: a timerfd runs on the real clock; build the TimerHeap "
                "with use_timerfd=False (fedsim.testing.virtual_time.make_timers does)"
            )
        super().add_reader(fd, callback, *args)


def _await_chain(coro: object) -> str:
    """Where a suspended coroutine waits: each ``await`` down to a future."""
    parts: list[str] = []
    obj: Any = coro
    while obj is not None and len(parts) < 12:
        frame = getattr(obj, "cr_frame", None) or getattr(obj, "gi_frame", None)
        if frame is None:
            break
        code = frame.f_code
        parts.append(f"{code.co_name} ({os.path.basename(code.co_filename)}:{frame.f_lineno})")
        obj = getattr(obj, "cr_await", None) or getattr(obj, "gi_yieldfrom", None)
    return " -> ".join(parts) or repr(coro)


def _is_timerfd(fd: FileDescriptorLike) -> bool:
    """True if ``fd`` is a Linux timerfd (False where that cannot be told)."""
    try:
        n = fd if isinstance(fd, int) else fd.fileno()
        return os.readlink(f"/proc/self/fd/{n}") == "anon_inode:[timerfd]"
    except (OSError, ValueError, AttributeError):
        return False


def run_virtual(coro: Coroutine[Any, Any, T], *, debug: bool = False) -> T:
    """Run a coroutine to completion on a new :class:`VirtualTimeLoop`.

    As :func:`asyncio.run`: tasks still pending at the end are cancelled,
    async generators and the default executor are shut down and the loop is
    closed.

    Parameters
    ----------
    coro : coroutine
        The main coroutine.
    debug : bool
        Run the loop in asyncio's debug mode.

    Returns
    -------
    T
        What the coroutine returns.

    Raises
    ------
    VirtualTimeDeadlock
        If every task ends up waiting with no timer scheduled.
    RuntimeError
        If called from a running event loop.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise RuntimeError("run_virtual() cannot be called from a running event loop")
    with asyncio.Runner(debug=debug, loop_factory=VirtualTimeLoop) as runner:
        return runner.run(coro)


def _virtual_loop(loop: asyncio.AbstractEventLoop | None) -> VirtualTimeLoop:
    if loop is None:
        loop = asyncio.get_running_loop()
    if not isinstance(loop, VirtualTimeLoop):
        raise TypeError(f"not on virtual time: {type(loop).__name__} is not a VirtualTimeLoop")
    return loop


def virtual_clock(dilation: float = 1.0, *, loop: VirtualTimeLoop | None = None) -> Clock:
    """An emulated clock on the loop's virtual time, starting now.

    Parameters
    ----------
    dilation : float
        Virtual seconds per emulated second (> 0), as for
        :class:`netem.clock.Clock`.
    loop : VirtualTimeLoop or None
        The loop (default: the running loop, which must be virtual).

    Returns
    -------
    netem.clock.Clock
        A clock whose real clock is ``loop.time`` and whose epoch is the
        loop's current time: ``clock.now()`` is emulated seconds since this
        call, on virtual time.

    Raises
    ------
    TypeError
        If the loop is not a :class:`VirtualTimeLoop`.
    """
    vloop = _virtual_loop(loop)
    return Clock(dilation, epoch=vloop.time(), real_clock=vloop.time)


def make_timers(
    clock: Clock,
    loop: asyncio.AbstractEventLoop | None = None,
    *,
    on_lateness: Callable[[float], object] | None = None,
) -> TimerHeap:
    """A :class:`netem.timers.TimerHeap` of the right kind for the loop.

    On a :class:`VirtualTimeLoop` the heap schedules through
    ``loop.call_later`` (``use_timerfd=False``); elsewhere it arms a timerfd
    where the platform has one.

    Parameters
    ----------
    clock : netem.clock.Clock
        The emulated clock (from :func:`virtual_clock` on virtual time).
    loop : asyncio.AbstractEventLoop or None
        The loop (default: the running loop).
    on_lateness : callable or None
        Passed to the heap.

    Returns
    -------
    netem.timers.TimerHeap
        The heap; close it when done.
    """
    if loop is None:
        loop = asyncio.get_running_loop()
    return TimerHeap(
        clock,
        loop,
        use_timerfd=not isinstance(loop, VirtualTimeLoop),
        on_lateness=on_lateness,
    )
