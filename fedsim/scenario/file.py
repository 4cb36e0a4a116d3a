"""A scenario file: its top-level model, loading, overrides, resolving and writing back.

A scenario is a TOML file validated on load into frozen pydantic models:
an unknown key, a wrong type or an out-of-range value raises
:class:`ScenarioError` whose message names the key, the value and what is
allowed (the CLI exits with status 2; :mod:`fedsim.scenario.explain` words it).
Overrides (``--set dotted.key=value``, ``overrides=`` of :func:`fedsim.load`)
go through the same validation, and an error they cause is blamed on them
(:class:`~fedsim.errors.OverrideError` when only they are wrong).
:func:`resolved` gives the scenario with every default filled in, which each
run writes to its directory (:mod:`fedsim.scenario.notes` says which of those
keys nothing reads, or replace a profile's). A scenario file that sets a client
optimizer option the chosen optimizer does not read is refused on load
(:func:`load`).

``algorithm.name``, ``model.name`` and ``data.dataset`` also accept a
plug-in: a ``module:attribute`` reference or an entry-point name
(:mod:`fedsim.scenario.plugins`).

pydantic does this job better than hand-written checks: it reports every
bad field at once, with its location, and it fills the defaults we write
back out.
"""

from __future__ import annotations

import copy
import hashlib
import json
import tomllib
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    Field,
    SerializeAsAny,
    ValidationError,
    field_validator,
    model_validator,
)

from fedsim import algorithms
from fedsim.algorithms import AlgorithmConfig, AlgorithmSpec
from fedsim.data import path_problem
from fedsim.errors import OverrideError, PluginError, ScenarioError
from fedsim.scenario import overrides as _overrides
from fedsim.scenario import plugins
from fedsim.scenario.explain import Problem, explain
from fedsim.scenario.netconfig import AvailabilityConfig, DevicesConfig, NetworkConfig
from fedsim.scenario.overrides import Override
from fedsim.scenario.sections import (
    DATASETS,
    OPTIMIZER_KEYS,
    ClientConfig,
    DataConfig,
    DeployConfig,
    EvalConfig,
    ModelConfig,
    RunConfig,
    optimizer_options,
)
from fedsim.schema import SchemaModel

__all__ = [
    "DEFAULT_ALGORITHM",
    "Scenario",
    "apply_overrides",
    "load",
    "parse",
    "resolved",
    "scenario_hash",
    "to_toml",
    "unread_options",
]

#: The algorithm of an ``[algorithm]`` table without a ``name``.
DEFAULT_ALGORITHM = "fedasync"


def _spec(name: Any) -> AlgorithmSpec:
    """The spec ``algorithm.name`` stands for: registered, or a plug-in (ValueError if none)."""
    if not isinstance(name, str):
        raise ValueError(f"must be a string (got {name!r})")
    try:
        return algorithms.get(name)
    except KeyError:
        pass
    obj = plugins.resolve("algorithm", name, tuple(sorted(algorithms.algorithm_names())))
    if not isinstance(obj, AlgorithmSpec):
        raise PluginError(f"{name!r} is a {type(obj).__name__}, not an AlgorithmSpec "
                         "(fedsim.algorithms.api; see fedsim.scenario.plugins)")
    if not (isinstance(obj.config, type) and issubclass(obj.config, AlgorithmConfig)):
        raise PluginError(f"{name!r}'s config {obj.config!r} does not subclass "
                          "fedsim.algorithms.api.AlgorithmConfig")
    return obj


def _algorithm(raw: dict[str, Any]) -> tuple[AlgorithmConfig | None, list[Problem]]:
    """Validate an ``[algorithm]`` table with its algorithm's config: the config, or problems.

    A plug-in's config declares its own ``name``; the table keeps the name
    the scenario used (the reference), so every process finds it again.
    """
    name = raw.get("name", DEFAULT_ALGORITHM)
    try:
        spec = _spec(name)
    except ValueError as exc:
        return None, [Problem(("algorithm", "name"), str(exc),
                              plugin=isinstance(exc, PluginError))]
    own = name if name in spec.names else spec.names[0]
    try:
        cfg = spec.config.model_validate({**raw, "name": own})
    except ValidationError as exc:
        return None, explain(exc, spec.config, ("algorithm",))
    except Exception as exc:  # a plug-in's own validator failing otherwise
        return None, [Problem(("algorithm",), f"{type(exc).__name__}: {exc}")]
    if own != name:
        cfg = cfg.model_copy(update={"name": name})
    for key, ref in cfg.modules().items():
        try:
            plugins.locate(ref)
        except ValueError as exc:
            return None, [Problem(("algorithm", key), str(exc), plugin=True)]
    return cfg.with_spec(spec), []


