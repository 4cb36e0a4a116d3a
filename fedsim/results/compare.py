"""Several runs side by side: overlay plots and a comparison table.

``fedsim compare RUN RUN ...`` (and ``fedsim plot`` with several runs)
draws, into one directory:

* ``compare-time.png``: test accuracy and test loss against emulated time;
* ``compare-progress.png``: test accuracy against the work done, in rounds
  when every run is round-based and in client updates applied otherwise;
* ``compare-bytes.png``: test accuracy against the megabytes communicated
  (up and down);

each with the target accuracy as a dashed line and each run's first
evaluation at or above it marked; and writes ``compare.csv``, the table
that :func:`format_table` prints. Runs of different tasks (another dataset,
partition, client count or model: accuracies that do not compare) are
named by :func:`task_differences`; :func:`comparison_warnings` says so,
and names a run whose task it cannot check, as the command line prints it.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import matplotlib

from fedsim.results.plots import loss_scale, new_figure, save
from fedsim.results.reader import Run
from fedsim.results.report import format_value
from fedsim.scenario import unread_task_keys

__all__ = ["TASK_TABLES", "ComparisonRow", "comparison_rows", "comparison_warnings",
           "default_labels", "format_table", "plot_comparison", "shared_target",
           "task_differences", "time_to_target", "write_csv"]

#: The scenario tables that make a run's task (its data, their split over
#: the clients, the model): runs that differ in a key of them that both read
#: learn different problems, and their accuracies do not compare.
TASK_TABLES = ("data", "model")


@dataclass(frozen=True, slots=True)
class ComparisonRow:
    """One run's line of the comparison table.

    ``time_to_target`` is the emulated time of the first evaluation at or
    above the target (None: not reached, or no target); ``megabytes`` counts
    both directions; ``staleness_mean``/``staleness_p99`` are None for a
    run without asynchronous updates; ``fidelity`` is the run's verdict
    (``pass``/``fail``, ``-`` if it has none).
    """

    run: str
    algorithm: str
    status: str
    final_accuracy: float | None
    best_accuracy: float | None
    target: float | None
    time_to_target: float | None
    updates: int
    rounds: int
    megabytes: float
    staleness_mean: float | None
    staleness_p99: float | None
    fidelity: str
    emulated_seconds: float | None


def default_labels(runs: Sequence[Run]) -> list[str]:
    """Each run's directory name, or ``parent/name`` where two names are equal."""
    names = [r.path.name for r in runs]
    if len(set(names)) == len(names):
        return names
    longer = [f"{r.path.parent.name}/{r.path.name}" for r in runs]
    if len(set(longer)) == len(longer):
        return longer
    return [str(r.path) for r in runs]


def shared_target(runs: Sequence[Run]) -> float | None:
    """The runs' target accuracy if they all have the same one, else None."""
    targets = {r.summary.get("target_accuracy") for r in runs}
    if len(targets) == 1:
        (t,) = targets
        return float(t) if isinstance(t, int | float) else None
    return None


def _task(scenario: Mapping[str, Any]) -> dict[str, str]:
    """The task keys a resolved scenario sets and reads, each value as JSON."""
    data, model = scenario.get("data"), scenario.get("model")
    data = data if isinstance(data, Mapping) else {}
    model = model if isinstance(model, Mapping) else {}
    unread = unread_task_keys(str(data.get("dataset")), str(data.get("partition")),
                              str(model.get("name")))
    out = {}
    for table in TASK_TABLES:
        section = scenario.get(table)
        if not isinstance(section, Mapping):
            continue
        for key, value in section.items():
            dotted = f"{table}.{key}"
            if dotted not in unread:
                out[dotted] = json.dumps(value, sort_keys=True)
    return out


def task_differences(runs: Sequence[Run], labels: Sequence[str]) -> list[str]:
    """How the runs' tasks differ: one line per key, each value with the runs that have it.

    A key is compared over the runs whose ``scenario.json`` sets it and
    whose dataset, partition and model read it
    (:func:`fedsim.scenario.unread_task_keys`):
    ``data.num_clients: 20 (a, b), 8 (c)``. Empty: one task (a run without
    a ``scenario.json``, ``run.scenario`` None, is left out).
    """
    known = [(label, _task(run.scenario)) for run, label in zip(runs, labels, strict=True)
             if isinstance(run.scenario, Mapping)]
    lines = []
    for key in dict.fromkeys(k for _, task in known for k in task):
        groups: dict[str, list[str]] = {}
        for label, task in known:
            if key in task:
                groups.setdefault(task[key], []).append(label)
        if len(groups) > 1:
            lines.append(f"{key}: " + ", ".join(f"{_shown(v)} ({', '.join(names)})"
                                                for v, names in groups.items()))
    return lines


