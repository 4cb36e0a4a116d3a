"""Draw docs/img/netem-profiles.png: how long a model message takes on netem's profiles.

For six named profiles spanning the range (``lan``, ``cable``, ``dsl``, ``4g``,
``wifi-floor``, ``satellite-geo``; netem/profiles.py), the figure shows the
distribution of the one-way delivery time (send to delivery) of a 57 KB model
message, the quickstart's MLP 60-200-10 (14,210 float32 parameters, 56,840
bytes, plus a small header: 56,900 bytes, 40 segments), in each direction,
as horizontal box plots on a log time axis, with each profile's configured
one-way delay (``RTT / 2``) marked. The gap between the mark and the box is
what the link adds beyond the delay: serialisation at the rate, TCP slow
start after idle, and loss recovery; the box's width is jitter, loss, and the
window TCP kept from earlier losses.

Nothing here opens a socket or waits: every message goes through
:meth:`netem.link.Link.schedule`, the same arithmetic on emulated seconds a
run uses, with the profile's parameters (``netem.profiles.profile``), seed 0
and client 0's stream keys (``("link", 0, direction)``, as
``fedsim.scenario.network`` names them), so the numbers are those of client 0
of a run with ``seed = 0`` on that profile.

Spacing: each direction sends its next message a fixed 5 emulated seconds
after the previous one was delivered, as in a federated round, where a
direction is silent while the client computes and the other direction
carries the model or the update. 5 s is longer than any of these profiles'
retransmission timeouts (at most about 1.8 s, satellite-geo's first RTO of
3 RTTs), so every message starts from TCP's initial window
(``tcp_slow_start_after_idle``) and none queues behind the previous one;
the delay and loss processes still run on (correlated delays, loss chains
through the silence).

Run it from the repository root (about 2 s; it prints each profile's p50 and
p95 per direction)::

    .venv/bin/python tools/netem_figure.py                  # docs/img/netem-profiles.png
    .venv/bin/python tools/netem_figure.py --out /tmp/f.png --samples 500
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter

from fedsim.results.plots import COLOURS as LANES
from fedsim.results.plots import new_figure, save
from netem.link import Link
from netem.linkparams import LinkParams
from netem.profiles import PROFILES, profile

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "docs" / "img" / "netem-profiles.png"

#: The profiles drawn, fastest first.
NAMES = ("lan", "cable", "dsl", "4g", "wifi-floor", "satellite-geo")
#: The quickstart's model message: 56,840 bytes of float32 parameters plus a header.
MODEL_BYTES = 56_900
#: Emulated seconds a direction stays silent between a delivery and its next send.
IDLE = 5.0
SEED = 0
DIRECTIONS = ("down", "up")
#: Okabe-Ito colours, as fedsim's timeline plot draws downloads and uploads.
COLOURS = {"down": LANES["download"], "up": LANES["upload"]}
DELAY_COLOUR = "#D55E00"


@dataclass(frozen=True)
class Sample:
    """Delivery times (seconds) of one profile and direction, and its parameters."""

    name: str
    direction: str
    params: LinkParams
    times: npt.NDArray[np.float64]  # t_deliver - t_send per delivered message
    dropped: int
    recovered: int  # messages that lost a packet and paid recovery time
    slow_start: float  # mean slow-start time (s)
    warm: int  # messages sent less than one RTO after the last: no restart from idle

    @property
    def base_delay(self) -> float:
        """The configured one-way delay (seconds): ``RTT / 2``."""
        return self.params.delay

    def quantile(self, q: float) -> float:
        """The ``q`` quantile of the delivery times (seconds)."""
        return float(np.quantile(self.times, q))


def sample(name: str, direction: str, n: int, seed: int = SEED) -> Sample:
    """Send ``n`` model messages through one direction of profile ``name``."""
    links = profile(name)
    params = links.down if direction == "down" else links.up
    link = Link(params, seed=seed, key=("link", 0, direction))
    times: list[float] = []
    dropped = recovered = warm = 0
    slow = 0.0
    t = 0.0
    tcp = link.connection
    for _ in range(n):
        warm += tcp.last_activity is not None and t - tcp.last_activity <= tcp.rto()
        d = link.schedule(t, MODEL_BYTES)
        if d.dropped:  # a tcp-timeout: 15 losses of one segment in a row
            dropped += 1
            t = link.busy_until + IDLE
            continue
        times.append(d.t_deliver - d.t_send)
        recovered += d.recovery > 0.0
        slow += d.slow_start
        t = d.t_deliver + IDLE
    return Sample(name, direction, params, np.asarray(times, dtype=np.float64), dropped,
                  recovered, slow / max(len(times), 1), warm)


def _ms(v: float) -> str:
    """Milliseconds with 3 significant digits, never in exponent form."""
    return f"{v:.0f}" if v >= 100 else f"{v:.3g}"


def _label(name: str) -> str:
    """Profile name plus its numbers, for the y axis."""
    p = PROFILES[name]
    rates = "/".join(f"{r / 1e6:g}" for r in (p.down, p.up) if r is not None)
    loss = "" if p.loss is None else f", loss {100 * p.loss.mean_loss_rate():.2g} %"
    return (f"{name}\nRTT {p.rtt * 1e3:g} ms, {rates} Mbit/s\n"
            f"jitter {p.jitter * 1e3:g} ms{loss}")


def draw(samples: Sequence[Sample], out: Path) -> Path:
    """Draw the box plots of ``samples`` (profile by profile, down then up) to ``out``."""
    names = list(dict.fromkeys(s.name for s in samples))
    fig = new_figure(9.0, 5.0, dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    offset = {"down": 0.2, "up": -0.2}
    for s in samples:
        row = len(names) - 1 - names.index(s.name)  # first profile on top
        ms = s.times * 1e3
        ax.bxp(
            [{
                "med": float(np.quantile(ms, 0.5)),
                "q1": float(np.quantile(ms, 0.25)),
                "q3": float(np.quantile(ms, 0.75)),
                "whislo": float(np.quantile(ms, 0.05)),
                "whishi": float(np.quantile(ms, 0.95)),
                "fliers": ms[(ms < np.quantile(ms, 0.05)) | (ms > np.quantile(ms, 0.95))],
            }],
            positions=[row + offset[s.direction]],
            widths=0.32,
            orientation="horizontal",
            patch_artist=True,
            boxprops={"facecolor": COLOURS[s.direction], "edgecolor": "black",
                      "linewidth": 0.8},
            medianprops={"color": "black", "linewidth": 1.6},
            whiskerprops={"linewidth": 0.8},
            capprops={"linewidth": 0.8},
            flierprops={"marker": "o", "markersize": 2.0, "alpha": 0.35,
                        "markerfacecolor": COLOURS[s.direction],
                        "markeredgecolor": "none"},
            manage_ticks=False,
        )
        # the median in numbers, left of the fastest message (the row is empty there)
        ax.text(float(ms.min()) / 1.12, row + offset[s.direction],
                f"p50 {_ms(float(np.quantile(ms, 0.5)))} ms", ha="right", va="center",
                fontsize=7, color="#333333")
    for row, name in enumerate(reversed(names)):
        base = next(s.base_delay for s in samples if s.name == name) * 1e3
        ax.plot([base, base], [row - 0.45, row + 0.45], color=DELAY_COLOUR, linewidth=2.0,
                solid_capstyle="butt", zorder=5)
    ax.set_xscale("log")
    # plain numbers (0.1, 1, 10, ... ms) rather than powers of ten: easier to read
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _pos: f"{x:g}"))
    ax.set_yticks(range(len(names)), [_label(n) for n in reversed(names)], fontsize=8)
    ax.set_ylim(-0.6, len(names) - 0.4)
    ax.set_xlabel("one-way delivery time of the message, send to delivery (ms, log scale)")
    ax.grid(axis="x", which="major", alpha=0.4)
    ax.grid(axis="x", which="minor", alpha=0.12)
    n = max(len(s.times) for s in samples)
    ax.set_title(
        f"netem: one-way delivery time of a 57 KB model message on {len(names)} profiles\n"
        f"{n} messages per profile and direction, {IDLE:g} s idle between them "
        f"(TCP slow start after idle), seed {SEED}",
        fontsize=10,
    )
    ax.legend(
        handles=[
            Patch(facecolor=COLOURS["down"], edgecolor="black", label="down (server to client)"),
            Patch(facecolor=COLOURS["up"], edgecolor="black", label="up (client to server)"),
            Line2D([], [], color=DELAY_COLOUR, linewidth=2.0,
                   label="configured one-way delay (RTT / 2)"),
        ],
        loc="lower left", fontsize=8,
        title="box p25-p75, line p50, whiskers p5-p95", title_fontsize=8,
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    return save(fig, out)


def run(out: Path = DEFAULT_OUT, samples: int = 2000,
        names: Sequence[str] = NAMES) -> dict[str, dict[str, tuple[float, float]]]:
    """Sample every profile and direction, draw the figure to ``out`` and print
    the table; return ``{profile: {direction: (p50, p95)}}`` in seconds."""
    drawn = [sample(name, direction, samples) for name in names for direction in DIRECTIONS]
    draw(drawn, out)
    print(f"{'profile':<14}{'dir':<5}{'delay ms':>9}{'p50 ms':>9}{'p95 ms':>9}"
          f"{'max ms':>9}{'slow start ms':>14}{'recovered':>10}{'dropped':>8}")
    table: dict[str, dict[str, tuple[float, float]]] = {}
    for s in drawn:
        p50, p95 = s.quantile(0.5), s.quantile(0.95)
        table.setdefault(s.name, {})[s.direction] = (p50, p95)
        print(f"{s.name:<14}{s.direction:<5}{s.base_delay * 1e3:>9.1f}{p50 * 1e3:>9.1f}"
              f"{p95 * 1e3:>9.1f}{s.times.max() * 1e3:>9.1f}{s.slow_start * 1e3:>14.1f}"
              f"{s.recovered:>10}{s.dropped:>8}")
        if s.warm:
            print(f"  note: {s.warm} messages of {s.name}/{s.direction} were sent within one"
                  f" RTO of the previous one (no slow start after idle)")
    print(f"wrote {out}")
    return table


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``--out PATH`` (default docs/img/netem-profiles.png), ``--samples N``."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="PNG to write")
    ap.add_argument("--samples", type=int, default=2000,
                    help="messages per profile and direction (default 2000)")
    args = ap.parse_args(argv)
    if args.samples < 1:
        ap.error(f"--samples must be >= 1 (got {args.samples})")
    run(args.out, args.samples)
    return 0


if __name__ == "__main__":
    sys.exit(main())
