"""Mahimahi delivery traces and trace-driven serialisation (docs/netem.md#time-varying-links)."""

import pytest

from netem.link import Link
from netem.linkparams import LinkParams
from netem.trace import (
    TRACE_DIR,
    DeliveryTrace,
    Schedule,
    TraceServer,
    bundled_trace,
    bursty_example,
    trace_from_rates,
)


def test_constant_trace_is_12_mbps():
    t = bundled_trace("constant-12mbps")
    assert t.timestamps_ms == (1,)
    assert t.mean_rate == pytest.approx(12e6)
    assert t.period == 0.001


def test_bundled_bursty_trace_is_reproducible_from_its_generator():
    assert bundled_trace("bursty").timestamps_ms == bursty_example().timestamps_ms
    assert (TRACE_DIR / "bursty.trace").read_text() == bursty_example().to_text()
    assert bursty_example().mean_rate == pytest.approx(12.6e6, rel=1e-3)
    with pytest.raises(ValueError, match=r"bundled_trace.name = 'nope'"):
        bundled_trace("nope")


def test_parse_and_validate(tmp_path):
    f = tmp_path / "x.trace"
    f.write_text("0\n0\n3\n5\n")
    t = DeliveryTrace.from_file(f)
    assert t.timestamps_ms == (0, 0, 3, 5)
    assert t.name == "x"
    # wraps with period = last timestamp
    assert [t.opportunity_time(g) for g in range(6)] == pytest.approx(
        [0.0, 0.0, 0.003, 0.005, 0.005, 0.005]
    )
    assert t.capacity(0.0, 0.01) == 7 * 1500  # 0, 0, 3, 5 | 5, 5, 8
    with pytest.raises(
        ValueError, match=r"timestamps_ms\[1\] = 2: must be an int >= 3"
    ):
        DeliveryTrace((3, 2, 5))
    with pytest.raises(ValueError, match="period"):
        DeliveryTrace((0, 0))


def test_server_byte_accounting_and_wasted_opportunities():
    s = TraceServer(bundled_trace("constant-12mbps"))  # opportunities at 1, 2, ... ms
    assert s.serve(0.0, 1500) == pytest.approx(0.001)
    assert s.serve(0.0, 1500) == pytest.approx(0.002)  # queued: next opportunity
    assert s.serve(0.0, 3000) == pytest.approx(0.004)
    # arrives after the last used opportunity: starts fresh at the next one
    assert s.serve(0.0105, 100) == pytest.approx(0.011)
    # queued behind: shares the 1400 bytes left at 11 ms
    assert s.serve(0.0105, 1400) == pytest.approx(0.011)
    assert s.serve(0.0105, 1) == pytest.approx(0.012)
    # arriving later: leftover of 12 ms is wasted
    assert s.serve(0.05, 1500) == pytest.approx(0.05)


def test_trace_driven_link_rate():
    p = LinkParams(
        trace=bundled_trace("constant-12mbps"), mss=1448, overhead=52, loss_mode="drop"
    )
    link = Link(p)
    d = link.schedule(0.0, 100 * 1448)  # 100 x 1500 wire bytes
    assert d.serialization == pytest.approx(0.100)  # opportunities at 1..100 ms
    big = Link(p).schedule(0.0, 10_000 * 1448)
    assert 8 * big.wire_bytes / big.serialization == pytest.approx(12e6, rel=1e-3)


def test_bursty_trace_outage_holds_bytes():
    p = LinkParams(trace=bundled_trace("bursty"), loss_mode="drop", overhead=52)
    d = Link(p).schedule(0.5005, 1448)  # sent during the 0.5-0.7 s outage
    assert d.t_deliver == pytest.approx(0.701)
    over_cycles = Link(p).schedule(0.0, 2_000 * 1448)  # ~3 MB: ~1.9 s
    rate = 8 * over_cycles.wire_bytes / over_cycles.serialization
    assert 6e6 < rate < 24e6


def test_trace_from_rates_long_run_rate():
    t = trace_from_rates([3e6, 9e6], 500)
    assert t.mean_rate == pytest.approx(6e6, rel=0.01)
    assert t.period == 1.0


def test_trace_and_rate_are_exclusive():
    with pytest.raises(ValueError, match="exclusive with rate"):
        LinkParams(rate=1e6, trace=bundled_trace("constant-12mbps"))


def test_schedule_periodic_and_timeline():
    s = Schedule.periodic(15.0, [{"delay": 0.02}, {"delay": 0.04}], until=60.0)
    assert [t for t, _ in s.changes] == [0.0, 15.0, 30.0, 45.0, 60.0]
    link = Link(LinkParams(delay=0.03), changes=s)
    assert link.params_at(16.0).delay == 0.04
    assert link.params_at(31.0).delay == 0.02
    with pytest.raises(ValueError, match=r"Schedule.changes\[0\].t = -1"):
        Schedule([(-1, {})])
