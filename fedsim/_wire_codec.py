"""encode and decode: a msgpack header frame plus one raw frame per tensor.

Private module; import from :mod:`fedsim.wire`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn, cast

import msgpack
import numpy as np

from fedsim._wire_messages import KINDS
from fedsim._wire_types import (
    MAX_NDIM,
    WIRE_DTYPES,
    WireError,
    describe,
    wire_dtype_name,
)

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from numpy.typing import NDArray

    from fedsim._wire_messages import Message, Tensors
    from fedsim._wire_types import TensorSpec

__all__ = [
    "DEFAULT_MAX_BYTES",
    "MAX_TENSORS",
    "SCHEMA_VERSION",
    "Meta",
    "decode",
    "encode",
]

SCHEMA_VERSION = 1
"""Version written in every header; decode rejects any other."""

DEFAULT_MAX_BYTES = 256 * 1024 * 1024
"""Default cap on a message's total size (all frames), in bytes."""

MAX_TENSORS = 65536
"""Most tensors one message may carry."""

_HEADER_KEYS = frozenset({"v", "kind", "sent_at", "seq", "body", "tensors"})
_U64_MAX = 2**64 - 1


@dataclass(frozen=True, slots=True)
class Meta:
    """Envelope of a decoded message: what the header says beside the body.

    Attributes
    ----------
    version : int
        Schema version of the message (always :data:`SCHEMA_VERSION`).
    kind : str
        Message kind, the class name (``"Task"``, ...).
    sent_at : float
        Emulated send time in seconds, as given to :func:`encode`.
    seq : int
        Per-sender sequence number, as given to :func:`encode`.
    nbytes : int
        Total payload bytes: header plus all tensor frames (what a link carries).
    """

    version: int
    kind: str
    sent_at: float
    seq: int
    nbytes: int


def encode(
    msg: Message, *, sent_at: float = 0.0, seq: int = 0
) -> list[bytes | memoryview]:
    """Turn ``msg`` into frames for ``socket.send_multipart(frames, copy=False)``.

    Frame 0 is the msgpack header::

        {"v": 1, "kind": "Task", "sent_at": 12.5, "seq": 7,
         "body": {<every field but the tensors>},
         "tensors": [["float32", [200, 60]], ["float32", [200]], ...]}

    and frame ``i + 1`` is the raw little-endian, C-order bytes of tensor ``i``.

    Parameters
    ----------
    msg : Message
        The message.
    sent_at : float, optional
        Emulated send time in seconds (finite).
    seq : int, optional
        Per-sender sequence number (0 <= seq < 2**64).

    Returns
    -------
    list of bytes or memoryview
        The header, then one memoryview per tensor. A tensor frame is a view of
        the caller's array, not a copy, unless the array was not C-contiguous
        or not little-endian; then it views a contiguous little-endian copy.
        The arrays must not be modified until the send has completed.

    Raises
    ------
    WireError
        ``"bad_field"`` for bad metadata or a field changed since the message
        was built into something msgpack cannot carry.
    TypeError
        If ``msg`` is not a message of this schema.
    """
    cls = type(msg)
    if KINDS.get(getattr(cls, "KIND", "")) is not cls:
        raise TypeError(f"encode() needs a fedsim.wire message, got {describe(msg)}")
    if isinstance(sent_at, bool) or not isinstance(sent_at, int | float):
        raise WireError(
            "bad_field", f"sent_at must be a float, got {describe(sent_at)}"
        )
    if not math.isfinite(sent_at):
        raise WireError("bad_field", f"sent_at must be finite, got {sent_at}")
    if isinstance(seq, bool) or not isinstance(seq, int) or not 0 <= seq <= _U64_MAX:
        raise WireError(
            "bad_field", f"seq must be an int in [0, 2**64), got {describe(seq)}"
        )

    frames: list[bytes | memoryview] = [b""]
    descriptors: list[list[Any]] = []
    if cls.TENSOR_FIELD is not None:
        for a in cast("Tensors", getattr(msg, cls.TENSOR_FIELD)):
            name = wire_dtype_name(a.dtype)
            if name is None:  # changed after construction, or a subclass
                raise WireError("bad_dtype", f"{cls.KIND}: dtype {a.dtype} not allowed")
            arr = np.asarray(a)
            if arr.dtype != WIRE_DTYPES[name]:  # big-endian: convert (copies)
                arr = arr.astype(WIRE_DTYPES[name])
            if not arr.flags.c_contiguous:  # strided view: make contiguous (copies)
                arr = np.ascontiguousarray(arr)
            descriptors.append([name, list(arr.shape)])
            # reshape(-1) of a C-contiguous array is a view, even for 0-d and empty.
            frames.append(arr.reshape(-1).view(np.uint8).data)

    header = {
        "v": SCHEMA_VERSION,
        "kind": cls.KIND,
        "sent_at": float(sent_at),
        "seq": seq,
        "body": {name: getattr(msg, name) for name in cls.BODY_FIELDS},
        "tensors": descriptors,
    }
    try:
        frames[0] = msgpack.packb(header, use_bin_type=True, datetime=False)
    except (TypeError, ValueError, OverflowError) as exc:
        raise WireError("bad_field", f"{cls.KIND}: cannot pack header: {exc}") from None
    return frames


