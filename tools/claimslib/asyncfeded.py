"""The AsyncFedED claims (Wang et al., arXiv:2205.13797): AF-1 and AF-1a, accuracy holds
as clients are suspended more often while FedAsync's degrades; AF-2, adaptive K converges
faster and more smoothly than a constant K."""

from __future__ import annotations

import math
from collections.abc import Sequence

from claimslib.charts import Chart, Panel
from claimslib.runs import (
    accuracy_drops,
    events,
    grid_or_setting,
    group,
    mean_accuracy,
    num,
    per_seed,
    read_json,
    setting,
    spearman,
    time_to_fraction,
    values,
    variant_label,
)
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

# AF-1 and AF-1a -----------------------------------------------------------------

def _asyncfeded_or_fedasync(sweep: sw.Sweep, p: sw.Point) -> str | None:
    name = setting(sweep, p, "algorithm.name")
    return str(name) if name in ("asyncfeded", "fedasync") else None


def _discard_reason(runs: Sequence[sw.PointResult], p: float) -> str | None:
    """What FedAsync's runs measured at suspension ``p`` (None if nothing was)."""
    stale = mean_ci(values(runs, "staleness_mean").values())[0]
    upd = mean_ci(values(runs, "updates").values())[0]
    if stale is None or upd is None:
        return None
    return (f"at P = {p:g} FedAsync applied {upd:,.0f} updates of mean staleness {stale:.1f} "
            f"(a suspended run's update is discarded, as in the authors' logs); the authors' "
            f"FedAsync code is not public")


#: AF-1's and AF-2's conditions: the paper's 300 s budget, and the shorter budget of the
#: earlier table (the ablation that changes only the budget).
PAPER_BUDGET = 300.0


def _budget_condition(sweep: sw.Sweep, p: sw.Point) -> str | None:
    budget = num(setting(sweep, p, "run.time_budget"))
    if budget is None:
        return None
    if budget == PAPER_BUDGET:
        return f"the paper's {PAPER_BUDGET:g} s budget"
    return f"a {budget:g} s budget (budget {PAPER_BUDGET:g} -> {budget:g} s)"


def _budgets(sweep: sw.Sweep, results: Sequence[sw.PointResult]) -> list[str]:
    """The budget conditions of a sweep: the paper's first, then the others."""
    names = {c for r in results if (c := _budget_condition(sweep, r.point)) is not None}
    paper = f"the paper's {PAPER_BUDGET:g} s budget"
    return [paper, *sorted(names - {paper})]


def eval_af1(sweep: sw.Sweep, results: list[sw.PointResult]) -> Finding:
    """AF-1 in the paper's budget and in the shorter one (:func:`_eval_af1`)."""
    return under_conditions(sweep, results, lambda p: _budget_condition(sweep, p), _eval_af1,
                            _budgets(sweep, results))


#: AF-1a's conditions: the authors' logged pass times, and AF-1's 4x slower devices
#: (the ablation that changes only the device speed), at P = 0.9 in 300 s.
AUTHORS_SPEED = "the authors' pass times (5 ms a local step)"
SLOWER = "AF-1's devices (20 ms a local step: pass times x 4)"


def _af1a_condition(sweep: sw.Sweep, p: sw.Point) -> str | None:
    if num(grid_or_setting(sweep, p, "availability.p")) != 0.9:
        return None
    if num(setting(sweep, p, "run.time_budget")) != PAPER_BUDGET:
        return None
    step = num(setting(sweep, p, "devices.step_time"))
    return AUTHORS_SPEED if step == 0.005 else SLOWER if step == 0.02 else None


def eval_af1_authors(sweep: sw.Sweep, results: list[sw.PointResult]) -> Finding:
    """AF-1a at the authors' pass times and at AF-1's slower devices, P = 0.9, 300 s
    (:func:`_eval_af1_authors`)."""
    return under_conditions(sweep, results, lambda p: _af1a_condition(sweep, p),
                            _eval_af1_authors, [AUTHORS_SPEED, SLOWER])


def eval_af2(sweep: sw.Sweep, results: list[sw.PointResult]) -> Finding:
    """AF-2 in the paper's budget and in the shorter one (:func:`_eval_af2`)."""
    return under_conditions(sweep, results, lambda p: _budget_condition(sweep, p), _eval_af2,
                            _budgets(sweep, results))


