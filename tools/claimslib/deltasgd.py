"""The Delta-SGD claims (Kim et al., ICLR 2024): DS-1, no step-size tuning needed;
DS-2, delta barely matters while each client's step size follows its own smoothness."""

from __future__ import annotations

import json
import math
from typing import Any

from claimslib.charts import Chart, Panel
from claimslib.runs import events, grid_or_setting, group, num, per_seed, setting, values
from claimslib.verdict import (
    NON_NEGATIVE,
    Check,
    Finding,
    diffs,
    explain,
    fmts,
    judge,
    md_table,
    mean_ci,
    missing,
    pct,
    pts,
    scaled,
    short_mean,
    side,
    under_conditions,
)
from fedsim import sweep as sw

# DS-1 ---------------------------------------------------------------------------

OPTIMIZERS = {"sgd": "SGD", "sgdm": "SGDM", "adam": "Adam", "deltasgd": "Delta-SGD"}


def eval_ds1(sweep: sw.Sweep, results: list[sw.PointResult]) -> Finding:
    """Delta-SGD needs no step-size tuning: across tasks its largest gap to the best
    optimizer is the smallest (Table 1's "gap to the best").

    A task is everything a variant sets outside ``client.*`` (dataset, model,
    partition); an optimizer is ``client.optimizer``. Per seed, an optimizer's
    gap on a task is the best final accuracy any optimizer reached there minus
    its own; its largest gap is the maximum over the tasks. Checks, one per
    other optimizer: its largest gap minus Delta-SGD's above 0 (paired by seed).
    """
    def task(p: sw.Point) -> str:
        keys = [f"{k}={json.dumps(v, sort_keys=True)}" for k, v in p.overrides
                if not k.startswith("client.") and k != "seed"]
        return "; ".join(sorted(keys))

    def key(p: sw.Point) -> tuple[str, str] | None:
        opt = setting(sweep, p, "client.optimizer")
        return None if opt is None else (task(p), str(opt))

    runs = group(results, key)
    tasks = list(dict.fromkeys(k[0] for k in runs))
    opts = list(dict.fromkeys(k[1] for k in runs))
    if "deltasgd" not in opts or len(opts) < 2:
        return missing("Delta-SGD variant beside other optimizers")
    names: dict[str, str] = {}
    for (t, _), rs in runs.items():
        p = rs[0].point
        names.setdefault(t, f"{setting(sweep, p, 'data.dataset')} "
                            f"{setting(sweep, p, 'model.name')}")
    acc = {k: values(rs, "final_accuracy") for k, rs in runs.items()}
    gap: dict[tuple[str, str], dict[int, float]] = {}
    for t in tasks:
        seeds: set[int] = set()
        for o in opts:
            seeds |= set(acc.get((t, o), {}))
        for s in sorted(seeds):
            got = {o: acc[(t, o)][s] for o in opts if s in acc.get((t, o), {})}
            for o, a in got.items():
                gap.setdefault((t, o), {})[s] = max(got.values()) - a
    worst: dict[str, dict[int, float]] = {}
    for o in opts:
        seeds = set.intersection(*(set(gap.get((t, o), {})) for t in tasks))
        worst[o] = {s: max(gap[(t, o)][s] for t in tasks) for s in seeds}
    checks = [Check(f"Delta-SGD's largest gap smaller than {OPTIMIZERS.get(o, o)}'s",
                    side(diffs(worst[o], worst["deltasgd"]), 0.0) if worst[o] else None)
              for o in opts if o != "deltasgd"]
    verdict, summary = judge(checks)
    own = {t: mean_ci(gap.get((t, "deltasgd"), {}).values())[0] or 0.0 for t in tasks}
    bad = max(tasks, key=lambda t: own[t])
    reason = (f"Delta-SGD's own largest mean gap was {100 * own[bad]:.1f} points, on "
              f"{names[bad]}")
    ours = pts(worst["deltasgd"].values(), NON_NEGATIVE)
    number = (f"largest gap to the best: Delta-SGD {ours}; "
              + ", ".join(f"{OPTIMIZERS.get(o, o)} {short_mean(worst[o].values(), scale=100)}"
                          for o in opts if o != "deltasgd") + " points")
    rows = []
    for o in opts:
        cells = [f"{short_mean(acc.get((t, o), {}).values(), scale=100)} % "
                 f"({short_mean(gap.get((t, o), {}).values(), scale=100)})" for t in tasks]
        rows.append([OPTIMIZERS.get(o, o), *cells, pts(worst[o].values(), NON_NEGATIVE)])
    chart = Chart("DS-1: step sizes tuned on task 1 only, Delta-SGD untuned (mean, 95 % CI)",
                  [Panel("final test accuracy (%)",
                         {OPTIMIZERS.get(o, o): [(names[t], *scaled(acc.get((t, o), {}).values(),
                                                                    100)) for t in tasks]
                          for o in opts}),
                   Panel("largest gap to the best over the tasks (points)",
                         {"": [(OPTIMIZERS.get(o, o), *scaled(worst[o].values(), 100))
                               for o in opts]}, bounds=NON_NEGATIVE)])
    return Finding(number, verdict, explain(verdict, summary, reason),
                   md_table(["optimizer", *(f"{names[t]} accuracy (gap)" for t in tasks),
                             "largest gap"], rows), chart)


