"""rng streams and delay distributions (docs/netem.md#delay-and-jitter)."""

import math
import os
import subprocess
import sys
from statistics import NormalDist

import numpy as np
import pytest
from scipy import stats

from netem.delayprocess import DelayProcess
from netem.dist import (
    Constant,
    LogNormal,
    Normal,
    Pareto,
    ParetoNormal,
    Uniform,
    make_dist,
)
from netem.empirical import Empirical
from netem.rng import key_digest, stream
from netem.stdnormal import norm_cdf, norm_ppf

N = 20_000


# -- rng -----------------------------------------------------------------------
def test_stream_is_reproducible_and_keyed():
    a = stream(7, "link", 3, "down", "delay").random(5)
    b = stream(7, "link", 3, "down", "delay").random(5)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, stream(7, "link", 3, "down", "loss-draw").random(5))
    assert not np.array_equal(a, stream(8, "link", 3, "down", "delay").random(5))
    # type-tagged and length-prefixed keys
    assert key_digest("1") != key_digest(1)
    assert key_digest("ab", "c") != key_digest("a", "bc")


def test_stream_digest_is_stable_across_processes():
    # Pinned: Python's randomised hash() would change between runs.
    assert key_digest("link", 1, "up") == (
        3198527743,
        3181351998,
        554588415,
        3202704101,
    )
    code = "from netem.rng import stream; print(stream(5, 'link', 1, 'up').random())"
    outs = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": hs},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for hs in ("0", "1", "random")
    }
    assert outs == {f"{stream(5, 'link', 1, 'up').random()}\n"}


@pytest.mark.parametrize("seed", [-1, 1.5, True])
def test_stream_rejects_bad_seed(seed):
    with pytest.raises(ValueError, match="seed"):
        stream(seed, "x")


def test_stream_rejects_bad_key():
    with pytest.raises(ValueError, match="str or an int"):
        stream(0, 1.5)


# -- normal helpers -------------------------------------------------------------
def test_norm_helpers_match_stdlib():
    nd = NormalDist()
    u = np.linspace(1e-6, 1 - 1e-6, 101)
    np.testing.assert_allclose(
        norm_ppf(u), [nd.inv_cdf(x) for x in u], rtol=0, atol=1e-12
    )
    z = np.linspace(-6, 6, 101)
    np.testing.assert_allclose(
        norm_cdf(z), [nd.cdf(x) for x in z], rtol=1e-12, atol=1e-15
    )
    assert np.isfinite(norm_ppf([0.0, 1.0])).all()


# -- families -------------------------------------------------------------------
CONTINUOUS = [
    Uniform(0.1, 0.05),
    Normal(0.1, 0.02),
    ParetoNormal(0.1, 0.03),
    LogNormal(0.05, 0.08),
    Empirical(tuple(np.random.default_rng(0).gamma(2.0, 0.01, 500))),
]


@pytest.mark.parametrize("d", CONTINUOUS, ids=lambda d: type(d).__name__)
def test_samples_follow_own_cdf_ks(d):
    x = d.sample(stream(1, "ks", type(d).__name__), N)
    assert stats.kstest(x, d.cdf).pvalue > 0.001


@pytest.mark.parametrize(
    "d", [*CONTINUOUS, Pareto(0.1, 0.03)], ids=lambda d: type(d).__name__
)
def test_ppf_inverts_cdf_and_moments_match_samples(d):
    u = np.linspace(0.001, 0.999, 999)
    x = d.ppf(u)
    assert np.all(np.diff(x) >= 0)
    if not isinstance(d, Pareto | Empirical):  # flat at Pareto's atom / between ties
        np.testing.assert_allclose(d.cdf(x), u, atol=2e-5)
    m, s = d.moments()
    x = d.sample(stream(2, "mom"), 200_000)
    assert abs(x.mean() - m) < 4 * s / math.sqrt(x.size)
    assert abs(x.std() - s) / s < 0.03


def test_pareto_matches_netem_table_and_its_atom():
    d = Pareto(1.0, 0.1)
    # pareto.c: (1/v^(1/3) - 1.5) * 4/3 with v = 1 - u, clipped at 4 sigma.
    assert d.ppf(0.0) == pytest.approx(1.0 + 0.1 * (1 - 1.5) * 4 / 3)
    assert d.ppf(0.5) == pytest.approx(1.0 + 0.1 * (0.5 ** (-1 / 3) - 1.5) * 4 / 3)
    assert d.ppf(1.0) == pytest.approx(1.4)
    x = d.sample(stream(3, "pareto"), N)
    upper = 1.4
    atom = np.mean(x >= upper - 1e-12)
    p_atom = 4.5**-3  # P(1/v^(1/3) > 4.5)
    assert abs(atom - p_atom) < 4 * math.sqrt(p_atom * (1 - p_atom) / N)
    below = x[x < upper - 1e-12]
    f_top = float(d.cdf(upper - 1e-9))
    assert stats.kstest(below, lambda v: d.cdf(v) / f_top).pvalue > 0.001
    m = d.moments()[0]
    assert m == pytest.approx(1.0 - 0.1 * 4 / 3 / (2 * 4.5**2), rel=1e-4)


def test_paretonormal_is_the_quantile_mix_of_netem():
    d = ParetoNormal(0.0, 1.0)  # mean 0 would clip at 0; check the raw shape
    u = np.array([0.3, 0.6, 0.9])
    raw = 0.25 * norm_ppf(u) + 0.75 * np.minimum(((1 - u) ** (-1 / 3) - 1.5) * 4 / 3, 4)
    np.testing.assert_allclose(d._s_ppf(u), raw)


