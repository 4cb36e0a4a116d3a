"""Scenario sections that configure netem: ``[network]``, ``[devices]``, ``[availability]``.

Every duration is in emulated seconds, every rate in bits/s. A field left
out (``None``) keeps what the profile (or netem's default) says, so a
scenario can name a profile and override any single field of it.

Example::

    [network]
    profile = "wifi-floor"          # every client, unless a group says otherwise
    in_flight = "held"

    [network.up]
    rate = 5e6                      # override one field of one direction

    [[network.groups]]              # a mixture: 30 % of the clients on 4G
    profile = "4g"
    fraction = 0.3

    [[network.changes]]             # at t = 20 s every downlink slows down
    at = 20.0
    down = { rate = 1e6 }
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from fedsim.schema import AtLeastOne, NonNeg, NonNegInt, Pos, Prob, SchemaModel

__all__ = [
    "AvailabilityConfig",
    "BottleneckConfig",
    "ChangeConfig",
    "DevicesConfig",
    "GroupConfig",
    "LinkConfig",
    "LossConfig",
    "NetworkConfig",
    "SpreadConfig",
]


Distribution = Literal[
    "constant", "uniform", "normal", "pareto", "paretonormal", "lognormal", "empirical"
]
SpreadDistribution = Literal["constant", "uniform", "normal", "lognormal", "pareto", "paretonormal"]
ProfileName = Literal[
    "3g", "4g", "4g-slow", "5g", "broadband", "cable", "dsl", "lan", "satellite-geo",
    "satellite-leo", "transatlantic", "transpacific", "wifi-building", "wifi-floor",
    "wifi-room",
]
PROFILE_NAMES: tuple[str, ...] = ProfileName.__args__  # type: ignore[attr-defined]


class LossConfig(SchemaModel):
    """Per-packet loss: ``bernoulli`` (``p``) or ``gilbert-elliott`` (``p``, ``r``)."""

    model: Literal["bernoulli", "gilbert-elliott"] = "bernoulli"
    p: Prob = 0.0
    r: Prob | None = None
    loss_bad: Prob = 1.0
    loss_good: Prob = 0.0

    @model_validator(mode="after")
    def _ge_needs_r(self) -> LossConfig:
        if self.model == "gilbert-elliott" and self.r is None:
            raise ValueError("gilbert-elliott loss needs r (P(bad -> good) per packet)")
        if self.model == "bernoulli" and self.r is not None:
            raise ValueError(f"r={self.r} is a gilbert-elliott parameter; set model")
        return self


class LinkConfig(SchemaModel):
    """Fields of one link direction; ``None`` keeps the profile's value."""

    delay: NonNeg | None = None
    jitter: NonNeg | None = None
    distribution: Distribution | None = None
    table: str | None = None
    table_unit: Literal["s", "ms", "us"] = "ms"
    correlation: Annotated[float, Field(ge=0, lt=1)] | None = None
    rate: Pos | Literal["unlimited"] | None = None
    trace: str | None = None
    queue_limit: AtLeastOne | None = None
    mss: AtLeastOne | None = None
    overhead: NonNegInt | None = None
    loss: LossConfig | None = None
    loss_mode: Literal["tcp", "drop", "message"] | None = None

    @model_validator(mode="after")
    def _consistent(self) -> LinkConfig:
        if self.distribution == "empirical" and self.table is None:
            raise ValueError("distribution = \"empirical\" needs table = \"path/to/table\"")
        if self.trace is not None and self.rate not in (None, "unlimited"):
            raise ValueError(f"set either rate ({self.rate}) or trace ({self.trace!r}), not both")
        return self


class SpreadConfig(SchemaModel):
    """Per-client multiplier with mean 1: ``distribution`` with std ``cv``."""

    distribution: SpreadDistribution = "lognormal"
    cv: NonNeg = 0.3


class GroupConfig(SchemaModel):
    """Clients with their own profile: explicit ids, or a share of the rest."""

    name: str | None = None
    profile: ProfileName | None = None
    clients: list[NonNegInt] | None = None
    fraction: Prob | None = None
    rtt: NonNeg | None = None
    up: LinkConfig = LinkConfig()
    down: LinkConfig = LinkConfig()

    @model_validator(mode="after")
    def _one_selector(self) -> GroupConfig:
        if (self.clients is None) == (self.fraction is None):
            raise ValueError("a group needs exactly one of clients = [...] or fraction = x")
        return self


class ChangeConfig(SchemaModel):
    """From emulated time ``at`` on, these fields change (on every client's links)."""

    at: NonNeg
    up: LinkConfig = LinkConfig()
    down: LinkConfig = LinkConfig()
    groups: list[str] | None = None

    @model_validator(mode="after")
    def _no_files(self) -> ChangeConfig:
        for d in (self.up, self.down):
            if d.table is not None or d.trace is not None:
                raise ValueError("changes cannot load a table or trace; set them on the link")
        return self


