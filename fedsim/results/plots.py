"""Plots of one run: accuracy and loss, staleness, and the per-client timeline.

matplotlib figures made without pyplot: no screen needed, no global state
touched (a notebook keeps its backend; a returned figure displays there), PNGs
written by the Agg renderer. Works on a finished run and on one that was
killed: :func:`fedsim.results.reader.load_run` reads only complete records. Every
figure says what its axes measure and in what unit; emulated seconds are the
federation's own time.
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

import numpy as np
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from fedsim.results.reader import Run, load_run
from fedsim.results.timeline import MAX_CLIENTS, Timeline, build_timeline, sample_clients
from fedsim.scenario.ids import format_ids

#: A font missing from matplotlib's font cache (a stale ~/.cache/matplotlib) falls
#: back to DejaVu Sans with a warning for each font while a figure is drawn, a
#: screen of them under a run's summary; the figure is the same, so :func:`save`
#: quiets this logger while it draws (and only then).
_FONTS = logging.getLogger("matplotlib.font_manager")

if TYPE_CHECKING:
    from matplotlib.axes import Axes

__all__ = ["TIMELINE_AUTO_MAX_BYTES", "accuracy_figure", "loss_scale", "new_figure",
           "plot_accuracy", "plot_run", "plot_staleness", "plot_timeline", "save",
           "staleness_figure", "staleness_values", "timeline_figure", "timeline_is_large",
           "timeline_name"]

TIMELINE_AUTO_MAX_BYTES = 20_000_000
"""A run whose ``events.jsonl`` is larger (about 120,000 records) gets its
timeline only on request (``fedsim plot RUN --timeline``): reading and
drawing takes about 3 s per 100,000 records. Ten emulated minutes of a
shipped scenario write 5-16 MB."""

#: Lane colours (Okabe-Ito, safe for colour-blind readers).
COLOURS = {"download": "#56B4E9", "upload": "#CC79A7", "training": "#009E73",
           "waiting": "#E69F00", "away": "#B0B0B0"}


def new_figure(width: float, height: float, *, dpi: int = 110,
               layout: Literal["constrained", "tight"] | None = None) -> Figure:
    """A figure that belongs to no pyplot state (nothing to close; a notebook's backend kept)."""
    return Figure(figsize=(width, height), dpi=dpi, layout=layout)


def save(fig: Figure, path: Path) -> Path:
    """Write ``fig`` as a PNG to ``path``; return ``path``."""
    level = _FONTS.level
    _FONTS.setLevel(logging.ERROR)
    try:
        fig.savefig(path)
    finally:
        _FONTS.setLevel(level)
    return path


def timeline_is_large(run_dir: Path) -> bool:
    """Whether the run's event log is over :data:`TIMELINE_AUTO_MAX_BYTES` (not read)."""
    path = Path(run_dir) / "events.jsonl"
    return path.exists() and path.stat().st_size > TIMELINE_AUTO_MAX_BYTES


def plot_run(run: Run | str | Path, *, timeline: bool | None = None,
             clients: Iterable[int] | None = None,
             window: tuple[float, float | None] | None = None,
             target: float | None = None, out_dir: str | Path | None = None) -> list[Path]:
    """Draw a run's plots into ``out_dir`` (default: its own directory); return the paths.

    ``accuracy.png`` always; ``staleness.png`` when the run has staleness
    (an asynchronous rule's updates, or DGA's correction delays); the
    timeline when ``timeline`` is True, or when it is None and the run is
    not large (:func:`timeline_is_large`). ``clients`` and ``window`` choose
    the timeline's clients and emulated-time window, and then its file is
    named after them (:func:`timeline_name`: ``timeline-2-6.png``), so that
    a part never replaces the whole run's ``timeline.png``. ``target``
    replaces the scenario's target accuracy on ``accuracy.png``. Raises
    :class:`fedsim.results.reader.RunDirError` for a directory it cannot read.
    """
    if not isinstance(run, Run):
        path = Path(run)
        if timeline is None:
            timeline = not timeline_is_large(path)
        run = load_run(path)
    elif timeline is None:
        timeline = not timeline_is_large(run.path)
    where = run.path if out_dir is None else Path(out_dir)
    where.mkdir(parents=True, exist_ok=True)
    out = [plot_accuracy(run, where / "accuracy.png", target=target)]
    staleness = plot_staleness(run, where / "staleness.png")
    if staleness is not None:
        out.append(staleness)
    if timeline:
        ids = None if clients is None else sorted(set(clients))
        out.append(plot_timeline(run, where / timeline_name(window, ids), clients=ids,
                                 window=window))
    return out


def timeline_name(window: tuple[float, float | None] | None = None,
                  clients: Sequence[int] | None = None) -> str:
    """The timeline's file name: ``timeline.png`` for the whole run, else named after its part.

    ``timeline-2-6.png`` (a window, emulated seconds; ``timeline-30-end.png``
    to the end), ``timeline-clients-0-9,20.png``, or both
    (``timeline-2-6-clients-0-9,20.png``). A list of clients too long for a
    file name is written as its count and a digest of it.
    """
    parts = ["timeline"]
    if window is not None:
        start, end = window
        parts.append(f"{start:g}-{'end' if end is None else format(end, 'g')}")
    if clients is not None:
        ids = format_ids(list(clients))
        if len(ids) > 40:
            ids = f"{len(set(clients))}-{hashlib.sha1(ids.encode()).hexdigest()[:8]}"
        parts.append(f"clients-{ids}")
    return "-".join(parts) + ".png"


# -- accuracy and loss --------------------------------------------------------------------
def _finite(xs: list[float], ys: list[float]) -> tuple[list[float], list[float]]:
    pairs = [(x, y) for x, y in zip(xs, ys, strict=True) if math.isfinite(x) and math.isfinite(y)]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def loss_scale(values: list[float]) -> str:
    """``"log"`` when positive losses span over 20x (a divergence, a long descent), else linear."""
    pos = [v for v in values if v > 0]
    return "log" if pos and max(pos) / min(pos) > 20 else "linear"


def _no_data(ax: Axes, what: str) -> None:
    ax.text(0.5, 0.5, what, ha="center", va="center", transform=ax.transAxes, color="0.4")


def plot_accuracy(run: Run, path: Path, *, target: float | None = None) -> Path:
    """Write ``accuracy.png`` (:func:`accuracy_figure`) to ``path``."""
    return save(accuracy_figure(run, target=target), path)


def accuracy_figure(run: Run, *, target: float | None = None) -> Figure:
    """Test accuracy (top) and test loss (bottom) against emulated time.

    The target accuracy (``target``, else the scenario's, if any) is a
    dashed line, and the first evaluation that reached it is marked with its time.
    """
    fig = new_figure(7.0, 5.6)
    ax, lx = fig.subplots(2, 1, sharex=True, height_ratios=[3, 2])
    t, acc = _finite(run.column("t"), run.column("accuracy"))
    tl, loss = _finite(run.column("t"), run.column("loss"))
    if acc:
        ax.plot(t, acc, marker=".", lw=1.4, color="#0072B2", label="test accuracy")
    else:
        _no_data(ax, "no evaluation recorded")
    if target is None:
        target = run.summary.get("target_accuracy")
    if isinstance(target, int | float):
        ax.axhline(target, color="0.3", ls="--", lw=0.9, label=f"target {target:g}")
        hit = next(((x, a) for x, a in zip(t, acc, strict=True) if a >= target), None)
        if hit is not None:
            ax.plot([hit[0]], [hit[1]], marker="o", ms=8, mfc="none", mec="#D55E00", mew=1.6,
                    ls="", label=f"target reached at {hit[0]:.2f} s")
    ax.set_ylabel("test accuracy")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    final = run.summary.get("final_accuracy")
    best = run.summary.get("best_accuracy")
    scores = ""
    if isinstance(final, int | float) and isinstance(best, int | float):
        scores = f"; final {final:.3f}, best {best:.3f}"
    ax.set_title(f"{run.name} ({run.algorithm}){scores}", fontsize=10)
    if loss:
        lx.plot(tl, loss, marker=".", lw=1.2, color="#D55E00")
        lx.set_yscale(loss_scale(loss))
    else:
        _no_data(lx, "no finite loss recorded")
    lx.set_ylabel("test loss")
    lx.set_xlabel("emulated time (s)")
    lx.grid(alpha=0.3, which="both")
    fig.tight_layout()
    return fig


# -- staleness ------------------------------------------------------------------------------
def staleness_values(run: Run) -> tuple[list[int], str, str] | None:
    """What the staleness plot counts, its axis label and what one value is; None if nothing.

    An asynchronous rule: each applied update's staleness (server versions
    between its download and its aggregation). DGA: each correction's delay
    D (local steps between a client's contribution to a round and the
    correction that round's average brought).
    """
    stale: list[int] = []
    delays: list[int] = []
    for e in run.events:
        if e["ev"] == "aggregate":
            if e.get("stalenesses") is not None:
                stale.extend(int(x) for x in e["stalenesses"])
            elif e.get("staleness") is not None:
                stale.append(int(e["staleness"]))
        elif e["ev"] == "correction" and isinstance(e.get("delay"), int | float):
            delays.append(int(e["delay"]))
    if stale:
        return (stale, "staleness (server versions between download and aggregation)",
                "applied updates")
    if delays:
        return (delays, "DGA delay D (local steps from a contribution to its correction)",
                "corrections")
    return None


def plot_staleness(run: Run, path: Path) -> Path | None:
    """Write ``staleness.png`` (:func:`staleness_figure`); None if the run has no staleness."""
    fig = staleness_figure(run)
    return None if fig is None else save(fig, path)


def staleness_figure(run: Run) -> Figure | None:
    """How often each staleness occurred (:func:`staleness_values`); None when the run has none.

    Counts on a log axis, each bar labelled with its count, so that a value
    that occurred once stays visible beside one that occurred hundreds of times.
    """
    found = staleness_values(run)
    if found is None:
        return None
    values, label, noun = found
    lo = min(values)
    counts = np.bincount(np.asarray(values, dtype=np.int64) - lo)
    idx = np.nonzero(counts)[0]
    fig = new_figure(7.0, 3.8)
    ax = fig.subplots()
    ax.bar(idx + lo, counts[idx], width=0.8, color="#0072B2")
    ax.set_yscale("log")
    ax.set_ylim(0.7, counts.max() * 3.0)
    if len(idx) <= 40:
        for i in idx:
            ax.text(float(i + lo), counts[i] * 1.12, str(counts[i]), ha="center", va="bottom",
                    fontsize=7, zorder=4,
                    bbox={"fc": "white", "ec": "none", "pad": 0.5, "alpha": 0.8})
    arr = np.asarray(values, dtype=float)
    mean, p99 = float(arr.mean()), float(np.percentile(arr, 99))
    ax.axvline(mean, color="k", ls="--", lw=1, label=f"mean {mean:.2f}", zorder=1)
    ax.axvline(p99, color="#D55E00", ls=":", lw=1.2, label=f"p99 {p99:g}", zorder=1)
    ax.legend(fontsize=8, loc="upper left")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel(label)
    ax.set_ylabel("count (log scale)")
    ax.grid(alpha=0.3, axis="y", which="both")
    ax.set_title(f"{run.name} ({run.algorithm}): {len(values)} {noun}, as they really "
                 "occurred", fontsize=10)
    fig.tight_layout()
    return fig


# -- the per-client timeline ------------------------------------------------------------------
#: Each lane's band in a client's row (offsets from the row's centre, rows 1 apart).
_BANDS = {"download": (-0.42, -0.2), "state": (-0.17, 0.17), "upload": (0.2, 0.42)}


def _bars(rows: list[tuple[int, list[tuple[float, float]]]], band: tuple[float, float]
          ) -> np.ndarray:
    """Rectangles (n, 4, 2) for every interval of every row, in one band."""
    spans = [(y, a, b) for y, ivs in rows for a, b in ivs]
    if not spans:
        return np.zeros((0, 4, 2))
    arr = np.asarray(spans, dtype=float)
    y, a, b = arr[:, 0], arr[:, 1], arr[:, 2]
    lo, hi = y + band[0], y + band[1]
    return np.stack([np.stack([a, lo], 1), np.stack([b, lo], 1),
                     np.stack([b, hi], 1), np.stack([a, hi], 1)], axis=1)


def plot_timeline(run: Run, path: Path, *, clients: Iterable[int] | None = None,
                  window: tuple[float, float | None] | None = None,
                  max_clients: int = MAX_CLIENTS) -> Path:
    """``timeline.png``: what every client (or a sample of ``max_clients``) did, when.

    One row per client: downloads above, uploads below, and between them
    training, waiting (at a barrier, or for its update's aggregation) or
    away. Each aggregation of a client's update is a marker on its row,
    coloured by the update's staleness (black: a synchronous round's);
    discarded updates and lost messages are crosses, a failed local run (lost
    client work) a red star with its cause. ``clients`` picks the
    rows (default: all, or a seeded sample of ``max_clients``); ``window``
    = (start, end) in emulated seconds. The staleness colours span the whole
    run's (:attr:`~fedsim.results.timeline.Timeline.staleness_max`) whatever the
    window and clients, so two parts of one run compare by colour.
    """
    total = run.summary.get("clients")
    all_ids: Iterable[int]
    if isinstance(total, int) and total > 0:
        all_ids = range(total)
    else:
        all_ids = {e["client"] for e in run.events if isinstance(e.get("client"), int)}
    ids = sorted(set(clients)) if clients is not None else sample_clients(all_ids, max_clients)
    start, end = window if window is not None else (0.0, None)
    tl = build_timeline(run.events, clients=ids,
                        total_clients=total if isinstance(total, int) else None,
                        start=start, end=end)
    return save(timeline_figure(tl, title=f"{run.name} ({run.algorithm})"), path)


def timeline_figure(tl: Timeline, *, title: str) -> Figure:
    """The picture of :class:`~fedsim.results.timeline.Timeline` ``tl`` (:func:`plot_timeline`)."""
    ids = sorted(tl.clients)
    row = {cid: i for i, cid in enumerate(ids)}
    n = max(1, len(ids))
    fig = new_figure(11.0, 2.4 + 0.3 * n, dpi=100, layout="constrained")
    ax = fig.subplots()
    lanes: list[tuple[str, str, tuple[float, float]]] = [
        ("download", "download", _BANDS["download"]), ("upload", "upload", _BANDS["upload"]),
        ("training", "training", _BANDS["state"]), ("waiting", "waiting", _BANDS["state"]),
        ("away", "away", _BANDS["state"])]
    span = max(tl.end - tl.start, 1e-9)
    for attr, colour, band in lanes:
        rows = [(row[c], getattr(tl.clients[c], attr)) for c in ids]
        verts = _bars(rows, band)
        if not len(verts):
            continue
        # one bar per message: a thin white edge shows where one ends and the next
        # begins, when bars are 4 pixels wide or more (the axis is about 1000 across)
        width_px = float(np.mean(verts[:, 1, 0] - verts[:, 0, 0])) / span * 1000
        edged = attr in ("download", "upload") and width_px >= 4
        # an (n, 4, 2) array is taken as it is (matplotlib's stubs say a sequence)
        polys = cast("Sequence[np.ndarray]", verts)
        ax.add_collection(PolyCollection(polys, facecolors=COLOURS[colour],
                                         edgecolors="white" if edged else "none",
                                         linewidths=0.6 if edged else 0),
                          autolim=False)  # the limits are the window's
    agg = [(t, row[c], s) for c in ids for t, s in tl.clients[c].aggregated]
    # markers shrink (and lose their edges) when a row holds more than ~8 per inch
    per_inch = len(agg) / n / 9.5
    marker_size = max(12.0, min(40.0, 600.0 / n)) if per_inch <= 8 else 6.0
    edge = 0.4 if per_inch <= 8 else 0.0
    stale = [(t, y, s) for t, y, s in agg if s is not None]
    rounds = [(t, y) for t, y, s in agg if s is None]
    scatter = None
    if stale:
        # the whole run's scale: windows and samples of one run compare by colour
        top = tl.staleness_max if tl.staleness_max is not None else max(s for _, _, s in stale)
        smax = max(1, top)
        scatter = ax.scatter([a[0] for a in stale], [a[1] for a in stale],
                             c=[a[2] for a in stale], cmap="viridis", vmin=0, vmax=smax,
                             s=marker_size, marker="o", edgecolors="k", linewidths=edge,
                             zorder=3)
    if rounds:
        ax.scatter([a[0] for a in rounds], [a[1] for a in rounds], s=marker_size * 0.8,
                   marker="D", c="k", linewidths=0, zorder=3)
    discards = [(t, row[c]) for c in ids for t in tl.clients[c].discarded]
    if discards:
        ax.scatter([a[0] for a in discards], [a[1] for a in discards], marker="X",
                   s=marker_size * 1.4, c="#D55E00", edgecolors="k", linewidths=0.4, zorder=4)
    lost = [(t, row[c] + (_BANDS["download"][0] + _BANDS["download"][1]) / 2 if d == "down"
             else row[c] + (_BANDS["upload"][0] + _BANDS["upload"][1]) / 2)
            for c in ids for t, d in tl.clients[c].lost]
    if lost:
        ax.scatter([a[0] for a in lost], [a[1] for a in lost], marker="x", s=marker_size,
                   c="k", linewidths=1.0, zorder=4)
    failed = [(t, row[c], cause) for c in ids for t, cause in tl.clients[c].failed]
    if failed:
        ax.scatter([a[0] for a in failed], [a[1] for a in failed], marker="*",
                   s=marker_size * 3.0, c="#CC0000", edgecolors="k", linewidths=0.5, zorder=5)
        for t, y, cause in failed:
            ax.annotate(f"run failed: {cause}", (t, y), xytext=(4, -6),
                        textcoords="offset points", fontsize=7, color="#CC0000", zorder=5)
    ax.set_xlim(tl.start, max(tl.end, tl.start + 1e-3))
    ax.set_ylim(n - 0.5, -0.5)
    ax.set_yticks(range(len(ids)))
    ax.set_yticklabels([str(c) for c in ids], fontsize=7 if n > 20 else 8)
    ax.set_ylabel("client")
    ax.set_xlabel("emulated time (s)")
    ax.grid(alpha=0.25, axis="x")
    shown = (f"all {len(ids)} clients" if len(ids) == tl.total_clients
             else f"{len(ids)} of {tl.total_clients} clients")
    ax.set_title(f"{title}: what each client did ({shown})", fontsize=10)
    handles: list[Any] = [
        Patch(color=COLOURS["download"], label="download (server to client)"),
        Patch(color=COLOURS["training"], label="training"),
        Patch(color=COLOURS["upload"], label="upload (client to server)"),
        Patch(color=COLOURS["waiting"], label="waiting (barrier, or update not yet applied)"),
        Patch(color=COLOURS["away"], label="away (off or suspended)")]
    if stale:
        handles.append(Line2D([], [], ls="", marker="o", mfc="#21918c", mec="k", mew=0.4,
                              label="update aggregated (colour: staleness)"))
    if rounds:
        handles.append(Line2D([], [], ls="", marker="D", color="k", label="update aggregated "
                              "(round)"))
    if discards:
        handles.append(Line2D([], [], ls="", marker="X", mfc="#D55E00", mec="k",
                              label="update discarded"))
    if lost:
        handles.append(Line2D([], [], ls="", marker="x", color="k", label="message lost"))
    if failed:
        handles.append(Line2D([], [], ls="", marker="*", mfc="#CC0000", mec="k", ms=10,
                              label="local run failed (lost work; client dropped)"))
    fig.legend(handles=handles, loc="outside lower center", ncol=4, fontsize=8, frameon=False)
    if scatter is not None:
        cb = fig.colorbar(scatter, ax=ax, pad=0.01, fraction=0.03, aspect=30)
        cb.set_label("staleness of the aggregated update")
    return fig
