"""tools/claims.py and tools/claimslib/: the evaluators on hand-made sweep results, and
what the tool writes.

Every evaluator is tried on the points of its real sweep file
(scenarios/repro/), with hand-made run directories (summary, metrics.csv,
events.jsonl): once where the claim holds and once with the mechanism
switched off or the direction reversed, so each verdict rule is shown to tell
the two apart. Nothing here runs a federation.
"""

from __future__ import annotations

import csv
import itertools
import json
import math
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fedsim import sweep as sw

ROOT = Path(__file__).resolve().parents[1]
REPRO = ROOT / "scenarios" / "repro"
sys.path.insert(0, str(ROOT / "tools"))     # claimslib, as `python tools/claims.py` finds it

from claimslib import writer  # noqa: E402
from claimslib.asyncfeded import eval_af1, eval_af1_authors, eval_af2  # noqa: E402
from claimslib.charts import Chart, Panel, draw_chart  # noqa: E402
from claimslib.deltasgd import eval_ds1, eval_ds2  # noqa: E402
from claimslib.dga import _one_way_delay, eval_dg1, eval_dg2  # noqa: E402
from claimslib.fedasync import eval_fa1, eval_fa2  # noqa: E402
from claimslib.fedspeed import eval_fs1, eval_fs2  # noqa: E402
from claimslib.runs import setting  # noqa: E402
from claimslib.verdict import (  # noqa: E402
    NON_NEGATIVE,
    NOT_SEEN,
    SHOWN,
    WITHIN_NOISE,
    Check,
    fmt,
    judge,
    pct,
    pts,
    side,
)
from tool_module import load_tool  # noqa: E402

claims = load_tool("claims", "claims_tool")
KEY = "network.up.delay+network.down.delay"


# -- hand-made runs ---------------------------------------------------------------

def _write_run(run_dir: Path, run: dict[str, Any]) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    if "metrics" in run:
        with open(run_dir / "metrics.csv", "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=["t", "updates", "accuracy", "loss"])
            w.writeheader()
            for row in run["metrics"]:
                w.writerow({k: ("" if isinstance(v, float) and math.isnan(v) else v)
                            for k, v in row.items()})
    if "events" in run:
        (run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n"
                                                      for e in run["events"]))
    for name, obj in run.get("files", {}).items():
        (run_dir / name).write_text(json.dumps(obj))


def _runs(tmp: Path, sweep: sw.Sweep, make: Callable[[sw.Point], dict[str, Any]],
          verdict: str = "pass") -> list[Any]:
    """A PointResult per point of ``sweep``: ``make(point)`` gives its summary figures and
    optionally its metrics rows, events and other files."""
    out = []
    for p in sweep.points():
        run = make(p)
        summary = {"status": "completed", "fidelity": {"verdict": verdict}, **run["summary"]}
        _write_run(tmp / "runs" / p.key, run)
        out.append(sw.PointResult(p, tmp / "runs" / p.key, "completed", verdict, 1, 1.0, 0.5,
                                  summary))
    return out


def _sweep(name: str) -> sw.Sweep:
    return sw.load_sweep(REPRO / f"{name}.sweep.toml")


def sweep_grid(name: str) -> list[Any]:
    """The values of a shipped sweep's (only) grid key."""
    (values,) = _sweep(name).grid.values()
    return list(values)


def _get(sweep: sw.Sweep, p: sw.Point, key: str) -> Any:
    return setting(sweep, p, key)


def _curve(final: float, n: int = 20, every: float = 1.0, dip: bool = False,
           rise: float = 0.3) -> list[dict[str, float]]:
    """An accuracy curve rising to ``final`` (a fraction ``rise`` of the run), with a dip of
    5 points every third evaluation after the rise when ``dip``."""
    rows = []
    for i in range(n + 1):
        acc = final * min(1.0, (i + 1) / (rise * n))
        if dip and i > rise * n and i % 3 == 0:
            acc -= 0.05
        rows.append({"t": i * every, "updates": 10 * i, "accuracy": acc, "loss": 2 - acc})
    return rows


def _jitter(seed: int, scale: float = 0.002) -> float:
    return scale * (seed - 2)


# -- the verdict rule --------------------------------------------------------------

def test_an_interval_stays_within_what_its_figure_can_be() -> None:
    # AF-1a's three AsyncFedED seeds: a Student-t interval of 52.0 to 116.6 %
    assert pct([0.911, 0.925, 0.693]) == ("84.3 % (95 % CI 52.0 to 100.0) "
                                          "[per seed: 91.1, 92.5, 69.3]")
    assert pct([0.02, 0.01, 0.4]).startswith("14.3 % (95 % CI 0.0 to 69.6) [per seed: 2.0,")
    assert pct([0.8]) == "80.0 % (1 seed)"
    # FA-1's Const/Poly ratio of loss spreads: -4.78 to 11.40 before
    assert fmt(3.31, 8.09, unit="x") == "3.31x (95 % CI 0.00 to 11.40)"
    assert fmt(-1.0, 0.5) == "-1.00 (95 % CI -1.50 to -0.50)"
    # DS-2's spread of final accuracy over delta: 0.0 to 155.2 points before
    assert pts([0.007, 0.007, 0.922], NON_NEGATIVE) == ("31.2 points (95 % CI 0.0 to 100.0) "
                                                        "[per seed: 0.7, 0.7, 92.2]")
    assert pts([-0.9, -0.95, 0.1]).startswith("-58.3 points (95 % CI -100.0 to 88.8)")


def test_side_shown_within_noise_and_not_seen() -> None:
    assert side([1.0, 1.1, 0.9], 0.0) == SHOWN
    assert side([1.0, -0.8, 0.9], 0.0) == WITHIN_NOISE
    assert side([-1.0, -1.1, -0.9], 0.0) == NOT_SEEN
    assert side([0.5], 0.0) == WITHIN_NOISE          # one seed shows nothing
    assert side([0.01, 0.011, 0.012], 0.02, below=True) == SHOWN
    assert side([math.inf, 3.0, 2.0], 1.0) == SHOWN   # a diverged seed
    assert side([], 0.0) is None


def test_judge_maps_checks_to_verdicts() -> None:
    c = Check
    s, n, w = SHOWN, NOT_SEEN, WITHIN_NOISE
    assert judge([c("a", s), c("b", s)])[0] == "reproduced"
    assert judge([c("a", s), c("b", n)])[0] == "partly"
    assert judge([c("a", n), c("b", w)])[0] == "not reproduced"
    assert judge([c("a", w), c("b", w)])[0] == "inconclusive"
    verdict, text = judge([c("a", None)])
    assert verdict == "inconclusive"
    assert text == "No faithful runs to compare."
    assert judge([c("a", s), c("b", None)])[0] == "partly"
    assert judge([c("x", s), c("y", n)])[1] == "Shown: x. Not seen: y."


# -- DG-1 --------------------------------------------------------------------------

TAU = 0.04


def _round_times(per_round: Callable[[int], float], rounds: int = 20) -> list[dict[str, Any]]:
    """The server's aggregate records of a run whose round r took ``per_round(r)`` s."""
    t, out = 0.0, []
    for r in range(1, rounds + 1):
        t += per_round(r)
        out.append({"ev": "aggregate", "t": t, "round": r})
    return out