def _algorithm_config(raw: Any) -> AlgorithmConfig:
    """An ``[algorithm]`` table as its algorithm's config (ValueError listing the problems)."""
    if isinstance(raw, AlgorithmConfig):
        return raw
    if not isinstance(raw, dict):
        raise ValueError(f"must be a table (got {raw!r})")
    cfg, problems = _algorithm(raw)
    if cfg is None:
        raise ValueError("; ".join(p.line() for p in problems))
    return cfg



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
        allowed = self.algorithm.spec.optimizers
        if allowed is not None and self.client.optimizer not in allowed:
            raise ValueError(
                f"client.optimizer = {self.client.optimizer!r} does not run under "
                f"algorithm {self.algorithm.name!r}: allowed {', '.join(allowed)}")
        return self


def _error(source: str, problems: list[Problem], overrides: Sequence[Override],
           base: Mapping[str, Any] | None) -> ScenarioError:
    """One error listing every problem, each blamed on its override if it has one.

    ``base`` is the scenario before the overrides (None: not known): an
    override that made a table the file lacks is blamed for its errors.
    """
    lines: list[str] = []
    blamed: list[Override] = []
    for p in problems:
        o = _overrides.blame(p.loc, p.text, overrides, base)
        if o is None:
            lines.append(p.line())
        else:
            lines.append(f"{p.line()} (from {o.label})")
            blamed.append(o)
    body = "\n  " + "\n  ".join(lines)
    if blamed and len(blamed) == len(problems):
        origin = blamed[0].origin
        where = f" (not in {source})" if source != "scenario" else ""
        return OverrideError(f"invalid override from {origin}{where}{body}",
                             keys=[o.dotted for o in blamed], origin=origin, source=source,
                             problems=lines)
    if all(p.plugin for p in problems):
        return PluginError(f"{source}: plug-in not found{body}", source=source, problems=lines)
    return ScenarioError(f"{source}: invalid scenario{body}", source=source, problems=lines)


def parse(raw: dict[str, Any], source: str = "scenario",
          overrides: Sequence[Override] = (), *,
          base: Mapping[str, Any] | None = None, written: bool = False,
          runs_here: bool = False) -> Scenario:
    """Validate a raw mapping into a :class:`Scenario`.

    The ``[algorithm]`` table is validated with its algorithm's config
    first, so its errors carry their own keys; every error of the whole
    scenario is reported at once. ``overrides`` are those already applied to
    ``raw``: an error at a key one of them set is said to come from it, as
    is an error at a table one of them made where ``base`` (``raw`` before
    the overrides) has none (``--set netwrk.up.delay=0.1``'s ``netwrk``).

    ``written``: ``raw`` is a scenario as a person gave it (a file, a
    mapping, a scenario derived through overrides), not one read back (a
    run's ``scenario.json``, read by its hosts or by a reader on another
    machine): a client optimizer option it sets that the chosen optimizer
    does not read is an error (:func:`unread_options`). A ``[client]`` table
    that holds every key a resolved one does (``fedsim check``'s output, a
    run's ``scenario.toml``, a scenario derived from another) was filled in,
    not written: only the keys ``overrides`` set are held to that rule.

    ``runs_here``: the scenario is to run on this machine (``fedsim check``,
    ``fedsim run``, :func:`fedsim.load`; not ``fedsim slurm`` on a login
    node): a built-in dataset's ``data.path`` must be there, as its loader
    needs it (:func:`fedsim.data.path_problem`; no data is read).
    """
    problems: list[Problem] = []
    alg = raw.get("algorithm", {})
    if isinstance(alg, dict):
        cfg, problems = _algorithm(alg)
        alg = cfg if cfg is not None else _algorithm_config({})
    try:
        sc = Scenario.model_validate({**raw, "algorithm": alg})
    except ValidationError as exc:
        problems += explain(exc, Scenario)
    else:
        if written:
            problems += unread_options(sc.client, overrides, base,
                                       _written_client_keys(raw, sc, overrides))
    if runs_here and not any(p.loc[:2] == ("data", "path") for p in problems):
        problems += _data_path(raw)
    if problems:
        raise _error(source, problems, overrides, base) from None
    return sc


def _data_path(raw: Mapping[str, Any]) -> list[Problem]:
    """``data.path`` as a built-in dataset's loader needs it here (none for a plug-in).

    Read from ``raw``, so that it is reported with the scenario's other problems."""
    data = raw.get("data")
    data = data if isinstance(data, Mapping) else {}
    dataset = data.get("dataset", DataConfig.model_fields["dataset"].default)
    path = data.get("path")
    if dataset not in DATASETS or not isinstance(path, str | None):
        return []  # a plug-in, or a path of a wrong type (its own error)
    why = path_problem(dataset, path)
    return [] if why is None else [Problem(("data", "path"), why)]


def _written_client_keys(raw: Mapping[str, Any], sc: Scenario,
                         overrides: Sequence[Override]) -> Collection[str] | None:
    """The ``[client]`` keys a person wrote: None (the table's own) unless ``raw``'s
    table holds every key the resolved scenario's does; then those ``overrides`` set."""
    table = raw.get("client")
    filled = {k for k, v in resolved(sc)["client"].items() if v is not None}  # TOML omits None
    if not isinstance(table, Mapping) or not filled <= set(table):
        return None
    keys: set[str] = set()
    for o in overrides:
        if o.key[0] == "client" and len(o.key) > 1:
            keys.add(o.key[1])
        elif o.key == ("client",) and isinstance(o.value, Mapping):
            keys.update(str(k) for k in o.value)
    return keys


