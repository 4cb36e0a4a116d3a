"""A claim's record, and what is written from the records.

:func:`run_claim` runs (or reads) a claim's sweep, evaluates it and copies its
figure to docs/claims/; :func:`pending` is the record of a claim not yet
measured. From the records :func:`write_docs` writes docs/claims.md and
:func:`write_readme` the table between README.md's ``claims-table`` markers.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from claimslib.charts import draw_chart
from claimslib.verdict import Finding
from fedsim import sweep as sw

#: The repository (this file is tools/claimslib/writer.py).
ROOT = Path(__file__).resolve().parents[2]
REPRO = ROOT / "scenarios" / "repro"
DOCS = ROOT / "docs"
STATE = DOCS / "claims" / "claims.json"
#: Each run's real seconds and cores (at its point's own dilation) in the last
#: regeneration, by sweep and point: they order the next one's pool, longest first
#: (a point's budget times its dilation only bounds a run that ends by its rounds),
#: and pack it by each run's load (runs of 0.05 to 0.5 cores).
TIMES = DOCS / "claims" / "times.json"
BEGIN, END = "<!-- claims-table:begin -->", "<!-- claims-table:end -->"
#: The file an evaluator's own chart is drawn to, in the claim's sweep directory
#: (``claim-<id>.png``: claims that share a sweep draw their own).
CHART = "claim"


@dataclass
class Claim:
    """One claim of one paper and how its sweep measures it."""

    id: str
    paper: str
    claim: str
    reported: str                # the paper's own number or statement, with where
    sweep: str                   # file under scenarios/repro/ (or an absolute path)
    #: which of the sweep's figures (a ``fedsim.sweep.FIGURES`` name) illustrates
    #: it, or None: the chart its evaluator draws
    figure: str | None
    evaluate: Callable[[sw.Sweep, list[sw.PointResult]], Finding]
    #: each difference from the paper's setting that remains, and why
    differences: tuple[str, ...] = ()
    #: other sweeps (files under scenarios/repro/) whose runs the evaluator also reads,
    #: run first if they have not run (e.g. an ablation another claim's sweep holds)
    also: tuple[str, ...] = ()


# -- a claim's record ------------------------------------------------------------

def _commit() -> str:
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--",
                                "fedsim", "netem", "scenarios"], capture_output=True,
                               text=True, check=True).stdout.strip()
        return head + ("+changes" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def run_claim(c: Claim, out: Path, jobs: str, execute: bool) -> dict[str, Any]:
    """Run (or read) a claim's sweep and evaluate it; returns its record.

    ``c.sweep`` is a file under scenarios/repro/ or an absolute path (a
    reduced copy, to try the whole path quickly).
    """
    if c.figure is not None and c.figure not in sw.FIGURES:
        raise SystemExit(f"claim {c.id}: figure {c.figure!r} is not one of the sweep's "
                         f"figures ({', '.join(sw.FIGURES)}); None draws the evaluator's chart")
    spec = sw.load_sweep(REPRO / c.sweep)
    # one directory per sweep file: claims that read the same runs share them
    sdir = out / Path(c.sweep).name.removesuffix(".sweep.toml")
    t0 = time.monotonic()
    # a resumed sweep's time covers only the part run last
    resumed = execute and any((sdir / "runs" / p.key / "summary.json").exists()
                              for p in spec.points())
    if execute:
        res = sw.run_sweep(spec, sdir, jobs=jobs if jobs == "auto" else int(jobs),
                           report=lambda line: print(f"  {c.id} {line}", flush=True))
        results = res.points
        real = time.monotonic() - t0
    else:
        spec, results = sw.read_results(sdir)
        sw.write_tables(spec, sdir, results)
        # what the runs took, one after another (main keeps a measured time if it has one)
        real = sum(sw.figure(r.summary, "real_seconds") or 0.0 for r in results)
    for extra in c.also:        # another claim's runs, as a condition of this one
        xspec = sw.load_sweep(REPRO / extra)
        xdir = out / Path(extra).name.removesuffix(".sweep.toml")
        if execute:
            results = [*results, *sw.run_sweep(
                xspec, xdir, jobs=jobs if jobs == "auto" else int(jobs),
                report=lambda line: print(f"  {c.id} {line}", flush=True)).points]
        elif (xdir / "sweep.json").exists():
            results = [*results, *sw.read_results(xdir)[1]]
    finding = c.evaluate(spec, results)
    if finding.chart is not None:
        fig: Path | None = draw_chart(finding.chart, sdir / f"{CHART}-{c.id.lower()}.png")
    else:
        fig = sdir / f"{c.figure}.png" if c.figure else None
    (DOCS / "claims").mkdir(parents=True, exist_ok=True)
    shown = fig is not None and fig.exists()
    if fig is not None and shown:
        shutil.copyfile(fig, DOCS / "claims" / f"{c.id.lower()}.png")
    counted = sum(r.counts for r in results)
    # runs that went on without a client whose training failed: named, never counted
    lost = [f"{_point_name(r)}: {r.lost_work}" for r in results if r.lost_runs]
    return {"id": c.id, "paper": c.paper, "claim": c.claim, "reported": c.reported,
            "differences": list(c.differences),
            "lost_work": lost, "number": finding.number, "verdict": finding.verdict,
            "why": finding.why,
            "details": finding.details, "sweep": _shown_path(REPRO / c.sweep),
            "figure": f"docs/claims/{c.id.lower()}.png" if shown else None,
            "runs": len(results), "counted": counted, "real_seconds": round(real, 1),
            "resumed": resumed,
            "measured": time.strftime("%Y-%m-%d"), "commit": _commit(),
            "command": f"python tools/claims.py --only {c.id}"}


def run_together(claims: Sequence[Claim], out: Path, jobs: str,
                 hints: Path | None = None, headroom: float | None = None,
                 max_scale: float = 4.0) -> tuple[float, bool]:
    """Run every sweep of ``claims`` (their own and those they also read, each once)
    in one pool (:func:`fedsim.sweep.run_sweeps`): the real seconds it took, and
    whether any of them was resumed. Evaluate the claims afterwards from disk.

    The pool goes longest first by the real times of an earlier regeneration:
    ``hints``, its directory, or else those :data:`TIMES` keeps (written here
    after every pool), where a point has one; the others by their budget
    (:meth:`fedsim.sweep.Sweep.expected_real`). Its runs are packed by the
    cores each used then (``run_sweeps(loads=)``)."""
    pairs: dict[str, tuple[sw.Sweep, Path]] = {}
    for c in claims:
        for name in (c.sweep, *c.also):
            if name not in pairs:
                pairs[name] = (sw.load_sweep(REPRO / name),
                               out / Path(name).name.removesuffix(".sweep.toml"))
    resumed = any((sdir / "runs" / pt.key / "summary.json").exists()
                  for spec, sdir in pairs.values() for pt in spec.points())
    known = read_times()
    bases = [spec.check() for spec, _ in pairs.values()]
    expected: dict[tuple[int, str], float] = {}
    loads: dict[tuple[int, str], float] = {}
    for i, (spec, sdir) in enumerate(pairs.values()):
        for pt in spec.points():
            entry = (_measured(hints / sdir.name / "runs" / pt.key, bases[i].get(pt.key))
                     if hints else known.get(sdir.name, {}).get(pt.key, {}))
            if "seconds" in entry:
                expected[(i, pt.key)] = entry["seconds"]
            if "cores" in entry:
                loads[(i, pt.key)] = entry["cores"]
    t0 = time.monotonic()
    sw.run_sweeps(list(pairs.values()), jobs=jobs if jobs == "auto" else int(jobs),
                  report=lambda line: print(f"  {line}", flush=True), expected=expected,
                  headroom=headroom, loads=loads, max_scale=max_scale)
    took = time.monotonic() - t0
    for i, (spec, sdir) in enumerate(pairs.values()):
        for pt in spec.points():
            entry = _measured(sdir / "runs" / pt.key, bases[i].get(pt.key))
            if entry:
                known.setdefault(sdir.name, {})[pt.key] = entry
    TIMES.parent.mkdir(parents=True, exist_ok=True)
    TIMES.write_text(json.dumps(known, indent=1, sort_keys=True) + "\n")
    return took, resumed


def read_times() -> dict[str, dict[str, dict[str, float]]]:
    """:data:`TIMES`: {sweep: {point key: {"seconds": s, "cores": c}}} ({} when
    absent or unreadable; a bare number is a point's seconds)."""
    try:
        data = json.loads(TIMES.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    out: dict[str, dict[str, dict[str, float]]] = {}
    for sweep_name, points in data.items():
        if not isinstance(points, dict):
            continue
        for key, value in points.items():
            entry = ({"seconds": float(value)} if isinstance(value, int | float) else
                     {k: float(x) for k, x in value.items()
                      if k in ("seconds", "cores") and isinstance(x, int | float)}
                     if isinstance(value, dict) else {})
            if entry:
                out.setdefault(str(sweep_name), {})[str(key)] = entry
    return out


def _measured(run: Path, base: float | None) -> dict[str, float]:
    """What an earlier run of a point took at the point's own dilation ``base``: its
    real seconds (those it ran, less its emulated seconds times the dilation it
    ran at beyond ``base``: a run a pool slowed to twice its dilation would
    otherwise be ordered as twice as long), and the cores it used (from the
    sweep's point.json: its process tree's CPU over its real time, at the
    dilation it ran at); {} when none is on disk."""
    try:
        summary = json.loads((run / "summary.json").read_text())
    except (OSError, ValueError):
        return {}
    seconds = summary.get("real_seconds") if isinstance(summary, dict) else None
    if not isinstance(seconds, int | float):
        return {}
    try:
        meta = json.loads((run / "point.json").read_text())
    except (OSError, ValueError):
        meta = {}
    ran_at = meta.get("dilation") if isinstance(meta, dict) else None
    scale = (float(ran_at) / base if isinstance(ran_at, int | float) and ran_at > 0 and base
             else 1.0)
    emulated = summary.get("emulated_seconds")
    if scale != 1.0 and isinstance(emulated, int | float) and base:
        seconds = max(float(seconds) - float(emulated) * base * (scale - 1.0),
                      float(seconds) / scale)
    entry = {"seconds": round(float(seconds), 1)}
    cores = meta.get("cores") if isinstance(meta, dict) else None
    if isinstance(cores, int | float) and cores > 0:
        entry["cores"] = round(float(cores) * scale, 3)
    return entry


def _point_name(r: sw.PointResult) -> str:
    """A run as the docs name it: variant, grid values and seed."""
    p = r.point
    parts = [p.variant] * bool(p.variant) + [f"{sw.short_key(k)} = {v}" for k, v in p.grid]
    return ", ".join([*parts, f"seed {p.seed}"])


def lost_note(r: dict[str, Any]) -> str:
    """What the table says of a claim's runs that lost client work ('' when none did)."""
    lost = r.get("lost_work") or []
    if not lost:
        return ""
    return (f" Lost client work in {len(lost)} run(s), not counted: "
            + "; ".join(x.split(": ", 1)[0] for x in lost[:6])
            + (" ..." if len(lost) > 6 else "") + " (docs/claims.md names each client and why).")


def _shown_path(p: Path) -> str:
    """A path as docs show it: relative to the repository when inside it."""
    try:
        return str(p.resolve().relative_to(ROOT))
    except ValueError:
        return str(p)


def pending(c: Claim) -> dict[str, Any]:
    """The record of a claim not measured yet."""
    return {"id": c.id, "paper": c.paper, "claim": c.claim, "reported": c.reported,
            "differences": list(c.differences),
            "number": "not measured yet", "verdict": "pending", "why": "Its sweep has not run.",
            "details": [], "sweep": _shown_path(REPRO / c.sweep), "figure": None, "runs": 0,
            "counted": 0, "real_seconds": 0.0, "measured": "-", "commit": "-",
            "command": f"python tools/claims.py --only {c.id}"}


# -- the table, docs/claims.md and README.md -------------------------------------

def table(records: list[dict[str, Any]]) -> str:
    """The whole Markdown table (docs/claims.md)."""
    lines = ["| claim | paper reports | fedsim (mean, 95 % CI) | verdict | figure | measured, "
             "and the command that regenerates it |",
             "|---|---|---|---|---|---|"]
    for r in records:
        fig = f"[png]({r['figure']})" if r.get("figure") else "-"
        lines.append(f"| [{r['id']}](docs/claims.md#{r['id'].lower()}) {r['claim']} | "
                     f"{r['reported']} | {r['number']} | **{r['verdict']}**: {r['why']}"
                     f"{lost_note(r)} | "
                     f"{fig} | {r['measured']} at {r['commit']}: `{r['command']}` |")
    return "\n".join(lines)


RESUMED = "; some sweeps were resumed, and only their last part is timed"
POOLED = " of runs one after another, in a pool of runs"


def write_docs(records: list[dict[str, Any]]) -> None:
    total = sum(r["real_seconds"] for r in records)
    partial = any(r.get("resumed") for r in records)
    # the wall time of a regeneration that ran the claims' sweeps in pools
    together = max((r.get("table_seconds") or 0.0 for r in records), default=0.0)
    pools = ("each paper's sweeps in one pool of runs, paper after paper"
             if any(r.get("table_pools") == "by paper" for r in records)
             else "every claim's sweep in one pool of runs")
    parts = ["# Claims, reproduced through real timing",
             "",
             "Written by `python tools/claims.py`; do not edit by hand. Each claim's sweep ran",
             "real federations (ZeroMQ, torch, netem) with every point's fidelity verdict",
             "checked: a point whose verdict failed was rerun with more dilation and, if it",
             "still failed, left out and counted below. Numbers are means over seeds with",
             "95 % confidence intervals (Student's t).",
             "",
             "Each verdict follows checks written in `tools/claimslib/` before any run, one per",
             "direction the paper claims (\"Const is less stable than Poly\", \"the gap widens",
             "with D\"). A check is *shown* when the 95 % confidence interval of its quantity",
             "(per-seed differences or ratios, paired by seed) lies on the expected side, *not",
             "seen* when its mean lies on the other side, and *within noise* otherwise. Every",
             "check shown: **reproduced**; none shown and one not seen: **not reproduced**; none",
             "shown and the rest within noise: **inconclusive**; anything else: **partly**.",
             "A quantity's per-seed values stand beside its mean and interval; a check whose",
             "interval reaches both sides is *undecided at this budget* (more seeds, up to 5,",
             "where the time allowed).",
             "",
             "A verdict that rests on a check near its threshold, on two to five seeds, can",
             "move by one step from one regeneration to the next with the same scenarios: no",
             "two runs' real timing is the same (the verdicts that moved so far: \"Verdicts",
             "that moved between regenerations\" in [measurements.md](measurements.md)).",
             "",
             "Each scenario follows its paper's setting wherever this machine allows it; what",
             "still differs is listed under each claim. Where a claim was not reproduced at",
             "first, one ablation changes only the suspected factor (the budget, the server",
             "rule, the participation, the client sizes, the reading of an ablation) and the",
             "verdict is given under each condition: \"Under X: **reproduced**. Under Y",
             "(measured): **not reproduced**\". The verdict in the table is the first",
             "condition's, the paper's setting (for FedSpeed: the authors' server rule, which",
             "produced the paper's numbers).",
             "",
             "A run in which a client's local training failed (lost client work: an overflow,",
             "a non-finite model, an exception) went on without that client; it is named under",
             "its claim and never counted.",
             "",
             *([f"Regenerating all of them took {'at least ' if partial else ''}"
                f"{together / 60:.0f} minutes of real time here (2 cores, {pools}: "
                "`python tools/claims.py`"
                f"{RESUMED if partial else ''}); one after another, their runs took "
                f"{total / 60:.0f} minutes."]
              if together else
              [f"Regenerating all of them took {'at least ' if partial else ''}"
               f"{total / 60:.0f} minutes of real time here (2 cores"
               f"{RESUMED if partial else ''})."]),
             "",
             table(records).replace("(docs/claims.md#", "(#").replace("(docs/", "("),
             ""]
    for r in records:
        parts += [f"## {r['id']}", "",
                  f"**{r['paper']}**: {r['claim']}.", "",
                  f"- The paper reports: {r['reported']}.",
                  *[f"- Differs from the paper's setting: {d}" for d in
                    r.get("differences") or []],
                  f"- fedsim: {r['number']}.",
                  f"- Verdict: **{r['verdict']}**. {r['why']}",
                  f"- Runs: {r['counted']} of {r['runs']} counted (the rest failed their "
                  "fidelity verdict after every attempt, failed, or lost client work).",
                  *[f"- Lost client work (not counted): {x}" for x in r.get("lost_work") or []],
                  f"- Sweep: `{r['sweep']}`; regenerate with `{r['command']}` "
                  f"({r['real_seconds'] / 60:.1f} min here"
                  f"{POOLED if r.get('table_seconds') else ''}"
                  f"{' for the part run last: the sweep was resumed' if r.get('resumed') else ''}"
                  f"); measured {r['measured']} at "
                  f"{r['commit']}.", ""]
        if r.get("details"):
            parts += [*r["details"], ""]
        if r.get("figure"):
            parts += [f"![{r['id']}]({r['figure'].removeprefix('docs/')})", ""]
    (DOCS / "claims.md").write_text("\n".join(parts))


def readme_table(records: list[dict[str, Any]]) -> str:
    """The README's short table: claim, verdict, and the link to its details
    (docs/claims.md: the numbers, the setting, the reason, the figure, the
    command). When the rows were measured, above it: once if every row was
    measured on one day at one commit, else per row in its link."""
    when = {(r["measured"], r["commit"]) for r in records}
    lines = []
    if len(when) == 1:
        day, commit = next(iter(when))
        lines += [f"Measured {day} at {commit}.", ""]
    lines += ["| claim | verdict | details |", "|---|---|---|"]
    for r in records:
        anchor = f"docs/claims.md#{r['id'].lower()}"
        stamp = "" if len(when) == 1 else f" ({r['measured']} at {r['commit']})"
        lines.append(f"| **{r['id']}** {r['claim']} | **{r['verdict']}** | "
                     f"[numbers, setting, figure]({anchor}){stamp} |")
    return "\n".join(lines)


def write_readme(records: list[dict[str, Any]]) -> None:
    readme = ROOT / "README.md"
    text = readme.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"README.md has no {BEGIN} ... {END} markers")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    readme.write_text(f"{head}{BEGIN}\n{readme_table(records)}\n{END}{tail}")