def _fedavg_round(d: float, k: int = 5) -> Callable[[int], float]:
    return lambda r: k * TAU + 2 * d


def _dga_round(d: float, d_steps: int = 20, k: int = 5) -> Callable[[int], float]:
    """Paper mode: the first s + 1 rounds never wait; then a wait of RTT - D tau once per
    period of s + 1 rounds when the round trip exceeds D steps (D = 0: FedAvg)."""
    if d_steps == 0:
        return _fedavg_round(d, k)
    period = (d_steps - 1) // k + 1
    wait = max(0.0, 2 * d - d_steps * TAU)
    return lambda r: k * TAU + (wait if r > period and (r - 1) % period == 0 else 0.0)


def _dg1_make(sweep: sw.Sweep, d_steps: int = 20,
              drain: bool = True) -> Callable[[sw.Point], dict[str, Any]]:
    def make(p: sw.Point) -> dict[str, Any]:
        d = _one_way_delay(sweep, p)
        k = int(p.variant.split("K=")[1].split()[0])
        fn = (_fedavg_round(d, k) if p.variant.startswith("FedAvg")
              else _dga_round(d, d_steps, k))
        noisy = lambda r: fn(r) * (1 + 0.01 * p.seed)  # noqa: E731
        evs = _round_times(noisy)
        end = evs[-1]["t"] + (2 * d if drain else 0.0)   # the last averages' flight
        return {"summary": {"emulated_seconds": end, "rounds": 20}, "events": evs}
    return make


def _dg1_sweep(tmp_path: Path, grid: list[float]) -> sw.Sweep:
    scen = tmp_path / "dg1.toml"
    scen.write_text("[algorithm]\nname = \"dga\"\nlocal_steps = 5\ndelay = 20\n"
                    "[devices]\nstep_time = 0.04\n")
    return sw.Sweep(scenario=scen, seeds=[1, 2, 3], grid={KEY: grid},
                    variants=[sw.Variant("FedAvg K=5", {"algorithm.name": "fedavg"}),
                              sw.Variant("DGA K=5 D=20", {})])


def test_dg1_reproduced_when_the_knee_falls_where_the_analysis_puts_it(tmp_path: Path) -> None:
    sweep = _dg1_sweep(tmp_path, [0.001, 0.1, 0.3, 0.5, 1.0, 5.0])
    f = eval_dg1(sweep, _runs(tmp_path, sweep, _dg1_make(sweep)))
    assert f.verdict == "reproduced", f
    # FedAvg at 5 s: 0.2 + 10 s a round; DGA: one wait of 10 - 0.8 s per 4 rounds
    assert f.number.startswith("speedup 4.0")
    assert "at 1000 ms" in f.number
    assert "DGA flat at 300 ms" in f.why
    assert "DGA waits for the round trip at 500 ms" in f.why
    assert f.details[0].startswith("| one-way latency | FedAvg K=5 predicted | FedAvg K=5 "
                                   "measured | DGA predicted | DGA measured | speedup |")
    assert f.chart is not None
    panel = f.chart.panels[0]
    assert panel.marks == [(400.0, "predicted knee: round trip = D tau_g (400 ms one way)")]
    assert "predicted: DGA K=5 D=20 (max(tau_g, RTT/D))" in panel.series


def test_dg1_counts_neither_the_pipeline_start_nor_the_last_flight(tmp_path: Path) -> None:
    """At 400 ms one way (round trip = D tau_g) the old rule read 1.21x from the whole run's
    time: the last averages' flight, paid once. In steady state DGA is flat there."""
    sweep = _dg1_sweep(tmp_path, [0.001, 0.39, 1.0])
    f = eval_dg1(sweep, _runs(tmp_path, sweep, _dg1_make(sweep, drain=True)))
    assert f.verdict == "reproduced", f


def test_dg1_not_reproduced_when_dga_waits_like_fedavg(tmp_path: Path) -> None:
    """The mechanism switched off (D = 0: DGA is FedAvg): DGA is not flat below the knee."""
    sweep = _dg1_sweep(tmp_path, [0.001, 0.1, 0.3, 0.5, 1.0, 5.0])
    f = eval_dg1(sweep, _runs(tmp_path, sweep, _dg1_make(sweep, d_steps=0)))
    assert f.verdict in ("partly", "not reproduced"), f
    assert "Not seen: DGA flat at 100 ms" in f.why


def test_dg1_not_reproduced_when_dga_never_waits(tmp_path: Path) -> None:
    """A DGA that hid any latency (no knee) is not what the analysis predicts either."""
    sweep = _dg1_sweep(tmp_path, [0.001, 0.3, 1.0, 5.0])
    make = _dg1_make(sweep)

    def flat(p: sw.Point) -> dict[str, Any]:
        run = make(p)
        if p.variant.startswith("DGA"):
            run["events"] = _round_times(lambda r: 5 * TAU)
        return run

    f = eval_dg1(sweep, _runs(tmp_path, sweep, flat))
    assert f.verdict == "partly", f
    assert "Not seen: DGA waits for the round trip at 1000 ms" in f.why


def test_flagged_runs_do_not_count(tmp_path: Path) -> None:
    sweep = _dg1_sweep(tmp_path, [0.001, 0.1, 0.5, 5.0])
    res = _runs(tmp_path, sweep, _dg1_make(sweep))
    for r in res:
        if dict(r.point.grid)[KEY] == 5.0:
            r.verdict = "fail"
    f = eval_dg1(sweep, res)
    assert f.verdict != "reproduced"
    assert "Not measured: DGA waits for the round trip at 5000 ms" in f.why


def test_dg1_grid_form_with_larger_fedavg_k(tmp_path: Path) -> None:
    """FedAvg K=5, K=10, K=20 and DGA over a latency grid key: K = 20 trains 4x K = 5's
    steps per round, compared per local step."""
    sweep = _dg1_sweep(tmp_path, [0.001, 0.5, 1.0])
    sweep.variants[1:1] = [sw.Variant("FedAvg K=10", {"algorithm.name": "fedavg"}),
                           sw.Variant("FedAvg K=20", {"algorithm.name": "fedavg"})]
    f = eval_dg1(sweep, _runs(tmp_path, sweep, _dg1_make(sweep)))
    assert f.verdict == "reproduced", f
    assert f.details[0].endswith("| FedAvg K=10 speedup over K=5 | FedAvg K=20 speedup over "
                                 "K=5 |")
    assert f.details[-1].startswith("| 1000 ms |")
    # per local step at 1 s: FedAvg K=5 2.2 / 5, K=10 2.4 / 10, K=20 2.8 / 20
    assert "| 1.83x (95 % CI 1.83 to 1.83) [per seed: 1.83, 1.83, 1.83] | 3.14x" in f.details[-1]


