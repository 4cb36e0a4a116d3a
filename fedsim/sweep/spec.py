"""Building a sweep: the ``[sweep]`` file and command-line additions, resolved into points.

A :class:`Sweep` is what ``sweep.json`` holds and what resumes a sweep; its
:meth:`Sweep.points` are the runs (variants x grid x seeds), each a
:class:`Point` with the ``--set`` overrides of its ``fedsim run``.
"""

from __future__ import annotations

import itertools
import json
import re
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedsim.errors import FedsimError, ScenarioError
from fedsim.scenario import load


class SweepError(FedsimError, ValueError):
    """A sweep that cannot be built or resumed; the message says which key or file."""


@dataclass(frozen=True)
class Variant:
    """A named set of overrides crossed with the grid; ``seeds``, when given,
    replaces the sweep's seeds for this variant (an ablation on fewer seeds)."""

    label: str
    set: dict[str, Any]
    seeds: list[int] | None = None


@dataclass(frozen=True)
class Point:
    """One run of a sweep."""

    variant: str
    grid: tuple[tuple[str, Any], ...]
    seed: int
    overrides: tuple[tuple[str, Any], ...]

    @property
    def key(self) -> str:
        """A directory name that identifies the point within its sweep."""
        parts = [_slug(self.variant)] if self.variant else []
        parts += [f"{short_key(k)}={_slug(toml_literal(v))}" for k, v in self.grid]
        parts.append(f"seed={self.seed}")
        return ",".join(parts)

    def set_args(self) -> list[str]:
        """The overrides as ``--set`` arguments (TOML literals)."""
        return [f"{k}={toml_literal(v)}" for k, v in self.overrides]


