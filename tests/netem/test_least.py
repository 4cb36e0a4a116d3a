"""The least time a link or a device can take: a floor every draw respects, and reaches.

A receiver bounds what a sender may claim by these (the server, an update's
send time: docs/deployment.md), so they must never be above what the model
can produce, and should not be far below it either.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from netem.device import RunTrace, StepTime
from netem.dist import Constant, LogNormal, Uniform
from netem.link import Link
from netem.linkparams import LinkParams

SIZE = 57_000


@pytest.mark.parametrize(("distribution", "jitter"), [
    ("constant", 0.0), ("uniform", 0.01), ("normal", 0.004), ("pareto", 0.01),
    ("paretonormal", 0.01), ("lognormal", 0.01)])
@pytest.mark.parametrize("rate", [None, 8e6])
def test_no_delivery_is_faster_than_the_links_least_delay(
        distribution: str, jitter: float, rate: float | None) -> None:
    p = LinkParams(delay=0.03, jitter=jitter, distribution=distribution, rate=rate,
                   delay_correlation=0.3)
    link = Link(p, seed=4, key=("link", 0, "down"))
    least = p.least_delay(SIZE)
    # messages far apart: no queueing, no head-of-line wait; the TCP slow start adds
    took = np.array([(d := link.schedule(10.0 * i, SIZE)).t_deliver - d.t_send
                     for i in range(3000)])
    assert took.min() >= least - 1e-12
    ser = 0.0 if rate is None else p.wire_bytes(SIZE) * 8 / rate
    # the family's floor: its lower clip; a log-normal's (and paretonormal's normal
    # part) is where netem's normal quantile is clipped, |z| <= 8.2
    z = -8.222082216130435
    sigma = math.sqrt(math.log1p((0.01 / 0.03) ** 2))
    floor = {"constant": 0.03, "uniform": 0.02, "normal": 0.03 - 4 * 0.004,
             "pareto": 0.03 - 0.01 * 2 / 3,
             "paretonormal": 0.03 + 0.01 * (0.25 * z + 0.75 * -2 / 3),
             "lognormal": math.exp(math.log(0.03) - sigma**2 / 2 + sigma * z)}[distribution]
    assert least == pytest.approx(floor + ser, abs=1e-12)


def test_the_least_delay_reaches_what_a_constant_link_takes() -> None:
    p = LinkParams(delay=0.05, rate=1e7, loss_mode="drop")
    d = Link(p).schedule(0.0, SIZE)
    assert d.t_deliver == pytest.approx(p.least_delay(SIZE), abs=1e-15)


def test_a_devices_least_time_is_below_every_run_and_reached_without_noise() -> None:
    rng = np.random.default_rng(0)
    constant = StepTime(Constant(0.004))
    assert constant.least_time(7) == constant.compute_time(7, rng) == 7 * 0.004
    uniform = StepTime(Uniform(0.004, 0.001), per="step")
    runs = [uniform.compute_time(5, rng) for _ in range(2000)]
    assert min(runs) >= uniform.least_time(5) == pytest.approx(5 * 0.003)
    noisy = StepTime(LogNormal(0.004, 0.002))  # a floor far below its mean, not 0
    assert 0.0 < noisy.least_time(5) < 0.05 * 5 * 0.004
    trace = RunTrace((0.3, 0.1, 0.2), steps_per_run=10)
    assert trace.least_time(20) == pytest.approx(0.2)
    assert min(trace.compute_time(20, rng, i) for i in range(3)) == trace.least_time(20)
