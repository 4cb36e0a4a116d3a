"""ZeroMQ sockets on asyncio, behind two small interfaces the actors use.

Connection model
----------------
A client host speaks for all of its clients over **one** connection to the
server: one DEALER per host, one ROUTER at the server. Every client message
carries its client id, and the server accepts it only from the host that
registered that id (:mod:`fedsim.actors.hosts`). Control traffic (hello,
start, event batches, stop, bye) shares the connection and bypasses the
emulated network; client traffic goes through each client's emulated link
on the receiving side, so the real connection's own timing is hidden inside
the emulated delay. One connection per host, not per client, is what lets
10,000 idle clients cost kilobytes each instead of libzmq's tens of
kilobytes per connection, and it is the unit an authenticated host (CURVE
key) is allowed to speak for: a range of client ids.

Interfaces
----------
:class:`Endpoint` (the server's ROUTER: many peers, each with an identity)
and :class:`Connection` (a host's DEALER, or the PAIR between a process and
its torch worker). :mod:`fedsim.testing` implements both in memory, so the
actors run in-process on virtual time in tests.

Bounds
------
* ``MAXMSGSIZE`` (``deploy.max_message_mb``) is enforced by libzmq while a
  message is decoded, before it is buffered: an oversize message makes
  libzmq drop the connection, and nothing else. :class:`ZmqEndpoint` watches
  the socket monitor and counts every disconnect (``disconnects``); the
  server logs each one of a peer that had not said goodbye, so a refusal is
  never silent.
* High-water marks bound the queues at ``HWM`` messages per peer. The server
  sends at most one task per client in flight plus broadcasts, and a host's
  clients are bounded by the scenario, so the bound is never reached in a
  healthy run; when it is, a send waits (DEALER) or fails with
  :class:`PeerGone` (ROUTER, mandatory routing) instead of dropping silently.

Cleanup follows pyzmq's advice: sockets close with an explicit linger and
the context is terminated before a process exits, or the last messages are
lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
import tempfile
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

__all__ = [
    "HWM",
    "Connection",
    "Endpoint",
    "PeerGone",
    "ZmqConnection",
    "ZmqContext",
    "ZmqEndpoint",
    "cleanup_ipc",
    "ipc_address",
    "raise_fd_limit",
]

log = logging.getLogger(__name__)

#: Messages queued per peer and direction before a send waits or fails.
HWM = 10_000


class PeerGone(ConnectionError):
    """A send to a peer that is not (or no longer) connected."""


@runtime_checkable
class Endpoint(Protocol):
    """The server side: many peers, each known by its identity."""

    address: str

    async def recv(self) -> tuple[bytes, list[Any]]:
        """The next message: (peer identity, frames)."""
        ...

    async def send(self, peer: bytes, frames: Sequence[bytes | memoryview]) -> None:
        """Send to one peer; :class:`PeerGone` if it is not connected."""
        ...

    def close(self) -> None:
        """Stop receiving and sending."""
        ...


@runtime_checkable
class Connection(Protocol):
    """One end of a connection to a single peer."""

    async def recv(self) -> list[Any]:
        """The next message's frames."""
        ...

    async def send(self, frames: Sequence[bytes | memoryview]) -> None:
        """Send one message."""
        ...

    def close(self) -> None:
        """Close this end."""
        ...


def raise_fd_limit(wanted: int = 65536) -> int:
    """Raise RLIMIT_NOFILE toward ``wanted``."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = min(max(soft, wanted), hard)
    if target > soft:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            return target
    return soft


def ipc_address(run_id: str, name: str) -> str:
    """A short ipc:// endpoint path (Unix socket paths are limited to ~107 bytes)."""
    base = os.environ.get("FEDSIM_IPC_DIR", tempfile.gettempdir())
    return f"ipc://{os.path.join(base, f'fedsim-{run_id}-{name}')}"


def cleanup_ipc(run_id: str) -> None:
    """Remove the ipc socket files of a run (libzmq leaves them behind)."""
    base = os.environ.get("FEDSIM_IPC_DIR", tempfile.gettempdir())
    prefix = f"fedsim-{run_id}-"
    with contextlib.suppress(OSError):
        for name in os.listdir(base):
            if name.startswith(prefix):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(base, name))