def _byte_view(frame: object, index: int) -> memoryview:
    """Return a flat, read-only byte view of a frame without copying it."""
    buffer = (
        frame
        if isinstance(frame, bytes | bytearray | memoryview)
        else getattr(frame, "buffer", frame)
    )
    try:
        view = memoryview(buffer)  # type: ignore[arg-type]
    except TypeError:
        raise WireError(
            "bad_frame", f"frame {index} is not bytes-like: {describe(frame)}"
        ) from None
    if not view.c_contiguous:
        raise WireError("bad_frame", f"frame {index} is not a contiguous buffer")
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view.toreadonly()


def _names(keys: Iterable[object]) -> str:
    return "[" + ", ".join(sorted(map(repr, keys))) + "]"


def _reject_ext(code: int, data: bytes) -> NoReturn:
    raise WireError("bad_header", f"msgpack extension type {code} is not allowed")


def _unpack_header(view: memoryview) -> object:
    try:
        return msgpack.unpackb(
            view,
            raw=False,
            strict_map_key=True,
            use_list=True,
            ext_hook=_reject_ext,
            timestamp=0,
        )
    except WireError:
        raise
    except (
        ValueError,
        TypeError,
        OverflowError,
        RecursionError,
        msgpack.UnpackException,
    ) as exc:
        raise WireError(
            "bad_header",
            f"frame 0 is not one msgpack document: {type(exc).__name__}: {exc}",
        ) from None


def _parse_descriptor(i: int, desc: object) -> tuple[tuple[int, ...], str]:
    if not (isinstance(desc, list) and len(desc) == 2):
        raise WireError("bad_header", f"tensor {i}: descriptor {describe(desc)}")
    name, shape = desc
    if not isinstance(name, str):
        raise WireError("bad_header", f"tensor {i}: dtype {describe(name)}")
    if name not in WIRE_DTYPES:
        raise WireError(
            "bad_dtype",
            f"tensor {i}: dtype {name!r} not allowed; use one of {list(WIRE_DTYPES)}",
        )
    if not (
        isinstance(shape, list)
        and len(shape) <= MAX_NDIM
        and all(type(d) is int and d >= 0 for d in shape)
    ):
        raise WireError("bad_header", f"tensor {i}: shape {describe(shape)}")
    return tuple(shape), name


