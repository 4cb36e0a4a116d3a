"""Scenarios: the TOML schema, loading, overrides, and validation messages a person can act on.

A scenario file is validated on load into frozen pydantic models
(:mod:`fedsim.scenario.file`); its sections are declared in
:mod:`fedsim.scenario.sections` and :mod:`fedsim.scenario.netconfig` (each
algorithm's ``[algorithm]`` table in its home under :mod:`fedsim.algorithms`).
:mod:`~fedsim.scenario.overrides` applies ``--set`` and ``overrides=``,
:mod:`~fedsim.scenario.explain` words pydantic's errors,
:mod:`~fedsim.scenario.notes` says what ``fedsim check`` marks beside a key,
:mod:`~fedsim.scenario.plugins` finds a user's algorithm, model or dataset,
:mod:`~fedsim.scenario.ids` reads and writes client-id ranges, and
:mod:`~fedsim.scenario.network` builds netem's links and devices from a
scenario (the seam between the two).

The loader's names are gathered here, imported on first use (so that
importing :mod:`fedsim.scenario.ids` or :mod:`~fedsim.scenario.overrides`
does not load pydantic and every algorithm):
``from fedsim.scenario import Scenario, load``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fedsim.scenario.file import (
        DEFAULT_ALGORITHM,
        Scenario,
        apply_overrides,
        load,
        parse,
        resolved,
        scenario_hash,
        to_toml,
    )
    from fedsim.scenario.notes import key_notes, unread_task_keys, unused_keys

__all__ = [
    "DEFAULT_ALGORITHM",
    "Scenario",
    "apply_overrides",
    "key_notes",
    "load",
    "parse",
    "resolved",
    "scenario_hash",
    "to_toml",
    "unread_task_keys",
    "unused_keys",
]


#: the names :mod:`fedsim.scenario.notes` holds (the others: :mod:`fedsim.scenario.file`)
_NOTES = ("key_notes", "unread_task_keys", "unused_keys")


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'fedsim.scenario' has no attribute {name!r}")
    home = "notes" if name in _NOTES else "file"
    value = getattr(importlib.import_module(f"fedsim.scenario.{home}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