def comparison_warnings(runs: Sequence[Run], labels: Sequence[str]) -> list[str]:
    """What to say beside the table of ``runs``: each warning a message of its own.

    One that names how the runs' tasks differ (:func:`task_differences`;
    their accuracies do not compare), then one per run without a
    ``scenario.json`` (its task is not checked). Empty: nothing to say.
    """
    differences = task_differences(runs, labels)
    out = []
    if differences:
        out.append("warning: these runs learn different tasks, so their accuracies do not "
                   "compare:\n  " + "\n  ".join(differences))
    for run, label in zip(runs, labels, strict=True):
        if run.scenario is None:
            out.append(f"warning: {label} has no scenario.json: whether its task is the "
                       "others' is not checked")
    return out


def _shown(value: str) -> str:
    """A JSON value as a scenario file writes it (strings without quotes)."""
    v = json.loads(value)
    return v if isinstance(v, str) else "none" if v is None else value


def _evaluations(run: Run) -> list[dict[str, float]]:
    return [row for row in run.metrics
            if math.isfinite(row.get("t", math.nan))
            and math.isfinite(row.get("accuracy", math.nan))]


def time_to_target(run: Run, target: float) -> dict[str, float] | None:
    """The first evaluation (a metrics row) at or above ``target``; None if none."""
    return next((row for row in _evaluations(run) if row["accuracy"] >= target), None)


def _number(x: Any) -> float | None:
    return float(x) if isinstance(x, int | float) and not isinstance(x, bool) else None


def comparison_rows(runs: Sequence[Run], labels: Sequence[str],
                    target: float | None) -> list[ComparisonRow]:
    """One :class:`ComparisonRow` per run (``labels`` in the same order)."""
    rows = []
    for run, label in zip(runs, labels, strict=True):
        s = run.summary
        evals = _evaluations(run)
        final = _number(s.get("final_accuracy"))
        best = _number(s.get("best_accuracy"))
        if final is None and evals:
            final = evals[-1]["accuracy"]
        if best is None and evals:
            best = max(row["accuracy"] for row in evals)
        hit = time_to_target(run, target) if target is not None else None
        up, down = _number(s.get("bytes_up")), _number(s.get("bytes_down"))
        if up is None and evals:
            up, down = evals[-1].get("bytes_up", 0.0), evals[-1].get("bytes_down", 0.0)
        st = s.get("staleness") or {}
        rows.append(ComparisonRow(
            run=label, algorithm=run.algorithm, status=run.status,
            final_accuracy=final, best_accuracy=best, target=target,
            time_to_target=hit["t"] if hit is not None else None,
            updates=int(_number(s.get("updates")) or (evals[-1]["updates"] if evals else 0)),
            rounds=int(_number(s.get("rounds")) or 0),
            megabytes=((up or 0.0) + (down or 0.0)) / 1e6,
            staleness_mean=_number(st.get("mean")), staleness_p99=_number(st.get("p99")),
            fidelity=str((s.get("fidelity") or {}).get("verdict", "-")),
            emulated_seconds=_number(s.get("emulated_seconds"))))
    return rows


def _cells(r: ComparisonRow) -> list[str]:
    ttt = ("-" if r.target is None else "not reached" if r.time_to_target is None
           else f"{r.time_to_target:.2f}")
    return [r.run, r.algorithm, r.status, format_value(r.final_accuracy, ".4f"),
            format_value(r.best_accuracy, ".4f"), ttt, str(r.updates), str(r.rounds),
            f"{r.megabytes:.1f}", format_value(r.staleness_mean, ".2f"),
            format_value(r.staleness_p99, "g"),
            r.fidelity]


