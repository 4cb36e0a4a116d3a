"""The verdict machinery: checks, paired confidence intervals, and the Finding.

How a verdict is reached. Each evaluator states the claim's expected
directions as :class:`Check` s, written before any result was seen and not
changed after: "Const's late test loss is noisier than Poly's", "the gap
widens with D". A check is *shown* when the 95 % confidence interval of its
quantity (per-seed differences or ratios, paired by seed where two variants
share seeds) lies on the expected side, *not seen* when the mean lies on the
other side (or on the line), and *within noise* when the mean is on the
expected side but the interval reaches across. :func:`judge` turns the checks
into the verdict: every check shown is **reproduced**; none shown and at
least one not seen is **not reproduced**; none shown and the rest within
noise (or nothing measured) is **inconclusive**; anything else is
**partly**. DG-1 keeps its own rule (its docstring).

The helpers below pair per-seed values (:func:`paired`, :func:`diffs`), give
their mean and 95 % interval (:func:`mean_ci`) and write them as the docs
show them (:func:`fmt`, :func:`pct`, :func:`pts`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from claimslib.charts import Chart, Panel
from fedsim import sweep as sw

REPRODUCED, PARTLY, NOT_REPRODUCED, INCONCLUSIVE = (
    "reproduced", "partly", "not reproduced", "inconclusive")
#: A check's outcome: its interval on the expected side, its mean on the other, or between.
SHOWN, WITHIN_NOISE, NOT_SEEN = 1, 0, -1


@dataclass
class Finding:
    """fedsim's number for a claim, and what it says about the claim."""

    number: str                  # e.g. "4.1x (95 % CI 3.8 to 4.4)"
    verdict: str                 # reproduced / partly / not reproduced / inconclusive
    why: str                     # one or two sentences
    details: list[str] = field(default_factory=list)   # table rows for docs/claims.md
    chart: Chart | None = None   # drawn to <sweep dir>/claim.png when given


@dataclass
class Check:
    """One expected direction of a claim and what the runs showed.

    ``state`` is SHOWN, WITHIN_NOISE or NOT_SEEN, or None when nothing could be
    measured (no faithful runs of a variant it needs).
    """

    expect: str
    state: int | None


def judge(checks: Sequence[Check]) -> tuple[str, str]:
    """The verdict from a claim's checks (the rule in the module docstring), and a summary."""
    groups: dict[int | None, list[str]] = {}
    for c in checks:
        groups.setdefault(c.state, []).append(c.expect)
    shown, against = len(groups.get(SHOWN, [])), len(groups.get(NOT_SEEN, []))
    measured = len(checks) - len(groups.get(None, []))
    if checks and shown == len(checks):
        verdict = REPRODUCED
    elif shown == 0 and against > 0:
        verdict = NOT_REPRODUCED
    elif shown == 0:
        verdict = INCONCLUSIVE
    else:
        verdict = PARTLY
    parts = [f"{name}: {'; '.join(groups[state])}"
             for state, name in ((SHOWN, "shown"), (NOT_SEEN, "not seen"),
                                 (WITHIN_NOISE, "undecided at this budget (the 95 % CI reaches "
                                                "both sides)"),
                                 (None, "not measured"))
             if groups.get(state)]
    if measured == 0:
        parts = ["no faithful runs to compare"]
    text = ". ".join(p[0].upper() + p[1:] for p in parts) + "."
    return verdict, text


def side(xs: Iterable[float], ref: float = 0.0, *, below: bool = False) -> int | None:
    """Where ``xs`` (per-seed values) lie against ``ref``: SHOWN, WITHIN_NOISE, NOT_SEEN.

    The expected side is above ``ref`` (below with ``below=True``). One value
    can show nothing (WITHIN_NOISE at best). An infinite value (a run that
    diverged, in a ratio) makes the interval meaningless: the signs decide,
    SHOWN only if every seed (two at least) lies on the expected side.
    """
    vals = [-x if below else x for x in xs if not math.isnan(x)]
    r = -ref if below else ref
    if not vals:
        return None
    if any(math.isinf(v) for v in vals):
        ahead = sum(v > r for v in vals)
        if ahead == len(vals) and len(vals) >= 2:
            return SHOWN
        return WITHIN_NOISE if 2 * ahead > len(vals) else NOT_SEEN
    m, ci = mean_ci(vals)
    assert m is not None
    if m <= r:
        return NOT_SEEN
    return SHOWN if ci is not None and m - ci > r else WITHIN_NOISE


