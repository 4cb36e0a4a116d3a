"""Availability: AsyncFedED suspension (docs/algorithms.md#r-af6), on/off, traces."""

import math

import numpy as np
import pytest
from scipy import stats

from netem.availability import (
    AlwaysAvailable,
    AvailabilityTrace,
    OnOff,
    SuspensionModel,
)
from netem.rng import stream


def test_suspension_fraction_and_hang_ratio_uniform_0_3():
    m = SuspensionModel(p=0.3)
    rng = stream(1, "client", 0, "suspension")
    t_runs = stream(1, "t_run").uniform(0.5, 5.0, 20_000)
    draws = [m.draw_run(float(t), rng) for t in t_runs]
    susp = [(d, t) for d, t in zip(draws, t_runs, strict=True) if d is not None]
    frac = len(susp) / len(draws)
    assert abs(frac - 0.3) < 4 * math.sqrt(0.3 * 0.7 / len(draws))
    ratios = np.array([d.hang / t for d, t in susp])
    assert stats.kstest(ratios, stats.uniform(0, 3).cdf).pvalue > 0.001
    d, t = susp[0]
    assert d.wasted == t
    assert d.discard_update
    assert d.unavailable_for == pytest.approx(t + d.hang)


def test_suspension_draws_are_aligned_per_run():
    # two uniforms per run whatever happened: run k's draw is the same for any P
    first = SuspensionModel(0.2).draw_run(1.0, stream(2, "s"))
    rng_lo, rng_hi = stream(2, "s"), stream(2, "s")
    lo = [SuspensionModel(0.2).draw_run(1.0, rng_lo) for _ in range(200)]
    hi = [SuspensionModel(0.5).draw_run(1.0, rng_hi) for _ in range(200)]
    for x, y in zip(lo, hi, strict=True):
        if x is not None:  # suspended at P=0.2 implies suspended at P=0.5, same hang
            assert y is not None
            assert y.hang == x.hang
    assert first == lo[0]


def test_suspension_budget_option_and_validation():
    m = SuspensionModel(
        p=1.0, hang="budget", budget=300.0, budget_fraction=0.2, discard_update=False
    )
    first = m.draw_run(2.0, stream(3, "b"))
    rng = stream(3, "b")
    ds = [m.draw_run(2.0, rng) for _ in range(2000)]
    assert all(0 <= d.hang <= 60.0 and d.wasted == 0.0 for d in ds)
    assert np.mean([d.hang for d in ds]) == pytest.approx(30.0, rel=0.05)
    assert first == ds[0]
    assert SuspensionModel(0.0).draw_run(1.0, rng) is None
    with pytest.raises(ValueError, match=r"SuspensionModel.budget = None"):
        SuspensionModel(0.1, hang="budget")
    with pytest.raises(ValueError, match=r"SuspensionModel.p = 1.2"):
        SuspensionModel(1.2)


def test_poisson_on_off_fraction_and_exponential_durations():
    proc = OnOff(mean_on=2.0, mean_off=1.0).process(stream(4, "onoff"))
    t, state, ons, offs = 0.0, True, [], []
    assert proc.is_available(0.0)
    while t < 20_000:
        t_next, nxt = proc.next_change(t)
        assert nxt is not state
        assert proc.is_available(t_next) is nxt
        assert proc.is_available((t + t_next) / 2) is state
        (ons if state else offs).append(t_next - t)
        t, state = t_next, nxt
    assert sum(ons) / (sum(ons) + sum(offs)) == pytest.approx(2 / 3, abs=0.02)
    assert stats.kstest(ons, stats.expon(scale=2.0).cdf).pvalue > 0.001
    assert stats.kstest(offs, stats.expon(scale=1.0).cdf).pvalue > 0.001


def test_on_off_is_reproducible_and_query_order_free():
    a = OnOff(1.0, 1.0, start="stationary").process(stream(5, "x"))
    b = OnOff(1.0, 1.0, start="stationary").process(stream(5, "x"))
    ts = np.linspace(0, 100, 301)
    fwd = [a.is_available(t) for t in ts]
    back = [b.is_available(t) for t in ts[::-1]][::-1]
    assert fwd == back


def test_availability_trace_periodic_and_fedscale():
    tr = AvailabilityTrace(((10.0, 20.0), (20.0, 30.0), (50.0, 60.0)), period=100.0)
    assert tr.intervals == ((10.0, 30.0), (50.0, 60.0))  # merged
    assert not tr.is_available(5.0)
    assert tr.is_available(10.0)
    assert not tr.is_available(30.0)
    assert tr.is_available(115.0)
    assert tr.next_change(0.0) == (10.0, True)
    assert tr.next_change(15.0) == (30.0, False)
    assert tr.next_change(70.0) == (110.0, True)
    wrap = AvailabilityTrace(((0.0, 10.0), (90.0, 100.0)), period=100.0)
    assert wrap.next_change(95.0) == (110.0, False)  # on across the wrap
    once = AvailabilityTrace(((1.0, 2.0),))
    assert once.next_change(3.0) == (math.inf, False)
    fs = AvailabilityTrace.from_fedscale(
        {"active": [0, 40], "inactive": [10, 60], "finish_time": 100}, unit=1.0
    )
    assert fs.is_available(105.0)
    assert not fs.is_available(30.0)
    assert AlwaysAvailable().next_change(1.0) == (math.inf, True)
    with pytest.raises(
        ValueError, match=r"intervals\[0\] = \(5.0, 5.0\): end must be > start"
    ):
        AvailabilityTrace(((5.0, 5.0),))
