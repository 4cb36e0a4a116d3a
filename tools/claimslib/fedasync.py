"""The FedAsync claims (Xie, Koyejo and Gupta, arXiv:1903.03934): FA-1, an adaptive
mixing weight is more stable than a constant one; FA-2, per gradient applied FedAsync
converges between single-thread SGD and FedAvg."""

from __future__ import annotations

import math
from typing import Any

from claimslib.charts import Chart, Panel
from claimslib.runs import (
    base_scenario,
    group,
    late_loss_mean,
    late_loss_std,
    num,
    per_seed,
    point_label,
    setting,
    updates_to_target,
    values,
    variant_label,
)
from claimslib.verdict import (
    NON_NEGATIVE,
    NOT_SEEN,
    SHOWN,
    WITHIN_NOISE,
    Check,
    Finding,
    explain,
    fmt,
    fmts,
    judge,
    md_table,
    mean_ci,
    missing,
    paired,
    short_mean,
    side,
)
from fedsim import sweep as sw

# FA-1 ---------------------------------------------------------------------------

def eval_fa1(sweep: sw.Sweep, results: list[sw.PointResult]) -> Finding:
    """FedAsync: an adaptive mixing weight (Poly, Hinge) is more stable than a constant one
    at high staleness, most of all with a large alpha.

    Instability is the standard deviation of the test loss over the second
    half of a run's evaluations (infinite if the run diverged). Variants are
    told apart by their settings (``algorithm.staleness``, ``alpha``,
    ``concurrency``), not their labels. Checks, at the largest concurrency and
    its largest alpha: Const's instability over Poly's above 1 and over Hinge's
    above 1 (per-seed ratios); and Const there the least stable of every
    setting (by the means).
    """
    def key(p: sw.Point) -> tuple[str, float, int] | None:
        st = setting(sweep, p, "algorithm.staleness")
        a = num(setting(sweep, p, "algorithm.alpha"))
        c = num(setting(sweep, p, "algorithm.concurrency"))
        return None if st is None or a is None or c is None else (str(st), a, int(c))

    runs = group(results, key)
    if not runs:
        return missing("FedAsync variants (algorithm.staleness, alpha, concurrency)")
    c_hi = max(k[2] for k in runs)
    a_hi = max(k[1] for k in runs if k[2] == c_hi)
    const, poly, hinge = (("const", a_hi, c_hi), ("poly", a_hi, c_hi), ("hinge", a_hi, c_hi))
    if const not in runs or (poly not in runs and hinge not in runs):
        return missing(f"Const and Poly or Hinge variants at alpha = {a_hi:g}, c = {c_hi}")
    std = {k: per_seed(v, late_loss_std) for k, v in runs.items()}
    where = f"c = {c_hi}, alpha = {a_hi:g}"
    ratios = {name: paired(std[const], std.get(k, {})) for name, k in (("Poly", poly),
                                                                        ("Hinge", hinge))}
    level = {k: (math.inf if any(math.isinf(x) for x in v.values())
                 else mean_ci(v.values())[0]) for k, v in std.items() if v}
    noisiest = max(level, key=lambda k: level[k] or 0.0) if level else None
    checks = [Check(f"Const less stable than {name} at {where}", side(ratios[name], 1.0))
              for name, k in (("Poly", poly), ("Hinge", hinge)) if k in runs]
    checks.append(Check(f"Const at {where} the least stable of all {len(runs)} settings",
                        None if noisiest is None else SHOWN if noisiest == const else NOT_SEEN))
    verdict, summary = judge(checks)
    stale = mean_ci(values(runs[const], "staleness_mean").values())[0]
    reason = None if stale is None else (
        f"with {c_hi} tasks in flight the staleness that occurred averaged {stale:.1f} (the "
        f"paper draws it uniformly up to {c_hi - 1})")
    diverged = sum(math.isinf(v) for v in std[const].values())
    number = "; ".join(f"Const/{name} late-loss std {fmts(ratios[name], unit='x')}"
                       for name, k in (("Poly", poly), ("Hinge", hinge)) if k in runs)
    number += f" at {where}" + (f" (Const diverged on {diverged} seeds)" if diverged else "")
    rows = []
    bars: dict[str, list[tuple[Any, float | None, float | None]]] = {}
    bars_loss: dict[str, list[tuple[Any, float | None, float | None]]] = {}
    for k, rs in sorted(runs.items(), key=lambda kv: kv[0][2]):
        s, lm = std[k], per_seed(rs, late_loss_mean)
        div = sum(math.isinf(v) for v in s.values())
        note = f" ({div} diverged)" if div else ""
        rows.append([point_label(rs) + note,
                     fmts(s.values(), ".3f", bounds=NON_NEGATIVE),
                     fmts(lm.values(), ".3f", bounds=NON_NEGATIVE),
                     short_mean(values(rs, "staleness_mean").values()), str(len(s))])
        bars.setdefault(f"c = {k[2]}", []).append((variant_label(rs) + note, *mean_ci(s.values())))
        bars_loss.setdefault(f"c = {k[2]}", []).append((variant_label(rs) + note,
                                                        *mean_ci(lm.values())))
    chart = Chart("FA-1: test-loss instability over each run's second half, by tasks in "
                  "flight c (mean, 95 % CI)",
                  [Panel("std of the test loss", bars, bounds=NON_NEGATIVE),
                   Panel("mean test loss", bars_loss, bounds=NON_NEGATIVE)])
    return Finding(number, verdict, explain(verdict, summary, reason),
                   md_table(["variant", "late-loss std", "late-loss mean", "staleness (mean)",
                             "seeds"], rows), chart)


