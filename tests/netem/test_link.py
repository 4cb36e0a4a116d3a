"""Link model: arithmetic, queues, FIFO, loss modes, hooks, determinism."""

import math

import numpy as np
import pytest

from netem.dist import Normal
from netem.link import Bottleneck, Delivery, Link
from netem.linkparams import LinkParams
from netem.loss import Bernoulli, GilbertElliott
from netem.trace import Schedule

# 1 MB/s, 1000-byte packets without overhead: 1 ms per packet
EXACT = {"delay": 0.01, "rate": 8e6, "mss": 1000, "overhead": 0, "loss_mode": "drop"}


def parts(d: Delivery) -> float:
    return (
        d.queueing
        + d.serialization
        + d.slow_start
        + d.recovery
        + d.propagation
        + d.scripted
        + d.hol
    )


def test_rate_and_queueing_exact_departures():
    link = Link(LinkParams(**EXACT))
    a = link.schedule(0.0, 1000)
    b = link.schedule(0.0, 2000)
    c = link.schedule(0.0025, 500)
    d = link.schedule(1.0, 1000)
    assert (a.t_deliver, a.serialization, a.queueing) == pytest.approx(
        (0.011, 0.001, 0.0)
    )
    assert (b.t_deliver, b.serialization, b.queueing) == pytest.approx(
        (0.013, 0.002, 0.001)
    )
    assert (c.t_deliver, c.queueing) == pytest.approx((0.0135, 0.0005))
    assert (d.t_deliver, d.queueing) == pytest.approx((1.011, 0.0))
    for x in (a, b, c, d):
        assert parts(x) == pytest.approx(x.delay)


def test_wire_bytes_count_per_packet_overhead():
    p = LinkParams(rate=8e6, mss=1448, overhead=90, loss_mode="drop")
    assert p.packets(0) == 1
    assert p.packets(1448) == 1
    assert p.packets(1449) == 2
    assert p.wire_bytes(10_000) == 10_000 + 7 * 90
    d = Link(p).schedule(0.0, 10_000)
    assert d.serialization == pytest.approx((10_000 + 630) / 1e6)
    assert d.wire_bytes == 10_630
    assert d.packets == 7


def test_drop_mode_tail_drops_on_queue_limit():
    link = Link(LinkParams(**EXACT, queue_limit=3000))
    out = [link.schedule(0.0, 1000) for _ in range(4)]
    assert [x.dropped for x in out] == [False, False, False, True]
    assert out[3].reason == "queue"
    assert math.isinf(out[3].t_deliver)
    # 1.5 ms later 1500 bytes are still queued: 1000 more fit, 2000 do not
    assert not link.schedule(0.0015, 1000).dropped
    assert link.schedule(0.0015, 600).reason == "queue"


def test_tcp_mode_never_tail_drops_but_waits():
    link = Link(LinkParams(**{**EXACT, "loss_mode": "tcp"}, queue_limit=3000))
    out = [link.schedule(0.0, 1000) for _ in range(5)]
    assert not any(x.dropped for x in out)
    assert out[-1].queueing == pytest.approx(0.004)


def test_fifo_under_heavy_jitter():
    p = LinkParams(delay=0.1, jitter=0.1, distribution="uniform", rate=1e9)
    link = Link(p, seed=3, key=("link", 0, "down"))
    ds = [link.schedule(i * 0.001, 100) for i in range(2000)]
    t = np.array([d.t_deliver for d in ds])
    assert np.all(np.diff(t) >= 0)
    assert sum(d.hol > 0 for d in ds) > 100  # the clamp was needed
    for d in ds[:50]:
        assert parts(d) == pytest.approx(d.delay)


def test_drop_and_message_loss_modes():
    lossy = LinkParams(delay=0.01, loss=Bernoulli(0.01), loss_mode="drop")
    link = Link(lossy, seed=1)
    big = [link.schedule(i, 100 * 1448) for i in range(400)]  # 100 packets each
    frac = np.mean([d.dropped for d in big])
    assert frac == pytest.approx(1 - 0.99**100, abs=0.1)
    assert all(d.reason == "loss" for d in big if d.dropped)
    msg = Link(LinkParams(delay=0.01, loss=Bernoulli(0.3), loss_mode="message"), seed=1)
    frac = np.mean([msg.schedule(i, 100 * 1448).dropped for i in range(2000)])
    assert frac == pytest.approx(0.3, abs=0.04)


def test_tcp_mode_loss_becomes_delay_never_drop():
    p = LinkParams(delay=0.025, rate=10e6, loss=Bernoulli(0.01))
    link = Link(p, seed=2)
    ds = [link.schedule(10.0 * i, 1_000_000) for i in range(20)]
    assert not any(d.dropped for d in ds)
    assert sum(d.recovery for d in ds) > 0
    assert link.loss_stats.lost > 0
    clean = Link(LinkParams(delay=0.025, rate=10e6), seed=2).schedule(0.0, 1_000_000)
    assert clean.recovery == 0.0
    assert clean.slow_start > 0  # from cwnd 10 at 50 ms RTT
    assert parts(ds[0]) == pytest.approx(ds[0].delay)


