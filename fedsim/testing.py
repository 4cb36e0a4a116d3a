"""Test harness: virtual time and an in-memory network for the actors.

With these, the whole actor system (server, client hosts, client actors and
their timers) runs in one process, on one event loop, in milliseconds of real
time and with no sleeps, and a run is reproducible step by step.

Virtual time
------------
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

In-memory network
-----------------
:class:`MemoryNetwork` implements the two transport interfaces the actors use
(:class:`Endpoint`, a ROUTER's side, and :class:`Connection`, a DEALER's or
one end of a pair) without sockets: :meth:`~MemoryNetwork.bind`,
:meth:`~MemoryNetwork.connect` and :meth:`~MemoryNetwork.pair`. Every message
sent is copied into new ``bytes``, becomes a :class:`Packet`, and goes
through :attr:`MemoryNetwork.route`, which a test replaces to drop, duplicate,
delay or reorder packets (trio's ``FakeNet.route_packet``); the default
delivers each packet in FIFO order. Sending never takes virtual time.

Examples
--------
>>> import asyncio
>>> from fedsim.testing import run_virtual
>>> async def main() -> float:
...     await asyncio.sleep(3600)
...     return asyncio.get_running_loop().time()
>>> run_virtual(main())  # an hour, at once
3600.0
"""

from __future__ import annotations

import asyncio
import errno
import math
import os
import selectors
import sys
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

from fedsim.wire.transport import PeerGone
from netem.clock import Clock
from netem.timers import TimerHeap

if TYPE_CHECKING:
    from typing import TypeVarTuple

    from _typeshed import FileDescriptorLike

    _Ts = TypeVarTuple("_Ts")

__all__ = [
    "Frames",
    "MemoryConnection",
    "MemoryEndpoint",
    "MemoryNetwork",
    "Packet",
    "VirtualTimeDeadlock",
    "VirtualTimeLoop",
    "make_timers",
    "run_virtual",
    "virtual_clock",
]

T = TypeVar("T")

# -- virtual time -------------------------------------------------------------


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
                "with use_timerfd=False (fedsim.testing.make_timers does)"
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
    clock = Clock(dilation, epoch=vloop.time())
    clock._real_clock = vloop.time
    return clock


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


# -- in-memory network ------------------------------------------------------------

#: A message as the codec builds it: its frames, each bytes-like.
Frames: TypeAlias = list[bytes | memoryview]


@dataclass(frozen=True, slots=True)
class Packet:
    """One message in flight on a :class:`MemoryNetwork`.

    Attributes
    ----------
    address : str
        The address the message travels on: the bound address of the
        endpoint, or the address of the pair.
    source : bytes or str
        The sender: a connection's (or pair end's) identity, or the
        endpoint's address when the endpoint sends.
    destination : bytes or str
        The receiver, named the same way.
    frames : tuple of bytes
        The message, already copied out of the sender's buffers.
    """

    address: str
    source: bytes | str
    destination: bytes | str
    frames: tuple[bytes, ...]

    @property
    def size(self) -> int:
        """Bytes in all frames."""
        return sum(len(f) for f in self.frames)


def _wake(waiters: list[asyncio.Future[None]]) -> None:
    for fut in waiters:
        if not fut.done():
            fut.set_result(None)
    waiters.clear()


async def _wait(*waiter_lists: list[asyncio.Future[None]]) -> None:
    """Wait until a :func:`_wake` of any of the lists (cancellation-safe)."""
    fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    for waiters in waiter_lists:
        waiters.append(fut)
    try:
        await fut
    finally:
        for waiters in waiter_lists:
            if fut in waiters:
                waiters.remove(fut)


