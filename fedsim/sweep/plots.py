"""A sweep's figures: each quantity against one grid key (or the variants), with CI error bars.

The x axis is ``plot.x``, else the first grid key with several numeric
values, else the first with several values of any kind (``staleness =
const, poly``), else the variants. A numeric key draws a line per variant
(and per value of the other grid keys); a categorical one puts its values
side by side on the axis, a marker per series at each. A figure that
cannot be drawn (nothing varies but the seed; no run that counts has the
quantity) is named in a warning of the ``fedsim.sweep.plots`` logger,
which the command line prints on stderr.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedsim.sweep.results import FIGURES
from fedsim.sweep.spec import Sweep, SweepError, grid_cell, short_key, toml_literal

if TYPE_CHECKING:
    from matplotlib.figure import Figure

log = logging.getLogger(__name__)

#: ``plot.x`` naming the variants (their labels side by side on the axis)
VARIANT = "variant"


def default_figures(sweep: Sweep) -> list[str]:
    ys = ["final_accuracy", "emulated_seconds"]
    if sweep.target_accuracy is not None:
        ys.append("time_to_target_s")
    return ys


def x_key(sweep: Sweep) -> str | None:
    """The key the figures are drawn against (:data:`VARIANT`: the variants); None: none varies.

    Raises :class:`SweepError` for a ``plot.x`` that is neither a grid key
    nor, with variants, ``"variant"``.
    """
    x = sweep.plot.get("x")
    if x is not None:
        if x in sweep.grid or (x == VARIANT and sweep.variants):
            return str(x)
        allowed = [*sweep.grid, *([VARIANT] if sweep.variants else [])]
        raise SweepError(f"sweep.plot.x = {x!r} is not a grid key ({', '.join(allowed)})")
    several = [k for k, v in sweep.grid.items() if len(v) > 1]
    numeric = [k for k in several if all(_is_num(a) for a in sweep.grid[k])]
    if numeric or several:
        return (numeric or several)[0]
    return VARIANT if len(sweep.variants) > 1 else None


def plot_sweep(sweep: Sweep, out: Path, agg: list[dict[str, Any]]) -> list[Path]:
    """Write :func:`sweep_figures` as ``<quantity>.png`` into ``out``; return the paths."""
    from fedsim.results.plots import save  # lazy: fedsim sweep --dry-run stays fast

    return [save(fig, out / f"{y}.png") for y, fig in sweep_figures(sweep, agg).items()]


def sweep_figures(sweep: Sweep, agg: list[dict[str, Any]]) -> dict[str, Figure]:
    """One figure per quantity against :func:`x_key`, a series per variant and other grid keys.

    ``agg`` is :func:`fedsim.sweep.aggregate`'s rows. Returns the figures by
    quantity; each quantity without one is logged as a warning, saying why.
    """
    ys = sweep.plot.get("y") or default_figures(sweep)
    bad = [y for y in ys if y not in FIGURES]
    if bad:
        raise SweepError(f"sweep.plot.y: unknown figure {bad[0]!r} (known: {', '.join(FIGURES)})")
    x = x_key(sweep)
    if x is None:
        log.warning("no figures: nothing but the seed varies in this sweep (aggregate.csv "
                    "holds each quantity's mean and 95 % CI)")
        return {}
    from fedsim.results.plots import new_figure  # lazy: fedsim sweep --dry-run stays fast

    numeric = x != VARIANT and all(_is_num(v) for v in sweep.grid[x])
    # a position on the axis per value: the value itself, or a category's index
    cats: list[Any] = []
    ticks: list[str] = []
    if x == VARIANT:
        cats = [v.label for v in sweep.variants]
        ticks = list(cats)
    elif not numeric:
        cats = [grid_cell(v) for v in sweep.grid[x]]
        ticks = [_label(v) for v in sweep.grid[x]]
    logx = sweep.plot.get("logx")
    if numeric and logx is None:
        xs_all = [float(v) for v in sweep.grid[x]]
        pos = [v for v in xs_all if v > 0]
        logx = bool(pos) and len(pos) == len(xs_all) and max(pos) / min(pos) > 100
    others = [k for k in sweep.grid if k != x]
    norm = sweep.plot.get("normalize")
    figures = {}
    for y in ys:
        lines: dict[str, list[tuple[float, float, float]]] = {}
        for row in agg:
            m = row.get(f"{y}_mean")
            if m is None:
                continue
            where = row["variant"] if x == VARIANT else row[x]
            if numeric:
                at = float(where)
            elif where in cats:
                at = float(cats.index(where))
            else:
                continue
            name = ", ".join([row["variant"]] * bool(row["variant"] and x != VARIANT)
                             + [f"{short_key(k)}={row[k]}" for k in others])
            lines.setdefault(name or y, []).append((at, m, row.get(f"{y}_ci95") or 0.0))
        if not lines:
            log.warning("no %s.png: %s", y, _why_empty(y, agg))
            continue
        scale = 1.0
        label = FIGURES[y][1]
        if norm and y in _TIMES:   # accuracies and losses keep their own scale
            ref, where_ref = _reference(lines, norm, x, ticks)
            if ref:
                scale = ref
                label += f"\n(relative to {norm}{where_ref})"
        fig = new_figure(6.4, 4.2)
        ax = fig.subplots()
        if numeric:
            for name, pts in lines.items():
                pts.sort()
                ax.errorbar([p[0] for p in pts], [p[1] / scale for p in pts],
                            yerr=[p[2] / scale for p in pts], marker="o", ms=4, capsize=3,
                            lw=1.3, label=name)
            if logx:
                ax.set_xscale("log")
        else:
            _categories(ax, lines, ticks, scale)
        _flat_axis(ax, [(p[1] - p[2]) / scale for pts in lines.values() for p in pts]
                   + [(p[1] + p[2]) / scale for pts in lines.values() for p in pts])
        ax.set_xlabel(x)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3, which="both", axis="both" if numeric else "y")
        n = max((r["n"] for r in agg), default=0)
        ax.set_title(f"{sweep.name}: {y} (mean, 95 % CI over up to {n} seeds)", fontsize=9)
        if numeric or len(lines) > 1 or next(iter(lines)) != y:
            ax.legend(fontsize=8)
        fig.tight_layout()
        figures[y] = fig
    return figures


def _categories(ax: Any, lines: dict[str, list[tuple[float, float, float]]],
                ticks: list[str], scale: float) -> None:
    """Each series' markers at its categories, side by side, the categories named on the axis."""
    k = len(lines)
    step = min(0.7 / k, 0.2) if k > 1 else 0.0
    for i, (name, pts) in enumerate(lines.items()):
        shift = (i - (k - 1) / 2) * step
        ax.errorbar([p[0] + shift for p in pts], [p[1] / scale for p in pts],
                    yerr=[p[2] / scale for p in pts], marker="o", ms=5, capsize=4, lw=1.3,
                    ls="none", label=name)
    ax.set_xticks(range(len(ticks)), ticks)
    ax.set_xlim(-0.5, len(ticks) - 0.5)
    # about 60 characters fit across the axis: longer names slant, so none overlaps the next
    if max(len(t) for t in ticks) * len(ticks) > 60:
        for t in ax.get_xticklabels():
            t.set_rotation(25)
            t.set_horizontalalignment("right")