def _eval_af1(sweep: sw.Sweep, results: list[sw.PointResult]) -> Finding:
    """AsyncFedED's accuracy holds as clients are suspended more often; FedAsync's degrades.

    Max accuracy = best test accuracy within the budget (Fig. 3, left); time
    to 90 % of each run's own maximum (Fig. 3, right) is reported beside it.
    Checks: AsyncFedED's max accuracy falls by under 5 points from the
    smallest P to the largest (per seed); FedAsync's fall minus AsyncFedED's
    above 0; AsyncFedED above FedAsync at the largest P.
    """
    def key(p: sw.Point) -> tuple[str, float] | None:
        m = _asyncfeded_or_fedasync(sweep, p)
        prob = num(grid_or_setting(sweep, p, "availability.p"))
        return None if m is None or prob is None else (m, prob)

    runs = group(results, key)
    ps = sorted({k[1] for k in runs})
    if len(ps) < 2 or not all((m, q) in runs for m in ("asyncfeded", "fedasync") for q in ps):
        return missing("AsyncFedED and FedAsync variants at two or more availability.p")
    best = {k: values(rs, "best_accuracy") for k, rs in runs.items()}
    t90 = {k: per_seed(rs, time_to_fraction) for k, rs in runs.items()}
    lo, hi = ps[0], ps[-1]
    drop = {m: {s: best[(m, lo)][s] - best[(m, hi)][s]
                for s in set(best[(m, lo)]) & set(best[(m, hi)])}
            for m in ("asyncfeded", "fedasync")}
    checks = [Check(f"AsyncFedED's max accuracy within 5 points from P = {lo:g} to {hi:g}",
                    side(drop["asyncfeded"].values(), 0.05, below=True)),
              Check("FedAsync loses more of it than AsyncFedED",
                    side(diffs(drop["fedasync"], drop["asyncfeded"]), 0.0)),
              Check(f"AsyncFedED above FedAsync at P = {hi:g}",
                    side(diffs(best[("asyncfeded", hi)], best[("fedasync", hi)]), 0.0))]
    verdict, summary = judge(checks)
    upd = {m: mean_ci(values(runs[(m, hi)], "updates").values())[0]
           for m in ("asyncfeded", "fedasync")}
    stale = mean_ci(values(runs[("fedasync", hi)], "staleness_mean").values())[0]
    reason = None if None in upd.values() else (
        f"at P = {hi:g} AsyncFedED applied {upd['asyncfeded']:,.0f} updates, FedAsync "
        f"{upd['fedasync']:,.0f}" + ("" if stale is None
                                     else f" of mean staleness {stale:.1f}"))
    name = {m: variant_label(runs[(m, lo)]) for m in ("asyncfeded", "fedasync")}

    def span(m: str) -> str:
        return (f"{short_mean(best[(m, lo)].values(), scale=100)} -> "
                f"{short_mean(best[(m, hi)].values(), scale=100)} %")

    number = (f"max accuracy from P = {lo:g} to {hi:g}: AsyncFedED {span('asyncfeded')}, "
              f"FedAsync {span('fedasync')}; AsyncFedED minus FedAsync at P = {hi:g}: "
              f"{pts(diffs(best[('asyncfeded', hi)], best[('fedasync', hi)]))}")
    rows = [[f"{q:g}", pct(best[("asyncfeded", q)].values()),
             pct(best[("fedasync", q)].values()),
             fmts(t90[("asyncfeded", q)].values(), ".1f", " s"),
             fmts(t90[("fedasync", q)].values(), ".1f", " s"),
             short_mean(values(runs[("fedasync", q)], "staleness_mean").values())] for q in ps]
    chart = Chart("AF-1: robustness to suspension (mean, 95 % CI over seeds)",
                  [Panel("max test accuracy within the budget (%)",
                         {name[m]: [(q, *scaled(best[(m, q)].values(), 100)) for q in ps]
                          for m in name}, kind="lines", xlabel="suspension probability P"),
                   Panel("emulated s to 90 % of the run's max",
                         {name[m]: [(q, *mean_ci(t90[(m, q)].values())) for q in ps]
                          for m in name}, kind="lines", xlabel="suspension probability P",
                         bounds=NON_NEGATIVE)])
    return Finding(number, verdict, explain(verdict, summary, reason),
                   md_table(["P", f"{name['asyncfeded']} max accuracy",
                             f"{name['fedasync']} max accuracy", "AsyncFedED to 90 %",
                             "FedAsync to 90 %", "FedAsync staleness (mean)"], rows), chart)