class _Inbox:
    """The receive queue of an endpoint, connection or pair end.

    ``max_queue`` bounds the messages queued *per source*, like a ZeroMQ
    high-water mark per pipe; the queue itself is one FIFO.
    """

    __slots__ = ("closed", "counts", "eof", "getters", "items", "max_queue", "putters")

    def __init__(self, max_queue: int | None) -> None:
        if max_queue is not None and (not isinstance(max_queue, int) or max_queue < 1):
            raise ValueError(f"Invalid max_queue: {max_queue!r} (must be None or an int >= 1)")
        self.max_queue = max_queue
        self.items: deque[tuple[bytes | str, tuple[bytes, ...]]] = deque()
        self.counts: dict[bytes | str, int] = {}
        self.getters: list[asyncio.Future[None]] = []
        self.putters: list[asyncio.Future[None]] = []
        self.closed = False
        # Set when the other end of a pair closes: recv drains, then raises.
        self.eof = False

    def has_room(self, source: bytes | str) -> bool:
        return self.max_queue is None or self.counts.get(source, 0) < self.max_queue

    def put(self, source: bytes | str, frames: tuple[bytes, ...]) -> None:
        self.items.append((source, frames))
        self.counts[source] = self.counts.get(source, 0) + 1
        _wake(self.getters)

    async def get(self) -> tuple[bytes | str, tuple[bytes, ...]]:
        while not self.items:
            if self.closed:
                raise ConnectionError("closed")
            if self.eof:
                raise ConnectionResetError("the other end of the pair is closed")
            await _wait(self.getters)
        source, frames = self.items.popleft()
        left = self.counts[source] - 1
        if left:
            self.counts[source] = left
        else:
            del self.counts[source]
        _wake(self.putters)
        return source, frames

    def close(self) -> None:
        self.closed = True
        self.items.clear()
        self.counts.clear()
        _wake(self.getters)
        _wake(self.putters)

    def end_of_stream(self) -> None:
        self.eof = True
        _wake(self.getters)
        _wake(self.putters)


def _copy(frames: Sequence[bytes | memoryview]) -> tuple[bytes, ...]:
    """New ``bytes`` for each frame, so the receiver never shares the sender's memory."""
    if not frames:
        raise ValueError("a message has at least one frame")
    return tuple(memoryview(f).tobytes() for f in frames)


def _check_identity(identity: bytes) -> None:
    # libzmq's rules for a routing id: 1 to 255 bytes, not starting with 0.
    if not isinstance(identity, bytes):
        raise TypeError(f"identity must be bytes, not {type(identity).__name__}")
    if not 0 < len(identity) <= 255 or identity[0] == 0:
        raise ValueError(f"Invalid identity {identity!r} (1 to 255 bytes, first byte not 0)")


class MemoryEndpoint:
    """An :class:`Endpoint` on a :class:`MemoryNetwork` (made by :meth:`~MemoryNetwork.bind`).

    Attributes
    ----------
    address : str
        The bound address.
    """

    def __init__(self, net: MemoryNetwork, address: str, max_queue: int | None) -> None:
        self.address = address
        self._net = net
        self._inbox = _Inbox(max_queue)
        self._stalled: list[asyncio.Future[None]] = []

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._inbox.closed

    @property
    def peers(self) -> frozenset[bytes]:
        """Identities of the connections at this address."""
        return frozenset(self._net._peers.get(self.address, ()))

    @property
    def queued(self) -> int:
        """Messages received and not yet taken by :meth:`recv`."""
        return len(self._inbox.items)

    async def recv(self) -> tuple[bytes, list[memoryview]]:
        """The next message, in arrival order.

        Returns
        -------
        tuple
            The sender's identity and the frames, as read-only memoryviews of
            ``bytes`` that belong to the receiver.

        Raises
        ------
        ConnectionError
            If the endpoint is (or gets) closed.
        """
        source, frames = await self._inbox.get()
        if not isinstance(source, bytes):  # a hand-made packet: deliver() checks it
            raise TypeError(f"packet source {source!r} is not an identity")
        return source, [memoryview(f) for f in frames]

    def user(self, peer: bytes) -> str | None:
        """The name ``peer`` authenticated as (None: not authenticated)."""
        conn = self._net._peers.get(self.address, {}).get(peer)
        return None if conn is None else conn.user

    async def send(self, peer: bytes, frames: Sequence[bytes | memoryview]) -> None:
        """Send one message to one peer.

        The frames are copied when ``send`` is called. If the peer's queue is
        full (its ``max_queue``), ``send`` waits for room.

        Raises
        ------
        PeerGone
            If no connection with identity ``peer`` is connected at this
            address (or it closes while ``send`` waits for room).
        ConnectionError
            If the endpoint is closed.
        """
        data = _copy(frames)
        while True:
            if self.closed:
                raise ConnectionError("closed")
            conn = self._net._peers.get(self.address, {}).get(peer)
            if conn is None:
                raise PeerGone(f"peer {peer!r} is not connected to {self.address}")
            if conn._inbox.has_room(self.address):
                break
            await _wait(conn._inbox.putters, self._stalled)
        self._net._transmit(Packet(self.address, self.address, peer, data))

    def close(self) -> None:
        """Unbind the address; queued messages are lost, pending calls fail.

        Connections stay attached to the address: if another endpoint binds
        it later, they are its peers (as DEALERs reconnect to a restarted
        ROUTER).
        """
        if self.closed:
            return
        self._inbox.close()
        _wake(self._stalled)
        if self._net._endpoints.get(self.address) is self:
            del self._net._endpoints[self.address]


