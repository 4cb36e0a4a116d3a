"""Sweeps: one scenario run over a grid of overrides, variants and seeds.

A sweep is a base scenario, overrides applied to every point (``set``), a
grid (the cartesian product of every key's values), optional named
*variants* (override sets, each crossed with the grid: "FedAvg K=5" beside
"DGA K=5 D=20") and seeds. Every point is a whole ``fedsim run`` in its own
process and its own run directory, so a point that crashes takes nothing
else with it, and any point can be rerun by hand with the command recorded
in its ``point.json``.

The output directory holds::

    sweep.json        the resolved sweep (what resumes it)
    runs/<point>/     one run directory per point (summary, metrics, events, plots)
    sweep.csv         one row per point: variant, grid values, seed, status,
                      verdict, attempts, dilation and the summary's figures
    aggregate.csv     per variant and grid point: n seeds, mean and 95 %
                      confidence half-width of every figure (Student's t)
    <figure>.png      each figure against the first grid key, one line per
                      variant, with the confidence interval as error bars

Faithfulness comes first. A point's figures count only if its fidelity
verdict passed. A point whose verdict fails is rerun with the dilation the
run suggested (or 1.5x its own, whichever is larger), up to
``max_attempts`` times, and then kept but *flagged* (``verdict = fail`` in
``sweep.csv``, left out of ``aggregate.csv``, named in the report), never
silently averaged in.

Points run in parallel only as far as the host keeps verdicts passing. With
``jobs = "auto"`` the sweep starts with one run, measures how many cores a
finished run really used (its process tree's CPU time over its real time,
from ``wait4``), and admits as many concurrent runs as fit in 75 % of the
cores by that measure (a run that mostly waits on emulated latency uses a
fraction of a core), never more than ``max_jobs`` nor more than memory
allows. A failed verdict halves the concurrency; each passing one lets it
grow by one run again.

A half-finished sweep resumes: run the same command again (or ``fedsim
sweep OUT_DIR``) and finished points are kept; a point whose run was
interrupted is run again from the start.
"""

from __future__ import annotations

import contextlib
import csv
import itertools
import json
import math
import os
import re
import sys
import time
import tomllib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedsim.errors import FedsimError
from fedsim.scenario import ScenarioError, load

__all__ = [
    "FIGURES",
    "Point",
    "PointResult",
    "Sweep",
    "SweepError",
    "SweepResult",
    "aggregate",
    "load_sweep",
    "parse_grid",
    "read_results",
    "run_sweep",
]

#: The figures taken from each run's summary.json into the tables: name ->
#: (dotted path in the summary, description).
FIGURES: dict[str, tuple[str, str]] = {
    "final_accuracy": ("final_accuracy", "test accuracy at the end"),
    "best_accuracy": ("best_accuracy", "best test accuracy seen"),
    "final_loss": ("final_loss", "test loss at the end"),
    "time_to_target_s": ("time_to_target_s", "emulated s to the target accuracy"),
    "emulated_seconds": ("emulated_seconds", "emulated s to the end of the run"),
    "real_seconds": ("real_seconds", "real s the run took"),
    "updates": ("updates", "updates aggregated"),
    "rounds": ("rounds", "rounds closed"),
    "bytes_up": ("bytes_up", "bytes clients sent"),
    "bytes_down": ("bytes_down", "bytes the server sent"),
    "staleness_mean": ("staleness.mean", "mean staleness of aggregated updates"),
    "staleness_p99": ("staleness.p99", "p99 staleness"),
    "lateness_p99_ms": ("fidelity.lateness_ms.p99", "p99 delivery lateness (ms)"),
}


class SweepError(FedsimError, ValueError):
    """A sweep that cannot be built or resumed; the message says which key or file."""


