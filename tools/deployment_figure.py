"""Draw docs/img/deployment.png: a fedsim federation across machines, as boxes and arrows.

The figure is a schematic of what docs/deployment.md and docs/architecture.md
("Processes", "Connection model") describe, and nothing more:

* the server machine runs ``fedsim server``: one process with one event loop
  holding the ZeroMQ ROUTER (a CURVE server whose ZAP handler admits only the
  keys in ``allowed.toml``), the algorithm's server side, the clients'
  emulated uplinks and its copies of their downlinks (netem applies a
  client's links on the receiving side), and the event log, summary and
  checkpoints it writes to the run directory; evaluation runs in a torch
  worker process of its own (started from scratch: the zygote the workers
  fork from is ``fedsim run``'s alone);
* each client machine runs ``fedsim clients --ids ...``: one client host
  process, one event loop with many client actors (each with its device
  speed, its availability and its emulated downlink) that never imports
  torch, and one torch trainer worker that trains their tasks;
* every host opens one TCP connection to the server's port, encrypted and
  authenticated with CURVE: a host's identity is its key, and it speaks only
  for the client ids the allow-list gives that key;
* ``fedsim slurm`` writes one batch job that starts all of it.

The axes span the whole figure in pixel units (900 x 420 at 100 dpi), so
every position below is a pixel of the PNG. No mathtext (no dollar signs):
a stale font cache makes matplotlib warn when it builds one.

Run it from the repository root (about a second)::

    .venv/bin/python tools/deployment_figure.py                 # docs/img/deployment.png
    .venv/bin/python tools/deployment_figure.py --out /tmp/d.png
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch
from matplotlib.path import Path as MplPath
from matplotlib.text import Text

from fedsim.results.plots import new_figure, save

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "docs" / "img" / "deployment.png"

WIDTH, HEIGHT, DPI = 900, 420, 100

# a restrained palette: one hue per kind of thing
SERVER_EDGE, SERVER_FILL = "#3f5f7f", "#eef3f8"
HOST_EDGE, HOST_FILL = "#56703f", "#f1f5ec"
TORCH_EDGE, TORCH_FILL = "#a8722f", "#fbf1e3"
DISK_EDGE, DISK_FILL = "#707070", "#f5f5f5"
WIRE = "#2d6b6b"
INK = "#222222"
MUTED = "#555555"

#: the client machines drawn: (host name, its client ids)
HOSTS = (("host-0", "0-49"), ("host-1", "50-99"), ("host-2", "100-149"))


def _box(ax: Axes, x: float, y: float, w: float, h: float, *, edge: str, fill: str,
         lw: float = 1.0, style: str = "-", radius: float = 6.0) -> FancyBboxPatch:
    """A rounded box with its lower left corner at (x, y), in pixels."""
    patch = FancyBboxPatch((x, y), w, h, boxstyle=f"round,pad=0,rounding_size={radius}",
                           facecolor=fill, edgecolor=edge, linewidth=lw, linestyle=style)
    ax.add_patch(patch)
    return patch


def _text(ax: Axes, x: float, y: float, s: str, *, size: float = 7.5, weight: str = "normal",
          mono: bool = False, color: str = INK, ha: str = "left", va: str = "center",
          linespacing: float = 1.25) -> Text:
    return ax.text(x, y, s, fontsize=size, fontweight=weight, color=color, ha=ha, va=va,
                   family="monospace" if mono else "sans-serif", linespacing=linespacing)


def _arrow(ax: Axes, start: tuple[float, float], end: tuple[float, float], *, color: str,
           both: bool = False, lw: float = 1.2) -> None:
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle="<|-|>" if both else "-|>",
                                 mutation_scale=9, color=color, linewidth=lw,
                                 shrinkA=0, shrinkB=0))


def _server(ax: Axes) -> tuple[float, float, float, float]:
    """The server machine; returns the ROUTER's box (x, y, w, h)."""
    _box(ax, 12, 58, 350, 322, edge=SERVER_EDGE, fill=SERVER_FILL, lw=1.4, radius=8)
    _text(ax, 24, 366, "server machine", size=9, weight="bold", color=SERVER_EDGE)
    _text(ax, 24, 344, "fedsim server SCENARIO --keys DIR\n    --bind tcp://0.0.0.0:5555",
          size=7, mono=True, linespacing=1.2)

    # the server process: one event loop
    _box(ax, 24, 150, 326, 174, edge=SERVER_EDGE, fill="white", lw=1.1)
    _text(ax, 34, 311, "server process: one event loop", size=8, weight="bold")
    parts = (
        (266, 34, "algorithm's server side\n(tasks, aggregation)"),
        (214, 38, "clients' uplinks (netem) and\ncopies of their downlinks"),
        (160, 44, "event log, summary and\ncheckpoints (writer thread)"),
    )
    for y, h, label in parts:
        _box(ax, 34, y, 190, h, edge="#9fb3c8", fill=SERVER_FILL, radius=4)
        _text(ax, 44, y + h / 2, label, size=7.5)

    router = (234, 160, 106, 104)
    x, y, w, h = router
    _box(ax, x, y, w, h, edge=WIRE, fill="#e4f0f0", lw=1.2, radius=4)
    _text(ax, x + w / 2, y + h - 22, "ZeroMQ\nROUTER", size=8.5, weight="bold", color=WIRE,
          ha="center")
    _text(ax, x + w / 2, y + 28, "CURVE server,\nZAP handler:\nallow-list", size=7,
          ha="center")

    # the evaluator and the run directory
    _box(ax, 24, 70, 136, 62, edge=TORCH_EDGE, fill=TORCH_FILL, lw=1.1)
    _text(ax, 92, 101, "evaluator\ntorch worker process\n(evaluates the model)", size=7.5,
          ha="center")
    _arrow(ax, (92, 150), (92, 132), color=MUTED, both=True)
    _box(ax, 170, 70, 180, 62, edge=DISK_EDGE, fill=DISK_FILL, lw=1.0, style="--")
    _text(ax, 179, 118, "run directory", size=7.5, weight="bold", color=MUTED)
    _text(ax, 179, 90, "events.jsonl  metrics.csv\nsummary.json  checkpoint.pt", size=7,
          mono=True)
    _arrow(ax, (204, 160), (204, 132), color=MUTED)
    return router