def _reference(lines: dict[str, list[tuple[float, float, float]]], norm: str, x: str,
               ticks: list[str]) -> tuple[float, str]:
    """The mean ``plot.normalize`` divides by and how the axis says where it is (0: none).

    ``norm`` is a variant: its series' first point; or, when the variants
    are the categories (``x`` is :data:`VARIANT`), its category's first point.
    """
    if x == VARIANT:
        if norm not in ticks:
            return 0.0, ""
        at = float(ticks.index(norm))
        for name, pts in lines.items():
            hit = [p for p in pts if p[0] == at]
            if hit:
                return hit[0][1], "" if len(lines) == 1 else f", {name}"
        return 0.0, ""
    ref = sorted(next((v for k, v in lines.items() if k.split(",")[0] == norm), []))
    if not ref:
        return 0.0, ""
    at_x = ticks[int(ref[0][0])] if ticks else f"{ref[0][0]:g}"
    return ref[0][1], f" at {short_key(x)} = {at_x}"


def _why_empty(y: str, agg: list[dict[str, Any]]) -> str:
    """Why no point has a value of ``y``, as the warning says it."""
    counted = sum(int(r.get("n") or 0) for r in agg)
    if counted == 0:
        return ("no run counts (every point flagged or unfinished: see sweep.csv), so "
                "there is nothing to draw")
    why = f"none of the {counted} runs that count reported {FIGURES[y][1]}"
    if y == "time_to_target_s":
        why += " (none reached the target accuracy)"
    return why


#: the figures ``plot.normalize`` divides (times: a ratio reads as a speedup)
_TIMES = ("emulated_seconds", "time_to_target_s", "real_seconds")


def _flat_axis(ax: Any, values: list[float]) -> None:
    """When the drawn values (means and their bars) all agree to a ten-thousandth, show
    them as the flat line they are: every run stopped at ``run.time_budget`` ends within
    microseconds of it, which the y axis would otherwise stretch into a pattern under
    an offset label (``1e-6+5``)."""
    if not values:
        return
    lo, hi = min(values), max(values)
    if hi - lo > 1e-4 * max(abs(hi), abs(lo), 1e-12):
        return
    pad = max(abs(hi), 1.0) * 0.05
    ax.set_ylim(lo - pad, hi + pad)
    ax.ticklabel_format(axis="y", useOffset=False, style="plain")


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _label(v: Any) -> str:
    """A grid value as its axis names it: a string bare, anything else as TOML writes it."""
    return v if isinstance(v, str) else toml_literal(v)
