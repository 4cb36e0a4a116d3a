"""The timer heap's memory does not grow with the number of timers it fired.

It used to keep one float per fired timer (``TimerHeap.lateness``): about
0.7 GB per process per hour at the netem benchmark's rate. Ten million timers
go through the heap's real firing path, the wake-up ``_run_due``, on a
:class:`~netem.clock.ManualClock`, so nothing sleeps, and the interpreter's
count of allocated memory blocks (``sys.getallocatedblocks``: every Python
object is at least one) stays flat after a warm-up of one million: nothing is
retained per timer (the old list of floats was nine million more blocks).
The count costs nothing to read, unlike tracemalloc, which made the same
check take 20-40 s.

To keep ten million firings within seconds, the big test pushes each batch
as one sorted list (a valid heap) of entries sharing one
:class:`~netem.timers.TimerHandle`, instead of ``BATCH`` calls of
``call_at``; firing is untouched. The smaller tests go through ``call_at``.
"""

from __future__ import annotations

import asyncio
import gc
import sys
import time

import pytest

from netem.clock import ManualClock
from netem.fidelitystats import Reservoir
from netem.timers import TimerHandle, TimerHeap

# Timers pushed, then fired by one wake-up. At most 100 keeps the fast path
# fast: CPython recycles up to 100 freed floats without calling the allocator.
BATCH = 100
WARMUP = 1_000_000
TOTAL = 10_000_000
STEP = 1e-6  # real seconds between deadlines


def _noop() -> None:
    pass


async def _fire(heap: TimerHeap, clock: ManualClock, n: int) -> None:
    """Push and fire ``n`` timers in batches of ``BATCH`` deadlines ``STEP``
    apart; one wake-up half a step after the last fires the batch, so
    lateness is uniform over 0.5 to ``BATCH - 0.5`` steps."""
    call_at, run_due, advance = heap.call_at, heap._run_due, clock.advance
    t = clock.now()
    for _ in range(n // BATCH):
        for _ in range(BATCH):
            t += STEP
            call_at(t, _noop)
        advance(t + 0.5 * STEP - clock.real())
        run_due()
        await asyncio.sleep(0)  # the loop runs (and purges cancelled fallbacks)


def _fire_batched(heap: TimerHeap, clock: ManualClock, n: int) -> None:
    """As :func:`_fire`, pushing each batch at once (see the module docstring)."""
    handle = TimerHandle(0.0, 0.0, _noop, ())
    steps = [k * STEP for k in range(1, BATCH + 1)]
    entries = heap._heap
    run_due, advance = heap._run_due, clock.advance
    for _ in range(n // BATCH):
        assert not entries
        base = clock.real()
        entries.extend([(base + s, k, handle) for k, s in enumerate(steps)])
        advance(steps[-1] + 0.5 * STEP)
        run_due()


@pytest.mark.timeout(300)
async def test_ten_million_timers_in_constant_memory() -> None:
    clock = ManualClock()
    heap = TimerHeap(clock, use_timerfd=False)
    gc.collect()
    # The cyclic collector only costs time here (timer entries are not cyclic
    # garbage; anything cyclic left behind would show up as growth).
    gc.disable()
    try:
        t0 = time.perf_counter()
        _fire_batched(heap, clock, WARMUP)
        gc.collect()
        base = sys.getallocatedblocks()
        _fire_batched(heap, clock, TOTAL - WARMUP)
        gc.collect()
        end = sys.getallocatedblocks()
        elapsed = time.perf_counter() - t0
    finally:
        gc.enable()
        heap.close()
    print(f"\n{heap.fired:,} timers in {elapsed:.1f} s; allocated blocks at 1 M: {base:,}, "
          f"at 10 M: {end:,} ({end - base:+,})")
    assert heap.fired == TOTAL
    assert heap.lateness_max == pytest.approx((BATCH - 0.5) * STEP)
    # nothing retained per timer (the old list of lateness floats: +9,000,000)
    assert end - base < 1_000


async def test_lateness_sink_sees_every_timer_and_reservoir_stays_bounded() -> None:
    clock = ManualClock()
    res = Reservoir(1_000, seed=1)
    heap = TimerHeap(clock, use_timerfd=False, on_lateness=res.add)
    await _fire(heap, clock, 20_000)
    heap.close()
    assert res.count == heap.fired == 20_000
    assert res.values().size == 1_000
    assert res.max == pytest.approx(heap.lateness_max)
    assert res.quantile(0.5) == pytest.approx(BATCH / 2 * STEP, rel=0.1)


async def test_faulty_sink_is_logged_and_the_heap_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def sink(_: float) -> None:
        raise RuntimeError("boom")

    clock = ManualClock()
    heap = TimerHeap(clock, use_timerfd=False, on_lateness=sink)
    fired: list[int] = []
    for i in range(3):
        heap.call_at(0.001 * (i + 1), fired.append, i)
    clock.advance(1.0)
    heap._run_due()
    heap.close()
    assert fired == [0, 1, 2]
    assert heap.fired == 3
    assert caplog.text.count("lateness sink") == 3
