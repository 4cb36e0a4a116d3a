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
its torch worker). :mod:`fedsim.testing.memory_network` implements both in memory, so the
actors run in-process on virtual time in tests.

Bounds
------
* ``MAXMSGSIZE`` (``deploy.max_message_mb``, by default derived from the
  scenario's model: :func:`fedsim.wire.codec.max_message_bytes`) bounds every
  frame a peer sends to the server's ROUTER or a host's DEALER; libzmq
  checks it from the frame's length prefix, before it buffers a byte, and
  drops the connection. The private PAIR sockets to a process's own workers
  carry no such bound. :class:`ZmqEndpoint` watches the socket monitor and
  counts every drop of an established connection (``disconnects``); the
  server logs and counts each one of a peer that had not said goodbye, so a
  refusal is never silent.
* ``HANDSHAKE_IVL`` (``deploy.handshake_timeout``): a connection that has
  not completed its ZMTP (and CURVE) handshake that long after it was
  accepted is closed by libzmq and reported as a failed handshake. An idle
  TCP connection costs the server about 55 KB of libzmq buffers.
* High-water marks bound the queues at ``HWM`` messages per peer, and a
  socket reads at most :data:`READ_AHEAD` messages ahead of its receiver.
  The server sends at most one task per client in flight plus broadcasts,
  and a host's clients are bounded by the scenario, so the bound is never
  reached in a healthy run; when it is, a send waits until the peer has
  room (a ROUTER's too: with mandatory routing libzmq refuses a full peer
  with EAGAIN) instead of dropping silently. A send to a peer that is not
  connected fails with :class:`PeerGone`.

Authentication
--------------
With :class:`~fedsim.wire.curve.ServerKeys` the ROUTER is a CURVE server whose
ZAP handler (:mod:`fedsim.wire.curve`) admits only allow-listed client keys;
:meth:`ZmqEndpoint.user` reports the name of each peer's key, and every
refused key or failed handshake is reported once through ``on_refused``.

Routing ids are the server's
----------------------------
A host's DEALER sets no routing id: the ROUTER gives each connection its
own (5 bytes, the first 0, from a counter that starts at a random value).
libzmq gives a routing id to the first connection that claims it and
ignores a later one before the application sees it, so a peer that chose
another host's id would lock that host out; no fedsim host chooses one.
:meth:`ZmqEndpoint.assigned` tells an id libzmq assigned from one a peer
chose (the server refuses messages from the latter). A host that
reconnects gets a new id, and registers again over it (its key, not its
id, says who it is). The ZAP handler cannot refuse a chosen id instead: in
libzmq 4.3 its request carries the *server's* routing id, not the peer's.

The host's side
---------------
:meth:`ZmqContext.connect` with ``on_state`` watches the DEALER's monitor:
``connected`` (a handshake succeeded; again after a reconnection),
``disconnected``, and ``refused`` with the cause: the server's ZAP handler
refused the key (``HANDSHAKE_FAILED_AUTH``), or handshakes keep failing
(a wrong server key, or one side without CURVE). A host learns in
milliseconds what it learned from a timeout before.

Reading and writing without a future per message
-------------------------------------------------

Sockets are plain pyzmq sockets driven by the event loop (:class:`LoopSocket`),
not ``zmq.asyncio`` ones, which make a future and a done callback for
every message, schedule extra loop callbacks and read ``EVENTS`` several
times a message. The loop watches
each socket's ``ZMQ_FD``; when it is readable, every waiting message (up to
:data:`READ_AHEAD`) is read at once with ``NOBLOCK`` into a deque, and
``recv`` takes from the deque, making a future only when it is empty. A
send is tried with ``NOBLOCK`` first and waits only at the high-water mark.
One 100 KB message over tcp loopback took 1.64x (host to server) and 1.45x
(server to host) the time of raw blocking pyzmq on ``zmq.asyncio``; this
way it takes about 1.07x and 1.00x, mostly the event loop's wake-up, and
1.00x at 10 MB (``python tools/bench_wire.py``, uvloop; the figures and
their conditions are in docs/benchmarks.md).

