"""What a claim's runs say: picking them out of a sweep, and reading their files.

Runs are selected and grouped by the settings each point ran with (a grid
value, a variant's override, else the base scenario); the measures an
evaluator compares (a figure of the summary, the accuracy curve of
metrics.csv, the events of events.jsonl) are taken per seed, over the runs
that count (their fidelity verdict passed).
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import tomllib
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from fedsim import sweep as sw
from fedsim.results.writer import read_events, read_metrics


def select(results: Sequence[sw.PointResult], variant: str | None = None,
           **grid: Any) -> list[sw.PointResult]:
    """The points of one variant at one grid point (grid keys by their short name)."""
    out = []
    for r in results:
        if variant is not None and r.point.variant != variant:
            continue
        g = {sw.short_key(k): v for k, v in r.point.grid}
        if all(_close(g.get(k), v) for k, v in grid.items()):
            out.append(r)
    return out


def _close(a: Any, b: Any) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return bool(a == b)


def values(results: Sequence[sw.PointResult], figure: str) -> dict[int, float]:
    """Seed -> figure, over the runs that count."""
    return per_seed(results, lambda r: sw.figure(r.summary, figure))


def per_seed(results: Iterable[sw.PointResult],
             of: Callable[[sw.PointResult], float | None]) -> dict[int, float]:
    """Seed -> ``of(run)``, over the runs that count (faithful) where it is defined."""
    out = {}
    for r in results:
        v = of(r) if r.counts else None
        if v is not None:
            out[r.point.seed] = v
    return out


@functools.lru_cache(maxsize=64)
def base_scenario(path: str) -> dict[str, Any]:
    """The tables of a sweep's base scenario file, read once per path ({} if unreadable)."""
    try:
        return tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return {}


def setting(sweep: sw.Sweep, point: sw.Point, key: str) -> Any:
    """A dotted scenario key as the point ran it: its overrides, else the base scenario.

    A point that switched algorithms carries a whole ``algorithm`` table: its
    ``algorithm.*`` keys come from there only (the base's belong to another
    algorithm). None when neither says (fedsim's default applied).
    """
    over = dict(point.overrides)
    head, _, rest = key.partition(".")
    if isinstance(over.get(head), dict):
        node: Any = over[head]
        for part in rest.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        return node
    if key in over:
        return over[key]
    node = base_scenario(str(sweep.scenario))
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def scenario_value(sweep: sw.Sweep, key: str, default: float) -> float:
    """A number the base scenario sets at the dotted ``key``, else ``default``."""
    node: Any = base_scenario(str(sweep.scenario))
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return float(node) if isinstance(node, (int, float)) else default


def group(results: Iterable[sw.PointResult],
          key: Callable[[sw.Point], Any]) -> dict[Any, list[sw.PointResult]]:
    """Results by ``key(point)`` (None keys dropped), in the sweep's order."""
    out: dict[Any, list[sw.PointResult]] = {}
    for r in results:
        k = key(r.point)
        if k is not None:
            out.setdefault(k, []).append(r)
    return out


def variant_label(runs: Sequence[sw.PointResult]) -> str:
    """The variant label of a group of runs."""
    return runs[0].point.variant if runs else "-"


def point_label(runs: Sequence[sw.PointResult]) -> str:
    """The variant label with the grid values, for a group that is one grid point."""
    if not runs:
        return "-"
    p = runs[0].point
    return ", ".join([p.variant] * bool(p.variant)
                     + [f"{sw.short_key(k)} = {v}" for k, v in p.grid]) or "-"


def grid_or_setting(sweep: sw.Sweep, p: sw.Point, key: str) -> Any:
    """A key's value at a point: its grid value when the grid sets it, else :func:`setting`."""
    g = dict(p.grid)
    return g[key] if key in g else setting(sweep, p, key)


def num(v: Any) -> float | None:
    """``v`` as a float when it is a number (a bool is not one), else None."""
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


# -- what a run's files say (metrics.csv, events.jsonl, ...) ---------------------

def accuracy_curve(r: sw.PointResult) -> list[tuple[float, float]]:
    """(emulated s, test accuracy) at every evaluation with a finite accuracy."""
    path = r.run_dir / "metrics.csv"
    if not path.exists():
        return []
    return [(row["t"], row["accuracy"]) for row in read_metrics(path)
            if math.isfinite(row.get("t", math.nan)) and math.isfinite(row.get("accuracy",
                                                                                math.nan))]


