"""fedsim.testing: the virtual-time loop and the in-memory network.

The virtual-time tests are plain functions that call :func:`run_virtual`
themselves, so no pytest-asyncio loop is involved in them.
"""

from __future__ import annotations

import asyncio
import errno
import os
import sys
import threading
import time

import pytest

from fedsim.testing.memory_network import MemoryConnection, MemoryNetwork, Packet
from fedsim.testing.virtual_time import (
    VirtualTimeDeadlock,
    VirtualTimeLoop,
    make_timers,
    run_virtual,
    virtual_clock,
)
from fedsim.wire.transport import Connection, Endpoint, PeerGone
from netem.timers import TimerHeap

# -- virtual time ----------------------------------------------------------------


def test_an_hour_of_sleep_takes_no_real_time() -> None:
    async def main() -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, VirtualTimeLoop)
        start = loop.time()
        await asyncio.sleep(3600)
        return start, loop.time()

    t0 = time.perf_counter()
    start, end = run_virtual(main())
    assert time.perf_counter() - t0 < 0.5
    assert (start, end) == (0.0, 3600.0)


def test_waits_longer_than_asyncios_one_day_select_cap() -> None:
    async def main() -> float:
        await asyncio.sleep(10 * 86400 + 0.25)
        return asyncio.get_running_loop().time()

    assert run_virtual(main()) == 10 * 86400 + 0.25


def test_timers_run_in_deadline_order_at_exactly_their_deadlines() -> None:
    delays = [0.3, 0.1, 0.7, 0.2, 1e-9, 2.0 / 3.0, 0.1 + 0.2, 1234.5678, 1e-12]

    async def main() -> list[tuple[float, int]]:
        loop = asyncio.get_running_loop()
        fired: list[tuple[float, int]] = []

        def fire(i: int) -> None:
            fired.append((loop.time(), i))

        for i, delay in enumerate(delays):
            loop.call_later(delay, fire, i)
        cancelled = loop.call_later(0.25, fire, 99)
        cancelled.cancel()
        await asyncio.sleep(2000)
        return fired

    fired = run_virtual(main())
    order = sorted(range(len(delays)), key=lambda i: delays[i])
    assert [i for _, i in fired] == order
    assert [t for t, _ in fired] == [delays[i] for i in order]  # exactly, not approximately


def test_concurrent_tasks_interleave_by_virtual_time() -> None:
    async def main() -> list[tuple[str, float]]:
        loop = asyncio.get_running_loop()
        log: list[tuple[str, float]] = []

        async def ticker(name: str, period: float, n: int) -> None:
            for _ in range(n):
                await asyncio.sleep(period)
                log.append((name, loop.time()))

        await asyncio.gather(ticker("a", 1.5, 3), ticker("b", 2.0, 2))
        return log

    assert run_virtual(main()) == [("a", 1.5), ("b", 2.0), ("a", 3.0), ("b", 4.0), ("a", 4.5)]


def test_deadlock_raises_a_clear_error_and_cleans_up() -> None:
    cleaned: list[str] = []

    async def stuck_forever(event: asyncio.Event) -> None:
        try:
            await event.wait()
        finally:
            cleaned.append("worker")

    async def main() -> None:
        loop = asyncio.get_running_loop()
        event = asyncio.Event()
        worker = asyncio.create_task(stuck_forever(event), name="stuck-worker")
        loop.call_later(5.0, lambda: None).cancel()  # a cancelled timer wakes nobody
        await asyncio.sleep(1.0)
        await worker

    with pytest.raises(
        VirtualTimeDeadlock, match="every task is blocked and no timer is scheduled"
    ) as info:
        run_virtual(main())
    assert isinstance(info.value, RuntimeError)
    message = str(info.value)
    assert message.startswith(
        "virtual time: every task is blocked and no timer is scheduled (at t = 1 s"
    )
    assert "stuck-worker: stuck_forever (test_testing.py:" in message
    assert "-> wait (locks.py:" in message
    assert cleaned == ["worker"]  # leftovers were cancelled, as asyncio.run does


