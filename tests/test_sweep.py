"""The sweep tool: building points, validating them, scheduling, reruns, resume, tables.

Most tests run the sweep's real scheduler against a stand-in for ``python
-m fedsim.cli run`` (a small script that writes what a run writes, with a
verdict that depends on the dilation it was given), so that reruns, flags
and resumption are tested in seconds; one test runs a real point.
"""

from __future__ import annotations

import csv
import json
import math
import os
import stat
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from fedsim import sweep as sw
from fedsim.cli import cli
from fedsim.sweep.execute import Scheduler

ROOT = Path(__file__).resolve().parents[1]
QUICK = ROOT / "scenarios" / "quickstart.toml"

# Writes summary.json and scenario.json as a run does. The verdict passes
# when the dilation is at least PASS_AT (env), and the accuracy is
# 0.5 + seed / 100 + delay (so aggregates are checkable by hand), plus
# FAKE_GAIN[staleness] (env, JSON) for the point's algorithm.staleness.
FAKE_RUN = r'''
import json, os, sys, time
args = sys.argv[1:]
assert args[:3] == ["-m", "fedsim.cli", "run"], args
out = args[args.index("--out") + 1]
sets = dict(a.split("=", 1) for a in (args[i + 1] for i, x in enumerate(args) if x == "--set"))
dil = float(args[args.index("--dilation") + 1]) if "--dilation" in args else 1.0
if os.environ.get("FAKE_CRASH") and sets.get("seed") == "2":
    sys.exit(3)
seed = int(sets["seed"])
delay = float(sets.get("network.up.delay", "0"))
passing = dil >= float(os.environ.get("PASS_AT", "1"))
gain = json.loads(os.environ.get("FAKE_GAIN", "{}")).get(
    sets.get("algorithm.staleness", "").strip('"'), 0.0)
time.sleep(0.05)
json.dump({"run": {"dilation": dil}}, open(os.path.join(out, "scenario.json"), "w"))
with open(os.path.join(out, "calls.log"), "a") as fh:
    fh.write(f"{dil}\n")
json.dump({"status": "completed", "final_accuracy": 0.5 + seed / 100 + delay + gain,
           "best_accuracy": 0.6, "emulated_seconds": 10.0 * (1 + delay), "updates": 7,
           "staleness": {"mean": 1.5, "p99": 3},
           "fidelity": {"verdict": "pass" if passing else "fail",
                        "suggested_dilation": None if passing else 2 * dil}},
          open(os.path.join(out, "summary.json"), "w"))
'''


@pytest.fixture
def fake_python(tmp_path: Path) -> str:
    script = tmp_path / "fake-python"
    script.write_text(f"#!{sys.executable}\n{FAKE_RUN}")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


def _csv(path: Path) -> list[dict[str, str]]:
    with open(path) as fh:
        return list(csv.DictReader(fh))


def _sweep(tmp_path: Path, text: str) -> Path:
    f = tmp_path / "s.sweep.toml"
    f.write_text(text.replace("QUICK", str(QUICK)))
    return f


BASIC = '''
[sweep]
scenario = "QUICK"
seeds = 2
[sweep.set]
"run.time_budget" = 5.0
[sweep.grid]
"network.up.delay+network.down.delay" = [0.0, 0.1]
[[sweep.variant]]
label = "const"
set = { "algorithm.staleness" = "const" }
[[sweep.variant]]
label = "poly"
set = { algorithm = { staleness = "poly" } }
'''


def test_points_are_variants_times_grid_times_seeds(tmp_path: Path) -> None:
    s = sw.load_sweep(_sweep(tmp_path, BASIC))
    pts = s.points()
    assert len(pts) == 2 * 2 * 2
    assert [p.variant for p in pts[:4]] == ["const"] * 4
    p = pts[1]
    over = dict(p.overrides)
    # a key joined with + sets every part; nested and dotted tables are alike
    assert over["network.up.delay"] == over["network.down.delay"] == 0.0
    assert over["algorithm.staleness"] == "const"
    assert over["seed"] == 2
    assert over["run.time_budget"] == 5.0
    assert dict(pts[4].overrides)["algorithm.staleness"] == "poly"
    assert p.key == "const,delay=0.0,seed=2"
    assert len({q.key for q in pts}) == len(pts)
    s.check()   # every point's scenario is valid


def test_a_variant_may_run_on_its_own_seeds(tmp_path: Path) -> None:
    """An ablation can take fewer seeds than the claim it checks: a variant's
    ``seeds`` replace the sweep's for it alone, survive sweep.json, and give
    way to --seeds, which sets every variant's."""
    text = BASIC.replace('set = { algorithm = { staleness = "poly" } }',
                         'set = { algorithm = { staleness = "poly" } }\nseeds = [7]')
    s = sw.load_sweep(_sweep(tmp_path, text))
    assert [(p.variant, p.seed) for p in s.points()] == [
        ("const", 1), ("const", 2), ("const", 1), ("const", 2), ("poly", 7), ("poly", 7)]
    back = sw.Sweep.from_json(s.to_json())
    assert back.points() == s.points()
    # a sweep without own seeds writes the sweep.json it wrote before (resumes stay valid)
    assert "seeds" not in sw.load_sweep(_sweep(tmp_path, BASIC)).to_json()["variants"][0]
    cli = sw.load_sweep(_sweep(tmp_path, text), seeds=1)
    assert {p.seed for p in cli.points()} == {1}
    with pytest.raises(sw.SweepError, match=r"sweep.variant\[0\].seeds: seeds must be at least"):
        sw.load_sweep(_sweep(tmp_path, BASIC.replace(
            'set = { "algorithm.staleness" = "const" }',
            'set = { "algorithm.staleness" = "const" }\nseeds = 0')))


def test_a_sweep_file_may_cap_its_runs_at_once(tmp_path: Path) -> None:
    """``max_jobs``: runs measured to break their verdicts beside more of their kind
    say so once, in their file; it survives sweep.json, and a sweep without it
    writes the sweep.json it wrote before (resumes stay valid)."""
    s = sw.load_sweep(_sweep(tmp_path, BASIC.replace("seeds = 2", "seeds = 2\nmax_jobs = 2")))
    assert s.max_jobs == 2
    assert sw.Sweep.from_json(s.to_json()).max_jobs == 2
    assert "max_jobs" not in sw.load_sweep(_sweep(tmp_path, BASIC)).to_json()
    for bad in ("0", "1.5", "true", '"2"'):
        with pytest.raises(sw.SweepError, match=r"sweep.max_jobs: a whole number of runs"):
            sw.load_sweep(_sweep(tmp_path, BASIC.replace(
                "seeds = 2", f"seeds = 2\nmax_jobs = {bad}")))


def test_command_line_additions_and_grid_values() -> None:
    assert sw.parse_grid("model.hidden=[64],[128, 64]") == ("model.hidden", [[64], [128, 64]])
    assert sw.parse_grid("algorithm.staleness=poly,hinge") == ("algorithm.staleness",
                                                               ["poly", "hinge"])
    assert sw.parse_grid('a.b="x,y",z') == ("a.b", ["x,y", "z"])
    with pytest.raises(sw.SweepError, match="not a TOML value"):
        sw.parse_grid("model.hidden=[64,")
    with pytest.raises(sw.SweepError, match=r"expected dotted\.key=v1,v2"):
        sw.parse_grid("model.hidden")
    s = sw.sweep_from_scenario(QUICK, grid=["algorithm.alpha=0.3,0.9"], sets=["run.time_budget=4"],
                               seeds=3, target=0.6)
    assert s.seeds == [1, 2, 3]
    assert s.grid == {"algorithm.alpha": [0.3, 0.9]}
    over = dict(s.points()[0].overrides)
    assert over["run.target_accuracy"] == 0.6
    assert over["run.time_budget"] == 4


