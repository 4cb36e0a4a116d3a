"""A sweep's figures: each against the x grid key, one line per variant, CI error bars."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedsim.sweep.results import FIGURES
from fedsim.sweep.spec import Sweep, SweepError, short_key


def default_figures(sweep: Sweep) -> list[str]:
    ys = ["final_accuracy", "emulated_seconds"]
    if sweep.target_accuracy is not None:
        ys.append("time_to_target_s")
    return ys


def plot_sweep(sweep: Sweep, out: Path, agg: list[dict[str, Any]]) -> list[Path]:
    """One figure per y: y against the x grid key, a line per variant (and other grid keys)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = sweep.plot.get("x") or next((k for k, v in sweep.grid.items()
                                     if len(v) > 1 and all(_is_num(a) for a in v)), None)
    if x is None:
        return []
    if x not in sweep.grid:
        raise SweepError(f"sweep.plot.x = {x!r} is not a grid key ({', '.join(sweep.grid)})")
    ys = sweep.plot.get("y") or default_figures(sweep)
    bad = [y for y in ys if y not in FIGURES]
    if bad:
        raise SweepError(f"sweep.plot.y: unknown figure {bad[0]!r} (known: {', '.join(FIGURES)})")
    xs_all = [float(v) for v in sweep.grid[x]]
    logx = sweep.plot.get("logx")
    if logx is None:
        pos = [v for v in xs_all if v > 0]
        logx = bool(pos) and len(pos) == len(xs_all) and max(pos) / min(pos) > 100
    others = [k for k in sweep.grid if k != x]
    norm = sweep.plot.get("normalize")
    files = []
    for y in ys:
        lines: dict[str, list[tuple[float, float, float]]] = {}
        for row in agg:
            m = row.get(f"{y}_mean")
            if m is None:
                continue
            name = ", ".join([row["variant"]] * bool(row["variant"])
                             + [f"{short_key(k)}={row[k]}" for k in others])
            lines.setdefault(name or y, []).append((float(row[x]), m, row.get(f"{y}_ci95") or 0.0))
        if not lines:
            continue
        scale = 1.0
        label = FIGURES[y][1]
        if norm and y in _TIMES:   # accuracies and losses keep their own scale
            ref = sorted(next((v for k, v in lines.items() if k.split(",")[0] == norm), []))
            if ref and ref[0][1]:
                scale = ref[0][1]
                label += f"\n(relative to {norm} at {short_key(x)} = {ref[0][0]:g})"
        fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=110)
        for name, pts in lines.items():
            pts.sort()
            ax.errorbar([p[0] for p in pts], [p[1] / scale for p in pts],
                        yerr=[p[2] / scale for p in pts], marker="o", ms=4, capsize=3, lw=1.3,
                        label=name)
        if logx:
            ax.set_xscale("log")
        ax.set_xlabel(x)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3, which="both")
        n = max((r["n"] for r in agg), default=0)
        ax.set_title(f"{sweep.name}: {y} (mean, 95 % CI over up to {n} seeds)", fontsize=9)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = out / f"{y}.png"
        fig.savefig(path)
        plt.close(fig)
        files.append(path)
    return files


#: the figures ``plot.normalize`` divides (times: a ratio reads as a speedup)
_TIMES = ("emulated_seconds", "time_to_target_s", "real_seconds")


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)