def test_wait_for_and_timeout_fire_on_virtual_time() -> None:
    async def main() -> list[tuple[str, float]]:
        loop = asyncio.get_running_loop()
        log: list[tuple[str, float]] = []
        event = asyncio.Event()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(event.wait(), 5.0)
        log.append(("wait_for timed out", loop.time()))

        loop.call_later(2.0, event.set)
        await asyncio.wait_for(event.wait(), 5.0)
        log.append(("wait_for done", loop.time()))

        with pytest.raises(TimeoutError):
            async with asyncio.timeout(3.0):
                await asyncio.sleep(100.0)
        log.append(("timeout expired", loop.time()))

        async with asyncio.timeout_at(loop.time() + 1.0):
            await asyncio.sleep(0.5)
        log.append(("timeout_at not reached", loop.time()))
        return log

    assert run_virtual(main()) == [
        ("wait_for timed out", 5.0),
        ("wait_for done", 7.0),
        ("timeout expired", 10.0),
        ("timeout_at not reached", 10.5),
    ]


def test_queue_between_tasks_on_virtual_time() -> None:
    async def main() -> list[tuple[int, float]]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[int] = asyncio.Queue(maxsize=1)
        got: list[tuple[int, float]] = []

        async def producer() -> None:
            for i in range(3):
                await asyncio.sleep(1.0)
                await queue.put(i)

        async def consumer() -> None:
            for _ in range(3):
                item = await queue.get()
                got.append((item, loop.time()))
                await asyncio.sleep(2.5)  # slower than the producer

        await asyncio.gather(producer(), consumer())
        return got

    assert run_virtual(main()) == [(0, 1.0), (1, 3.5), (2, 6.0)]


def test_thread_jobs_take_no_virtual_time() -> None:
    async def main() -> list[tuple[str, float]]:
        loop = asyncio.get_running_loop()
        log: list[tuple[str, float]] = []

        async def sleeper() -> None:
            await asyncio.sleep(0.001)
            log.append(("sleeper", loop.time()))

        task = asyncio.create_task(sleeper())

        def job() -> int:
            time.sleep(0.05)  # 50 ms of real time; virtual time waits for it
            return 42

        value = await asyncio.to_thread(job)
        log.append((f"thread {value}", loop.time()))
        await task
        return log

    assert run_virtual(main()) == [("thread 42", 0.0), ("sleeper", 0.001)]


def test_callbacks_from_other_threads_wake_the_loop() -> None:
    async def main() -> float:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[float] = loop.create_future()
        fut_time = loop.run_in_executor(None, time.sleep, 0.02)
        threading.Thread(target=lambda: loop.call_soon_threadsafe(fut.set_result, 1.0)).start()
        await fut_time
        return await fut

    assert run_virtual(main()) == 1.0


def test_run_virtual_returns_and_refuses_a_running_loop() -> None:
    async def value() -> int:
        return 7

    assert run_virtual(value()) == 7

    async def nested() -> None:
        coro = value()
        try:
            with pytest.raises(RuntimeError, match="running event loop"):
                run_virtual(coro)
        finally:
            coro.close()

    run_virtual(nested())


def test_virtual_clock_needs_a_virtual_loop() -> None:
    async def main() -> None:
        with pytest.raises(TypeError, match="not on virtual time"):
            virtual_clock()

    asyncio.run(main())


