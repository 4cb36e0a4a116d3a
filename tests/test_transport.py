"""fedsim's ZeroMQ transport on real sockets: its reader without a future per message.

:class:`fedsim.wire._zmqsocket.LoopSocket` reads every waiting message when the
socket's ``ZMQ_FD`` is readable and after every call on the socket (the FD
is edge-triggered: a send can consume the signal of a message that arrived).
These tests check what that must keep: order, nothing lost to a cancelled
receive, bounded read-ahead, sends waiting at the high-water mark, and close.
Each runs on asyncio's loop and on uvloop (fedsim's default).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import zmq

import fedsim.wire.transport as transport
from fedsim.wire.transport import READ_AHEAD, ZmqConnection, ZmqContext, ZmqEndpoint

pytestmark = pytest.mark.timeout(60)

LOOPS = ["asyncio", "uvloop"]


def run(kind: str, main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run ``main()`` on a fresh loop of ``kind``."""
    if kind == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        uvloop.run(main())
    else:
        asyncio.run(main())


def _pair(ctx: ZmqContext, address: str = "tcp://127.0.0.1:0",
          ) -> tuple[ZmqEndpoint, ZmqConnection]:
    endpoint = ctx.endpoint(address)
    return endpoint, ctx.connect(endpoint.address, b"host-0")


def _number(frames: list[Any]) -> int:
    return int(frames[0].bytes)


@pytest.mark.parametrize("kind", LOOPS)
def test_bursts_arrive_in_order_both_ways(kind: str) -> None:
    """5,000 messages each way, sent without waiting, received in order and complete."""
    n = 5000

    async def main() -> None:
        ctx = ZmqContext()
        endpoint, conn = _pair(ctx)

        async def up() -> None:  # a send does not wait below the high-water mark
            for i in range(n):
                await conn.send([b"%d" % i, b"x" * (i % 300)])

        async def down(peer: bytes) -> None:
            for i in range(n):
                await endpoint.send(peer, [b"%d" % i])

        sender = asyncio.ensure_future(up())
        got: list[int] = []
        replier = None
        while len(got) < n:
            peer, frames = await endpoint.recv()
            got.append(_number(frames))
            assert len(frames[1].bytes) == got[-1] % 300
            if replier is None:  # the first message names the peer: answer while receiving
                assert peer == b"host-0"
                replier = asyncio.ensure_future(down(peer))
        assert got == list(range(n))
        assert [_number(await conn.recv()) for _ in range(n)] == list(range(n))
        assert replier is not None
        await asyncio.gather(sender, replier)
        endpoint.close()
        conn.close()
        ctx.close(linger_ms=0)

    run(kind, main)


@pytest.mark.parametrize("kind", LOOPS)
def test_a_cancelled_recv_loses_no_message(kind: str) -> None:
    """Receives cancelled while waiting, or right after they were woken, lose nothing."""

    async def main() -> None:
        ctx = ZmqContext()
        endpoint, conn = _pair(ctx)
        await conn.send([b"hello"])
        peer, _ = await endpoint.recv()

        # Cancelled while waiting: the message sent afterwards goes to the next recv.
        waiting = asyncio.ensure_future(conn.recv())
        await asyncio.sleep(0.01)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await endpoint.send(peer, [b"0"])
        assert _number(await asyncio.wait_for(conn.recv(), 5)) == 0

        # Woken (the message is read into the inbox and its future resolved),
        # then cancelled before it ran: the message stays for the next recv.
        woken = asyncio.ensure_future(conn.recv())
        await asyncio.sleep(0.01)
        await endpoint.send(peer, [b"1"])
        deadline = time.monotonic() + 5
        while not conn.sock.inbox:  # read, and the recv woken, but not yet run
            assert time.monotonic() < deadline
            conn.sock.sock.poll(10)
            conn.sock._pump()
        assert not conn.sock._getters
        woken.cancel()
        with pytest.raises(asyncio.CancelledError):
            await woken
        assert _number(await asyncio.wait_for(conn.recv(), 5)) == 1

        # Receives that time out over and over while messages stream in: each
        # message is received exactly once, in order.
        n = 2000

        async def stream() -> None:
            for i in range(n):
                await endpoint.send(peer, [b"%d" % i])
                if i % 50 == 0:
                    await asyncio.sleep(0.001)

        streaming = asyncio.ensure_future(stream())
        got: list[int] = []
        timeouts = 0
        while len(got) < n:
            try:
                got.append(_number(await asyncio.wait_for(conn.recv(), 0.0002)))
            except TimeoutError:
                timeouts += 1
        await streaming
        assert got == list(range(n))
        assert timeouts > 0  # the test did cancel waiting receives
        endpoint.close()
        conn.close()
        ctx.close(linger_ms=0)

    run(kind, main)