def test_shared_bottleneck_serialises_links():
    b = Bottleneck(rate=8e6)
    x = Link(
        LinkParams(delay=0.0, mss=1000, overhead=0, loss_mode="drop"), bottleneck=b
    )
    y = Link(
        LinkParams(delay=0.0, mss=1000, overhead=0, loss_mode="drop"), bottleneck=b
    )
    assert x.schedule(0.0, 1000).t_deliver == pytest.approx(0.001)
    assert y.schedule(0.0, 1000).t_deliver == pytest.approx(0.002)
    # a slower own stage dominates (cut-through): 0.5 MB/s own, 1 MB/s shared
    z = Link(
        LinkParams(rate=4e6, mss=1000, overhead=0, loss_mode="drop"),
        bottleneck=Bottleneck(8e6),
    )
    assert z.schedule(0.0, 2000).t_deliver == pytest.approx(0.004)
    small = Bottleneck(8e6, queue_limit=1500)
    w = Link(LinkParams(mss=1000, overhead=0, loss_mode="drop"), bottleneck=small)
    assert not w.schedule(0.0, 1000).dropped
    assert w.schedule(0.0, 1000).reason == "bottleneck-queue"


def test_route_hook_scripts_drop_and_delay():
    def route(d):
        if d.index == 2:
            return d.dropped_by("scripted")
        if d.tag == "slow":
            return d.delayed_by(0.5)
        return d

    link = Link(LinkParams(delay=0.01), route=route)
    out = [
        link.schedule(0.1 * i, 100, tag="slow" if i == 3 else None) for i in range(5)
    ]
    assert out[2].dropped
    assert out[2].reason == "scripted"
    assert out[3].t_deliver == pytest.approx(0.81)
    assert out[3].scripted == 0.5
    assert out[4].t_deliver == pytest.approx(0.81)
    assert out[4].hol == pytest.approx(0.40)


def test_determinism_regardless_of_other_links():
    p = LinkParams(
        delay=0.05,
        jitter=0.02,
        distribution="normal",
        delay_correlation=0.5,
        rate=5e6,
        loss=GilbertElliott(0.01, 0.3),
    )

    def run(interleave):
        a = Link(p, seed=11, key=("link", 1, "up"))
        b = Link(p, seed=11, key=("link", 2, "up"))
        out = []
        for i in range(200):
            if interleave:
                for _ in range(i % 3):
                    b.schedule(i * 0.5, 50_000)
            out.append(a.schedule(i * 0.5, 20_000 + 100 * i))
        return out

    assert run(False) == run(True)
    other = Link(p, seed=11, key=("link", 2, "up")).schedule(0.0, 20_000)
    assert other != run(False)[0]


def test_delay_sequence_independent_of_message_sizes():
    p = LinkParams(delay=0.05, jitter=0.02, distribution="normal")
    a = Link(p, seed=4)
    b = Link(p, seed=4)
    pa = [a.schedule(i, 100).propagation for i in range(50)]
    pb = [b.schedule(i, 10_000 * (i % 7)).propagation for i in range(50)]
    assert pa == pb


def test_realised_propagation_has_configured_marginal():
    p = LinkParams(delay=0.05, jitter=0.01, distribution="normal")
    link = Link(p, seed=5)
    x = np.array([link.schedule(i, 10).propagation for i in range(5000)])
    m, s = Normal(0.05, 0.01).moments()
    assert x.mean() == pytest.approx(m, abs=4 * s / math.sqrt(x.size))
    assert x.std() == pytest.approx(s, rel=0.05)


def test_schedule_can_switch_loss_off_and_sizes_may_be_numpy_ints():
    changes = Schedule([(5.0, {"loss": None})])
    p = LinkParams(delay=0.01, loss=GilbertElliott(0.5, 0.1), loss_mode="drop")
    link = Link(p, seed=1, changes=changes)
    early = [link.schedule(float(i) / 10, np.int64(10_000)) for i in range(40)]
    assert any(d.dropped for d in early)
    n = link.loss_stats.packets
    late = [link.schedule(5.0 + i, 10_000) for i in range(40)]
    assert not any(d.dropped for d in late)
    assert link.loss_stats.packets == n


def test_time_varying_schedule():
    changes = Schedule(
        [(10.0, {"delay": 0.2}), (20.0, {"rate": 8e6, "loss_mode": "drop"})]
    )
    link = Link(LinkParams(delay=0.01, mss=1000, overhead=0), changes=changes)
    assert link.schedule(5.0, 1000).t_deliver == pytest.approx(5.01)
    assert link.schedule(10.0, 1000).t_deliver == pytest.approx(10.2)
    assert link.schedule(20.0, 1000).t_deliver == pytest.approx(20.201)
    assert link.params_at(15.0).delay == 0.2
    assert link.params_at(15.0).rate is None
    with pytest.raises(ValueError, match=r"Schedule change at t=1.0"):
        Link(LinkParams(), changes=Schedule([(1.0, {"speed": 1})]))
    with pytest.raises(ValueError, match=r"LinkParams.rate = -1"):
        Link(LinkParams(), changes=Schedule([(1.0, {"rate": -1})]))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"rate": -5.0}, r"LinkParams.rate = -5.0: must be > 0 bits/s or None"),
        ({"delay": -0.1}, r"LinkParams.delay = -0.1: must be >= 0 s"),
        (
            {"delay_correlation": 1.0},
            r"LinkParams.delay_correlation = 1.0: must be in \[0, 1\)",
        ),
        (
            {"distribution": "gauss"},
            r"LinkParams.distribution = 'gauss': must be one of",
        ),
        ({"distribution": "empirical"}, r"LinkParams.table = None: an Empirical table"),
        (
            {"loss_mode": "udp"},
            r"LinkParams.loss_mode = 'udp': must be one of 'tcp', 'drop'",
        ),
        ({"queue_limit": 0}, r"LinkParams.queue_limit = 0: must be >= 1"),
        ({"mss": 0}, r"LinkParams.mss = 0: must be in \[1, 65535\]"),
    ],
)
def test_params_validation_messages(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LinkParams(**kwargs)