def format_table(rows: Sequence[ComparisonRow]) -> str:
    """The rows as an aligned text table (``-``: no value)."""
    target = next((r.target for r in rows if r.target is not None), None)
    head = ["run", "algorithm", "status", "final acc", "best acc",
            f"time to {target:g} (s)" if target is not None else "time to target",
            "updates", "rounds", "MB", "staleness mean", "p99", "fidelity"]
    body = [_cells(r) for r in rows]
    widths = [max(len(x) for x in col) for col in zip(head, *body, strict=True)]
    left = {0, 1, 2, 11}

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) if i in left else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths, strict=True))).rstrip()

    return "\n".join([line(head), *(line(b) for b in body)])


def write_csv(rows: Sequence[ComparisonRow], path: Path) -> Path:
    """Write the rows as CSV (one column per :class:`ComparisonRow` field; empty: no value)."""
    fields = list(ComparisonRow.__dataclass_fields__)
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=fields)
        w.writeheader()
        for r in rows:
            w.writerow({k: "" if v is None else v for k, v in asdict(r).items()})
    return path


_STYLES = ("-", "--", "-.", ":")


def plot_comparison(runs: Sequence[Run], labels: Sequence[str], out_dir: Path,
                    target: float | None) -> list[Path]:
    """Draw the overlay figures of ``runs`` into ``out_dir``; return the paths written."""
    colours = matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]
    by_rounds = all(run.summary.get("rounds") for run in runs)
    work_key, work_label = (("round", "rounds") if by_rounds
                            else ("updates", "client updates applied"))
    series = []
    for i, (run, label) in enumerate(zip(runs, labels, strict=True)):
        evals = _evaluations(run)
        style = {"color": colours[i % len(colours)], "ls": _STYLES[(i // len(colours)) % 4],
                 "lw": 1.5, "label": label}
        hit = time_to_target(run, target) if target is not None else None
        series.append((evals, style, hit))
    paths = []

    fig = new_figure(8.0, 6.4)
    ax, lx = fig.subplots(2, 1, sharex=True, height_ratios=[3, 2])
    losses: list[float] = []
    for evals, style, hit in series:
        ax.plot([r["t"] for r in evals], [r["accuracy"] for r in evals], **style)
        pts = [(r["t"], r["loss"]) for r in evals if math.isfinite(r.get("loss", math.nan))]
        lx.plot([p[0] for p in pts], [p[1] for p in pts], **style)
        losses += [p[1] for p in pts]
        if hit is not None:
            ax.plot([hit["t"]], [hit["accuracy"]], marker="o", ms=7, mfc="none",
                    mec=style["color"], mew=1.6, ls="")
    lx.set_yscale(loss_scale(losses))
    lx.set_ylabel("test loss")
    lx.set_xlabel("emulated time (s)")
    lx.grid(alpha=0.3, which="both")
    _accuracy_axes(ax, target, "test accuracy against emulated time")
    fig.tight_layout()
    paths.append(save(fig, out_dir / "compare-time.png"))

    for name, key, xlabel, scale in (
            ("compare-progress.png", work_key, work_label, 1.0),
            ("compare-bytes.png", "bytes", "megabytes communicated (up + down)", 1e-6)):
        fig = new_figure(8.0, 4.4)
        ax = fig.subplots()
        for evals, style, hit in series:
            ax.plot([_x(r, key) * scale for r in evals], [r["accuracy"] for r in evals], **style)
            if hit is not None:
                ax.plot([_x(hit, key) * scale], [hit["accuracy"]], marker="o", ms=7,
                        mfc="none", mec=style["color"], mew=1.6, ls="")
        ax.set_xlabel(xlabel)
        _accuracy_axes(ax, target, f"test accuracy against {xlabel}")
        fig.tight_layout()
        paths.append(save(fig, out_dir / name))
    return paths


def _x(row: dict[str, float], key: str) -> float:
    if key == "bytes":
        return row.get("bytes_up", 0.0) + row.get("bytes_down", 0.0)
    return row.get(key, math.nan)


def _accuracy_axes(ax: Any, target: float | None, title: str) -> None:
    if target is not None:
        ax.axhline(target, color="0.3", ls="--", lw=0.9,
                   label=f"target {target:g} (o: first reached)")
    ax.set_ylabel("test accuracy")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title(title, fontsize=10)
