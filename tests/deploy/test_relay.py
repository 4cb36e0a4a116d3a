"""The delaying relay (fedsim.deploy.relay): both directions, a fixed delay, order kept.

An echo server behind the relay: every round trip through it takes at least
twice the one-way delay (a lower bound with a little slack for timer
granularity; the upper bound is generous, the machine is shared), and what
comes back is exactly what was sent, in order, also when many chunks are in
flight at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
from collections.abc import AsyncIterator

import pytest

from fedsim.deploy.relay import Relay, main

DELAY = 0.05  # one way


async def _echo(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    while chunk := await r.read(1 << 16):
        w.write(chunk)
        await w.drain()
    w.close()


@pytest.fixture
async def relayed() -> AsyncIterator[tuple[int, int]]:
    """(echo port, relay port): the relay forwards to the echo server, DELAY each way."""
    echo = await asyncio.start_server(_echo, "127.0.0.1", 0)
    echo_port = echo.sockets[0].getsockname()[1]
    relay = Relay(("127.0.0.1", 0), ("127.0.0.1", echo_port), DELAY)
    await relay.start()
    yield echo_port, relay.port
    await relay.close()
    echo.close()
    await echo.wait_closed()


async def _round_trip(port: int, payload: bytes) -> tuple[float, bytes]:
    r, w = await asyncio.open_connection("127.0.0.1", port)
    t0 = time.monotonic()
    w.write(payload)
    got = await r.readexactly(len(payload))
    took = time.monotonic() - t0
    w.close()
    await w.wait_closed()
    return took, got


async def test_every_round_trip_is_delayed_both_ways(relayed: tuple[int, int]) -> None:
    echo_port, relay_port = relayed
    direct = min([(await _round_trip(echo_port, b"ping"))[0] for _ in range(3)])
    trips = [await _round_trip(relay_port, b"ping %d" % i) for i in range(5)]
    for took, got in trips:
        assert got.startswith(b"ping ")
        # out and back: two one-way delays (a 5 ms slack for timer granularity)
        assert took >= 2 * DELAY - 0.005
        assert took < 2 * DELAY + 1.0  # generous: a shared machine
    assert direct < DELAY  # the delay is the relay's, not the loopback's


async def test_order_and_content_kept_with_many_chunks_in_flight(
        relayed: tuple[int, int]) -> None:
    _, relay_port = relayed
    r, w = await asyncio.open_connection("127.0.0.1", relay_port)
    sent = b"".join(b"%06d|" % i + bytes([i % 251]) * (i % 3000) for i in range(400))
    t0 = time.monotonic()
    for i in range(0, len(sent), 7000):  # many writes, all in flight before the first is back
        w.write(sent[i:i + 7000])
    await w.drain()
    first = await r.readexactly(1)
    assert time.monotonic() - t0 >= 2 * DELAY - 0.005
    rest = await asyncio.wait_for(r.readexactly(len(sent) - 1), 30)
    assert first + rest == sent
    # the delay is not added per chunk: ~600 kB in many chunks came back in
    # far less than (number of chunks) x the delay
    assert time.monotonic() - t0 < (len(sent) // 7000) * DELAY
    w.close()
    await w.wait_closed()


async def test_closing_one_side_closes_the_other(relayed: tuple[int, int]) -> None:
    _, relay_port = relayed
    r, w = await asyncio.open_connection("127.0.0.1", relay_port)
    w.write(b"bye")
    assert await r.readexactly(3) == b"bye"
    w.write_eof()  # the echo server sees EOF, closes, and so does the relay
    assert await asyncio.wait_for(r.read(), 5) == b""
    w.close()
    await w.wait_closed()


async def test_a_reset_on_one_side_drops_the_other() -> None:
    import socket
    import struct

    async def reset(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await r.read(10)
        sock = w.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        w.transport.abort()  # an RST, not a FIN

    target = await asyncio.start_server(reset, "127.0.0.1", 0)
    relay = Relay(("127.0.0.1", 0), ("127.0.0.1", target.sockets[0].getsockname()[1]), DELAY)
    await relay.start()
    r, w = await asyncio.open_connection("127.0.0.1", relay.port)
    w.write(b"x")
    with contextlib.suppress(ConnectionResetError):
        assert await asyncio.wait_for(r.read(), 5) == b""
    w.close()
    with contextlib.suppress(ConnectionResetError):
        await w.wait_closed()
    for _ in range(100):  # the relay lets go of both sides
        if not relay._conns:
            break
        await asyncio.sleep(0.05)
    assert not relay._conns
    await relay.close()
    target.close()
    await target.wait_closed()


async def test_an_unreachable_target_closes_the_connection() -> None:
    probe = await asyncio.start_server(_echo, "127.0.0.1", 0)
    dead_port = probe.sockets[0].getsockname()[1]
    probe.close()
    await probe.wait_closed()
    relay = Relay(("127.0.0.1", 0), ("127.0.0.1", dead_port), DELAY)
    await relay.start()
    r, w = await asyncio.open_connection("127.0.0.1", relay.port)
    assert await asyncio.wait_for(r.read(), 5) == b""
    w.close()
    await w.wait_closed()
    await relay.close()


def test_the_command_line_relays() -> None:
    """``python -m fedsim.deploy.relay`` says it is ready and then forwards with its delay."""
    import socket

    with socket.create_server(("127.0.0.1", 0)) as target, \
            socket.socket() as spare:
        spare.bind(("127.0.0.1", 0))
        port = spare.getsockname()[1]
        spare.close()
        tport = target.getsockname()[1]
        p = subprocess.Popen([sys.executable, "-m", "fedsim.deploy.relay", "--listen",
                              f"127.0.0.1:{port}", "--to", f"127.0.0.1:{tport}",
                              "--delay-ms", "50"], stdout=subprocess.PIPE, text=True)
        try:
            assert p.stdout is not None
            assert p.stdout.readline().strip() == "relay ready"
            with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
                t0 = time.monotonic()
                c.sendall(b"hello")
                target.settimeout(10)
                conn, _ = target.accept()
                with conn:
                    conn.settimeout(10)
                    assert conn.recv(5) == b"hello"
                    assert time.monotonic() - t0 >= 0.045  # one way
        finally:
            p.terminate()
            p.communicate(timeout=10)


def test_the_command_line_rejects_a_bad_address(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--listen", "127.0.0.1:notaport", "--to", "127.0.0.1:1", "--delay-ms", "1"])
    assert exc.value.code == 2
    assert "'127.0.0.1:notaport' is not HOST:PORT" in capsys.readouterr().err