Local sockets
-------------
ipc endpoints live in Linux's abstract socket namespace (``ipc://@name``):
nothing is created on disk, so a killed run leaves no socket file behind.

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
import socket
import time
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import zmq
import zmq.utils.z85
from zmq.utils.monitor import parse_monitor_message

from fedsim.wire._zmqsocket import READ_AHEAD, LoopSocket
from fedsim.wire.codec import Frames
from fedsim.wire.curve import ClientKeys, ServerKeys, ZapHandler

__all__ = [
    "HWM",
    "READ_AHEAD",
    "Connection",
    "Endpoint",
    "PeerGone",
    "ZmqConnection",
    "ZmqContext",
    "ZmqEndpoint",
    "assigned",
    "ipc_address",
    "is_loopback",
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

    async def recv(self) -> tuple[bytes, Frames]:
        """The next message: (peer identity, frames)."""
        ...

    async def send(self, peer: bytes, frames: Frames) -> None:
        """Send to one peer; :class:`PeerGone` if it is not connected."""
        ...

    def user(self, peer: bytes) -> str | None:
        """The name ``peer`` authenticated as (its key's entry), None without authentication."""
        ...

    def close(self) -> None:
        """Stop receiving and sending: waiting and later calls raise ConnectionError."""
        ...


@runtime_checkable
class Connection(Protocol):
    """One end of a connection to a single peer."""

    async def recv(self) -> Frames:
        """The next message's frames."""
        ...

    async def send(self, frames: Frames) -> None:
        """Send one message."""
        ...

    def close(self) -> None:
        """Close this end: waiting and later calls raise ConnectionError."""
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
    """An ipc:// endpoint in the abstract socket namespace: no file, nothing left behind."""
    return f"ipc://@fedsim-{run_id}-{name}"


def is_loopback(address: str) -> bool:
    """Whether ``address`` (a zmq endpoint) is reachable only from this machine."""
    if address.startswith(("ipc://", "inproc://")):
        return True
    host = address.removeprefix("tcp://").rsplit(":", 1)[0].strip("[]")
    return host in ("localhost", "::1") or host.startswith("127.")


#: Frames below this many bytes are copied into libzmq on send, larger ones
#: handed over without a copy (pyzmq's ``copy_threshold``; its default is 64 KiB).
#: A zero-copy frame costs a message to pyzmq's garbage-collector thread when
#: libzmq lets go of it. Measured over tcp loopback (2026-11-30, 2 cores, median
#: send + receive): copying a 100 KB frame took 0.91x the time of handing it
#: over, 256 KB 0.99x, 512 KB 1.11x, 4 MB 1.16x; fedsim's transport alone at
#: 100 KB went from 1.12-1.21x raw pyzmq's zero-copy send to 0.96-1.07x.
COPY_BELOW = 256 * 1024


class ZmqContext:
    """This process's ZeroMQ context and every socket made from it.

    ``max_message_bytes`` (> 0) is the default ``MAXMSGSIZE`` of the sockets
    that face other processes' peers (:meth:`endpoint`, :meth:`connect`), not
    of the private :meth:`pair` sockets.
    """

    def __init__(self, max_message_bytes: int = -1) -> None:
        raise_fd_limit()
        self.ctx: zmq.Context[Any] = zmq.Context()
        self.ctx.setsockopt(zmq.LINGER, 0)
        self.max_message_bytes = max_message_bytes
        self._sockets: list[LoopSocket] = []
        self._auth: ZapHandler | None = None
        self.closed = False

    def socket(self, kind: int, max_message_bytes: int = -1) -> zmq.Socket[Any]:
        """A new socket of ``kind`` with the high-water marks (and a ``MAXMSGSIZE`` if > 0)."""
        sock: zmq.Socket[Any] = self.ctx.socket(kind)
        sock.setsockopt(zmq.SNDHWM, HWM)
        sock.setsockopt(zmq.RCVHWM, HWM)
        sock.copy_threshold = COPY_BELOW
        if max_message_bytes > 0:
            sock.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
        return sock

    def watch(self, sock: zmq.Socket[Any]) -> LoopSocket:
        """``sock`` driven by the event loop; closed with this context."""
        watched = LoopSocket(sock)
        self._sockets.append(watched)
        return watched

    def endpoint(self, address: str, keys: ServerKeys | None = None,
                 on_refused: Callable[[str, str, str], None] | None = None, *,
                 max_message_bytes: int | None = None,
                 handshake_timeout: float | None = None) -> ZmqEndpoint:
        """Bind a ROUTER at ``address`` (``tcp://host:0`` picks a free port).

        With ``keys`` it is a CURVE server admitting only the allow-listed
        keys; ``on_refused(source, reason, why)`` hears of every refusal and
        failed handshake, once (``source``: the peer's IP address, ``local``
        for ipc, ``?`` when it closed too soon to be read; ``reason``:
        ``unauthenticated`` for a key the ZAP handler refused,
        ``bad_handshake`` for another failed handshake, ``handshake_timeout``
        for a connection that did not complete one in time).
        ``max_message_bytes`` is its ``MAXMSGSIZE`` (default: the context's),
        ``handshake_timeout`` (real seconds) its ``HANDSHAKE_IVL``.
        """
        return ZmqEndpoint(self, address, keys, on_refused,
                           max_message_bytes=(self.max_message_bytes if max_message_bytes
                                              is None else max_message_bytes),
                           handshake_timeout=handshake_timeout)

    def connect(self, address: str, identity: bytes | None = None,
                keys: ClientKeys | None = None, *,
                on_state: Callable[[str, str], None] | None = None) -> ZmqConnection:
        """Connect a DEALER (a CURVE client with ``keys``).

        Without ``identity`` the server's ROUTER assigns the connection its
        routing id (what fedsim's hosts do); tests and rogues may choose one.
        ``on_state(state, detail)`` hears ``connected``, ``disconnected`` and
        ``refused`` (see :class:`ZmqConnection`).
        """
        sock = self.socket(zmq.DEALER, self.max_message_bytes)
        if identity is not None:
            sock.setsockopt(zmq.ROUTING_ID, identity)
        if keys is not None:
            sock.curve_serverkey = keys.server
            sock.curve_publickey = keys.public
            sock.curve_secretkey = keys.secret
        sock.setsockopt(zmq.RECONNECT_IVL, 50)
        conn = ZmqConnection(self, self.watch(sock))
        conn.address = address
        if on_state is not None:
            conn.watch_state(on_state, curve=keys is not None)
        sock.connect(address)
        return conn

    def pair(self, address: str, *, bind: bool) -> ZmqConnection:
        """A PAIR socket, for a process and its private worker."""
        sock = self.socket(zmq.PAIR)
        if bind:
            sock.bind(address)
        else:
            sock.connect(address)
        return ZmqConnection(self, self.watch(sock))

    def forget(self, sock: LoopSocket, linger_ms: int = 0) -> None:
        """Close ``sock`` with ``linger_ms``; this context no longer owns it."""
        sock.close(linger_ms)
        with contextlib.suppress(ValueError):
            self._sockets.remove(sock)

    def close(self, linger_ms: int = 500) -> None:
        """Close every socket with ``linger_ms`` and terminate the context."""
        if self.closed:
            return
        self.closed = True
        if self._auth is not None:
            self._auth.close()
        for sock in self._sockets:
            sock.close(linger_ms)
        self._sockets.clear()
        self.ctx.term()


#: Handshakes in a row closed without a reason (none succeeding) after which
#: a host hears ``failing``: libzmq tries every 50 ms, so about a quarter second.
FAILING_AFTER = 5


class ZmqConnection:
    """A DEALER or PAIR socket as a :class:`Connection`.

    ``recv`` and ``send`` raise :class:`ConnectionError` once :meth:`close`
    was called (also a ``recv`` waiting then), as the in-memory connection
    of :mod:`fedsim.testing.memory_network` does.

    A DEALER's state (:meth:`watch_state`) comes from its socket monitor:
    ``connected`` when a handshake succeeds (the detail says ``again`` after
    a reconnection: the ROUTER gave this connection a new routing id),
    ``disconnected`` when an established connection drops, ``refused``
    once, with the cause, when the server's ZAP handler refused the key or
    a handshake failed for a protocol error (one side without CURVE, a key
    that does not match): then the DEALER stops trying (it would knock
    every 50 ms). ``failing`` when :data:`FAILING_AFTER` handshakes in a row
    were closed without a reason: the server closes a handshake it cannot
    decrypt (this host's ``server.key`` is not the server's), but so does a
    proxy in front of a server not listening yet, so the DEALER tries on.
    """

    def __init__(self, owner: ZmqContext, sock: LoopSocket) -> None:
        self.owner = owner
        self.sock = sock
        self.address = ""
        self.handshakes = 0
        self._monitor: LoopSocket | None = None
        self._watcher: asyncio.Future[None] | None = None

    async def recv(self) -> Frames:
        return await self.sock.recv()

    async def send(self, frames: Frames) -> None:
        await self.sock.send(frames)

    def watch_state(self, on_state: Callable[[str, str], None], *, curve: bool) -> None:
        """Report this DEALER's handshakes and drops to ``on_state(state, detail)``."""
        events = (zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED
                  | zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                  | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
        self._monitor = self.owner.watch(self.sock.sock.get_monitor_socket(events))
        self._watcher = asyncio.ensure_future(self._watch(on_state, curve))

    async def _watch(self, on_state: Callable[[str, str], None], curve: bool) -> None:
        assert self._monitor is not None
        failures = 0
        refused = False
        with contextlib.suppress(asyncio.CancelledError, ConnectionError, zmq.ZMQError):
            while True:
                msg = parse_monitor_message([f.bytes for f in await self._monitor.recv()])
                event = msg["event"]
                if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                    failures = 0
                    self.handshakes += 1
                    on_state("connected", "again" if self.handshakes > 1 else "")
                elif event == zmq.EVENT_DISCONNECTED:
                    if failures == 0 and self.handshakes:
                        on_state("disconnected", "")
                elif refused:
                    continue
                elif event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                    refused = self._give_up()
                    on_state("refused", f"the server refused this host's key (ZAP status "
                                        f"{msg['value']}: it is not on the server's allow-list)")
                elif event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
                    refused = self._give_up()
                    on_state("refused", "handshake failed: " + _protocol_error(msg["value"],
                                                                                curve))
                else:
                    failures += 1
                    if failures == FAILING_AFTER:
                        on_state("failing", (
                            f"{failures} handshakes in a row were closed: "
                            + ("the server's key (server.key) may not be this server's, or "
                               "the server is not listening yet behind a proxy" if curve
                               else "the server may use CURVE (give --keys DIR), or not be "
                               "listening yet behind a proxy")))

    def _give_up(self) -> bool:
        """Stop connecting (a refused host would knock every 50 ms); True."""
        if self.address:
            self.sock.disconnect(self.address)
        return True

    def close(self, linger_ms: int = 200) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
        if self._monitor is not None:
            with contextlib.suppress(zmq.ZMQError):
                self.sock.sock.disable_monitor()
            self.owner.forget(self._monitor)
        self.owner.forget(self.sock, linger_ms)


_HANDSHAKE_FAILED: dict[int, str] = {
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL: "handshake failed",
    zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: "handshake failed (protocol: a peer without CURVE?)",
    zmq.EVENT_HANDSHAKE_FAILED_AUTH: "handshake failed (authentication)",
}


def _protocol_error(code: int, curve: bool) -> str:
    """What a ZMTP protocol error in a handshake means, for a person."""
    if code == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
        return ("the server does not use CURVE (it runs --insecure): drop --keys"
                if curve else "the server uses CURVE: give --keys DIR")
    if code == zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC:
        return "a CURVE key does not match (the server's key in server.key is not this server's)"
    return f"ZMTP protocol error 0x{code:x}"


UNKNOWN_PEER = "an unknown address"
"""The source of a connection closed before its monitor event was read: the
address is read from the socket when the event is, and under load a failed
handshake's connection can be gone by then."""


def _peer_of(fd: int) -> str:
    """The IP address of the peer of accepted socket ``fd`` (``local`` for ipc,
    :data:`UNKNOWN_PEER` once it is closed)."""
    try:
        with socket.socket(fileno=os.dup(fd)) as s:
            name = s.getpeername()
    except OSError:
        return UNKNOWN_PEER
    if isinstance(name, tuple) and name:
        return str(name[0])
    return "local"


def assigned(peer: bytes) -> bool:
    """Whether routing id ``peer`` is one a ROUTER assigned (5 bytes, the first 0),
    not one the peer chose."""
    return len(peer) == 5 and peer[0] == 0


class ZmqEndpoint:
    """A ROUTER socket as an :class:`Endpoint`, with a monitor of its connections.

    libzmq refuses a frame over ``MAXMSGSIZE`` by dropping its connection (it
    never buffers it); ``disconnects`` counts every established connection
    dropped, and ``on_disconnect(source)`` (if set) is called for each. With
    ``keys`` the socket is a CURVE server. ``on_refused(source, reason, why)``
    hears of every key refused and every other failed handshake, once each.
    ``recv`` and ``send`` raise :class:`ConnectionError` once :meth:`close`
    was called (also a ``recv`` waiting then), as the in-memory endpoint of
    :mod:`fedsim.testing.memory_network` does.

    The monitor's events carry no peer address (libzmq 4.3 reports the bound
    endpoint), so the peer is read from the accepted socket
    (``EVENT_ACCEPTED`` gives its descriptor). A failed handshake is the one
    of the next connection to close: libzmq reports both from the same call
    on its one I/O thread, with nothing between them.
    """

    def __init__(self, owner: ZmqContext, address: str, keys: ServerKeys | None = None,
                 on_refused: Callable[[str, str, str], None] | None = None, *,
                 max_message_bytes: int = -1,
                 handshake_timeout: float | None = None) -> None:
        self.owner = owner
        self.on_refused = on_refused
        self.authenticated = keys is not None
        self._users: dict[bytes, str | None] = {}
        self._addresses: dict[bytes, str] = {}
        sock = owner.socket(zmq.ROUTER, max_message_bytes)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # unknown peer -> error, not silence
        if handshake_timeout is not None:
            sock.setsockopt(zmq.HANDSHAKE_IVL, max(1, round(handshake_timeout * 1e3)))
        self.handshake_timeout = handshake_timeout
        if keys is not None:
            if not zmq.has("curve"):
                raise RuntimeError("this libzmq was built without CURVE support")
            if owner._auth is None:
                owner._auth = ZapHandler(owner.ctx, keys.allowed, self._refused)
            sock.curve_server = True
            sock.curve_publickey = keys.public
            sock.curve_secretkey = keys.secret
            sock.zap_domain = b"fedsim"
        if address.startswith("tcp://") and address.endswith(":0"):
            host = address.rsplit(":", 1)[0]
            address = f"{host}:{sock.bind_to_random_port(host)}"
        else:
            sock.bind(address)
        self.address = address
        self.disconnects = 0
        self.on_disconnect: Callable[[str], None] | None = None
        #: accepted connections not closed yet: descriptor -> (peer address, accepted at)
        self._accepted: dict[int, tuple[str, float]] = {}
        events = zmq.EVENT_DISCONNECTED | zmq.EVENT_ACCEPTED
        for ev in _HANDSHAKE_FAILED:
            events |= ev
        self.sock = owner.watch(sock)
        self._monitor_sock = owner.watch(sock.get_monitor_socket(events))
        self._monitor = asyncio.ensure_future(self._watch())

    def _refused(self, source: str, reason: str, why: str) -> None:
        if self.on_refused is not None:
            self.on_refused(source, reason, why)
        else:
            log.warning("refused a connection from %s: %s: %s", source or UNKNOWN_PEER, reason, why)

    async def _watch(self) -> None:
        failed: tuple[int, int] | None = None  # the last failed handshake: (event, value)
        with contextlib.suppress(asyncio.CancelledError, ConnectionError, zmq.ZMQError):
            while True:
                frames = await self._monitor_sock.recv()
                msg = parse_monitor_message([f.bytes for f in frames])
                event, value = msg["event"], msg["value"]
                if event == zmq.EVENT_ACCEPTED:
                    self._accepted[value] = (_peer_of(value), time.monotonic())
                elif event in _HANDSHAKE_FAILED:
                    failed = (event, value)
                elif event == zmq.EVENT_DISCONNECTED:
                    source, since = self._accepted.pop(value, (UNKNOWN_PEER, time.monotonic()))
                    if failed is not None:
                        self._handshake_failed(source, since, *failed)
                        failed = None
                        continue
                    self.disconnects += 1
                    if self.on_disconnect is not None:
                        self.on_disconnect(source)

    def _handshake_failed(self, source: str, since: float, event: int, value: int) -> None:
        if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            return  # the ZAP handler refused it, and said so with the key
        why = _HANDSHAKE_FAILED[event]
        if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
            why = ("handshake failed (protocol: a peer without CURVE)"
                   if value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH else
                   "handshake failed (protocol: a peer with a wrong server key)"
                   if value == zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC else
                   f"handshake failed (ZMTP protocol error 0x{value:x})")
        reason = "bad_handshake"
        if event == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
            held = time.monotonic() - since
            timeout = self.handshake_timeout
            if timeout is not None and held >= 0.9 * timeout:
                reason, why = "handshake_timeout", f"no handshake in {held:.1f} s: closed"
            else:
                why = f"handshake failed (the peer closed the connection after {held:.1f} s)"
        self._refused(source, reason, why)

    def assigned(self, peer: bytes) -> bool:
        """Whether ``peer`` is a routing id this ROUTER assigned, not one the peer chose."""
        return assigned(peer)

    async def recv(self) -> tuple[bytes, Frames]:
        frames = await self.sock.recv()
        peer = frames[0].bytes
        if len(frames) > 1:
            # pyzmq types every Frame.get() as int | str; a metadata property is a str
            if self.authenticated:  # the ZAP handler's answer for this connection's key
                user = frames[1].get("User-Id")
                self._users[peer] = user if isinstance(user, str) and user else None
            if peer not in self._addresses:
                try:
                    address: int | str = frames[1].get("Peer-Address")
                except zmq.ZMQError:  # inproc: no such property
                    address = ""
                self._addresses[peer] = (address if isinstance(address, str) and address
                                         else "local")
        return peer, frames[1:]

    def user(self, peer: bytes) -> str | None:
        """The allow-list name of ``peer``'s key (None without CURVE)."""
        return self._users.get(peer)

    def peer_address(self, peer: bytes) -> str | None:
        """The IP address ``peer`` connected from (``local`` for ipc), once it has sent."""
        return self._addresses.get(peer)

    async def send(self, peer: bytes, frames: Frames) -> None:
        try:
            await self.sock.send([peer, *frames])
        except zmq.ZMQError as exc:
            if exc.errno == zmq.EHOSTUNREACH:
                raise PeerGone(f"peer {peer!r} is not connected") from None
            raise

    def close(self) -> None:
        self._monitor.cancel()
        with contextlib.suppress(zmq.ZMQError):
            self.sock.sock.disable_monitor()
        self.owner.forget(self._monitor_sock)
        self.owner.forget(self.sock, 500)