def test_dg1_predicts_the_wait_when_k_does_not_divide_d(tmp_path: Path) -> None:
    """D = 12, K = 5 (s = 2, r = 2): a period of 3 rounds lasts RTT + 3 tau_g when it
    waits, not the 15 steps x RTT/D of the K | D formula."""
    scen = tmp_path / "dg1.toml"
    scen.write_text("[algorithm]\nname = \"dga\"\nlocal_steps = 5\ndelay = 12\n"
                    "[devices]\nstep_time = 0.04\n")
    sweep = sw.Sweep(scenario=scen, seeds=[1, 2, 3], grid={KEY: [0.001, 0.1, 1.0, 5.0]},
                     variants=[sw.Variant("FedAvg K=5", {"algorithm.name": "fedavg"}),
                               sw.Variant("DGA K=5 D=20", {})])
    f = eval_dg1(sweep, _runs(tmp_path, sweep, _dg1_make(sweep, d_steps=12)))
    assert f.verdict == "reproduced", f
    # at 5 s one way: (10 + 0.12) / (3 x 5 x 0.04) = 16.87 tau_g per step, predicted and seen
    assert f.details[-1].split(" | ")[3] == "16.87"


def test_dg1_on_the_shipped_sweep(tmp_path: Path) -> None:
    sweep = _sweep("dg1")
    f = eval_dg1(sweep, _runs(tmp_path, sweep, _dg1_make(sweep)))
    assert f.verdict == "reproduced", f
    assert len(f.details) == 2 + len(sweep_grid("dg1"))
    grid = sweep_grid("dg1")
    assert any(2 * d < 0.8 < 2 * e for d, e in itertools.pairwise(grid))  # both sides of the knee
    assert f.chart is not None
    assert {v.label for v in sweep.variants} <= set(f.chart.panels[0].series)


def test_dg1_on_the_shipped_sweep_with_d0_does_not_reproduce(tmp_path: Path) -> None:
    sweep = _sweep("dg1")
    f = eval_dg1(sweep, _runs(tmp_path, sweep, _dg1_make(sweep, d_steps=0)))
    assert f.verdict != "reproduced", f


def test_dg1_reads_the_latency_from_each_variant(tmp_path: Path) -> None:
    """The other form: a variant per method and latency ("DGA K=5 D=20 @ 400 ms")."""
    scen = tmp_path / "dg1.toml"
    scen.write_text("[algorithm]\nname = \"dga\"\nlocal_steps = 5\ndelay = 20\n"
                    "[network]\nrtt = 1.0\n[devices]\nstep_time = 0.04\n")
    variants = [sw.Variant(f"{m} @ {d * 1e3:g} ms", {"network.rtt": 2 * d,
                                                     **({"algorithm.name": "fedavg"}
                                                        if m.startswith("FedAvg") else {})})
                for d in (0.001, 0.1, 0.3, 1.0, 2.0) for m in ("FedAvg K=5", "DGA K=5 D=20")]
    sweep = sw.Sweep(scenario=scen, seeds=[1, 2, 3], variants=variants)
    f = eval_dg1(sweep, _runs(tmp_path, sweep, _dg1_make(sweep)))
    assert f.verdict == "reproduced", f
    assert [row.split(" |")[0] for row in f.details[2:]] == [
        "| 1 ms", "| 100 ms", "| 300 ms", "| 1000 ms", "| 2000 ms"]


# -- FA-1 --------------------------------------------------------------------------

def _fa1(tmp_path: Path, const_std: float, adaptive_std: float,
         diverge: bool = False) -> Any:
    sweep = _sweep("fa1")

    def make(p: sw.Point) -> dict[str, Any]:
        st = _get(sweep, p, "algorithm.staleness")
        hot = _get(sweep, p, "algorithm.alpha") == 0.9 and _get(
            sweep, p, "algorithm.concurrency") == 17
        a = (const_std if st == "const" else adaptive_std) if hot else 0.02
        a *= 1 + 0.05 * p.seed
        rows = [{"t": i, "updates": 10 * i, "accuracy": 0.7,
                 "loss": 1.0 + (a if i % 2 else -a)} for i in range(20)]
        if diverge and hot and st == "const":
            for row in rows[15:]:
                row["loss"] = math.nan
        return {"summary": {"staleness": {"mean": 15.5 if hot else 4.0}}, "metrics": rows}

    return eval_fa1(sweep, _runs(tmp_path, sweep, make))


def test_fa1_reproduced_when_const_is_the_noisy_one(tmp_path: Path) -> None:
    f = _fa1(tmp_path, const_std=0.3, adaptive_std=0.05)
    assert f.verdict == "reproduced", f
    assert f.number.startswith("Const/Poly late-loss std 6.00x")
    assert "c = 17, alpha = 0.9" in f.number
    assert len(f.details) == 2 + 8
    # five seeds: 0.02 x (1 + 0.05 s) for s = 1..5, mean 0.023 and 0.024 shown
    assert f.details[-1].startswith("| Const alpha=0.3, concurrency = 17 | 0.024")
    assert f.details[3].startswith("| Poly a=0.5 alpha=0.9, concurrency = 5 | 0.024")
    assert f.chart is not None


def test_fa1_not_reproduced_when_the_adaptive_weight_is_the_noisy_one(tmp_path: Path) -> None:
    f = _fa1(tmp_path, const_std=0.05, adaptive_std=0.3)
    assert f.verdict == "not reproduced", f
    assert "Measured: with 17 tasks in flight the staleness that occurred averaged 15.5" in f.why
    assert "CIFAR-10" not in f.why               # no guess, only what was measured


def test_fa1_a_diverged_constant_weight_is_the_least_stable(tmp_path: Path) -> None:
    f = _fa1(tmp_path, const_std=0.05, adaptive_std=0.05, diverge=True)
    assert f.verdict == "reproduced", f
    assert "diverged on 5 seeds" in f.number


# -- FA-2 --------------------------------------------------------------------------

def _fa2(tmp_path: Path, updates: dict[Any, float], reach: bool = True) -> Any:
    sweep = _sweep("fa2")

    def make(p: sw.Point) -> dict[str, Any]:
        name = _get(sweep, p, "algorithm.name")
        c = _get(sweep, p, "algorithm.concurrency")
        u = updates["fedavg" if name == "fedavg" else c] * (1 + 0.02 * p.seed)
        rows = [{"t": i, "updates": i * u / 10, "accuracy": 0.07 * i, "loss": 1.0}
                for i in range(11)]
        if not reach and name == "fedavg":
            for row in rows:
                row["accuracy"] = 0.5
        return {"summary": {"staleness": {"mean": max(0, c - 1) if c else None}},
                "metrics": rows}

    return eval_fa2(sweep, _runs(tmp_path, sweep, make))


def test_fa2_reproduced_when_fedasync_sits_between_and_slows_with_staleness(
        tmp_path: Path) -> None:
    f = _fa2(tmp_path, {1: 50, 2: 55, 5: 80, 17: 120, "fedavg": 200})
    assert f.verdict == "reproduced", f
    assert f.number.startswith("gradients to 70% over SGD's: FedAvg 4.00x")
    assert "c = 2, 5, 17: 1.10x, 1.60x, 2.40x" in f.number
    # 70 % first reached after 50 x (1.02 ... 1.10) updates of 20 steps each
    assert f.details[2].startswith("| SGD (one task in flight, alpha=1) | 1,060 (95 % CI")


def test_fa2_not_reproduced_when_staleness_changes_nothing_and_fedavg_is_fastest(
        tmp_path: Path) -> None:
    f = _fa2(tmp_path, {1: 200, 2: 60, 5: 60, 17: 60, "fedavg": 30})
    assert f.verdict == "not reproduced", f
    assert "Not seen: FedAvg needs more gradients than single-thread SGD" in f.why


