"""Scenario files: schema, loading and validation.

A scenario is a TOML file validated on load into frozen pydantic models:
an unknown key, a wrong type or an out-of-range value raises
:class:`ScenarioError` whose message names the key, the value and what is
allowed (the CLI exits with status 2). ``--set dotted.key=value`` overrides
go through the same validation. :func:`resolved` gives the scenario with
every default filled in, which each run writes to its directory.

pydantic does this job better than hand-written checks: it reports every
bad field at once, with its location, and it fills the defaults we write
back out.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, SerializeAsAny, ValidationError, field_validator, model_validator

from fedsim import algorithms
from fedsim._netconfig import AvailabilityConfig, DevicesConfig, NetworkConfig
from fedsim._schema import NonNeg, Pos, Prob, SchemaModel
from fedsim.algorithms import AlgorithmConfig

__all__ = [
    "DEFAULT_ALGORITHM",
    "Scenario",
    "ScenarioError",
    "load",
    "parse",
    "resolved",
    "scenario_hash",
]

#: The algorithm of an ``[algorithm]`` table without a ``name``.
DEFAULT_ALGORITHM = "fedasync"


class ScenarioError(ValueError):
    """A scenario that cannot run; the message names every bad key."""


def _algorithm_config(raw: Any) -> AlgorithmConfig:
    """Validate an ``[algorithm]`` table with its registered algorithm's config."""
    if isinstance(raw, AlgorithmConfig):
        return raw
    if not isinstance(raw, dict):
        raise ValueError(f"must be a table, got {raw!r}")
    name = raw.get("name", DEFAULT_ALGORITHM)
    try:
        spec = algorithms.get(name)
    except KeyError:
        allowed = ", ".join(repr(n) for n in sorted(algorithms.algorithm_names()))
        raise ValueError(f"name: unknown algorithm {name!r} (allowed: {allowed})") from None
    return spec.config.model_validate({**raw, "name": name})



class DataConfig(SchemaModel):
    """Dataset, partition and number of clients."""

    dataset: Literal["synthetic", "digits", "leaf", "mnist", "cifar10"] = "synthetic"
    num_clients: Annotated[int, Field(ge=1, le=1_000_000)] = 20
    partition: Literal["natural", "iid", "dirichlet", "shards"] = "natural"
    synthetic_alpha: NonNeg = 1.0
    synthetic_beta: NonNeg = 1.0
    synthetic_iid: bool = False
    max_samples_per_client: Annotated[int, Field(ge=1)] | None = None
    dirichlet_alpha: Pos = 0.5
    dirichlet_recipe: Literal["hsu", "deltasgd_code", "feddyn_sequential"] = "hsu"
    samples_per_client: Annotated[int, Field(ge=1)] | None = None
    classes_per_client: Annotated[int, Field(ge=1)] = 2
    test_fraction: Annotated[float, Field(gt=0, lt=1)] | None = None
    path: str | None = None


class ModelConfig(SchemaModel):
    """The torch model every client trains."""

    name: Literal["mlp", "cnn", "cnn_mnist", "char_lstm"] = "mlp"
    hidden: list[Annotated[int, Field(ge=1)]] = [200]
    lstm_hidden: Annotated[int, Field(ge=1)] = 256


class ClientConfig(SchemaModel):
    """Client optimizer and local work per task."""

    optimizer: Literal["sgd", "sgdm", "adam", "adagrad", "deltasgd", "sps"] = "sgd"
    lr: Pos = 0.05
    momentum: Annotated[float, Field(ge=0, lt=1)] = 0.9
    beta1: Annotated[float, Field(ge=0, lt=1)] = 0.9
    beta2: Annotated[float, Field(ge=0, lt=1)] = 0.999
    weight_decay: NonNeg = 0.0
    # Adagrad
    initial_accumulator: NonNeg = 0.0
    # Delta-SGD (docs/algorithms.md#delta-sgd): locality-adaptive step size
    eta0: Pos = 0.2
    theta0: Pos = 1.0
    gamma: Pos = 2.0
    delta: NonNeg = 0.1
    eta_max: Pos | None = None  # no cap
    first_step: Literal["paper", "code"] = "paper"
    batch_mode: Literal["same", "previous"] = "same"
    # SPS (stochastic Polyak step size)
    sps_c: Pos = 0.5
    f_star: float = 0.0
    sps_mode: Literal["constant", "smooth"] = "constant"
    batch_size: Annotated[int, Field(ge=1)] = 32
    local_steps: Annotated[int, Field(ge=1)] | None = None
    local_epochs: Pos | None = None

    @model_validator(mode="before")
    @classmethod
    def _default_steps(cls, data: Any) -> Any:
        if (isinstance(data, dict) and data.get("local_epochs") is None
                and "local_steps" not in data):
            return {**data, "local_steps": 10}
        return data

    @model_validator(mode="after")
    def _one_budget(self) -> ClientConfig:
        if self.local_steps is not None and self.local_epochs is not None:
            raise ValueError(
                "set either local_steps or local_epochs, not both "
                f"(got local_steps={self.local_steps}, local_epochs={self.local_epochs})"
            )
        if self.local_steps is None and self.local_epochs is None:
            raise ValueError("set local_steps or local_epochs")
        return self


