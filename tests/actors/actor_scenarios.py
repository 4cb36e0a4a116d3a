"""Small scenario builders and event-log helpers for the actor tests (tests/actors/test_actor_*).

Every scenario here is tiny (a few clients, a 16-unit MLP, a few local
steps, a few emulated seconds) so that a whole federation through the real
actors (:func:`fedsim.testing.federation.run_in_memory`, virtual time, in-memory
network, torch in-process) takes a second or two of real time.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

from fedsim.scenario import Scenario, parse

#: The base of every actor-test scenario (override any key with ``build``).
BASE: dict[str, Any] = {
    "name": "actor-test",
    "seed": 3,
    "data": {"dataset": "synthetic", "num_clients": 6, "max_samples_per_client": 64},
    "model": {"name": "mlp", "hidden": [16]},
    "client": {"lr": 0.05, "batch_size": 16, "local_steps": 3},
    "run": {"time_budget": 2.0},
    "eval": {"every_rounds": 1000, "every_updates": 1000},
    "devices": {"step_time": 0.004},
    "network": {"up": {"delay": 0.02}, "down": {"delay": 0.02}},
    "deploy": {"start_timeout": 5.0},
}


def _merge(into: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = copy.deepcopy(value)
    return into


def build(algorithm: dict[str, Any], **sections: dict[str, Any]) -> Scenario:
    """A tiny scenario running ``algorithm``; each keyword deep-merges a section.

    >>> build({"name": "fedavg"}, run={"time_budget": 3.0}).run.time_budget
    3.0
    """
    raw = _merge(copy.deepcopy(BASE), {"algorithm": algorithm, **sections})
    return parse(raw, "actor-test")


def of(events: Iterable[dict[str, Any]], ev: str, **match: Any) -> list[dict[str, Any]]:
    """The records of kind ``ev`` whose fields equal ``match``."""
    return [e for e in events
            if e["ev"] == ev and all(e.get(k) == v for k, v in match.items())]


def away_intervals(events: list[dict[str, Any]]) -> dict[int, list[tuple[float, float]]]:
    """Per client, each ``[away, back)`` interval (open-ended ones end at +inf)."""
    out: dict[int, list[tuple[float, float]]] = {}
    start: dict[int, float] = {}
    for e in sorted((e for e in events if e["ev"] in ("away", "back")),
                    key=lambda e: (e["t"], e["ev"] == "away")):
        c = e["client"]
        if e["ev"] == "away":
            start.setdefault(c, e["t"])
        elif c in start:
            out.setdefault(c, []).append((start.pop(c), e["t"]))
    for c, t in start.items():
        out.setdefault(c, []).append((t, float("inf")))
    return out