def test_fa2_marks_runs_that_never_reached_the_target(tmp_path: Path) -> None:
    f = _fa2(tmp_path, {1: 50, 2: 55, 5: 80, 17: 120, "fedavg": 200}, reach=False)
    assert any(row.startswith("| FedAvg k=10 | >= ") and "0 of 5" in row for row in f.details)


# -- DS-1 --------------------------------------------------------------------------

def _ds1(tmp_path: Path, bad: dict[str, str]) -> Any:
    """Every optimizer at 0.85 on every task, except ``bad[optimizer]``'s task at 0.6."""
    sweep = _sweep("ds1")

    def make(p: sw.Point) -> dict[str, Any]:
        opt = _get(sweep, p, "client.optimizer")
        task = f"{_get(sweep, p, 'data.dataset')} {_get(sweep, p, 'model.name')}"
        acc = 0.6 if bad.get(opt) == task else 0.85 - (0.005 if opt == "deltasgd" else 0)
        return {"summary": {"final_accuracy": acc + _jitter(p.seed)}}

    return eval_ds1(sweep, _runs(tmp_path, sweep, make))


def test_ds1_reproduced_when_only_the_tuned_optimizers_fall_behind_somewhere(
        tmp_path: Path) -> None:
    f = _ds1(tmp_path, {"sgd": "digits cnn", "sgdm": "digits mlp", "adam": "digits cnn"})
    assert f.verdict == "reproduced", f
    assert f.number.startswith("largest gap to the best: Delta-SGD 0.5 points")
    assert "SGD 25.0, SGDM 25.0, Adam 25.0 points" in f.number
    assert len(f.details) == 2 + 4


def test_ds1_not_reproduced_when_delta_sgd_is_the_one_that_falls_behind(tmp_path: Path) -> None:
    f = _ds1(tmp_path, {"deltasgd": "digits cnn"})
    assert f.verdict == "not reproduced", f


# -- DS-2 --------------------------------------------------------------------------

def _ds2(tmp_path: Path, slope: float, client_spread: float) -> Any:
    sweep = _sweep("ds2")

    def make(p: sw.Point) -> dict[str, Any]:
        d = dict(p.grid)["client.delta"]
        evs = [{"t": r + c / 10, "ev": "train_end", "client": c, "lr_mean": 0.1 * (
            1 + (client_spread - 1) * c / 3)} for r in range(3) for c in range(4)]
        return {"summary": {"final_accuracy": 0.85 + slope * math.log10(d) + _jitter(p.seed)},
                "events": evs}

    return eval_ds2(sweep, _runs(tmp_path, sweep, make))


def test_ds2_reproduced_when_delta_barely_matters_and_clients_differ(tmp_path: Path) -> None:
    f = _ds2(tmp_path, slope=0.002, client_spread=3.0)
    assert f.verdict == "reproduced", f
    assert f.number.startswith("spread of final accuracy over delta 0.4 points")
    assert "differ 3.0x" in f.number
    assert f.chart is not None
    assert f.chart.panels[0].min_span == 8.0         # a 1-point change drawn as one


def test_ds2_not_reproduced_when_delta_moves_accuracy_and_clients_step_alike(
        tmp_path: Path) -> None:
    f = _ds2(tmp_path, slope=0.05, client_spread=1.0)
    assert f.verdict == "not reproduced", f


# -- DG-2 --------------------------------------------------------------------------

def _dg2(tmp_path: Path, gain: Callable[[int], float], without: float = 0.8,
         per_round: float | None = None, sgd_gain: Callable[[int], float] | None = None) -> Any:
    """Final accuracies: ``without`` for a run without the correction (``per_round`` for the
    per-round reading, when given), plus ``gain(D)`` with it (``sgd_gain`` with plain SGD)."""
    sweep = _sweep("dg2")

    def make(p: sw.Point) -> dict[str, Any]:
        d = dict(p.grid)["algorithm.delay"]
        corr = _get(sweep, p, "algorithm.correction")
        sgd = _get(sweep, p, "client.optimizer") == "sgd"
        g = (sgd_gain or gain) if sgd else gain
        base = per_round if corr == "none" and per_round is not None else without
        acc = base + (g(d) if corr == "full" else 0.0)
        acc += _jitter(p.seed) * (2 if corr == "full" else 1)
        return {"summary": {"final_accuracy": acc}}

    return eval_dg2(sweep, _runs(tmp_path, sweep, make))


def test_dg2_reproduced_when_the_gain_grows_with_d(tmp_path: Path) -> None:
    f = _dg2(tmp_path, lambda d: 0.0025 * d)
    assert f.verdict == "reproduced", f
    assert "at D = 5" in f.number
    # the gain at D = 20 is 5 points, give or take the seeds' jitter, with its CI
    at_20 = re.search(r"(\d+\.\d) points \(95 % CI [^)]*\) \[per seed: [^]]*\] at D = 20",
                      f.number)
    assert at_20 is not None, f.number
    assert abs(float(at_20.group(1)) - 5.0) <= 0.2
    assert f.number.endswith("(under without correction read per step (from D steps after a "
                             "round is sent, each of the next K steps moves along 1/K of its "
                             "all-client average; never along the client's own gradient), "
                             "momentum SGD)")


def test_dg2_reports_both_readings_of_without_correction(tmp_path: Path) -> None:
    """The per-step reading shows the paper's widening gap; the per-round jump fails to
    learn at all, so its gap is the whole accuracy at every D: both are in the text.
    With the correction the accuracy falls a little with D (Table 1: 89.2 to 88.7)."""
    sweep = _sweep("dg2")

    def make(p: sw.Point) -> dict[str, Any]:
        d = dict(p.grid)["algorithm.delay"]
        acc = {"full": 0.9 - 0.0005 * d, "none_per_step": 0.9 - 0.003 * d,
               "none": 0.1}[_get(sweep, p, "algorithm.correction")]
        return {"summary": {"final_accuracy": acc + _jitter(p.seed)}}

    f = eval_dg2(sweep, _runs(tmp_path, sweep, make))
    assert f.verdict == "reproduced", f
    assert "Under without correction read per round" in f.why
    assert "(measured): **partly**" in f.why
    assert "without the correction no run learned at any D" in f.why
    assert any(line.startswith("**Under without correction read per round") for line in f.details)


def test_dg2_not_reproduced_when_the_correction_changes_nothing(tmp_path: Path) -> None:
    f = _dg2(tmp_path, lambda d: 0.0)
    assert f.verdict == "not reproduced", f
    assert "Not seen: the correction helps at D = 20" in f.why


def test_dg2_says_so_when_no_run_without_the_correction_learned(tmp_path: Path) -> None:
    f = _dg2(tmp_path, lambda d: 0.8, without=0.1)     # the gap saturates at every D
    assert f.verdict == "partly", f
    assert "without the correction no run learned at any D" in f.why