def test_uniform_and_normal_parameters():
    assert Uniform(1.0, 0.3).moments()[1] == pytest.approx(0.3 / math.sqrt(3), rel=1e-4)
    assert Normal(1.0, 0.1).moments()[1] == pytest.approx(0.1, rel=1e-3)
    assert Normal(1.0, 0.1).ppf(1.0) == pytest.approx(1.4)  # +4 sigma clip
    assert LogNormal(0.2, 0.1).moments() == (0.2, 0.1)
    assert Constant(0.3).ppf([0.1, 0.9]).tolist() == [0.3, 0.3]


def test_clip_at_zero_makes_an_atom_and_raises_the_mean():
    d = Normal(0.01, 0.01)
    x = d.sample(stream(4, "clip"), N)
    assert x.min() == 0.0
    p0 = NormalDist().cdf(-1.0)
    assert abs(np.mean(x == 0.0) - p0) < 4 * math.sqrt(p0 * (1 - p0) / N)
    assert float(d.cdf(0.0)) == pytest.approx(p0)
    assert d.moments()[0] > 0.01  # documented effect on the mean


def test_empirical_from_file_units_and_rescale(tmp_path):
    f = tmp_path / "ping.txt"
    f.write_text("# ping, ms\n10\n12\n\n14  # comment\n20\n")
    e = Empirical.from_file(f)  # default unit: ms
    assert e.ppf([0.0, 1.0]).tolist() == [0.010, 0.020]
    assert Empirical.from_file(f, unit="s").ppf(0.0) == 10.0
    s = e.moments()[1]
    r = e.rescaled(0.1, 0.02)
    rm, rs = r.moments()
    # piecewise-linear moments differ slightly from the sample's; shape kept
    assert rm == pytest.approx(0.1, abs=0.01)
    assert rs == pytest.approx(0.02 * s / np.std([0.01, 0.012, 0.014, 0.02]), rel=1e-6)
    d = make_dist("empirical", 0.1, 0.02, e)
    assert d == r
    bad = tmp_path / "bad.txt"
    bad.write_text("1\nabc\n")
    with pytest.raises(ValueError, match=r"bad.txt:2"):
        Empirical.from_file(bad)


def test_empirical_cdf_handles_ties():
    e = Empirical((0.0, 0.0, 1.0, 2.0))
    np.testing.assert_allclose(
        e.cdf([-1, 0, 0.5, 1, 2, 3]), [0, 1 / 3, 0.5, 2 / 3, 1, 1]
    )
    assert e.ppf(1 / 3) == 0.0  # the atom at 0 holds the tied third


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"mean": -1.0, "jitter": 0.0}, r"Normal.mean = -1.0: must be >= 0"),
        ({"mean": 1.0, "jitter": math.nan}, r"Normal.jitter = nan: must be finite"),
    ],
)
def test_validation_names_field_value_and_range(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Normal(**kwargs)


def test_make_dist_names():
    assert isinstance(make_dist("pareto", 0.1, 0.01), Pareto)
    assert isinstance(make_dist("pareto", 0.1, 0.0), Constant)
    with pytest.raises(ValueError, match=r"make_dist.name = 'gamma'"):
        make_dist("gamma", 0.1, 0.01)


# -- correlation ----------------------------------------------------------------
@pytest.mark.parametrize(
    "d",
    [Normal(0.1, 0.02), Pareto(0.1, 0.03), Uniform(0.1, 0.05)],
    ids=lambda d: type(d).__name__,
)
@pytest.mark.parametrize("rho", [0.0, 0.5, 0.9])
def test_copula_ar1_keeps_marginal_and_targets_rho(d, rho):
    proc = DelayProcess(d, rho, stream(5, "ar1", type(d).__name__, str(rho)))
    x = proc.draw(40_000)
    thin = x[::40]  # rho^40 < 2e-2: nearly independent, so KS applies
    if isinstance(d, Pareto):
        f_top = float(d.cdf(0.22 - 1e-9))
        thin = thin[thin < 0.22 - 1e-12]
        assert stats.kstest(thin, lambda v: d.cdf(v) / f_top).pvalue > 0.001
    else:
        assert stats.kstest(thin, d.cdf).pvalue > 0.001
    # Gaussian copula: Spearman's rho = 6/pi asin(rho/2) whatever the marginal.
    rs = stats.spearmanr(x[:-1], x[1:]).statistic
    assert rs == pytest.approx(6 / math.pi * math.asin(rho / 2), abs=0.03)
    if isinstance(d, Normal):
        assert np.corrcoef(x[:-1], x[1:])[0, 1] == pytest.approx(rho, abs=0.03)


def test_draw_equals_repeated_next_and_set_dist_keeps_state():
    a = DelayProcess(Normal(0.1, 0.01), 0.7, stream(9, "d"))
    b = DelayProcess(Normal(0.1, 0.01), 0.7, stream(9, "d"))
    xa = a.draw(50)
    xb = np.array([b.next() for _ in range(50)])
    np.testing.assert_allclose(xa, xb, rtol=0, atol=1e-15)
    a.set_dist(Normal(0.2, 0.01))
    b.set_dist(Normal(0.2, 0.01))
    assert a.next() == b.next()
    with pytest.raises(
        ValueError, match=r"DelayProcess.rho = 1.0: must be in \[0, 1\)"
    ):
        DelayProcess(Normal(0.1, 0.01), 1.0, stream(0, "x"))
