"""An in-memory network for the actors: the transport's two interfaces without sockets.

With it and a virtual-time loop (:mod:`fedsim.testing.virtual_time`), the
whole actor system runs in one process (:mod:`fedsim.testing.federation`).

:class:`MemoryNetwork` implements the two transport interfaces the actors use
(:class:`Endpoint`, a ROUTER's side, and :class:`Connection`, a DEALER's or
one end of a pair) without sockets: :meth:`~MemoryNetwork.bind`,
:meth:`~MemoryNetwork.connect` and :meth:`~MemoryNetwork.pair`. Every message
sent is copied into new ``bytes``, becomes a :class:`Packet`, and goes
through :attr:`MemoryNetwork.route`, which a test replaces to drop, duplicate,
delay or reorder packets (trio's ``FakeNet.route_packet``); the default
delivers each packet in FIFO order. Sending never takes virtual time.
"""

from __future__ import annotations

import asyncio
import errno
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from fedsim.wire.codec import Frames, frame_view
from fedsim.wire.transport import PeerGone

__all__ = [
    "MemoryConnection",
    "MemoryEndpoint",
    "MemoryNetwork",
    "Packet",
]


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


def _copy(frames: Frames) -> tuple[bytes, ...]:
    """New ``bytes`` for each frame, so the receiver never shares the sender's memory."""
    if not frames:
        raise ValueError("a message has at least one frame")
    return tuple(frame_view(f, i).tobytes() for i, f in enumerate(frames))


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

    async def send(self, peer: bytes, frames: Frames) -> None:
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

    async def send(self, frames: Frames) -> None:
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
    >>> from fedsim.testing.virtual_time import run_virtual
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