@dataclass
class Sweep:
    """A resolved sweep: everything needed to run it and to resume it."""

    scenario: Path
    seeds: list[int]
    set: dict[str, Any] = field(default_factory=dict)
    grid: dict[str, list[Any]] = field(default_factory=dict)
    variants: list[Variant] = field(default_factory=list)
    target_accuracy: float | None = None
    plot: dict[str, Any] = field(default_factory=dict)
    name: str | None = None
    #: grid key -> {other key: values}: the i-th value of each goes with the
    #: grid key's i-th value (a dilation per latency, say)
    with_: dict[str, dict[str, list[Any]]] = field(default_factory=dict)
    #: the most of its runs under way at once (None: as many as the scheduler
    #: finds room for): a limit measured for runs whose verdicts break beside
    #: more of their kind, whatever their mean load says
    max_jobs: int | None = None

    def points(self) -> list[Point]:
        """Every point: variants x grid x seeds, in that nesting order."""
        variants = self.variants or [Variant("", {})]
        keys = list(self.grid)
        combos = list(itertools.product(*(self.grid[k] for k in keys))) if keys else [()]
        out = []
        base = self._base_algorithm()   # read the base file once, not per point
        for var in variants:
            for combo in combos:
                for seed in var.seeds or self.seeds:
                    over: dict[str, Any] = dict(self.set)
                    if self.target_accuracy is not None:
                        over["run.target_accuracy"] = self.target_accuracy
                    over.update(var.set)
                    for k, v in zip(keys, combo, strict=True):
                        over.update((part, v) for part in k.split("+"))
                        i = self.grid[k].index(v)
                        over.update((o, vs[i]) for o, vs in self.with_.get(k, {}).items())
                    over["seed"] = seed
                    out.append(Point(var.label, tuple(zip(keys, combo, strict=True)), seed,
                                     tuple(self._switch_algorithm(over, base).items())))
        return out

    def _switch_algorithm(self, over: dict[str, Any], base: Any) -> dict[str, Any]:
        """A point that names another algorithm than the base scenario gets a
        fresh ``[algorithm]`` table: that algorithm's defaults plus the
        point's own ``algorithm.*`` keys (the base's keys belong to the base's
        algorithm and would not validate under another)."""
        name = over.get("algorithm.name")
        if name is None or name == base:
            return over
        table = {k.removeprefix("algorithm."): v for k, v in over.items()
                 if k.startswith("algorithm.")}
        rest = {k: v for k, v in over.items() if not k.startswith("algorithm.")}
        return {"algorithm": _unflatten(table), **rest}

    def _base_algorithm(self) -> Any:
        try:
            raw = tomllib.loads(self.scenario.read_text())
        except (OSError, tomllib.TOMLDecodeError):
            return None
        alg = raw.get("algorithm")
        return alg.get("name") if isinstance(alg, dict) else None

    def to_json(self) -> dict[str, Any]:
        """The sweep as plain data (what sweep.json holds)."""
        return {"scenario": str(self.scenario), "seeds": self.seeds, "set": self.set,
                "grid": self.grid,
                "variants": [{"label": v.label, "set": v.set}
                             | ({"seeds": v.seeds} if v.seeds is not None else {})
                             for v in self.variants],
                "target_accuracy": self.target_accuracy, "plot": self.plot, "name": self.name,
                "with": self.with_} | ({"max_jobs": self.max_jobs} if self.max_jobs else {})

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Sweep:
        """Inverse of :meth:`to_json`."""
        return cls(scenario=Path(data["scenario"]), seeds=list(data["seeds"]),
                   set=dict(data.get("set") or {}), grid=dict(data.get("grid") or {}),
                   variants=[Variant(v["label"], dict(v["set"]),
                                     list(v["seeds"]) if v.get("seeds") is not None else None)
                             for v in data.get("variants") or []],
                   target_accuracy=data.get("target_accuracy"), plot=dict(data.get("plot") or {}),
                   name=data.get("name"), with_=dict(data.get("with") or {}),
                   max_jobs=data.get("max_jobs"))

    def check(self) -> dict[str, float | None]:
        """Validate every point's scenario before anything runs (all errors at once).

        Returns each point's own dilation (its scenario's ``run.dilation``
        with the point's overrides; None for ``"auto"``), by point key.
        """
        dilations: dict[str, float | None] = {}
        if not self.scenario.is_file():
            raise SweepError(f"sweep.scenario: no such scenario file {self.scenario}")
        problems: list[str] = []
        seen: set[str] = set()
        seen_text: set[str] = set()
        for p in self.points():
            if p.key in seen:
                raise SweepError(f"two points share the name {p.key!r}: give the variants "
                                 "different labels")
            seen.add(p.key)
            try:
                d = load(self.scenario, p.set_args()).run.dilation
                dilations[p.key] = None if d == "auto" else float(d)
            except ScenarioError as exc:
                text = str(exc).split("\n", 1)[-1].strip()
                where = ", ".join([f"variant {p.variant!r}"] * bool(p.variant)
                                  + [f"{k}={toml_literal(v)}" for k, v in p.grid])
                if text not in seen_text:   # seeds repeat the same mistake
                    seen_text.add(text)
                    problems.append(f"point {where or '(base)'}: {text}")
                if len(problems) >= 5:
                    break
        if problems:
            raise SweepError("invalid sweep\n  " + "\n  ".join(problems))
        return dilations

    def expected_real(self) -> dict[str, float]:
        """About how many real seconds each point's run takes, by point key: its
        emulated time budget times its dilation (1 for ``"auto"``), where the
        budget is what ends it; 0 (not known) for a run that may end sooner, by
        its rounds, updates or target accuracy, whose budget only bounds it (a
        pool of the claims' sweeps that ordered by the bound ran DG-1's
        20-round runs, 40 real s each, first, as if they took 6,000 s, and
        AsyncFedED's 455 s runs, which end by their budget, last)."""
        out: dict[str, float] = {}
        for p in self.points():
            run = load(self.scenario, p.set_args()).run
            d = 1.0 if run.dilation == "auto" else float(run.dilation)
            sooner = (run.max_rounds is not None or run.max_updates is not None
                      or (run.target_accuracy is not None and run.stop_at_target))
            out[p.key] = 0.0 if sooner else float(run.time_budget or 0.0) * d
        return out


# -- building a sweep ---------------------------------------------------------

_SWEEP_KEYS = {"scenario", "seeds", "set", "grid", "with", "variant", "target_accuracy", "plot",
               "name", "max_jobs"}
_PLOT_KEYS = {"x", "y", "logx", "normalize"}


def _seeds(value: Any, where: str) -> list[int]:
    if isinstance(value, bool):
        raise SweepError(f"{where}: seeds must be a count or a list of integers (got {value!r})")
    if isinstance(value, int):
        if value < 1:
            raise SweepError(f"{where}: seeds must be at least 1 (got {value})")
        return list(range(1, value + 1))
    if (isinstance(value, list) and value and all(isinstance(s, int) and not isinstance(s, bool)
                                                  and s >= 0 for s in value)):
        if len(set(value)) != len(value):
            raise SweepError(f"{where}: a seed is listed twice ({value})")
        return list(value)
    raise SweepError(f"{where}: seeds must be a count or a list of integers >= 0 (got {value!r})")