@pytest.mark.parametrize("kind", LOOPS)
def test_messages_arriving_while_the_loop_is_busy(kind: str) -> None:
    """A burst that arrives while the loop is blocked is read ahead at most READ_AHEAD at a time."""
    n = 3 * READ_AHEAD + 7

    async def main() -> None:
        ctx = ZmqContext()
        endpoint = ctx.endpoint("tcp://127.0.0.1:0")
        raw_ctx: zmq.Context[Any] = zmq.Context()
        raw = raw_ctx.socket(zmq.DEALER)
        raw.setsockopt(zmq.ROUTING_ID, b"raw")
        raw.connect(endpoint.address)

        def burst() -> None:  # another thread, while this loop sleeps
            for i in range(n):
                raw.send_multipart([b"%d" % i])

        first = asyncio.ensure_future(endpoint.recv())  # waiting when the burst comes
        await asyncio.sleep(0.01)
        sender = threading.Thread(target=burst)
        sender.start()
        time.sleep(0.3)  # noqa: ASYNC251 (the point: the loop is busy, the burst queues in libzmq)
        sender.join()
        peer, frames = await asyncio.wait_for(first, 5)
        got = [_number(frames)]
        assert peer == b"raw"
        while len(got) < n:
            assert len(endpoint.sock.inbox) <= READ_AHEAD
            _, frames = await asyncio.wait_for(endpoint.recv(), 5)
            got.append(_number(frames))
        assert got == list(range(n))
        raw.close(0)
        raw_ctx.term()
        endpoint.close()
        ctx.close(linger_ms=0)

    run(kind, main)


@pytest.mark.parametrize("kind", LOOPS)
def test_sends_wait_at_the_high_water_mark_in_turn(
        kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """At the high-water mark a send waits (both ways), then every message arrives in order."""
    monkeypatch.setattr(transport, "HWM", 5)
    n = 300

    async def main() -> None:
        ctx = ZmqContext()
        endpoint, conn = _pair(ctx, "inproc://hwm")  # inproc: no kernel buffers beyond the HWM
        await conn.send([b"hello"])
        peer, _ = await endpoint.recv()

        sent = {"a": 0, "b": 0}

        async def flood(name: str) -> None:  # two senders on one DEALER
            for i in range(n):
                await conn.send([name.encode(), b"%d" % i])
                sent[name] += 1

        floods = [asyncio.ensure_future(flood(name)) for name in sent]
        await asyncio.sleep(0.2)
        assert not any(f.done() for f in floods)
        # 5 + 5 in libzmq, READ_AHEAD in the endpoint's inbox: far from 2 x 300
        assert sum(sent.values()) <= 2 * 5 + READ_AHEAD + 2
        got: dict[bytes, list[int]] = {b"a": [], b"b": []}
        for _ in range(2 * n):
            _, (name, number) = await asyncio.wait_for(endpoint.recv(), 5)
            got[name.bytes].append(int(number.bytes))
        await asyncio.gather(*floods)
        assert got == {b"a": list(range(n)), b"b": list(range(n))}

        # ROUTER -> DEALER: a full peer makes the send wait too (not fail).
        async def down() -> None:
            for i in range(n):
                await endpoint.send(peer, [b"%d" % i])

        downs = asyncio.ensure_future(down())
        await asyncio.sleep(0.2)
        assert not downs.done()
        assert [_number(await asyncio.wait_for(conn.recv(), 5)) for _ in range(n)] == list(
            range(n))
        await downs

        # A send waiting at the mark fails with ConnectionError when its socket closes.
        async def stuck() -> None:
            while True:
                await conn.send([b"more"])

        blocked = asyncio.ensure_future(stuck())
        await asyncio.sleep(0.2)
        assert not blocked.done()
        conn.close()
        with pytest.raises(ConnectionError):
            await asyncio.wait_for(blocked, 5)
        endpoint.close()
        ctx.close(linger_ms=0)

    run(kind, main)


@pytest.mark.parametrize("kind", LOOPS)
def test_close_while_a_recv_waits(kind: str) -> None:
    """A waiting recv fails with ConnectionError on close, and so does every later call."""

    async def main() -> None:
        ctx = ZmqContext()
        endpoint, conn = _pair(ctx)
        waiting_conn = asyncio.ensure_future(conn.recv())
        waiting_endpoint = asyncio.ensure_future(endpoint.recv())
        await asyncio.sleep(0.01)
        conn.close()
        with pytest.raises(ConnectionError, match=r"^closed$"):
            await asyncio.wait_for(waiting_conn, 5)
        with pytest.raises(ConnectionError, match=r"^closed$"):
            await conn.recv()
        with pytest.raises(ConnectionError, match=r"^closed$"):
            await conn.send([b"x"])
        conn.close()  # idempotent
        endpoint.close()
        with pytest.raises(ConnectionError, match=r"^closed$"):
            await asyncio.wait_for(waiting_endpoint, 5)
        with pytest.raises(ConnectionError, match=r"^closed$"):
            await endpoint.send(b"host-0", [b"x"])
        ctx.close(linger_ms=0)

    run(kind, main)


@pytest.mark.parametrize("kind", LOOPS)
def test_a_message_whose_signal_a_send_consumed_is_still_received(kind: str) -> None:
    """Both ends send and receive at once: no receive sleeps on a signal a send consumed.

    A send processes libzmq's pending commands, which can include "a message
    arrived", and ``ZMQ_FD`` does not signal it again; a reader that only
    woke on the FD would wait forever here.
    """
    n = 3000

    async def main() -> None:
        ctx = ZmqContext()
        endpoint, conn = _pair(ctx)
        await conn.send([b"hello"])
        peer, _ = await endpoint.recv()

        async def host() -> list[int]:
            got = []
            for i in range(n):
                await conn.send([b"%d" % i])
                got.append(_number(await conn.recv()))
            return got

        async def server() -> list[int]:
            got = []
            for i in range(n):
                await endpoint.send(peer, [b"%d" % i])
                got.append(_number((await endpoint.recv())[1]))
            return got

        up, down = await asyncio.wait_for(asyncio.gather(server(), host()), 30)
        assert up == down == list(range(n))
        endpoint.close()
        conn.close()
        ctx.close(linger_ms=0)

    run(kind, main)
