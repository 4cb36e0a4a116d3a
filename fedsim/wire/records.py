"""Records on the wire: the base of every value type and message, and how each field is checked.

A record (:class:`Record`) is a frozen, slotted, keyword-only dataclass whose
fields are checked when it is built, on the sending side and in
:func:`fedsim.wire.codec.decode` alike, so a record that exists is
well-typed. :func:`register` reads a record class's annotations once and
builds its checks; :mod:`fedsim.wire.messages` declares the records.

Field types are few and checked by annotation:

``int``
    a Python int (not bool, not numpy) that fits int64;
``float``
    a finite float (an int is accepted and stored as a float). NaN and
    +-inf are refused unless the field is annotated :data:`AnyFloat`,
    which only the measured losses are (a diverged loss is information);
``bool``, ``str``
    exactly those;
``X | None``
    None or an X;
``tuple[X, ...]``
    of ints, floats, strs or value types (a list is accepted and stored as
    a tuple);
value types
    records registered in :data:`VALUE_TYPES` (:class:`~fedsim.wire.messages.LocalWork`,
    :class:`~fedsim.wire.messages.Event`, :class:`~fedsim.wire.messages.PhaseSample`),
    checked the same way;
:class:`~fedsim.wire.tensors.TensorSpec`
    a model's layout;
:class:`~fedsim.wire.tensors.Model`
    the model, at most one field per message (``Model`` or
    ``Model | None``); it travels as raw frames, never in msgpack;
``dict[str, Any]``
    only ``Event.extra``, ``HostBye.fidelity`` and ``Trained.notes``:
    plain data (None, bool, int, float, str, list, dict with str keys,
    at most :data:`MAX_DEPTH` deep; see :func:`check_plain`).

A bad value raises ``WireError("bad_field")`` naming the field and the
value: ``Update.steps must be an int, got str 'lots'``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import fields
from typing import (
    Annotated,
    Any,
    ClassVar,
    TypeVar,
    Union,
    cast,
    get_args,
    get_origin,
    get_type_hints,
)

from fedsim.wire.errors import Reason, WireError, describe
from fedsim.wire.tensors import Model, TensorSpec

__all__ = [
    "MAX_DEPTH",
    "VALUE_TYPES",
    "AnyFloat",
    "Bad",
    "Record",
    "check_plain",
    "non_negative",
    "register",
]

MAX_DEPTH = 32
"""Deepest nesting of lists and dicts in a plain-data (``dict[str, Any]``) field."""

_I64_MIN = -(2**63)
_I64_MAX = 2**63 - 1
_U64_MAX = 2**64 - 1


# ---------------------------------------------------------------------------
# Plain data (the three dict fields)


def _non_plain(value: object, depth: int) -> tuple[list[str], str] | None:
    """Find the first non-plain part of ``value``: (reversed path, problem)."""
    if value is None or isinstance(value, bool | float | str):
        return None
    if isinstance(value, int):
        if _I64_MIN <= value <= _U64_MAX:
            return None
        return [], f"int {value} does not fit in 64 bits"
    if depth >= MAX_DEPTH:
        return [], f"nested deeper than {MAX_DEPTH} levels"
    if isinstance(value, list):
        for i, item in enumerate(value):
            found = _non_plain(item, depth + 1)
            if found is not None:
                found[0].append(f"[{i}]")
                return found
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return [], f"dict key {describe(key)} is not a str"
            found = _non_plain(item, depth + 1)
            if found is not None:
                found[0].append(f"[{key!r}]")
                return found
        return None
    hint = " (use a list)" if isinstance(value, tuple) else ""
    return [], (
        f"{describe(value)} is not a plain type{hint}; allowed: None, bool, int,"
        " float, str, list, dict with str keys"
    )


def check_plain(where: str, value: object) -> None:
    """Raise ``WireError("bad_field")`` unless ``value`` is plain msgpack data.

    Plain means None, bool, int (64-bit, signed or unsigned), float (any,
    NaN included), str, list, and dict with str keys, nested at most
    :data:`MAX_DEPTH` deep. Tuples are refused because msgpack would hand
    them back as lists and the round trip would not be equal.
    """
    found = _non_plain(value, 0)
    if found is not None:
        path, problem = found
        raise WireError("bad_field", f"{where}{''.join(reversed(path))}: {problem}")


# ---------------------------------------------------------------------------
# Field types: how each annotation is checked (built here) and loaded (decoded)


class _AllowNonFinite:
    def __repr__(self) -> str:
        return "AllowNonFinite"


AnyFloat = Annotated[float, _AllowNonFinite()]
"""A float field that may hold NaN or +-inf (plain ``float`` fields may not)."""


class Bad(Exception):
    """A field check failed; the location is prepended on the way out.

    Checks raise it with the text after the location (" must be an int, got
    ..."); each enclosing tuple, record or field adds its part of the path
    (``[3]``, ``.client``), and the outermost caller turns it into a
    WireError. So no location string is built unless a check fails.
    """

    def __init__(self, text: str, path: str = "", reason: Reason = "bad_field") -> None:
        super().__init__(text)
        self.text = text
        self.path = path
        self.reason: Reason = reason

    def under(self, part: str) -> Bad:
        self.path = part + self.path
        return self

    def error(self, root: str) -> WireError:
        return WireError(self.reason, f"{root}{self.path}{self.text}")


class _Kind:
    """How one annotation is checked; ``load`` takes msgpack's decoded form."""

    nullable: bool = False
    """None passes without a call (``X | None``)."""
    exact: type | None = None
    """A value of exactly this type passes without a call (str, bool)."""

    def check(self, v: Any) -> Any:
        raise NotImplementedError

    def load(self, v: Any) -> Any:
        return self.check(v)


class _Int(_Kind):
    def check(self, v: Any) -> int:
        if type(v) is not int:
            if isinstance(v, bool) or not isinstance(v, int):
                raise Bad(f" must be an int, got {describe(v)}")
            v = int(v)
        if not _I64_MIN <= v <= _I64_MAX:
            raise Bad(f": {describe(v)} does not fit in int64")
        out: int = v
        return out


class _Float(_Kind):
    def __init__(self, finite: bool) -> None:
        self.finite = finite

    def check(self, v: Any) -> float:
        if type(v) is not float:
            if isinstance(v, bool) or not isinstance(v, int | float):
                raise Bad(f" must be a float, got {describe(v)}")
            try:
                v = float(v)
            except OverflowError:
                raise Bad(f": {describe(v)} is too large for a float") from None
        if self.finite and not math.isfinite(v):
            raise Bad(f" must be finite, got {v}")
        out: float = v
        return out


class _Bool(_Kind):
    exact = bool

    def check(self, v: Any) -> bool:
        if v is not True and v is not False:
            raise Bad(f" must be a bool, got {describe(v)}")
        return v


class _Str(_Kind):
    exact = str

    def check(self, v: Any) -> str:
        if type(v) is not str:
            if not isinstance(v, str):
                raise Bad(f" must be a str, got {describe(v)}")
            v = str(v)
        out: str = v
        return out


class _Optional(_Kind):
    nullable = True

    def __init__(self, inner: _Kind) -> None:
        self.inner = inner
        self.exact = inner.exact

    def check(self, v: Any) -> Any:
        return None if v is None else self.inner.check(v)

    def load(self, v: Any) -> Any:
        return None if v is None else self.inner.load(v)


class _Tuple(_Kind):
    def __init__(self, inner: _Kind) -> None:
        self.inner = inner

    def check(self, v: Any) -> tuple[Any, ...]:
        if not isinstance(v, tuple | list):
            raise Bad(f" must be a tuple, got {describe(v)}")
        return self._each(self.inner.check, v)

    def load(self, v: Any) -> tuple[Any, ...]:
        if not isinstance(v, list):
            raise Bad(f" must be an array, got {describe(v)}")
        return self._each(self.inner.load, v)

    @staticmethod
    def _each(check: Callable[[Any], Any], v: Sequence[Any]) -> tuple[Any, ...]:
        i = 0
        try:
            out = []
            for i, item in enumerate(v):  # noqa: B007 - i names the item on error
                out.append(check(item))
        except Bad as bad:
            raise bad.under(f"[{i}]") from None
        if type(v) is tuple and all(a is b for a, b in zip(out, v, strict=True)):
            return v
        return tuple(out)


class _Value(_Kind):
    def __init__(self, cls: type[Record]) -> None:
        self.cls = cls
        name = cls.__name__
        self.expected = f"{'an' if name[0] in 'AEIOU' else 'a'} {name}"

    def check(self, v: Any) -> Any:
        if type(v) is not self.cls:
            raise Bad(f" must be {self.expected}, got {describe(v)}")
        return v

    def load(self, v: Any) -> Any:
        return self.cls._load(v)


class _Spec(_Kind):
    def check(self, v: Any) -> TensorSpec:
        if not isinstance(v, TensorSpec):
            raise Bad(f" must be a TensorSpec, got {describe(v)}")
        return v

    def load(self, v: Any) -> TensorSpec:
        try:
            return TensorSpec.from_wire(v)
        except WireError as exc:
            raise Bad(f": {exc.detail}", reason=exc.reason) from None  # type: ignore[arg-type]


class _Dict(_Kind):
    def check(self, v: Any) -> dict[str, Any]:
        if not isinstance(v, dict):
            raise Bad(f" must be a dict, got {describe(v)}")
        found = _non_plain(v, 0)
        if found is not None:
            path, problem = found
            raise Bad(f": {problem}", "".join(reversed(path)))
        return v


class _ModelKind(_Kind):
    def __init__(self, optional: bool) -> None:
        self.optional = optional
        self.nullable = optional

    def check(self, v: Any) -> Model | None:
        if v is None and self.optional:
            return None
        if not isinstance(v, Model):
            hint = ""
            if isinstance(v, tuple | list):
                hint = " (wrap arrays with Model.from_arrays or Model.from_flat)"
            raise Bad(f" must be a Model, got {describe(v)}{hint}")
        return v


_SIMPLE: dict[object, _Kind] = {int: _Int(), float: _Float(True), bool: _Bool(), str: _Str()}
_ANY_FLOAT = _Float(False)
_DICT_FIELDS = {("Event", "extra"), ("HostBye", "fidelity"), ("Trained", "notes")}
"""The only fields allowed to be ``dict[str, Any]``."""


def _kind_of(owner: str, name: str, ann: Any) -> _Kind:
    """The check for annotation ``ann`` of field ``owner.name``; TypeError if none."""
    if ann in _SIMPLE:
        return _SIMPLE[ann]
    if ann == AnyFloat:
        return _ANY_FLOAT
    if ann is TensorSpec:
        return _Spec()
    if ann is Model:
        return _ModelKind(optional=False)
    if isinstance(ann, type) and ann in VALUE_TYPES.values():
        return _Value(ann)
    origin, args = get_origin(ann), get_args(ann)
    if origin in (Union, type(int | None)) and len(args) == 2 and type(None) in args:
        inner = args[0] if args[1] is type(None) else args[1]
        if inner is Model:
            return _ModelKind(optional=True)
        return _Optional(_kind_of(owner, name, inner))
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        inner_kind = _kind_of(owner, name, args[0])
        if isinstance(inner_kind, _Int | _Float | _Str | _Value):
            return _Tuple(inner_kind)
    if ann == dict[str, Any] and (owner, name) in _DICT_FIELDS:
        return _Dict()
    raise TypeError(f"{owner}.{name}: no wire type for annotation {ann!r}")


# ---------------------------------------------------------------------------
# Records: the base of value types and messages


def _same(a: Any, b: Any) -> bool:
    if type(a) is float and type(b) is float and a != a and b != b:
        return True  # NaN in an AnyFloat field
    return bool(a == b)


def non_negative(record: object, *names: str) -> None:
    """Each named int field of ``record`` is >= 0 (ids, counters, versions)."""
    for name in names:
        value = getattr(record, name)
        if value is not None and value < 0:
            raise Bad(f" must be >= 0, got {value}", f".{name}")


class Record:
    """Shared behaviour of value types and messages: checks, ``==``, short repr."""

    __slots__ = ()

    KIND: ClassVar[str]
    """The class name: the kind written in the envelope."""
    FIELDS: ClassVar[tuple[str, ...]]
    """Field names in declaration order: the order of the values on the wire."""
    MODEL_FIELD: ClassVar[str | None] = None
    """Name of the field holding the Model (its bytes travel as frames), or None."""
    MODEL_OPTIONAL: ClassVar[bool] = False
    """Whether the Model field is ``Model | None``."""
    MODEL_COPIES_FIELD: ClassVar[str | None] = None
    """A tuple field whose length is the number of spec copies the model holds
    (Advance: ``rounds``); None means one copy."""
    _FIELDS: ClassVar[tuple[tuple[str, _Kind], ...]]
    _PLAN: ClassVar[tuple[tuple[str, _Kind, bool, type | None], ...]]
    """Per field: name, kind, and the kind's fast paths (nullable, exact type)."""
    _MODEL_INDEX: ClassVar[int]

    def __post_init__(self) -> None:
        name = ""
        try:
            for name, kind, nullable, exact in self._PLAN:
                value = getattr(self, name)
                if (value is None and nullable) or type(value) is exact:
                    continue
                checked = kind.check(value)
                if checked is not value:
                    object.__setattr__(self, name, checked)
        except Bad as bad:
            raise bad.under(f".{name}").error(self.KIND) from None
        try:
            self._validate()
        except Bad as bad:
            raise bad.error(self.KIND) from None

    def _validate(self) -> None:
        """Cross-field checks: raise ``Bad`` (path relative to this record)."""

    @classmethod
    def from_wire(cls, raw: Any, model: Model | None = None) -> Any:
        """Build from the decoded msgpack array of field values, checking each.

        ``model`` fills the Model field (its slot in ``raw``, the spec, is
        not read). Raises ``WireError`` (``"bad_field"``, or ``"bad_dtype"``
        in a TensorSpec field) naming the field.
        """
        try:
            return cls._load(raw, model)
        except Bad as bad:
            raise bad.error(cls.KIND) from None

    @classmethod
    def _load(cls, raw: Any, model: Model | None = None) -> Any:
        if not isinstance(raw, list):
            raise Bad(f" must be an array, got {describe(raw)}")
        if len(raw) != len(cls._FIELDS):
            raise Bad(f": {len(raw)} field values, {cls.KIND} has {len(cls._FIELDS)}")
        if cls._MODEL_INDEX >= 0:  # the slot holds the spec: put the model there
            raw = list(raw)
            raw[cls._MODEL_INDEX] = model
        obj = object.__new__(cls)
        setattr_ = object.__setattr__
        name = ""
        try:
            for (name, kind, nullable, exact), value in zip(cls._PLAN, raw, strict=True):
                if not ((value is None and nullable) or type(value) is exact):
                    value = kind.load(value)
                setattr_(obj, name, value)
        except Bad as bad:
            raise bad.under(f".{name}") from None
        obj._validate()
        return obj

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return all(_same(getattr(self, n), getattr(other, n)) for n in self.FIELDS)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"{self.KIND}({', '.join(f'{n}={getattr(self, n)!r}' for n in self.FIELDS)})"


_R = TypeVar("_R", bound=type[Record])

VALUE_TYPES: dict[str, type[Any]] = {}
"""Name -> registered value type (usable as a field type, not sent alone)."""


def register(cls: _R, registry: dict[str, type[Any]], *, message: bool) -> _R:
    """Build the checks of record class ``cls`` from its annotations; enter it in ``registry``.

    TypeError for an annotation with no wire type, or a Model field where
    none may be (a value type, a second one).
    """
    hints = get_type_hints(cls, include_extras=True)
    checks: list[tuple[str, _Kind]] = []
    model_index = -1
    for i, f in enumerate(fields(cls)):  # type: ignore[arg-type]
        kind = _kind_of(cls.__name__, f.name, hints[f.name])
        if isinstance(kind, _ModelKind):
            if not message:
                raise TypeError(f"{cls.__name__}.{f.name}: value types cannot hold a Model")
            if model_index >= 0:
                raise TypeError(f"{cls.__name__}: more than one Model field")
            model_index = i
        checks.append((f.name, kind))
    cls.KIND = cls.__name__
    cls._FIELDS = tuple(checks)
    cls._PLAN = tuple((name, kind, kind.nullable, kind.exact) for name, kind in checks)
    cls.FIELDS = tuple(name for name, _ in checks)
    cls._MODEL_INDEX = model_index
    cls.MODEL_FIELD = checks[model_index][0] if model_index >= 0 else None
    cls.MODEL_OPTIONAL = model_index >= 0 and cast("_ModelKind", checks[model_index][1]).optional
    _compile_checks(cls)
    registry[cls.KIND] = cls
    return cls


# ---------------------------------------------------------------------------
# The checks of each record class as straight-line code
#
# A message is checked on every send and every receive, on the event loops.
# The loops above (Record.__post_init__, Record._load) call a check per field;
# for each class, register() also writes them out as one function per
# direction, with a value of the expected type and range passing inline and
# anything else going to the very same kind's check (which converts it or
# raises Bad, named by field). Same results, same errors (a test compares them
# on odd values in every field of every kind); for an Update, decoding its
# fields takes 1.3 us instead of 2.9 and building one 1.8 instead of 2.7 (thread
# CPU time, timeit best of 5).


def _inline(kind: _Kind, v: str) -> str | None:
    """An expression true when value ``v`` passes ``kind`` unchanged; None: always call it."""
    if isinstance(kind, _Optional):
        inner = _inline(kind.inner, v)
        return None if inner is None else f"{v} is None or ({inner})"
    if isinstance(kind, _ModelKind):
        return f"type({v}) is Model" + (f" or {v} is None" if kind.optional else "")
    if isinstance(kind, _Int):
        return f"type({v}) is int and {_I64_MIN} <= {v} <= {_I64_MAX}"
    if isinstance(kind, _Float):
        return f"type({v}) is float" + (f" and {v} - {v} == 0.0" if kind.finite else "")
    if kind.exact is not None:
        return f"type({v}) is {kind.exact.__name__}"
    return None


def _compile_checks(cls: type[Record]) -> None:
    """Give ``cls`` its straight-line ``__post_init__`` and ``_load`` (see above)."""
    names = {"Bad": Bad, "Model": Model, "new": object.__new__, "set_": object.__setattr__,
             "generic_load": Record._load.__func__,  # type: ignore[attr-defined]
             "cls": cls}
    post = ["def __post_init__(self):", "    try:", "        pass"]
    load = ["def _load(cls_, raw, model=None):",
            f"    if type(raw) is not list or len(raw) != {len(cls._PLAN)}:",
            "        return generic_load(cls_, raw, model)",
            "    obj = new(cls_)"]
    for i, (name, kind, _, _) in enumerate(cls._PLAN):
        names[f"k{i}"] = kind
        fast = _inline(kind, "v")
        test = f"not ({fast})" if fast else "True"
        post += [f"        v = self.{name}",
                 f"        if {test}:",
                 f"            c = k{i}.check(v)",
                 f"            if c is not v: set_(self, {name!r}, c)"]
        load += [f"    v = {'model' if i == cls._MODEL_INDEX else f'raw[{i}]'}",
                 f"    if {test}:",
                 "        try:",
                 f"            v = k{i}.load(v)",
                 "        except Bad as bad:",
                 f"            raise bad.under({'.' + name!r}) from None",
                 f"    set_(obj, {name!r}, v)"]
    post += ["    except Bad:",    # the generic loop raises the same Bad, naming the field
             "        Record.__post_init__(self)",
             "        raise",
             "    try:",
             "        self._validate()",
             "    except Bad as bad:",
             "        raise bad.error(cls.KIND) from None"]
    load += ["    obj._validate()", "    return obj"]
    names["Record"] = Record
    code = compile("\n".join(post) + "\n\n" + "\n".join(load),
                   f"<checks of {cls.__name__}>", "exec")
    exec(code, names)  # the source is built above from the class's own field names
    cls.__post_init__ = names["__post_init__"]  # type: ignore[method-assign]
    cls._load = classmethod(names["_load"])  # type: ignore[method-assign,assignment]
