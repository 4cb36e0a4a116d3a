"""Fidelity accumulators and verdict logic (docs/netem.md#fidelity)."""

import json

import numpy as np
import pytest

from netem.fidelity import FidelityMonitor
from netem.fidelitystats import Thresholds, binomial_limit, nice_ceiling
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
    # allowed = max(1 ms, 5 % of 8 ms) = 1 ms; Exp(3 ms) is later than that 72 % of the time
    lat = rep["lateness_ms"]
    assert lat["allowed_p99"] == pytest.approx(1.0)
    assert lat["late_limit"] == binomial_limit(2000, 0.01, 0.99)
    assert lat["late"] > 1000
    # at the suggestion at most late_limit timers stay later than 1 ms: the
    # (late_limit + 1)-th largest lateness over 1 ms is the factor
    v = np.sort(mon._late.values())
    assert rep["suggested_dilation"] == nice_ceiling(
        2.0 * v[v.size - lat["late_limit"] - 1] / 1e-3 * (1 + 1e-9))
    assert rep["suggested_dilation"] >= 20


def test_compute_overruns_fail():
    mon = FidelityMonitor()
    for i in range(100):
        mon.record_compute(1.0, 1.8 if i < 5 else 0.5)
    rep = mon.report()
    assert rep["verdict"] == "fail"  # 5 of 100: a 1 % rate reaches 5 with 0.34 %
    assert rep["compute"]["overruns"] == 5
    assert rep["compute"]["overrun_limit"] == 4
    assert rep["suggested_dilation"] == 2.0  # then at most 4 above: the 5th ratio, 1.8
    mon = FidelityMonitor()
    for i in range(100):
        mon.record_compute(1.0, 1.8 if i < 4 else 0.5)  # 4 %, but 1.8 % likely at 1 %
    assert mon.report()["verdict"] == "pass"


def test_binomial_limit_against_the_distribution():
    """The limit is the smallest c with P(X > c) <= 1 - confidence, X ~ Binomial(n, p):
    checked against the tail summed exactly in rationals, and against a simulation."""
    from fractions import Fraction
    from math import comb

    def tail(n, p, c):  # P(X > c), exact
        p = Fraction(p)
        return 1 - sum(comb(n, k) * p**k * (1 - p) ** (n - k) for k in range(c + 1))

    for n in (1, 10, 30, 100, 150, 400, 1000):
        c = binomial_limit(n, 0.01, 0.99)
        assert tail(n, "0.01", c) <= Fraction("0.01")
        assert c == 0 or tail(n, "0.01", c - 1) > Fraction("0.01")
    assert [binomial_limit(n, 0.01, 0.99) for n in (100, 400, 1000)] == [4, 9, 18]
    big = binomial_limit(100_000, 0.01, 0.99)
    assert 1070 <= big <= 1078  # 1,000 + 2.326 sd (31.5), the normal approximation
    draws = np.random.default_rng(3).binomial(100_000, 0.01, 200_000)
    assert 0.005 < np.mean(draws > big) <= 0.012
    assert binomial_limit(0, 0.01, 0.99) == 0
    assert binomial_limit(50, 0.0, 0.99) == 0


def test_a_few_late_timers_are_no_evidence_and_many_are():
    """Two late timers of 102 (a p99 above the allowance, the second-largest value)
    pass; as many late as a 1 % rate would reach in under 1 % of runs fail."""
    def run(n, late):
        mon = FidelityMonitor()
        for i in range(n):
            mon.record_lateness(0.004 if i < late else 0.0002)
        return mon.report()
    rep = run(102, 2)
    assert rep["lateness_ms"]["p99"] > rep["lateness_ms"]["allowed_p99"]
    assert rep["verdict"] == "pass", rep["reasons"]
    assert rep["lateness_ms"]["late"] == 2
    limit = binomial_limit(102, 0.01, 0.99)
    assert run(102, limit)["verdict"] == "pass"
    rep = run(102, limit + 1)
    assert rep["verdict"] == "fail"
    assert rep["reasons"] == [f"lateness: {limit + 1} outside <= {limit} of 102 timers later "
                              "than 0.001 s (1 % at 99 %)"]
    # at the suggested dilation (4 ms / k <= 1 ms) every timer is on time
    assert rep["suggested_dilation"] == 5.0
    # a long run's limit is close to 1 %: 1.2 % late of 20,000 fails
    assert run(20_000, 240)["verdict"] == "fail"


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