# DS-2 ---------------------------------------------------------------------------

def client_step_spread(r: sw.PointResult) -> float | None:
    """Largest over smallest of the clients' mean step sizes (train_end lr_mean) in a run."""
    per: dict[Any, list[float]] = {}
    for e in events(r, "train_end"):
        lr = e.get("lr_mean")
        if isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0:
            per.setdefault(e.get("client"), []).append(float(lr))
    means = [sum(v) / len(v) for v in per.values()]
    return max(means) / min(means) if len(means) >= 2 else None


def diverged_keys(acc: dict[float, dict[int, float]]) -> set[tuple[float, int]]:
    """(delta, seed) of runs that ended below half the seed's best final accuracy over delta."""
    seeds = set.intersection(*(set(a) for a in acc.values()))
    return {(d, s) for d in acc for s in seeds if acc[d][s] < 0.5 * max(a[s] for a in acc.values())}


def _spread_without(acc: dict[float, dict[int, float]], out: set[tuple[float, int]]) -> float:
    """The largest per-seed spread of final accuracy over delta, leaving ``out``'s runs out."""
    seeds = set.intersection(*(set(a) for a in acc.values()))
    spreads = []
    for s in seeds:
        xs = [acc[d][s] for d in acc if (d, s) not in out]
        if len(xs) >= 2:
            spreads.append(max(xs) - min(xs))
    return max(spreads, default=0.0)


#: DS-2's conditions: the paper's client sizes (500 samples each), and the
#: generator's lognormal sizes (the ablation that changes only the client sizes).
PAPER_SIZES = "the paper's client sizes (500 samples each)"
LOGNORMAL = "the generator's lognormal client sizes (client sizes: 500 each -> lognormal)"


def _sizes(sweep: sw.Sweep, p: sw.Point) -> str | None:
    return PAPER_SIZES if setting(sweep, p, "data.synthetic_sizes") == 500 else LOGNORMAL


def eval_ds2(sweep: sw.Sweep, results: list[sw.PointResult]) -> Finding:
    """DS-2 at the paper's client sizes and at the natural ones (:func:`_eval_ds2`)."""
    return under_conditions(sweep, results, lambda p: _sizes(sweep, p), _eval_ds2,
                            [PAPER_SIZES, LOGNORMAL])


def _eval_ds2(sweep: sw.Sweep, results: list[sw.PointResult]) -> Finding:
    """Delta-SGD's delta barely matters, while each client's step size follows its own
    local smoothness.

    Checks: the spread (max - min over delta, per seed) of the final accuracy
    below 2 points; the clients' mean step sizes (train_end ``lr_mean``) differ,
    largest over smallest above 1.2 (over every faithful run).
    """
    def key(p: sw.Point) -> float | None:
        return num(grid_or_setting(sweep, p, "client.delta"))

    runs = group(results, key)
    deltas = sorted(runs)
    if len(deltas) < 2:
        return missing("two or more values of client.delta")
    acc = {d: values(runs[d], "final_accuracy") for d in deltas}
    seeds = set.intersection(*(set(a) for a in acc.values()))
    spread = [max(acc[d][s] for d in deltas) - min(acc[d][s] for d in deltas)
              for s in sorted(seeds)]
    steps = {d: per_seed(runs[d], client_step_spread) for d in deltas}
    all_steps = [v for d in deltas for v in steps[d].values()]
    checks = [Check("final accuracy moves by under 2 points over delta",
                    side(spread, 0.02, below=True)),
              Check("clients' step sizes differ (largest client's mean over the smallest's "
                    "above 1.2)", side(all_steps, 1.2))]
    verdict, summary = judge(checks)
    best = {d: values(runs[d], "best_accuracy") for d in deltas}
    out = diverged_keys(acc)
    if out:
        reason = ("runs diverged: " + "; ".join(
            f"delta = {d:g}, seed {s} (final {100 * acc[d][s]:.1f} %, best "
            f"{100 * best[d].get(s, math.nan):.1f} %)" for d, s in sorted(out))
            + f"; over the other runs the final accuracy moved by at most "
            f"{100 * _spread_without(acc, out):.1f} points")
    else:
        reason = None
    number = (f"spread of final accuracy over delta {pts(spread, NON_NEGATIVE)}; clients' mean "
              f"step sizes differ {fmts(all_steps, '.1f', 'x')} (largest / smallest)")
    rows = [[f"{d:g}", pct(acc[d].values()), fmts(steps[d].values(), ".2f", "x"),
             str(len(acc[d]))] for d in deltas]
    chart = Chart("DS-2: Delta-SGD's delta (mean, 95 % CI over seeds)",
                  [Panel("final test accuracy (%)",
                         {"Delta-SGD": [(d, *scaled(acc[d].values(), 100)) for d in deltas]},
                         kind="lines", xlabel="delta", logx=True, min_span=8.0),
                   Panel("clients' mean step size, largest / smallest",
                         {"Delta-SGD": [(d, *mean_ci(steps[d].values())) for d in deltas]},
                         kind="lines", xlabel="delta", logx=True, logy=True,
                         bounds=NON_NEGATIVE)])
    return Finding(number, verdict, explain(verdict, summary, reason),
                   md_table(["delta", "final accuracy", "client step sizes (largest / smallest)",
                             "seeds"], rows), chart)
