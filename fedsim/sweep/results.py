"""What became of each point: its status, verdict and figures, read from its run directory.

Both a running sweep and a finished one (:func:`read_results`) read a point
the same way, from its ``point.json``, ``summary.json`` and ``scenario.json``.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedsim.results.writer import read_summary
from fedsim.sweep.spec import Point, Sweep, SweepError, toml_literal

#: The figures taken from each run's summary.json into the tables: name ->
#: (dotted path in the summary, description).
FIGURES: dict[str, tuple[str, str]] = {
    "final_accuracy": ("final_accuracy", "test accuracy at the end"),
    "best_accuracy": ("best_accuracy", "best test accuracy seen"),
    "final_loss": ("final_loss", "test loss at the end"),
    "time_to_target_s": ("time_to_target_s", "emulated s to the target accuracy"),
    "emulated_seconds": ("emulated_seconds", "emulated s to the end of the run"),
    "real_seconds": ("real_seconds", "real s the run took"),
    "updates": ("updates", "updates aggregated"),
    "rounds": ("rounds", "rounds closed"),
    "bytes_up": ("bytes_up", "bytes clients sent"),
    "bytes_down": ("bytes_down", "bytes the server sent"),
    "staleness_mean": ("staleness.mean", "mean staleness of aggregated updates"),
    "staleness_p99": ("staleness.p99", "p99 staleness"),
    "lateness_p99_ms": ("fidelity.lateness_ms.p99", "p99 delivery lateness (ms)"),
}


@dataclass
class PointResult:
    """What became of one point."""

    point: Point
    run_dir: Path
    status: str                 # completed / failed / interrupted / error / pending
    verdict: str | None         # pass / fail / None (no summary)
    attempts: int
    dilation: float | None
    cores: float | None         # CPU time of its process tree / its real time
    summary: dict[str, Any] | None

    @property
    def counts(self) -> bool:
        """Whether its figures go into the aggregate: completed, faithful, and no client
        work lost (a run that went on without a client whose training failed measured
        another federation than the one asked for; :attr:`lost_work` names it)."""
        return self.status == "completed" and self.verdict == "pass" and not self.lost_runs

    @property
    def lost_runs(self) -> int:
        """Client runs that failed in this run (``summary.json``'s ``lost_work.runs``)."""
        lost = (self.summary or {}).get("lost_work")
        return int(lost.get("runs", 0)) if isinstance(lost, dict) else 0

    @property
    def lost_work(self) -> str | None:
        """What client work was lost, in words (None when none was)."""
        lost = (self.summary or {}).get("lost_work")
        if not self.lost_runs or not isinstance(lost, dict):
            return None
        parts = []
        for cid, causes in (lost.get("by_client") or {}).items():
            reason = (lost.get("first_reason") or {}).get(cid, "")
            parts.append(f"client {cid}: " + ", ".join(f"{k} x{v}" for k, v in causes.items())
                         + (f" ({reason[:160]})" if reason else ""))
        return f"{self.lost_runs} client run(s) failed: " + "; ".join(parts)

    def row(self) -> dict[str, Any]:
        """Its row of sweep.csv."""
        row: dict[str, Any] = {"variant": self.point.variant}
        row.update({k: toml_literal(v) if isinstance(v, (list, dict)) else v
                    for k, v in self.point.grid})
        row.update({"seed": self.point.seed, "status": self.status, "verdict": self.verdict,
                    "attempts": self.attempts, "dilation": self.dilation,
                    "cores": None if self.cores is None else round(self.cores, 3),
                    "lost_runs": self.lost_runs})
        for name in FIGURES:
            row[name] = figure(self.summary, name)
        row["run_dir"] = str(self.run_dir)
        return row


def figure(summary: dict[str, Any] | None, name: str) -> float | None:
    """One figure of a run's summary (None when absent)."""
    node: Any = summary
    for part in FIGURES[name][0].split("."):
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    if isinstance(node, bool) or not isinstance(node, (int, float)):
        return None
    return float(node)


def read_point(run_dir: Path) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads((run_dir / "point.json").read_text())
        return data
    except (OSError, json.JSONDecodeError):
        return None


def point_result(point: Point, run_dir: Path) -> PointResult:
    meta = read_point(run_dir) or {}
    summary = read_summary(run_dir) if run_dir.is_dir() else None
    status = "pending" if summary is None else str(summary.get("status"))
    if summary is None and meta.get("exit_code") not in (None, 0):
        status = "crashed"      # it died before writing a summary: output.log says why
    verdict = None if summary is None else (summary.get("fidelity") or {}).get("verdict")
    dilation = meta.get("dilation")
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        # the dilation the run really used ("auto" resolved)
        dilation = float(json.loads((run_dir / "scenario.json").read_text())["run"]["dilation"])
    return PointResult(point, run_dir, status, verdict, int(meta.get("attempts", 0)),
                       dilation, meta.get("cores"), summary)


def read_results(out: str | Path) -> tuple[Sweep, list[PointResult]]:
    """A sweep directory's spec and every point's state (finished or not)."""
    out = Path(out)
    try:
        sweep = Sweep.from_json(json.loads((out / "sweep.json").read_text()))
    except (OSError, json.JSONDecodeError, KeyError) as exc:
        raise SweepError(f"{out}: not a sweep directory (no readable sweep.json: {exc})") from None
    return sweep, [point_result(p, out / "runs" / p.key) for p in sweep.points()]