#: the optimizer of a ``[client]`` table that names none
_DEFAULT_OPTIMIZER: str = ClientConfig.model_fields["optimizer"].default


def unread_options(client: ClientConfig, overrides: Sequence[Override] = (),
                   base: Mapping[str, Any] | None = None,
                   written: Collection[str] | None = None) -> list[Problem]:
    """The optimizer options a written ``[client]`` table sets (``written``,
    by default its ``model_fields_set``) that its optimizer does not read,
    each a problem naming the key, the optimizer and the keys that optimizer
    reads.

    A key the file (``base``, the scenario before ``overrides``) sets for
    the file's own optimizer is no problem when an override chose another
    one: a sweep's point that switches optimizers keeps the file's options,
    which ``fedsim check`` then marks as unused. A key an override sets is
    held to the optimizer chosen.
    """
    opt = client.optimizer
    reads, foreign = optimizer_options(client)
    table = base.get("client") if base is not None else None
    own = table.get("optimizer", _DEFAULT_OPTIMIZER) if isinstance(table, Mapping) else None
    # the options of the file's own optimizer, when an override chose another
    kept = OPTIMIZER_KEYS.get(own, ()) if isinstance(own, str) and own != opt else ()
    out: list[Problem] = []
    set_keys = client.model_fields_set if written is None else written
    for key in foreign:
        if key not in set_keys:
            continue
        loc = ("client", key)
        if key in kept and not any(o.key == loc[:len(o.key)] for o in overrides):
            continue
        owners = [name for name, keys in OPTIMIZER_KEYS.items() if key in keys]
        out.append(Problem(loc, (
            f"set to {getattr(client, key)!r}, but optimizer {opt!r} does not read it "
            f"(it reads {', '.join(reads)}; {key} is read by {', '.join(owners)}): "
            "remove it, or choose an optimizer that reads it")))
    return out


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``dotted.key=value`` overrides (command-line syntax) to a raw scenario mapping."""
    return _overrides.apply(raw, _overrides.from_cli(overrides))


def _as_overrides(overrides: Sequence[str] | Sequence[Override] | Mapping[str, Any] | None
                  ) -> list[Override]:
    if overrides is None:
        return []
    if isinstance(overrides, Mapping):
        return _overrides.from_python(overrides)
    if all(isinstance(o, Override) for o in overrides):
        return list(overrides)  # type: ignore[arg-type]
    return _overrides.from_cli([str(o) for o in overrides])


def load(path: str | Path,
         overrides: Sequence[str] | Sequence[Override] | Mapping[str, Any] | None = None,
         *, runs_here: bool = True) -> Scenario:
    """Load, override and validate a scenario file.

    ``runs_here=False`` for a command that runs nothing here (``fedsim keys``,
    ``fedsim slurm`` on a login node): ``data.path`` is not looked at (see
    :func:`parse`).

    ``overrides``: ``"dotted.key=value"`` strings (command-line syntax, TOML
    values), :class:`~fedsim.scenario.overrides.Override` values, or a mapping of
    dotted keys to Python values. A plug-in module the scenario names is
    also looked for next to the file.
    """
    ovs = _as_overrides(overrides)
    p = Path(path)
    try:
        raw = tomllib.loads(p.read_text())
    except FileNotFoundError:
        raise ScenarioError(f"{p}: no such scenario file", source=str(p)) from None
    except IsADirectoryError:
        raise ScenarioError(f"{p}: is a directory, not a scenario file", source=str(p)) from None
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"{p}: not valid TOML: {exc}", source=str(p)) from None
    with plugins.searching(p.parent):
        return parse(_overrides.apply(raw, ovs), str(p), ovs, base=raw, written=True,
                     runs_here=runs_here)


#: Resolved keys the server settles at run time and sends to every host in
#: ``Start`` (a measured step time, an automatic dilation): not hashed.
RUNTIME_KEYS = (("run", "dilation"), ("devices", "host_step_time"))


def scenario_hash(data: dict[str, Any]) -> str:
    """SHA-256 of a resolved scenario's canonical JSON (hosts must run the server's).

    ``RUNTIME_KEYS`` are left out: the server decides them and tells the hosts.
    """
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


def to_toml(data: dict[str, Any], comments: Mapping[str, str] | None = None) -> str:
    """Render a resolved scenario as TOML (tables last, ``None`` omitted).

    ``comments`` maps dotted keys of plain values to a comment written
    after them (:func:`unused_keys`).
    """
    comments = comments or {}
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
                note = comments.get(f"{prefix}.{k}" if prefix else k)
                lines.append(f"{k} = {json.dumps(v)}" + (f"  # {note}" if note else ""))
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
