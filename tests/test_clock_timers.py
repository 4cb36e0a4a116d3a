"""netem's clock and timer heap: dilation, ordering, lateness, cancellation."""

from __future__ import annotations

import asyncio

import pytest

from netem.clock import Clock, ManualClock
from netem.timers import TimerHeap


def test_dilation_scales_real_time_and_rebases_without_jumps() -> None:
    clock = ManualClock(dilation=4.0)
    clock.advance(2.0)
    assert clock.now() == pytest.approx(0.5)
    assert clock.to_real(1.0) == pytest.approx(4.0)
    clock.set_dilation(2.0)
    assert clock.now() == pytest.approx(0.5)  # no jump
    clock.advance(1.0)
    assert clock.now() == pytest.approx(1.0)
    with pytest.raises(ValueError, match="Invalid dilation: 0"):
        Clock(dilation=0)


@pytest.mark.parametrize("use_timerfd", [True, False])
async def test_timers_fire_in_deadline_order_and_on_time(use_timerfd: bool) -> None:
    clock = Clock()
    lateness: list[float] = []
    heap = TimerHeap(clock, use_timerfd=use_timerfd, on_lateness=lateness.append)
    fired: list[int] = []
    done = asyncio.get_running_loop().create_future()
    deadlines = [0.030, 0.010, 0.020, 0.010, 0.040]
    for i, d in enumerate(deadlines):
        heap.call_at(clock.now() + d, fired.append, i)
    cancelled = heap.call_at(clock.now() + 0.015, fired.append, 99)
    cancelled.cancel()
    heap.call_at(clock.now() + 0.045, done.set_result, None)
    await asyncio.wait_for(done, 2.0)
    assert fired == [1, 3, 2, 0, 4]
    assert len(lateness) == heap.fired == 6  # the cancelled one is not counted
    assert all(x >= 0 for x in lateness)  # never early
    assert heap.lateness_max == max(lateness) < 0.05
    heap.close()


async def test_dilated_sleep_takes_dilated_real_time() -> None:
    clock = Clock(dilation=5.0)
    heap = TimerHeap(clock)
    t0 = clock.real()
    await heap.sleep_until(clock.now() + 0.02)  # 20 ms emulated = 100 ms real
    elapsed = clock.real() - t0
    assert 0.099 <= elapsed < 0.2
    heap.close()


async def test_a_spinning_heap_wakes_before_its_deadline_and_never_fires_early() -> None:
    """The timerfd is armed up to the margin before a deadline after a quiet
    spell; the rest is busy-waited, so no callback runs before its deadline."""
    clock = Clock()
    lateness: list[float] = []
    heap = TimerHeap(clock, spin_max=0.005, on_lateness=lateness.append)
    assert heap.kind == "timerfd"
    for _ in range(5):
        deadline = clock.now() + 0.1   # a quiet spell: 5 % of it is 5 ms
        fired: list[float] = []
        heap.call_at(deadline, lambda out=fired: out.append(clock.now()))
        assert heap._wake_at < clock.to_real(deadline)   # armed early
        await heap.sleep_until(deadline + 0.01)
        assert len(fired) == 1
        assert fired[0] >= deadline
    assert all(x >= 0 for x in lateness)
    assert heap.spun > 0
    heap.close()


async def test_a_heap_woken_often_spins_at_most_its_share_of_the_time() -> None:
    clock = Clock()
    heap = TimerHeap(clock, spin_max=0.005)
    t0 = clock.real()
    for _ in range(100):   # a wake-up every 2 ms: a warm CPU
        await heap.sleep_until(clock.now() + 0.002)
    elapsed = clock.real() - t0
    # SPIN_SHARE (5 %) of each gap, plus what a late wake-up left to spin
    assert heap.spun <= 0.05 * elapsed + 0.005, (heap.spun, elapsed)
    heap.close()


async def test_only_a_real_timerfd_heap_spins() -> None:
    clock = Clock()
    heap = TimerHeap(clock, use_timerfd=False, spin_max=0.005)
    for _ in range(5):
        await heap.sleep_until(clock.now() + 0.02)
    assert heap.spun == 0
    assert heap.wake_latency_max == 0
    heap.close()
    with pytest.raises(ValueError, match="Invalid spin_max: -1"):
        TimerHeap(clock, spin_max=-1)
