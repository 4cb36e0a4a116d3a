"""A model on the wire: its layout (:class:`TensorSpec`), its buffers (:class:`Model`), torch views.

:data:`WIRE_DTYPES` are the dtypes a tensor may travel as. A
:class:`TensorSpec` is also a field type (``Start.spec``), and a
:class:`Model` field travels as raw frames, never in msgpack (see
:mod:`fedsim.wire.codec`).

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
  hands the very same memory to the receiver, and a :class:`fedsim.wire.codec.Body`
  encoded once and sent later sends whatever the buffer holds then. Snapshot
  a model that keeps changing (``Model.from_flat(x.copy(), spec)``);
- copy a decoded buffer before modifying it (``model.flat().copy()``). A
  decoded buffer may also be unaligned (``flags.aligned``), as libzmq puts it.

Torch
-----
:func:`to_tensor` and :func:`to_model` are the one place a wire model meets a
torch tensor. Both directions are views, not copies: a flat float32 tensor
becomes the model's single buffer, and a received buffer becomes a tensor
through DLPack (which, unlike ``torch.from_numpy``, takes read-only memory
without a warning). The algorithms read such a tensor and never write to it.
torch is bound lazily (:mod:`fedsim.lazy`): a client host imports this module
and never imports torch.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import DTypeLike, NDArray

from fedsim.lazy import lazy_module
from fedsim.wire.errors import Reason, WireError, describe

if TYPE_CHECKING:
    import torch
    from torch.utils import dlpack
else:
    torch = lazy_module("torch")
    dlpack = lazy_module("torch.utils.dlpack")

__all__ = [
    "MAX_NDIM",
    "MAX_TENSORS",
    "WIRE_DTYPES",
    "BytesUpTo",
    "Model",
    "TensorSpec",
    "flat_model",
    "to_model",
    "to_tensor",
    "wire_dtype_name",
]

MAX_NDIM = 32
"""Most dimensions a tensor may have."""

MAX_TENSORS = 65536
"""Most tensors a :class:`TensorSpec` may list."""

_I64_MAX = 2**63 - 1

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

    Give it to :func:`fedsim.wire.codec.decode` so that a message whose model does
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

    def accepts(self, got: TensorSpec) -> bool:
        """Whether a received model of spec ``got`` fits this expected one."""
        return got.entries == self.entries

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


class BytesUpTo(TensorSpec):
    """An expected payload of any length up to ``limit`` bytes: one uint8 tensor.

    A Flower message's size varies from message to message (a train
    instruction carries the model, an evaluation reply a few metrics), so a
    run of a Flower app (:mod:`fedsim.flower`) expects its tasks and updates
    to be this: a receiver accepts ``[("uint8", (n,))]`` for any
    ``0 <= n <= limit`` and refuses anything else before reading buffers;
    :attr:`nbytes` is the limit (what :func:`fedsim.wire.codec.max_message_bytes`
    allows).

    >>> BytesUpTo(100).accepts(TensorSpec([("uint8", (40,))]))
    True
    """

    def __init__(self, limit: int) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ValueError(f"BytesUpTo: limit must be an int >= 0, got {limit!r}")
        self._set([("uint8", (limit,))])

    @property
    def limit(self) -> int:
        """The most bytes a payload may have."""
        return self.entries[0][1][0]

    def accepts(self, got: TensorSpec) -> bool:
        e = got.entries
        return (len(e) == 1 and e[0][0] == "uint8" and len(e[0][1]) == 1
                and e[0][1][0] <= self.limit)

    def check_spec(self, got: TensorSpec) -> None:
        if not self.accepts(got):
            raise WireError("shape_mismatch", f"expected one uint8 tensor of at most "
                            f"{self.limit} bytes, got {list(got.entries)[:3]}")

    def repeated(self, copies: int) -> TensorSpec:
        if copies != 1:
            raise ValueError("BytesUpTo: a byte payload is not repeated")
        return self


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
            # the common case in one test (an ndarray of the wire dtype itself, 1-D, of
            # the spec's size, its elements adjacent: what numpy calls C-contiguous in
            # 1-D); anything else goes through each check in turn, to be named
            if (type(buf) is np.ndarray and buf.dtype is WIRE_DTYPES[name] and buf.ndim == 1
                    and buf.size == n and (n < 2 or buf.strides[0] == buf.itemsize)):
                continue
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
    def checked(cls, spec: TensorSpec, buffers: tuple[NDArray[Any], ...]) -> Model:
        """A model whose buffers the caller has already checked against ``spec``
        (one per dtype, of that wire dtype, 1-D, C-contiguous, of the right size,
        as the codec's decode makes them): the checks are not made again."""
        model = object.__new__(cls)
        object.__setattr__(model, "spec", spec)
        object.__setattr__(model, "buffers", buffers)
        return model

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
# Torch


def to_tensor(model: Model) -> torch.Tensor:
    """A received model's flat buffer as a tensor, without a copy (read-only memory)."""
    return dlpack.from_dlpack(model.flat())


def to_model(vec: torch.Tensor, spec: TensorSpec) -> Model:
    """A flat tensor as a wire model (a view when it is already contiguous float32)."""
    return Model.from_flat(vec.detach().to(torch.float32).contiguous().numpy(), spec)


def flat_model(vec: torch.Tensor) -> Model:
    """A flat tensor of any wire dtype as a one-entry model, without a copy when it is
    contiguous: an algorithm's derived upload (a float64 delta), or a test's."""
    arr = vec.detach().contiguous().reshape(-1).numpy()
    name = wire_dtype_name(arr.dtype)
    if name is None:
        raise WireError("bad_dtype", f"flat_model: dtype {arr.dtype} is not a wire dtype")
    return Model.from_flat(arr, _flat_spec(name, arr.size))


@functools.lru_cache(maxsize=64)
def _flat_spec(name: str, size: int) -> TensorSpec:
    """The one-entry spec of a flat vector (built once: a spec takes ~9 us to build,
    and an algorithm derives an upload per update)."""
    return TensorSpec([(name, (size,))])
