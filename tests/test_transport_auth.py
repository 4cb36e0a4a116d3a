"""CURVE on real ZeroMQ sockets: who may connect, and who the server thinks they are."""

from __future__ import annotations

import asyncio

import pytest
import zmq

from fedsim.transport import ClientKeys, ServerKeys, ZmqContext

pytestmark = pytest.mark.timeout(30)


def _pair() -> tuple[bytes, bytes]:
    public, secret = zmq.curve_keypair()
    return public, secret


async def _exchange(server_keys: ServerKeys, client: ClientKeys | None,
                    identity: bytes = b"h0") -> tuple[list[tuple[str, str]], object]:
    ctx = ZmqContext()
    refused: list[tuple[str, str]] = []
    endpoint = ctx.endpoint("tcp://127.0.0.1:0", server_keys, lambda a, w: refused.append((a, w)))
    conn = ctx.connect(endpoint.address, identity, client)
    await conn.send([b"hello"])
    got: object = None
    try:
        peer, frames = await asyncio.wait_for(endpoint.recv(), 1.0)
        got = (peer, [bytes(f) for f in frames], endpoint.user(peer))
        await endpoint.send(peer, [b"welcome"])
        assert [bytes(f) for f in await asyncio.wait_for(conn.recv(), 1.0)] == [b"welcome"]
    except TimeoutError:
        pass
    await asyncio.sleep(0.1)  # let the monitor report a failed handshake
    endpoint.close()
    conn.close()
    ctx.close(linger_ms=0)
    return refused, got


async def test_an_allowed_key_connects_and_is_known_by_its_name() -> None:
    spub, ssec = _pair()
    cpub, csec = _pair()
    keys = ServerKeys(spub, ssec, {cpub: "host-0"})
    refused, got = await _exchange(keys, ClientKeys(cpub, csec, spub))
    assert refused == []
    assert got == (b"h0", [b"hello"], "host-0")


async def test_a_key_not_on_the_allow_list_gets_no_byte_and_is_reported() -> None:
    spub, ssec = _pair()
    cpub, _ = _pair()
    rpub, rsec = _pair()  # a rogue with a valid key pair of its own
    keys = ServerKeys(spub, ssec, {cpub: "host-0"})
    refused, got = await _exchange(keys, ClientKeys(rpub, rsec, spub))
    assert got is None
    assert refused
    assert "is not on the allow-list" in refused[0][1]
    assert rpub.decode() in refused[0][1]


async def test_a_peer_without_curve_gets_no_byte_and_is_reported() -> None:
    spub, ssec = _pair()
    cpub, _ = _pair()
    refused, got = await _exchange(ServerKeys(spub, ssec, {cpub: "host-0"}), None)
    assert got is None
    assert any("handshake failed" in why for _, why in refused), refused


async def test_a_client_with_the_wrong_server_key_gets_nothing() -> None:
    spub, ssec = _pair()
    cpub, csec = _pair()
    other, _ = _pair()
    _refused, got = await _exchange(ServerKeys(spub, ssec, {cpub: "host-0"}),
                                   ClientKeys(cpub, csec, other))
    assert got is None