@dataclass(frozen=True)
class Variant:
    """A named set of overrides crossed with the grid."""

    label: str
    set: dict[str, Any]


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
        parts += [f"{_short(k)}={_slug(_literal(v))}" for k, v in self.grid]
        parts.append(f"seed={self.seed}")
        return ",".join(parts)

    def set_args(self) -> list[str]:
        """The overrides as ``--set`` arguments (TOML literals)."""
        return [f"{k}={_literal(v)}" for k, v in self.overrides]


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

    def points(self) -> list[Point]:
        """Every point: variants x grid x seeds, in that nesting order."""
        variants = self.variants or [Variant("", {})]
        keys = list(self.grid)
        combos = list(itertools.product(*(self.grid[k] for k in keys))) if keys else [()]
        out = []
        base = self._base_algorithm()   # read the base file once, not per point
        for var in variants:
            for combo in combos:
                for seed in self.seeds:
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
                "grid": self.grid, "variants": [{"label": v.label, "set": v.set}
                                                for v in self.variants],
                "target_accuracy": self.target_accuracy, "plot": self.plot, "name": self.name,
                "with": self.with_}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Sweep:
        """Inverse of :meth:`to_json`."""
        return cls(scenario=Path(data["scenario"]), seeds=list(data["seeds"]),
                   set=dict(data.get("set") or {}), grid=dict(data.get("grid") or {}),
                   variants=[Variant(v["label"], dict(v["set"]))
                             for v in data.get("variants") or []],
                   target_accuracy=data.get("target_accuracy"), plot=dict(data.get("plot") or {}),
                   name=data.get("name"), with_=dict(data.get("with") or {}))

    def check(self) -> None:
        """Validate every point's scenario before anything runs (all errors at once)."""
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
                load(self.scenario, p.set_args())
            except ScenarioError as exc:
                text = str(exc).split("\n", 1)[-1].strip()
                where = ", ".join([f"variant {p.variant!r}"] * bool(p.variant)
                                  + [f"{k}={_literal(v)}" for k, v in p.grid])
                if text not in seen_text:   # seeds repeat the same mistake
                    seen_text.add(text)
                    problems.append(f"point {where or '(base)'}: {text}")
                if len(problems) >= 5:
                    break
        if problems:
            raise SweepError("invalid sweep\n  " + "\n  ".join(problems))


# -- building a sweep ---------------------------------------------------------

_SWEEP_KEYS = {"scenario", "seeds", "set", "grid", "with", "variant", "target_accuracy", "plot",
               "name"}
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
        [sweep.set]                    # on every point
        "run.max_rounds" = 40
        [sweep.grid]                   # the cartesian product; a+b sets both keys
        "network.up.delay+network.down.delay" = [0.001, 0.01, 0.1, 1.0]
        [sweep.with."network.up.delay+network.down.delay"]
        "run.dilation" = [2.0, 1.0, 0.5, 0.25]   # paired with the delays, one each
        [[sweep.variant]]              # each crossed with the grid
        label = "FedAvg K=5"
        set = { "algorithm.name" = "fedavg", "algorithm.local_steps" = 5 }
        [sweep.plot]                   # optional
        x = "network.delay"            # default: the first grid key
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
        extra = set(v) - {"label", "set"}
        if extra:
            raise SweepError(f"{where}.{sorted(extra)[0]}: unknown key (allowed: label, set)")
        variants.append(Variant(v["label"], _table(v.get("set", {}), f"{where}.set")))
    labels = [v.label for v in variants]
    if len(set(labels)) != len(labels):
        raise SweepError(f"{p}: two variants share a label ({labels})")
    plot = spec.get("plot", {})
    if not isinstance(plot, dict) or set(plot) - _PLOT_KEYS:
        raise SweepError(f"{p}: sweep.plot: allowed keys {', '.join(sorted(_PLOT_KEYS))}")
    tgt = spec.get("target_accuracy")
    if tgt is not None and not (isinstance(tgt, (int, float)) and 0 < tgt <= 1):
        raise SweepError(f"{p}: sweep.target_accuracy: a fraction in (0, 1] (got {tgt!r})")
    sweep = Sweep(scenario=base, seeds=_seeds(spec.get("seeds", 1), f"{p}: sweep.seeds"),
                  set=_table(spec.get("set", {}), f"{p}: sweep.set"), grid=grid_table,
                  variants=variants, target_accuracy=tgt, plot=plot,
                  name=spec.get("name") or p.name.removesuffix(".toml").removesuffix(".sweep"),
                  with_=with_)
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
    if seeds is not None:
        sweep.seeds = _seeds(seeds, "--seeds")
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


def _literal(v: Any) -> str:
    """A TOML literal for a plain value."""
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {_literal(x)}" for k, x in v.items()) + " }"
    if isinstance(v, list):
        return "[" + ", ".join(_literal(x) for x in v) + "]"
    return json.dumps(v)


