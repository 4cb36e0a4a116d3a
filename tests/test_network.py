"""The scenario -> netem seam: profiles, groups, spreads, changes, devices, availability."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from fedsim.errors import ScenarioError
from fedsim.scenario import key_notes, load, parse, resolved, to_toml
from fedsim.scenario.network import NetPlan, NetworkError
from netem.profiles import profile

QUICKSTART = Path(__file__).resolve().parents[1] / "scenarios" / "quickstart.toml"


def _plan(**sections) -> NetPlan:
    raw = {"data": {"num_clients": 40}, **sections}
    return NetPlan(parse(raw))


def test_profile_applies_to_every_client_with_overrides() -> None:
    plan = _plan(network={"profile": "wifi-floor", "up": {"rate": 5e6}})
    ref = profile("wifi-floor")
    for c in (0, 39):
        assert plan.params(c, "down") == ref.down
        assert plan.params(c, "up").rate == 5e6
        assert plan.params(c, "up").delay == ref.up.delay


def test_explicit_links_without_profile() -> None:
    plan = _plan(network={"up": {"delay": 0.02, "jitter": 0.005, "distribution": "normal",
                                 "loss": {"model": "bernoulli", "p": 0.01}, "loss_mode": "drop"}})
    p = plan.params(3, "up")
    assert (p.delay, p.jitter, p.distribution, p.loss_mode) == (0.02, 0.005, "normal", "drop")
    assert p.loss.mean_loss_rate() == pytest.approx(0.01)
    assert plan.params(3, "down").delay == 0.0


def test_groups_mixture_is_deterministic_and_sized() -> None:
    net = {"profile": "cable", "groups": [
        {"name": "cell", "profile": "4g", "fraction": 0.25},
        {"name": "sat", "profile": "satellite-geo", "clients": [0, 1]}]}
    a, b = _plan(network=net), _plan(network=net)
    assert a.group_of == b.group_of
    assert a.group_of[:2] == ["sat", "sat"]
    assert a.group_of.count("cell") == round(0.25 * 38)
    cell = a.group_of.index("cell")
    assert a.params(cell, "down") == profile("4g").down
    assert a.params(0, "up") == profile("satellite-geo").up
    assert set(a.expectations()) >= {"default/up", "cell/down", "sat/up"}
    other = _plan(seed=5, network=net)
    assert other.group_of != a.group_of  # the draw depends on the seed


def test_spreads_are_per_client_recorded_and_disable_delay_checks() -> None:
    plan = _plan(network={"profile": "4g", "delay_spread": {"cv": 0.3},
                          "rate_spread": {"distribution": "uniform", "cv": 0.2}})
    delays = {plan.params(c, "down").delay for c in range(40)}
    assert len(delays) == 40
    rec = plan.record()
    assert len(rec["clients"]) == 40
    assert rec["clients"][7]["down"]["delay"] == plan.params(7, "down").delay
    json.dumps(rec)
    assert plan.expectations() == {}


def test_changes_build_a_schedule() -> None:
    plan = _plan(network={"up": {"delay": 0.01},
                          "changes": [{"at": 5.0, "up": {"delay": 0.2}}]})
    link = plan.make_link(0, "up")
    early = link.schedule(1.0, 100)
    late = link.schedule(6.0, 100)
    assert early.t_deliver == pytest.approx(1.01)
    assert late.t_deliver == pytest.approx(6.2)
    assert "default/up" not in plan.expectations()  # its delay changes mid-run


def test_devices_drawn_per_client_and_recorded() -> None:
    plan = _plan(devices={"step_time": 0.01, "distribution": "lognormal", "spread": 0.005})
    steps = [plan.device(c).mean_step() for c in range(40)]
    assert len(set(steps)) == 40
    assert sum(steps) / 40 == pytest.approx(0.01, rel=0.3)
    assert plan.record()["clients"][3]["step_time"] == pytest.approx(steps[3])


def test_devices_per_draws_the_variation_per_run_or_per_step() -> None:
    """Bug: ``devices.per`` was accepted but never read (always one draw per run)."""
    import numpy as np
    cv = 0.5
    spreads = {}
    for per in ("run", "step"):
        plan = _plan(devices={"step_time": 0.01, "within_cv": cv, "per": per})
        dev = plan.device(0)
        rng = np.random.default_rng(0)
        runs = np.array([dev.compute_time(400, rng) for _ in range(400)])
        assert runs.mean() == pytest.approx(4.0, rel=0.1)
        spreads[per] = runs.std() / runs.mean()
        assert plan.record()["devices"]["per"] == per
    # one draw per run keeps the step's cv; 400 draws per run divide it by 20
    assert spreads["run"] == pytest.approx(cv, rel=0.2)
    assert spreads["step"] == pytest.approx(cv / 20, rel=0.3)
    with pytest.raises(ScenarioError, match="within_cv"):
        _plan(devices={"step_time": 0.01, "per": "step"})


def test_availability_models() -> None:
    plan = _plan(availability={"model": "onoff", "mean_on": 1.0, "mean_off": 1.0})
    av = plan.availability(4)
    t, on = av.next_change(0.0)
    assert t > 0
    assert on is False
    sus = _plan(availability={"model": "suspension", "p": 0.3})
    assert sus.suspension(0).p == 0.3
    assert _plan().suspension(0) is None


def test_availability_trace_file(tmp_path: Path) -> None:
    path = tmp_path / "av.json"
    path.write_text(json.dumps({"period": 10.0, "clients": {"2": [[0, 4], [6, 8]]}}))
    plan = _plan(availability={"model": "trace", "trace": str(path)})
    av = plan.availability(2)
    assert av.is_available(1.0)
    assert not av.is_available(5.0)
    assert plan.availability(3).is_available(5.0)
    bad = _plan(availability={"model": "trace", "trace": str(tmp_path / "missing.json")})
    with pytest.raises(NetworkError, match=r"availability\.trace"):
        bad.availability(2)


def test_bad_network_settings_name_the_field() -> None:
    with pytest.raises(ScenarioError, match=r"network.profile.*'wifi-floor'"):
        parse({"network": {"profile": "wifi-mars"}})
    with pytest.raises(ScenarioError, match="exactly one of clients"):
        parse({"network": {"groups": [{"profile": "4g"}]}})
    with pytest.raises(ScenarioError, match=r"fractions add up to 1\.2"):
        parse({"network": {"groups": [{"fraction": 0.6}, {"fraction": 0.6}]}})
    with pytest.raises(ScenarioError, match="gilbert-elliott loss needs r"):
        parse({"network": {"up": {"loss": {"model": "gilbert-elliott", "p": 0.1}}}})
    with pytest.raises(NetworkError, match="client 50 does not exist"):
        _plan(network={"groups": [{"clients": [50]}]})
    with pytest.raises(NetworkError, match=r"network\.up\.table"):
        _plan(network={"up": {"distribution": "empirical", "table": "/nonexistent"}})


def test_the_least_transfer_follows_the_links_spreads_and_changes() -> None:
    plan = _plan(network={"down": {"delay": 0.02, "jitter": 0.01, "rate": 1e6},
                          "delay_spread": {"cv": 0.3},
                          "changes": [{"at": 5.0, "down": {"delay": 0.2, "rate": 2e6}}]})
    for c in (0, 7):
        before, after = plan.params(c, "down"), replace(plan.params(c, "down"), delay=0.2,
                                                        rate=2e6)
        assert plan.least_transfer(c, "down", 10_000, 4.9) == before.least_delay(10_000)
        assert plan.least_transfer(c, "down", 10_000, 5.0) == after.least_delay(10_000)
        # what the client's own link does, message by message, is never less
        link = plan.make_link(c, "down")
        for t in (0.0, 2.0, 4.0, 6.0, 8.0):
            d = link.schedule(t, 10_000)
            assert d.t_deliver - t >= plan.least_transfer(c, "down", 10_000, t) - 1e-12
    assert plan.least_transfer(0, "down", 10_000, 0.0) != plan.least_transfer(7, "down",
                                                                              10_000, 0.0)


def test_the_least_compute_is_the_devices_floor() -> None:
    plan = _plan(devices={"step_time": 0.01, "distribution": "uniform", "spread": 0.005})
    for c in range(5):
        assert plan.least_compute(c, 4) == pytest.approx(4 * plan.device(c).mean_step())
    noisy = _plan(devices={"step_time": 0.01, "within_cv": 0.5})
    assert 0.0 < noisy.least_compute(0, 4) < 0.05 * 4 * 0.01  # its log-normal's floor


def test_fedsim_check_marks_the_keys_that_replace_the_profiles_values() -> None:
    """A key set next to a named profile replaces its value: the quickstart's 50 ms
    delays stay under ``--set network.profile=satellite-geo`` (a user took the run for a
    satellite link); ``fedsim check`` (and a run's scenario.toml) say so next to each."""
    sc = load(QUICKSTART, ["network.profile=satellite-geo"])
    notes = key_notes(sc)
    assert notes["network.up.delay"] == ("replaces profile satellite-geo's 0.3 (leave it out "
                                         "to take it)")
    assert notes["network.down.delay"].startswith("replaces profile satellite-geo's 0.3")
    assert not any(k.startswith("network.") for k in key_notes(load(QUICKSTART)))
    text = to_toml(resolved(sc), notes)
    assert "delay = 0.05  # replaces profile satellite-geo's 0.3 (leave it out to take it)" in text
    rtt = load(QUICKSTART, ["network.profile=4g", "network.rtt=0.1", "network.up.rate=1e6"])
    assert key_notes(rtt)["network.rtt"].startswith("replaces profile 4g's ")
    assert key_notes(rtt)["network.up.rate"].startswith("replaces profile 4g's ")