@pytest.mark.parametrize("dilation", [1.0, 2.0])
def test_timer_heap_fires_at_exactly_the_scheduled_emulated_times(dilation: float) -> None:
    times = [0.5, 0.1, 0.3, 0.3, 2.0 / 3.0, 7.25, 100.001]

    async def main() -> None:
        loop = asyncio.get_running_loop()
        clock = virtual_clock(dilation)
        assert clock.now() == 0.0
        lateness: list[float] = []
        heap = make_timers(clock, on_lateness=lateness.append)
        assert heap.kind == "call_at"
        fired: list[tuple[float, float, float]] = []
        for t in times:
            heap.call_at(t, lambda t=t: fired.append((t, clock.now(), loop.time())))
        heap.call_at(50.0, lambda: fired.append((-1.0, 0.0, 0.0))).cancel()
        await heap.sleep_until(200.0)
        assert clock.now() == 200.0
        assert loop.time() == 200.0 * dilation
        heap.close()

        assert [t for t, _, _ in fired] == sorted(times)
        for t, now, real in fired:
            assert now == t  # exactly: the virtual clock jumps onto each deadline
            assert real == t * dilation
        assert heap.fired == len(times) + 1  # the sleep_until timer too
        assert lateness == [0.0] * heap.fired
        assert heap.lateness_max == 0.0

    run_virtual(main())


def test_timer_heap_is_on_time_with_an_epoch_after_zero() -> None:
    async def main() -> None:
        await asyncio.sleep(3600.1)
        clock = virtual_clock(2.0)
        heap = TimerHeap(clock, use_timerfd=False)
        fired: list[tuple[float, float]] = []
        times = [i * 0.37 for i in range(1, 200)]
        for t in times:
            heap.call_at(t, lambda t=t: fired.append((t, clock.now())))
        await heap.sleep_until(times[-1] + 1)
        heap.close()
        assert [t for t, _ in fired] == times
        assert all(now == pytest.approx(t, abs=1e-9) for t, now in fired)
        assert heap.lateness_max == 0.0  # never late, not even by a rounding error

    run_virtual(main())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="timerfd is Linux-only")
def test_a_timerfd_heap_is_refused_on_virtual_time() -> None:
    before = set(os.listdir("/proc/self/fd"))

    async def main() -> None:
        clock = virtual_clock()
        with pytest.raises(RuntimeError, match="use_timerfd=False"):
            TimerHeap(clock)  # use_timerfd=True by default

    try:
        run_virtual(main())
    finally:
        # TimerHeap does not close the timerfd it failed to register.
        for fd in set(os.listdir("/proc/self/fd")) - before:
            try:
                if os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:[timerfd]":
                    os.close(int(fd))
            except OSError:
                pass


# -- in-memory network -----------------------------------------------------------

SERVER = "tcp://server:5555"


def test_round_trip_between_an_endpoint_and_its_connections() -> None:
    async def main() -> None:
        net = MemoryNetwork()
        endpoint: Endpoint = net.bind(SERVER)
        h1: Connection = net.connect(SERVER, b"host-1")
        h2: Connection = net.connect(SERVER, b"host-2")
        assert isinstance(endpoint, Endpoint)
        assert isinstance(h1, Connection)
        assert endpoint.address == SERVER

        await h1.send([b"hello", b"from 1"])
        await h2.send([memoryview(b"hello"), b"from 2"])
        got = [await endpoint.recv() for _ in range(2)]
        assert [(peer, [bytes(f) for f in frames]) for peer, frames in got] == [
            (b"host-1", [b"hello", b"from 1"]),
            (b"host-2", [b"hello", b"from 2"]),
        ]
        assert all(isinstance(f, memoryview) for _, frames in got for f in frames)

        await endpoint.send(b"host-2", [b"to 2"])
        await endpoint.send(b"host-1", [b"to 1", b""])
        assert [bytes(f) for f in await h1.recv()] == [b"to 1", b""]
        assert [bytes(f) for f in await h2.recv()] == [b"to 2"]
        assert net.sent == 4
        assert net.bytes_sent == 5 + 6 + 5 + 6 + 4 + 4
        assert (net.delivered, net.dropped) == (4, 0)
        net.close()

    run_virtual(main())