def decode(
    frames: Sequence[Any],
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    spec: TensorSpec | None = None,
    check_finite: bool = True,
) -> tuple[Message, Meta]:
    """Validate ``frames`` and turn them back into a message and its envelope.

    Checks, in order, cheapest first: total size, header (msgpack, version,
    kind, keys, tensor descriptors), frame count, ``spec``, frame lengths,
    fields, then tensor values. The tensor frames are not read before the
    size, header, count and spec checks pass.

    Parameters
    ----------
    frames : sequence of bytes, bytearray, memoryview or zmq.Frame
        As from ``socket.recv_multipart(copy=False)``; anything with a
        ``.buffer`` or the buffer protocol.
    max_bytes : int, optional
        Reject messages whose frames total more bytes than this.
    spec : TensorSpec, optional
        Expected tensors (count, shapes, dtypes) for the kinds that carry
        tensors (Task, Update, Aggregate); other kinds ignore it.
    check_finite : bool, optional
        Reject NaN and +-Inf in floating-point tensors (one pass over them).

    Returns
    -------
    (Message, Meta)
        The message; its tensors are read-only numpy views of the frames (no
        copy; they keep the frames alive). Copy one to modify it, or see
        :func:`fedsim.wire.numpy_to_torch`.

    Raises
    ------
    WireError
        With ``reason`` one of :data:`fedsim.wire.REASONS`; the message is
        discarded and the receiver can go on.
    """
    if not 1 <= len(frames) <= MAX_TENSORS + 1:
        raise WireError("frame_count", f"{len(frames)} frames")
    views = [_byte_view(f, i) for i, f in enumerate(frames)]
    nbytes = sum(v.nbytes for v in views)
    if nbytes > max_bytes:
        raise WireError("oversize", f"{nbytes} bytes > max_bytes={max_bytes}")

    header = _unpack_header(views[0])
    if not isinstance(header, dict):
        raise WireError("bad_header", f"header is a {type(header).__name__}, not a map")
    if "v" not in header:
        raise WireError("bad_header", "header has no schema version 'v'")
    version = header["v"]
    if type(version) is not int or version != SCHEMA_VERSION:
        raise WireError(
            "wrong_version", f"schema version {version!r}, expected {SCHEMA_VERSION}"
        )
    if header.keys() != _HEADER_KEYS:
        missing, extra = (
            _names(_HEADER_KEYS - header.keys()),
            _names(header.keys() - _HEADER_KEYS),
        )
        raise WireError("bad_header", f"header keys: missing {missing}, extra {extra}")
    kind = header["kind"]
    cls = KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise WireError("unknown_kind", f"kind {describe(kind)}")
    sent_at, seq, body, raw_descs = (
        header["sent_at"],
        header["seq"],
        header["body"],
        header["tensors"],
    )
    if type(sent_at) is not float or not math.isfinite(sent_at):
        raise WireError("bad_header", f"sent_at {describe(sent_at)}")
    if type(seq) is not int or seq < 0:
        raise WireError("bad_header", f"seq {describe(seq)}")
    if not isinstance(body, dict):
        raise WireError("bad_header", f"body is a {type(body).__name__}, not a map")
    if not isinstance(raw_descs, list):
        raise WireError("bad_header", f"tensors is a {type(raw_descs).__name__}")
    if cls.TENSOR_FIELD is None and raw_descs:
        raise WireError("bad_header", f"{kind} carries no tensors, header lists some")
    descs = [_parse_descriptor(i, d) for i, d in enumerate(raw_descs)]

    if len(views) != 1 + len(descs):
        raise WireError(
            "frame_count",
            f"{kind} header lists {len(descs)} tensors, got {len(views) - 1} frames",
        )
    if spec is not None and cls.TENSOR_FIELD is not None:
        spec.check_descriptors(descs)
    arrays: list[NDArray[Any]] = []
    for i, ((shape, name), view) in enumerate(zip(descs, views[1:], strict=True)):
        dtype = WIRE_DTYPES[name]
        expected = math.prod(shape) * dtype.itemsize
        if view.nbytes != expected:
            raise WireError(
                "size_mismatch",
                f"tensor {i} ({name}{list(shape)}): frame has {view.nbytes} bytes,"
                f" expected {expected}",
            )
        arrays.append(np.frombuffer(view, dtype=dtype).reshape(shape))

    if body.keys() != set(cls.BODY_FIELDS):
        fields = set(cls.BODY_FIELDS)
        missing, extra = _names(fields - body.keys()), _names(body.keys() - fields)
        raise WireError("bad_field", f"{kind}: missing fields {missing}, extra {extra}")
    if cls.TENSOR_FIELD is not None:
        body[cls.TENSOR_FIELD] = tuple(arrays)
    msg = cast("Message", cls(**body))  # the field checks raise WireError("bad_field")

    for i, a in enumerate(arrays):
        _check_values(i, a, check_finite)
    return msg, Meta(SCHEMA_VERSION, kind, sent_at, seq, nbytes)


def _check_values(i: int, a: NDArray[Any], check_finite: bool) -> None:
    kind = a.dtype.kind
    if kind == "f" and check_finite:
        # isfinite + all: one vectorized pass; measured faster than a.sum()
        # here (0.2 vs 0.4 ms per 10 MB) despite the temporary bool array.
        finite = np.isfinite(a)
        if not finite.all():
            bad = int(a.size - np.count_nonzero(finite))
            raise WireError(
                "non_finite", f"tensor {i} ({a.dtype}): {bad} NaN or Inf values"
            )
    elif kind == "b" and a.size and a.view(np.uint8).max() > 1:
        raise WireError("bad_value", f"tensor {i} (bool): bytes other than 0 and 1")