def test_dg2_the_momentum_ablation_is_judged_on_its_own(tmp_path: Path) -> None:
    f = _dg2(tmp_path, lambda d: 0.8, without=0.1, sgd_gain=lambda d: 0.0025 * d)
    assert f.verdict == "partly", f
    assert ("Under without correction read per step, plain SGD (momentum -> none, lr kept: the "
            "effective step 10x smaller) (measured): **reproduced**") in f.why


# -- AF-1 and AF-1a ----------------------------------------------------------------

def _af(p_acc: Callable[[str, float], float], short: Callable[[str, float], float] | None = None
        ) -> Callable[[sw.Sweep, sw.Point], dict[str, Any]]:
    """Best accuracy ``p_acc(method, P)`` in the paper's budget, ``short(...)`` (default the
    same) in the ablation's shorter one."""
    def make(sweep: sw.Sweep, p: sw.Point) -> dict[str, Any]:
        m = _get(sweep, p, "algorithm.name")
        prob = _get(sweep, p, "availability.p")
        paper = _get(sweep, p, "run.time_budget") == 300.0
        best = (p_acc if paper or short is None else short)(m, prob) + _jitter(p.seed, 0.005)
        return {"summary": {"best_accuracy": best, "final_accuracy": best - 0.01,
                            "updates": 500, "staleness": {"mean": 1.2}},
                "metrics": _curve(best, rise=0.2 + 0.5 * prob)}
    return make


def _collapse(m: str, p: float) -> float:
    return 0.95 - 0.01 * p if m == "asyncfeded" else 0.94 - 0.6 * p ** 3


def test_af1_reproduced_when_fedasync_collapses_at_large_p(tmp_path: Path) -> None:
    sweep = _sweep("af1")
    make = _af(_collapse)
    f = eval_af1(sweep, _runs(tmp_path, sweep, lambda p: make(sweep, p)))
    assert f.verdict == "reproduced", f
    # 95 and 94.1 %, each with its seeds' jitter (under 0.5 points)
    assert re.search(r"AsyncFedED 9[45]\.\d -> 9[34]\.\d %", f.number), f.number
    assert f.number.endswith("(under the paper's 300 s budget)")
    assert f.details[0].startswith("**Under the paper's 300 s budget**")
    assert f.chart is not None
    assert len(f.chart.panels) == 4                 # two panels per budget
    assert f.chart.columns == 2


def test_af1s_time_to_90_percent_is_drawn_without_negative_error_bars(tmp_path: Path) -> None:
    """Seeds far apart give a Student-t interval below 0 s; the figure stops it at 0
    (as the tables do), where it had drawn -600 s."""
    from claimslib.charts import _errors

    sweep = _sweep("af1")
    make = _af(_collapse)

    def spread(p: sw.Point) -> dict[str, Any]:
        run = make(sweep, p)
        if p.seed == sweep.seeds[-1]:   # one seed reaches 90 % of its max late
            run["metrics"] = _curve(run["summary"]["best_accuracy"], rise=0.95)
        return run

    f = eval_af1(sweep, _runs(tmp_path, sweep, spread))
    assert f.chart is not None
    timed = [p for p in f.chart.panels if p.value.startswith("emulated s")]
    assert len(timed) == 2
    for panel in timed:
        for points in panel.series.values():
            means = [m for _, m, _ in points]
            cis = [c for _, _, c in points]
            assert any(m - c < 0 for m, c in zip(means, cis, strict=True))  # the case
            below, _ = _errors(panel, means, cis)
            assert all(m - b >= 0 for m, b in zip(means, below, strict=True))


def test_af1_reproduced_in_the_papers_budget_and_not_in_30_s(tmp_path: Path) -> None:
    """The ablation: only the budget changes, and the claim goes with it."""
    sweep = _sweep("af1")
    make = _af(_collapse, short=lambda m, p: 0.84 - 0.4 * p)
    f = eval_af1(sweep, _runs(tmp_path, sweep, lambda p: make(sweep, p)))
    assert f.verdict == "reproduced", f
    assert "Under a 30 s budget (budget 300 -> 30 s) (measured): **not reproduced**" in f.why


def test_af1_not_reproduced_when_both_degrade_alike(tmp_path: Path) -> None:
    sweep = _sweep("af1")
    make = _af(lambda m, p: 0.94 - 0.5 * p)
    f = eval_af1(sweep, _runs(tmp_path, sweep, lambda p: make(sweep, p)))
    assert f.verdict == "not reproduced", f
    assert "Measured: at P = 0.9 AsyncFedED applied 500 updates, FedAsync 500" in f.why


def test_af1_partly_when_fedasync_holds_up_too(tmp_path: Path) -> None:
    """The known case: AsyncFedED ahead at P = 0.9, but FedAsync does not collapse."""
    sweep = _sweep("af1")
    make = _af(lambda m, p: 0.85 if m == "asyncfeded" else 0.80)
    f = eval_af1(sweep, _runs(tmp_path, sweep, lambda p: make(sweep, p)))
    assert f.verdict == "partly", f
    assert "Not seen: FedAsync loses more of it than AsyncFedED" in f.why
    assert "mean staleness 1.2" in f.why


def _af1a(tmp_path: Path, authors: Callable[[str, float], float],
          slower: Callable[[str, float], float]) -> Any:
    """AF-1a's runs (af1a: the authors' pass times) beside AF-1's (4x slower devices)."""
    a, b = _sweep("af1a"), _sweep("af1")
    make_a, make_b = _af(authors), _af(slower)
    runs = (_runs(tmp_path / "a", a, lambda p: make_a(a, p))
            + _runs(tmp_path / "b", b, lambda p: make_b(b, p)))
    return eval_af1_authors(a, runs)


def test_af1_authors_reproduced_when_fedasync_collapses(tmp_path: Path) -> None:
    f = _af1a(tmp_path, lambda m, p: 0.98 if m == "asyncfeded" else 0.35,
              lambda m, p: 0.9 if m == "asyncfeded" else 0.85)
    assert f.verdict == "reproduced", f
    # 98 % give or take the seeds' jitter
    m = re.match(r"max accuracy at P = 0\.9: AsyncFedED (\d+\.\d) %", f.number)
    assert m is not None, f.number
    assert abs(float(m.group(1)) - 98.0) <= 0.5, f.number
    assert ("Under AF-1's devices (20 ms a local step: pass times x 4) (measured): "
            "**not reproduced**") in f.why


def test_af1_authors_not_reproduced_in_the_known_case(tmp_path: Path) -> None:
    """FedAsync 0.79 against AsyncFedED 0.84: no collapse, a 5-point gap."""
    known = lambda m, p: 0.84 if m == "asyncfeded" else 0.79  # noqa: E731
    f = _af1a(tmp_path, known, known)
    assert f.verdict == "not reproduced", f
    assert "Measured: at P = 0.9 FedAsync applied 500 updates of mean staleness 1.2" in f.why
    assert "not public" in f.why


# -- AF-2 --------------------------------------------------------------------------