def _short(key: str) -> str:
    """A grid key's short name: ``network.up.delay+network.down.delay`` -> ``delay``."""
    return key.split("+")[0].rsplit(".", 1)[-1]


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.=+-]+", "_", text).strip("_") or "_"


# -- running ------------------------------------------------------------------

@dataclass
class PointResult:
    """What became of one point."""

    point: Point
    run_dir: Path
    status: str                 # completed / failed / interrupted / error / pending
    verdict: str | None         # pass / fail / None (no summary)
    attempts: int
    dilation: float | None
    cores: float | None         # CPU time of its process tree / its real time
    summary: dict[str, Any] | None

    @property
    def counts(self) -> bool:
        """Whether its figures go into the aggregate (completed and faithful)."""
        return self.status == "completed" and self.verdict == "pass"

    def row(self) -> dict[str, Any]:
        """Its row of sweep.csv."""
        row: dict[str, Any] = {"variant": self.point.variant}
        row.update({k: _literal(v) if isinstance(v, (list, dict)) else v
                    for k, v in self.point.grid})
        row.update({"seed": self.point.seed, "status": self.status, "verdict": self.verdict,
                    "attempts": self.attempts, "dilation": self.dilation,
                    "cores": None if self.cores is None else round(self.cores, 3)})
        for name in FIGURES:
            row[name] = figure(self.summary, name)
        row["run_dir"] = str(self.run_dir)
        return row


def figure(summary: dict[str, Any] | None, name: str) -> float | None:
    """One figure of a run's summary (None when absent)."""
    node: Any = summary
    for part in FIGURES[name][0].split("."):
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    if isinstance(node, bool) or not isinstance(node, (int, float)):
        return None
    return float(node)


@dataclass
class SweepResult:
    """A sweep's outcome: every point, and where the tables and figures are."""

    out: Path
    points: list[PointResult]
    files: list[Path]

    @property
    def flagged(self) -> list[PointResult]:
        """Points that finished but do not count (failed verdict or run)."""
        return [p for p in self.points if not p.counts]