class MemoryConnection:
    """A :class:`Connection` on a :class:`MemoryNetwork`.

    Made by :meth:`~MemoryNetwork.connect` (to an endpoint) or
    :meth:`~MemoryNetwork.pair` (one of two ends).

    Attributes
    ----------
    address : str
        The endpoint's or the pair's address.
    identity : bytes
        This end's identity: what the endpoint's :meth:`~MemoryEndpoint.recv`
        reports and :meth:`~MemoryEndpoint.send` takes.
    """

    def __init__(
        self,
        net: MemoryNetwork,
        address: str,
        identity: bytes,
        max_queue: int | None,
    ) -> None:
        self.address = address
        self.identity = identity
        self._net = net
        self._inbox = _Inbox(max_queue)
        self._stalled: list[asyncio.Future[None]] = []
        self._pair_peer: MemoryConnection | None = None  # for the ends of a pair
        self.user: str | None = None

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._inbox.closed

    @property
    def queued(self) -> int:
        """Messages received and not yet taken by :meth:`recv`."""
        return len(self._inbox.items)

    async def recv(self) -> list[memoryview]:
        """The next message's frames, in arrival order.

        Returns
        -------
        list of memoryview
            Read-only views of ``bytes`` that belong to the receiver.

        Raises
        ------
        ConnectionError
            If this end is (or gets) closed; for an end of a pair, also once
            the other end has closed and every message it sent was received
            (:class:`ConnectionResetError`).
        """
        _, frames = await self._inbox.get()
        return [memoryview(f) for f in frames]

    async def send(self, frames: Sequence[bytes | memoryview]) -> None:
        """Send one message.

        The frames are copied when ``send`` is called. If the receiver's queue
        holds ``max_queue`` messages from this connection, ``send`` waits for
        room. A message to an endpoint that is closed is lost, as it would be
        on ZeroMQ (the network counts it in ``dropped``).

        Raises
        ------
        ConnectionError
            If this end is closed.
        BrokenPipeError
            If this is an end of a pair whose other end is closed.
        """
        data = _copy(frames)
        net = self._net
        while True:
            if self.closed:
                raise ConnectionError("closed")
            peer = self._pair_peer
            if peer is not None:
                if peer.closed:
                    raise BrokenPipeError(f"the other end of the pair {self.address} is closed")
                inbox: _Inbox | None = peer._inbox
            else:
                endpoint = net._endpoints.get(self.address)
                inbox = None if endpoint is None else endpoint._inbox
            if inbox is None or inbox.closed or inbox.has_room(self.identity):
                break
            await _wait(inbox.putters, self._stalled)
        destination = peer.identity if peer is not None else self.address
        net._transmit(Packet(self.address, self.identity, destination, data))

    def close(self) -> None:
        """Disconnect: the identity is free again and sends to it raise :class:`PeerGone`.

        Queued messages are lost and pending calls on this end fail with
        :class:`ConnectionError`. The other end of a pair first receives
        what was sent to it, then gets :class:`ConnectionResetError`.
        """
        if self.closed:
            return
        self._inbox.close()
        _wake(self._stalled)
        net = self._net
        peer = self._pair_peer
        if peer is None:
            peers = net._peers.get(self.address)
            if peers is not None and peers.get(self.identity) is self:
                del peers[self.identity]
                if not peers:
                    del net._peers[self.address]
            return
        peer._inbox.end_of_stream()
        _wake(peer._stalled)
        if peer.closed and net._pairs.get(self.address, {}).get(self.identity) is self:
            del net._pairs[self.address]


