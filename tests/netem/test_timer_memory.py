"""The timer heap's memory does not grow with the number of timers it fired.

It used to keep one float per fired timer (``TimerHeap.lateness``): about
0.7 GB per process per hour at the netem benchmark's rate. Ten million timers
go through the heap's real firing path, the wake-up ``_run_due``, on a
:class:`~netem.clock.ManualClock`, so nothing sleeps, and tracemalloc shows
that after a warm-up of one million the traced memory stays flat: what is
retained does not grow, and the peak (one batch of pending timers in flight)
is the same as during the warm-up.

To keep ten million firings within seconds under tracemalloc, the big test
pushes each batch as one sorted list (a valid heap) of entries sharing one
:class:`~netem.timers.TimerHandle`, instead of ``BATCH`` calls of
``call_at``; firing is untouched. The smaller tests go through ``call_at``.
"""

from __future__ import annotations

import asyncio
import gc
import time
import tracemalloc

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


@pytest.mark.slow  # 20-40 s under tracemalloc, depending on the host's load
@pytest.mark.timeout(600)
async def test_ten_million_timers_in_constant_memory() -> None:
    clock = ManualClock()
    heap = TimerHeap(clock, use_timerfd=False)
    gc.collect()
    # The cyclic collector only costs time here (timer entries are not cyclic
    # garbage; anything cyclic left behind would show up as growth).
    gc.disable()
    tracemalloc.start()
    try:
        t0 = time.perf_counter()
        _fire_batched(heap, clock, WARMUP)
        gc.collect()
        base, warm_peak = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        _fire_batched(heap, clock, TOTAL - WARMUP)
        gc.collect()
        end, peak = tracemalloc.get_traced_memory()
        elapsed = time.perf_counter() - t0
    finally:
        tracemalloc.stop()
        gc.enable()
        heap.close()
    print(
        f"\n{heap.fired:,} timers in {elapsed:.1f} s; traced memory at 1 M: {base / 1e3:.1f} KB"
        f" (peak {warm_peak / 1e3:.1f} KB), at 10 M: {end / 1e3:.1f} KB; peak 1 M-10 M:"
        f" {peak / 1e3:.1f} KB (growth {(peak - base) / 1e3:.1f} KB over the 1 M level,"
        f" {(peak - warm_peak) / 1e3:+.1f} KB over the warm-up's peak)"
    )
    assert heap.fired == TOTAL
    assert heap.lateness_max == pytest.approx((BATCH - 0.5) * STEP)
    assert end - base < 16_000  # nothing retained per timer (the old list: ~290 MB)
    assert peak - base < 256_000  # one batch in flight (~100 B per pending timer)
    assert peak - warm_peak < 16_000


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