def _table(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise SweepError(f"{where}: expected a table of dotted.key = value")
    return _flatten(value)


def _flatten(table: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"algorithm": {"name": "x"}}`` and ``{"algorithm.name": "x"}`` alike."""
    out: dict[str, Any] = {}
    for k, v in table.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _unflatten(flat: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, v in flat.items():
        node = out
        *head, last = key.split(".")
        for part in head:
            node = node.setdefault(part, {})
        node[last] = v
    return out


def load_sweep(path: str | Path, *, grid: Iterable[str] = (), sets: Iterable[str] = (),
               seeds: int | None = None, target: float | None = None) -> Sweep:
    """A sweep file (a TOML file with a ``[sweep]`` table), with command-line additions.

    Example::

        [sweep]
        scenario = "dg1.toml"          # relative to this file
        seeds = 3                      # seeds 1..3, or a list [1, 2, 3]
        target_accuracy = 0.8          # sets run.target_accuracy on every point
        max_jobs = 2                   # optional: at most this many of its runs at once
        [sweep.set]                    # on every point
        "run.max_rounds" = 40
        [sweep.grid]                   # the cartesian product; a+b sets both keys
        "network.up.delay+network.down.delay" = [0.001, 0.01, 0.1, 1.0]
        [sweep.with."network.up.delay+network.down.delay"]
        "run.dilation" = [2.0, 1.0, 0.5, 0.25]   # paired with the delays, one each
        [[sweep.variant]]              # each crossed with the grid
        label = "FedAvg K=5"
        set = { "algorithm.name" = "fedavg", "algorithm.local_steps" = 5 }
        seeds = 2                      # optional: this variant's own seeds
        [sweep.plot]                   # optional
        x = "network.delay"            # a grid key or "variant"; default: the first
                                       # numeric grid key, else the first that varies
        y = ["emulated_seconds"]       # default: accuracy, time, time to target
        logx = true                    # default: when x spans over two decades
        normalize = "FedAvg K=5"       # times relative to this variant's mean at the first x
    """
    p = Path(path)
    try:
        raw = tomllib.loads(p.read_text())
    except FileNotFoundError:
        raise SweepError(f"{p}: no such file") from None
    except tomllib.TOMLDecodeError as exc:
        raise SweepError(f"{p}: not valid TOML: {exc}") from None
    spec = raw.get("sweep")
    if not isinstance(spec, dict):
        raise SweepError(f"{p}: not a sweep file (it has no [sweep] table)")
    unknown = set(spec) - _SWEEP_KEYS
    if unknown:
        raise SweepError(f"{p}: sweep.{sorted(unknown)[0]}: unknown key "
                         f"(allowed: {', '.join(sorted(_SWEEP_KEYS))})")
    if "scenario" not in spec or not isinstance(spec["scenario"], str):
        raise SweepError(f"{p}: sweep.scenario: give the base scenario file (a path "
                         "relative to the sweep file)")
    base = (p.parent / spec["scenario"]).resolve()
    grid_table = _table(spec.get("grid", {}), f"{p}: sweep.grid")
    for k, v in grid_table.items():
        if not isinstance(v, list) or not v:
            raise SweepError(f"{p}: sweep.grid.{k}: expected a non-empty list of values")
    with_: dict[str, dict[str, list[Any]]] = {}
    for gk, companions in (spec.get("with") or {}).items():
        where = f"{p}: sweep.with.{gk}"
        if gk not in grid_table:
            raise SweepError(f"{where}: {gk!r} is not a grid key ({', '.join(grid_table)})")
        table = _table(companions, where)
        for ck, cv in table.items():
            if not isinstance(cv, list) or len(cv) != len(grid_table[gk]):
                raise SweepError(f"{where}.{ck}: expected a list of {len(grid_table[gk])} "
                                 f"values, one per value of {gk}")
        if len({json.dumps(v) for v in grid_table[gk]}) != len(grid_table[gk]):
            raise SweepError(f"{where}: the grid key's values must differ to be paired")
        with_[gk] = table
    variants = []
    for i, v in enumerate(spec.get("variant", [])):
        where = f"{p}: sweep.variant[{i}]"
        if not isinstance(v, dict) or not isinstance(v.get("label"), str) or not v["label"]:
            raise SweepError(f"{where}: each variant needs a label = \"...\"")
        extra = set(v) - {"label", "set", "seeds"}
        if extra:
            raise SweepError(f"{where}.{sorted(extra)[0]}: unknown key "
                             "(allowed: label, set, seeds)")
        variants.append(Variant(v["label"], _table(v.get("set", {}), f"{where}.set"),
                                _seeds(v["seeds"], f"{where}.seeds") if "seeds" in v else None))
    labels = [v.label for v in variants]
    if len(set(labels)) != len(labels):
        raise SweepError(f"{p}: two variants share a label ({labels})")
    plot = spec.get("plot", {})
    if not isinstance(plot, dict) or set(plot) - _PLOT_KEYS:
        raise SweepError(f"{p}: sweep.plot: allowed keys {', '.join(sorted(_PLOT_KEYS))}")
    tgt = spec.get("target_accuracy")
    if tgt is not None and not (isinstance(tgt, (int, float)) and 0 < tgt <= 1):
        raise SweepError(f"{p}: sweep.target_accuracy: a fraction in (0, 1] (got {tgt!r})")
    mj = spec.get("max_jobs")
    if mj is not None and (type(mj) is not int or mj < 1):
        raise SweepError(f"{p}: sweep.max_jobs: a whole number of runs, at least 1 (got {mj!r})")
    sweep = Sweep(scenario=base, seeds=_seeds(spec.get("seeds", 1), f"{p}: sweep.seeds"),
                  set=_table(spec.get("set", {}), f"{p}: sweep.set"), grid=grid_table,
                  variants=variants, target_accuracy=tgt, plot=plot,
                  name=spec.get("name") or p.name.removesuffix(".toml").removesuffix(".sweep"),
                  with_=with_, max_jobs=mj)
    return _add_cli(sweep, grid, sets, seeds, target)


def sweep_from_scenario(path: str | Path, *, grid: Iterable[str] = (), sets: Iterable[str] = (),
                        seeds: int | None = None, target: float | None = None) -> Sweep:
    """A sweep of a plain scenario file, built from the command line."""
    p = Path(path)
    sweep = Sweep(scenario=p.resolve(), seeds=[1], name=p.stem)
    return _add_cli(sweep, grid, sets, seeds, target)


def _add_cli(sweep: Sweep, grid: Iterable[str], sets: Iterable[str], seeds: int | None,
             target: float | None) -> Sweep:
    for item in grid:
        key, values = parse_grid(item)
        if key in sweep.with_ and len(values) != len(sweep.grid[key]):
            raise SweepError(f"--grid {key}: the sweep file pairs {len(sweep.grid[key])} values "
                             f"of it with {', '.join(sweep.with_[key])} (sweep.with)")
        sweep.grid[key] = values
    for item in sets:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise SweepError(f"--set {item!r}: expected dotted.key=value")
        sweep.set[key.strip()] = _coerce(value.strip(), f"--set {item!r}")
    if seeds is not None:        # every variant's, its own included
        sweep.seeds = _seeds(seeds, "--seeds")
        sweep.variants = [Variant(v.label, v.set) for v in sweep.variants]
    if target is not None:
        sweep.target_accuracy = target
    return sweep


def _split_top(text: str) -> list[str]:
    """Split on commas outside brackets, braces and quotes."""
    out: list[str] = []
    cur: list[str] = []
    depth, quote = 0, ""
    for ch in text:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append("".join(cur))
            cur = []
            continue
        cur.append(ch)
    out.append("".join(cur))
    return [s.strip() for s in out]


def _coerce(text: str, where: str) -> Any:
    """A TOML value; a bare word (no quotes) is taken as a string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        if re.fullmatch(r"[A-Za-z_][\w.:/-]*", text):
            return text
        raise SweepError(f"{where}: {text!r} is not a TOML value (quote strings, close "
                         "brackets)") from None


def parse_grid(item: str) -> tuple[str, list[Any]]:
    """``key=v1,v2,...`` -> (key, [values]); values are TOML (``[64],[128]`` works)."""
    key, sep, values = item.partition("=")
    if not sep or not key.strip() or not values.strip():
        raise SweepError(f"--grid {item!r}: expected dotted.key=v1,v2,...")
    parsed = [_coerce(v, f"--grid {item!r}") for v in _split_top(values)]
    if any(v == "" for v in parsed):
        raise SweepError(f"--grid {item!r}: an empty value")
    return key.strip(), parsed


def toml_literal(v: Any) -> str:
    """A TOML literal for a plain value."""
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {toml_literal(x)}" for k, x in v.items()) + " }"
    if isinstance(v, list):
        return "[" + ", ".join(toml_literal(x) for x in v) + "]"
    return json.dumps(v)


def grid_cell(v: Any) -> Any:
    """A grid value as a table's cell holds it: a list or table as its TOML literal,
    anything else as it is."""
    return toml_literal(v) if isinstance(v, (list, dict)) else v


def short_key(key: str) -> str:
    """A grid key's short name: ``network.up.delay+network.down.delay`` -> ``delay``."""
    return key.split("+")[0].rsplit(".", 1)[-1]


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.=+-]+", "_", text).strip("_") or "_"