# -- paired confidence intervals, and how numbers are written --------------------

def mean_ci(xs: Iterable[float]) -> tuple[float | None, float | None]:
    """Mean and 95 % half-width (Student's t)."""
    return sw.mean_ci(list(xs))


def paired(num: dict[int, float], den: dict[int, float]) -> list[float]:
    """Per-seed ratios num/den over the seeds both have (x/0 is infinite unless x is 0)."""
    out = []
    for s in sorted(set(num) & set(den)):
        if den[s]:
            out.append(num[s] / den[s])
        elif num[s]:
            out.append(math.copysign(math.inf, num[s]))
    return out


def diffs(a: dict[int, float], b: dict[int, float]) -> list[float]:
    """Per-seed differences a - b over the seeds both have."""
    return [a[s] - b[s] for s in sorted(set(a) & set(b))]


#: ``bounds`` of a figure that cannot be negative (a spread, a loss, a count, a time)
NON_NEGATIVE = (0.0, math.inf)


def fmt(m: float | None, ci: float | None, spec: str = ".2f", unit: str = "",
        bounds: tuple[float, float] = (-math.inf, math.inf)) -> str:
    """``m unit (95 % CI lo-hi)``, the interval cut to ``bounds`` (what the
    figure can be at all: a Student-t interval over 3 seeds of an accuracy
    can reach past 100 %). A ratio (unit ``x``) or a duration (`` s``) is
    never below 0."""
    if unit in ("x", " s"):
        bounds = (max(0.0, bounds[0]), bounds[1])
    if m is None:
        return "no faithful runs"
    if ci is None:
        return f"{m:{spec}}{unit} (1 seed)"
    lo, hi = max(bounds[0], m - ci), min(bounds[1], m + ci)
    if max(abs(m), abs(lo), abs(hi)) >= 1e6:  # e.g. a ratio to a step size near 0
        spec = ".2e"
    return f"{m:{spec}}{unit} (95 % CI {lo:{spec}} to {hi:{spec}})"


def fmts(xs: Iterable[float], spec: str = ".2f", unit: str = "",
         bounds: tuple[float, float] = (-math.inf, math.inf)) -> str:
    """:func:`fmt` of per-seed values' mean and 95 % CI, with the values beside it."""
    vals = list(xs)
    big = max((abs(v) for v in vals if math.isfinite(v)), default=0.0) >= 1e6
    return fmt(*mean_ci(vals), spec, unit, bounds) + seeds_of(vals, ".2e" if big else spec)


def seeds_of(xs: Iterable[float], spec: str = ".1f", scale: float = 1.0) -> str:
    """The per-seed values behind a mean, as the tables show them beside it: ``[a, b, c]``."""
    vals = list(xs)
    if len(vals) < 2:
        return ""
    return " [per seed: " + ", ".join(
        "diverged" if math.isinf(v) else f"{scale * v:{spec}}" for v in vals) + "]"


def pct(xs: Iterable[float]) -> str:
    """Accuracies (fractions) as percent: mean and 95 % CI (within 0 to 100 %), and the
    per-seed values."""
    vals = list(xs)
    m, ci = mean_ci(vals)
    return fmt(None if m is None else 100 * m, None if ci is None else 100 * ci, ".1f", " %",
               bounds=(0.0, 100.0)) + seeds_of(vals, scale=100)


