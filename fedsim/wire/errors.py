"""The wire's errors: :class:`WireError` and its stable reason codes.

Every check of the wire (a message built with a bad field, a frame the codec
refuses) raises :class:`WireError` with a short, stable :data:`Reason`: log
it, count it, go on.
"""

from __future__ import annotations

from typing import Literal, get_args

__all__ = ["REASONS", "Reason", "WireError", "describe"]

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
    "unknown_payload",  # a task without its model, whose version's model the receiver lacks
]
"""Short, stable codes carried by :class:`WireError` (log them, count them)."""

REASONS: frozenset[str] = frozenset(get_args(Reason))


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
