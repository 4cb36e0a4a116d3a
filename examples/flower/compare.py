"""Draw docs/flower/curves.png: the same Flower app's accuracy against time, three ways.

    python examples/flower/compare.py FLOWER_CSV LAN_RUN WIFI_RUN [--out PNG]

FLOWER_CSV is run_flower.py's output (Flower's own simulation: wall-clock
seconds, no network); LAN_RUN and WIFI_RUN are the run directories of
``fedsim run examples/flower/lan.toml`` and ``wifi.toml`` (emulated seconds:
what the app would take on those networks; fedsim's own evaluation of each
round's model, metrics.csv).
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

ROOT = Path(__file__).resolve().parents[2]


def _rows(path: Path, x: str, y: str) -> tuple[list[float], list[float]]:
    with path.open() as fh:
        rows = [r for r in csv.DictReader(fh) if r.get(y) not in (None, "")]
    return [float(r[x]) for r in rows], [float(r[y]) for r in rows]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("flower_csv", type=Path)
    ap.add_argument("lan_run", type=Path)
    ap.add_argument("wifi_run", type=Path)
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "flower" / "curves.png")
    args = ap.parse_args()
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    x, y = _rows(args.flower_csv, "seconds", "accuracy")
    ax.plot(x, y, marker=".", label="Flower's simulation (real s, no network)")
    for run, label in ((args.lan_run, "fedsim, lan (emulated s)"),
                       (args.wifi_run, "fedsim, wifi-building (emulated s)")):
        x, y = _rows(run / "metrics.csv", "t", "accuracy")
        ax.plot(x, y, marker=".", label=label)
    ax.set_xscale("symlog", linthresh=1.0)
    ax.set_xlabel("seconds (log scale above 1)")
    ax.set_ylabel("test accuracy")
    ax.set_title("The same Flower app (FedAvg, 10 of 20 clients a round, 30 rounds)")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