def _af2(tmp_path: Path, adaptive_works: bool, in_40_s: bool | None = None) -> Any:
    sweep = _sweep("af2")
    sizes = [50, 100, 200, 400]
    steps = [0.01, 0.02, 0.03, 0.04]         # time per pass grows with the client index

    def make(p: sw.Point) -> dict[str, Any]:
        adaptive = _get(sweep, p, "algorithm.kappa") > 0
        short = _get(sweep, p, "run.time_budget") != 300.0
        works = adaptive_works if not short or in_40_s is None else in_40_s
        good = adaptive and works
        k_end = [20.0, 12.0, 6.0, 2.0] if good else [10.0] * 4
        evs = [{"t": 1.0 + i, "ev": "aggregate", "clients": [i % 4], "k_next": k_end[i % 4],
                "gamma": 3.1 if good else 6.0} for i in range(40)]
        return {"summary": {"best_accuracy": 0.9},
                "metrics": _curve(0.9 if good else 0.85, n=60, dip=not good,
                                  rise=0.2 if good else 0.5),
                "events": evs,
                "files": {"data.json": {"clients": [{"num_samples": n} for n in sizes]},
                          "heterogeneity.json": {"clients": [{"client": i, "step_time": s}
                                                             for i, s in enumerate(steps)]}}}

    return eval_af2(sweep, _runs(tmp_path, sweep, make))


def test_af2_reproduced_when_adaptive_k_is_faster_smoother_and_favours_fast_clients(
        tmp_path: Path) -> None:
    f = _af2(tmp_path, adaptive_works=True)
    assert f.verdict == "reproduced", f
    assert "rank correlation of a client's time per pass with its final K -1.00" in f.number


def test_af2_in_300_s_and_not_in_40_s(tmp_path: Path) -> None:
    f = _af2(tmp_path, adaptive_works=True, in_40_s=False)
    assert f.verdict == "reproduced", f
    assert "Under a 40 s budget (budget 300 -> 40 s) (measured): **not reproduced**" in f.why


def test_af2_not_reproduced_when_k_stays_put(tmp_path: Path) -> None:
    """kappa = 0 in effect: the 'adaptive' runs behave like K = 10."""
    f = _af2(tmp_path, adaptive_works=False)
    assert f.verdict == "not reproduced", f
    assert "Not measured: faster clients end with larger K" in f.why


# -- FS-1 and FS-2 -----------------------------------------------------------------

def _fs_key(sweep: sw.Sweep, p: sw.Point) -> str:
    """fedavg, fedadam, fedspeed (Algorithm 1's rule) or fedspeed-authors."""
    a = _get(sweep, p, "algorithm.name")
    if a == "fedspeed" and _get(sweep, p, "algorithm.server_rule") == "fl_simulator":
        return "fedspeed-authors"
    return str(a)


def _fs1(tmp_path: Path, loss_per_epoch: dict[str, float]) -> Any:
    sweep = _sweep("fs1")

    def make(p: sw.Point) -> dict[str, Any]:
        a = _fs_key(sweep, p)
        e = _get(sweep, p, "client.local_epochs")
        loss = loss_per_epoch.get(a, loss_per_epoch.get("fedspeed", 0.0))
        return {"summary": {"final_accuracy": 0.9 - loss * e + _jitter(p.seed)}}

    return eval_fs1(sweep, _runs(tmp_path, sweep, make))


def test_fs1_reproduced_when_fedspeed_holds_as_e_grows(tmp_path: Path) -> None:
    f = _fs1(tmp_path, {"fedavg": 0.005, "fedadam": 0.007, "fedspeed": 0.0005})
    assert f.verdict == "reproduced", f
    assert "FedSpeed 1.0 points" in f.number
    assert f.chart is not None
    assert set(f.chart.panels[0].series) == {"FedAvg", "FedAdam", "FedSpeed"}
    assert f.chart.panels[0].title.startswith("under the authors' server rule")


def test_fs1_with_the_authors_rule_and_not_with_algorithm_1s(tmp_path: Path) -> None:
    f = _fs1(tmp_path, {"fedavg": 0.005, "fedadam": 0.007, "fedspeed-authors": 0.0005,
                        "fedspeed": 0.01})
    assert f.verdict == "reproduced", f
    assert ("Under Algorithm 1's server rule, 10 % of clients a round (measured): "
            "**not reproduced**") in f.why


def test_fs1_not_reproduced_when_fedspeed_drifts_most(tmp_path: Path) -> None:
    f = _fs1(tmp_path, {"fedavg": 0.001, "fedadam": 0.001, "fedspeed": 0.006})
    assert f.verdict == "not reproduced", f


def _fs2(tmp_path: Path, gain: dict[str, float], paper_correction: float | None = None) -> Any:
    """Final accuracy 0.85 plus each module's gain; Algorithm 1's rule at 10 % gets
    ``paper_correction`` for the correction instead, when given."""
    sweep = _sweep("fs2")

    def make(p: sw.Point) -> dict[str, Any]:
        partial = _get(sweep, p, "algorithm.fraction") != 1.0
        paper = _get(sweep, p, "algorithm.server_rule") != "fl_simulator"
        g = dict(gain)
        if paper_correction is not None and paper and partial:
            g["correction"] = paper_correction
        acc = 0.85 + sum(v for m, v in g.items() if _get(sweep, p, f"algorithm.{m}"))
        return {"summary": {"final_accuracy": acc + _jitter(p.seed)}}

    return eval_fs2(sweep, _runs(tmp_path, sweep, make))


def test_fs2_reproduced_when_every_module_adds(tmp_path: Path) -> None:
    f = _fs2(tmp_path, {"prox": 0.005, "correction": 0.02, "perturbation": 0.02})
    assert f.verdict == "reproduced", f
    assert f.number.startswith("all three 89.5 % (95 % CI")
    assert f.details[0].startswith("**Under the authors' server rule (FL-Simulator)")
    assert sum(line.startswith("**Under") for line in f.details) == 3


def test_fs2_the_correction_drifts_under_algorithm_1s_rule_at_partial_participation(
        tmp_path: Path) -> None:
    f = _fs2(tmp_path, {"prox": 0.005, "correction": 0.02, "perturbation": 0.02},
             paper_correction=-0.1)
    assert f.verdict == "reproduced", f
    assert ("Under Algorithm 1's server rule, 10 % of clients a round (measured): "
            "**partly**") in f.why
    assert ("Under Algorithm 1's server rule, every client every round (partial -> full "
            "participation) (measured): **reproduced**") in f.why


def test_fs2_not_reproduced_when_the_modules_do_nothing(tmp_path: Path) -> None:
    f = _fs2(tmp_path, {"prox": 0.005, "correction": 0.0, "perturbation": 0.0})
    assert f.verdict == "not reproduced", f


# -- every claim, and what the tool writes -----------------------------------------

def test_every_claim_names_a_sweep_a_figure_and_the_papers_number() -> None:
    ids = [c.id for c in claims.CLAIMS]
    assert len(set(ids)) == len(ids)
    assert {"FA-1", "FA-2", "DS-1", "DS-2", "DG-1", "DG-2", "AF-1", "AF-1a", "AF-2", "FS-1",
            "FS-2"} <= set(ids)
    for c in claims.CLAIMS:
        sweep = sw.load_sweep(REPRO / c.sweep)
        assert sweep.points(), c.id
        assert c.figure is None or c.figure in sw.FIGURES, c.id
        assert c.figure is None or any(isinstance(v[0], (int, float))
                                       for v in sweep.grid.values()), c.id
        assert any(ch.isdigit() for ch in c.reported) or "figure only" in c.reported, c.id