def test_messages_arrive_in_fifo_order() -> None:
    async def main() -> None:
        net = MemoryNetwork()
        endpoint = net.bind(SERVER)
        hosts = [net.connect(SERVER, b"h%d" % i) for i in range(3)]

        async def chatter(conn: MemoryConnection) -> None:
            for i in range(50):
                await conn.send([conn.identity, str(i).encode()])
                if i % 7 == 0:
                    await asyncio.sleep(0.001 * (1 + hosts.index(conn)))

        await asyncio.gather(*(chatter(h) for h in hosts))
        seen: dict[bytes, list[int]] = {h.identity: [] for h in hosts}
        while endpoint.queued:
            peer, (ident, number) = await endpoint.recv()
            assert bytes(ident) == peer
            seen[peer].append(int(bytes(number)))
        assert all(numbers == list(range(50)) for numbers in seen.values())

        for i in range(20):
            await endpoint.send(b"h1", [str(i).encode()])
        assert [int(bytes((await hosts[1].recv())[0])) for _ in range(20)] == list(range(20))
        net.close()

    run_virtual(main())


def test_send_copies_the_frames() -> None:
    async def main() -> None:
        net = MemoryNetwork()
        endpoint = net.bind(SERVER)
        host = net.connect(SERVER, b"host")
        buf = bytearray(b"model v1")
        view = memoryview(buf)
        await host.send([view, memoryview(buf)[:]])
        buf[:] = b"MUTATED!"  # after send: must not change what is received
        _, frames = await endpoint.recv()
        assert [bytes(f) for f in frames] == [b"model v1", b"model v1"]
        assert all(f.readonly and f.obj is not buf for f in frames)

        payload = b"immutable"
        await endpoint.send(b"host", [payload])
        (frame,) = await host.recv()
        assert frame.obj is not payload
        assert bytes(frame) == payload
        net.close()

    run_virtual(main())


def test_send_to_an_identity_that_is_not_connected_raises_peer_gone() -> None:
    async def main() -> None:
        net = MemoryNetwork()
        endpoint = net.bind(SERVER)
        with pytest.raises(PeerGone, match="b'nobody' is not connected to tcp://server:5555"):
            await endpoint.send(b"nobody", [b"x"])
        host = net.connect(SERVER, b"host")
        await endpoint.send(b"host", [b"x"])
        host.close()
        with pytest.raises(PeerGone):
            await endpoint.send(b"host", [b"y"])
        assert issubclass(PeerGone, ConnectionError)
        assert net.sent == 1  # a refused send is not a packet
        net.close()

    run_virtual(main())


def test_connecting_needs_a_bound_address_and_a_free_identity() -> None:
    net = MemoryNetwork()
    with pytest.raises(ConnectionRefusedError, match="nothing is bound at tcp://server:5555"):
        net.connect(SERVER, b"host")
    endpoint = net.bind(SERVER)
    first = net.connect(SERVER, b"host")
    with pytest.raises(ConnectionError, match="b'host' is already connected to tcp://server"):
        net.connect(SERVER, b"host")
    assert endpoint.peers == {b"host"}
    first.close()
    assert endpoint.peers == set()
    again = net.connect(SERVER, b"host")  # the identity is free once closed
    assert endpoint.peers == {b"host"}
    endpoint.close()
    with pytest.raises(ConnectionRefusedError):
        net.connect(SERVER, b"other")
    again.close()

    with pytest.raises(ValueError, match="Invalid identity"):
        net.connect(SERVER, b"")
    with pytest.raises(ValueError, match="Invalid identity"):
        net.connect(SERVER, b"\x00zmq-reserved")
    with pytest.raises(ValueError, match="Invalid max_queue"):
        net.bind("tcp://other", max_queue=0)
    net.bind(SERVER)
    with pytest.raises(OSError, match="address already in use: tcp://server:5555") as info:
        net.bind(SERVER)
    assert info.value.errno == errno.EADDRINUSE
    net.close()