# -- suggested dilation and the rate check (regressions) -----------------------
TIMING_CHECKS = {"lateness", "overruns", "rate", "delay_mean", "delay_std"}


class Run:
    """A run's observations, replayable at another dilation.

    Real lateness and real compute time do not depend on the dilation, so in
    emulated time both scale as ``dilation / new_dilation``; everything else
    (the link model's arithmetic, loss counts) is identical.
    """

    def __init__(self, dilation: float = 1.0) -> None:
        self.dilation = dilation
        self.links: list[tuple[str, LinkParams]] = []
        self.deliveries: list[tuple[str, object, float]] = []
        self.computes: list[tuple[float, float]] = []
        self.losses: list[tuple[str, LossStats]] = []

    def link(self, kind, params, n, size, late, gap=0.05, seed=1):
        """``n`` messages of ``size`` bytes, ``gap`` s apart; ``late[i]`` emulated s late."""
        self.links.append((kind, params))
        link = Link(params, seed=seed, key=("link", kind))
        for i in range(n):
            self.deliveries.append((kind, link.schedule(gap * i, size), float(late[i])))
        self.losses.append((kind, link.loss_stats))

    def monitor(self, dilation: float | None = None) -> FidelityMonitor:
        new = self.dilation if dilation is None else dilation
        s = self.dilation / new
        mon = FidelityMonitor(dilation=new)
        for kind, params in self.links:
            mon.expect_link(kind, params)
        for kind, d, late in self.deliveries:
            mon.record_delivery(kind, d, d.t_deliver + late * s)
        for budget, actual in self.computes:
            mon.record_compute(budget, actual * s)
        for kind, stats in self.losses:
            mon.record_loss(kind, stats)
        return mon


def failing(rep):
    return {(c["check"], c["kind"]) for c in rep["checks"] if not c["ok"]}


def assert_suggestion_fixes_timing(run: Run) -> dict:
    """The verdict fails; the suggestion is above the dilation in use, and at
    the suggested dilation every timing check passes."""
    rep = run.monitor().report()
    assert rep["verdict"] == "fail"
    suggested = rep["suggested_dilation"]
    assert suggested > run.dilation, rep["reasons"]
    again = run.monitor(suggested).report()
    assert {c for c in failing(again) if c[0] in TIMING_CHECKS} == set(), again["reasons"]
    return rep


@pytest.mark.parametrize("dilation", [1.0, 2.0, 7.0])
def test_overruns_suggest_a_larger_dilation_that_passes(dilation):
    # 6 overruns in 150 (a 1 % rate allows 5): the interpolated p99 of
    # actual/budget is below 1.01, so a p99 rule would suggest too little.
    run = Run(dilation)
    run.computes = [(1.0, 0.5)] * 144 + [(1.0, 1.01)] * 6
    rep = assert_suggestion_fixes_timing(run)
    assert failing(rep) == {("overruns", None)}
    assert rep["suggested_dilation"] == nice_ceiling(dilation * 1.01 * (1 + 1e-9))


def test_late_timers_suggestion_passes_when_replayed():
    run = Run(2.0)
    up = LinkParams(delay=0.008, jitter=0.002, distribution="normal", rate=20e6)
    run.link("up", up, 2000, 20_000, stream(9, "late").exponential(0.003, 2000))
    rep = assert_suggestion_fixes_timing(run)
    assert ("lateness", None) in failing(rep)


def test_non_timing_failure_still_suggests_a_larger_dilation():
    # A loss rate outside its interval does not depend on timing; the verdict
    # fails all the same, so the suggestion must not be the dilation in use.
    for dilation in (1.0, 1.5, 3.0):
        mon = FidelityMonitor(dilation=dilation)
        mon.expect_loss("x", Bernoulli(0.01))
        mon.record_loss("x", LossStats(100_000, 1300, 1290))
        rep = mon.report()
        assert failing(rep) == {("loss_rate", "x")}
        assert rep["suggested_dilation"] == nice_ceiling(dilation * (1 + 1e-9)) > dilation
        assert rep["unfixable_by_dilation"] == ["loss_rate[x]"]


