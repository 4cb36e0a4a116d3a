"""A claim's figure: what an evaluator asks for (a :class:`Chart` of :class:`Panel` s), drawn.

An evaluator whose claim no figure of its sweep shows returns a Chart with
its Finding; :func:`draw_chart` draws it, panels side by side with 95 %
confidence intervals as error bars. matplotlib is imported (through
:mod:`fedsim.results.plots`) only when a chart is drawn.
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class Panel:
    """One panel of a claim's figure: bars per category, or lines against a number.

    ``series`` maps a series name to its points ``(x, mean, ci95)``; for
    bars ``x`` is a category label (series sharing categories are grouped),
    for lines a number. A mean of None (no faithful runs) is marked, not drawn.
    An error bar stops at ``bounds`` (default: 0 to 100 for a panel whose
    value is in ``(%)``, none otherwise): a Student-t interval over three
    seeds can reach past what the figure can be.
    """

    value: str                                   # what the bars' length / the lines' y measure
    series: dict[str, list[tuple[Any, float | None, float | None]]]
    kind: str = "bars"                           # bars | lines
    xlabel: str = ""                             # lines only
    logx: bool = False
    #: lines only: the y axis spans at least this much (a small change stays small)
    min_span: float | None = None
    bounds: tuple[float, float] | None = None
    logy: bool = False                           # lines only
    title: str = ""                              # above the panel (e.g. the condition it shows)
    #: lines only: vertical lines at these x, each with a label (e.g. a predicted knee)
    marks: list[tuple[float, str]] | None = None


def _bounds(panel: Panel) -> tuple[float, float]:
    if panel.bounds is not None:
        return panel.bounds
    return (0.0, 100.0) if "(%)" in panel.value else (-math.inf, math.inf)


def _errors(panel: Panel, means: list[float], cis: list[float]) -> list[list[float]]:
    """Asymmetric error bars ``[below, above]``, each interval cut at the panel's bounds."""
    lo, hi = _bounds(panel)
    return [[m - max(lo, m - c) for m, c in zip(means, cis, strict=True)],
            [min(hi, m + c) - m for m, c in zip(means, cis, strict=True)]]


@dataclass
class Chart:
    """A claim's figure, when its sweep draws none that shows the claim."""

    title: str
    panels: list[Panel]
    #: panels per row (default: all in one row); a claim measured under several
    #: conditions puts each condition's panels on a row of their own
    columns: int | None = None


#: Okabe-Ito (safe for colour-blind readers), as fedsim's own plots.
PALETTE = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000"]


def draw_chart(chart: Chart, path: Path) -> Path:
    """Draw ``chart`` to the PNG ``path``: its panels side by side, 95 % CIs as error bars."""
    from fedsim.results.plots import new_figure, save

    n = len(chart.panels)
    cols = max(1, min(n, chart.columns or n))
    rows = math.ceil(n / cols)
    cats = max((len(_categories(p)) * max(1, len(p.series)) for p in chart.panels
                if p.kind == "bars"), default=0)
    width = min(5.6 * cols, 16.0)
    height = max(3.8, 1.6 + 0.28 * cats)
    fig = new_figure(width, height * rows, layout="constrained")
    grid = fig.subplots(rows, cols, squeeze=False)
    axes = [ax for row in grid for ax in row]
    for ax in axes[n:]:
        ax.set_visible(False)
    for ax, panel in zip(axes[:n], chart.panels, strict=True):
        if not panel.value and not panel.series:    # a blank: the rest of a shorter row
            ax.set_visible(False)
            continue
        if panel.title:
            ax.set_title(textwrap.fill(panel.title, 60), fontsize=9)
        if panel.kind == "lines":
            _draw_lines(ax, panel)
        elif panel.kind == "bars":
            _draw_bars(ax, panel)
        else:
            raise ValueError(f"Panel.kind: {panel.kind!r} (allowed: bars, lines)")
    title = chart.title.replace("95 % CI", "95\u00a0%\u00a0CI")   # never split across lines
    fig.suptitle(textwrap.fill(title, int(13 * width)), fontsize=10)
    return save(fig, path)