def test_close_fails_pending_calls_and_loses_queued_messages() -> None:
    async def main() -> None:
        net = MemoryNetwork()
        endpoint = net.bind(SERVER)
        host = net.connect(SERVER, b"host")
        loop = asyncio.get_running_loop()

        loop.call_later(1.0, host.close)
        with pytest.raises(ConnectionError, match=r"^closed$"):
            await host.recv()  # pending when closed
        with pytest.raises(ConnectionError, match=r"^closed$"):
            await host.recv()
        with pytest.raises(ConnectionError, match=r"^closed$"):
            await host.send([b"x"])
        host.close()  # idempotent
        assert host.closed

        other = net.connect(SERVER, b"other")
        await other.send([b"lost"])
        assert endpoint.queued == 1
        loop.call_later(1.0, endpoint.close)
        await asyncio.sleep(2.0)
        assert endpoint.closed
        assert endpoint.queued == 0
        with pytest.raises(ConnectionError, match=r"^closed$"):
            await endpoint.recv()
        with pytest.raises(ConnectionError, match=r"^closed$"):
            await endpoint.send(b"other", [b"x"])
        idle = net.bind("tcp://idle")
        loop.call_later(1.0, idle.close)
        with pytest.raises(ConnectionError, match=r"^closed$"):
            await idle.recv()  # pending when closed

        # A DEALER's send to a closed ROUTER is lost, not an error ...
        await other.send([b"into the void"])
        assert net.dropped == 1
        # ... and it is the peer of whatever binds the address next.
        restarted = net.bind(SERVER)
        assert restarted.peers == {b"other"}
        await other.send([b"hello again"])
        assert (await restarted.recv())[0] == b"other"
        net.close()
        assert other.closed
        assert restarted.closed

    run_virtual(main())


def test_pair_connects_a_parent_and_its_worker() -> None:
    async def main() -> None:
        net = MemoryNetwork()
        parent, worker = net.pair("ipc://worker-0")
        assert (parent.identity, worker.identity) == (b"parent", b"worker")
        sent: list[Packet] = []

        def spy(packet: Packet) -> None:
            sent.append(packet)
            net.deliver(packet)

        net.route = spy
        await parent.send([b"task"])
        assert [bytes(f) for f in await worker.recv()] == [b"task"]
        await worker.send([b"result", b"1"])
        await worker.send([b"result", b"2"])
        assert sent[0] == Packet("ipc://worker-0", b"parent", b"worker", (b"task",))
        assert sent[1].source == b"worker"
        assert sent[1].destination == b"parent"

        worker.close()  # the parent still receives what was sent, then learns
        assert [bytes(f) for f in await parent.recv()] == [b"result", b"1"]
        assert [bytes(f) for f in await parent.recv()] == [b"result", b"2"]
        with pytest.raises(ConnectionResetError):
            await parent.recv()
        with pytest.raises(BrokenPipeError):
            await parent.send([b"more"])
        with pytest.raises(OSError, match="already in use"):
            net.pair("ipc://worker-0")
        parent.close()
        a, b = net.pair("ipc://worker-0", identities=(b"a", b"b"))  # free again

        # A recv waiting when the other end closes wakes up.
        asyncio.get_running_loop().call_later(2.0, b.close)
        with pytest.raises(ConnectionError):
            await a.recv()
        net.close()

    run_virtual(main())