class _Scheduler:
    """How many runs may go at once (see the module docstring)."""

    def __init__(self, jobs: int | str, max_jobs: int) -> None:
        self.cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
            os.cpu_count() or 1)
        self.fixed = None if jobs == "auto" else int(jobs)
        self.max_jobs = max(1, max_jobs)
        self.load: float | None = None    # cores one run uses (the largest seen recently)
        self.ceiling = self.max_jobs

    def allowed(self) -> int:
        if self.fixed is not None:
            return self.fixed
        if self.load is None:
            return 1
        fit = int(0.75 * self.cores / max(self.load, 0.05))
        return max(1, min(fit, self.ceiling, self.max_jobs))

    def finished(self, cores: float | None, verdict: str | None) -> None:
        if cores is not None:
            self.load = cores if self.load is None else max(cores, 0.7 * self.load)
        if verdict == "fail":        # back off at once, come back one run at a time
            self.ceiling = max(1, self.allowed() // 2)
        elif verdict == "pass":
            self.ceiling = min(self.max_jobs, self.ceiling + 1)


def _mem_available_gb() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return math.inf


def _read_point(run_dir: Path) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads((run_dir / "point.json").read_text())
        return data
    except (OSError, json.JSONDecodeError):
        return None


def _result(point: Point, run_dir: Path) -> PointResult:
    from fedsim.metrics import read_summary

    meta = _read_point(run_dir) or {}
    summary = read_summary(run_dir) if run_dir.is_dir() else None
    status = "pending" if summary is None else str(summary.get("status"))
    if summary is None and meta.get("exit_code") not in (None, 0):
        status = "crashed"      # it died before writing a summary: output.log says why
    verdict = None if summary is None else (summary.get("fidelity") or {}).get("verdict")
    dilation = meta.get("dilation")
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        # the dilation the run really used ("auto" resolved)
        dilation = float(json.loads((run_dir / "scenario.json").read_text())["run"]["dilation"])
    return PointResult(point, run_dir, status, verdict, int(meta.get("attempts", 0)),
                       dilation, meta.get("cores"), summary)


def _done(res: PointResult, max_attempts: int) -> bool:
    """Finished for good: faithful, unfaithful after every attempt, or failed as a run.

    A point never run, interrupted or crashed (no summary) is not: a resumed
    sweep runs it again.
    """
    if res.status in ("pending", "interrupted", "running", "crashed"):
        return False
    if res.status == "completed" and res.verdict == "fail":
        return res.attempts >= max_attempts
    return True   # faithful, or a run that failed (its output.log says why)


def _next_dilation(res: PointResult) -> float:
    suggested = ((res.summary or {}).get("fidelity") or {}).get("suggested_dilation")
    return round(max(float(suggested or 0.0), 1.5 * (res.dilation or 1.0)), 3)


def run_sweep(sweep: Sweep, out: str | Path, *, jobs: int | str = "auto", max_jobs: int = 8,
              max_attempts: int = 3, python: str | None = None,
              report: Callable[[str], None] | None = None) -> SweepResult:
    """Run every point not yet finished in ``out``; write the tables and figures.

    ``out`` may hold an earlier run of the same sweep (it resumes) but not of
    a different one (:class:`SweepError`).
    """
    out = Path(out)
    say = report or (lambda _: None)
    sweep.check()
    out.mkdir(parents=True, exist_ok=True)
    spec_file = out / "sweep.json"
    spec = sweep.to_json()
    if spec_file.exists():
        old = json.loads(spec_file.read_text())
        if old != spec:
            diff = sorted(k for k in spec if spec.get(k) != old.get(k))
            raise SweepError(f"{out} holds a different sweep (it differs in: {', '.join(diff)}); "
                             "choose another --out, or resume it with `fedsim sweep "
                             f"{out}`")
    else:
        _atomic_write(spec_file, json.dumps(spec, indent=2) + "\n")
    points = sweep.points()
    runs = out / "runs"
    results = {p.key: _result(p, runs / p.key) for p in points}
    todo = [p for p in points if not _done(results[p.key], max_attempts)]
    kept = len(points) - len(todo)
    say(f"sweep {sweep.name}: {len(points)} points"
        + (f", {kept} already finished" if kept else "") + f"; results in {out}")
    sched = _Scheduler(jobs, max_jobs)
    running: dict[int, tuple[Point, Any, float, float]] = {}
    python = python or sys.executable
    t0 = time.monotonic()
    finished = 0
    try:
        while todo or running:
            while (todo and len(running) < sched.allowed()
                   and (not running or _mem_available_gb() > 3.0)):
                p = todo.pop(0)
                prev = results[p.key]
                dilation = _next_dilation(prev) if prev.verdict == "fail" else None
                running_proc = _start(p, sweep, runs / p.key, python, dilation,
                                      prev.attempts + 1)
                running[running_proc.pid] = (p, running_proc, time.monotonic(), dilation or 0.0)
            pid, status, usage = os.wait4(-1, 0)
            if pid not in running:
                continue
            p, proc, started, _ = running.pop(pid)
            proc.returncode = os.waitstatus_to_exitcode(status)
            real = time.monotonic() - started
            cores = (usage.ru_utime + usage.ru_stime) / real if real > 0 else None
            run_dir = runs / p.key
            meta = _read_point(run_dir) or {}
            meta["cores"] = cores
            meta["exit_code"] = proc.returncode
            _atomic_write(run_dir / "point.json", json.dumps(meta, indent=2) + "\n")
            res = _result(p, run_dir)
            results[p.key] = res
            sched.finished(cores, res.verdict)
            if res.status == "completed" and not _done(res, max_attempts):
                todo.insert(0, p)      # an unfaithful run goes again, with more dilation
                say(f"  rerun {p.key}: verdict {res.verdict} at dilation {res.dilation}; "
                    f"next {_next_dilation(res)} (concurrency now {sched.allowed()})")
                continue
            finished += 1
            say(_progress_line(res, finished, len(todo) + len(running) + finished, kept,
                               time.monotonic() - t0, sched.allowed()))
    except KeyboardInterrupt:
        for _, proc, _, _ in running.values():
            proc.send_signal(2)
        for _, proc, _, _ in running.values():
            proc.wait()
        raise
    final = [results[p.key] for p in points]
    files = write_tables(sweep, out, final)
    return SweepResult(out, final, files)


def _start(p: Point, sweep: Sweep, run_dir: Path, python: str, dilation: float | None,
           attempt: int) -> Any:
    import shutil
    import subprocess

    if run_dir.exists():          # an interrupted or unfaithful attempt: keep its log
        old = run_dir.with_name(f"{run_dir.name}.attempt-{attempt - 1}")
        shutil.rmtree(old, ignore_errors=True)
        run_dir.rename(old)
    run_dir.mkdir(parents=True)
    cmd = [python, "-m", "fedsim.cli", "run", str(sweep.scenario), "--out", str(run_dir),
           "--no-progress", *itertools.chain.from_iterable(("--set", s) for s in p.set_args())]
    if dilation is not None:
        cmd += ["--dilation", str(dilation)]
    meta = {"variant": p.variant, "grid": dict(p.grid), "seed": p.seed, "attempts": attempt,
            "dilation": dilation, "command": cmd[1:]}
    _atomic_write(run_dir / "point.json", json.dumps(meta, indent=2) + "\n")
    log = open(run_dir / "output.log", "wb")   # noqa: SIM115 (the child owns it)
    try:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    finally:
        log.close()


def _progress_line(res: PointResult, done: int, total: int, kept: int, elapsed: float,
                   jobs: int) -> str:
    s = res.summary or {}
    acc = figure(s, "final_accuracy")
    emu = figure(s, "emulated_seconds")
    real = figure(s, "real_seconds")
    rate = elapsed / done
    eta = rate * (total - done)
    flag = "" if res.counts else "  FLAGGED"
    return (f"[{done + kept:>3}/{total + kept}] {res.point.key}: {res.status}, verdict "
            f"{res.verdict}, acc {'-' if acc is None else f'{acc:.3f}'}, "
            f"{'-' if emu is None else f'{emu:.1f}'} emulated s in "
            f"{'-' if real is None else f'{real:.1f}'} real s, "
            f"{'-' if res.cores is None else f'{res.cores:.2f}'} cores; "
            f"{jobs} at once, about {eta / 60:.0f} min left{flag}")


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


# -- tables and figures -------------------------------------------------------

def t_quantile(df: int) -> float:
    """Student's t 0.975 quantile (two-sided 95 %) for ``df`` degrees of freedom."""
    from scipy.stats import t  # type: ignore[import-untyped]  # (scikit-learn needs scipy)

    return float(t.ppf(0.975, df))


def mean_ci(values: Sequence[float]) -> tuple[float | None, float | None]:
    """Mean and the half-width of its 95 % confidence interval (None below 2 values)."""
    xs = [v for v in values if v is not None and math.isfinite(v)]
    if not xs:
        return None, None
    m = sum(xs) / len(xs)
    if len(xs) < 2:
        return m, None
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))
    return m, t_quantile(len(xs) - 1) * sd / math.sqrt(len(xs))