class ZmqContext:
    """This process's ZeroMQ context and every socket made from it."""

    def __init__(self, max_message_bytes: int = -1) -> None:
        raise_fd_limit()
        self.ctx = zmq.asyncio.Context()
        self.ctx.setsockopt(zmq.LINGER, 0)
        self.max_message_bytes = max_message_bytes
        self._sockets: list[zmq.asyncio.Socket] = []
        self.closed = False

    def socket(self, kind: int) -> zmq.asyncio.Socket:
        sock = self.ctx.socket(kind)
        sock.setsockopt(zmq.SNDHWM, HWM)
        sock.setsockopt(zmq.RCVHWM, HWM)
        if self.max_message_bytes > 0:
            sock.setsockopt(zmq.MAXMSGSIZE, self.max_message_bytes)
        self._sockets.append(sock)
        return sock

    def endpoint(self, address: str) -> ZmqEndpoint:
        """Bind a ROUTER at ``address`` (``tcp://host:0`` picks a free port)."""
        return ZmqEndpoint(self, address)

    def connect(self, address: str, identity: bytes) -> ZmqConnection:
        """Connect a DEALER with routing id ``identity``."""
        sock = self.socket(zmq.DEALER)
        sock.setsockopt(zmq.ROUTING_ID, identity)
        sock.setsockopt(zmq.RECONNECT_IVL, 50)
        sock.connect(address)
        return ZmqConnection(self, sock)

    def pair(self, address: str, *, bind: bool) -> ZmqConnection:
        """A PAIR socket, for a process and its private worker."""
        sock = self.socket(zmq.PAIR)
        if bind:
            sock.bind(address)
        else:
            sock.connect(address)
        return ZmqConnection(self, sock)

    def forget(self, sock: zmq.asyncio.Socket, linger_ms: int = 0) -> None:
        if not sock.closed:
            sock.close(linger=linger_ms)
        with contextlib.suppress(ValueError):
            self._sockets.remove(sock)

    def close(self, linger_ms: int = 500) -> None:
        """Close every socket with ``linger_ms`` and terminate the context."""
        if self.closed:
            return
        self.closed = True
        for sock in self._sockets:
            if not sock.closed:
                sock.close(linger=linger_ms)
        self._sockets.clear()
        self.ctx.term()


class ZmqConnection:
    """A DEALER or PAIR socket as a :class:`Connection`."""

    def __init__(self, owner: ZmqContext, sock: zmq.asyncio.Socket) -> None:
        self.owner = owner
        self.sock = sock

    async def recv(self) -> list[Any]:
        frames: list[Any] = await self.sock.recv_multipart(copy=False)
        return frames

    async def send(self, frames: Sequence[bytes | memoryview]) -> None:
        await self.sock.send_multipart(list(frames), copy=False)

    def close(self, linger_ms: int = 200) -> None:
        self.owner.forget(self.sock, linger_ms)


class ZmqEndpoint:
    """A ROUTER socket as an :class:`Endpoint`, with a monitor counting disconnects.

    libzmq refuses a message over ``MAXMSGSIZE`` by dropping its connection
    (it never buffers it); ``disconnects`` counts every dropped connection,
    and ``on_disconnect`` (if set) is called for each.
    """

    def __init__(self, owner: ZmqContext, address: str) -> None:
        self.owner = owner
        sock = owner.socket(zmq.ROUTER)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # unknown peer -> error, not silence
        if address.startswith("tcp://") and address.endswith(":0"):
            host = address.rsplit(":", 1)[0]
            address = f"{host}:{sock.bind_to_random_port(host)}"
        else:
            sock.bind(address)
        self.sock = sock
        self.address = address
        self.disconnects = 0
        self.on_disconnect: Any = None
        self._monitor_sock = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        self._monitor = asyncio.ensure_future(self._watch())

    async def _watch(self) -> None:
        with contextlib.suppress(asyncio.CancelledError, zmq.ZMQError):
            while True:
                msg = parse_monitor_message(await self._monitor_sock.recv_multipart())
                if msg["event"] == zmq.EVENT_DISCONNECTED:
                    self.disconnects += 1
                    if self.on_disconnect is not None:
                        self.on_disconnect()

    async def recv(self) -> tuple[bytes, list[Any]]:
        frames = await self.sock.recv_multipart(copy=False)
        return frames[0].bytes, frames[1:]

    async def send(self, peer: bytes, frames: Sequence[bytes | memoryview]) -> None:
        try:
            await self.sock.send_multipart([peer, *frames], copy=False)
        except zmq.ZMQError as exc:
            if exc.errno == zmq.EHOSTUNREACH:
                raise PeerGone(f"peer {peer!r} is not connected") from None
            raise

    def close(self) -> None:
        self._monitor.cancel()
        with contextlib.suppress(zmq.ZMQError):
            self.sock.disable_monitor()
        self.owner.forget(self._monitor_sock)
        self.owner.forget(self.sock, 500)