def _host(ax: Axes, y0: float, name: str, ids: str) -> tuple[float, float]:
    """One client machine with its lower edge at ``y0``; returns where its connection
    leaves the host process (the process box's left edge, halfway up)."""
    x0, w, h = 530, 358, 100
    _box(ax, x0, y0, w, h, edge=HOST_EDGE, fill=HOST_FILL, lw=1.4, radius=8)
    _text(ax, x0 + 10, y0 + h - 12, f"client machine ({name})", size=8.5, weight="bold",
          color=HOST_EDGE)
    _text(ax, x0 + 10, y0 + h - 27, f"fedsim clients SCENARIO --ids {ids} --name {name} ...",
          size=7, mono=True)

    # the client host process: one event loop, many client actors, no torch
    px, py, pw, ph = x0 + 10, y0 + 7, 244, 56
    _box(ax, px, py, pw, ph, edge=HOST_EDGE, fill="white", lw=1.1)
    _text(ax, px + 8, py + ph - 10, "client host process: one event loop", size=7.5,
          weight="bold")
    # a stack of client actors: cards drawn back to front
    for k in (2, 1):
        _box(ax, px + 8 + 3 * k, py + 5 + 3 * k, 224, 27, edge="#9db38a", fill=HOST_FILL,
             radius=3)
    _box(ax, px + 8, py + 5, 224, 27, edge="#9db38a", fill="white", radius=3)
    _text(ax, px + 14, py + 18.5,
          f"client actors {ids}, each: device speed,\navailability, its downlink (netem)",
          size=7, linespacing=1.15)

    # the torch trainer
    tx, tw = px + pw + 14, 80
    _box(ax, tx, py, tw, ph, edge=TORCH_EDGE, fill=TORCH_FILL, lw=1.1)
    _text(ax, tx + tw / 2, py + ph / 2, "trainer\ntorch worker\nprocess", size=7.5,
          ha="center")
    _arrow(ax, (px + pw, py + ph / 2), (tx, py + ph / 2), color=MUTED, both=True)
    return px, py + ph / 2