def aggregate(sweep: Sweep, results: Sequence[PointResult]) -> list[dict[str, Any]]:
    """Per variant and grid point, over the seeds whose runs count: n, mean, ci95."""
    groups: dict[tuple[str, tuple[tuple[str, str], ...]], list[PointResult]] = {}
    for r in results:
        gkey = tuple((k, _literal(v)) for k, v in r.point.grid)
        groups.setdefault((r.point.variant, gkey), []).append(r)
    rows = []
    for (variant, gkey), rs in groups.items():
        ok = [r for r in rs if r.counts]
        row: dict[str, Any] = {"variant": variant}
        row.update(dict(zip((k for k, _ in gkey), _grid_values(rs[0]),
                                           strict=True)))
        row["n"] = len(ok)
        row["flagged"] = len(rs) - len(ok)
        for name in FIGURES:
            vals = [figure(r.summary, name) for r in ok]
            m, ci = mean_ci([v for v in vals if v is not None])
            row[f"{name}_mean"] = m
            row[f"{name}_ci95"] = ci
            row[f"{name}_n"] = sum(v is not None for v in vals)
        rows.append(row)
    return rows


def _grid_values(r: PointResult) -> list[Any]:
    return [_literal(v) if isinstance(v, (list, dict)) else v for _, v in r.point.grid]


