"""sweep.csv and aggregate.csv: one row per point, and per variant and grid point the
mean and Student-t 95 % confidence half-width of every figure over the faithful seeds.
"""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedsim.sweep.plots import plot_sweep
from fedsim.sweep.results import FIGURES, PointResult, figure
from fedsim.sweep.spec import Sweep, grid_cell, toml_literal


def t_quantile(df: int) -> float:
    """Student's t 0.975 quantile (two-sided 95 %) for ``df`` degrees of freedom."""
    # scipy comes with scikit-learn (a dependency), so it is installed
    from scipy.stats import t  # type: ignore[import-untyped]  # lazy: sweep --dry-run stays fast

    return float(t.ppf(0.975, df))


def mean_ci(values: Sequence[float]) -> tuple[float | None, float | None]:
    """Mean and the half-width of its 95 % confidence interval (None below 2 values)."""
    xs = [v for v in values if v is not None and math.isfinite(v)]
    if not xs:
        return None, None
    m = sum(xs) / len(xs)
    if len(xs) < 2:
        return m, None
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))
    return m, t_quantile(len(xs) - 1) * sd / math.sqrt(len(xs))


def aggregate(sweep: Sweep, results: Sequence[PointResult]) -> list[dict[str, Any]]:
    """Per variant and grid point, over the seeds whose runs count: n, mean, ci95."""
    groups: dict[tuple[str, tuple[tuple[str, str], ...]], list[PointResult]] = {}
    for r in results:
        gkey = tuple((k, toml_literal(v)) for k, v in r.point.grid)
        groups.setdefault((r.point.variant, gkey), []).append(r)
    rows = []
    for (variant, gkey), rs in groups.items():
        ok = [r for r in rs if r.counts]
        row: dict[str, Any] = {"variant": variant}
        row.update(dict(zip((k for k, _ in gkey), _grid_values(rs[0]),
                                           strict=True)))
        row["n"] = len(ok)
        row["flagged"] = len(rs) - len(ok)
        for name in FIGURES:
            vals = [figure(r.summary, name) for r in ok]
            m, ci = mean_ci([v for v in vals if v is not None])
            row[f"{name}_mean"] = m
            row[f"{name}_ci95"] = ci
            row[f"{name}_n"] = sum(v is not None for v in vals)
        rows.append(row)
    return rows


def _grid_values(r: PointResult) -> list[Any]:
    return [grid_cell(v) for _, v in r.point.grid]


def _write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    cols: list[str] = []
    for r in rows:
        cols += [c for c in r if c not in cols]
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols)
        w.writeheader()
        for r in rows:
            w.writerow({k: "" if v is None else v for k, v in r.items()})
    os.replace(tmp, path)


def write_tables(sweep: Sweep, out: Path, results: Sequence[PointResult]) -> list[Path]:
    """Write sweep.csv, aggregate.csv and the figures; return the paths."""
    files = [out / "sweep.csv", out / "aggregate.csv"]
    _write_csv(files[0], [r.row() for r in results])
    agg = aggregate(sweep, results)
    _write_csv(files[1], agg)
    files += plot_sweep(sweep, out, agg)
    return files
