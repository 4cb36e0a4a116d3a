"""fedsim's message schema, version 2: value types, messages, models, errors.

This module says *what* travels; :mod:`fedsim.codec` says *how* (frames,
envelope, size caps). Import each name from the module that defines it.
Neither module imports torch: client-host processes do not load it.

Rules
-----
1. One schema, versioned by :data:`SCHEMA_VERSION`. A message is a frozen,
   slotted, keyword-only dataclass whose fields are checked when it is built,
   on the sending side and in :func:`fedsim.codec.decode` alike, so a message
   that exists is well-typed. Dispatch on its class
   (``match msg: case Update(): ...``); :data:`KINDS` maps kind names (the
   class names) to classes and :data:`Message` is their union.
2. Field types are few and checked by annotation:

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
       frozen keyword-only dataclasses registered like messages
       (:class:`LocalWork`, :class:`Event`, :class:`PhaseSample`), checked
       the same way;
   :class:`TensorSpec`
       a model's layout;
   :class:`Model`
       the model, at most one field per message (``Model`` or
       ``Model | None``); it travels as raw frames, never in msgpack;
   ``dict[str, Any]``
       only ``Event.extra``, ``HostBye.fidelity`` and ``Trained.notes``:
       plain data (None, bool, int, float, str, list, dict with str keys,
       at most :data:`MAX_DEPTH` deep; see :func:`check_plain`).

   A bad value raises ``WireError("bad_field")`` naming the field and the
   value: ``Update.steps must be an int, got str 'lots'``.
3. Nothing is pickled. In the msgpack header a message or value type is an
   array of its field values in declaration order (no names: the schema
   version pins the layout); a tuple is an array; a :class:`TensorSpec` is an
   array of ``[dtype name, [dims]]`` pairs; a Model field holds the model's
   spec there, its bytes follow as frames (see :mod:`fedsim.codec`).
4. Errors carry a stable :data:`Reason` code: log it, count it, go on.

Models and the zero-copy contract
---------------------------------
A :class:`Model` is a :class:`TensorSpec` plus one 1-D C-contiguous buffer per
distinct dtype (in order of first appearance in the spec) holding that
dtype's tensors back to back in spec order. A float32 model is one buffer,
sent as one frame. :meth:`Model.from_flat` wraps an existing flat array
without copying; :meth:`Model.from_arrays` copies per-tensor arrays into new
buffers (one copy). :meth:`Model.arrays` returns per-tensor views.

The codec sends a Model's buffers as they are and decodes into read-only
``np.frombuffer`` views of the received frames. So:

- do not modify a Model's buffers while a message holding it may still be in
  flight: the network emulator holds frames for the link delay, ``inproc://``
  hands the very same memory to the receiver, and a :class:`fedsim.codec.Body`
  encoded once and sent later sends whatever the buffer holds then. Snapshot
  a model that keeps changing (``Model.from_flat(x.copy(), spec)``);
- copy a decoded buffer before modifying it (``model.flat().copy()``). A
  decoded buffer may also be unaligned (``flags.aligned``), as libzmq puts it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, fields
from typing import (
    Annotated,
    Any,
    ClassVar,
    Literal,
    TypeVar,
    Union,
    cast,
    get_args,
    get_origin,
    get_type_hints,
)

import numpy as np
from numpy.typing import DTypeLike, NDArray

__all__ = [
    "EVENT_KINDS",
    "FAILURE_CAUSES",
    "HOST_EVENT_KINDS",
    "HOST_PHASES",
    "KINDS",
    "MAX_DEPTH",
    "MAX_NDIM",
    "MAX_PHASE_VALUES",
    "MAX_TENSORS",
    "REASONS",
    "SCHEMA_VERSION",
    "VALUE_TYPES",
    "WIRE_DTYPES",
    "Advance",
    "AnyFloat",
    "Average",
    "ClockProbe",
    "ClockReply",
    "Evaluate",
    "Evaluated",
    "Event",
    "EventBatch",
    "Failed",
    "HostBye",
    "HostHello",
    "Leave",
    "LocalWork",
    "Message",
    "Model",
    "PhaseSample",
    "Ready",
    "Reason",
    "Refused",
    "Shutdown",
    "Start",
    "Stop",
    "Task",
    "TensorSpec",
    "Train",
    "Trained",
    "Update",
    "WireError",
    "WorkerFailed",
    "WorkerReady",
    "check_plain",
    "describe",
    "wire_dtype_name",
]

SCHEMA_VERSION = 3
"""Version written in every envelope; :func:`fedsim.codec.decode` rejects any other."""

# ---------------------------------------------------------------------------
# Errors

Reason = Literal[
    "bad_frame",  # a frame is not a contiguous bytes-like buffer
    "bad_envelope",  # frame 0 is not a msgpack [version, kind, sent_at, seq] array
    "bad_header",  # frame 1 is not a msgpack array, or the model spec in it is malformed
    "wrong_version",  # envelope's schema version is not SCHEMA_VERSION
    "unknown_kind",  # envelope names a message kind this schema does not have
    "oversize",  # total bytes over max_bytes (checked before any frame is parsed)
    "oversize_header",  # frame 0 or 1 over its limit (checked before it is unpacked)
    "frame_count",  # number of frames != 2 + number of model buffers
    "bad_dtype",  # a dtype outside WIRE_DTYPES
    "shape_mismatch",  # tensor count or shape differs from the expected TensorSpec
    "dtype_mismatch",  # tensor dtype differs from the expected TensorSpec
    "size_mismatch",  # a buffer's length != what the spec says it holds
    "non_finite",  # NaN or +-Inf in a floating-point model buffer
    "bad_value",  # a bool tensor holding bytes other than 0 and 1
    "bad_field",  # missing, extra or wrongly typed field, or envelope argument
]
"""Short, stable codes carried by :class:`WireError` (log them, count them)."""

REASONS: frozenset[str] = frozenset(get_args(Reason))

MAX_NDIM = 32
"""Most dimensions a tensor may have."""

MAX_TENSORS = 65536
"""Most tensors a :class:`TensorSpec` may list."""

MAX_DEPTH = 32
"""Deepest nesting of lists and dicts in a plain-data (``dict[str, Any]``) field."""

_I64_MIN = -(2**63)
_I64_MAX = 2**63 - 1
_U64_MAX = 2**64 - 1


class WireError(ValueError):
    """A message that cannot be built or encoded, or was rejected on decode.

    Parameters
    ----------
    reason : Reason
        Short stable code, one of :data:`REASONS` (e.g. ``"oversize"``).
    detail : str
        What was wrong, naming the frame, field or tensor.

    Attributes
    ----------
    reason : str
        The code, for counters and log fields.
    detail : str
        The human-readable part.
    """

    reason: str
    detail: str

    def __init__(self, reason: Reason, detail: str) -> None:
        if reason not in REASONS:
            raise ValueError(
                f"Invalid WireError reason: {reason!r}; use one of {sorted(REASONS)}"
            )
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail

    def __reduce__(self) -> tuple[type[WireError], tuple[str, str]]:
        # Default exception pickling replays self.args, which is one string.
        return (type(self), (self.reason, self.detail))


def describe(value: object, limit: int = 40) -> str:
    """Return ``"<type> <short repr>"`` for an error message."""
    text = repr(value)
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return f"{type(value).__name__} {text}"


# ---------------------------------------------------------------------------
# dtypes

WIRE_DTYPES: dict[str, np.dtype[Any]] = {
    name: np.dtype(code)
    for name, code in (
        ("bool", "|b1"),
        ("uint8", "|u1"),
        ("int8", "|i1"),
        ("int16", "<i2"),
        ("int32", "<i4"),
        ("int64", "<i8"),
        ("float16", "<f2"),
        ("float32", "<f4"),
        ("float64", "<f8"),
    )
}
"""Wire name -> dtype. Multi-byte types travel little-endian. No bfloat16
(numpy lacks it): convert with ``.float()`` first."""

_NAME_BY_KIND_SIZE = {(dt.kind, dt.itemsize): name for name, dt in WIRE_DTYPES.items()}


def wire_dtype_name(dtype: DTypeLike) -> str | None:
    """Return the wire name of ``dtype`` (any byte order), or None if not allowed."""
    try:
        dt = np.dtype(dtype)
    except (TypeError, ValueError):
        return None
    if dt.fields is not None or dt.subdtype is not None:
        return None
    return _NAME_BY_KIND_SIZE.get((dt.kind, dt.itemsize))


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
# TensorSpec

Shape = tuple[int, ...]


def _check_dims(where: str, shape: object, reason: Reason) -> Shape:
    """Return ``shape`` as a tuple of ints, or raise WireError(reason)."""
    if isinstance(shape, np.ndarray | str | bytes) or not isinstance(shape, Sequence):
        raise WireError(reason, f"{where}: shape {describe(shape)} is not a sequence")
    if len(shape) > MAX_NDIM:
        raise WireError(reason, f"{where}: {len(shape)} dimensions > MAX_NDIM={MAX_NDIM}")
    dims = []
    for d in shape:
        if isinstance(d, bool) or not isinstance(d, int | np.integer) or not 0 <= d <= _I64_MAX:
            raise WireError(reason, f"{where}: bad shape {describe(shape)}")
        dims.append(int(d))
    return tuple(dims)


@dataclass(frozen=True, slots=True, init=False, repr=False)
class TensorSpec:
    """The layout of a model: one ``(dtype name, shape)`` per tensor, in order.

    Give it to :func:`fedsim.codec.decode` so that a message whose model does
    not fit is rejected before its buffers are read. It is also a field type
    (``Start.spec``), sent as ``[[dtype, [dims]], ...]``.

    Parameters
    ----------
    entries : iterable of (dtype-like, sequence of int)
        Dtype and shape of each tensor; dtypes must be wire dtypes. (Schema 1
        took ``(shape, dtype)``; that order is refused with a hint.)

    Attributes
    ----------
    entries : tuple of (str, tuple of int)
        Wire dtype names and shapes.

    Examples
    --------
    >>> spec = TensorSpec([("float32", (3, 4)), (np.float32, (4,))])
    >>> spec.nbytes, spec.dtypes
    (64, ('float32',))
    """

    entries: tuple[tuple[str, Shape], ...]
    # Derived (not compared): distinct dtypes in order of first appearance,
    # elements per dtype, (buffer index, offset, count) of each entry, the
    # wire form, and the total bytes.
    _dtypes: tuple[str, ...] = field(compare=False)
    _counts: tuple[int, ...] = field(compare=False)
    _layout: tuple[tuple[int, int, int], ...] = field(compare=False)
    _wire: list[list[Any]] = field(compare=False)
    _nbytes: int = field(compare=False)

    def __init__(self, entries: Iterable[tuple[DTypeLike, Sequence[int]]]) -> None:
        self._set(self._normalize(entries, "bad_field", local=True))

    @staticmethod
    def _normalize(entries: Iterable[Any], reason: Reason, local: bool) -> list[tuple[str, Shape]]:
        """Check and normalize entries; ``local``: built here (any dtype-like),
        else decoded (dtype names only). Malformed entries raise ``reason``."""
        out: list[tuple[str, Shape]] = []
        for i, entry in enumerate(entries):
            if i >= MAX_TENSORS:
                raise WireError(reason, f"TensorSpec: more than MAX_TENSORS={MAX_TENSORS}")
            if not isinstance(entry, tuple | list) or len(entry) != 2:
                raise WireError(
                    reason, f"tensor {i}: {describe(entry)} is not a (dtype, shape) pair"
                )
            dtype, shape = entry
            if local:
                if isinstance(dtype, tuple | list):
                    raise WireError(
                        reason,
                        f"tensor {i}: {describe(entry)}: entries are (dtype, shape) pairs",
                    )
                name = wire_dtype_name(dtype)
            elif isinstance(dtype, str):
                name = dtype if dtype in WIRE_DTYPES else None
            else:
                raise WireError(reason, f"tensor {i}: dtype {describe(dtype)}")
            if name is None:
                raise WireError(
                    "bad_dtype",
                    f"tensor {i}: dtype {dtype!r} not allowed; use one of {list(WIRE_DTYPES)}",
                )
            out.append((name, _check_dims(f"tensor {i}", shape, reason)))
        return out

    def _set(self, entries: Sequence[tuple[str, Shape]]) -> None:
        dtypes: list[str] = []
        counts: list[int] = []
        layout: list[tuple[int, int, int]] = []
        for name, shape in entries:
            try:
                b = dtypes.index(name)
            except ValueError:
                b = len(dtypes)
                dtypes.append(name)
                counts.append(0)
            n = math.prod(shape)
            layout.append((b, counts[b], n))
            counts[b] += n
        setattr_ = object.__setattr__
        setattr_(self, "entries", tuple(entries))
        setattr_(self, "_dtypes", tuple(dtypes))
        setattr_(self, "_counts", tuple(counts))
        setattr_(self, "_layout", tuple(layout))
        setattr_(self, "_wire", [[name, list(shape)] for name, shape in entries])
        setattr_(self, "_nbytes", sum(n * WIRE_DTYPES[name].itemsize
                                      for name, n in zip(dtypes, counts, strict=True)))

    @classmethod
    def from_wire(cls, raw: object) -> TensorSpec:
        """Build from its decoded msgpack form, ``[[dtype name, [dims]], ...]``.

        Raises
        ------
        WireError
            ``"bad_field"`` if malformed, ``"bad_dtype"`` for a dtype name
            outside :data:`WIRE_DTYPES`.
        """
        if not isinstance(raw, list):
            raise WireError("bad_field", f"TensorSpec: {describe(raw)} is not an array")
        spec = object.__new__(cls)
        spec._set(cls._normalize(raw, "bad_field", local=False))
        return spec

    def to_wire(self) -> list[list[Any]]:
        """The msgpack form, ``[[dtype name, [dims]], ...]`` (cached: do not modify)."""
        return self._wire

    @classmethod
    def from_arrays(cls, arrays: Iterable[NDArray[Any]]) -> TensorSpec:
        """Build the spec that ``arrays`` (e.g. a model's parameters) satisfy."""
        return cls((a.dtype, a.shape) for a in arrays)

    @property
    def dtypes(self) -> tuple[str, ...]:
        """Distinct dtype names, in order of first appearance: one Model buffer each."""
        return self._dtypes

    @property
    def counts(self) -> tuple[int, ...]:
        """Elements per dtype of :attr:`dtypes` (the lengths of a Model's buffers)."""
        return self._counts

    @property
    def layout(self) -> tuple[tuple[int, int, int], ...]:
        """Where each tensor lives in a Model: ``(buffer index, offset, count)``,
        in elements of the buffer's dtype."""
        return self._layout

    @property
    def nbytes(self) -> int:
        """Total bytes of the tensors described."""
        return self._nbytes

    def __len__(self) -> int:
        return len(self.entries)

    def __iter__(self) -> Iterator[tuple[str, Shape]]:
        return iter(self.entries)

    def __repr__(self) -> str:
        shown = [f"{name}{list(shape)}" for name, shape in self.entries[:4]]
        if len(self.entries) > 4:
            shown.append(f"... {len(self.entries) - 4} more")
        return f"TensorSpec({', '.join(shown)}; {self.nbytes} B)"

    def repeated(self, copies: int) -> TensorSpec:
        """This spec ``copies`` times back to back (e.g. a model plus a control
        variate: ``spec.repeated(2)``). The per-dtype buffers of such a Model hold
        the copies one after the other."""
        if isinstance(copies, bool) or not isinstance(copies, int) or copies < 0:
            raise ValueError(f"TensorSpec.repeated: copies must be an int >= 0, got {copies!r}")
        if len(self.entries) * copies > MAX_TENSORS:
            raise WireError("bad_field", f"TensorSpec: more than MAX_TENSORS={MAX_TENSORS}")
        if copies == 1:
            return self   # immutable: a trainer asks this of every upload
        spec = object.__new__(TensorSpec)
        spec._set(self.entries * copies)
        return spec

    def check(self, arrays: Sequence[NDArray[Any]]) -> None:
        """Raise ``WireError`` unless ``arrays`` match this spec.

        Raises
        ------
        WireError
            ``"shape_mismatch"`` (count or shape) or ``"dtype_mismatch"``.
        """
        self._check_entries([(wire_dtype_name(a.dtype), a.shape) for a in arrays])

    def check_spec(self, got: TensorSpec) -> None:
        """Raise ``WireError`` unless ``got`` equals this (expected) spec.

        Raises
        ------
        WireError
            ``"shape_mismatch"`` (count or shape) or ``"dtype_mismatch"``,
            naming the first tensor that differs.
        """
        if got.entries != self.entries:
            self._check_entries(got.entries)

    def _check_entries(self, entries: Sequence[tuple[str | None, Shape]]) -> None:
        if len(entries) != len(self.entries):
            raise WireError(
                "shape_mismatch", f"expected {len(self.entries)} tensors, got {len(entries)}"
            )
        for i, ((name, shape), (want_name, want_shape)) in enumerate(
            zip(entries, self.entries, strict=True)
        ):
            if tuple(shape) != want_shape:
                raise WireError(
                    "shape_mismatch", f"tensor {i}: shape {tuple(shape)}, expected {want_shape}"
                )
            if name != want_name:
                raise WireError(
                    "dtype_mismatch", f"tensor {i}: dtype {name}, expected {want_name}"
                )


# ---------------------------------------------------------------------------
# Model


def _not_array_hint(value: object) -> str:
    if type(value).__module__.startswith("torch"):
        return " (use tensor.numpy(), or Model.from_arrays)"
    return ""


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class Model:
    """A model on the wire: its spec and one flat buffer per dtype.

    Parameters
    ----------
    spec : TensorSpec
        Dtype and shape of every tensor.
    buffers : tuple of numpy.ndarray
        One 1-D C-contiguous array per dtype of ``spec.dtypes``, of that wire
        dtype (little-endian), holding that dtype's tensors back to back in
        spec order (``spec.counts`` elements). A list is stored as a tuple.
        They are used as they are, not copied (see the module's zero-copy
        contract).

    Raises
    ------
    WireError
        ``"bad_field"`` (not arrays, wrong count, not 1-D contiguous),
        ``"dtype_mismatch"`` or ``"size_mismatch"``.
    """

    spec: TensorSpec
    buffers: tuple[NDArray[Any], ...]

    def __post_init__(self) -> None:
        spec, buffers = self.spec, self.buffers
        if not isinstance(spec, TensorSpec):
            raise WireError("bad_field", f"Model.spec must be a TensorSpec, got {describe(spec)}")
        if isinstance(buffers, list):
            buffers = tuple(buffers)
            object.__setattr__(self, "buffers", buffers)
        if not isinstance(buffers, tuple):
            raise WireError(
                "bad_field", f"Model.buffers must be a tuple of arrays, got {describe(buffers)}"
            )
        if len(buffers) != len(spec.dtypes):
            raise WireError(
                "bad_field",
                f"Model.buffers: {len(buffers)} buffers, the spec has"
                f" {len(spec.dtypes)} dtypes {list(spec.dtypes)}",
            )
        for i, (buf, name, n) in enumerate(zip(buffers, spec.dtypes, spec.counts, strict=True)):
            where = f"Model.buffers[{i}]"
            if not isinstance(buf, np.ndarray):
                raise WireError(
                    "bad_field",
                    f"{where} must be a numpy.ndarray, got {describe(buf)}{_not_array_hint(buf)}",
                )
            if buf.dtype != WIRE_DTYPES[name]:
                raise WireError("dtype_mismatch", f"{where}: dtype {buf.dtype}, expected {name}")
            if buf.ndim != 1 or not buf.flags.c_contiguous:
                raise WireError("bad_field", f"{where} must be 1-D and C-contiguous")
            if buf.size != n:
                raise WireError(
                    "size_mismatch", f"{where} ({name}): {buf.size} elements, the spec needs {n}"
                )

    @classmethod
    def from_flat(cls, flat: NDArray[Any], spec: TensorSpec) -> Model:
        """Wrap ``flat``, all of ``spec``'s tensors back to back, without copying.

        Parameters
        ----------
        flat : numpy.ndarray
            C-contiguous (any shape; it is viewed as 1-D), of the spec's one
            dtype, with exactly the spec's element count.
        spec : TensorSpec
            A single-dtype spec (or an empty one, with an empty ``flat``).

        Raises
        ------
        WireError
            ``"bad_field"`` (several dtypes, not an array, not contiguous),
            ``"dtype_mismatch"`` or ``"size_mismatch"``.
        """
        if not isinstance(spec, TensorSpec):
            raise WireError("bad_field", f"Model.from_flat: spec {describe(spec)}")
        if not isinstance(flat, np.ndarray):
            raise WireError(
                "bad_field",
                f"Model.from_flat: flat must be a numpy.ndarray, got {describe(flat)}"
                + _not_array_hint(flat),
            )
        if len(spec.dtypes) > 1:
            raise WireError(
                "bad_field",
                f"Model.from_flat: the spec has dtypes {list(spec.dtypes)}; use from_arrays",
            )
        if not spec.dtypes:
            if flat.size:
                raise WireError(
                    "size_mismatch", f"Model.from_flat: {flat.size} elements, the spec is empty"
                )
            return cls(spec, ())
        if not flat.flags.c_contiguous:
            raise WireError(
                "bad_field", "Model.from_flat: flat must be C-contiguous (np.ascontiguousarray)"
            )
        return cls(spec, (flat.reshape(-1),))

    @classmethod
    def from_arrays(cls, arrays: Iterable[NDArray[Any]]) -> Model:
        """Copy per-tensor ``arrays`` into new per-dtype buffers (one copy).

        Any strides and byte order are accepted; the spec is
        ``TensorSpec.from_arrays(arrays)``.

        Raises
        ------
        WireError
            ``"bad_field"`` for a non-array, ``"bad_dtype"`` for a dtype
            outside :data:`WIRE_DTYPES`.
        """
        arrays = tuple(arrays)
        for i, a in enumerate(arrays):
            if not isinstance(a, np.ndarray):
                raise WireError(
                    "bad_field",
                    f"Model.from_arrays: array {i} must be a numpy.ndarray, got {describe(a)}"
                    + _not_array_hint(a),
                )
        spec = TensorSpec.from_arrays(arrays)
        buffers = tuple(np.empty(n, WIRE_DTYPES[name]) for name, n in zip(
            spec.dtypes, spec.counts, strict=True))
        for a, (b, offset, n) in zip(arrays, spec._layout, strict=True):
            buffers[b][offset : offset + n].reshape(a.shape)[...] = a
        return cls(spec, buffers)

    def flat(self) -> NDArray[Any]:
        """The single buffer of a single-dtype model (a float32 model's parameters).

        Raises
        ------
        ValueError
            If the model has several dtypes (or none), naming them.
        """
        if len(self.buffers) != 1:
            raise ValueError(
                f"Model.flat(): the model has {len(self.buffers)} dtypes"
                f" {list(self.spec.dtypes)}; use .buffers or .arrays()"
            )
        return self.buffers[0]

    def arrays(self) -> tuple[NDArray[Any], ...]:
        """Per-tensor views of the buffers, reshaped, in spec order (no copy)."""
        bufs = self.buffers
        return tuple(
            bufs[b][offset : offset + n].reshape(shape)
            for (_, shape), (b, offset, n) in zip(self.spec.entries, self.spec._layout, strict=True)
        )

    @property
    def nbytes(self) -> int:
        """Bytes of all buffers (what the model's frames carry)."""
        return sum(b.nbytes for b in self.buffers)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Model):
            return NotImplemented
        return self.spec == other.spec and all(
            np.array_equal(x, y, equal_nan=x.dtype.kind == "f")
            for x, y in zip(self.buffers, other.buffers, strict=True)
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        dt = "+".join(self.spec.dtypes) or "empty"
        return f"Model({dt}, {len(self.spec)} tensors, {self.nbytes} B)"


# ---------------------------------------------------------------------------
# Field types: how each annotation is checked (built here) and loaded (decoded)


class _AllowNonFinite:
    def __repr__(self) -> str:
        return "AllowNonFinite"


AnyFloat = Annotated[float, _AllowNonFinite()]
"""A float field that may hold NaN or +-inf (plain ``float`` fields may not)."""


class _Bad(Exception):
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

    def under(self, part: str) -> _Bad:
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
                raise _Bad(f" must be an int, got {describe(v)}")
            v = int(v)
        if not _I64_MIN <= v <= _I64_MAX:
            raise _Bad(f": {describe(v)} does not fit in int64")
        out: int = v
        return out


class _Float(_Kind):
    def __init__(self, finite: bool) -> None:
        self.finite = finite

    def check(self, v: Any) -> float:
        if type(v) is not float:
            if isinstance(v, bool) or not isinstance(v, int | float):
                raise _Bad(f" must be a float, got {describe(v)}")
            try:
                v = float(v)
            except OverflowError:
                raise _Bad(f": {describe(v)} is too large for a float") from None
        if self.finite and not math.isfinite(v):
            raise _Bad(f" must be finite, got {v}")
        out: float = v
        return out


class _Bool(_Kind):
    exact = bool

    def check(self, v: Any) -> bool:
        if v is not True and v is not False:
            raise _Bad(f" must be a bool, got {describe(v)}")
        return v


class _Str(_Kind):
    exact = str

    def check(self, v: Any) -> str:
        if type(v) is not str:
            if not isinstance(v, str):
                raise _Bad(f" must be a str, got {describe(v)}")
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
            raise _Bad(f" must be a tuple, got {describe(v)}")
        return self._each(self.inner.check, v)

    def load(self, v: Any) -> tuple[Any, ...]:
        if not isinstance(v, list):
            raise _Bad(f" must be an array, got {describe(v)}")
        return self._each(self.inner.load, v)

    @staticmethod
    def _each(check: Callable[[Any], Any], v: Sequence[Any]) -> tuple[Any, ...]:
        i = 0
        try:
            out = []
            for i, item in enumerate(v):  # noqa: B007 - i names the item on error
                out.append(check(item))
        except _Bad as bad:
            raise bad.under(f"[{i}]") from None
        if type(v) is tuple and all(a is b for a, b in zip(out, v, strict=True)):
            return v
        return tuple(out)


class _Value(_Kind):
    def __init__(self, cls: type[_Record]) -> None:
        self.cls = cls
        name = cls.__name__
        self.expected = f"{'an' if name[0] in 'AEIOU' else 'a'} {name}"

    def check(self, v: Any) -> Any:
        if type(v) is not self.cls:
            raise _Bad(f" must be {self.expected}, got {describe(v)}")
        return v

    def load(self, v: Any) -> Any:
        return self.cls._load(v)


class _Spec(_Kind):
    def check(self, v: Any) -> TensorSpec:
        if not isinstance(v, TensorSpec):
            raise _Bad(f" must be a TensorSpec, got {describe(v)}")
        return v

    def load(self, v: Any) -> TensorSpec:
        try:
            return TensorSpec.from_wire(v)
        except WireError as exc:
            raise _Bad(f": {exc.detail}", reason=exc.reason) from None  # type: ignore[arg-type]


class _Dict(_Kind):
    def check(self, v: Any) -> dict[str, Any]:
        if not isinstance(v, dict):
            raise _Bad(f" must be a dict, got {describe(v)}")
        found = _non_plain(v, 0)
        if found is not None:
            path, problem = found
            raise _Bad(f": {problem}", "".join(reversed(path)))
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
            raise _Bad(f" must be a Model, got {describe(v)}{hint}")
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
# Records: value types and messages


def _same(a: Any, b: Any) -> bool:
    if type(a) is float and type(b) is float and a != a and b != b:
        return True  # NaN in an AnyFloat field
    return bool(a == b)


def _non_negative(record: object, *names: str) -> None:
    """Each named int field of ``record`` is >= 0 (ids, counters, versions)."""
    for name in names:
        value = getattr(record, name)
        if value is not None and value < 0:
            raise _Bad(f" must be >= 0, got {value}", f".{name}")


class _Record:
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
        except _Bad as bad:
            raise bad.under(f".{name}").error(self.KIND) from None
        try:
            self._validate()
        except _Bad as bad:
            raise bad.error(self.KIND) from None

    def _validate(self) -> None:
        """Cross-field checks: raise ``_Bad`` (path relative to this record)."""

    @classmethod
    def from_wire(cls, raw: Any, model: Model | None = None) -> Any:
        """Build from the decoded msgpack array of field values, checking each.

        ``model`` fills the Model field (its slot in ``raw``, the spec, is
        not read). Raises ``WireError`` (``"bad_field"``, or ``"bad_dtype"``
        in a TensorSpec field) naming the field.
        """
        try:
            return cls._load(raw, model)
        except _Bad as bad:
            raise bad.error(cls.KIND) from None

    @classmethod
    def _load(cls, raw: Any, model: Model | None = None) -> Any:
        if not isinstance(raw, list):
            raise _Bad(f" must be an array, got {describe(raw)}")
        if len(raw) != len(cls._FIELDS):
            raise _Bad(f": {len(raw)} field values, {cls.KIND} has {len(cls._FIELDS)}")
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
        except _Bad as bad:
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


_R = TypeVar("_R", bound=type[_Record])

KINDS: dict[str, type[Any]] = {}
"""Kind name (class name) -> message class, for dispatch in :func:`fedsim.codec.decode`."""

VALUE_TYPES: dict[str, type[Any]] = {}
"""Name -> registered value type (usable as a field type, not sent alone)."""


def _register(cls: _R, registry: dict[str, type[Any]], *, message: bool) -> _R:
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
    registry[cls.KIND] = cls
    return cls


def _value(cls: _R) -> _R:
    return _register(cls, VALUE_TYPES, message=False)


def _message(cls: _R) -> _R:
    return _register(cls, KINDS, message=True)


# ---------------------------------------------------------------------------
# Value types

EVENT_KINDS: tuple[str, ...] = (
    "send",
    "deliver",
    "drop",
    "reject",
    "train_start",
    "train_end",
    "train_error",
    "away",
    "back",
    "aggregate",
    "discard",
    "evaluate",
    "correction",
    "barrier_wait",
    "barrier_resume",
    "client_failed",
    "host_lost",
    "host_joined",
    "host_rejected",
    "start",
    "checkpoint",
    "resume",
    "missing",
    "end",
    "warning",
)
"""Every ``Event.ev`` value."""

#: The ``Event.ev`` values a client host may report (the rest are the server's).
HOST_EVENT_KINDS: frozenset[str] = frozenset({
    "send", "deliver", "drop", "reject", "train_start", "train_end", "train_error", "away",
    "back", "correction", "barrier_wait", "barrier_resume", "warning"})

_EVENT_KIND_SET = frozenset(EVENT_KINDS)


@_value
@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class LocalWork(_Record):
    """A task's local budget: ``steps`` or ``epochs``, or neither (the scenario's default)."""

    steps: int | None = None
    epochs: float | None = None

    def _validate(self) -> None:
        if self.steps is not None and self.epochs is not None:
            raise _Bad(": set steps or epochs, not both")
        if self.steps is not None and self.steps < 1:
            raise _Bad(f" must be >= 1, got {self.steps}", ".steps")
        if self.epochs is not None and not self.epochs > 0:
            raise _Bad(f" must be > 0, got {self.epochs}", ".epochs")


def _dict() -> dict[str, Any]:
    return {}


@_value
@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class Event(_Record):
    """One record of the run's event log (a line of events.jsonl; see :meth:`to_json_dict`)."""

    t: float
    real: float
    ev: str
    client: int | None = None
    host: str | None = None
    kind: str | None = None
    dir: str | None = None
    bytes: int | None = None
    sent_at: float | None = None
    scheduled: float | None = None
    version: int | None = None
    base_version: int | None = None
    task_id: int | None = None
    round: int | None = None
    steps: int | None = None
    staleness: int | None = None
    reason: str | None = None
    extra: dict[str, Any] = field(default_factory=_dict)

    def _validate(self) -> None:
        if self.ev not in _EVENT_KIND_SET:
            raise _Bad(f" must be one of EVENT_KINDS, got {describe(self.ev)}", ".ev")
        if self.extra:
            shadowed = [k for k in self.extra if k in _EVENT_NAMES]
            if shadowed:
                raise _Bad(f": keys {shadowed} shadow Event fields; set those", ".extra")

    @classmethod
    def of(cls, t: float, real: float, ev: str, **fields: Any) -> Event:
        """An event from keyword fields: the typed ones in their slots, the rest in ``extra``.

        Fields set to None are left out.
        """
        typed = {k: v for k, v in fields.items() if k in _EVENT_NAMES and v is not None}
        extra = {k: v for k, v in fields.items() if k not in _EVENT_NAMES and v is not None}
        return cls(t=t, real=real, ev=ev, extra=extra, **typed)

    def to_json_dict(self) -> dict[str, Any]:
        """The events.jsonl line: ``t``, ``real``, ``ev``, the optional fields
        that are not None (in declaration order), then ``extra``'s items."""
        out: dict[str, Any] = {"t": self.t, "real": self.real, "ev": self.ev}
        for name in _EVENT_OPTIONAL:
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        out.update(self.extra)
        return out


_EVENT_NAMES = frozenset(Event.FIELDS)
_EVENT_OPTIONAL = Event.FIELDS[3:-1]

#: The phases a client host measures and reports (``PhaseSample.phase``): the
#: names of their distributions in the summary's ``phases``
#: (:data:`fedsim.phases.PHASES`, docs/run-directory.md "Where time goes").
HOST_PHASES: frozenset[str] = frozenset({
    "encode.hosts", "decode.hosts", "queueing.hosts", "compute.real", "compute.budget"})

#: Most values one PhaseSample may carry.
MAX_PHASE_VALUES = 65536


@_value
@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class PhaseSample(_Record):
    """A client host's durations of one phase since its previous event batch (seconds).

    ``count`` durations summing to ``sum``, the largest ``max``; ``values`` is
    a uniform sample of them (all of them when there were few): what a
    :class:`fedsim.phases.Durations` exports.
    """

    phase: str
    count: int
    sum: float
    max: float
    values: tuple[float, ...]

    def _validate(self) -> None:
        if self.phase not in HOST_PHASES:
            raise _Bad(f" must be one of {sorted(HOST_PHASES)}, got {describe(self.phase)}",
                       ".phase")
        if not 1 <= len(self.values) <= min(self.count, MAX_PHASE_VALUES):
            raise _Bad(f": {len(self.values)} values for a count of {self.count} (1 to "
                       f"min(count, {MAX_PHASE_VALUES}) values)", ".values")
        if self.sum < 0 or self.max < 0 or any(not 0 <= v <= self.max for v in self.values):
            raise _Bad(": durations must be >= 0 and at most max")


# ---------------------------------------------------------------------------
# Client <-> server, through the emulated network. Each carries the client id:
# a client host speaks for many clients over one connection.


@_message
@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class Task(_Record):
    """Server -> client, when it dispatches work: train from ``model`` (version ``version``)."""

    client: int
    task_id: int
    version: int
    round: int
    work: LocalWork | None
    model: Model

    def _validate(self) -> None:
        _non_negative(self, "client", "task_id", "version", "round")


@_message
@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class Update(_Record):
    """Client -> server, when a task is done: its result (pipeline rounds: base_version = round).

    The server applies it by its own record: the base version (and, for a
    task answered by one upload, the round) of the task ``task_id`` it sent,
    the client's partition size as its weight, and a send time no earlier
    than that task allows. ``base_version`` and ``num_samples`` are what the
    client believes; they are checked for type and range, never trusted.
    """

    client: int
    task_id: int
    base_version: int
    round: int
    num_samples: int
    steps: int
    loss: AnyFloat | None
    model: Model

    def _validate(self) -> None:
        _non_negative(self, "client", "task_id", "base_version", "round", "steps")
        if self.num_samples < 1:
            raise _Bad(f" must be >= 1, got {self.num_samples}", ".num_samples")


@_message
@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class Average(_Record):
    """Server -> client, after a DGA round: that round's average (one message per client)."""

    client: int
    round: int
    version: int
    model: Model

    def _validate(self) -> None:
        _non_negative(self, "client", "round", "version")


@_message
@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class Ready(_Record):
    """Client -> server, back from away (``reset``: its connection was reset, its task is gone)."""

    client: int
    reset: bool

    def _validate(self) -> None:
        _non_negative(self, "client")


#: Why a client's local run failed, as results count it (``summary.json``'s
#: ``lost_work``): ``overflow``, a step beyond the range of the parameters'
#: dtype; ``non_finite``, a trained model holding NaN or an infinity;
#: ``error``, any other exception in training; ``host_lost``, its client host
#: was lost (the server's own record, never sent).
FAILURE_CAUSES: tuple[str, ...] = ("overflow", "non_finite", "error", "host_lost")


def _check_cause(rec: Any) -> None:
    if rec.cause not in FAILURE_CAUSES[:3]:
        raise _Bad(f" must be one of {', '.join(FAILURE_CAUSES[:3])}, got {rec.cause!r}",
                   ".cause")


@_message
@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class Failed(_Record):
    """Client -> server, when its training failed for good; the server drops it.

    ``cause`` counts it (:data:`FAILURE_CAUSES`), ``reason`` says it in words.
    """

    client: int
    cause: str
    reason: str

    def _validate(self) -> None:
        _non_negative(self, "client")
        _check_cause(self)


@_message
@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class Leave(_Record):
    """Client -> server, on an orderly departure."""

    client: int
    reason: str

    def _validate(self) -> None:
        _non_negative(self, "client")


# ---------------------------------------------------------------------------
# Client host <-> server control path (not emulated)


@_message
@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class HostHello(_Record):
    """Host -> server, once its data and workers are ready: who it is and which clients it runs."""

    host: str
    pid: int
    clients: tuple[int, ...]
    samples: tuple[int, ...]
    boot_id: str
    fedsim_version: str
    scenario_hash: str
    #: the host's estimate of (server monotonic - host monotonic), in real
    #: seconds, from the minimum-RTT ClockProbe exchange, and its uncertainty
    #: (half that round trip)
    clock_offset: float = 0.0
    clock_uncertainty: float = 0.0

    def _validate(self) -> None:
        if not (math.isfinite(self.clock_offset) and math.isfinite(self.clock_uncertainty)
                and self.clock_uncertainty >= 0):
            raise _Bad(": clock offset and uncertainty must be finite (uncertainty >= 0)")
        if len(self.samples) != len(self.clients):
            raise _Bad(f": {len(self.clients)} clients but {len(self.samples)} samples")


@_message
@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class Start(_Record):
    """Server -> host, when the federation begins: clock epoch (server monotonic), dilation,
    the model's tensor spec, and how many model copies a Task carries."""

    epoch: float
    dilation: float
    spec: TensorSpec
    task_copies: int = 1
    #: the real seconds one local step takes on the server's machine, when the
    #: scenario's device model scales it (measured there, once, for every host)
    host_step_time: float | None = None
    #: the server process's incarnation (random, new at every start or resume):
    #: a ClockReply with another one tells a host the server restarted
    server: str = ""
    #: the emulated time the host's clients start at: 0, a resumed run's
    #: checkpoint time, or the server's time when a host joins a running federation
    t0: float = 0.0


@_message
@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class Refused(_Record):
    """Server -> host, instead of Start: it may not join (version or scenario mismatch, ...)."""

    reason: str


@_message
@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class EventBatch(_Record):
    """Host -> server, periodically: event-log records, and the host's phase
    durations since its previous batch (see :class:`PhaseSample`)."""

    host: str
    events: tuple[Event, ...]
    phases: tuple[PhaseSample, ...] = ()


@_message
@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class Stop(_Record):
    """Server -> host, when the run ends: stop the clients and say HostBye."""

    reason: str


@_message
@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class HostBye(_Record):
    """Host -> server, after Stop: its own measurements (fidelity: FidelityMonitor.export())."""

    host: str
    overruns: int
    compute_deadlines: int
    rejected: int
    fidelity: dict[str, Any]
    #: the clock offset re-estimated during the run (real seconds); its
    #: spread from the first estimate is drift the verdict must account for
    clock_offsets: tuple[float, ...] = ()


@_message
@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class ClockProbe(_Record):
    """Host -> server, before Start: an NTP-style probe sent at host monotonic ``t_sent``."""

    seq: int
    t_sent: float


@_message
@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class ClockReply(_Record):
    """Server -> host, on a ClockProbe: the probe echoed with the server's monotonic time,
    and the server's incarnation (see :class:`Start`)."""

    seq: int
    t_sent: float
    t_server: float
    server: str = ""


# ---------------------------------------------------------------------------
# Host or server <-> torch worker process (private socket, not emulated).
# Every request carries a request_id and its reply echoes it.


@_message
@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class WorkerReady(_Record):
    """Worker -> parent, once built: samples per client (in the parent's order) and the spec."""

    samples: tuple[int, ...]
    spec: TensorSpec


@_message
@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class Train(_Record):
    """Parent -> worker, on a Task: begin the task's local work from ``model``.

    ``due``: the emulated time the host expects the result by (the task's
    start plus its expected compute time); a worker with several requests
    waiting takes the earliest due first (None: as soon as possible).
    """

    request_id: int
    client: int
    task_id: int
    version: int
    round: int
    work: LocalWork | None
    model: Model
    due: float | None = None

    def _validate(self) -> None:
        _non_negative(self, "client", "task_id", "version", "round")


@_message
@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class Advance(_Record):
    """Parent -> worker, on DGA averages: continue the pipeline with the averages of ``rounds``.

    ``model`` holds one spec copy per round, back to back (``spec.repeated(len(rounds))``),
    or is None when ``rounds`` is empty.
    """

    MODEL_COPIES_FIELD: ClassVar[str | None] = "rounds"

    request_id: int
    client: int
    rounds: tuple[int, ...]
    model: Model | None
    due: float | None = None   # as Train's

    def _validate(self) -> None:
        if (self.model is None) != (not self.rounds):
            raise _Bad(
                ": model must be None exactly when rounds is empty"
                f" ({len(self.rounds)} rounds, model {'None' if self.model is None else 'set'})"
            )


@_message
@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class Trained(_Record):
    """Worker -> parent, on Train or Advance: the outcome (next: "done", "more" or "wait")."""

    request_id: int
    client: int
    steps: int
    loss: AnyFloat | None
    compute_s: float
    upload: Model | None
    upload_round: int | None
    next: str
    wait_round: int | None
    notes: dict[str, Any]

    def _validate(self) -> None:
        if self.next not in ("done", "more", "wait"):
            raise _Bad(f" must be 'done', 'more' or 'wait', got {describe(self.next)}", ".next")


@_message
@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class Evaluate(_Record):
    """Parent (server) -> worker, to evaluate a global model on the test set."""

    request_id: int
    version: int
    model: Model


@_message
@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class Evaluated(_Record):
    """Worker -> parent, on Evaluate: test loss (may be NaN/inf: AnyFloat), accuracy, time taken."""

    request_id: int
    version: int
    loss: AnyFloat
    accuracy: float
    seconds: float


@_message
@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class WorkerFailed(_Record):
    """Worker -> parent, instead of the reply to request ``request_id``: why it failed
    (``cause``: :data:`FAILURE_CAUSES`)."""

    request_id: int
    cause: str
    reason: str

    def _validate(self) -> None:
        _check_cause(self)


@_message
@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class Shutdown(_Record):
    """Parent -> worker, at the end: exit."""


Message = (
    Task
    | Update
    | Average
    | Ready
    | Failed
    | Leave
    | HostHello
    | Start
    | Refused
    | EventBatch
    | Stop
    | HostBye
    | ClockProbe
    | ClockReply
    | WorkerReady
    | Train
    | Advance
    | Trained
    | Evaluate
    | Evaluated
    | WorkerFailed
    | Shutdown
)
"""Any message of this schema; ``match`` on the class to dispatch."""