# FA-2 ---------------------------------------------------------------------------

def eval_fa2(sweep: sw.Sweep, results: list[sw.PointResult]) -> Finding:
    """FedAsync converges, per gradient applied, between single-thread SGD and FedAvg, and
    closer to FedAvg as its staleness grows.

    Gradients to the target = client updates applied at the first evaluation
    at or above it x the local steps per update (a run that never got there
    counts all its gradients, a lower bound marked >=). SGD is FedAsync with
    one task in flight; FedAvg is ``algorithm.name = "fedavg"``. Checks:
    FedAvg over SGD above 1 (per-seed ratios); every FedAsync concurrency
    between the two (its mean ratios on the expected sides: shown; a ratio's
    interval wholly outside: not seen); the largest concurrency over the
    smallest above 1.
    """
    target = sweep.target_accuracy or num(base_scenario(str(sweep.scenario)).get(
        "run", {}).get("target_accuracy"))
    if target is None:
        return missing("target accuracy (sweep.target_accuracy)")

    def key(p: sw.Point) -> tuple[str, int] | None:
        name = setting(sweep, p, "algorithm.name")
        if name == "fedavg":
            return ("FedAvg", 0)
        c = num(setting(sweep, p, "algorithm.concurrency"))
        if name != "fedasync" or c is None:
            return None
        return ("SGD", 1) if c == 1 else ("FedAsync", int(c))

    runs = group(results, key)
    cs = sorted(k[1] for k in runs if k[0] == "FedAsync")
    if ("SGD", 1) not in runs or ("FedAvg", 0) not in runs or not cs:
        return missing("SGD (one task in flight), FedAsync and FedAvg variants")
    grads: dict[tuple[str, int], dict[int, float]] = {}
    short: dict[tuple[str, int], int] = {}
    for k, rs in runs.items():
        grads[k], short[k] = {}, 0
        for r in rs:
            got = updates_to_target(r, target) if r.counts else None
            h = num(setting(sweep, r.point, "client.local_steps")) or 1.0
            if got is not None:
                grads[k][r.point.seed] = got[0] * h
                short[k] += not got[1]
    sgd, avg = grads[("SGD", 1)], grads[("FedAvg", 0)]
    checks = [Check("FedAvg needs more gradients than single-thread SGD",
                    side(paired(avg, sgd), 1.0))]
    for c in cs:
        lo, hi = paired(grads[("FedAsync", c)], sgd), paired(avg, grads[("FedAsync", c)])
        if not lo or not hi:
            state = None
        elif (side(lo, 1.0, below=True) == SHOWN or side(hi, 1.0, below=True) == SHOWN):
            state = NOT_SEEN
        else:
            state = SHOWN if (mean_ci(lo)[0] or 0) >= 1 and (mean_ci(hi)[0] or 0) >= 1 \
                else WITHIN_NOISE
        checks.append(Check(f"FedAsync c = {c} between SGD and FedAvg", state))
    if len(cs) > 1:
        checks.append(Check(f"FedAsync c = {cs[-1]} needs more gradients than c = {cs[0]}",
                            side(paired(grads[("FedAsync", cs[-1])],
                                        grads[("FedAsync", cs[0])]), 1.0)))
    verdict, summary = judge(checks)
    st = {c: mean_ci(values(runs[("FedAsync", c)], "staleness_mean").values())[0] for c in cs}
    reason = None
    if st[cs[0]] is not None and st[cs[-1]] is not None:
        reason = (f"the staleness that occurred averaged {st[cs[0]]:.1f} at c = {cs[0]} and "
                  f"{st[cs[-1]]:.1f} at c = {cs[-1]} (the paper draws it uniformly up to 4 "
                  f"or 16)")
    number = (f"gradients to {target:.0%} over SGD's: FedAvg "
              f"{fmts(paired(avg, sgd), unit='x')}; FedAsync c = "
              f"{', '.join(map(str, cs))}: "
              + ", ".join(f"{short_mean(paired(grads[('FedAsync', c)], sgd), '.2f')}x"
                          for c in cs))
    rows, bars = [], []
    order = [("SGD", 1), *(("FedAsync", c) for c in cs), ("FedAvg", 0)]
    for k in order:
        m, ci = mean_ci(grads[k].values())
        mark = ">= " if short[k] else ""
        rows.append([variant_label(runs[k]), mark + fmt(m, ci, ",.0f", bounds=NON_NEGATIVE),
                     f"{len(grads[k]) - short[k]} of {len(grads[k])}",
                     short_mean(values(runs[k], "staleness_mean").values())])
        bars.append((variant_label(runs[k]) + (" (>=)" if short[k] else ""), m, ci))
    chart = Chart(f"FA-2: gradients applied until {target:.0%} test accuracy (mean, 95 % CI)",
                  [Panel("gradients applied", {"": bars}, bounds=NON_NEGATIVE)])
    return Finding(number, verdict, explain(verdict, summary, reason),
                   md_table(["variant", "gradients to target", "reached it", "staleness (mean)"],
                            rows), chart)