def test_delay_mean_from_lateness_suggestion_passes_when_replayed():
    # 3 ms of lateness on a 20 ms constant delay: the realised mean is 15 % off
    run = Run(1.0)
    p = LinkParams(delay=0.020)
    run.link("k", p, 500, 1000, np.full(500, 0.003))
    rep = assert_suggestion_fixes_timing(run)
    assert {("lateness", None), ("delay_mean", "k")} <= failing(rep)


def test_delay_std_from_lateness_suggestion_passes_when_replayed():
    # jittery lateness (std 8.7 ms) widens a 1 ms delay std beyond the 5 ms
    # allowance (its tolerance): the suggestion must fix that check too
    run = Run(1.0)
    p = LinkParams(delay=0.100, jitter=0.001, distribution="normal")
    late = stream(3, "late").uniform(0.0, 0.030, 2000)
    run.link("k", p, 2000, 1000, late)
    rep = assert_suggestion_fixes_timing(run)
    assert ("delay_std", "k") in failing(rep)
    std = next(c for c in rep["checks"] if c["check"] == "delay_std")
    assert 1 < std["needs_factor"] < rep["suggested_dilation"]


FAST = LinkParams(delay=0.050, rate=1e9)  # allowed lateness: 5 % of 50 ms = 2.5 ms
MSG = 57_000  # serialises in 0.46 ms at 1 Gbit/s


def test_fast_link_with_ordinary_lateness_passes_the_rate_check():
    late = stream(4, "late").uniform(0.0001, 0.0015, 2000)
    run = Run(1.0)
    run.link("fast", FAST, 2000, MSG, late)
    rep = run.monitor().report()
    assert rep["verdict"] == "pass", rep["reasons"]
    link = rep["links"]["fast"]
    assert link["rate_realised"] == pytest.approx(link["rate_nominal"])
    # charging every message's whole lateness, as before, would say 0.3-0.4
    assert 0.2 < link["rate_realised_all_lateness"] / link["rate_nominal"] < 0.5
    assert rep["suggested_dilation"] == 1.0


def test_rate_allowance_is_the_merging_monitors():
    # A client host records its downlinks without configuration (its own
    # allowance would be the 1 ms floor); the server that merges its export
    # knows the links, and its allowance (2.5 ms) is the one that applies.
    host = FidelityMonitor()
    link = Link(FAST, seed=2, key=("down",))
    late = stream(5, "late").uniform(0.0001, 0.0015, 500)
    for i in range(500):
        d = link.schedule(0.05 * i, MSG)
        host.record_delivery("fast", d, d.t_deliver + late[i])
    server = FidelityMonitor()
    server.expect_link("fast", FAST)
    server.merge(json.loads(json.dumps(host.export())))
    rep = server.report()
    assert rep["verdict"] == "pass", rep["reasons"]


def test_under_rate_link_fails_the_rate_check():
    # 1 Mbit/s nominal, really 0.8 Mbit/s: each 57 KB message is 25 % of its
    # serialisation (0.12 s) late, far beyond the allowance.
    slow = LinkParams(delay=0.050, rate=1e6)
    run = Run(1.0)
    ser = slow.serialization(MSG)
    run.link("slow", slow, 100, MSG, np.full(100, 0.25 * ser), gap=1.0)
    rep = assert_suggestion_fixes_timing(run)
    assert ("rate", "slow") in failing(rep)
    link = rep["links"]["slow"]
    ratio = link["rate_realised"] / link["rate_nominal"]
    # charged: 0.12 s - 2.5 ms of each message's lateness
    assert ratio == pytest.approx(ser / (ser + 0.25 * ser - 0.0025), rel=0.02)


def test_fast_link_beyond_the_allowance_fails_and_the_suggestion_passes():
    run = Run(1.0)
    run.link("fast", FAST, 2000, MSG, stream(6, "late").uniform(0.002, 0.004, 2000))
    rep = assert_suggestion_fixes_timing(run)
    assert ("rate", "fast") in failing(rep)