def test_route_hook_drops_duplicates_and_delays_packets() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        net = MemoryNetwork()
        endpoint = net.bind(SERVER)
        h1 = net.connect(SERVER, b"h1")
        h2 = net.connect(SERVER, b"h2")

        def faults(packet: Packet) -> None:
            kind = bytes(packet.frames[0])
            if packet.source == b"h1" and kind == b"drop":
                return
            if packet.destination == b"h2" and kind == b"dup":
                net.deliver(packet)
                net.deliver(packet)
                return
            if kind == b"slow":
                loop.call_later(0.25, net.deliver, packet)
                return
            net.deliver(packet)

        net.route = faults
        await h1.send([b"drop"])
        await h1.send([b"slow", b"1"])
        await h1.send([b"fast", b"2"])
        peer, frames = await endpoint.recv()
        assert (peer, bytes(frames[0]), loop.time()) == (b"h1", b"fast", 0.0)
        peer, frames = await endpoint.recv()
        assert (peer, bytes(frames[0]), loop.time()) == (b"h1", b"slow", 0.25)

        await endpoint.send(b"h2", [b"dup"])
        await endpoint.send(b"h1", [b"dup"])
        assert [bytes((await h2.recv())[0]) for _ in range(2)] == [b"dup", b"dup"]
        assert h2.queued == 0
        assert h1.queued == 1

        # A delayed packet to a peer that left meanwhile is dropped.
        await endpoint.send(b"h2", [b"slow"])
        h2.close()
        await asyncio.sleep(1.0)
        assert (net.sent, net.delivered, net.dropped) == (6, 5, 1)

        def refuse(packet: Packet) -> None:
            raise OSError(errno.ENETUNREACH, "scripted outage")

        net.route = refuse
        with pytest.raises(OSError, match="scripted outage"):
            await h1.send([b"x"])
        net.close()

    run_virtual(main())


def test_a_full_queue_makes_send_wait() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        net = MemoryNetwork()
        endpoint = net.bind(SERVER, max_queue=2)
        slow = net.connect(SERVER, b"slow", max_queue=2)
        other = net.connect(SERVER, b"other")
        done: list[tuple[int, float]] = []

        async def flood() -> None:
            for i in range(5):
                await endpoint.send(b"slow", [b"%d" % i])
                done.append((i, loop.time()))

        async def drain() -> list[int]:
            got = []
            for _ in range(5):
                await asyncio.sleep(1.0)
                got.append(int(bytes((await slow.recv())[0])))
            return got

        _, got = await asyncio.gather(flood(), drain())
        assert got == [0, 1, 2, 3, 4]
        assert done == [(0, 0.0), (1, 0.0), (2, 1.0), (3, 2.0), (4, 3.0)]

        # The endpoint's bound is per peer: one peer at its bound does not
        # hold up another.
        await slow.send([b"a"])
        await slow.send([b"b"])
        blocked = asyncio.create_task(slow.send([b"c"]))
        await asyncio.sleep(0.5)
        assert not blocked.done()
        await asyncio.wait_for(other.send([b"free"]), 0.1)
        assert endpoint.queued == 3

        # Closing the waiting sender fails its send.
        slow.close()
        with pytest.raises(ConnectionError, match=r"^closed$"):
            await blocked
        net.close()

    run_virtual(main())


def test_a_full_peer_that_leaves_fails_the_waiting_send_with_peer_gone() -> None:
    async def main() -> None:
        net = MemoryNetwork()
        endpoint = net.bind(SERVER)
        host = net.connect(SERVER, b"host", max_queue=1)
        await endpoint.send(b"host", [b"1"])
        asyncio.get_running_loop().call_later(5.0, host.close)
        with pytest.raises(PeerGone):
            await endpoint.send(b"host", [b"2"])
        net.close()

    run_virtual(main())


def test_a_message_needs_a_frame() -> None:
    async def main() -> None:
        net = MemoryNetwork()
        a, _ = net.pair("inproc://p")
        with pytest.raises(ValueError, match="at least one frame"):
            await a.send([])
        net.close()

    run_virtual(main())


def test_a_recv_nobody_answers_is_reported_as_a_deadlock() -> None:
    async def main() -> None:
        net = MemoryNetwork()
        net.bind(SERVER)
        host = net.connect(SERVER, b"host")
        await host.send([b"hello?"])
        await host.recv()  # the server never replies

    with pytest.raises(VirtualTimeDeadlock, match=r"main .*-> recv .*-> get "):
        run_virtual(main())
