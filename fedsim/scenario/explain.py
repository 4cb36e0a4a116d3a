"""pydantic's validation errors, rewritten for someone who wrote a scenario.

Each error becomes a :class:`Problem`: the key as the user writes it
(``network.groups[0].profile``), the value given, and what is allowed:

* a choice (a ``Literal``): the allowed names, and the closest one
  ("did you mean 'poly'?", :mod:`difflib`);
* an unknown key: the closest key of that table, or the table the key
  belongs to ("lr is a key of [client]"), or the table's keys;
* a value that may be one of several things (``dilation = 2.0`` or
  ``"auto"``): one line saying all of them, where pydantic reports one line
  per alternative with its internal name (``constrained-float``);
* a wrong type for a table or a list: "must be a table", "must be a list".

Numeric bounds keep pydantic's wording ("Input should be greater than 0"),
which says it well.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from annotated_types import Ge, Gt, Le, Lt
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails

from fedsim.errors import PluginError

__all__ = ["Problem", "closest", "dotted", "explain"]

Loc = tuple[str | int, ...]


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with a scenario: where (``loc``) and what (``text``).

    ``plugin``: a plug-in could not be found or is not what it must be.
    """

    loc: Loc
    text: str
    plugin: bool = False

    def line(self) -> str:
        """``key: text`` (a rule across tables names its own keys: just ``text``)."""
        return f"{dotted(self.loc)}: {self.text}" if self.loc else self.text


def dotted(loc: Iterable[str | int]) -> str:
    """``("network", "groups", 0, "profile")`` as ``network.groups[0].profile``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def closest(word: object, choices: Iterable[str]) -> str | None:
    """The choice ``word`` was most likely meant to be (None when none is close)."""
    found = difflib.get_close_matches(str(word), list(choices), n=1, cutoff=0.6)
    return found[0] if found else None


# -- annotations ----------------------------------------------------------------------


def _unwrap(tp: Any, meta: Sequence[Any] = ()) -> tuple[Any, list[Any]]:
    """``tp`` without ``Annotated``, and every constraint found on the way."""
    out = list(meta)
    while typing.get_origin(tp) is typing.Annotated:
        args = typing.get_args(tp)
        tp = args[0]
        for m in args[1:]:
            out.extend(m.metadata if isinstance(m, FieldInfo) else [m])
    return tp, out


def _members(tp: Any) -> list[Any]:
    """The alternatives of a union (``tp`` itself when it is not one)."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return list(typing.get_args(tp))
    return [tp]


def _models(tp: Any) -> list[type[BaseModel]]:
    """The tables (pydantic models) a value of type ``tp`` may be."""
    tp, _ = _unwrap(tp)
    return [m for m in (_unwrap(a)[0] for a in _members(tp))
            if isinstance(m, type) and issubclass(m, BaseModel)]


def _items(tp: Any) -> Any | None:
    """The element type when ``tp`` is (optionally) a list."""
    tp, _ = _unwrap(tp)
    for m in _members(tp):
        m, _ = _unwrap(m)
        if typing.get_origin(m) in (list, tuple) and typing.get_args(m):
            return typing.get_args(m)[0]
    return None


def _is_mapping(tp: Any) -> bool:
    tp, _ = _unwrap(tp)
    return any(typing.get_origin(_unwrap(m)[0]) is dict for m in _members(tp))


def _bounds(meta: Sequence[Any]) -> str:
    parts = []
    for m in meta:
        for cls, op in ((Gt, ">"), (Ge, ">="), (Lt, "<"), (Le, "<=")):
            if isinstance(m, cls):
                parts.append(f"{op} {getattr(m, cls.__name__.lower())}")
    return " and ".join(parts)


def describe(tp: Any, meta: Sequence[Any] = ()) -> str:
    """What a value of type ``tp`` may be, in words (``a number > 0 or 'auto'``)."""
    tp, meta = _unwrap(tp, meta)
    members = _members(tp)
    if len(members) > 1:
        return " or ".join(describe(m) for m in members if m is not type(None))
    if typing.get_origin(tp) is Literal:
        return ", ".join(repr(v) for v in typing.get_args(tp))
    bound = _bounds(meta)
    if tp is bool:
        return "true or false"
    if tp in (int, float):
        what = "an integer" if tp is int else "a number"
        return f"{what} {bound}" if bound else what
    if tp is str:
        return "a string"
    if typing.get_origin(tp) in (list, tuple):
        return "a list"
    if typing.get_origin(tp) is dict or (isinstance(tp, type) and issubclass(tp, BaseModel)):
        return "a table"
    return getattr(tp, "__name__", str(tp))


# -- locations ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Place:
    """Where a location lands in the schema."""

    loc: Loc               # the user's key path (union member tags dropped)
    tp: Any                # the type found there (None: unknown)
    meta: tuple[Any, ...]  # its constraints