def _write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    cols: list[str] = []
    for r in rows:
        cols += [c for c in r if c not in cols]
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols)
        w.writeheader()
        for r in rows:
            w.writerow({k: "" if v is None else v for k, v in r.items()})
    os.replace(tmp, path)


def write_tables(sweep: Sweep, out: Path, results: Sequence[PointResult]) -> list[Path]:
    """Write sweep.csv, aggregate.csv and the figures; return the paths."""
    files = [out / "sweep.csv", out / "aggregate.csv"]
    _write_csv(files[0], [r.row() for r in results])
    agg = aggregate(sweep, results)
    _write_csv(files[1], agg)
    files += plot_sweep(sweep, out, agg)
    return files


def read_results(out: str | Path) -> tuple[Sweep, list[PointResult]]:
    """A sweep directory's spec and every point's state (finished or not)."""
    out = Path(out)
    try:
        sweep = Sweep.from_json(json.loads((out / "sweep.json").read_text()))
    except (OSError, json.JSONDecodeError, KeyError) as exc:
        raise SweepError(f"{out}: not a sweep directory (no readable sweep.json: {exc})") from None
    return sweep, [_result(p, out / "runs" / p.key) for p in sweep.points()]


def default_figures(sweep: Sweep) -> list[str]:
    ys = ["final_accuracy", "emulated_seconds"]
    if sweep.target_accuracy is not None:
        ys.append("time_to_target_s")
    return ys


def plot_sweep(sweep: Sweep, out: Path, agg: list[dict[str, Any]]) -> list[Path]:
    """One figure per y: y against the x grid key, a line per variant (and other grid keys)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = sweep.plot.get("x") or next((k for k, v in sweep.grid.items()
                                     if len(v) > 1 and all(_is_num(a) for a in v)), None)
    if x is None:
        return []
    if x not in sweep.grid:
        raise SweepError(f"sweep.plot.x = {x!r} is not a grid key ({', '.join(sweep.grid)})")
    ys = sweep.plot.get("y") or default_figures(sweep)
    bad = [y for y in ys if y not in FIGURES]
    if bad:
        raise SweepError(f"sweep.plot.y: unknown figure {bad[0]!r} (known: {', '.join(FIGURES)})")
    xs_all = [float(v) for v in sweep.grid[x]]
    logx = sweep.plot.get("logx")
    if logx is None:
        pos = [v for v in xs_all if v > 0]
        logx = bool(pos) and len(pos) == len(xs_all) and max(pos) / min(pos) > 100
    others = [k for k in sweep.grid if k != x]
    norm = sweep.plot.get("normalize")
    files = []
    for y in ys:
        lines: dict[str, list[tuple[float, float, float]]] = {}
        for row in agg:
            m = row.get(f"{y}_mean")
            if m is None:
                continue
            name = ", ".join([row["variant"]] * bool(row["variant"])
                             + [f"{_short(k)}={row[k]}" for k in others])
            lines.setdefault(name or y, []).append((float(row[x]), m, row.get(f"{y}_ci95") or 0.0))
        if not lines:
            continue
        scale = 1.0
        label = FIGURES[y][1]
        if norm and y in _TIMES:   # accuracies and losses keep their own scale
            ref = sorted(next((v for k, v in lines.items() if k.split(",")[0] == norm), []))
            if ref and ref[0][1]:
                scale = ref[0][1]
                label += f"\n(relative to {norm} at {_short(x)} = {ref[0][0]:g})"
        fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=110)
        for name, pts in lines.items():
            pts.sort()
            ax.errorbar([p[0] for p in pts], [p[1] / scale for p in pts],
                        yerr=[p[2] / scale for p in pts], marker="o", ms=4, capsize=3, lw=1.3,
                        label=name)
        if logx:
            ax.set_xscale("log")
        ax.set_xlabel(x)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3, which="both")
        n = max((r["n"] for r in agg), default=0)
        ax.set_title(f"{sweep.name}: {y} (mean, 95 % CI over up to {n} seeds)", fontsize=9)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = out / f"{y}.png"
        fig.savefig(path)
        plt.close(fig)
        files.append(path)
    return files


#: the figures ``plot.normalize`` divides (times: a ratio reads as a speedup)
_TIMES = ("emulated_seconds", "time_to_target_s", "real_seconds")


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)
