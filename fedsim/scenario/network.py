"""The seam between a scenario and netem: links, devices and availability per client.

Each client has two links, ``up`` (client -> server) and ``down``, built
from the scenario's ``[network]`` section: a named profile (or netem's
defaults), the group the client belongs to, explicit field overrides,
per-client spreads (heterogeneity) and time-varying changes. Links are
applied on the receiving side: a message carries its emulated send time, and
the receiver holds it until the link says it arrives, so the real transfer
over loopback is hidden inside the emulated delay. The server applies every
uplink (so an uplink bottleneck can be shared), each client host the
downlinks of its clients; a downlink bottleneck is a real queue at the
server, which holds a message until the shared stage releases it.

Every process builds the same :class:`NetPlan` from the scenario's seed:
group assignment, spreads and device draws come from netem's keyed random
streams, so they agree bit for bit without being sent around, and one link's
delays and losses do not depend on any other link's traffic.
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Sequence
from dataclasses import replace
from functools import cached_property
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from fedsim.errors import ScenarioError
from fedsim.scenario import Scenario
from fedsim.scenario.netconfig import GroupConfig, LinkConfig, LossConfig
from netem.availability import AlwaysAvailable, AvailabilityTrace, OnOff, SuspensionModel
from netem.device import RunTrace, draw_devices
from netem.dist import make_dist
from netem.empirical import Empirical
from netem.link import Bottleneck, Delivery, Link
from netem.linkparams import LinkParams
from netem.loss import Bernoulli, GilbertElliott, LossModel
from netem.profiles import profile
from netem.rng import stream
from netem.trace import DeliveryTrace, Schedule, bundled_trace

__all__ = ["ALWAYS", "DEFAULT_GROUP", "Delivery", "DeviceModel", "NetPlan", "NetworkError"]

DEFAULT_GROUP = "default"

#: the availability of every client not subject to ``[availability]`` (one object for all)
ALWAYS = AlwaysAvailable()


class NetworkError(ScenarioError):
    """A ``[network]``, ``[devices]`` or ``[availability]`` setting that cannot be built."""


class DeviceModel(Protocol):
    """What a client's device answers: netem's :data:`~netem.device.Device` models,
    or an instant device when ``devices.step_time = 0``."""

    def compute_time(self, steps: int, rng: np.random.Generator, run_index: int = 0) -> float:
        """Emulated seconds for ``steps`` steps of run ``run_index``."""
        ...

    def least_time(self, steps: int) -> float:
        """The least emulated seconds any run of ``steps`` steps takes."""
        ...

    def mean_step(self) -> float:
        """Expected emulated seconds per step."""
        ...


def _loss(cfg: LossConfig) -> LossModel | None:
    if cfg.model == "bernoulli":
        return Bernoulli(cfg.p) if cfg.p > 0 else None
    return GilbertElliott(p=cfg.p, r=float(cfg.r or 0.0), loss_bad=cfg.loss_bad,
                          loss_good=cfg.loss_good)


def _fields(cfg: LinkConfig, where: str) -> dict[str, Any]:
    """LinkParams fields that ``cfg`` sets."""
    out: dict[str, Any] = {}
    for name in ("delay", "jitter", "distribution", "queue_limit", "mss", "overhead",
                 "loss_mode"):
        v = getattr(cfg, name)
        if v is not None:
            out[name] = v
    if cfg.correlation is not None:
        out["delay_correlation"] = cfg.correlation
    if cfg.rate is not None:
        out["rate"] = None if cfg.rate == "unlimited" else float(cfg.rate)
        out["trace"] = None
    if cfg.loss is not None:
        out["loss"] = _loss(cfg.loss)
    if cfg.table is not None:
        try:
            out["table"] = Empirical.from_file(cfg.table, unit=cfg.table_unit)
        except (OSError, ValueError) as exc:
            raise NetworkError(f"{where}.table = {cfg.table!r}: {exc}") from None
    if cfg.trace is not None:
        out["trace"] = _trace(cfg.trace, f"{where}.trace")
        out["rate"] = None
    return out


def _trace(name: str, where: str) -> DeliveryTrace:
    try:
        if Path(name).exists():
            return DeliveryTrace.from_file(name)
        return bundled_trace(name)
    except (OSError, ValueError) as exc:
        raise NetworkError(f"{where} = {name!r}: {exc} (a Mahimahi file or a bundled trace)") \
            from None


class NetPlan:
    """Per-client links, devices and availability of one scenario (deterministic)."""

    def __init__(self, sc: Scenario, host_step_time: float | None = None) -> None:
        self.sc = sc
        self.net = sc.network
        self.n = sc.data.num_clients
        self.seed = sc.seed
        self.host_step_time = host_step_time
        self._groups: dict[str, GroupConfig | None] = {DEFAULT_GROUP: None}
        for i, group in enumerate(self.net.groups):
            self._groups[group.name or f"group{i}"] = group
        self.group_of = self._assign()
        try:
            self._base: dict[str, tuple[LinkParams, LinkParams]] = {}
            for name, g in self._groups.items():  # default first: groups may build on it
                self._base[name] = self._group_params(name, g)
        except ValueError as exc:
            raise NetworkError(f"network: {exc}") from None
        self.delay_mult = self._spread(self.net.delay_spread, "delay")
        self.rate_mult = self._spread(self.net.rate_spread, "rate")
        self._changes = self._build_changes()
        self._kinds: dict[tuple[str, str], str] = {}
        # (client, direction) -> its parameter timeline's start times, and each
        # parameter set with its least propagation delay (least_transfer)
        self._least: dict[tuple[int, str], tuple[list[float],
                                                 list[tuple[LinkParams, float]]]] = {}

    # -- assignment and draws ---------------------------------------------------
    def _assign(self) -> list[str]:
        group_of = [DEFAULT_GROUP] * self.n
        for name, g in self._groups.items():
            for c in (g.clients if g is not None and g.clients else []):
                if c >= self.n:
                    raise NetworkError(
                        f"network.groups[{name}].clients: client {c} does not exist "
                        f"(data.num_clients = {self.n})")
                group_of[c] = name
        rest = [c for c in range(self.n) if group_of[c] == DEFAULT_GROUP]
        order = stream(self.seed, "network", "groups").permutation(len(rest)).tolist()
        pos = 0
        for name, g in self._groups.items():
            if g is None or g.fraction is None:
                continue
            k = round(g.fraction * len(rest))
            for j in order[pos:pos + k]:
                group_of[rest[j]] = name
            pos += k
        return group_of

    def _group_params(self, name: str, g: GroupConfig | None) -> tuple[LinkParams, LinkParams]:
        """Default group: profile + ``network.up/down``; a group with its own
        profile: that profile + the group's fields; without: the default
        group's links + the group's fields."""
        net = self.net
        if g is not None and g.profile is None:
            up, down = self._base[DEFAULT_GROUP]
            if g.rtt is not None:
                up, down = replace(up, delay=g.rtt / 2), replace(down, delay=g.rtt / 2)
        else:
            prof = net.profile if g is None else g.profile
            rtt = net.rtt if g is None else g.rtt
            if prof is not None:
                links = profile(prof, {"rtt": rtt} if rtt is not None else None)
                up, down = links.up, links.down
            else:
                up = down = LinkParams(delay=(rtt or 0.0) / 2.0)
        if g is None:
            up = replace(up, **_fields(net.up, "network.up"))
            down = replace(down, **_fields(net.down, "network.down"))
        else:
            where = f"network.groups[{name}]"
            up = replace(up, **_fields(g.up, f"{where}.up"))
            down = replace(down, **_fields(g.down, f"{where}.down"))
        return up, down

    def _spread(self, cfg: Any, purpose: str) -> np.ndarray:
        if cfg is None or cfg.cv == 0:
            return np.ones(self.n)
        d = make_dist(cfg.distribution, 1.0, cfg.cv)
        v = d.sample(stream(self.seed, "network", "spread", purpose), self.n)
        return np.maximum(v, 1e-3)

    def _build_changes(self) -> dict[str, tuple[Schedule, Schedule]]:
        out: dict[str, tuple[Schedule, Schedule]] = {}
        for name in self._groups:
            ups, downs = [], []
            for i, ch in enumerate(self.net.changes):
                if ch.groups is not None and name not in ch.groups:
                    continue
                ups.append((ch.at, _fields(ch.up, f"network.changes[{i}].up")))
                downs.append((ch.at, _fields(ch.down, f"network.changes[{i}].down")))
            out[name] = (Schedule(ups), Schedule(downs))
        return out

    # -- links -----------------------------------------------------------------
    def params(self, client: int, direction: str) -> LinkParams:
        """The parameters of one client's link at time 0 (spreads applied)."""
        if direction not in ("up", "down"):
            raise ValueError(f"Invalid direction: {direction!r} (up or down)")
        up, down = self._base[self.group_of[client]]
        p = up if direction == "up" else down
        dm, rm = float(self.delay_mult[client]), float(self.rate_mult[client])
        if dm != 1.0:
            p = replace(p, delay=p.delay * dm, jitter=p.jitter * dm)
        if rm != 1.0 and p.rate is not None:
            p = replace(p, rate=p.rate * rm)
        return p

    def kind(self, client: int, direction: str) -> str:
        """Fidelity bucket of a link: its group and direction (one string per bucket)."""
        key = (self.group_of[client], direction)
        name = self._kinds.get(key)
        if name is None:
            name = self._kinds[key] = f"{key[0]}/{direction}"
        return name

    def make_link(self, client: int, direction: str,
                  bottleneck: Bottleneck | None = None) -> Link:
        """A fresh netem link for ``client`` in ``direction``."""
        up, down = self._changes[self.group_of[client]]
        try:
            return Link(self.params(client, direction), seed=self.seed,
                        key=("link", client, direction),
                        changes=up if direction == "up" else down, bottleneck=bottleneck)
        except ValueError as exc:
            raise NetworkError(f"network (client {client}, {direction}): {exc}") from None

    def least_transfer(self, client: int, direction: str, nbytes: int, t: float) -> float:
        """The least emulated seconds a message of ``nbytes`` sent at ``t`` can take
        on ``client``'s link in ``direction``: the floor of its propagation delay
        plus its serialisation, with the parameters in force at ``t`` (what
        :meth:`~netem.linkparams.LinkParams.least_delay` says; everything else
        the link does only adds). Each link's floors are worked out on its
        first use and kept (an empirical table's takes a sort)."""
        key = (client, direction)
        got = self._least.get(key)
        if got is None:
            p = self.params(client, direction)
            changes = self._changes[self.group_of[client]][0 if direction == "up" else 1]
            timeline = changes.timeline(p) if changes.changes else [(-math.inf, p)]
            got = self._least[key] = ([c[0] for c in timeline],
                                      [(q, q.least_propagation()) for _, q in timeline])
        times, floors = got
        q, prop = floors[max(bisect.bisect_right(times, t) - 1, 0)]
        return prop + q.serialization(nbytes)

    def bottleneck(self, direction: str) -> Bottleneck | None:
        cfg = self.net.bottleneck_up if direction == "up" else self.net.bottleneck_down
        if cfg is None:
            return None
        return Bottleneck(cfg.rate, cfg.queue_limit, name=f"server-{direction}")

    def expectations(self) -> dict[str, LinkParams]:
        """Link kinds whose configured delay and loss can be checked.

        A kind qualifies when all its clients share one parameter set over
        the whole run (no spread, no change of delay or loss).
        """
        out: dict[str, LinkParams] = {}
        if self.net.delay_spread is not None and self.net.delay_spread.cv > 0:
            return out
        for name, (up, down) in self._base.items():
            if name not in self.group_of:
                continue
            ups, downs = self._changes[name]
            for direction, p, sched in (("up", up, ups), ("down", down, downs)):
                touched = {k for _, ov in sched.changes for k in ov}
                if touched & {"delay", "jitter", "distribution", "delay_correlation", "loss",
                              "table"}:
                    continue
                out[f"{name}/{direction}"] = p
        return out

    def mean_delay(self, direction: str) -> float:
        """Configured mean one-way delay of ``direction``'s links at t = 0, averaged
        over the clients (seconds): what a message would take on an idle link
        with no rate limit, loss or slow start."""
        return float(np.mean([self.params(c, direction).delay_dist().moments()[0]
                              for c in range(self.n)])) if self.n else 0.0

    @property
    def min_delay(self) -> float:
        """Smallest configured mean one-way delay over all clients (seconds)."""
        return min((self.params(c, d).delay_dist().moments()[0]
                    for c in range(self.n) for d in ("up", "down")), default=0.0)

    # -- devices ----------------------------------------------------------------
    @cached_property
    def _devices(self) -> tuple[Sequence[DeviceModel], dict[str, Any]]:
        d = self.sc.devices
        rng = stream(self.seed, "devices", "draw")
        if d.model == "trace":
            try:
                vals = [float(x) for x in Path(str(d.trace)).read_text().split()
                        if not x.startswith("#")]
                dev = RunTrace(tuple(vals), d.steps_per_run)
            except (OSError, ValueError) as exc:
                raise NetworkError(f"devices.trace = {d.trace!r}: {exc}") from None
            rec = {"kind": "trace", "path": d.trace, "runs": len(vals),
                   "steps_per_run": d.steps_per_run, "mean_step": dev.mean_step(),
                   "clients": [{"client": c, "step_time": dev.mean_step()}
                               for c in range(self.n)]}
            return [dev] * self.n, rec
        if d.model == "step_time" and d.step_time == 0:
            return [_Zero()] * self.n, {"kind": "none", "clients": []}
        across = make_dist(d.distribution, 1.0 if d.model == "speed_factor" else d.step_time,
                           d.spread)
        try:
            if d.model == "speed_factor":
                if not self.host_step_time:
                    raise NetworkError("devices.model = \"speed_factor\" needs the host's "
                                       "calibrated step time")
                return draw_devices(self.n, rng, speed_factor=across,
                                    host_step_time=self.host_step_time, within_cv=d.within_cv,
                                    per=d.per)
            return draw_devices(self.n, rng, step_time=across, within_cv=d.within_cv, per=d.per)
        except ValueError as exc:
            raise NetworkError(f"devices: {exc}") from None

    def draw_devices(self) -> None:
        """Draw every client's device now (a host's first task would: 20 ms at 10,000
        clients, after t = 0); a no-op until a speed factor has the host's step time."""
        if self.sc.devices.model != "speed_factor" or self.host_step_time:
            _ = self._devices

    def device(self, client: int) -> DeviceModel:
        return self._devices[0][client]

    def least_compute(self, client: int, steps: int) -> float:
        """The least emulated seconds ``steps`` local steps take on ``client``'s device
        (0 while a speed-factor device still waits for the host's step time)."""
        if self.sc.devices.model == "speed_factor" and not self.host_step_time:
            return 0.0
        return self.device(client).least_time(steps)

    def device_rng(self, client: int) -> np.random.Generator:
        return stream(self.seed, "devices", "run", client)

    # -- availability -------------------------------------------------------------
    @cached_property
    def _subject(self) -> set[int]:
        a = self.sc.availability
        k = round(a.fraction * self.n)
        order = stream(self.seed, "availability", "subject").permutation(self.n)
        return {int(c) for c in order[:k]}

    @cached_property
    def _suspension(self) -> SuspensionModel | None:
        a = self.sc.availability
        if a.model != "suspension" or a.p == 0:
            return None
        return SuspensionModel(a.p, hang_factor=a.hang_factor, discard_update=a.discard_update)

    def suspension(self, client: int) -> SuspensionModel | None:
        """The suspension model of ``client`` (one object, shared: it keeps no state)."""
        if self._suspension is None or client not in self._subject:
            return None
        return self._suspension

    def suspension_rng(self, client: int) -> np.random.Generator:
        return stream(self.seed, "availability", "suspension", client)

    @cached_property
    def _trace_table(self) -> dict[int, AvailabilityTrace]:
        a = self.sc.availability
        try:
            raw = json.loads(Path(str(a.trace)).read_text())
            period = raw.get("period")
            return {int(c): AvailabilityTrace(tuple(map(tuple, ivs)), period=period)
                    for c, ivs in raw["clients"].items()}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise NetworkError(
                f"availability.trace = {a.trace!r}: {exc} (expected JSON "
                '{"period": T or null, "clients": {"0": [[start, end], ...]}})') from None

    def availability(self, client: int) -> Any:
        """An object with ``is_available(t)`` and ``next_change(t)``."""
        a = self.sc.availability
        if client not in self._subject:
            return ALWAYS
        if a.model == "onoff":
            return OnOff(a.mean_on, a.mean_off, a.start).process(
                stream(self.seed, "availability", "onoff", client))
        if a.model == "trace":
            return self._trace_table.get(client, ALWAYS)
        return ALWAYS

    # -- record ----------------------------------------------------------------------
    def check(self) -> None:
        """Build everything once so a bad setting fails before the run starts."""
        for c in range(min(self.n, 64)):
            self.make_link(c, "up")
            self.make_link(c, "down")
            self.availability(c)
        if self.sc.devices.model != "speed_factor" or self.host_step_time:
            _ = self._devices

    def record(self) -> dict[str, Any]:
        """JSON-able per-client draws, for ``heterogeneity.json`` in the run directory."""
        devs, dev_rec = self._devices
        clients = []
        step = {e["client"]: e for e in dev_rec.get("clients", [])}
        links: dict[int, tuple[LinkParams, dict[str, Any]]] = {}  # clients without a spread
        # share their group's parameters: each is described once (keyed by identity)

        def described(p: LinkParams) -> dict[str, Any]:
            got = links.get(id(p))
            if got is None:
                got = links[id(p)] = (p, _link_record(p))
            return got[1]

        for c in range(self.n):
            up, down = self.params(c, "up"), self.params(c, "down")
            clients.append({
                "client": c, "group": self.group_of[c],
                "up": described(up), "down": described(down),
                "delay_mult": float(self.delay_mult[c]), "rate_mult": float(self.rate_mult[c]),
                "step_time": step.get(c, {}).get("step_time", devs[c].mean_step()),
                "availability": self.sc.availability.model if c in self._subject else "always",
            })
        return {
            "seed": self.seed,
            "groups": {g: sum(1 for x in self.group_of if x == g) for g in self._groups},
            "devices": {k: v for k, v in dev_rec.items() if k != "clients"},
            "clients": clients,
        }


def _link_record(p: LinkParams) -> dict[str, Any]:
    mean, std = p.delay_dist().moments()
    return {"delay": p.delay, "jitter": p.jitter, "distribution": p.distribution,
            "delay_mean": mean, "delay_std": std,
            "rate": p.rate, "trace": p.trace is not None,
            "loss": None if p.loss is None else p.loss.mean_loss_rate(),
            "loss_mode": p.loss_mode, "queue_limit": p.queue_limit}


class _Zero:
    """A device that computes instantly (``step_time = 0``)."""

    def compute_time(self, steps: int, rng: np.random.Generator, run_index: int = 0) -> float:
        return 0.0

    def least_time(self, steps: int) -> float:
        return 0.0

    def mean_step(self) -> float:
        return 0.0


def finite(t: float) -> bool:
    """Whether a delivery time is a real time (a dropped message has ``inf``)."""
    return math.isfinite(t)