class MemoryNetwork:
    """Endpoints and connections in one process, with scriptable faults.

    Every :meth:`~MemoryConnection.send` copies the frames into new ``bytes``,
    makes a :class:`Packet`, counts it (:attr:`sent`, :attr:`bytes_sent`) and
    hands it to :attr:`route`; the default route (``None``) calls
    :meth:`deliver`, which appends it to the receiver's queue. Messages are
    thus received in the order they were sent, per sender.

    Attributes
    ----------
    route : callable or None
        Called with each packet sent, in the sender's task, instead of
        :meth:`deliver` (trio's ``FakeNet.route_packet``). To drop a packet,
        do nothing; to duplicate it, deliver it twice; to delay it, schedule
        the delivery, e.g. ``loop.call_later(0.5, net.deliver, packet)``
        (virtual seconds on a :class:`VirtualTimeLoop`). An exception raised
        by the route is raised by ``send``.
    sent : int
        Packets sent (handed to the route).
    bytes_sent : int
        Bytes in those packets' frames.
    delivered : int
        Packets :meth:`deliver` queued for a receiver.
    dropped : int
        Packets :meth:`deliver` found no open receiver for.

    Notes
    -----
    ``max_queue`` bounds, per sender, the messages a receiver holds before
    ``send`` waits (back-pressure, like a ZeroMQ high-water mark; a ROUTER
    with mandatory routing would rather fail, a DEALER waits). Only ``send``
    waits: :meth:`deliver` always queues, so packets a route duplicates or
    delays may exceed the bound.

    Unlike ZeroMQ, :meth:`connect` fails at once when nothing is bound at the
    address, and so does a second connection with an identity already
    connected (libzmq would silently ignore it).

    Examples
    --------
    >>> async def main() -> tuple[bytes, bytes]:
    ...     net = MemoryNetwork()
    ...     server = net.bind("tcp://server")
    ...     host = net.connect("tcp://server", b"host-1")
    ...     await host.send([b"hello"])
    ...     peer, frames = await server.recv()
    ...     await server.send(peer, [b"welcome"])
    ...     (reply,) = await host.recv()
    ...     net.close()
    ...     return peer, bytes(reply)
    >>> run_virtual(main())
    (b'host-1', b'welcome')
    """

    def __init__(self) -> None:
        self.route: Callable[[Packet], None] | None = None
        self.sent = 0
        self.bytes_sent = 0
        self.delivered = 0
        self.dropped = 0
        self._endpoints: dict[str, MemoryEndpoint] = {}
        self._peers: dict[str, dict[bytes, MemoryConnection]] = {}
        self._pairs: dict[str, dict[bytes, MemoryConnection]] = {}

    def _check_free(self, address: str) -> None:
        if address in self._endpoints or address in self._pairs:
            raise OSError(errno.EADDRINUSE, f"address already in use: {address}")

    def bind(self, address: str, *, max_queue: int | None = None) -> MemoryEndpoint:
        """Bind an endpoint at ``address``.

        Parameters
        ----------
        address : str
            Any string (``"tcp://server:5555"``); one namespace with pairs.
        max_queue : int or None
            Messages the endpoint holds per peer before that peer's ``send``
            waits (default: unbounded).

        Raises
        ------
        OSError
            ``EADDRINUSE`` if an open endpoint or pair has the address.
        """
        self._check_free(address)
        endpoint = MemoryEndpoint(self, address, max_queue)
        self._endpoints[address] = endpoint
        return endpoint

    def connect(
        self, address: str, identity: bytes, *, max_queue: int | None = None,
        user: str | None = None,
    ) -> MemoryConnection:
        """Connect to the endpoint bound at ``address``, as ``identity``.

        Parameters
        ----------
        address : str
            A bound address.
        identity : bytes
            The connection's identity at the endpoint (1 to 255 bytes, the
            first not zero, as for libzmq).
        max_queue : int or None
            Messages the connection holds before the endpoint's ``send`` to
            it waits (default: unbounded).
        user : str or None
            The name the connection authenticated as (what a CURVE
            handshake's ZAP handler gives libzmq's ``User-Id``), reported by
            :meth:`MemoryEndpoint.user`.

        Raises
        ------
        ConnectionRefusedError
            If no endpoint is bound at ``address``.
        ConnectionError
            If a connection with ``identity`` is already connected there.
        """
        _check_identity(identity)
        if address not in self._endpoints:
            raise ConnectionRefusedError(
                errno.ECONNREFUSED, f"connection refused: nothing is bound at {address}"
            )
        peers = self._peers.setdefault(address, {})
        if identity in peers:
            raise ConnectionError(f"identity {identity!r} is already connected to {address}")
        conn = MemoryConnection(self, address, identity, max_queue)
        conn.user = user
        peers[identity] = conn
        return conn

    def pair(
        self,
        address: str,
        *,
        identities: tuple[bytes, bytes] = (b"parent", b"worker"),
        max_queue: int | None = None,
    ) -> tuple[MemoryConnection, MemoryConnection]:
        """Two connected ends (a parent and its worker).

        Parameters
        ----------
        address : str
            The pair's address (in packets); free again once both ends close.
        identities : tuple of bytes
            The two ends' identities, the sources and destinations of their
            packets.
        max_queue : int or None
            Messages each end holds before the other's ``send`` waits.

        Raises
        ------
        OSError
            ``EADDRINUSE`` if an open endpoint or pair has the address.
        """
        self._check_free(address)
        first, second = identities
        _check_identity(first)
        _check_identity(second)
        if first == second:
            raise ValueError(f"the ends of a pair need two identities, not {first!r} twice")
        a = MemoryConnection(self, address, first, max_queue)
        b = MemoryConnection(self, address, second, max_queue)
        a._pair_peer, b._pair_peer = b, a
        self._pairs[address] = {first: a, second: b}
        return a, b

    def deliver(self, packet: Packet) -> bool:
        """Queue a packet for its destination (the default route).

        Returns
        -------
        bool
            True if delivered; False if the destination is not open (the
            packet is counted in :attr:`dropped`).

        Raises
        ------
        ValueError
            If the packet names its endpoint inconsistently.
        """
        inbox: _Inbox | None = None
        ends = self._pairs.get(packet.address)
        if ends is not None:
            if isinstance(packet.destination, bytes):
                end = ends.get(packet.destination)
                inbox = None if end is None else end._inbox
        elif isinstance(packet.destination, str):
            if packet.destination != packet.address or not isinstance(packet.source, bytes):
                raise ValueError(f"a packet to an endpoint comes from an identity: {packet!r}")
            endpoint = self._endpoints.get(packet.address)
            inbox = None if endpoint is None else endpoint._inbox
        else:
            conn = self._peers.get(packet.address, {}).get(packet.destination)
            inbox = None if conn is None else conn._inbox
        if inbox is None or inbox.closed:
            self.dropped += 1
            return False
        inbox.put(packet.source, packet.frames)
        self.delivered += 1
        return True

    def close(self) -> None:
        """Close every endpoint, connection and pair end of this network."""
        for endpoint in list(self._endpoints.values()):
            endpoint.close()
        for peers in list(self._peers.values()):
            for conn in list(peers.values()):
                conn.close()
        for ends in list(self._pairs.values()):
            for end in list(ends.values()):
                end.close()

    def _transmit(self, packet: Packet) -> None:
        self.sent += 1
        self.bytes_sent += packet.size
        route = self.route
        if route is None:
            self.deliver(packet)
        else:
            route(packet)