def pts(xs: Iterable[float], bounds: tuple[float, float] = (-math.inf, math.inf)) -> str:
    """Accuracy differences (fractions) as percentage points: mean and 95 % CI
    (``bounds``: :data:`NON_NEGATIVE` for a gap or a spread), the interval
    cut at +-100 points, as far as two accuracies can be apart; and the per-seed values."""
    vals = list(xs)
    m, ci = mean_ci(vals)
    return fmt(None if m is None else 100 * m, None if ci is None else 100 * ci, ".1f",
               " points", bounds=(max(bounds[0], -100.0), min(bounds[1], 100.0))) \
        + seeds_of(vals, scale=100)


def scaled(xs: Iterable[float], scale: float = 1.0) -> tuple[float | None, float | None]:
    """Mean and 95 % half-width, both times ``scale`` (100 for percent), as a chart takes them."""
    m, ci = mean_ci(xs)
    return (None if m is None else scale * m, None if ci is None else scale * ci)


def short_mean(xs: Iterable[float], spec: str = ".1f", scale: float = 1.0) -> str:
    """The mean alone (times ``scale``) formatted by ``spec``; "-" when nothing was measured."""
    m, _ = scaled(xs, scale)
    return "-" if m is None else f"{m:{spec}}"


def md_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """A Markdown table's lines (header, rule, rows), as a Finding's ``details``."""
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(r) + " |" for r in rows)]


def explain(verdict: str, summary: str, reason: str | None) -> str:
    """The checks' summary, and what the runs measured that bears on it when the claim
    did not fully hold. ``reason`` states measurements only; a suspected cause is an
    ablation (:func:`under_conditions`), never a sentence."""
    if reason and verdict in (NOT_REPRODUCED, PARTLY):
        return f"{summary} Measured: {reason}."
    return summary


Evaluator = Callable[[sw.Sweep, list[sw.PointResult]], Finding]


def under_conditions(sweep: sw.Sweep, results: Sequence[sw.PointResult],
                     condition: Callable[[sw.Point], str | Sequence[str] | None],
                     evaluate: Evaluator, conditions: Sequence[str]) -> Finding:
    """The claim judged once per condition of the sweep (the first: the paper's setting;
    each other changes one factor, an ablation), in one Finding.

    ``condition(point)`` names a point's condition, or several (a baseline's run
    serves every condition its setting belongs to), or None. The
    verdict is the first condition's; the text says it for each, e.g.
    "Under the authors' rule: **reproduced**. Under Algorithm 1's rule
    (measured): **not reproduced** ...", so a reader sees what the claim needs.
    """
    groups: dict[str, list[sw.PointResult]] = {}
    for r in results:
        named = condition(r.point)
        for c in [named] if isinstance(named, str) else named or ():
            groups.setdefault(c, []).append(r)
    if conditions[0] not in groups:
        return missing(f"runs in the paper's setting ({conditions[0]})")
    found = [(c, evaluate(sweep, groups[c])) for c in conditions if c in groups]
    (first, main), rest = found[0], found[1:]
    why = f"Under {first}: **{main.verdict}**. {main.why}"
    for c, f in rest:
        why += f" Under {c} (measured): **{f.verdict}**; {f.number}. {f.why}"
    details: list[str] = []
    for c, f in found:
        details += [f"**Under {c}**: {f.number}.", "", *f.details, ""]
    charts = [(c, f.chart) for c, f in found if f.chart is not None]
    chart = None
    if charts:
        per_row = max(len(ch.panels) for _, ch in charts)
        panels = []
        for c, ch in charts:
            for p in ch.panels:
                p.title = f"under {c}"
            # a blank panel (no value, no series: not drawn) ends a shorter row
            panels += ch.panels + [Panel("", {})] * (per_row - len(ch.panels))
        chart = Chart(charts[0][1].title, panels, columns=per_row)
    return Finding(f"{main.number} (under {first})", main.verdict, why, details[:-1], chart)


def missing(what: str) -> Finding:
    """The finding when the sweep lacks a variant the claim needs."""
    return Finding("not measurable", INCONCLUSIVE, f"The sweep has no {what}.")
