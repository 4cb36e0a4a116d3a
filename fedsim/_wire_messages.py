"""The message kinds of schema version 1.

Private module; import from :mod:`fedsim.wire`.

Every message is a frozen, slotted, keyword-only dataclass. Field values are
checked when the message is built, on the sending side and in
:func:`fedsim.wire.decode` alike, so a message that exists is well-typed.
"Frozen" is shallow: the dicts and arrays inside are the caller's objects and
must not be changed after the message is built (see the zero-copy note in
:mod:`fedsim.wire`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, TypeVar, get_type_hints

import numpy as np
from numpy.typing import NDArray

from fedsim._wire_types import (
    WIRE_DTYPES,
    WireError,
    check_plain,
    describe,
    wire_dtype_name,
)

__all__ = [
    "KINDS",
    "Aggregate",
    "Bye",
    "Control",
    "Error",
    "EventBatch",
    "EventRecord",
    "Heartbeat",
    "HostHello",
    "Message",
    "Register",
    "Task",
    "Tensors",
    "Update",
]

Tensors = tuple[NDArray[Any], ...]
"""A message's tensors, in order (e.g. the model's parameters)."""

EventRecord = tuple[Any, ...] | dict[str, Any]
"""One event-log record: a tuple or a dict of plain values."""

_I64_MIN = -(2**63)
_I64_MAX = 2**63 - 1

_FieldCheck = Callable[[str, Any], Any]


def _check_int(where: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise WireError("bad_field", f"{where} must be an int, got {describe(value)}")
    if not _I64_MIN <= value <= _I64_MAX:
        raise WireError("bad_field", f"{where}={value} does not fit in int64")
    return value


def _check_str(where: str, value: Any) -> str:
    if not isinstance(value, str):
        raise WireError("bad_field", f"{where} must be a str, got {describe(value)}")
    return value


def _check_dict(where: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise WireError("bad_field", f"{where} must be a dict, got {describe(value)}")
    check_plain(where, value)
    return value


def _as_tuple(where: str, value: Any) -> tuple[Any, ...]:
    if isinstance(value, tuple):
        return value
    if isinstance(value, list):
        return tuple(value)
    raise WireError(
        "bad_field", f"{where} must be a tuple or list, got {describe(value)}"
    )


def _check_tensors(where: str, value: Any) -> Tensors:
    arrays = _as_tuple(where, value)
    for i, a in enumerate(arrays):
        if not isinstance(a, np.ndarray):
            hint = " (convert torch tensors with tensors_to_numpy)"
            raise WireError(
                "bad_field",
                f"{where}[{i}] must be a numpy.ndarray, got {describe(a)}"
                + (hint if type(a).__module__.startswith("torch") else ""),
            )
        if wire_dtype_name(a.dtype) is None:
            raise WireError(
                "bad_dtype",
                f"{where}[{i}] has dtype {a.dtype}; allowed: {', '.join(WIRE_DTYPES)}",
            )
    return arrays


def _check_int_tuple(where: str, value: Any) -> tuple[int, ...]:
    items = _as_tuple(where, value)
    for i, item in enumerate(items):
        _check_int(f"{where}[{i}]", item)
    return items


def _check_events(where: str, value: Any) -> tuple[EventRecord, ...]:
    records = _as_tuple(where, value)
    if any(isinstance(r, list) for r in records):
        records = tuple(tuple(r) if isinstance(r, list) else r for r in records)
    for i, record in enumerate(records):
        if isinstance(record, tuple):
            check_plain(f"{where}[{i}]", list(record))
        elif isinstance(record, dict):
            check_plain(f"{where}[{i}]", record)
        else:
            raise WireError(
                "bad_field",
                f"{where}[{i}] must be a tuple or dict, got {describe(record)}",
            )
    return records


# Annotation -> check. A field with any other annotation is a bug in this file.
_CHECKS: dict[object, _FieldCheck] = {
    int: _check_int,
    str: _check_str,
    dict[str, Any]: _check_dict,
    Tensors: _check_tensors,
    tuple[int, ...]: _check_int_tuple,
    tuple[EventRecord, ...]: _check_events,
}


def _tensors_equal(a: Tensors, b: Tensors) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if x.dtype != y.dtype or x.shape != y.shape:
            return False
        if not np.array_equal(x, y, equal_nan=x.dtype.kind == "f"):
            return False
    return True


def _tensors_repr(arrays: Tensors) -> str:
    shown = [f"{a.dtype}{list(a.shape)}" for a in arrays[:4]]
    if len(arrays) > 4:
        shown.append(f"... {len(arrays) - 4} more")
    nbytes = sum(a.nbytes for a in arrays)
    return f"<{len(arrays)} tensors, {nbytes} B: {', '.join(shown)}>"


class _MessageBase:
    """Shared behaviour: field checks, tensor-aware ``==`` and a short repr."""

    __slots__ = ()

    KIND: ClassVar[str]
    """The kind string written in the header (the class name)."""
    TENSOR_FIELD: ClassVar[str | None]
    """Name of the field that travels as raw frames, or None."""
    BODY_FIELDS: ClassVar[tuple[str, ...]]
    """Fields that travel in the msgpack header, in declaration order."""
    _FIELD_CHECKS: ClassVar[tuple[tuple[str, _FieldCheck], ...]]

    def __post_init__(self) -> None:
        for name, check in self._FIELD_CHECKS:
            value = getattr(self, name)
            checked = check(f"{self.KIND}.{name}", value)
            if checked is not value:
                object.__setattr__(self, name, checked)

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        for name, _ in self._FIELD_CHECKS:
            mine, theirs = getattr(self, name), getattr(other, name)
            if name == self.TENSOR_FIELD:
                if not _tensors_equal(mine, theirs):
                    return False
            elif mine != theirs:
                return False
        return True

    def __repr__(self) -> str:
        parts = []
        for name, _ in self._FIELD_CHECKS:
            value = getattr(self, name)
            text = _tensors_repr(value) if name == self.TENSOR_FIELD else repr(value)
            parts.append(f"{name}={text}")
        return f"{self.KIND}({', '.join(parts)})"


_M = TypeVar("_M", bound=type[_MessageBase])

KINDS: dict[str, type[_MessageBase]] = {}
"""Kind string -> message class, for dispatch in :func:`fedsim.wire.decode`."""


def _register(cls: _M) -> _M:
    hints = get_type_hints(cls)
    checks: list[tuple[str, _FieldCheck]] = []
    tensor_field = None
    for f in fields(cls):  # type: ignore[arg-type]
        annotation = hints[f.name]
        if annotation not in _CHECKS:
            raise TypeError(f"{cls.__name__}.{f.name}: no wire check for {annotation}")
        checks.append((f.name, _CHECKS[annotation]))
        if annotation == Tensors:
            tensor_field = f.name
    cls.KIND = cls.__name__
    cls.TENSOR_FIELD = tensor_field
    cls.BODY_FIELDS = tuple(name for name, _ in checks if name != tensor_field)
    cls._FIELD_CHECKS = tuple(checks)
    KINDS[cls.KIND] = cls
    return cls


def _dict() -> dict[str, Any]:
    return {}


# ---------------------------------------------------------------------------
# Client <-> server, through the network emulator


@_register
@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class Register(_MessageBase):
    """First contact of a client with the server."""

    client: int
    host: str
    num_samples: int
    info: dict[str, Any] = field(default_factory=_dict)


@_register
@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class Task(_MessageBase):
    """Server -> client: train from ``tensors`` (model ``version``) with ``config``.

    ``config`` holds the local configuration (steps, lr, ...).
    """

    client: int
    version: int
    round: int
    task_id: int
    tensors: Tensors
    config: dict[str, Any] = field(default_factory=_dict)


@_register
@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class Update(_MessageBase):
    """Client -> server: result of task ``task_id``, trained from ``base_version``."""

    client: int
    task_id: int
    base_version: int
    round: int
    num_samples: int
    tensors: Tensors
    stats: dict[str, Any] = field(default_factory=_dict)


@_register
@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class Aggregate(_MessageBase):
    """Server -> clients broadcast (e.g. DGA's averaged gradient)."""

    round: int
    version: int
    tensors: Tensors
    info: dict[str, Any] = field(default_factory=_dict)


@_register
@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class Heartbeat(_MessageBase):
    """Liveness and availability (``status``: "ready", "suspended", ...)."""

    sender: int
    status: str
    info: dict[str, Any] = field(default_factory=_dict)


@_register
@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class Bye(_MessageBase):
    """Orderly departure of ``sender``."""

    sender: int
    reason: str


@_register
@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class Error(_MessageBase):
    """``sender`` reports a fatal failure (its training failed); the server drops it."""

    sender: int
    reason: str


# ---------------------------------------------------------------------------
# Client host <-> server control channel (not through the network emulator)


@_register
@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class HostHello(_MessageBase):
    """A client-host process announces itself and the clients it runs."""

    host: str
    clients: tuple[int, ...]
    pid: int
    info: dict[str, Any] = field(default_factory=_dict)


@_register
@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class Control(_MessageBase):
    """A control operation (``op``: "start", "stop", "clock_sync", ...)."""

    op: str
    args: dict[str, Any] = field(default_factory=_dict)


@_register
@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class EventBatch(_MessageBase):
    """A batch of event-log records from ``host`` (tuples or dicts of plain data).

    Lists given as records are stored as tuples, as decode returns them.
    """

    host: str
    events: tuple[EventRecord, ...]


Message = (
    Register
    | Task
    | Update
    | Aggregate
    | Heartbeat
    | Bye
    | Error
    | HostHello
    | Control
    | EventBatch
)
"""Any message of this schema; ``match`` on the class to dispatch."""