class RunConfig(SchemaModel):
    """When a run stops. Durations are emulated seconds."""

    time_budget: Pos | None = 60.0
    max_updates: Annotated[int, Field(ge=1)] | None = None
    max_rounds: Annotated[int, Field(ge=1)] | None = None
    target_accuracy: Prob | None = None
    stop_at_target: bool = False
    dilation: Pos | Literal["auto"] = 1.0
    # the server checkpoints (model, algorithm state, counters, log offsets)
    # every this many aggregations (updates or rounds, as the algorithm
    # counts them) or real seconds, whichever comes first; 0 turns either off
    checkpoint_every: Annotated[int, Field(ge=0)] = 50
    checkpoint_seconds: NonNeg = 30.0

    @model_validator(mode="after")
    def _some_limit(self) -> RunConfig:
        if self.time_budget is None and self.max_updates is None and self.max_rounds is None:
            raise ValueError("set at least one of time_budget, max_updates, max_rounds")
        return self


class EvalConfig(SchemaModel):
    """How often the global model is evaluated on the held-out test set."""

    every_updates: Annotated[int, Field(ge=1)] | None = None
    every_rounds: Annotated[int, Field(ge=1)] | None = 1
    every_seconds: Pos | None = None


class DeployConfig(SchemaModel):
    """Processes, sockets and limits (one host or many)."""

    # client-host processes of `fedsim run` (0: one per core)
    hosts: Annotated[int, Field(ge=0)] = 0
    transport: Literal["ipc", "tcp"] = "ipc"
    loop: Literal["uvloop", "asyncio"] = "uvloop"
    max_message_mb: Pos = 512.0
    # real seconds to wait for client hosts to register before the federation
    # starts with those present (the missing ones are named)
    start_timeout: Pos = 120.0
    # real seconds of silence after which a host (or, seen from a host, the
    # server) is taken for dead; hosts probe the server's clock every 2 s
    host_timeout: Annotated[float, Field(ge=5.0)] = 15.0
    # the longest real transit a message may claim (now - its send time); a
    # claim outside [now - this, now + clock uncertainty] is clamped and counted
    max_transit_ms: Pos = 1000.0
    # messages per real second one client host may send, averaged over 5 s;
    # beyond it messages are rejected (counted, logged)
    max_host_rate: Pos = 5000.0
    # messages per real second one client may send (updates, ready, leave),
    # averaged over 5 s, and the largest message without a model a host may
    # send (event batches, goodbyes), in MB
    max_client_rate: Pos = 200.0
    max_control_mb: Pos = 16.0


class Scenario(SchemaModel):
    """A whole experiment."""

    name: str = "scenario"
    seed: Annotated[int, Field(ge=0, lt=2**63)] = 0
    data: DataConfig = DataConfig()
    model: ModelConfig = ModelConfig()
    algorithm: SerializeAsAny[AlgorithmConfig] = Field(
        default_factory=lambda: _algorithm_config({"name": DEFAULT_ALGORITHM}))
    client: ClientConfig = ClientConfig()
    run: RunConfig = RunConfig()
    eval: EvalConfig = EvalConfig()
    network: NetworkConfig = NetworkConfig()
    devices: DevicesConfig = DevicesConfig()
    availability: AvailabilityConfig = AvailabilityConfig()
    deploy: DeployConfig = DeployConfig()

    @field_validator("algorithm", mode="before")
    @classmethod
    def _registered_algorithm(cls, raw: Any) -> AlgorithmConfig:
        return _algorithm_config(raw)

    @model_validator(mode="after")
    def _optimizer_fits_algorithm(self) -> Scenario:
        allowed = algorithms.get(self.algorithm.name).optimizers
        if allowed is not None and self.client.optimizer not in allowed:
            raise ValueError(
                f"client.optimizer = {self.client.optimizer!r} does not run under "
                f"algorithm {self.algorithm.name!r}: allowed {', '.join(allowed)}")
        return self


def _describe(err: dict[str, Any], prefix: str = "") -> str:
    loc = prefix + ".".join(str(p) for p in err["loc"])
    loc = loc.replace("function-after[", "").rstrip("]") or "(top level)"
    value = err.get("input")
    msg = err["msg"]
    if err["type"] == "value_error":
        msg = msg.removeprefix("Value error, ")
        if loc == "(top level)":  # a cross-section rule names its own keys
            return msg
    if err["type"] == "extra_forbidden":
        return f"{loc}: unknown key (value {value!r})"
    if err["type"] == "union_tag_invalid":
        return f"{loc}.name: {msg}"
    if isinstance(value, dict):
        return f"{loc}: {msg}"
    return f"{loc}: {msg} (got {value!r})"