def _eval_af1_authors(sweep: sw.Sweep, results: list[sw.PointResult]) -> Finding:
    """AF-1 at P = 0.9 as the authors ran it: FedAsync+Const collapses, AsyncFedED does not.

    Checks: FedAsync's max accuracy below 60 % (the authors' logs: 34.7 %);
    AsyncFedED's minus FedAsync's above 20 points (per seed; the logs: 63.5).
    """
    runs = group(results, lambda p: _asyncfeded_or_fedasync(sweep, p))
    if "asyncfeded" not in runs or "fedasync" not in runs:
        return missing("AsyncFedED and FedAsync variants")
    best = {m: values(rs, "best_accuracy") for m, rs in runs.items()}
    t90 = {m: per_seed(rs, time_to_fraction) for m, rs in runs.items()}
    gap = diffs(best["asyncfeded"], best["fedasync"])
    checks = [Check("FedAsync+Const collapses (max accuracy below 60 %)",
                    side(best["fedasync"].values(), 0.6, below=True)),
              Check("AsyncFedED above it by over 20 points", side(gap, 0.2))]
    verdict, summary = judge(checks)
    prob = num(grid_or_setting(sweep, runs["fedasync"][0].point, "availability.p")) or 0.0
    reason = _discard_reason(runs["fedasync"], prob)
    number = (f"max accuracy at P = {prob:g}: AsyncFedED {pct(best['asyncfeded'].values())}, "
              f"FedAsync+Const {pct(best['fedasync'].values())}")
    rows = [[variant_label(runs[m]), pct(best[m].values()),
             pct(values(runs[m], "final_accuracy").values()),
             fmts(t90[m].values(), ".1f", " s"),
             short_mean(values(runs[m], "updates").values(), ",.0f"),
             short_mean(values(runs[m], "staleness_mean").values())]
            for m in ("asyncfeded", "fedasync")]
    chart = Chart(f"AF-1 as the authors ran it, P = {prob:g} (mean, 95 % CI over seeds)",
                  [Panel("max test accuracy within the budget (%)",
                         {"": [(variant_label(runs[m]), *scaled(best[m].values(), 100))
                               for m in ("asyncfeded", "fedasync")]}),
                   Panel("emulated s to 90 % of the run's max",
                         {"": [(variant_label(runs[m]), *mean_ci(t90[m].values()))
                               for m in ("asyncfeded", "fedasync")]}, bounds=NON_NEGATIVE)])
    return Finding(number, verdict, explain(verdict, summary, reason),
                   md_table(["variant", "max accuracy", "final accuracy", "to 90 % of max",
                             "updates applied", "staleness (mean)"], rows), chart)


# AF-2 ---------------------------------------------------------------------------