@pytest.mark.parametrize(("text", "message"), [
    ('[sweep]\nscenario = "QUICK"\nseeds = 0\n', "seeds must be at least 1"),
    ('[sweep]\nscenario = "QUICK"\nseeds = [1, 1]\n', "a seed is listed twice"),
    ('[sweep]\nscenario = "QUICK"\ngird = {}\n', "sweep.gird: unknown key"),
    ('[sweep]\nseeds = 2\n', "sweep.scenario: give the base scenario"),
    ('[sweep]\nscenario = "QUICK"\n[sweep.grid]\n"a.b" = []\n', "sweep.grid.a.b: expected a"),
    ('[sweep]\nscenario = "QUICK"\n[[sweep.variant]]\nset = {}\n', "needs a label"),
    ('[sweep]\nscenario = "QUICK"\n[[sweep.variant]]\nlabel = "a"\n[[sweep.variant]]\n'
     'label = "a"\n', "two variants share a label"),
    ('name = "x"\n', "not a sweep file"),
    ('[sweep]\nscenario = "QUICK"\ntarget_accuracy = 2\n', "target_accuracy: a fraction"),
])
def test_a_malformed_sweep_file_names_the_key(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(sw.SweepError, match=message):
        sw.load_sweep(_sweep(tmp_path, text))


def test_every_point_is_validated_before_anything_runs(tmp_path: Path) -> None:
    s = sw.load_sweep(_sweep(tmp_path, '[sweep]\nscenario = "QUICK"\nseeds = 3\n[sweep.grid]\n'
                             '"algorithm.staleness" = ["poly", "sideways"]\n'))
    with pytest.raises(sw.SweepError) as err:
        sw.run_sweep(s, tmp_path / "out")
    text = str(err.value)
    assert "algorithm.staleness=\"sideways\"" in text
    assert "sideways" in text
    assert text.count("sideways' ") <= 1 or text.count("point ") == 1   # once, not per seed
    assert not (tmp_path / "out").exists()


def test_mean_and_ci_are_students_t() -> None:
    m, ci = sw.mean_ci([1.0, 2.0, 3.0])
    assert m == 2.0
    assert ci == pytest.approx(4.302652729911275 * 1.0 / math.sqrt(3))
    assert sw.mean_ci([5.0]) == (5.0, None)
    assert sw.mean_ci([]) == (None, None)


def test_a_sweep_reruns_unfaithful_points_and_writes_its_tables(
        tmp_path: Path, fake_python: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PASS_AT", "4")     # a verdict passes only at dilation >= 4
    s = sw.load_sweep(_sweep(tmp_path, BASIC))
    lines: list[str] = []
    res = sw.run_sweep(s, tmp_path / "out", python=fake_python, report=lines.append)
    assert all(r.counts for r in res.points)
    for r in res.points:
        # dilation 1 failed, the suggested 2 failed, then 4 passed; earlier attempts are kept
        assert (r.run_dir / "calls.log").read_text().split() == ["4.0"]
        assert r.attempts == 3
        assert r.dilation == 4.0
        assert (r.run_dir.parent / f"{r.run_dir.name}.attempt-1").is_dir()
        assert (r.run_dir.parent / f"{r.run_dir.name}.attempt-2").is_dir()
    assert any("rerun" in x for x in lines)
    rows = _csv(tmp_path / "out" / "sweep.csv")
    assert len(rows) == 8
    assert {r["verdict"] for r in rows} == {"pass"}
    agg = _csv(tmp_path / "out" / "aggregate.csv")
    assert len(agg) == 4
    row = next(r for r in agg if r["variant"] == "poly"
               and r["network.up.delay+network.down.delay"] == "0.1")
    assert row["n"] == "2"
    assert float(row["final_accuracy_mean"]) == pytest.approx(0.5 + 0.015 + 0.1)
    assert float(row["final_accuracy_ci95"]) == pytest.approx(
        sw.t_quantile(1) * math.sqrt(0.5 * 0.01**2) / math.sqrt(2))
    assert (tmp_path / "out" / "final_accuracy.png").stat().st_size > 5000


def _markers(fig: Any) -> dict[str, tuple[list[float], list[float]]]:
    """Each series' marker positions in a sweep figure, by its legend label."""
    (ax,) = fig.axes
    return {bars.get_label(): (list(bars.lines[0].get_xdata()), list(bars.lines[0].get_ydata()))
            for bars in ax.containers}


def test_a_categorical_grid_draws_a_figure_per_quantity_with_the_categories_on_the_axis(
        tmp_path: Path, fake_python: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The most common comparison, --grid algorithm.staleness=const,poly, drew nothing."""
    monkeypatch.setenv("FAKE_GAIN", json.dumps({"poly": 0.2}))
    s = sw.sweep_from_scenario(QUICK, grid=["algorithm.staleness=const,poly,hinge"], seeds=2)
    out = tmp_path / "out"
    res = sw.run_sweep(s, out, python=fake_python)
    assert [f.name for f in res.files] == ["sweep.csv", "aggregate.csv", "final_accuracy.png",
                                          "emulated_seconds.png"]
    assert all(f.read_bytes()[:4] == b"\x89PNG" for f in res.files[2:])
    spec, results = sw.read_results(out)
    figs = sw.sweep_figures(spec, sw.aggregate(spec, results))
    (ax,) = figs["final_accuracy"].axes
    assert [t.get_text() for t in ax.get_xticklabels()] == ["const", "poly", "hinge"]
    assert {t.get_rotation() for t in ax.get_xticklabels()} == {0.0}   # short names: level
    assert ax.get_xlabel() == "algorithm.staleness"
    ((xs, ys),) = _markers(figs["final_accuracy"]).values()    # one series: no variants
    assert xs == [0.0, 1.0, 2.0]
    assert ys == pytest.approx([0.515, 0.715, 0.515])
    assert ax.get_legend() is None      # nothing to tell apart
    # the command line (resuming the finished sweep) lists the figures too
    r = CliRunner().invoke(cli, ["sweep", str(out)])
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines()[-2:] == [str(out / "final_accuracy.png"),
                                          str(out / "emulated_seconds.png")]


def test_variants_alone_are_the_categories_and_a_numeric_grid_keeps_its_lines(
        tmp_path: Path, fake_python: str) -> None:
    only = _sweep(tmp_path, BASIC.replace('"network.up.delay+network.down.delay" = [0.0, 0.1]',
                                          ""))
    s = sw.load_sweep(only)
    res = sw.run_sweep(s, tmp_path / "v", python=fake_python)
    figs = sw.sweep_figures(s, sw.aggregate(s, res.points))
    (ax,) = figs["final_accuracy"].axes
    assert [t.get_text() for t in ax.get_xticklabels()] == ["const", "poly"]
    assert ax.get_xlabel() == "variant"
    # a categorical key beside a numeric one: against the numeric, a line per category
    s = sw.sweep_from_scenario(QUICK, grid=["algorithm.staleness=const,poly",
                                            "network.up.delay=0.0,0.1"])
    res = sw.run_sweep(s, tmp_path / "m", python=fake_python)
    figs = sw.sweep_figures(s, sw.aggregate(s, res.points))
    (ax,) = figs["final_accuracy"].axes
    assert ax.get_xlabel() == "network.up.delay"
    lines = _markers(figs["final_accuracy"])
    assert sorted(lines) == ["staleness=const", "staleness=poly"]
    assert lines["staleness=const"][0] == [0.0, 0.1]
    assert lines["staleness=const"][1] == pytest.approx([0.51, 0.61])
    # plot.x may name the categorical key, or the variants
    s.plot = {"x": "algorithm.staleness"}
    (ax,) = sw.sweep_figures(s, sw.aggregate(s, res.points))["final_accuracy"].axes
    assert [t.get_text() for t in ax.get_xticklabels()] == ["const", "poly"]
    assert sorted(_markers(ax.figure)) == ["delay=0.0", "delay=0.1"]
    s.plot = {"x": "variant"}
    with pytest.raises(sw.SweepError, match=r"sweep.plot.x = 'variant' is not a grid key "
                       r"\(algorithm.staleness, network.up.delay\)"):
        sw.sweep_figures(s, [])


def test_long_category_names_slant_and_normalize_names_a_category(tmp_path: Path) -> None:
    hidden = ["[200]", "[128, 64]", "[512, 256, 128]", "[1024, 512, 256, 128]"]
    s = sw.sweep_from_scenario(QUICK, grid=["model.hidden=" + ",".join(hidden)])
    s.variants = [sw.Variant("fedavg", {}), sw.Variant("fedasync", {})]
    s.plot = {"normalize": "fedavg", "y": ["emulated_seconds"]}
    agg = [{"variant": v, "model.hidden": h, "n": 1, "emulated_seconds_mean": base * k,
            "emulated_seconds_ci95": None}
           for v, base in (("fedavg", 10.0), ("fedasync", 5.0))
           for h, k in zip(hidden, (1, 2, 1, 3), strict=True)]
    (ax,) = sw.sweep_figures(s, agg)["emulated_seconds"].axes
    labels = ax.get_xticklabels()
    assert [t.get_text() for t in labels] == hidden
    assert {t.get_rotation() for t in labels} == {25.0}
    assert ax.get_ylabel().endswith("(relative to fedavg at hidden = [200])")
    lines = _markers(ax.figure)
    assert lines["fedavg"][1] == pytest.approx([1.0, 2.0, 1.0, 3.0])
    assert lines["fedasync"][1] == pytest.approx([0.5, 1.0, 0.5, 1.5])
    # side by side at each category, not on top of each other
    assert [round(b - a, 6) for a, b in zip(lines["fedavg"][0], lines["fedasync"][0],
                                            strict=True)] == [0.2] * 4


def test_a_figure_that_cannot_be_drawn_is_named_with_the_reason(
        tmp_path: Path, fake_python: str, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    s = sw.sweep_from_scenario(QUICK, grid=["algorithm.staleness=const,poly"], target=0.9)
    res = sw.run_sweep(s, tmp_path / "t", python=fake_python)
    assert [f.name for f in res.files[2:]] == ["final_accuracy.png", "emulated_seconds.png"]
    assert caplog.messages == ["no time_to_target_s.png: none of the 2 runs that count "
                               "reported emulated s to the target accuracy (none reached the "
                               "target accuracy)"]
    caplog.clear()
    monkeypatch.setenv("PASS_AT", "1000")
    res = sw.run_sweep(s, tmp_path / "f", python=fake_python, max_attempts=1)
    assert res.files[2:] == []
    assert caplog.messages[-3:] == [
        f"no {y}.png: no run counts (every point flagged or unfinished: see sweep.csv), so "
        "there is nothing to draw" for y in ("final_accuracy", "emulated_seconds",
                                             "time_to_target_s")]


def test_a_sweep_of_seeds_alone_says_it_draws_no_figure_on_stderr(
        tmp_path: Path, fake_python: str) -> None:
    s = sw.sweep_from_scenario(QUICK, seeds=2)
    out = tmp_path / "out"
    sw.run_sweep(s, out, python=fake_python)
    import subprocess

    done = subprocess.run([sys.executable, "-m", "fedsim.cli", "sweep", str(out)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert ("WARNING fedsim.sweep.plots: no figures: nothing but the seed varies in this "
            "sweep (aggregate.csv holds each quantity's mean and 95 % CI)") in done.stderr
    assert done.stdout.splitlines()[-2:] == [str(out / "sweep.csv"), str(out / "aggregate.csv")]


def test_a_rerun_follows_the_suggestion_within_1_5x_to_4x_of_the_failed_dilation() -> None:
    from fedsim.sweep.execute import next_dilation

    def failed(dilation: float, suggested: float | None) -> sw.PointResult:
        p = sw.Point(variant="", grid=(), seed=1, overrides=())
        summary = {"status": "completed",
                   "fidelity": {"verdict": "fail", "suggested_dilation": suggested}}
        return sw.PointResult(point=p, run_dir=Path("x"), status="completed", verdict="fail",
                              attempts=1, dilation=dilation, summary=summary, cores=None)

    assert next_dilation(failed(1.0, 2.0)) == 2.0       # the suggestion
    assert next_dilation(failed(1.0, 1.1)) == 1.5       # at least 1.5x
    assert next_dilation(failed(1.0, None)) == 1.5
    assert next_dilation(failed(0.5, 20.0)) == 2.0      # a starved run's 40x: at most 4x


# A run that takes 0.4 s to start (to write fedsim-run.json, as a run does at
# t = 0) and then runs 0.6 s; it logs when it was launched and when its clock started.
STAGED_RUN = r'''
import json, os, sys, time
args = sys.argv[1:]
out = args[args.index("--out") + 1]
log = os.environ["STAGED_LOG"]
with open(log, "a") as fh:
    fh.write(f"launch {time.time()}\n")
time.sleep(0.4)
json.dump({"format": 2}, open(os.path.join(out, "fedsim-run.json"), "w"))
with open(log, "a") as fh:
    fh.write(f"clock {time.time()}\n")
time.sleep(0.6)
json.dump({"run": {"dilation": 1.0}}, open(os.path.join(out, "scenario.json"), "w"))
json.dump({"status": "completed", "final_accuracy": 0.5, "emulated_seconds": 1.0,
           "fidelity": {"verdict": "pass"}}, open(os.path.join(out, "summary.json"), "w"))
'''


def test_runs_start_one_at_a_time_and_then_overlap(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A neighbour's start-up (imports, data, processes) starves a running run's
    SCHED_IDLE trainers: the next run is launched only once the last one's clock runs."""
    script = tmp_path / "staged-python"
    script.write_text(f"#!{sys.executable}\n{STAGED_RUN}")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    log = tmp_path / "staged.log"
    monkeypatch.setenv("STAGED_LOG", str(log))
    s = sw.sweep_from_scenario(QUICK, seeds=3)
    res = sw.run_sweep(s, tmp_path / "out", jobs=3, python=str(script))
    assert all(r.counts for r in res.points)
    events = sorted((float(t), kind) for kind, t in
                    (line.split() for line in log.read_text().splitlines()))
    launches = [t for t, k in events if k == "launch"]
    clocks = [t for t, k in events if k == "clock"]
    assert len(launches) == len(clocks) == 3
    for nxt, clock in zip(launches[1:], clocks[:2], strict=True):
        assert nxt >= clock          # launched only after the previous one's clock started
    assert launches[1] < clocks[0] + 0.6   # ... and while that run was still running


def test_points_that_stay_unfaithful_are_flagged_not_averaged(
        tmp_path: Path, fake_python: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PASS_AT", "1000")
    s = sw.sweep_from_scenario(QUICK, grid=["network.up.delay=0.0,0.1"])
    res = sw.run_sweep(s, tmp_path / "out", python=fake_python, max_attempts=2)
    assert len(res.flagged) == 2
    assert all(r.verdict == "fail" and r.attempts == 2 for r in res.points)
    agg = _csv(tmp_path / "out" / "aggregate.csv")
    assert [r["n"] for r in agg] == ["0", "0"]
    assert [r["flagged"] for r in agg] == ["1", "1"]
    assert all(r["final_accuracy_mean"] == "" for r in agg)


def test_a_half_finished_sweep_resumes_without_redoing_finished_points(
        tmp_path: Path, fake_python: str, monkeypatch: pytest.MonkeyPatch) -> None:
    s = sw.sweep_from_scenario(QUICK, grid=["network.up.delay=0.0,0.1"], seeds=2)
    out = tmp_path / "out"
    monkeypatch.setenv("FAKE_CRASH", "1")        # seed 2's runs die without a summary
    first = sw.run_sweep(s, out, python=fake_python)
    assert {r.point.seed: r.status for r in first.points} == {1: "completed", 2: "crashed"}
    monkeypatch.delenv("FAKE_CRASH")
    # a crashed run is not retried at once (it may crash again), but a resume runs it
    done = {r.point.key: (r.run_dir / "calls.log").stat().st_mtime_ns
            for r in first.points if r.point.seed == 1}
    second = sw.run_sweep(s, out, python=fake_python)
    assert all(r.counts for r in second.points)
    for r in second.points:
        if r.point.seed == 1:   # untouched
            assert (r.run_dir / "calls.log").stat().st_mtime_ns == done[r.point.key]
    # a different sweep into the same directory is refused, saying what differs
    other = sw.sweep_from_scenario(QUICK, grid=["network.up.delay=0.0,0.2"], seeds=2)
    with pytest.raises(sw.SweepError, match="differs in: grid"):
        sw.run_sweep(other, out, python=fake_python)
    spec, results = sw.read_results(out)
    assert spec.grid == s.grid
    assert all(r.counts for r in results)


def test_auto_concurrency_follows_the_measured_load() -> None:
    sched = Scheduler("auto", max_jobs=8, max_scale=1.0)
    sched.cores = 2
    assert sched.allowed() == 1            # nothing measured yet
    sched.finished(0.2, "pass")             # a run that mostly waits: half the cores' worth
    assert sched.allowed() == 2             # ... is 5 at once, reached one run at a time
    for want in (3, 4, 5, 5):
        sched.finished(0.2, "pass")
        assert sched.allowed() == want
    sched.finished(1.5, "pass")             # a heavy one
    assert sched.allowed() == 1
    sched = Scheduler("auto", max_jobs=8, max_scale=1.0)   # never scaled: see below
    sched.cores = 2
    for _ in range(8):
        sched.finished(0.1, "pass")
    assert sched.allowed() == 8
    sched.finished(0.1, "fail", at=8)       # an unfaithful run beside others halves it
    assert sched.allowed() == 4
    sched.finished(0.1, "pass")             # and a faithful one lets it grow by one
    assert sched.allowed() == 5
    sched.finished(0.1, "fail", shared=False)   # alone on the machine: the point's own need
    assert sched.allowed() == 5
    for _ in range(5):                      # never again as high as where it failed
        sched.finished(0.1, "pass")
    assert sched.allowed() == 7
    sched.finished(0.1, "fail", at=6)
    assert sched.allowed() == 3
    for _ in range(5):
        sched.finished(0.1, "pass")
    assert sched.allowed() == 5
    assert Scheduler(3, max_jobs=8).allowed() == 3


def test_crowded_runs_with_room_on_the_cores_go_at_twice_the_dilation() -> None:
    sched = Scheduler("auto", max_jobs=8)
    sched.cores = 2
    for _ in range(3):
        sched.finished(0.2, "pass")          # a fifth of a core: 5 would fit
    assert (sched.allowed(), sched.scale) == (4, 1.0)
    sched.finished(0.2, "fail", at=2)        # yet 2 at once crowd each other
    assert sched.scale == 2.0                # twice the dilation, 3 (= 2 x 2 - 1) at once:
    assert sched.allowed() == 3              # 1.5 runs' worth, not 2 at half speed
    assert sched.scale_for(5) == 2.0
    assert sched.scale_for(1) == 1.0         # the last run goes at its own dilation
    # ... unless it was crowded out last time and others still run
    assert sched.scale_for(2, crowded=True, alone=False) == 2.0
    assert sched.scale_for(1, crowded=True, alone=True) == 1.0
    sched.finished(0.1, "pass", scale=2.0)   # a run at scale 2 uses half the CPU
    assert sched.load == pytest.approx(0.2)  # ... measured as at scale 1
    assert sched.allowed() == 3
    for _ in range(5):
        sched.finished(0.1, "pass", scale=2.0)
    assert sched.allowed() == 4              # 3 faithful runs in a row at 3: one more
    sched.finished(0.2, "fail", at=2, scale=1.0)   # started before the doubling: answered
    assert (sched.scale, sched.allowed()) == (2.0, 4)
    sched.finished(0.1, "fail", at=3, scale=2.0)   # crowded again: 4x, 5 at once
    assert sched.scale == 4.0
    assert sched.allowed() == 5
    for _ in range(5):
        sched.finished(0.05, "pass", scale=4.0)
    assert sched.allowed() == 6              # 5 in a row at 5: one more
    sched.finished(0.05, "fail", at=5, scale=4.0)  # at max_scale: the concurrency halves,
    # to 2 at 4x the dilation: half the work per unit of time of one run at its own
    assert (sched.scale, sched.allowed()) == (1.0, 1)
    assert sched.scale_for(9) == 1.0
    sched.finished(0.2, "fail", at=2)
    assert (sched.scale, sched.allowed()) == (1.0, 1)    # and it stays there


def test_no_doubling_without_room_or_when_disabled() -> None:
    sched = Scheduler("auto", max_jobs=8)
    sched.cores = 2
    sched.finished(0.45, "pass")
    sched.finished(0.45, "pass")             # 2 fit; at twice the dilation 4 would, not 3+
    sched.finished(0.9, "fail", at=2)        # a heavy run: at scale 2, fit = 2 < 3
    assert (sched.scale, sched.allowed()) == (1.0, 1)
    off = Scheduler("auto", max_jobs=8, max_scale=1.0)
    off.cores = 2
    for _ in range(3):
        off.finished(0.2, "pass")
    off.finished(0.2, "fail", at=2)
    assert (off.scale, off.allowed()) == (1.0, 1)
    fixed = Scheduler(3, max_jobs=8)
    fixed.finished(0.2, "fail", at=3)
    assert (fixed.scale, fixed.allowed()) == (1.0, 3)


def test_a_sweep_scaled_up_runs_its_points_at_a_multiple_of_their_own_dilation() -> None:
    from fedsim.sweep.execute import dilation_for

    p = sw.Point(variant="", grid=(), seed=1, overrides=())

    def result(verdict: str, dilation: float) -> sw.PointResult:
        summary = {"status": "completed",
                   "fidelity": {"verdict": verdict, "suggested_dilation": 3 * dilation}}
        return sw.PointResult(point=p, run_dir=Path("x"), status="completed" if verdict
                              else "pending", verdict=verdict or None, attempts=1,
                              dilation=dilation, summary=summary, cores=None)

    fresh = result("", 0.5)
    assert dilation_for(fresh, 0.5, 1.0, False) is None      # its scenario's own
    assert dilation_for(fresh, 0.5, 2.0, False) == 1.0
    assert dilation_for(fresh, None, 2.0, False) is None     # "auto": not scaled
    crowded = result("fail", 2.0)                             # at 4x, then back to 1x
    assert dilation_for(crowded, 0.5, 1.0, True) is None     # as a first attempt
    assert dilation_for(crowded, 0.5, 4.0, True) == 2.0      # ... at the scale of now
    assert dilation_for(crowded, 0.5, 1.0, True, need=1.5) == 1.5   # or its own need
    alone = result("fail", 1.0)
    assert dilation_for(alone, 0.5, 2.0, False) == 3.0       # its own need wins
    assert dilation_for(alone, 0.5, 8.0, False) == 4.0       # ... unless the scale's is more
    assert dilation_for(alone, None, 2.0, False) == 3.0      # "auto": its suggestion


# A run that fails its verdict whenever another run ran at the same time (as
# trainers starved by a crowded machine do), asking for four times its dilation.
CROWD_RUN = r'''
import json, os, sys, time
args = sys.argv[1:]
out = args[args.index("--out") + 1]
dil = float(args[args.index("--dilation") + 1]) if "--dilation" in args else 1.0
crowd = os.environ["CROWD_DIR"]
me = os.path.join(crowd, str(os.getpid()))
open(me, "w").close()
json.dump({"format": 2}, open(os.path.join(out, "fedsim-run.json"), "w"))
seen = set()
for _ in range(8):
    seen |= set(os.listdir(crowd)) - {str(os.getpid())}
    time.sleep(0.05)
os.remove(me)
with open(os.path.join(out, "calls.log"), "a") as fh:
    fh.write(f"{dil}\n")
json.dump({"run": {"dilation": dil}}, open(os.path.join(out, "scenario.json"), "w"))
json.dump({"status": "completed", "final_accuracy": 0.5, "emulated_seconds": 1.0,
           "fidelity": {"verdict": "fail" if seen else "pass",
                        "suggested_dilation": 4 * dil if seen else None}},
          open(os.path.join(out, "summary.json"), "w"))
'''


def _crowd_sweep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, run: str, delays: str,
                 own_cap: int | None = None, **kwargs: Any) -> tuple[sw.SweepResult, list[str]]:
    """A sweep over ``delays`` whose every point runs the fake ``run`` (a CROWD_RUN);
    ``own_cap``: the sweep file's own ``max_jobs``."""
    script = tmp_path / "crowd-python"
    script.write_text(f"#!{sys.executable}\n{run}")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    (tmp_path / "crowd").mkdir()
    monkeypatch.setenv("CROWD_DIR", str(tmp_path / "crowd"))
    s = sw.sweep_from_scenario(QUICK, grid=[f"network.up.delay={delays}"], seeds=2)
    s.max_jobs = own_cap
    lines: list[str] = []
    kwargs.setdefault("max_attempts", 2)
    kwargs.setdefault("report", lines.append)
    res = sw.run_sweep(s, tmp_path / "out", python=str(script), **kwargs)
    return res, lines


def test_a_run_that_failed_beside_others_goes_again_at_its_dilation(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A crowded machine is not the point's fault: no more dilation, no attempt lost."""
    res, lines = _crowd_sweep(tmp_path, monkeypatch, CROWD_RUN, "0.0,0.1,0.2", max_scale=1.0)
    assert all(r.counts for r in res.points), [(r.point.key, r.verdict) for r in res.points]
    assert any("beside other runs" in x for x in lines)   # some did fail beside others
    for r in res.points:   # ... and went again at the dilation they had
        assert set((r.run_dir / "calls.log").read_text().split()) == {"1.0"}
        assert r.dilation in (None, 1.0)


def test_a_sweeps_max_jobs_keeps_its_runs_from_crowding_each_other(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs that fail beside any other (CROWD_RUN), in a sweep capped at one run at
    a time: none ever had company, so none failed or went again."""
    res, lines = _crowd_sweep(tmp_path, monkeypatch, CROWD_RUN, "0.0,0.1,0.2", own_cap=1,
                              max_attempts=1)
    assert all(r.counts for r in res.points), [(r.point.key, r.verdict) for r in res.points]
    assert not any("beside other runs" in x for x in lines), lines
    assert all(r.attempts == 1 for r in res.points)


def test_crowded_runs_go_again_at_twice_the_dilation_and_more_at_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs that crowd each other at their own dilation (2, the quickstart's) but
    not at twice it: the sweep doubles every later run's dilation and overlaps them."""
    run = (CROWD_RUN.replace('"fail" if seen else "pass"',
                             '"fail" if seen and dil < 4.0 else "pass"')
           .replace("4 * dil if seen", "4 * dil if seen and dil < 4.0")
           .replace("else 1.0", "else 2.0"))
    res, lines = _crowd_sweep(tmp_path, monkeypatch, run, "0.0,0.1,0.2,0.3")
    assert all(r.counts for r in res.points), [(r.point.key, r.verdict) for r in res.points]
    assert any("every run at 2x its dilation" in x for x in lines), lines
    assert {r.dilation for r in res.points} <= {None, 2.0, 4.0}
    assert any(r.dilation == 4.0 for r in res.points)


def test_in_a_pool_only_the_sweep_whose_runs_crowd_each_other_slows_down(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two sweeps in one pool: sweep a's runs fail beside others at their own dilation
    (2) and pass at twice it; sweep b's never fail. Only a's later runs go at twice
    their dilation; b's stay at their own (a pool of every claim's sweeps once went to
    4x for all after two sweeps' crowded failures)."""
    crowded = "seen and dil < 4.0 and '/a/' in out"
    run = (CROWD_RUN.replace('"fail" if seen else "pass"', f'"fail" if {crowded} else "pass"')
           .replace("4 * dil if seen", f"4 * dil if {crowded}")
           .replace("else 1.0", "else 2.0"))
    script = tmp_path / "crowd-python"
    script.write_text(f"#!{sys.executable}\n{run}")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    (tmp_path / "crowd").mkdir()
    monkeypatch.setenv("CROWD_DIR", str(tmp_path / "crowd"))
    a = sw.sweep_from_scenario(QUICK, grid=["network.up.delay=0.0,0.1,0.2,0.3"], seeds=2)
    b = sw.sweep_from_scenario(QUICK, grid=["network.up.delay=0.0,0.1,0.2,0.3"], seeds=2)
    lines: list[str] = []
    ra, rb = sw.run_sweeps([(a, tmp_path / "a"), (b, tmp_path / "b")], python=str(script),
                           report=lines.append, max_attempts=2)
    assert all(r.counts for r in [*ra.points, *rb.points]), lines
    slowed = [x for x in lines if "its runs crowd each other; from now on at" in x]
    assert len(slowed) == 1, lines                # a's, once (b's runs never fail)
    assert "at 2x their dilation" in slowed[0]
    assert not any("every run at" in x for x in lines), lines
    assert {r.dilation for r in rb.points} <= {None, 2.0}
    assert any(r.dilation == 4.0 for r in ra.points)


# A run that fails its verdict below dilation 3, alone, asking for 3.
NEEDS_3_RUN = CROWD_RUN.replace('"fail" if seen else "pass"', '"fail" if dil < 3.0 else "pass"'
                                ).replace("4 * dil if seen else None", "3.0")


def test_a_resumed_sweep_reruns_a_point_at_the_dilation_it_asked_for_before_a_stop(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What an attempt taught lives in point.json: a point that failed alone, then
    lost its next attempt to a stop, goes again at the dilation it asked for, not
    at its scenario's own."""
    res, _ = _crowd_sweep(tmp_path, monkeypatch, NEEDS_3_RUN, "0.0", jobs=1, max_attempts=1)
    assert [r.verdict for r in res.points] == ["fail", "fail"]      # one attempt each
    s = sw.sweep_from_scenario(QUICK, grid=["network.up.delay=0.0"], seeds=2)
    killed = tmp_path / "killed-python"          # the next attempts die without a summary
    killed.write_text(f"#!{sys.executable}\nraise SystemExit(1)\n")
    killed.chmod(killed.stat().st_mode | stat.S_IEXEC)
    res = sw.run_sweep(s, tmp_path / "out", python=str(killed), jobs=1, max_attempts=2)
    assert [r.status for r in res.points] == ["crashed", "crashed"]
    res = sw.run_sweep(s, tmp_path / "out", python=str(tmp_path / "crowd-python"), jobs=1,
                       max_attempts=3)
    for r in res.points:
        assert (r.verdict, r.dilation) == ("pass", 3.0)
        assert (r.run_dir / "calls.log").read_text().split() == ["3.0"]


def test_a_resumed_sweep_does_not_count_attempts_lost_to_a_crowded_machine(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Stopped right after attempts that failed beside other runs, a sweep resumed
    with one attempt a point still owes each of them a fair one."""
    def stop_at_the_first_rerun(line: str) -> None:
        if "beside other runs" in line:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _crowd_sweep(tmp_path, monkeypatch, CROWD_RUN, "0.0,0.1", jobs=2, max_attempts=1,
                     max_scale=1.0, report=stop_at_the_first_rerun)
    s = sw.sweep_from_scenario(QUICK, grid=["network.up.delay=0.0,0.1"], seeds=2)
    metas = [tmp_path / "out" / "runs" / p.key / "point.json" for p in s.points()]
    crowded = [m for m in metas
               if m.exists() and json.loads(m.read_text()).get("crowded_attempts")]
    assert crowded                                 # the stop came after a crowded attempt
    for f in (tmp_path / "crowd").iterdir():       # what the stopped fake runs left behind
        f.unlink()
    res = sw.run_sweep(s, tmp_path / "out", python=str(tmp_path / "crowd-python"), jobs=1,
                       max_attempts=1)
    assert all(r.counts for r in res.points), [(r.point.key, r.verdict) for r in res.points]


def test_a_rerun_beside_others_keeps_its_dilation() -> None:
    from fedsim.sweep.execute import next_dilation

    p = sw.Point(variant="", grid=(), seed=1, overrides=())
    res = sw.PointResult(point=p, run_dir=Path("x"), status="completed", verdict="fail",
                         attempts=1, dilation=0.5, cores=None,
                         summary={"status": "completed",
                                  "fidelity": {"verdict": "fail", "suggested_dilation": 20.0}})
    assert next_dilation(res, shared=True) == 0.5
    assert next_dilation(res) == 2.0


def test_cli_dry_run_and_errors(tmp_path: Path) -> None:
    runner = CliRunner()
    r = runner.invoke(cli, ["sweep", str(_sweep(tmp_path, BASIC)), "--dry-run"])
    assert r.exit_code == 0, r.output
    assert "8 points" in r.output
    assert "--set 'network.down.delay=0.1'" in r.output
    r = runner.invoke(cli, ["sweep", str(QUICK)])
    assert r.exit_code == 2
    assert "nothing to sweep" in r.output
    r = runner.invoke(cli, ["sweep", str(QUICK), "--grid", "algorithm.alpah=0.1,0.2"])
    assert r.exit_code == 2
    assert "algorithm.alpah" in r.output
    r = runner.invoke(cli, ["sweep", str(QUICK), "--seeds", "2", "--jobs", "many"])
    assert r.exit_code == 2
    assert "--jobs" in r.output


@pytest.mark.skipif(not hasattr(os, "wait4"), reason="needs os.wait4")
def test_a_real_sweep_point(tmp_path: Path) -> None:
    """The real path: a `fedsim run` process (real ZeroMQ, torch, netem)."""
    s = sw.sweep_from_scenario(QUICK, grid=["algorithm.staleness=poly"], sets=[
        "run.time_budget=2", "data.num_clients=4", "algorithm.concurrency=2",
        "deploy.hosts=1", "run.dilation=3", "eval.every_updates=4"])
    res = sw.run_sweep(s, tmp_path / "out", jobs=1)
    for r in res.points:
        assert r.status == "completed", (r.run_dir / "output.log").read_text()[-2000:]
        assert r.summary is not None
        assert r.summary["updates"] > 0
        assert r.cores is not None
        assert 0 < r.cores < 4
        command = json.loads((r.run_dir / "point.json").read_text())["command"]
        assert command[:3] == ["-m", "fedsim.cli", "run"]
        # a sweep's runs draw no PNGs of their own (the sweep draws its figures)
        assert "--no-plots" in command
        assert not list(r.run_dir.glob("*.png"))
    assert (tmp_path / "out" / "sweep.csv").exists()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_runs_fork_from_the_sweeps_process_as_fresh_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`fedsim sweep` forks each run from its own process, which imported torch once
    (2.4 s of CPU a run before), and each is what a new interpreter's run would be:
    its report in its output.log, its exit code in point.json, nothing in the
    sweep's own output. FEDSIM_SWEEP_FORK=0, another interpreter or threads in the
    sweep's process: a new interpreter per run."""
    import subprocess

    from fedsim.sweep import launch

    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k != launch.FORK_ENV}
    done = subprocess.run(
        [sys.executable, "-m", "fedsim.cli", "sweep", str(QUICK), "--seeds", "2", "--jobs", "1",
         "--out", str(out), "--set", "run.time_budget=1", "--set", "data.num_clients=4",
         "--set", "algorithm.concurrency=2", "--set", "deploy.hosts=1",
         "--set", "run.dilation=3", "--set", "eval.every_updates=4"],
        capture_output=True, text=True, env=env, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "run directory" not in done.stdout + done.stderr     # the runs' reports
    runs = sorted((out / "runs").iterdir())
    assert len(runs) == 2
    for run in runs:
        log = (run / "output.log").read_text()
        assert "fidelity" in log, log[-2000:]
        assert "run directory" in log
        point = json.loads((run / "point.json").read_text())
        assert point["forked"] is True
        assert point["exit_code"] == 0
        assert json.loads((run / "summary.json").read_text())["updates"] > 0
    monkeypatch.setenv(launch.FORK_ENV, "0")
    assert not launch._forking(sys.executable)
    monkeypatch.delenv(launch.FORK_ENV)
    assert not launch._forking("/bin/sh")


def test_a_variant_naming_another_algorithm_starts_from_its_defaults(tmp_path: Path) -> None:
    """DGA's keys (delay, mode, c_beta) would not validate under FedAvg."""
    dga = ROOT / "scenarios" / "dga-digits.toml"
    f = tmp_path / "v.sweep.toml"
    f.write_text(f'[sweep]\nscenario = "{dga}"\n[[sweep.variant]]\nlabel = "FedAvg"\n'
                 'set = { "algorithm.name" = "fedavg" }\n[[sweep.variant]]\nlabel = "DGA D=5"\n'
                 'set = { "algorithm.delay" = 5 }\n')
    s = sw.load_sweep(f)
    s.check()
    fedavg, dga_point = s.points()
    assert dict(fedavg.overrides)["algorithm"] == {"name": "fedavg"}
    assert dict(dga_point.overrides)["algorithm.delay"] == 5     # same algorithm: merged
    from fedsim.scenario import load

    assert load(dga, fedavg.set_args()).algorithm.name == "fedavg"
    assert load(dga, dga_point.set_args()).algorithm.mode == "auto"   # the base's key kept


def test_values_paired_with_a_grid_key(tmp_path: Path) -> None:
    """A dilation per latency: the i-th dilation goes with the i-th delay only."""
    f = _sweep(tmp_path, '[sweep]\nscenario = "QUICK"\n[sweep.grid]\n'
               '"network.up.delay+network.down.delay" = [0.001, 1.0]\n'
               '"algorithm.alpha" = [0.3, 0.9]\n'
               '[sweep.with."network.up.delay+network.down.delay"]\n'
               '"run.dilation" = [2.0, 0.25]\n')
    s = sw.load_sweep(f)
    got = {(dict(p.overrides)["network.up.delay"], dict(p.overrides)["algorithm.alpha"]):
           dict(p.overrides)["run.dilation"] for p in s.points()}
    assert got == {(0.001, 0.3): 2.0, (0.001, 0.9): 2.0, (1.0, 0.3): 0.25, (1.0, 0.9): 0.25}
    assert s.points()[0].key == "delay=0.001,alpha=0.3,seed=1"
    assert sw.Sweep.from_json(json.loads(json.dumps(s.to_json()))).points() == s.points()
    with pytest.raises(sw.SweepError, match="pairs 2 values"):
        sw.load_sweep(f, grid=["network.up.delay+network.down.delay=0.1,0.2,0.3"])
    bad = _sweep(tmp_path, '[sweep]\nscenario = "QUICK"\n[sweep.grid]\n"a.b" = [1, 2]\n'
                 '[sweep.with."a.b"]\n"run.dilation" = [2.0]\n')
    with pytest.raises(sw.SweepError, match=r"expected a list of 2 values"):
        sw.load_sweep(bad)


def test_a_run_that_lost_client_work_is_flagged_and_left_out_of_the_aggregate(
        tmp_path: Path) -> None:
    """A run that went on without a client whose training failed measured another
    federation: it is named (lost_runs in sweep.csv, lost_work in words) and never
    averaged in, though it completed with a passing verdict."""
    scen = tmp_path / "s.toml"
    scen.write_text("[algorithm]\nname = \"fedavg\"\n")
    spec = sw.Sweep(scenario=scen, seeds=[1, 2], variants=[sw.Variant("v", {})])
    p1, p2 = spec.points()
    lost = {"runs": 1, "by_reason": {"overflow": 1}, "by_client": {"9": {"overflow": 1}},
            "clients": [9], "first_reason": {"9": "training failed: StepOverflow: ..."}}
    ok = sw.PointResult(p1, tmp_path / "a", "completed", "pass", 1, 1.0, 0.5,
                        {"final_accuracy": 0.9, "lost_work": {"runs": 0}})
    bad = sw.PointResult(p2, tmp_path / "b", "completed", "pass", 1, 1.0, 0.5,
                         {"final_accuracy": 0.1, "lost_work": lost})
    assert ok.counts
    assert not bad.counts
    assert bad.lost_runs == 1
    assert bad.lost_work is not None
    assert "client 9: overflow x1" in bad.lost_work
    assert bad.row()["lost_runs"] == 1
    (row,) = sw.aggregate(spec, [ok, bad])
    assert row["n"] == 1
    assert row["flagged"] == 1
    assert row["final_accuracy_mean"] == 0.9


def test_sweeps_run_together_in_one_pool_each_with_its_own_tables(
        tmp_path: Path, fake_python: str) -> None:
    """run_sweeps: two sweeps' points in one queue, the longest first (budget times
    dilation); each sweep's tables in its own directory; run again, nothing reruns."""
    a = sw.load_sweep(_sweep(tmp_path, BASIC))                        # 8 points of 5 s
    b = sw.sweep_from_scenario(QUICK, grid=["algorithm.staleness=const,poly"], seeds=1,
                               sets=["run.time_budget=9"])             # 2 points of 9 s
    lines: list[str] = []
    ra, rb = sw.run_sweeps([(a, tmp_path / "a"), (b, tmp_path / "b")], python=fake_python,
                           report=lines.append)
    assert (len(ra.points), len(rb.points)) == (8, 2)
    assert all(r.counts for r in [*ra.points, *rb.points])
    assert _csv(tmp_path / "a" / "sweep.csv")
    assert _csv(tmp_path / "b" / "sweep.csv")
    done = [line.split("] ", 1)[1].split(": ", 1)[0] for line in lines if line.startswith("[")]
    assert len(done) == 10
    assert done[:2] == [f"{b.name or 'b'}/{p.key}" for p in b.points()]  # the longest first
    again: list[str] = []
    sw.run_sweeps([(a, tmp_path / "a"), (b, tmp_path / "b")], python=fake_python,
                  report=again.append)
    assert "10 points, 10 already finished" in again[0]


def test_measured_times_order_the_pool_before_budgets(
        tmp_path: Path, fake_python: str) -> None:
    """Real times measured by an earlier run order the pool, longest first, over the
    budget-times-dilation guess: a point that took longest goes first, though its
    budget is the shorter one (the claims' rounds-bound runs)."""
    a = sw.load_sweep(_sweep(tmp_path, BASIC))                        # 8 points of 5 s
    b = sw.sweep_from_scenario(QUICK, grid=["algorithm.staleness=const,poly"], seeds=1,
                               sets=["run.time_budget=9"])             # 2 points of 9 s
    first = next(iter(a.points())).key
    lines: list[str] = []
    sw.run_sweeps([(a, tmp_path / "a"), (b, tmp_path / "b")], python=fake_python,
                  report=lines.append, expected={(0, first): 100.0})
    done = [line.split("] ", 1)[1].split(": ", 1)[0] for line in lines if line.startswith("[")]
    assert done[0] == f"{a.name or 'a'}/{first}"
    assert done[1:3] == [f"{b.name or 'b'}/{p.key}" for p in b.points()]


def test_no_doubling_when_the_cap_on_runs_leaves_less_work_per_second() -> None:
    """7 light runs at once crowd each other; at twice their dilation only 8 could go
    (max_jobs): 4 runs' worth per unit of time against 6 at their own dilation, so the
    sweep keeps the dilation and runs fewer at once (2026-11-29: a pool of every
    claim's sweep went to 4x with 8 at once, an idle machine)."""
    sched = Scheduler("auto", max_jobs=8)
    sched.cores = 2
    for _ in range(8):
        sched.finished(0.05, "pass")          # a 40th of a core each: 8 fit
    assert sched.allowed() == 8
    sched.finished(0.05, "fail", at=7)
    assert sched.scale == 1.0
    assert (sched.cap, sched.allowed()) == (6, 3)     # halved, then up by one per pass
    for _ in range(5):
        sched.finished(0.05, "pass")
    assert sched.allowed() == 6


def test_the_cap_climbs_back_after_as_many_faithful_runs_as_it_allows() -> None:
    """Additive increase, multiplicative decrease: a failure early in a pool (its
    second run, at a sensitive point) halves the concurrency, which then climbs
    back by one each time as many faithful runs in a row as it allows have
    ended at it, instead of holding 300 runs at 1 at once (2026-11-29)."""
    sched = Scheduler("auto", max_jobs=8)
    sched.cores = 2
    sched.finished(0.9, "pass")               # heavy: no room at twice the dilation
    sched.finished(0.9, "fail", at=2)
    assert (sched.scale, sched.cap, sched.allowed()) == (1.0, 1, 1)
    sched.load = 0.1                          # lighter runs since: 10 would fit
    sched.finished(0.1, "pass")
    assert sched.cap == 1                     # after a crowding, 2 in a row at the cap
    sched.finished(0.1, "pass")
    assert sched.cap == 2
    sched.finished(0.1, "pass")
    sched.finished(0.1, "pass")
    assert (sched.cap, sched.allowed()) == (3, 3)   # 2 in a row at 2
    sched.finished(0.9, "fail", at=3)         # a heavy one: no room to double; halves,
    assert (sched.scale, sched.cap) == (1.0, 2)      # and the next climb waits for 4
    for _ in range(3):
        sched.finished(0.1, "pass")
    assert sched.cap == 2
    sched.finished(0.1, "pass")
    assert sched.cap == 3


def test_the_live_ramp_lets_one_more_go_while_the_machine_has_room() -> None:
    """Before any run has finished (a pool's first, longest, runs take 455 real s),
    the machine's busy cores measured while the runs went say whether one more
    fits: each takes its share, and the sum stays within half the cores."""
    from fedsim.sweep.policy import MachineLoad

    sched = Scheduler("auto", max_jobs=8)
    sched.cores = 2
    assert sched.allowed() == 1
    assert sched.room_for_one_more(1, 0.3)       # 0.3 + 0.3 <= 1
    sched.grow()
    assert sched.allowed() == 2
    assert sched.room_for_one_more(2, 0.6)       # 0.6 + 0.3 <= 1
    assert not sched.room_for_one_more(2, 0.8)   # 0.8 + 0.4 > 1
    sched.finished(0.45, "pass")                 # a finished run's load counts if larger
    assert not sched.room_for_one_more(2, 0.6)   # its 0.45, not the share 0.3: > 1
    assert sched.room_for_one_more(1, 0.3)       # 0.3 + 0.45 <= 1
    assert not Scheduler(3, max_jobs=8).room_for_one_more(1, 0.0)   # a fixed count

    load = MachineLoad()
    assert load.busy_cores(0.0) is None
    load.samples.extend([(0.0, 100, 1000), (10.0, 400, 2000), (20.0, 500, 3000)])
    cores = os.cpu_count() or 1
    assert load.busy_cores(0.0) == pytest.approx(0.2 * cores)    # 400 of 2000
    assert load.busy_cores(5.0) == pytest.approx(0.1 * cores)    # from the sample at 10
    assert load.busy_cores(15.0) is None                          # one sample since
    assert load.peak_cores(0.0) == pytest.approx(0.3 * cores)    # 300 of 1000, 0 to 10
    assert load.peak_cores(15.0) is None
    # the busiest second counts: 0.5 on average leaves room, a full machine does not
    assert sched.room_for_one_more(1, 0.3, peak=1.2)             # 1.2 + 0.45 <= 1.8
    assert not sched.room_for_one_more(1, 0.3, peak=1.5)         # 1.5 + 0.45 > 1.8
    load.sample(30.0)                                             # /proc/stat here
    assert load.samples[-1][0] == 30.0


def test_runs_of_known_loads_are_packed_first_fit() -> None:
    """Where each run's load is known (an earlier regeneration's), the next run is the
    first, longest first, whose load fits beside those under way within the
    headroom: three AsyncFedED runs of 0.48 cores crowded each other at 1.44 of 2
    cores (2026-11-29), so at 0.6 two go, and a light run fills beside them."""
    from fedsim.sweep.pick import Item, RunningItem, next_item

    sched = Scheduler("auto", max_jobs=8, headroom=0.6)
    sched.cores = 2

    def item(key: str) -> Item:
        p = sw.Point(variant=key, grid=(), seed=1, overrides=())
        return Item(0, "s", p, None, Path("."))  # type: ignore[arg-type]

    heavy1, heavy2, heavy3, light = item("h1"), item("h2"), item("h3"), item("l")
    loads = {heavy1.key: 0.48, heavy2.key: 0.48, heavy3.key: 0.48, light.key: 0.1}
    todo = [heavy1, heavy2, heavy3, light]

    def of(it: Item) -> float | None:
        return loads.get(it.key)

    assert next_item(todo, {}, sched, of) == 0                 # the first always goes
    running = {1: RunningItem(heavy1, None, 0.0, 1, 1.0, 0.48)}
    assert next_item(todo[1:], running, sched, of) == 0        # 0.96 <= 1.2
    running[2] = RunningItem(heavy2, None, 0.0, 2, 1.0, 0.48)
    assert next_item(todo[2:], running, sched, of) == 1        # not h3 (1.44): the light one
    running[3] = RunningItem(light, None, 0.0, 3, 1.0, 0.1)
    assert next_item([heavy3], running, sched, of) is None
    # a crowded failure shrinks the share packed: 0.8 x 0.6 of 2 cores = 0.96
    sched.finished(0.5, "fail", shared=True, at=3)
    assert sched.budget == pytest.approx(0.48)
    assert not sched.fits(0.48, 0.48 + 0.01, 1)
    sched.finished(0.5, "pass")
    assert sched.budget == pytest.approx(0.50)                # back up by 0.02 a run
    # a run of unknown load under way, or first in line: the count rule
    running[4] = RunningItem(item("u"), None, 0.0, 4, 1.0, None)
    assert next_item([heavy3], running, sched, of) is None     # 4 under way, 2 allowed
    assert next_item([item("u2")], {}, sched, of) == 0



def test_a_light_run_takes_a_gap_only_if_it_ends_before_the_heaviest_can_go() -> None:
    """EASY backfilling: while the first in line waits for room, a later run that
    fits goes only if it is expected to end before enough room frees for the first
    (so the longest runs are not pushed to the tail by light ones)."""
    from fedsim.sweep.pick import Item, RunningItem, _room_at, next_item

    sched = Scheduler("auto", max_jobs=8, headroom=0.6)
    sched.cores = 2                                         # 1.2 cores to fill

    def item(key: str) -> Item:
        p = sw.Point(variant=key, grid=(), seed=1, overrides=())
        return Item(0, "s", p, None, Path("."))  # type: ignore[arg-type]

    h1, h2, h3, long_, short = (item(k) for k in ("h1", "h2", "h3", "long", "short"))
    loads = {h1.key: 0.48, h2.key: 0.48, h3.key: 0.48, long_.key: 0.1, short.key: 0.1}
    seconds = {h1.key: 455.0, h2.key: 455.0, h3.key: 455.0, long_.key: 400.0,
               short.key: 100.0}
    running = {1: RunningItem(h1, None, 0.0, 0, 1.0, 0.48),
               2: RunningItem(h2, None, 100.0, 0, 1.0, 0.48)}

    def of(it: Item) -> float | None:
        return loads.get(it.key)

    def secs(it: Item) -> float | None:
        return seconds.get(it.key)

    # h3 needs 0.24 cores freed: h1's end at 455 s frees them
    assert _room_at(0.48, 0.96, running, sched, secs, 200.0) == 455.0
    assert next_item([h3, long_, short], running, sched, of, secs, 200.0) == 2   # not long (600)
    assert next_item([h3, long_], running, sched, of, secs, 200.0) is None
    assert next_item([h3, long_], running, sched, of, lambda it: None, 200.0) == 1   # unknown


def test_a_crowding_episode_shrinks_the_share_once_and_only_runs_at_the_cap_raise_it() -> None:
    sched = Scheduler("auto", max_jobs=8, headroom=0.6)
    sched.cores = 2
    sched.finished(0.9, "pass")
    sched.finished(0.9, "fail", shared=True, at=2, started=10.0)
    assert sched.budget == pytest.approx(0.48)
    # another run of the same episode (started before the share shrank): answered
    sched.finished(0.9, "fail", shared=True, at=2, started=11.0)
    assert sched.budget == pytest.approx(0.48)
    assert sched.cap == 1
    sched.finished(0.9, "pass", at=1)                   # at the cap: 2 in a row needed
    assert sched.cap == 1
    sched.finished(0.9, "pass", at=1)
    assert sched.cap == 2
    sched.finished(0.9, "pass", at=1)                   # below it now: does not count
    sched.finished(0.9, "pass", at=1)
    assert sched.cap == 2
    sched.finished(0.9, "pass", at=2)
    sched.finished(0.9, "pass", at=2)
    assert sched.cap == 3


def test_a_quantity_every_run_shares_is_drawn_flat_without_an_offset() -> None:
    """Runs that stop at run.time_budget end within microseconds of it: the figure shows
    the flat line, not microseconds stretched over the axis under a ``1e-6+5`` offset."""
    s = sw.sweep_from_scenario(QUICK, grid=["network.up.delay=0.0,0.1"])
    s.plot = {"y": ["emulated_seconds"]}
    agg = [{"variant": "", "network.up.delay": d, "n": 1, "emulated_seconds_mean": m,
            "emulated_seconds_ci95": None} for d, m in ((0.0, 5.000058), (0.1, 5.000066))]
    (ax,) = sw.sweep_figures(s, agg)["emulated_seconds"].axes
    lo, hi = ax.get_ylim()
    assert lo == pytest.approx(5.000058 - 0.25)
    assert hi == pytest.approx(5.000066 + 0.25)
    assert ax.yaxis.get_major_formatter().get_useOffset() is False
    # values that differ keep matplotlib's own limits
    agg[1]["emulated_seconds_mean"] = 7.5
    (ax,) = sw.sweep_figures(s, agg)["emulated_seconds"].axes
    assert ax.get_ylim()[1] < 8.0
