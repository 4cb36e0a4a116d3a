"""fedsim's message schema and codec.

Rules
-----
1. One schema, versioned by :data:`SCHEMA_VERSION`. A message is a frozen,
   slotted, keyword-only dataclass whose fields are checked when it is built;
   dispatch on its class (``match msg: case Update(): ...``).
2. The codec is two pure functions. ``encode(msg, sent_at=..., seq=...)``
   returns frames for ``send_multipart(frames, copy=False)``; ``decode(frames)``
   returns ``(msg, meta)`` or raises :class:`WireError` with a stable
   ``reason`` code, after which the receiver logs it and goes on.
3. Nothing is pickled. Frame 0 is a msgpack map (schema version, kind,
   envelope, the message's non-tensor fields, and dtype and shape of each
   tensor); each tensor follows as its own raw frame. Non-tensor fields hold
   only plain data: None, bool, int, float, str, list, dict with str keys.

Wire format, version 1
----------------------
::

    frame 0:  msgpack {"v": 1, "kind": <class name>, "sent_at": <float>,
                       "seq": <int>, "body": {<fields>},
                       "tensors": [[<dtype name>, [<dims>]], ...]}
    frame i+1: bytes of tensor i, C order, little-endian

dtype names are those of :data:`WIRE_DTYPES`: bool, uint8, int8, int16,
int32, int64, float16, float32, float64 (no bfloat16: numpy lacks it).
``sent_at`` (emulated seconds) and ``seq`` (per-sender sequence number) form
the envelope, returned apart from the message as :class:`Meta`.

Zero copy, and what it asks of callers
--------------------------------------
``encode`` hands out memoryviews of the message's own arrays (it copies only
arrays that are not C-contiguous or not little-endian), and ``decode`` returns
``np.frombuffer`` views of the received frames, marked read-only. So:

- do not modify a message's arrays while it may still be in flight: the
  network emulator holds frames for the link delay, and ``inproc://`` hands
  the very same memory to the receiver. Snapshot a model that keeps changing
  with ``tensors_to_numpy(params, copy=True)``;
- copy a decoded array before modifying it, or use
  ``numpy_to_torch(arrays, copy=True)``.

Cost, measured once with ``timeit`` on the 2-vCPU development machine (for
orientation, not a test): a Task with 16 float32 tensors, 10 MB in all::

    build the Task (field checks)        ~   9 us
    encode                               ~  25 us
    decode, check_finite=False           ~  50 us   (bytes or zmq.Frame frames)
    decode, check_finite=True            ~ 0.33 ms  (np.isfinite over 10 MB)
    Heartbeat encode / decode            ~ 2 / 7 us

Both grow with the number of tensors (about 2 us each to encode, 3-4 us to
decode), not with their size; the finiteness check is the only pass over the
bytes.
"""

from __future__ import annotations

from fedsim._wire_codec import (
    DEFAULT_MAX_BYTES,
    MAX_TENSORS,
    SCHEMA_VERSION,
    Meta,
    decode,
    encode,
)
from fedsim._wire_messages import (
    KINDS,
    Aggregate,
    Bye,
    Control,
    Error,
    EventBatch,
    EventRecord,
    Heartbeat,
    HostHello,
    Message,
    Register,
    Task,
    Tensors,
    Update,
)
from fedsim._wire_torch import numpy_to_torch, tensors_to_numpy
from fedsim._wire_types import (
    MAX_DEPTH,
    MAX_NDIM,
    REASONS,
    WIRE_DTYPES,
    Reason,
    TensorSpec,
    WireError,
)

__all__ = [
    "DEFAULT_MAX_BYTES",
    "KINDS",
    "MAX_DEPTH",
    "MAX_NDIM",
    "MAX_TENSORS",
    "REASONS",
    "SCHEMA_VERSION",
    "WIRE_DTYPES",
    "Aggregate",
    "Bye",
    "Control",
    "Error",
    "EventBatch",
    "EventRecord",
    "Heartbeat",
    "HostHello",
    "Message",
    "Meta",
    "Reason",
    "Register",
    "Task",
    "TensorSpec",
    "Tensors",
    "Update",
    "WireError",
    "decode",
    "encode",
    "numpy_to_torch",
    "tensors_to_numpy",
]