class BottleneckConfig(SchemaModel):
    """A rate + queue shared by every client's link at the server."""

    rate: Pos
    queue_limit: AtLeastOne | None = None


class NetworkConfig(SchemaModel):
    """The emulated network between the server and each client."""

    profile: ProfileName | None = None
    rtt: NonNeg | None = None
    up: LinkConfig = LinkConfig()
    down: LinkConfig = LinkConfig()
    groups: list[GroupConfig] = []
    changes: list[ChangeConfig] = []
    delay_spread: SpreadConfig | None = None
    rate_spread: SpreadConfig | None = None
    bottleneck_up: BottleneckConfig | None = None
    bottleneck_down: BottleneckConfig | None = None
    in_flight: Literal["held", "dropped", "reset"] = "held"

    @model_validator(mode="after")
    def _groups(self) -> NetworkConfig:
        total = sum(g.fraction or 0.0 for g in self.groups)
        if total > 1 + 1e-9:
            raise ValueError(f"group fractions add up to {total:g} (must be <= 1)")
        seen: set[int] = set()
        names = [g.name for g in self.groups if g.name is not None]
        if len(names) != len(set(names)):
            raise ValueError(f"group names must be unique (got {names})")
        for g in self.groups:
            for c in g.clients or []:
                if c in seen:
                    raise ValueError(f"client {c} is in two groups")
                seen.add(c)
        for ch in self.changes:
            for name in ch.groups or []:
                if name not in names and name != "default":
                    raise ValueError(
                        f"change at {ch.at}: unknown group {name!r} "
                        f"(allowed: default, {', '.join(n for n in names if n)})"
                    )
        return self


class DevicesConfig(SchemaModel):
    """Client devices: emulated compute time per local step.

    ``model = "step_time"``: per-client mean step time drawn from
    ``distribution`` (mean ``step_time``, std ``spread``);
    ``"speed_factor"``: per-client factor (mean 1, std ``spread``) times the
    host's calibrated step time; ``"trace"``: measured run times from
    ``trace`` (one value in seconds per line, ``steps_per_run`` steps each).
    ``within_cv`` adds variation inside a client, drawn once per run
    (``per = "run"``) or once per step (``"step"``).
    ``host_step_time`` (seconds per real local step on this host) is measured
    by ``fedsim run`` when a speed factor needs it and left unset.
    """

    model: Literal["step_time", "speed_factor", "trace"] = "step_time"
    step_time: NonNeg = 0.01
    distribution: SpreadDistribution = "constant"
    spread: NonNeg = 0.0
    within_cv: NonNeg = 0.0
    per: Literal["run", "step"] = "run"
    trace: str | None = None
    steps_per_run: AtLeastOne = 1
    host_step_time: Pos | None = None

    @model_validator(mode="after")
    def _consistent(self) -> DevicesConfig:
        if self.model == "trace" and self.trace is None:
            raise ValueError("devices.model = \"trace\" needs trace = \"path\"")
        if self.model != "trace" and self.trace is not None:
            raise ValueError(f"devices.trace = {self.trace!r} needs model = \"trace\"")
        if self.per == "step" and self.within_cv == 0:
            raise ValueError("devices.per = \"step\" needs within_cv > 0 (the variation "
                             "it draws per step)")
        if self.distribution != "constant" and self.spread == 0:
            raise ValueError(
                f"devices.distribution = {self.distribution!r} needs spread > 0 "
                "(the std across clients)"
            )
        return self


class AvailabilityConfig(SchemaModel):
    """When clients are away.

    ``suspension``: AsyncFedED's (docs/algorithms.md#r-af6): each local run is,
    with probability ``p``, wasted and the client hangs for
    ``U(0, hang_factor x run time)``. ``onoff``: exponential on and off
    periods. ``trace``: a JSON file ``{"period": T or null, "clients":
    {"0": [[start, end], ...], ...}}`` of active intervals (clients not
    listed are always on). Messages in flight to or from an away client
    are held, dropped, or lost with the connection (``network.in_flight``).
    """

    model: Literal["always", "suspension", "onoff", "trace"] = "always"
    p: Prob = 0.0
    hang_factor: NonNeg = 3.0
    discard_update: bool = True
    mean_on: Pos = 60.0
    mean_off: Pos = 10.0
    start: Literal["on", "off", "stationary"] = "on"
    fraction: Prob = 1.0
    trace: str | None = None

    @model_validator(mode="after")
    def _consistent(self) -> AvailabilityConfig:
        if self.model == "trace" and self.trace is None:
            raise ValueError("availability.model = \"trace\" needs trace = \"path.json\"")
        return self
