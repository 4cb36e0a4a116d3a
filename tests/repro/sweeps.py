"""The points of a sweep file (scenarios/repro/*.sweep.toml), for the repro tests.

A sweep file names a base scenario and crosses its ``[sweep.grid]`` (every
key's values, cartesian) with its ``[[sweep.variant]]`` override sets, each
point run for seeds ``1..N`` (or the listed seeds)::

    [sweep]
    scenario = "dg1.toml"        # relative to the sweep file
    seeds = 3
    target_accuracy = 0.8        # optional
    [sweep.set]                  # applied to every point
    "run.max_rounds" = 40
    [sweep.grid]
    "network.rtt" = [0.002, 1.0]
    [[sweep.variant]]
    label = "FedAvg K=5"
    set = { "algorithm" = { name = "fedavg" }, "client.local_steps" = 5 }

An override sets one dotted key to a value, as ``fedsim run --set`` does: a
table value replaces the whole table (that is how a variant swaps the
algorithm). The tests use this to check that every point of every shipped
sweep is a valid scenario; running a sweep is the sweep tool's job.
"""

from __future__ import annotations

import copy
import itertools
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedsim.scenario import Scenario, parse

__all__ = ["Point", "Sweep", "read_sweep"]


@dataclass(frozen=True)
class Point:
    """One run of a sweep: the variant's label, the overrides and the seed."""

    label: str
    overrides: dict[str, Any]
    seed: int

    def scenario(self, base: dict[str, Any], source: str) -> Scenario:
        """The base scenario with this point's overrides and seed, validated."""
        raw = copy.deepcopy(base)
        for key, value in {**self.overrides, "seed": self.seed}.items():
            node = raw
            *tables, last = key.split(".")
            for part in tables:
                node = node.setdefault(part, {})
                if not isinstance(node, dict):
                    raise ValueError(f"{source}: override {key!r}: {part!r} is not a table")
            node[last] = copy.deepcopy(value)
        return parse(raw, f"{source} [{self.label}, seed {self.seed}]")


@dataclass(frozen=True)
class Sweep:
    """A parsed sweep file."""

    path: Path
    scenario: Path
    seeds: tuple[int, ...]
    target_accuracy: float | None
    points: tuple[Point, ...] = field(default=())

    def base(self) -> dict[str, Any]:
        """The base scenario's raw TOML."""
        return tomllib.loads(self.scenario.read_text())


_SWEEP_KEYS = {"scenario", "seeds", "target_accuracy", "set", "grid", "variant"}


def read_sweep(path: Path) -> Sweep:
    """Parse a sweep file into its points (grid x variants x seeds).

    Raises ValueError naming the file and the key for anything this format
    does not define.
    """
    doc = tomllib.loads(path.read_text())
    if set(doc) != {"sweep"}:
        raise ValueError(f"{path}: expected only a [sweep] table, got {sorted(doc)}")
    sw = doc["sweep"]
    unknown = set(sw) - _SWEEP_KEYS
    if unknown:
        raise ValueError(f"{path}: unknown sweep keys {sorted(unknown)} "
                         f"(allowed: {', '.join(sorted(_SWEEP_KEYS))})")
    seeds_raw = sw.get("seeds", 1)
    if isinstance(seeds_raw, int) and seeds_raw >= 1:
        seeds = tuple(range(1, seeds_raw + 1))
    elif isinstance(seeds_raw, list) and seeds_raw and all(isinstance(s, int) for s in seeds_raw):
        seeds = tuple(seeds_raw)
    else:
        raise ValueError(f"{path}: seeds must be an int >= 1 or a list of ints, got {seeds_raw!r}")
    common = dict(sw.get("set", {}))
    grid: dict[str, list[Any]] = dict(sw.get("grid", {}))
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise ValueError(f"{path}: grid key {key!r} needs a non-empty list, got {values!r}")
    variants = sw.get("variant") or [{"label": "", "set": {}}]
    points = []
    for variant in variants:
        if set(variant) - {"label", "set"}:
            raise ValueError(f"{path}: a variant takes label and set, got {sorted(variant)}")
        for combo in itertools.product(*grid.values()):
            overrides = {**common, **dict(zip(grid, combo, strict=True)),
                         **variant.get("set", {})}
            label = " ".join(filter(None, [variant.get("label", ""),
                                           *(f"{k}={v}" for k, v in zip(grid, combo,
                                                                        strict=True))]))
            points += [Point(label, overrides, s) for s in seeds]
    target = sw.get("target_accuracy")
    return Sweep(path=path, scenario=(path.parent / sw["scenario"]).resolve(), seeds=seeds,
                 target_accuracy=None if target is None else float(target), points=tuple(points))
