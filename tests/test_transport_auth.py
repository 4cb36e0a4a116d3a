"""CURVE on real ZeroMQ sockets: who may connect, who the server thinks they are, and
what each side hears of a refusal (once, with the peer's address and the cause)."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest
import zmq

from fedsim.wire.curve import ClientKeys, ServerKeys
from fedsim.wire.transport import UNKNOWN_PEER, ZmqContext, assigned

pytestmark = pytest.mark.timeout(30)


def _pair() -> tuple[bytes, bytes]:
    public, secret = zmq.curve_keypair()
    return public, secret


async def _exchange(server_keys: ServerKeys, client: ClientKeys | None,
                    identity: bytes | None = None
                    ) -> tuple[list[tuple[str, str]], object, list[tuple[str, str]]]:
    ctx = ZmqContext()
    refused: list[tuple[str, str]] = []
    states: list[tuple[str, str]] = []

    def on_refused(source: str, reason: str, why: str) -> None:
        assert reason == ("unauthenticated" if "allow-list" in why else "bad_handshake")
        refused.append((source, why))

    endpoint = ctx.endpoint("tcp://127.0.0.1:0", server_keys, on_refused)
    conn = ctx.connect(endpoint.address, identity, client,
                       on_state=lambda s, d: states.append((s, d)))
    await conn.send([b"hello"])
    got: object = None
    try:
        peer, frames = await asyncio.wait_for(endpoint.recv(), 1.0)
        got = (peer, [bytes(f) for f in frames], endpoint.user(peer))
        await endpoint.send(peer, [b"welcome"])
        assert [bytes(f) for f in await asyncio.wait_for(conn.recv(), 1.0)] == [b"welcome"]
    except TimeoutError:
        pass
    await asyncio.sleep(0.3)  # let the monitors report
    endpoint.close()
    conn.close()
    ctx.close(linger_ms=0)
    return refused, got, states


async def test_an_allowed_key_connects_and_is_known_by_its_name() -> None:
    spub, ssec = _pair()
    cpub, csec = _pair()
    keys = ServerKeys(spub, ssec, {cpub: "host-0"})
    refused, got, states = await _exchange(keys, ClientKeys(cpub, csec, spub))
    assert refused == []
    assert isinstance(got, tuple)
    peer, frames, user = got
    assert (frames, user) == ([b"hello"], "host-0")
    assert assigned(peer), peer   # the server's ROUTER gave the connection its routing id
    assert states == [("connected", "")]


async def test_a_key_not_on_the_allow_list_gets_no_byte_and_each_side_hears_it_once() -> None:
    spub, ssec = _pair()
    cpub, _ = _pair()
    rpub, rsec = _pair()  # a rogue with a valid key pair of its own
    keys = ServerKeys(spub, ssec, {cpub: "host-0"})
    refused, got, states = await _exchange(keys, ClientKeys(rpub, rsec, spub))
    assert got is None
    assert len(refused) == 1, refused  # the ZAP handler's report; not again from the monitor
    source, why = refused[0]
    assert source == "127.0.0.1"
    assert "is not on the allow-list" in why
    assert rpub.decode() in why
    assert states[:1] == [("refused", "the server refused this host's key (ZAP status 400: "
                                      "it is not on the server's allow-list)")]


async def test_a_peer_without_curve_gets_no_byte_and_is_reported() -> None:
    spub, ssec = _pair()
    cpub, _ = _pair()
    refused, got, states = await _exchange(ServerKeys(spub, ssec, {cpub: "host-0"}), None)
    assert got is None
    assert refused
    # a peer that fails within milliseconds may be gone before its address is read
    assert {a for a, _ in refused} <= {"127.0.0.1", UNKNOWN_PEER}
    assert all("handshake failed (protocol" in why for _, why in refused), refused
    (refusal,) = [s for s in states if s[0] == "refused"]
    assert refusal[1] == "handshake failed: the server uses CURVE: give --keys DIR"


async def test_a_client_with_the_wrong_server_key_gets_nothing_and_hears_it_is_failing() -> None:
    spub, ssec = _pair()
    cpub, csec = _pair()
    other, _ = _pair()
    t0 = time.monotonic()
    _refused, got, states = await _exchange(ServerKeys(spub, ssec, {cpub: "host-0"}),
                                            ClientKeys(cpub, csec, other))
    assert got is None
    # the server closes what it cannot decrypt: so does a proxy before a server that
    # is not up, so the client is warned and tries on
    (failing,) = [s for s in states if s[0] == "failing"]
    assert "server.key" in failing[1]
    assert not [s for s in states if s[0] == "refused"]
    assert time.monotonic() - t0 < 5.0


async def test_an_idle_connection_is_closed_at_the_handshake_timeout_and_reported_once() -> None:
    spub, ssec = _pair()
    cpub, _ = _pair()
    ctx = ZmqContext()
    refused: list[tuple[str, str, str]] = []
    endpoint = ctx.endpoint("tcp://127.0.0.1:0", ServerKeys(spub, ssec, {cpub: "host-0"}),
                            lambda *a: refused.append(a), handshake_timeout=0.3)
    host, port = endpoint.address.removeprefix("tcp://").rsplit(":", 1)
    idle = [socket.create_connection((host, int(port))) for _ in range(3)]  # not a byte sent
    try:
        await asyncio.sleep(1.0)
        closed = 0
        for s in idle:
            s.settimeout(1.0)
            try:  # libzmq sent its greeting, then closed
                while s.recv(4096):
                    pass
                closed += 1
            except TimeoutError:
                pass
        assert closed == 3
        assert len(refused) == 3, refused
        assert {(a, reason) for a, reason, _ in refused} == {
            ("127.0.0.1", "handshake_timeout")}, refused
        assert all(why.startswith("no handshake in 0.") for _, _, why in refused), refused
        assert endpoint.disconnects == 0   # never established: refusals, not drops
    finally:
        for s in idle:
            s.close()
        endpoint.close()
        ctx.close(linger_ms=0)


async def test_a_frame_over_the_bound_drops_the_connection_and_the_host_connects_again() -> None:
    ctx = ZmqContext()
    drops: list[str] = []
    states: list[tuple[str, str]] = []
    endpoint = ctx.endpoint("tcp://127.0.0.1:0", max_message_bytes=1000)
    endpoint.on_disconnect = drops.append
    conn = ctx.connect(endpoint.address, on_state=lambda s, d: states.append((s, d)))
    try:
        await conn.send([b"small"])
        first, _ = await asyncio.wait_for(endpoint.recv(), 2.0)
        await conn.send([b"x" * 1001])       # dropped unread: libzmq closes the connection
        for _ in range(100):
            if ("connected", "again") in states:
                break
            await asyncio.sleep(0.02)
        await conn.send([b"after"])
        second, frames = await asyncio.wait_for(endpoint.recv(), 2.0)
        assert [bytes(f) for f in frames] == [b"after"]
        assert second != first  # a new connection, a new routing id
        assert assigned(second)
        assert drops == ["127.0.0.1"]
        assert endpoint.disconnects == 1
        assert states == [("connected", ""), ("disconnected", ""), ("connected", "again")]
    finally:
        endpoint.close()
        conn.close()
        ctx.close(linger_ms=0)


def test_routing_ids_a_peer_chose_are_told_from_assigned_ones() -> None:
    assert assigned(b"\x00\x12\x34\x56\x78")
    assert not assigned(b"host-1")
    assert not assigned(b"\x00abc")
    assert not assigned(b"\x01\x12\x34\x56\x78")
