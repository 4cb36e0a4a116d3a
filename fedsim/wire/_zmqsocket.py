"""A pyzmq socket driven by the running event loop, without a future per message.

:class:`LoopSocket` is what :mod:`fedsim.wire.transport`'s connections and
endpoints are made of: it watches the socket's ``ZMQ_FD`` with the loop's
``add_reader``, reads every waiting message into an inbox at once, and
makes a future only when a receive (or a send at the high-water mark) has
to wait. Measured with ``python tools/bench_wire.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Sequence
from typing import Any, cast

import zmq

__all__ = ["READ_AHEAD", "LoopSocket"]

log = logging.getLogger(__name__)

#: Messages a socket reads ahead of ``recv`` (beyond it they stay in libzmq, under ``HWM``).
READ_AHEAD = 64


def _wake_first(waiters: deque[asyncio.Future[None]]) -> bool:
    """Wake the first waiter that still waits; False if there is none."""
    while waiters:
        fut = waiters.popleft()
        if not fut.done():
            fut.set_result(None)
            return True
    return False


class LoopSocket:
    """A pyzmq socket read and written from the running event loop, a future only to wait.

    ``ZMQ_FD`` is edge-triggered: it becomes readable when libzmq's state
    *may* have changed, and any call on the socket (an ``EVENTS`` read, a
    send, a receive) may consume that signal. So every call here ends in
    :meth:`_pump`, which reads ``EVENTS`` and reads messages until
    ``POLLIN`` is gone (or :data:`READ_AHEAD` messages wait in
    :attr:`inbox`, then :meth:`recv` pumps again as it takes one): the loop
    never sleeps on a signal that was already consumed. Ending on an
    ``EVENTS`` read also matters to libzmq itself: only a reader that found
    its queue empty is signalled for the next message (a blocking receive
    that returns a message does not leave it so). Hence every call on
    :attr:`sock` goes through this class, or is followed by :meth:`_pump`.

    A message is only ever taken from :attr:`inbox` by :meth:`recv` itself,
    after its wait (if any) is over, so a receive cancelled at any point
    loses nothing.
    """

    __slots__ = ("_fd", "_full", "_getters", "_loop", "_putters", "closed", "inbox", "sock")

    def __init__(self, sock: zmq.Socket[Any]) -> None:
        self.sock = sock
        self.inbox: deque[list[zmq.Frame]] = deque()
        self.closed = False
        self._fd = sock.FD
        self._full = False  # stopped reading with POLLIN still set: READ_AHEAD were waiting
        self._loop: asyncio.AbstractEventLoop | None = None
        self._getters: deque[asyncio.Future[None]] = deque()
        self._putters: deque[asyncio.Future[None]] = deque()

    def _attach(self) -> asyncio.AbstractEventLoop:
        """The running loop, watching this socket's FD (registered on first use)."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._detach()
            loop.add_reader(self._fd, self._readable)
            self._loop = loop
            self._pump()  # the signal may have been consumed before anyone watched
        return loop

    def _detach(self) -> None:
        if self._loop is not None:
            with contextlib.suppress(Exception):  # a closed loop has forgotten it anyway
                self._loop.remove_reader(self._fd)
            self._loop = None

    def _readable(self) -> None:
        """The FD watcher: most often a message is there, so read before asking EVENTS."""
        if self.closed:
            return
        if len(self.inbox) < READ_AHEAD:
            try:
                self.inbox.append(self.sock.recv_multipart(zmq.NOBLOCK, copy=False))
            except zmq.Again:
                pass
            except zmq.ZMQError as exc:
                self._failed(exc)
                return
        self._pump()

    def _failed(self, exc: zmq.ZMQError) -> None:
        log.debug("a socket failed while reading: %s", exc)
        self.close(0)

    def disconnect(self, address: str) -> None:
        """Stop connecting to ``address`` (an address it is not connected to is ignored)."""
        if not self.closed:
            with contextlib.suppress(zmq.ZMQError):
                self.sock.disconnect(address)
            self._pump()

    def _pump(self) -> None:
        """Read what libzmq holds (up to READ_AHEAD waiting) and wake whoever it is for.

        The end of every call on the socket, and of the FD watcher.
        """
        if self.closed:
            return
        sock, inbox = self.sock, self.inbox
        try:
            while True:
                events = cast(int, sock.get(zmq.EVENTS))
                if not events & zmq.POLLIN:
                    self._full = False
                    break
                if len(inbox) >= READ_AHEAD:
                    self._full = True
                    break
                try:
                    frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:  # cannot happen after POLLIN: read EVENTS again
                    continue
                inbox.append(frames)
        except zmq.ZMQError as exc:  # the context is gone (ETERM) or the socket closed
            self._failed(exc)
            return
        for _ in range(len(inbox)):
            if not _wake_first(self._getters):
                break
        if events & zmq.POLLOUT and self._putters:
            _wake_first(self._putters)

    async def recv(self) -> list[zmq.Frame]:
        """The next message's frames (``zmq.Frame``, not copied).

        Raises ConnectionError once the socket is closed (also while waiting).
        """
        if not self.inbox:
            if self.closed:
                raise ConnectionError("closed")
            loop = self._attach()
            while not self.inbox:
                if self.closed:
                    raise ConnectionError("closed")
                fut = loop.create_future()
                self._getters.append(fut)
                try:
                    await fut
                except BaseException:
                    fut.cancel()
                    with contextlib.suppress(ValueError):
                        self._getters.remove(fut)
                    if self.inbox and not fut.cancelled():  # woken, then cancelled: pass it on
                        _wake_first(self._getters)
                    raise
        frames = self.inbox.popleft()
        if self._full:
            self._pump()
        return frames

    async def send(self, frames: Sequence[bytes | memoryview | zmq.Frame]) -> None:
        """Send one message: at once unless the high-water mark is reached, then in turn.

        Raises ConnectionError once the socket is closed (also while waiting)
        and ``zmq.ZMQError`` for what libzmq refuses (``EHOSTUNREACH``...).
        """
        if self.closed:
            raise ConnectionError("closed")
        parts = list(frames)
        woken = False
        while True:
            if woken or not self._putters:  # others waiting go first
                try:
                    self.sock.send_multipart(parts, zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    pass
                except BaseException:  # EHOSTUNREACH...: it may have consumed a signal too
                    self._pump()
                    raise
                else:
                    self._pump()
                    return
            # at the high-water mark: wait for POLLOUT, in turn
            loop = asyncio.get_running_loop()
            fut = loop.create_future()
            if woken:
                self._putters.appendleft(fut)  # it was first: keep its place
            else:
                self._putters.append(fut)
            self._attach()
            self._pump()  # the failed send may have consumed a signal (POLLIN or POLLOUT)
            try:
                await fut
            except BaseException:
                fut.cancel()
                with contextlib.suppress(ValueError):
                    self._putters.remove(fut)
                if not fut.cancelled():  # woken, then cancelled: pass it on
                    _wake_first(self._putters)
                raise
            if self.closed:
                raise ConnectionError("closed")
            woken = True

    def close(self, linger_ms: int) -> None:
        """Close the socket: waiting calls raise ConnectionError, messages read ahead are lost."""
        if self.closed:
            return
        self.closed = True
        self._detach()
        self.inbox.clear()
        for waiters in (self._getters, self._putters):
            while waiters:
                fut = waiters.popleft()
                if not fut.done():
                    with contextlib.suppress(RuntimeError):  # its loop is closed
                        fut.set_result(None)
        if not self.sock.closed:
            self.sock.close(linger=linger_ms)
