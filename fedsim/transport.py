"""ZeroMQ sockets on asyncio: one context per process, strict cleanup.

The server binds a ROUTER; every client actor owns its own DEALER (one
connection per device, as a real deployment has), with its client id as the
routing id. Frames go out with ``copy=False`` and come back as
``zmq.Frame`` objects whose buffers :func:`fedsim.wire.decode` views without
copying.

Cleanup follows pyzmq's advice and the loss measured here
(MEASUREMENTS.md §1): sockets close with an explicit linger and the context
is terminated before a process exits, or the last messages are silently
lost.
"""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import tempfile
from collections.abc import Sequence
from typing import Any

import zmq
import zmq.asyncio

__all__ = [
    "MAX_MESSAGE_BYTES",
    "Transport",
    "ipc_address",
    "raise_fd_limit",
]

log = logging.getLogger(__name__)

#: Hard cap for one inbound frame, enforced by libzmq (the codec's own
#: ``max_bytes`` check rejects smaller oversize messages with a logged reason).
MAX_MESSAGE_BYTES = 1 << 31


def raise_fd_limit(wanted: int = 65536) -> int:
    """Raise RLIMIT_NOFILE toward ``wanted`` (each socket costs a few fds)."""
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


class Transport:
    """Owns this process's ZeroMQ context and every socket made from it.

    Parameters
    ----------
    max_sockets : int
        ZMQ_MAX_SOCKETS for the context (libzmq's default is 1023; a host of
        10,000 clients needs one socket each).
    """

    def __init__(self, max_sockets: int = 1024) -> None:
        raise_fd_limit(2 * max_sockets + 256)
        self.ctx = zmq.asyncio.Context()
        self.ctx.setsockopt(zmq.LINGER, 0)
        with contextlib.suppress(zmq.ZMQError):
            self.ctx.set(zmq.MAX_SOCKETS, max(1024, max_sockets + 64))
        self._sockets: list[zmq.asyncio.Socket] = []
        self.closed = False

    def _socket(self, kind: int) -> zmq.asyncio.Socket:
        sock = self.ctx.socket(kind)
        sock.setsockopt(zmq.SNDHWM, 0)  # never drop: emulated loss is netem's job
        sock.setsockopt(zmq.RCVHWM, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        self._sockets.append(sock)
        return sock

    def router(self, address: str) -> tuple[zmq.asyncio.Socket, str]:
        """Bind a ROUTER; ``tcp://host:0`` picks a free port. Returns the bound address."""
        sock = self._socket(zmq.ROUTER)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # unknown peer -> error, not silence
        if address.startswith("tcp://") and address.endswith(":0"):
            port = sock.bind_to_random_port(address.rsplit(":", 1)[0])
            address = f"{address.rsplit(':', 1)[0]}:{port}"
        else:
            sock.bind(address)
        return sock, address

    def dealer(self, address: str, identity: bytes) -> zmq.asyncio.Socket:
        """Connect a DEALER with the given routing id."""
        sock = self._socket(zmq.DEALER)
        sock.setsockopt(zmq.ROUTING_ID, identity)
        sock.setsockopt(zmq.RECONNECT_IVL, 50)
        sock.connect(address)
        return sock

    def pair(self, address: str, *, bind: bool) -> zmq.asyncio.Socket:
        """A PAIR socket, for a process and its private worker."""
        sock = self._socket(zmq.PAIR)
        if bind:
            sock.bind(address)
        else:
            sock.connect(address)
        return sock

    def close_socket(self, sock: zmq.asyncio.Socket, linger_ms: int = 0) -> None:
        """Close one socket (pending outbound messages wait up to ``linger_ms``)."""
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


async def send(sock: zmq.asyncio.Socket, frames: Sequence[Any]) -> None:
    """Send a multipart message without copying tensor buffers."""
    await sock.send_multipart(frames, copy=False)