@pytest.mark.parametrize("claim", claims.CLAIMS, ids=lambda c: c.id)
def test_every_evaluator_says_inconclusive_when_every_run_was_flagged(
        tmp_path: Path, claim: Any) -> None:
    sweep = sw.load_sweep(REPRO / claim.sweep)
    res = _runs(tmp_path, sweep, lambda p: {"summary": {"final_accuracy": 0.5}}, verdict="fail")
    f = claim.evaluate(sweep, res)
    assert f.verdict == "inconclusive", f


def test_a_sweep_without_the_claims_variants_is_named(tmp_path: Path) -> None:
    scen = tmp_path / "x.toml"
    scen.write_text("[algorithm]\nname = \"fedavg\"\n")
    sweep = sw.Sweep(scenario=scen, seeds=[1], variants=[sw.Variant("only", {})])
    res = _runs(tmp_path, sweep, lambda p: {"summary": {}})
    f = eval_fs2(sweep, res)
    assert f.verdict == "inconclusive"
    assert "prox-only" in f.why


def test_charts_draw_bars_and_lines(tmp_path: Path) -> None:
    chart = Chart("t", [
        Panel("accuracy", {"a": [("x", 0.8, 0.02), ("y", None, None)],
                                  "b": [("x", 0.7, None), ("y", 0.6, 0.01)]}),
        Panel("time", {"a": [(1, 2.0, 0.1), (10, 3.0, 0.2)]}, kind="lines",
                     xlabel="E", logx=True)])
    path = draw_chart(chart, tmp_path / "c.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match=r"Panel\.kind: 'pie'"):
        draw_chart(Chart("t", [Panel("v", {}, kind="pie")]),
                          tmp_path / "d.png")


def test_run_claim_evaluates_a_sweep_on_disk_and_writes_its_figure(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The --no-run path: read the sweep directory, evaluate, draw, copy into docs/claims/."""
    monkeypatch.setattr(writer, "DOCS", tmp_path / "docs")
    claim = next(c for c in claims.CLAIMS if c.id == "FS-2")
    sweep = _sweep("fs2")
    out = tmp_path / "sweeps"
    (out / "fs2").mkdir(parents=True)
    (out / "fs2" / "sweep.json").write_text(json.dumps(sweep.to_json()))
    for p in sweep.points():
        run_dir = out / "fs2" / "runs" / p.key
        run_dir.mkdir(parents=True)
        gain = 0.02 * sum(bool(_get(sweep, p, f"algorithm.{m}"))
                          for m in ("correction", "perturbation"))
        (run_dir / "summary.json").write_text(json.dumps({
            "status": "completed", "fidelity": {"verdict": "pass"}, "real_seconds": 2.0,
            "final_accuracy": 0.85 + gain + _jitter(p.seed)}))
    rec = writer.run_claim(claim, out, "auto", execute=False)
    assert rec["verdict"] == "reproduced"
    assert rec["figure"] == "docs/claims/fs-2.png"
    assert (tmp_path / "docs" / "claims" / "fs-2.png").exists()
    assert (out / "fs2" / "claim-fs-2.png").exists()
    assert rec["counted"] == rec["runs"] == 33
    assert rec["real_seconds"] == 66.0          # the runs' own time, one after another
    assert rec["sweep"] == "scenarios/repro/fs2.sweep.toml"
    assert "chart" not in rec
    writer.write_docs([rec])
    text = (tmp_path / "docs" / "claims.md").read_text()
    assert "## FS-2" in text
    assert "| variant | final accuracy | minus prox only |" in text
    assert "![FS-2](claims/fs-2.png)" in text


def test_runs_with_lost_client_work_are_named_and_never_counted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """DS-2's case: a run that went on without the client whose Delta-SGD step overflowed
    is not a plain result. The claim is judged on the other runs, and the table and
    docs/claims.md name the run, the client and the cause."""
    monkeypatch.setattr(writer, "DOCS", tmp_path / "docs")
    claim = next(c for c in claims.CLAIMS if c.id == "DS-2")
    sweep = _sweep("ds2")
    out = tmp_path / "sweeps"
    (out / "ds2").mkdir(parents=True)
    (out / "ds2" / "sweep.json").write_text(json.dumps(sweep.to_json()))
    for p in sweep.points():
        d = dict(p.grid)["client.delta"]
        broken = (d == 1.0 and p.variant.startswith("lognormal")
                  and p.seed == max(q.seed for q in sweep.points() if q.variant == p.variant))
        summary = {"status": "completed", "fidelity": {"verdict": "pass"}, "real_seconds": 2.0,
                   "final_accuracy": 0.09 if broken else 0.93 + _jitter(p.seed)}
        if broken:
            summary["lost_work"] = {
                "runs": 1, "by_reason": {"overflow": 1}, "by_client": {"9": {"overflow": 1}},
                "clients": [9], "first_reason": {"9": "training failed: StepOverflow: ..."}}
        _write_run(out / "ds2" / "runs" / p.key, {"files": {"summary.json": summary}})
    rec = writer.run_claim(claim, out, "auto", execute=False)
    assert rec["counted"] == rec["runs"] - 1
    (lost,) = rec["lost_work"]
    assert lost.startswith("lognormal client sizes, delta = 1.0, seed ")
    assert "client 9: overflow x1" in lost
    assert "diverged" not in rec["why"]               # the broken run is no plain result
    assert "Lost client work in 1 run(s), not counted: lognormal client sizes, delta = 1.0" in (
        writer.table([rec]))
    writer.write_docs([rec])
    assert "- Lost client work (not counted): lognormal client sizes, delta = 1.0" in (
        tmp_path / "docs" / "claims.md").read_text()


def test_a_claim_also_reads_another_claims_runs(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """AF-1a judges its own runs (the authors' pass times) and AF-1's at P = 0.9 (4x slower
    devices): ``also`` brings the second sweep's runs from their own directory."""
    monkeypatch.setattr(writer, "DOCS", tmp_path / "docs")
    claim = next(c for c in claims.CLAIMS if c.id == "AF-1a")
    assert claim.also == ("af1.sweep.toml",)
    out = tmp_path / "sweeps"
    for name in ("af1a", "af1"):
        sweep = _sweep(name)
        (out / name).mkdir(parents=True)
        (out / name / "sweep.json").write_text(json.dumps(sweep.to_json()))
        make = _af(lambda m, p, n=name: (0.98 if m == "asyncfeded" else
                                         0.35 if n == "af1a" else 0.9))
        for p in sweep.points():
            run = make(sweep, p)
            run["summary"].update({"status": "completed", "fidelity": {"verdict": "pass"},
                                   "real_seconds": 1.0})
            run["files"] = {"summary.json": run["summary"]}
            _write_run(out / name / "runs" / p.key, run)
    rec = writer.run_claim(claim, out, "auto", execute=False)
    assert rec["verdict"] == "reproduced", rec
    assert ("Under AF-1's devices (20 ms a local step: pass times x 4) (measured): "
            "**not reproduced**") in rec["why"]
    assert (out / "af1a" / "claim-af-1a.png").exists()


def test_the_table_goes_between_the_readme_markers(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\nbefore\n{writer.BEGIN}\nold\n{writer.END}\nafter\n")
    monkeypatch.setattr(writer, "ROOT", tmp_path)
    rec = {"id": "DG-1", "claim": "c", "reported": "5x", "number": "4.9x", "verdict": "reproduced",
           "why": "w.", "figure": "docs/claims/dg-1.png", "measured": "2026-11-24",
           "commit": "abc123", "command": "python tools/claims.py --only DG-1"}
    writer.write_readme([rec])
    text = readme.read_text()
    assert "old" not in text
    assert text.startswith("# x\nbefore\n")
    assert text.endswith("after\n")
    # claim, verdict and the link: the numbers and the reason are in docs/claims.md
    assert "Measured 2026-11-24 at abc123." in text
    assert ("| **DG-1** c | **reproduced** | [numbers, setting, figure](docs/claims.md#dg-1) |"
            in text)
    # rows of different regenerations say each its own
    writer.write_readme([rec, {**rec, "id": "DG-2", "measured": "2026-11-25", "commit": "def456"}])
    text = readme.read_text()
    assert "Measured 2026" not in text
    assert "[numbers, setting, figure](docs/claims.md#dg-2) (2026-11-25 at def456) |" in text


def test_a_pool_goes_by_the_last_regenerations_times_and_keeps_its_own(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pool is ordered by the real seconds docs/claims/times.json kept from the
    last regeneration (a point's budget only bounds a run that ends by its rounds),
    and each pool writes its own runs' seconds there for the next."""
    times = tmp_path / "times.json"
    monkeypatch.setattr(writer, "TIMES", times)
    keys = [p.key for p in sw.load_sweep(REPRO / "dg1.sweep.toml").points()]
    times.write_text(json.dumps({"dg1": {keys[0]: 12.5,
                                         keys[1]: {"seconds": 30.0, "cores": 0.2}},
                                 "gone": {"x": 1.0}}))
    seen: dict[tuple[int, str], float] = {}
    packed: dict[tuple[int, str], float] = {}

    scales: list[float] = []
    own: dict[str, float] = {}

    def pool(pairs: Any, *, jobs: Any, report: Any, expected: Any, headroom: Any,
             loads: Any, max_scale: float) -> list[Any]:
        seen.update(expected)
        packed.update(loads)
        scales.append(max_scale)
        for spec, sdir in pairs:
            for pt in spec.points():
                run = Path(sdir) / "runs" / pt.key
                run.mkdir(parents=True)
                (run / "summary.json").write_text(json.dumps({"real_seconds": 7.0,
                                                              "emulated_seconds": 2.0}))
                # every point ran at twice its own dilation, at 0.1 cores
                own[pt.key] = (10.0 if "delay=0.001" in pt.key else
                               1.0 if "delay=0.1" in pt.key else 0.5)
                (run / "point.json").write_text(json.dumps({"cores": 0.1,
                                                            "dilation": 2 * own[pt.key]}))
        return []

    monkeypatch.setattr(writer.sw, "run_sweeps", pool)
    dg1 = next(c for c in claims.CLAIMS if c.id == "DG-1")
    writer.run_together([dg1], tmp_path / "out", "auto", max_scale=1.0)
    assert scales == [1.0]
    assert seen == {(0, keys[0]): 12.5, (0, keys[1]): 30.0}
    assert packed == {(0, keys[1]): 0.2}
    kept = json.loads(times.read_text())
    # at each point's own dilation: twice the cores it used at twice it, and its real
    # seconds less the emulated ones' extra dilation (at least half of them)
    assert kept["dg1"] == {k: {"seconds": max(7.0 - 2.0 * own[k], 3.5), "cores": 0.2}
                           for k in keys}
    assert {v["seconds"] for v in kept["dg1"].values()} == {3.5, 5.0, 6.0}
    assert kept["gone"] == {"x": {"seconds": 1.0}}     # other sweeps' times are kept
    times.write_text("not json")
    assert writer.read_times() == {}


def test_the_table_runs_each_papers_sweeps_in_a_pool_of_their_own_longest_paper_first(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With --by-paper each paper's sweeps go in one pool, the paper whose claims took
    longest last time first; each paper's claims are evaluated and recorded as soon
    as its pool ends (an interrupted regeneration keeps them), and every record gets
    the whole table's time. ``--one-pool`` runs every sweep in one pool."""
    state = tmp_path / "claims.json"
    old = [{"id": c.id, "verdict": "partly", "real_seconds": 60.0 * (10 if "AF" in c.id else 1)}
           for c in claims.CLAIMS]
    state.write_text(json.dumps(old))
    monkeypatch.setattr(claims, "STATE", state)
    pools: list[list[str]] = []
    events: list[str] = []
    written: list[list[dict[str, Any]]] = []

    def run_together(cs: Any, out: Any, jobs: Any, hints: Any, headroom: Any,
                     max_scale: Any) -> tuple[float, bool]:
        pools.append([c.id for c in cs])
        events.append("pool")
        return 1.0, False

    def run_claim(c: Any, out: Any, jobs: Any, execute: bool) -> dict[str, Any]:
        assert not execute                 # the pool ran them
        events.append(c.id)
        return {"id": c.id, "number": "n", "verdict": "reproduced", "real_seconds": 1.0}

    monkeypatch.setattr(claims, "run_together", run_together)
    monkeypatch.setattr(claims, "run_claim", run_claim)
    monkeypatch.setattr(claims, "write_docs", lambda records: written.append(records))
    monkeypatch.setattr(claims, "write_readme", lambda records: None)
    assert claims.main(["--only", "FA-1,AF-2,AF-1,FA-2,DG-1", "--by-paper",
                        "--out", str(tmp_path)]) == 0
    assert pools == [["AF-1", "AF-2"], ["FA-1", "FA-2"], ["DG-1"]]
    assert events == ["pool", "AF-1", "AF-2", "pool", "FA-1", "FA-2", "pool", "DG-1"]
    # AF-1 and AF-2 were recorded before FedAsync's pool ran
    assert [r["verdict"] for r in written[1] if r["id"] in ("AF-1", "AF-2", "FA-1")] == [
        "partly", "reproduced", "reproduced"]
    final = {r["id"]: r for r in json.loads(state.read_text())}
    assert final["FA-1"]["table_pools"] == final["DG-1"]["table_pools"] == "by paper"
    assert final["AF-1"]["table_seconds"] == final["DG-1"]["table_seconds"] >= 0.0
    assert "table_seconds" not in final["DS-1"]        # not regenerated
    pools.clear()
    assert claims.main(["--only", "FA-1,AF-1", "--one-pool", "--out", str(tmp_path)]) == 0
    assert pools == [["FA-1", "AF-1"]]
    assert json.loads(state.read_text())[0]["table_pools"] == "one"
    # the default: claim by claim, each sweep run by run_claim, no pool
    pools.clear()
    ran: list[bool] = []
    monkeypatch.setattr(claims, "run_claim", lambda c, out, jobs, execute: ran.append(execute)
                        or {"id": c.id, "number": "n", "verdict": "partly", "real_seconds": 1.0})
    assert claims.main(["--only", "FA-1,AF-1", "--out", str(tmp_path)]) == 0
    assert pools == []
    assert ran == [True, True]