def time_to_fraction(r: sw.PointResult, frac: float = 0.9) -> float | None:
    """Emulated s until the test accuracy first reached ``frac`` of the run's own maximum."""
    curve = accuracy_curve(r)
    if not curve:
        return None
    top = max(a for _, a in curve)
    return next(t for t, a in curve if a >= frac * top)


def mean_accuracy(r: sw.PointResult) -> float | None:
    """Test accuracy averaged over the run's emulated time (area under the curve / span)."""
    curve = accuracy_curve(r)
    if len(curve) < 2 or curve[-1][0] <= curve[0][0]:
        return None
    area = sum((t1 - t0) * (a0 + a1) / 2 for (t0, a0), (t1, a1) in itertools.pairwise(curve))
    return area / (curve[-1][0] - curve[0][0])


def accuracy_drops(r: sw.PointResult, by: float = 0.02) -> float | None:
    """How many times the test accuracy fell by more than ``by`` from one evaluation to the next."""
    curve = accuracy_curve(r)
    if len(curve) < 2:
        return None
    return float(sum(a0 - a1 > by for (_, a0), (_, a1) in itertools.pairwise(curve)))


def updates_to_target(r: sw.PointResult, target: float) -> tuple[float, bool] | None:
    """Client updates applied at the first evaluation at or above ``target`` (True), or, when
    the run never got there, all its updates (False: a lower bound)."""
    path = r.run_dir / "metrics.csv"
    rows = read_metrics(path) if path.exists() else []
    rows = [x for x in rows if math.isfinite(x.get("updates", math.nan))]
    if not rows:
        return None
    for x in rows:
        if x.get("accuracy", -1.0) >= target:
            return x["updates"], True
    return rows[-1]["updates"], False


def late_loss_std(r: sw.PointResult, tail: float = 0.5) -> float | None:
    """Standard deviation of the test loss over the last ``tail`` of a run's evaluations.

    A run whose loss went non-finite in that stretch diverged: infinitely unstable.
    """
    if not r.counts:
        return None
    losses = _late_losses(r, tail)
    if losses is None or len(losses) < 3:
        return None
    if not all(math.isfinite(v) for v in losses):
        return math.inf
    m = sum(losses) / len(losses)
    return math.sqrt(sum((x - m) ** 2 for x in losses) / (len(losses) - 1))


def late_loss_mean(r: sw.PointResult, tail: float = 0.5) -> float | None:
    """Mean test loss over the last ``tail`` of a run's evaluations (inf if it diverged)."""
    losses = _late_losses(r, tail)
    if not losses:
        return None
    return sum(losses) / len(losses) if all(math.isfinite(v) for v in losses) else math.inf


def _late_losses(r: sw.PointResult, tail: float) -> list[float] | None:
    """The test losses of the last ``tail`` of the evaluations. An evaluation with an
    accuracy but no finite loss (a NaN loss is written as an empty cell) diverged."""
    path = r.run_dir / "metrics.csv"
    if not path.exists():
        return None
    rows = [x for x in read_metrics(path) if math.isfinite(x.get("accuracy", math.nan))]
    rows = rows[int(len(rows) * (1 - tail)):]
    return [x.get("loss", math.nan) if math.isfinite(x.get("loss", math.nan)) else math.inf
            for x in rows]


def events(r: sw.PointResult, *kinds: str) -> list[dict[str, Any]]:
    """The run's event records of the given kinds, in time order."""
    path = r.run_dir / "events.jsonl"
    if not path.exists():
        return []
    out = [e for e in read_events(path) if e.get("ev") in kinds
           and isinstance(e.get("t"), (int, float))]
    out.sort(key=lambda e: float(e["t"]))
    return out


def read_json(path: Path) -> Any:
    """A JSON file's content, or None when it is missing or not JSON."""
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Spearman's rank correlation (average ranks for ties); None if either side is constant."""
    if len(xs) != len(ys) or len(xs) < 3:
        return None

    def ranks(v: Sequence[float]) -> list[float]:
        order = sorted(range(len(v)), key=lambda i: v[i])
        out = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                out[order[k]] = (i + j) / 2
            i = j + 1
        return out

    rx, ry = ranks(xs), ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    sxx = sum((a - mx) ** 2 for a in rx)
    syy = sum((b - my) ** 2 for b in ry)
    return None if sxx == 0 or syy == 0 else sxy / math.sqrt(sxx * syy)
