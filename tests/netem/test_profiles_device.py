"""Profiles (docs/netem.md#profiles) and device compute models (docs/netem.md#devices)."""

import json
import math

import numpy as np
import pytest
from scipy import stats

from netem.device import RunTrace, SpeedFactor, StepTime, draw_devices
from netem.dist import LogNormal, Normal, Uniform
from netem.link import Link
from netem.linkparams import LinkParams
from netem.profiles import PROFILES, list_profiles, profile
from netem.rng import stream

REQUIRED = [
    "lan",
    "wifi-room",
    "wifi-floor",
    "wifi-building",
    "dsl",
    "cable",
    "4g",
    "4g-slow",
    "3g",
    "5g",
    "satellite-leo",
    "satellite-geo",
    "transatlantic",
]


@pytest.mark.parametrize("name", REQUIRED)
def test_every_profile_builds_links_with_sources(name):
    pl = profile(name)
    assert isinstance(pl.up, LinkParams)
    assert isinstance(pl.down, LinkParams)
    assert pl.up.delay + pl.down.delay == pytest.approx(PROFILES[name].rtt)
    assert PROFILES[name].sources
    Link(pl.down).schedule(0.0, 100_000)


def test_dga_latencies_and_preset_rates():
    rtts = {
        n: PROFILES[n].rtt for n in ("lan", "wifi-room", "wifi-floor", "wifi-building")
    }
    assert rtts == {
        "lan": 0.001,
        "wifi-room": 0.016,
        "wifi-floor": 0.132,
        "wifi-building": 0.470,
    }
    p = profile("4g-slow")
    assert (p.down.rate, p.up.rate) == (1.6384e6, 0.75e6)  # Lighthouse mobileSlow4G
    assert profile("dsl").up.rate == 384e3  # WebPageTest DSL
    assert profile("transatlantic").down.rate is None
    assert profile("wifi-room").down.loss.mean_loss_rate() == pytest.approx(
        0.0099, abs=1e-4
    )


def test_overrides_both_one_direction_and_rtt():
    p = profile(
        "wifi-floor", overrides={"jitter": 0.0, "up.rate": 1e6, "down.loss": None}
    )
    assert p.up.jitter == p.down.jitter == 0.0
    assert p.up.rate == 1e6
    assert p.down.rate == 20e6
    assert p.down.loss is None
    assert p.up.loss is not None
    p = profile("4g", overrides={"rtt": 0.2})
    assert p.up.delay == p.down.delay == 0.1
    with pytest.raises(ValueError, match=r"profile.overrides.speed = 3"):
        profile("4g", overrides={"speed": 3})
    with pytest.raises(ValueError, match=r"LinkParams.rate = -1"):
        profile("4g", overrides={"rate": -1})
    with pytest.raises(ValueError, match=r"profile.name = 'wifi': must be one of"):
        profile("wifi")


def test_listing_is_json_able_with_sources():
    rows = list_profiles()
    assert {r["name"] for r in rows} >= set(REQUIRED)
    assert all(r["sources"] for r in rows)
    json.dumps(rows)


# -- devices --------------------------------------------------------------------
def test_step_time_per_run_and_per_step():
    d = StepTime(Normal(0.01, 0.002))
    rng = stream(1, "dev")
    runs = np.array([d.compute_time(100, rng) for _ in range(2000)])
    assert runs.mean() == pytest.approx(1.0, rel=0.01)
    assert runs.std() == pytest.approx(0.2, rel=0.1)  # one draw per run
    ds = StepTime(Normal(0.01, 0.002), per="step")
    runs = np.array([ds.compute_time(100, rng) for _ in range(2000)])
    assert runs.std() == pytest.approx(0.02, rel=0.1)  # averages over steps
    assert d.compute_time(0, rng) == 0.0


def test_run_trace_and_speed_factor():
    t = RunTrace((1.0, 2.0, 3.0), steps_per_run=10)
    rng = stream(0, "x")
    assert [t.compute_time(10, rng, k) for k in range(4)] == [1.0, 2.0, 3.0, 1.0]
    assert t.compute_time(5, rng, 1) == 1.0
    assert SpeedFactor(2.0, 0.05).compute_time(10, rng) == pytest.approx(1.0)
    with pytest.raises(ValueError, match=r"SpeedFactor.factor = 0: must be > 0"):
        SpeedFactor(0, 0.05)


def test_heterogeneous_draw_is_recorded_and_reproducible():
    devs, rec = draw_devices(500, stream(3, "het"), step_time=LogNormal(0.05, 0.05))
    devs2, rec2 = draw_devices(500, stream(3, "het"), step_time=LogNormal(0.05, 0.05))
    assert rec == rec2
    assert devs == devs2
    json.dumps(rec)
    steps = np.array([c["step_time"] for c in rec["clients"]])
    assert stats.kstest(steps, LogNormal(0.05, 0.05).cdf).pvalue > 0.001
    assert rec["distribution"] == {"family": "LogNormal", "mean": 0.05, "jitter": 0.05}
    assert devs[7].compute_time(10, stream(0, "y")) == pytest.approx(10 * steps[7])
    devs, rec = draw_devices(
        10,
        stream(3, "f"),
        speed_factor=Uniform(2.0, 1.0),
        host_step_time=0.01,
        within_cv=0.1,
    )
    assert rec["kind"] == "speed_factor"
    assert "factor" in rec["clients"][0]
    assert devs[0].mean_step() == pytest.approx(rec["clients"][0]["step_time"])
    with pytest.raises(ValueError, match="exactly one"):
        draw_devices(3, stream(0, "z"))
    with pytest.raises(ValueError, match="host_step_time"):
        draw_devices(3, stream(0, "z"), speed_factor=Uniform(2.0, 1.0))
    assert math.isclose(devs[0].dist.moments()[1], 0.1 * devs[0].dist.moments()[0])