def parse(raw: dict[str, Any], source: str = "scenario") -> Scenario:
    """Validate a raw mapping into a :class:`Scenario`.

    The ``[algorithm]`` table is validated with its registered algorithm's
    config first, so its errors carry their own keys; every error of the
    whole scenario is reported at once.
    """
    lines: list[str] = []
    alg = raw.get("algorithm", {})
    if isinstance(alg, dict):
        try:
            alg = _algorithm_config(alg)
        except ValidationError as exc:
            lines += [_describe(e, "algorithm.") for e in exc.errors(include_url=False)]
            alg = _algorithm_config({})
        except ValueError as exc:
            lines.append(f"algorithm.{exc}")
            alg = _algorithm_config({})
    try:
        sc = Scenario.model_validate({**raw, "algorithm": alg})
    except ValidationError as exc:
        lines += [_describe(e) for e in exc.errors(include_url=False)]
    if lines:
        raise ScenarioError(f"{source}: invalid scenario\n  " + "\n  ".join(lines)) from None
    return sc


def _coerce(text: str) -> Any:
    """Interpret a ``--set`` value as TOML (numbers, booleans, arrays, strings)."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``dotted.key=value`` overrides to a raw scenario mapping."""
    out = json.loads(json.dumps(raw))
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ScenarioError(f"--set {item!r}: expected dotted.key=value")
        parts = key.strip().split(".")
        node = out
        for part in parts[:-1]:
            nxt = node.setdefault(part, {})
            if not isinstance(nxt, dict):
                raise ScenarioError(f"--set {item!r}: {part!r} is not a table")
            node = nxt
        node[parts[-1]] = _coerce(value.strip())
    return out


def load(path: str | Path, overrides: list[str] | None = None) -> Scenario:
    """Load, override and validate a scenario file."""
    p = Path(path)
    try:
        raw = tomllib.loads(p.read_text())
    except FileNotFoundError:
        raise ScenarioError(f"{p}: no such scenario file") from None
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"{p}: not valid TOML: {exc}") from None
    return parse(apply_overrides(raw, overrides or []), str(p))


#: Resolved keys the server settles at run time and sends to every host in
#: ``Start`` (a measured step time, an automatic dilation): not hashed.
RUNTIME_KEYS = (("run", "dilation"), ("devices", "host_step_time"))


def scenario_hash(data: dict[str, Any]) -> str:
    """SHA-256 of a resolved scenario's canonical JSON (hosts must run the server's).

    ``RUNTIME_KEYS`` are left out: the server decides them and tells the hosts.
    """
    import copy
    import hashlib

    data = copy.deepcopy(data)
    for table, key in RUNTIME_KEYS:
        if isinstance(data.get(table), dict):
            data[table].pop(key, None)
    text = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def resolved(scenario: Scenario) -> dict[str, Any]:
    """The scenario with every default filled in, as plain data."""
    return scenario.model_dump(mode="json")


def _inline(table: dict[str, Any]) -> str:
    """A TOML inline table (``None`` omitted)."""
    items = ", ".join(f"{k} = {_inline(v) if isinstance(v, dict) else json.dumps(v)}"
                      for k, v in table.items() if v is not None)
    return f"{{ {items} }}"


def to_toml(data: dict[str, Any]) -> str:
    """Render a resolved scenario as TOML (tables last, ``None`` omitted)."""
    lines: list[str] = []

    def emit(table: dict[str, Any], prefix: str) -> None:
        def is_array_of_tables(v: Any) -> bool:
            return isinstance(v, list) and bool(v) and all(isinstance(x, dict) for x in v)

        scalars = {k: v for k, v in table.items()
                   if not isinstance(v, dict) and not is_array_of_tables(v)}
        tables = {k: v for k, v in table.items() if isinstance(v, dict)}
        arrays = {k: v for k, v in table.items() if is_array_of_tables(v)}
        if prefix and scalars and not prefix.startswith("[["):
            lines.append(f"\n[{prefix}]")
        for k, v in scalars.items():
            if v is not None:
                lines.append(f"{k} = {json.dumps(v)}")
        for k, v in tables.items():
            emit(v, f"{prefix}.{k}" if prefix else k)
        for k, items in arrays.items():
            for item in items:
                lines.append(f"\n[[{prefix}.{k}]]" if prefix else f"\n[[{k}]]")
                flat = {ik: iv for ik, iv in item.items() if not isinstance(iv, dict)}
                for ik, iv in flat.items():
                    if iv is not None:
                        lines.append(f"{ik} = {json.dumps(iv)}")
                for ik, iv in item.items():
                    if isinstance(iv, dict):
                        lines.append(f"{ik} = {_inline(iv)}")

    emit(data, "")
    return "\n".join(lines).lstrip() + "\n"
