"""Plots of a run directory: accuracy vs emulated time, staleness histogram.

matplotlib with the Agg backend (no screen needed). Works on a finished run
and on one that was killed: it reads only complete records.
"""

from __future__ import annotations

import math
from pathlib import Path

from fedsim.metrics import read_events, read_metrics

__all__ = ["plot_run"]


def plot_run(run_dir: Path) -> list[Path]:
    """Write ``accuracy.png`` and ``staleness.png``; return the paths written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    out: list[Path] = []
    metrics = run_dir / "metrics.csv"
    rows = read_metrics(metrics) if metrics.exists() else []
    rows = [r for r in rows if not math.isnan(r.get("accuracy", math.nan))]
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=110)
    if rows:
        ax.plot([r["t"] for r in rows], [r["accuracy"] for r in rows], marker=".", lw=1.2)
    ax.set_xlabel("emulated time (s)")
    ax.set_ylabel("test accuracy")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.set_title(f"{run_dir.name}: accuracy vs emulated time", fontsize=10)
    fig.tight_layout()
    path = run_dir / "accuracy.png"
    fig.savefig(path)
    plt.close(fig)
    out.append(path)

    staleness: list[int] = []
    events = run_dir / "events.jsonl"
    if events.exists():
        for e in read_events(events):
            if e.get("ev") != "aggregate":
                continue
            if e.get("stalenesses") is not None:
                staleness.extend(int(x) for x in e["stalenesses"])
            elif e.get("staleness") is not None:
                staleness.append(int(e["staleness"]))
    if staleness:
        top = max(staleness)
        ax.hist(staleness, bins=range(0, top + 2), align="left", rwidth=0.85)
        mean = sum(staleness) / len(staleness)
        ax.axvline(mean, color="k", ls="--", lw=1, label=f"mean {mean:.2f}")
        ax.legend()
    else:
        ax.text(0.5, 0.5, "no asynchronous updates", ha="center", transform=ax.transAxes)
    ax.set_xlabel("staleness (server versions between download and upload)")
    ax.set_ylabel("updates")
    ax.grid(alpha=0.3, axis="y")
    ax.set_title(f"{run_dir.name}: staleness that really occurred", fontsize=10)
    fig.tight_layout()
    path = run_dir / "staleness.png"
    fig.savefig(path)
    plt.close(fig)
    out.append(path)
    return out
