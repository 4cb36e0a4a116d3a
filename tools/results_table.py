"""Run the shipped scenarios one after another and print the results table of docs/results.md.

Each scenario runs through ``fedsim run`` exactly as a user would (its own
processes, real sockets, netem links), one at a time so that no run competes
with another for the two cores; the row is read back from the run's
``summary.json``. Usage::

    python tools/results_table.py                 # every scenario in scenarios/
    python tools/results_table.py dga-digits fedspeed-digits --out runs/table

A run that fails prints its status in the row; the table still comes out.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fedsim.results.writer import read_summary  # noqa: E402 (after the path is set)


def _fmt(x: float | None, spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


def row(name: str, s: dict, sc: dict) -> str:
    """One markdown row from a run's summary.json and resolved scenario.json."""
    st = s.get("staleness") or {}
    stale = "-" if st.get("mean") is None else (
        f"{st['mean']:.2f} / {st['p99']:.0f} / {st['max']:.0f}")
    target = s.get("target_accuracy")
    ttt = "-" if target is None else (
        f"{_fmt(s.get('time_to_target_s'), '.2f')} ({target})"
        if s.get("time_to_target_s") is not None else f"not reached ({target})")
    rounds = f" ({s['rounds']} rounds)" if s.get("rounds") else ""
    fid = s.get("fidelity") or {}
    lat = fid.get("lateness_ms") or {}
    over = (fid.get("compute") or {}).get("overruns", 0)
    verdict = f"{fid.get('verdict', '?')} (p99 {_fmt(lat.get('p99'), '.2f')} ms, overruns {over})"
    if fid.get("verdict") == "fail":
        verdict += f"; suggests dilation {fid.get('suggested_dilation')}"
    status = "" if s["status"] == "completed" else f" **{s['status']}**"
    opt = sc.get("client", {}).get("optimizer", "sgd")
    alg = s["algorithm"] + ("" if opt in ("sgd", "sgdm") else f" + {opt}")
    return (f"| {name} | {alg}{status} | {_fmt(s.get('final_accuracy'))} | "
            f"{_fmt(s.get('best_accuracy'))} | {ttt} | {s['updates']}{rounds} | {stale} | "
            f"{s['emulated_seconds']:.1f} / {s['real_seconds']:.1f} | {verdict} |")


HEADER = (
    "| scenario | algorithm | final acc. | best | time to target (emulated s) | updates | "
    "staleness mean / p99 / max | emulated / real s | fidelity |\n"
    "|---|---|---|---|---|---|---|---|---|"
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help="scenario names (default: all in scenarios/)")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "table",
                    help="parent directory of the run directories")
    args = ap.parse_args(argv)
    names = args.names or sorted(p.stem for p in (ROOT / "scenarios").glob("*.toml"))
    rows = []
    for name in names:
        run_dir = args.out / name
        t0 = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", "fedsim.cli", "run", str(ROOT / "scenarios" / f"{name}.toml"),
             "--out", str(run_dir)], cwd=ROOT, capture_output=True, text=True, check=False)
        took = time.monotonic() - t0
        summary = read_summary(run_dir)  # a killed run reads as interrupted
        if summary is None:
            print(f"{name}: no summary (exit {proc.returncode})\n{proc.stderr[-2000:]}",
                  file=sys.stderr)
            continue
        sc = json.loads((run_dir / "scenario.json").read_text())
        rows.append(row(name, summary, sc))
        print(f"{name}: exit {proc.returncode}, {took:.0f} s wall", file=sys.stderr, flush=True)
    print(HEADER)
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