def _walk(root: type[BaseModel], loc: Sequence[str | int]) -> _Place:
    """Follow ``loc`` through the schema, dropping pydantic's union member tags."""
    tp: Any = root
    meta: tuple[Any, ...] = ()
    out: list[str | int] = []
    for part in loc:
        if tp is None:
            out.append(part)
            continue
        models = _models(tp)
        owner = next((m for m in models if isinstance(part, str) and part in m.model_fields),
                     None)
        if owner is not None:
            f = owner.model_fields[str(part)]
            tp, meta = f.annotation, tuple(f.metadata)
            out.append(part)
        elif isinstance(part, int) and _items(tp) is not None:
            tp, meta = _items(tp), ()
            out.append(part)
        elif _is_mapping(tp) and isinstance(part, str):
            tp, meta = None, ()
            out.append(part)
        # else: a tag pydantic gives a union member (constrained-float,
        # literal['auto'], function-after[...]): not a key
    return _Place(tuple(out), tp, meta)


def _keys_elsewhere(root: type[BaseModel], key: str, here: Loc) -> list[str]:
    """Top-level tables of ``root`` (other than ``here``) that have a key ``key``."""
    found = []
    for name, f in root.model_fields.items():
        for m in _models(f.annotation):
            if key in m.model_fields and (name,) != here[:1]:
                found.append(name)
    return found


# -- errors ---------------------------------------------------------------------------


def _unknown_key(root: type[BaseModel], prefix: Loc, err: ErrorDetails) -> Problem:
    place = _walk(root, err["loc"][:-1])
    key = str(err["loc"][-1])
    loc = (*prefix, *place.loc, key)
    keys = [k for m in _models(place.tp) for k in m.model_fields]
    guess = closest(key, keys)
    if guess is not None:
        return Problem(loc, f"unknown key (did you mean {guess!r}?)")
    elsewhere = [] if prefix else _keys_elsewhere(root, key, place.loc)
    if elsewhere:
        where = " or ".join(f"[{t}]" for t in elsewhere)
        return Problem(loc, f"unknown key here; {key} is a key of {where}")
    return Problem(loc, f"unknown key (allowed keys: {', '.join(keys)})")


def _one(root: type[BaseModel], prefix: Loc, err: ErrorDetails) -> Problem:
    kind, value = err["type"], err.get("input")
    place = _walk(root, err["loc"])
    loc = (*prefix, *place.loc)
    msg: str = err["msg"]
    if kind == "value_error":
        cause = (err.get("ctx") or {}).get("error")
        return Problem(loc, msg.removeprefix("Value error, "),
                       plugin=isinstance(cause, PluginError))
    if kind == "literal_error":
        tp, _ = _unwrap(place.tp)
        allowed = [v for m in _members(tp) if typing.get_origin(_unwrap(m)[0]) is Literal
                   for v in typing.get_args(_unwrap(m)[0])]
        names = ", ".join(repr(v) for v in allowed) if allowed else err["ctx"]["expected"]
        guess = closest(value, [str(v) for v in allowed])
        hint = f"; did you mean {guess!r}?" if guess is not None else ""
        return Problem(loc, f"{value!r} is not allowed (allowed: {names}){hint}")
    if kind in ("model_type", "dict_type", "model_attributes_type"):
        return Problem(loc, f"must be a table (got {value!r})")
    if kind in ("list_type", "tuple_type"):
        return Problem(loc, f"must be a list (got {value!r})")
    if isinstance(value, dict):
        return Problem(loc, msg)
    return Problem(loc, f"{msg} (got {value!r})")


def explain(exc: ValidationError, root: type[BaseModel], prefix: Loc = ()) -> list[Problem]:
    """Every error of ``exc`` (raised validating ``root``) as a :class:`Problem`.

    ``prefix`` is prepended to each location (``("algorithm",)`` for an
    algorithm's own table). The errors pydantic gives for each alternative
    of one value become one problem.
    """
    out: list[Problem] = []
    unions: dict[Loc, list[ErrorDetails]] = {}
    for err in exc.errors(include_url=False):
        if err["type"] == "extra_forbidden":
            out.append(_unknown_key(root, prefix, err))
            continue
        place = _walk(root, err["loc"])
        if len(place.loc) < len(err["loc"]) and len(_members(_unwrap(place.tp)[0])) > 1:
            if place.loc not in unions:
                unions[place.loc] = []
                out.append(Problem((*prefix, *place.loc), ""))  # filled below, in order
            unions[place.loc].append(err)
            continue
        out.append(_one(root, prefix, err))
    for i, p in enumerate(out):
        if p.text:
            continue
        errs = unions[p.loc[len(prefix):]]
        place = _walk(root, errs[0]["loc"])
        if len(errs) == 1:
            out[i] = _one(root, prefix, errs[0])
            continue
        value = errs[0].get("input")
        out[i] = Problem(p.loc, f"{value!r} is not allowed: expected "
                                f"{describe(place.tp, place.meta)}")
    return out
