"""fedsim.testing: the virtual-time loop and the in-memory network.

The virtual-time tests are plain functions that call :func:`run_virtual`
themselves, so no pytest-asyncio loop is involved in them.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time

import pytest

from fedsim.testing import (
    VirtualTimeDeadlock,
    VirtualTimeLoop,
    make_timers,
    run_virtual,
    virtual_clock,
)
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
        for i, delay in enumerate(delays):
            loop.call_later(delay, lambda i=i: fired.append((loop.time(), i)))
        cancelled = loop.call_later(0.25, lambda: fired.append((loop.time(), 99)))
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
        # The job takes 50 ms of real time; virtual time waits for it.
        value = await asyncio.to_thread(lambda: time.sleep(0.05) or 42)
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
