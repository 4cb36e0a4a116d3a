"""The 10,000-link speed-ups keep what they replace.

``tools/bench_netem.py --links 10000`` spent 20-30 s building links (the
delay moments integrated ``norm_ppf`` elementwise per distinct distribution)
and most of its loop time in numpy calls on single values and in re-arming
the timerfd. Each faster path is checked here against the slow one it
replaces, value for value; ``test_link_pinned.py`` pins the link model as a
whole against the old code.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import select
from typing import Any

import numpy as np
import pytest

from netem.clock import Clock, ManualClock
from netem.delayprocess import DelayProcess
from netem.dist import (
    Constant,
    LogNormal,
    Normal,
    Pareto,
    ParetoNormal,
    Uniform,
    _numeric_moments,
    make_dist,
    scalar_ppf,
)
from netem.empirical import Empirical
from netem.fidelity import FidelityMonitor
from netem.fidelitystats import Reservoir
from netem.link import Delivery, Link
from netem.linkparams import LinkParams
from netem.loss import Bernoulli, GilbertElliott
from netem.lossprocess import LossProcess
from netem.rng import stream
from netem.stdnormal import norm_ppf, norm_ppf1
from netem.timers import TimerHeap

SCALED = (Uniform, Normal, Pareto, ParetoNormal)


# -- distributions ---------------------------------------------------------------
def edge_and_random_u() -> list[float]:
    rng = np.random.default_rng(3)
    edges = [0.0, 1e-300, 1e-17, 1e-16, 0.5, 1 - 1e-16, 1 - 1e-17, 1.0]
    return edges + rng.random(2000).tolist() + (rng.random(200) ** 20).tolist()


@pytest.mark.parametrize(
    "dist",
    [
        Constant(0.02),
        *(cls(0.02, 0.006) for cls in SCALED),
        *(cls(0.01, 0.03) for cls in SCALED),  # jitter > mean: the clip at 0
        LogNormal(0.05, 0.02),
        LogNormal(0.05, 0.0),
        Empirical((0.01, 0.02, 0.05), 0.03, 0.01),
    ],
    ids=repr,
)
def test_scalar_ppf_is_the_vector_ppf_to_the_bit(dist: Any) -> None:
    f = scalar_ppf(dist)
    with np.errstate(divide="ignore"):
        for u in edge_and_random_u():
            got, want = f(u), float(dist.ppf(u))
            assert type(got) is float
            assert got == want, (u, got, want)


def test_norm_ppf1_is_norm_ppf() -> None:
    for u in edge_and_random_u():
        assert norm_ppf1(u) == float(norm_ppf(u))


def test_a_subclass_falls_back_to_its_own_ppf() -> None:
    @dataclasses.dataclass(frozen=True, slots=True)
    class Shifted(Uniform):
        def ppf(self, u: Any) -> Any:
            return Uniform.ppf(self, u) + 1.0

    d = Shifted(0.02, 0.01)
    assert scalar_ppf(d)(0.25) == float(d.ppf(0.25)) == 1.0 + float(Uniform(0.02, 0.01).ppf(0.25))
    assert d.moments() == _numeric_moments(d.ppf)


@pytest.mark.parametrize("cls", SCALED)
def test_moments_from_the_family_grid_are_the_integrated_ones(cls: type) -> None:
    rng = np.random.default_rng(7)
    for _ in range(40):
        d = cls(float(rng.exponential(0.1)), float(rng.exponential(0.05)))
        assert d.moments() == _numeric_moments(d.ppf)  # exactly, not approximately


def test_delay_process_reads_ahead_without_changing_the_draws() -> None:
    dist = make_dist("paretonormal", 0.03, 0.01)
    proc = DelayProcess(dist, 0.4, stream(1, "ahead"))
    rng = stream(1, "ahead")  # the same stream, one scalar draw at a time
    z = None
    want = []
    for _ in range(3 * DelayProcess.BLOCK + 5):
        eps = float(rng.standard_normal())
        z = eps if z is None else 0.4 * z + math.sqrt(1 - 0.16) * eps
        want.append(float(dist.ppf(0.5 * math.erfc(-z * math.sqrt(0.5)))))
    got = [proc.next() for _ in range(7)]
    got += proc.draw(DelayProcess.BLOCK + 3).tolist()  # part from the block read ahead
    got += [proc.next() for _ in range(len(want) - len(got))]
    assert got == want


# -- link ---------------------------------------------------------------------------
def test_deliveries_are_frozen_delivery_values() -> None:
    link = Link(LinkParams(delay=0.01, rate=1e6, queue_limit=3000, loss_mode="drop"))
    ds = [link.schedule(0.0, 1000) for _ in range(4)]  # the last ones overflow the queue
    assert {d.reason for d in ds} == {"", "queue"}
    for d in ds:
        assert type(d) is Delivery
        with pytest.raises(dataclasses.FrozenInstanceError):
            d.t_deliver = 0.0  # type: ignore[misc]
        assert d == dataclasses.replace(d)
        assert hash(d) == hash(dataclasses.replace(d))


def test_schedule_still_checks_its_arguments() -> None:
    link = Link(LinkParams(delay=0.01))
    for bad in (math.nan, math.inf, "1"):
        with pytest.raises(ValueError, match="t_send"):
            link.schedule(bad, 10)  # type: ignore[arg-type]
    for bad_n in (-1, 1.5, True):
        with pytest.raises(ValueError, match="nbytes"):
            link.schedule(0.0, bad_n)  # type: ignore[arg-type]
    d = link.schedule(np.float64(0.5), np.int64(10))  # numpy scalars are accepted
    assert d.nbytes == 10
    assert type(d.nbytes) is int


def test_links_with_one_loss_model_share_its_chain() -> None:
    a = LossProcess(GilbertElliott(0.01, 0.3), stream(0, "a"), stream(0, "b"))
    b = LossProcess(GilbertElliott(0.01, 0.3), stream(0, "c"), stream(0, "d"))
    assert a._pi is b._pi
    assert a._cum is b._cum
    with pytest.raises(ValueError, match="read-only"):
        a._t[0, 0] = 0.5
    model = GilbertElliott(0.01, 0.3)
    t = model.transition_matrix()
    assert t.flags.writeable  # the model's own arrays are not frozen


def test_an_unhashable_loss_model_still_runs() -> None:
    class Unhashable:
        __hash__ = None  # type: ignore[assignment]

        def transition_matrix(self) -> np.ndarray:
            return np.ones((1, 1))

        def state_loss(self) -> np.ndarray:
            return np.array([0.5])

        def stationary(self) -> np.ndarray:
            return np.ones(1)

    p = LossProcess(Unhashable(), stream(0, "s"), stream(0, "l"))
    q = LossProcess(Bernoulli(0.5), stream(0, "s"), stream(0, "l"))
    assert p.draw(50).tolist() == q.draw(50).tolist()


# -- fidelity monitor -----------------------------------------------------------------
def test_reservoir_stays_a_uniform_sample() -> None:
    res = Reservoir(2_000, seed=4)
    n = 200_000
    for i in range(n):
        res.add(float(i))
    v = res.values()
    assert res.count == n
    assert res.max == n - 1
    assert res.sum == n * (n - 1) / 2
    assert v.size == 2_000
    assert np.unique(v).size == 2_000
    # a uniform sample of 0..n-1: mean n/2 +- 4 standard errors, every decile filled
    assert abs(v.mean() - n / 2) < 4 * n / math.sqrt(12 * v.size)
    assert np.histogram(v, bins=10, range=(0, n))[0].min() > 120


def test_monitor_builds_one_stats_object_per_kind() -> None:
    m = FidelityMonitor()
    d = Link(LinkParams(delay=0.01, rate=1e6)).schedule(0.0, 1000)
    m.record_delivery("up", d, d.t_deliver + 1e-4)
    k = m._kinds["up"]
    m.record_delivery("up", d, d.t_deliver + 2e-4)
    assert m._kinds["up"] is k
    assert k.delay.n == 2


# -- timer heap ----------------------------------------------------------------------
async def test_a_wake_up_arms_once_however_many_timers_its_callbacks_add() -> None:
    clock = ManualClock()
    heap = TimerHeap(clock, use_timerfd=False)
    arms: list[float] = []
    arm = heap._arm

    def counting_arm(deadline: float) -> None:
        arms.append(deadline)
        arm(deadline)

    heap._arm = counting_arm  # type: ignore[method-assign]
    fired: list[int] = []

    def fan_out(i: int) -> None:
        fired.append(i)
        heap.call_at(5.0 - i, fired.append, 10 + i)  # each one earlier than the last
        heap.call_at(9.0, fired.append, 20 + i)

    for i in range(3):
        heap.call_at(1.0, fan_out, i)
    assert len(arms) == 1  # outside a wake-up, call_at arms (once here: same deadline)
    clock.advance(1.5)
    heap._run_due()
    assert fired == [0, 1, 2]
    assert len(arms) == 2
    assert arms[-1] == clock.to_real(3.0)
    assert heap.wakeups == 1
    assert heap.fired == 3
    clock.advance(10.0)
    heap._run_due()
    assert fired[3:] == [12, 11, 10, 20, 21, 22]
    assert len(arms) == 2  # nothing left: nothing armed
    heap.close()
    await asyncio.sleep(0)


async def test_timerfd_is_not_readable_after_a_wake_up_without_a_read() -> None:
    clock = Clock()
    heap = TimerHeap(clock)
    if heap.kind != "timerfd":
        heap.close()
        pytest.skip("no timerfd here")
    fd = heap._fd
    for k in range(3):
        t = clock.now() + 0.002
        heap.call_at(t + 10.0, lambda: None)  # keeps the heap armed, far away
        await heap.sleep_until(t)
        assert heap.wakeups == k + 1
        assert select.select([fd], [], [], 0)[0] == []  # re-armed: expiry count reset
    heap.close()


async def test_timerfd_is_disarmed_when_the_heap_empties() -> None:
    clock = Clock()
    heap = TimerHeap(clock)
    if heap.kind != "timerfd":
        heap.close()
        pytest.skip("no timerfd here")
    await heap.sleep_until(clock.now() + 0.002)
    assert len(heap) == 0
    assert heap._armed is None
    assert select.select([heap._fd], [], [], 0.01)[0] == []  # no stray wake-up either
    heap.close()