def _k_and_gamma(r: sw.PointResult, gamma_bar: float) -> tuple[dict[int, float], float | None]:
    """Each client's last K (aggregate ``k_next``), and the median |gamma - gamma_bar| over
    the second half of the run's aggregations."""
    last_k: dict[int, float] = {}
    gammas: list[float] = []
    for e in events(r, "aggregate"):
        cl, k, g = e.get("clients"), e.get("k_next"), e.get("gamma")
        if isinstance(cl, list) and len(cl) == 1 and isinstance(k, (int, float)):
            last_k[int(cl[0])] = float(k)
        if isinstance(g, (int, float)) and math.isfinite(g):
            gammas.append(abs(g - gamma_bar))
    late = sorted(gammas[len(gammas) // 2:])
    med = None if not late else (late[(len(late) - 1) // 2] + late[len(late) // 2]) / 2
    return last_k, med


def _pass_times(r: sw.PointResult, batch: int) -> dict[int, float]:
    """Each client's emulated time per pass over its data: ceil(n_i / batch) x its step time."""
    data, het = read_json(r.run_dir / "data.json"), read_json(r.run_dir / "heterogeneity.json")
    if not isinstance(data, dict) or not isinstance(het, dict):
        return {}
    sizes = [c.get("num_samples") for c in data.get("clients", [])]
    out = {}
    for c in het.get("clients", []):
        i, st = c.get("client"), c.get("step_time")
        if isinstance(i, int) and 0 <= i < len(sizes) and isinstance(sizes[i], int) \
                and isinstance(st, (int, float)):
            out[i] = math.ceil(sizes[i] / batch) * float(st)
    return out


def _eval_af2(sweep: sw.Sweep, results: list[sw.PointResult]) -> Finding:
    """AsyncFedED's adaptive K converges faster and more smoothly than a constant K,
    steering staleness toward gamma_bar and giving fast clients more local work.

    Adaptive K is ``algorithm.kappa > 0``; a constant K has kappa = 0 and K =
    ``k_initial``. Faster: test accuracy averaged over the run's time; smoother:
    fewer drops of over 2 points between evaluations. Checks: adaptive ahead
    of every constant K in averaged accuracy (per seed); fewer drops than the
    constant K with the fewest; median |gamma - gamma_bar| over the second
    half smaller than with the constant K nearest its initial K; the rank
    correlation of a client's time per pass with its final K below 0.
    """
    def key(p: sw.Point) -> tuple[str, float] | None:
        kappa = num(setting(sweep, p, "algorithm.kappa"))
        k0 = num(setting(sweep, p, "algorithm.k_initial"))
        if kappa is None or k0 is None:
            return None
        return ("adaptive", k0) if kappa > 0 else ("constant", k0)

    runs = group(results, key)
    adaptive = next((k for k in runs if k[0] == "adaptive"), None)
    consts = sorted((k for k in runs if k[0] == "constant"), key=lambda k: k[1])
    if adaptive is None or not consts:
        return missing("adaptive K (kappa > 0) and constant K (kappa = 0) variants")
    any_point = runs[adaptive][0].point
    gamma_bar = num(setting(sweep, any_point, "algorithm.gamma_bar")) or 3.0
    batch = int(num(setting(sweep, any_point, "client.batch_size")) or 32)
    acc = {k: per_seed(rs, mean_accuracy) for k, rs in runs.items()}
    drops = {k: per_seed(rs, accuracy_drops) for k, rs in runs.items()}
    trace = {r.run_dir: _k_and_gamma(r, gamma_bar) for rs in runs.values() for r in rs
             if r.counts}
    dev = {k: per_seed(rs, lambda r: trace[r.run_dir][1]) for k, rs in runs.items()}
    final_k = {r.point.seed: trace[r.run_dir][0] for r in runs[adaptive] if r.counts}

    def rho(r: sw.PointResult) -> float | None:
        pt, k = _pass_times(r, batch), final_k.get(r.point.seed, {})
        both = sorted(set(pt) & set(k))
        return spearman([pt[c] for c in both], [k[c] for c in both])

    rhos = per_seed(runs[adaptive], rho)
    steadiest = min(consts, key=lambda k: mean_ci(drops[k].values())[0] or math.inf)
    nearest = min(consts, key=lambda k: abs(k[1] - adaptive[1]))
    checks = [Check(f"adaptive K ahead of K = {k[1]:g} in accuracy over time",
                    side(diffs(acc[adaptive], acc[k]), 0.0)) for k in consts]
    checks += [Check(f"fewer accuracy drops than K = {steadiest[1]:g} (the steadiest constant)",
                     side(diffs(drops[steadiest], drops[adaptive]), 0.0)),
               Check(f"gamma nearer gamma_bar = {gamma_bar:g} than with K = {nearest[1]:g}",
                     side(diffs(dev[nearest], dev[adaptive]), 0.0)),
               Check("faster clients end with larger K", side(rhos.values(), 0.0, below=True))]
    verdict, summary = judge(checks)
    ks = [k for per in final_k.values() for k in per.values()]
    budget = num(setting(sweep, any_point, "run.time_budget"))
    reason = None if not ks or budget is None else (
        f"in {budget:g} emulated s K went from {adaptive[1]:g} to between {min(ks):.1f} and "
        f"{max(ks):.1f}")
    number = (f"accuracy averaged over the run: adaptive {pct(acc[adaptive].values())}; "
              + ", ".join(f"K = {k[1]:g} {short_mean(acc[k].values(), scale=100)} %"
                          for k in consts)
              + f"; rank correlation of a client's time per pass with its final K "
                f"{fmts(rhos.values())}")
    order = [adaptive, *consts]
    rows = [[variant_label(runs[k]), pct(acc[k].values()),
             pct(values(runs[k], "best_accuracy").values()),
             fmts(drops[k].values(), ".1f", bounds=NON_NEGATIVE),
             fmts(dev[k].values(), ".2f", bounds=NON_NEGATIVE)]
            for k in order]
    chart = Chart("AF-2: adaptive K against constant K (mean, 95 % CI over seeds)",
                  [Panel("test accuracy averaged over the run (%)",
                         {"": [(variant_label(runs[k]), *scaled(acc[k].values(), 100))
                               for k in order]}),
                   Panel("accuracy drops of over 2 points",
                         {"": [(variant_label(runs[k]), *mean_ci(drops[k].values()))
                               for k in order]}, bounds=NON_NEGATIVE)])
    return Finding(number, verdict, explain(verdict, summary, reason),
                   md_table(["variant", "accuracy over time", "max accuracy", "drops > 2 points",
                             "median abs(gamma - gamma_bar), 2nd half"], rows), chart)
