"""Loss models (docs/netem.md#loss)."""

import math

import numpy as np
import pytest
from scipy import stats

from netem.loss import Bernoulli, FourState, GilbertElliott
from netem.lossprocess import LossProcess, ScriptedLoss
from netem.rng import stream


def proc(model, seed=1, name="x"):
    return model.process(
        stream(seed, name, "loss-state"), stream(seed, name, "loss-draw")
    )


def ci_ok(model, stats_, z=4.0):
    mu = model.mean_loss_rate()
    se = math.sqrt(mu * (1 - mu) * model.variance_inflation() / stats_.packets)
    return abs(stats_.rate - mu) <= z * se


def test_bernoulli_rate_within_ci_and_chi_square():
    p = proc(Bernoulli(0.02))
    lost = p.draw(100_000)
    assert ci_ok(Bernoulli(0.02), p.stats)
    k = int(lost.sum())
    chi = stats.chisquare([k, lost.size - k], [2000, 98_000])
    assert chi.pvalue > 0.001
    assert p.stats.mean_burst == pytest.approx(1 / 0.98, rel=0.03)


@pytest.mark.parametrize(
    "model",
    [
        GilbertElliott(0.01, 0.3),
        GilbertElliott(0.02, 0.2, loss_bad=0.5, loss_good=0.01),
        GilbertElliott.from_durations(good=200, bad=2),
    ],
    ids=str,
)
def test_gilbert_elliott_rate_and_burst(model):
    p = proc(model)
    p.draw(300_000)
    s = p.stats
    assert ci_ok(model, s)
    b = model.mean_burst_length()
    sd = math.sqrt(max(b * (b - 1), 0.25))
    assert abs(s.mean_burst - b) < 4 * sd / math.sqrt(s.bursts) + 0.02 * b


def test_simple_gilbert_closed_forms():
    g = GilbertElliott(0.01, 0.25)
    assert g.mean_loss_rate() == pytest.approx(0.01 / 0.26)
    assert g.mean_burst_length() == pytest.approx(4.0)
    lam = 1 - 0.01 - 0.25
    assert g.variance_inflation() == pytest.approx((1 + lam) / (1 - lam))
    assert GilbertElliott.from_durations(200, 2) == GilbertElliott(0.005, 0.5)


def test_simple_gilbert_burst_lengths_are_geometric():
    r = 0.4
    p = proc(GilbertElliott(0.05, r), seed=3)
    lost = p.draw(200_000)
    # run lengths of consecutive losses
    edges = np.diff(np.concatenate(([0], lost.astype(int), [0])))
    runs = np.flatnonzero(edges == -1) - np.flatnonzero(edges == 1)
    obs = np.bincount(runs, minlength=8)[1:8].astype(float)
    obs = np.append(obs, np.sum(runs >= 8))
    k = np.arange(1, 8)
    pk = r * (1 - r) ** (k - 1)
    exp = np.append(pk, (1 - r) ** 7) * runs.size
    assert stats.chisquare(obs, exp).pvalue > 0.001


def test_four_state_defaults_reduce_to_bernoulli():
    f = FourState(0.05)
    assert f.p31 == pytest.approx(0.95)
    assert f.mean_loss_rate() == pytest.approx(0.05)
    assert f.mean_burst_length() == pytest.approx(1 / 0.95)


def test_four_state_full_model_matches_simulation():
    f = FourState(0.01, 0.3, 0.2, 0.4, 0.02)
    p = proc(f, seed=5)
    p.draw(300_000)
    assert ci_ok(f, p.stats)
    b = f.mean_burst_length()
    assert p.stats.mean_burst == pytest.approx(b, rel=0.05)


def test_batch_draws_equal_single_draws_and_streams_are_separate():
    m = GilbertElliott(0.05, 0.3, loss_bad=0.7, loss_good=0.01)
    a, b = proc(m), proc(m)
    x = a.draw(1000)
    y = np.concatenate([b.draw(1) for _ in range(1000)])
    np.testing.assert_array_equal(x, y)
    assert a.stats == b.stats
    # Transitions use only the state stream: same state stream + different
    # loss stream keeps the set of bad-state packets (loss_bad = 1, good = 0).
    g = GilbertElliott(0.05, 0.3)
    s1 = LossProcess(g, stream(1, "st"), stream(1, "l1")).draw(5000)
    s2 = LossProcess(g, stream(1, "st"), stream(1, "l2")).draw(5000)
    np.testing.assert_array_equal(s1, s2)


def test_scripted_loss_counts_bursts_across_calls():
    s = ScriptedLoss([1, 2, 3, 7])
    assert s.draw(3).tolist() == [False, True, True]
    assert s.draw(5).tolist() == [True, False, False, False, True]
    assert (s.stats.packets, s.stats.lost, s.stats.bursts) == (8, 4, 2)


@pytest.mark.parametrize(
    ("ctor", "match"),
    [
        (
            lambda: Bernoulli(1.5),
            r"Bernoulli.p = 1.5: must be a probability in \[0, 1\]",
        ),
        (lambda: GilbertElliott(0.1, -0.1), r"GilbertElliott.r = -0.1"),
        (
            lambda: FourState(0.6, p14=0.5),
            r"FourState.p14 = 0.5: p13 \+ p14 must be <= 1",
        ),
    ],
)
def test_validation(ctor, match):
    with pytest.raises(ValueError, match=match):
        ctor()


def test_idle_runs_the_chain_through_the_silence():
    """From the bad state, k idle slots give row 'bad' of T^k; long silences the stationary law."""
    g = GilbertElliott(0.05, 0.2)
    t = g.transition_matrix()
    for k, expect in ((3, np.linalg.matrix_power(t, 3)[1, 1]), (10_000, g.stationary()[1])):
        p = proc(g, seed=k)
        bad = 0
        for _ in range(20_000):
            p._s = 1  # start each trial in the bad state
            p.idle(k)
            bad += p._s
        se = math.sqrt(expect * (1 - expect) / 20_000)
        assert abs(bad / 20_000 - expect) < 4 * se


def test_idle_preserves_the_loss_rate_and_censors_bursts():
    g = GilbertElliott.from_durations(good=50, bad=4)
    p = proc(g, seed=3)
    rng = np.random.default_rng(0)
    for _ in range(20_000):
        p.draw(int(rng.integers(1, 20)))
        p.idle(float(rng.exponential(5.0)))
    s = p.stats
    assert ci_ok(g, s)
    assert s.cut > 0
    b = g.mean_burst_length()  # censored-geometric estimate stays unbiased
    assert abs(s.mean_burst - b) < 4 * math.sqrt(b * (b - 1) / s.ended) + 0.02 * b


def test_idle_is_a_no_op_below_one_slot_and_for_bernoulli():
    a, b = proc(Bernoulli(0.1), seed=5), proc(Bernoulli(0.1), seed=5)
    a.idle(1e9)
    assert (a.draw(1000) == b.draw(1000)).all()
    g1, g2 = proc(GilbertElliott(0.1, 0.3), seed=6), proc(GilbertElliott(0.1, 0.3), seed=6)
    g1.idle(0.5)
    assert (g1.draw(1000) == g2.draw(1000)).all()
