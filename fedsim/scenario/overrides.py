"""Overrides of scenario keys: ``--set dotted.key=value`` and ``overrides={...}``.

An override is kept with how the user wrote it (:attr:`Override.label`) and
where (:attr:`Override.origin`), so that an error it causes is blamed on the
command line or the ``overrides=`` argument, never on the scenario file.

On the command line a value is TOML (``--set algorithm.alpha=0.3``,
``--set 'model.hidden=[64, 32]'``, ``--set 'algorithm.staleness="hinge"'``).
A bare word (letters, digits and ``_ . : / + -``) is taken as a string, so
``--set algorithm.staleness=hinge`` works too; anything else that is not
TOML (``[64,``) is an error, not a string. Through :func:`fedsim.load` the
values are Python values, given as a mapping of dotted keys.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fedsim.errors import OverrideError

__all__ = ["CLI", "PYTHON", "Override", "apply", "from_cli", "from_python"]

#: Where an override came from, as error messages say it.
CLI = "the command line"
PYTHON = "the overrides= argument"

_BARE_WORD = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:/+\-]*")
_KEY_PART = re.compile(r"[A-Za-z0-9_\-]+")


@dataclass(frozen=True, slots=True)
class Override:
    """One key set from outside the scenario file.

    ``key`` is the dotted path as parts; ``label`` is how the user wrote it
    (``--set run.dilation=fast``, ``--dilation fast``,
    ``overrides['run.time_budget']``); ``origin`` is :data:`CLI` or
    :data:`PYTHON`.
    """

    key: tuple[str, ...]
    value: Any
    label: str
    origin: str

    @property
    def dotted(self) -> str:
        """The key as written in a scenario (``run.dilation``)."""
        return ".".join(self.key)


def _fail(message: str, key: str, origin: str) -> OverrideError:
    return OverrideError(f"invalid override from {origin}\n  {message}", keys=(key,),
                         origin=origin, problems=(message,))


def _split_key(key: str, label: str, origin: str) -> tuple[str, ...]:
    parts = tuple(p.strip() for p in key.strip().split("."))
    if not key.strip() or not all(_KEY_PART.fullmatch(p) for p in parts):
        raise _fail(f"{label}: {key.strip()!r} is not a dotted key (e.g. algorithm.alpha)",
                    key.strip(), origin)
    return parts


def parse_value(text: str, label: str, key: str, origin: str = CLI) -> Any:
    """A command-line value: TOML, or a bare word taken as a string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError as exc:
        if _BARE_WORD.fullmatch(text):
            return text
        why = str(exc).split(" (at ")[0]
        raise _fail(f"{label}: {text!r} is not a valid TOML value ({why}); write an array "
                    "as [64, 32], a string in quotes (\"...\")", key, origin) from None


def _item(item: str, label: str, origin: str) -> Override:
    """One ``KEY=VALUE`` string (the value in TOML)."""
    key, sep, text = item.partition("=")
    if not sep:
        raise _fail(f"{label}: expected dotted.key=value", key.strip(), origin)
    parts = _split_key(key, label, origin)
    return Override(parts, parse_value(text.strip(), label, key.strip(), origin), label, origin)


def from_cli(items: Iterable[str], dilation: str | None = None) -> list[Override]:
    """Overrides from ``--set KEY=VALUE`` options (and ``--dilation X``)."""
    out = [_item(item, f"--set {item}", CLI) for item in items]
    if dilation is not None:
        value: Any = "auto" if dilation.strip() == "auto" else parse_value(
            dilation.strip(), f"--dilation {dilation}", "run.dilation")
        out.append(Override(("run", "dilation"), value, f"--dilation {dilation}", CLI))
    return out


def from_python(overrides: Mapping[str, Any] | Sequence[str] | None) -> list[Override]:
    """Overrides given to :func:`fedsim.load`: a mapping of dotted keys to values
    (a mapping value sets the keys under it), or ``"key=value"`` strings as on
    the command line."""
    if overrides is None:
        return []
    if isinstance(overrides, str):
        raise _fail(f"overrides={overrides!r}: give a mapping {{'dotted.key': value}} or a "
                    "list of 'key=value' strings", overrides, PYTHON)
    if not isinstance(overrides, Mapping):
        return [_item(str(item), f"overrides entry {str(item)!r}", PYTHON)
                for item in overrides]
    flat: list[Override] = []

    def walk(prefix: tuple[str, ...], table: Mapping[Any, Any]) -> None:
        for k, v in table.items():
            if not isinstance(k, str):
                raise _fail(f"overrides: key {k!r} is not a string", str(k), PYTHON)
            label = "overrides[" + repr(".".join((*prefix, k))) + "]"
            parts = (*prefix, *_split_key(k, label, PYTHON))
            if isinstance(v, Mapping) and v:
                walk(parts, v)
            else:
                dotted = ".".join(parts)
                flat.append(Override(parts, _plain(v, dotted), f"overrides[{dotted!r}]",
                                     PYTHON))

    walk((), overrides)
    return flat


def _plain(value: Any, key: str) -> Any:
    """A value as a scenario file could hold it (tuples become lists; paths, str)."""
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError):
        raise _fail(f"overrides[{key!r}]: {value!r} is not a value a scenario can hold "
                    "(numbers, strings, booleans, lists and tables)", key, PYTHON) from None


def apply(raw: Mapping[str, Any], overrides: Sequence[Override]) -> dict[str, Any]:
    """``raw`` (unchanged) with every override set, as a new mapping."""
    out: dict[str, Any] = json.loads(json.dumps(raw))
    for o in overrides:
        node = out
        for i, part in enumerate(o.key[:-1]):
            nxt = node.setdefault(part, {})
            if not isinstance(nxt, dict):
                where = ".".join(o.key[:i + 1])
                raise _fail(f"{o.label}: {where} is {nxt!r}, not a table", o.dotted, o.origin)
            node = nxt
        node[o.key[-1]] = o.value
    return out


def blame(loc: Sequence[str | int], message: str, overrides: Sequence[Override],
          base: Mapping[str, Any] | None = None) -> Override | None:
    """The override an error at ``loc`` comes from, if any.

    The error's key is the override's key or lies under it (``model.hidden.0``
    under ``model.hidden``); or the error belongs to a table holding the key
    and either the override made that table (``base``, the mapping before
    the overrides, lacks it: ``--set netwrk.up.delay=0.1`` made the unknown
    ``netwrk``) or the error's message names the key (a rule of the whole
    ``[client]`` table, a rule across tables). The last such override wins:
    it was applied last.
    """
    path = tuple(str(p) for p in loc)
    found = None
    for o in overrides:
        if path[:len(o.key)] == o.key:
            found = o
        elif o.key[:len(path)] == path:
            rest = ".".join(o.key[len(path):])
            if ((path and base is not None and not _holds(base, path))
                    or re.search(rf"(?<![\w.]){re.escape(rest)}(?![\w])", message)):
                found = o
    return found


def _holds(raw: Mapping[str, Any], path: Sequence[str]) -> bool:
    """Whether ``raw`` has a value at the dotted ``path``."""
    node: Any = raw
    for part in path:
        if not isinstance(node, Mapping) or part not in node:
            return False
        node = node[part]
    return True
