"""Fidelity accumulators and verdict logic (NETEM-REFERENCE §5)."""

import json

import numpy as np
import pytest

from netem.fidelity import FidelityMonitor
from netem.fidelitystats import Thresholds, nice_ceiling
from netem.link import Link
from netem.linkparams import LinkParams
from netem.loss import Bernoulli, GilbertElliott
from netem.lossprocess import LossStats
from netem.rng import stream


def run_links(mon, late, n=2000):
    up = LinkParams(
        delay=0.008,
        jitter=0.002,
        distribution="normal",
        rate=20e6,
        loss=GilbertElliott(0.01, 0.3),
    )
    link = Link(up, seed=1, key=("link", 0, "up"))
    mon.expect_link("up", up)
    lat = stream(9, "late").exponential(late, n) if late else np.zeros(n)
    for i in range(n):
        d = link.schedule(0.05 * i, 20_000)
        mon.record_delivery("up", d, d.t_deliver + lat[i])
    mon.record_loss("up", link.loss_stats)
    return mon


def test_clean_run_passes_and_is_json_able():
    mon = run_links(FidelityMonitor(), late=0.0002)
    for _ in range(200):
        mon.record_compute(1.0, 0.9)
    rep = mon.report()
    assert rep["verdict"] == "pass", rep["reasons"]
    assert rep["suggested_dilation"] == 1.0
    assert set(rep["lateness_ms"]) >= {"p50", "p99", "max"}
    assert rep["lateness_ms"]["p99"] < 1.5
    assert {c["check"] for c in rep["checks"]} >= {
        "lateness",
        "overruns",
        "delay_mean",
        "delay_std",
        "rate",
        "loss_rate",
        "burst_length",
    }
    assert rep["thresholds"]["lateness_floor"] == 1e-3
    json.dumps(rep)


def test_late_timers_fail_and_suggest_dilation():
    mon = run_links(FidelityMonitor(dilation=2.0), late=0.003)
    rep = mon.report()
    assert rep["verdict"] == "fail"
    assert any(r.startswith("lateness") for r in rep["reasons"])
    # allowed p99 = max(1 ms, 5 % of 8 ms) = 1 ms; p99 of Exp(3 ms) ~ 13.8 ms
    p99 = rep["lateness_ms"]["p99"]
    assert rep["lateness_ms"]["allowed_p99"] == pytest.approx(1.0)
    assert rep["suggested_dilation"] == nice_ceiling(2.0 * p99 / 1.0)
    assert rep["suggested_dilation"] >= 20


def test_compute_overruns_fail():
    mon = FidelityMonitor()
    for i in range(100):
        mon.record_compute(1.0, 1.8 if i < 5 else 0.5)
    rep = mon.report()
    assert rep["verdict"] == "fail"
    assert rep["compute"]["overruns"] == 5
    assert rep["suggested_dilation"] == 2.0  # p99 of actual/budget = 1.8
    mon = FidelityMonitor()
    for i in range(200):
        mon.record_compute(1.0, 1.8 if i < 2 else 0.5)  # exactly 1 %
    assert mon.report()["verdict"] == "pass"


def test_loss_outside_interval_fails_and_bursty_model_widens_it():
    mon = FidelityMonitor()
    mon.expect_loss("x", Bernoulli(0.01))
    mon.record_loss("x", LossStats(100_000, 1300, 1290))
    rep = mon.report()
    assert rep["verdict"] == "fail"
    assert any(r.startswith("loss_rate[x]") for r in rep["reasons"])
    # a GE model with the same mean and 10-packet bursts: 1.3 % is plausible
    mon = FidelityMonitor()
    mon.expect_loss("x", GilbertElliott(0.00101, 0.1))
    mon.record_loss("x", LossStats(100_000, 1300, 130))
    assert mon.report()["verdict"] == "pass", mon.report()["reasons"]


def test_delay_bias_fails_mean_check():
    mon = FidelityMonitor()
    mon.expect_delay("down", 0.1, 0.0)
    for _ in range(100):
        mon.record_delay("down", 0.107)  # beyond 2 % and the 5 ms lateness allowance
    rep = mon.report()
    assert [c["check"] for c in rep["checks"] if not c["ok"]] == ["delay_mean"]
    mon = FidelityMonitor(Thresholds(delay_mean_rel=0.1))
    mon.expect_delay("down", 0.1, 0.0)
    for _ in range(100):
        mon.record_delay("down", 0.107)
    assert mon.report()["verdict"] == "pass"


def test_too_few_samples_are_skipped():
    mon = FidelityMonitor()
    mon.expect_delay("k", 0.1, 0.01)
    mon.record_delay("k", 0.5)
    assert mon.report()["verdict"] == "pass"


def test_nice_ceiling():
    assert [nice_ceiling(x) for x in (0.5, 1.0, 1.2, 2.5, 4, 7, 10, 11, 160)] == [
        1,
        1,
        1.5,
        3,
        5,
        10,
        10,
        15,
        200,
    ]


def test_reservoir_keeps_exact_count_and_max():
    mon = FidelityMonitor(capacity=100)
    for i in range(10_000):
        mon.record_lateness(i * 1e-6)
    lat = mon.report()["lateness_ms"]
    assert lat["n"] == 10_000
    assert lat["max"] == pytest.approx(9.999)
    assert lat["p50"] == pytest.approx(5.0, abs=1.0)


def test_merging_thinned_exports_weighs_each_source_by_its_count():
    """A host's export is thinned to max_samples values; merged, they stand for
    the host's whole count, and no unfilled buffer slot leaks into a quantile."""
    server, host = FidelityMonitor(), FidelityMonitor()
    for _ in range(1_000):
        server.record_lateness(0.010)  # 1,000 samples at 10 ms
    for _ in range(30_000):
        host.record_lateness(0.001)  # 30,000 at 1 ms, exported as 3,000 values
    server.merge(json.loads(json.dumps(host.export(max_samples=3_000))))
    lat = server.report()["lateness_ms"]
    assert lat["n"] == 31_000
    assert lat["max"] == pytest.approx(10.0)
    assert lat["p50"] == pytest.approx(1.0)  # 97 % of the samples are 1 ms
    assert lat["p99"] == pytest.approx(10.0)  # the top 3 % are 10 ms
    assert min(server._late.values()) >= 0.001  # no unwritten slot (np.empty) read back