def _categories(panel: Panel) -> list[Any]:
    seen: list[Any] = []
    for pts_ in panel.series.values():
        seen += [x for x, _, _ in pts_ if x not in seen]
    return seen


def _draw_bars(ax: Any, panel: Panel) -> None:
    cats = _categories(panel)
    k = max(1, len(panel.series))
    h = 0.8 / k
    reach = 0.0
    for i, (name, pts_) in enumerate(panel.series.items()):
        at = {x: (m, ci) for x, m, ci in pts_}
        ys = [j - 0.4 + h * (i + 0.5) for j in range(len(cats))]
        means = [at.get(c, (None, None))[0] for c in cats]
        errs = [at.get(c, (None, None))[1] or 0.0 for c in cats]
        bars = _errors(panel, [m or 0.0 for m in means], errs)
        ax.barh(ys, [m or 0.0 for m in means], height=h * 0.9, xerr=bars, capsize=3,
                color=PALETTE[i % len(PALETTE)], label=name if k > 1 else None)
        errs = [b if m is not None and m < 0 else a
                for m, b, a in zip(means, bars[0], bars[1], strict=True)]
        for y, m, e in zip(ys, means, errs, strict=True):
            if m is None:
                ax.text(0, y, "  no faithful runs", va="center", fontsize=7, color="0.4")
            else:   # the value beside its bar: differences of a point stay readable
                ax.text(m + e if m >= 0 else m - e, y, f" {_value_label(m)} ", va="center",
                        ha="left" if m >= 0 else "right", fontsize=7)
                reach = max(reach, abs(m) + e)
    ax.set_xlim(*((0, 1.18 * reach) if reach > 0 else (None, None)))
    ax.set_yticks(range(len(cats)), [textwrap.fill(str(c), 24) for c in cats], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(panel.value)
    ax.grid(axis="x", alpha=0.3)
    if k > 1:
        ax.legend(fontsize=7, loc="lower left", bbox_to_anchor=(0, 1.0), ncol=min(k, 4),
                  frameon=False)


def _value_label(m: float) -> str:
    return f"{m:,.0f}" if abs(m) >= 100 else f"{m:.1f}" if abs(m) >= 10 else f"{m:.3g}"


def _draw_lines(ax: Any, panel: Panel) -> None:
    for i, (name, pts_) in enumerate(panel.series.items()):
        got = sorted((float(x), m, ci or 0.0) for x, m, ci in pts_ if m is not None)
        if not got:
            continue
        ax.errorbar([p[0] for p in got], [p[1] for p in got],
                    yerr=_errors(panel, [p[1] for p in got], [p[2] for p in got]),
                    marker="o", ms=4, capsize=3, lw=1.3, color=PALETTE[i % len(PALETTE)],
                    label=name)
    for x, text in panel.marks or []:
        ax.axvline(x, color="0.35", ls="--", lw=1.0, label=text)
    if panel.logx:
        ax.set_xscale("log")
    if panel.logy:
        ax.set_yscale("log", nonpositive="clip")
    xs = sorted({float(x) for pts_ in panel.series.values() for x, m, _ in pts_ if m is not None})
    if xs:      # ticks at the measured values, written as they are, none on top of another
        pos = [math.log10(x) if panel.logx and x > 0 else x for x in xs]
        room = 0.06 * ((pos[-1] - pos[0]) or 1.0)
        kept = [0]
        for i in range(1, len(xs)):
            if pos[i] - pos[kept[-1]] >= room:
                kept.append(i)
        ax.set_xticks([xs[i] for i in kept], [f"{xs[i]:g}" for i in kept])
        ax.minorticks_off()
    if panel.min_span is not None:
        lo, hi = ax.get_ylim()
        if hi - lo < panel.min_span:
            mid = (lo + hi) / 2
            ax.set_ylim(mid - panel.min_span / 2, mid + panel.min_span / 2)
    ax.set_xlabel(panel.xlabel)
    ax.set_ylabel(panel.value)
    ax.grid(alpha=0.3, which="both")
    if ax.get_legend_handles_labels()[0]:     # a panel with nothing measured has no legend
        ax.legend(fontsize=7)
