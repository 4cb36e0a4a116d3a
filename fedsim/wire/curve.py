"""CURVE authentication: the server's and hosts' keys, and the ZAP handler that
admits only allow-listed client keys.

With :class:`ServerKeys` the ROUTER is a CURVE server and this process runs
a ZAP handler (:class:`ZapHandler`, RFC 27) that admits a client key only
if it is on the allow-list, and tells libzmq the name the key belongs to
(its ``User-Id``). :meth:`fedsim.wire.transport.ZmqEndpoint.user` reports that name for each peer,
so the server knows *who* sent a message from the handshake, not from
anything the peer chose (its routing id, a field of the message). A refused
key gets no reply at all: libzmq closes the connection before one byte of a
message is read. Every refused key (from the ZAP handler, with the peer's
address and the key) and every other failed handshake (a peer without
CURVE, a wrong server key, a handshake timeout: from the socket monitor,
with the peer's address read from the accepted socket) is reported once
through ``on_refused``.

Keys are made, stored and loaded by :mod:`fedsim.deploy.keys`; the sockets
that use them are :mod:`fedsim.wire.transport`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import zmq
import zmq.utils.z85

from fedsim.wire._zmqsocket import LoopSocket

__all__ = ["ZAP_DENIED", "ZAP_OK", "ClientKeys", "ServerKeys", "ZapHandler"]


@dataclass(frozen=True)
class ServerKeys:
    """The server's CURVE key pair and the allow-list of client host keys.

    Keys are Z85 text (40 characters), as ``zmq.curve_keypair`` makes them.
    ``allowed`` maps a host's public key to its name.
    """

    public: bytes
    secret: bytes = field(repr=False)
    allowed: Mapping[bytes, str]


@dataclass(frozen=True)
class ClientKeys:
    """A client host's CURVE key pair and the server's public key."""

    public: bytes
    secret: bytes = field(repr=False)
    server: bytes


#: ZAP status codes (RFC 27)
ZAP_OK, ZAP_DENIED = b"200", b"400"


class ZapHandler:
    """A ZAP handler: admits a CURVE client key only if it is on the allow-list."""

    def __init__(self, ctx: zmq.Context[Any], allowed: Mapping[bytes, str],
                 on_refused: Callable[[str, str, str], None]) -> None:
        self.allowed = {zmq.utils.z85.decode(k): name for k, name in allowed.items()}
        self.on_refused = on_refused
        sock = ctx.socket(zmq.REP)
        sock.setsockopt(zmq.LINGER, 0)
        sock.bind("inproc://zeromq.zap.01")
        self.sock = LoopSocket(sock)
        self.task = asyncio.ensure_future(self._serve())

    async def _serve(self) -> None:
        with contextlib.suppress(asyncio.CancelledError, ConnectionError, zmq.ZMQError):
            while True:
                req = [f.bytes for f in await self.sock.recv()]
                reply = self._answer(req)
                await self.sock.send(reply)

    def _answer(self, req: list[bytes]) -> list[bytes]:
        if len(req) < 6 or req[0] != b"1.0":
            rid = req[1] if len(req) > 1 else b""
            return [b"1.0", rid, b"500", b"malformed ZAP request", b"", b""]
        rid, address, mechanism = req[1], req[3].decode(errors="replace"), req[5]
        key = req[6] if len(req) > 6 else b""
        name = self.allowed.get(key) if mechanism == b"CURVE" else None
        if name is None:
            why = (f"{mechanism.decode(errors='replace')} key "
                   f"{zmq.utils.z85.encode(key).decode() if len(key) == 32 else '?'} "
                   "is not on the allow-list")
            self.on_refused(address or "local", "unauthenticated", why)
            return [b"1.0", rid, ZAP_DENIED, b"key not allowed", b"", b""]
        return [b"1.0", rid, ZAP_OK, b"OK", name.encode(), b""]

    def close(self) -> None:
        self.task.cancel()
        self.sock.close(0)
