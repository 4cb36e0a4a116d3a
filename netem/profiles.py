"""Named network profiles, each with its sources.

The table with every source in full, and what is measured and what is a
placeholder: docs/netem.md#profiles.

Decisions:

* Each profile is given as a round-trip time; each direction gets a one-way
  propagation delay of ``RTT / 2`` (the ``delay`` field). ``rtt`` can be
  overridden and is split the same way.
* ``jitter`` is per direction, with the distribution named in the table.
  Loss applies to both directions (independent streams). Rates are
  ``down`` (server -> client) and ``up`` (client -> server) in bits/s;
  ``None`` = not the bottleneck ("link-limited" long-haul profiles).
* Values marked *placeholder* in :data:`PROFILES` have no measured source:
  they are to be tuned, not data. All jitter values, the Wi-Fi rates, most
  loss values.

Override any :class:`~netem.linkparams.LinkParams` field with
``profile(name, overrides={...})``: a plain key applies to both directions,
``"up.rate"`` / ``"down.rate"`` to one, ``"rtt"`` re-splits the delay.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from netem import _check
from netem.linkparams import LinkParams
from netem.loss import Bernoulli, GilbertElliott, LossModel

__all__ = ["PROFILES", "Profile", "ProfileLinks", "list_profiles", "profile"]

M = 1e6


@dataclass(frozen=True, slots=True)
class Profile:
    """A named profile: RTT (s), per-direction rates (bits/s), jitter, loss."""

    name: str
    rtt: float
    down: float | None
    up: float | None
    jitter: float = 0.0
    distribution: str = "normal"
    correlation: float = 0.0
    loss: LossModel | None = None
    sources: tuple[str, ...] = ()
    placeholders: tuple[str, ...] = ()
    notes: str = ""

    def links(self) -> ProfileLinks:
        """``LinkParams`` for both directions."""
        common: dict[str, Any] = {
            "delay": self.rtt / 2.0,
            "jitter": self.jitter,
            "distribution": self.distribution,
            "delay_correlation": self.correlation,
            "loss": self.loss,
        }
        return ProfileLinks(
            up=LinkParams(rate=self.up, **common),
            down=LinkParams(rate=self.down, **common),
        )


@dataclass(frozen=True, slots=True)
class ProfileLinks:
    """Uplink (client -> server) and downlink parameters of a profile."""

    up: LinkParams
    down: LinkParams


_DGA = "DGA paper (Zhu et al., NeurIPS 2021, Sec. 3.2, Raspberry Pis): 1 / 16 / 132 / 470 ms"
_WPT = "WebPageTest connectivity.ini.sample"
_LH = "Lighthouse core/config/constants.js"
_S0 = "str0m-netem GE presets (netem/src/config.rs), heuristic"

PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile(
            "lan",
            0.001,
            1000 * M,
            1000 * M,
            jitter=0.00005,
            sources=(f"{_DGA}: wired 1 ms",),
            placeholders=("rate", "jitter"),
            notes="",
        ),
        Profile(
            "wifi-room",
            0.016,
            100 * M,
            100 * M,
            jitter=0.004,
            distribution="paretonormal",
            correlation=0.3,
            loss=GilbertElliott.from_durations(good=200, bad=2),
            sources=(
                f"{_DGA}: different rooms 16 ms",
                "WiFiSeer (Sui et al., MobiSys 2016): long tail, p90 ~20 ms,"
                " p99 ~250 ms (not reproduced by this placeholder jitter)",
                f"{_S0}: wifi good 200 / bad 2 packets (~1 %)",
            ),
            placeholders=("rate", "jitter", "correlation", "loss"),
        ),
        Profile(
            "wifi-floor",
            0.132,
            20 * M,
            20 * M,
            jitter=0.033,
            distribution="paretonormal",
            correlation=0.3,
            loss=GilbertElliott.from_durations(good=100, bad=2),
            sources=(
                f"{_DGA}: different floors 132 ms",
                f"{_S0}: cellular 100/2 (~2 %)",
            ),
            placeholders=("rate", "jitter", "correlation", "loss"),
        ),
        Profile(
            "wifi-building",
            0.470,
            5 * M,
            5 * M,
            jitter=0.09,
            distribution="paretonormal",
            correlation=0.3,
            loss=GilbertElliott.from_durations(good=40, bad=2),
            sources=(
                f"{_DGA}: different buildings 470 ms",
                f"{_S0}: wifi_lossy 40/2 (~5 %)",
            ),
            placeholders=("rate", "jitter", "correlation", "loss"),
        ),
        Profile(
            "dsl",
            0.050,
            1.5 * M,
            0.384 * M,
            jitter=0.001,
            sources=(
                f"{_WPT}: DSL 1.5 Mbps / 384 kbps, 50 ms",
                "Verizon / FCC MBA 2016: DSL 37-40 ms",
            ),
            placeholders=("jitter",),
        ),
        Profile(
            "cable",
            0.028,
            5 * M,
            1 * M,
            jitter=0.001,
            sources=(f"{_WPT}: Cable 5/1 Mbps, 28 ms",),
            placeholders=("jitter",),
            notes="for today's fixed broadband see 'broadband'",
        ),
        Profile(
            "broadband",
            0.010,
            94 * M,
            48 * M,
            jitter=0.001,
            sources=(
                "Ookla Speedtest Global Index Aug 2024: fixed 93.99 / 48.36 Mbps;"
                " Ookla fixed latency median 10 ms",
            ),
            placeholders=("jitter",),
        ),
        Profile(
            "4g",
            0.070,
            12 * M,
            12 * M,
            jitter=0.010,
            loss=Bernoulli(0.001),
            sources=(
                f"{_WPT} public UI: LTE 12/12 Mbps, 70 ms",
                "Huang et al. MobiSys 2012: LTE median 13 / 6 Mbps",
            ),
            placeholders=("jitter", "loss"),
        ),
        Profile(
            "4g-slow",
            0.150,
            1.6384 * M,
            0.750 * M,
            jitter=0.010,
            sources=(
                f"{_LH}: mobileSlow4G rtt 150 ms, 1.6x1024 kbps down, 750 kbps up",
            ),
            placeholders=("jitter",),
        ),
        Profile(
            "3g",
            0.300,
            0.700 * M,
            0.700 * M,
            jitter=0.030,
            loss=Bernoulli(0.015),
            sources=(
                f"{_LH}: mobileRegular3G rtt 300 ms, 700 kbps",
                "comcast README: 3G/HSDPA (good) 1.5 % loss",
            ),
            placeholders=("jitter",),
        ),
        Profile(
            "5g",
            0.030,
            166 * M,
            21 * M,
            jitter=0.003,
            sources=(
                "Ookla Q3 2021: global median 5G 166.13 / 21.08 Mbps",
                "Ookla 2022: all-mobile median latency 28 ms (not 5G-specific)",
            ),
            placeholders=("jitter",),
            notes="",
        ),
        Profile(
            "satellite-leo",
            0.050,
            200 * M,
            15 * M,
            jitter=0.008,
            loss=GilbertElliott(p=0.0005, r=0.2),
            sources=(
                "APNIC 2022 Starlink: median ~50 ms RTT (IQR 40-60), >300 Mbps",
                "arXiv 2310.09242: 15 s reconfiguration intervals",
            ),
            placeholders=("rate", "jitter", "loss"),
            notes="15 s reconfiguration steps: use trace.Schedule.periodic",
        ),
        Profile(
            "satellite-geo",
            0.600,
            100 * M,
            10 * M,
            jitter=0.005,
            loss=Bernoulli(0.002),
            sources=(
                "Michel et al. IMC 2022: GEO minimum latency ~600 ms",
                "APNIC 100/10 SatCom plan; comcast Satellite 0.2 % loss",
            ),
            placeholders=("jitter",),
        ),
        Profile(
            "transatlantic",
            0.075,
            None,
            None,
            jitter=0.001,
            sources=(
                "geocables: London-NY RTT 70-80 ms",
                "Hibernia Express NY-London 58.95 ms (floor)",
            ),
            placeholders=("jitter",),
            notes="link-limited: combine with an access profile's rates",
        ),
        Profile(
            "transpacific",
            0.110,
            None,
            None,
            jitter=0.001,
            sources=("geocables: LA-Tokyo RTT 100-115 ms",),
            placeholders=("jitter",),
        ),
    )
}


def profile(name: str, overrides: Mapping[str, Any] | None = None) -> ProfileLinks:
    """Up/down ``LinkParams`` of a named profile, with overrides.

    Parameters
    ----------
    name
        A key of :data:`PROFILES`.
    overrides
        ``{"field": v}`` for both directions, ``{"up.field": v}`` or
        ``{"down.field": v}`` for one; ``"rtt"`` sets ``delay = rtt / 2``
        in both directions. Unknown fields raise ``ValueError``.
    """
    if name not in PROFILES:
        _check.fail(
            "profile", "name", name, f"must be one of {', '.join(sorted(PROFILES))}"
        )
    pl = PROFILES[name].links()
    up: dict[str, Any] = {}
    down: dict[str, Any] = {}
    fields = set(LinkParams.__dataclass_fields__)
    for key, value in (overrides or {}).items():
        direction, _, fld = key.rpartition(".")
        if fld == "rtt" and direction == "":
            _check.nonneg("profile.overrides", "rtt", value, " s")
            up["delay"] = down["delay"] = value / 2.0
            continue
        if fld not in fields or direction not in ("", "up", "down"):
            _check.fail(
                "profile.overrides",
                key,
                value,
                "keys are LinkParams fields, optionally prefixed 'up.' or 'down.',"
                " or 'rtt'",
            )
        if direction in ("", "up"):
            up[fld] = value
        if direction in ("", "down"):
            down[fld] = value
    return ProfileLinks(up=replace(pl.up, **up), down=replace(pl.down, **down))


def list_profiles() -> list[dict[str, Any]]:
    """JSON-able listing for docs: numbers, sources and placeholders."""
    out = []
    for p in PROFILES.values():
        out.append(
            {
                "name": p.name,
                "rtt_ms": p.rtt * 1e3,
                "down_mbps": None if p.down is None else p.down / M,
                "up_mbps": None if p.up is None else p.up / M,
                "jitter_ms": p.jitter * 1e3,
                "distribution": p.distribution,
                "loss": None if p.loss is None else round(p.loss.mean_loss_rate(), 6),
                "sources": list(p.sources),
                "placeholders": list(p.placeholders),
                "notes": p.notes,
            }
        )
    return out