def figure() -> Figure:
    """The whole schematic, on a Figure of its own (Agg canvas)."""
    fig = new_figure(WIDTH / DPI, HEIGHT / DPI, dpi=DPI)
    FigureCanvasAgg(fig)
    ax = fig.add_axes((0.0, 0.0, 1.0, 1.0))
    ax.set_xlim(0, WIDTH)
    ax.set_ylim(0, HEIGHT)
    ax.set_axis_off()

    _text(ax, WIDTH / 2, 402, "A fedsim federation across machines", size=11.5,
          weight="bold", ha="center")

    rx, ry, rw, rh = _server(ax)
    hosts = [_host(ax, 280 - 111 * i, name, ids) for i, (name, ids) in enumerate(HOSTS)]

    # one TCP connection per host, opened by the host, to the ROUTER
    for i, start in enumerate(hosts):
        end = (rx + rw, ry + rh - 18 - i * (rh - 36) / (len(hosts) - 1))
        _arrow(ax, start, end, color=WIRE, both=True, lw=1.5)
    _text(ax, 446, 348, "ZeroMQ over TCP + CURVE:\none connection per host\n"
          "(its DEALER to the ROUTER),\nopened by the host", size=7.5, color=WIRE, ha="center")
    _text(ax, 372, 80, "a host's identity is its\nkey; allowed.toml lists\n"
          "the client ids each key\nmay speak for, no others", size=7.5, color=WIRE)

    # fedsim slurm: one batch job for all of it
    _box(ax, 12, 8, 876, 42, edge=MUTED, fill="white", lw=1.0, style="--", radius=6)
    command = _text(ax, 22, 37, "fedsim slurm SCENARIO --hosts N --run-dir DIR ...", size=7,
                    mono=True)
    right = command.get_window_extent().x1  # pixels = data units
    _text(ax, right + 6, 37, "writes one batch job for all of this:", size=7.5)
    _text(ax, 22, 21,
          "it makes the keys in DIR/keys and runs two job steps side by side: the server "
          "on the job's first node, and the N client hosts (host-r with the r-th range "
          "of client ids).", size=7.5)
    return fig


def text_overlaps(fig: Figure) -> list[str]:
    """What would make the drawing unreadable, in words (an empty list when clean).

    Texts outside the canvas; two texts whose drawn extents overlap; an arrow
    through a text; a text not wholly inside the innermost box its anchor is in
    (with a 2-pixel margin), or, anchored in no box, reaching into one.
    """
    texts = [t for ax in fig.axes for t in ax.texts if t.get_text()]
    extents = [t.get_window_extent() for t in texts]
    patches = [p for ax in fig.axes for p in ax.patches]
    arrows = [p for p in patches if isinstance(p, FancyArrowPatch)]
    boxes = [p.get_window_extent() for p in patches if isinstance(p, FancyBboxPatch)]
    problems = []
    for a in arrows:
        # the shaft and the heads, as open polylines in pixels (to_polygons honours the
        # path's codes; the raw vertices hold a CLOSEPOLY's placeholder at the origin)
        lines = [MplPath(xy) for xy in a.get_path().transformed(a.get_transform())
                 .to_polygons(closed_only=False)]
        problems += [f"an arrow crosses {t.get_text()!r}"
                     for t, e in zip(texts, extents, strict=True)
                     if any(line.intersects_bbox(e, filled=False) for line in lines)]
    for t, e in zip(texts, extents, strict=True):
        anchor = t.get_transform().transform(t.get_position())
        around = [(b.width * b.height, -i, b) for i, b in enumerate(boxes)
                  if b.contains(*anchor)]
        if around:
            box = min(around, key=lambda k: (k[0], k[1]))[2]
            if not box.padded(-2).containsx(e.x0) or not box.padded(-2).containsx(e.x1) \
                    or not box.padded(-2).containsy(e.y0) or not box.padded(-2).containsy(e.y1):
                problems.append(f"{t.get_text()!r} spills out of its box")
        elif any(e.overlaps(b) for b in boxes):
            problems.append(f"{t.get_text()!r} reaches into a box")
    for i, (t, e) in enumerate(zip(texts, extents, strict=True)):
        if e.x0 < 0 or e.y0 < 0 or e.x1 > fig.bbox.width or e.y1 > fig.bbox.height:
            problems.append(f"outside the canvas: {t.get_text()!r}")
        for u, f in zip(texts[i + 1:], extents[i + 1:], strict=True):
            if e.overlaps(f):
                problems.append(f"{t.get_text()!r} overlaps {u.get_text()!r}")
    return problems


def draw(path: Path = DEFAULT_OUT) -> Path:
    """Draw the schematic to ``path`` (a PNG, 900 x 420 pixels); return ``path``."""
    fig = figure()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return save(fig, path)


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``--out PATH`` (default docs/img/deployment.png)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="PNG to write")
    args = ap.parse_args(argv)
    print(f"wrote {draw(args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
