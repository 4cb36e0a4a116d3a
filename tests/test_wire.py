"""Tests of fedsim.wire: round trips, zero copy, every rejection, real sockets."""

from __future__ import annotations

import pickle
import subprocess
import sys
from typing import TYPE_CHECKING, Any

import msgpack
import numpy as np
import pytest
import torch
import zmq

from fedsim import wire
from fedsim.wire import (
    Aggregate,
    Bye,
    Control,
    Error,
    EventBatch,
    Heartbeat,
    HostHello,
    Register,
    Task,
    TensorSpec,
    Update,
    WireError,
    decode,
    encode,
)

if TYPE_CHECKING:
    from collections.abc import Callable

RNG = np.random.default_rng(0)


def _arrays() -> tuple[np.ndarray, ...]:
    return (
        RNG.standard_normal((3, 4)).astype(np.float32),
        np.arange(4, dtype=np.float32),
        np.array(7, dtype=np.int64),
        np.zeros((0, 5), dtype=np.float64),
        np.array([True, False, True]),
    )


MESSAGES = [
    Register(
        client=3,
        host="host-ü",
        num_samples=120,
        info={"device": "phone", "nested": {"a": [1, 2.5, None, True, "x"]}},
    ),
    Task(
        client=3,
        version=7,
        round=2,
        task_id=11,
        tensors=_arrays(),
        config={"steps": 5, "lr": 0.05},
    ),
    Task(client=0, version=0, round=0, task_id=0, tensors=()),
    Update(
        client=3,
        task_id=11,
        base_version=7,
        round=2,
        num_samples=120,
        tensors=_arrays(),
        stats={"loss": 0.25, "steps": 5},
    ),
    Aggregate(round=4, version=9, tensors=(np.ones(10, np.float16),), info={"n": 3}),
    Heartbeat(sender=3, status="ready"),
    Heartbeat(sender=-1, status="suspended", info={"until": 12.5}),
    Bye(sender=3, reason="done"),
    Error(sender=0, reason="non_finite"),
    HostHello(host="h1", clients=(1, 2, 3), pid=4321, info={"cores": 2}),
    Control(op="clock_sync", args={"t0": 1.25, "rate": 1.0}),
    EventBatch(host="h1", events=(("send", 1.0, 3), {"ev": "deliver", "t": 2.0}, ())),
]


def _as_bytes(frames: list[Any]) -> list[Any]:
    return [bytes(f) for f in frames]


def _as_memoryview(frames: list[Any]) -> list[Any]:
    return [memoryview(bytes(f)) for f in frames]


def _as_bytearray(frames: list[Any]) -> list[Any]:
    return [bytearray(f) for f in frames]


def _as_zmq_frames(frames: list[Any]) -> list[Any]:
    return [zmq.Frame(bytes(f)) for f in frames]


FRAME_TYPES = [_as_bytes, _as_memoryview, _as_bytearray, _as_zmq_frames]


# ---------------------------------------------------------------------------
# Round trips


@pytest.mark.parametrize("msg", MESSAGES, ids=lambda m: type(m).__name__)
@pytest.mark.parametrize("convert", FRAME_TYPES, ids=lambda f: f.__name__[4:])
def test_round_trip_every_kind(msg: wire.Message, convert: Callable) -> None:
    frames = encode(msg, sent_at=12.5, seq=42)
    got, meta = decode(convert(frames))
    assert type(got) is type(msg)
    assert got == msg
    assert meta == wire.Meta(
        version=wire.SCHEMA_VERSION,
        kind=type(msg).__name__,
        sent_at=12.5,
        seq=42,
        nbytes=sum(memoryview(f).nbytes for f in frames),
    )


def test_every_kind_is_covered() -> None:
    assert {type(m).__name__ for m in MESSAGES} == set(wire.KINDS)


SHAPES = [(), (0,), (3, 0, 2), (1,), (7,), (2, 3, 4), (1, 1, 1, 1, 5)]


@pytest.mark.parametrize("name", list(wire.WIRE_DTYPES))
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_every_dtype_and_shape(name: str, shape: tuple[int, ...]) -> None:
    dtype = wire.WIRE_DTYPES[name]
    a = np.asarray(RNG.standard_normal(shape) * 50).astype(dtype)
    msg = Aggregate(round=0, version=0, tensors=(a,))
    got, _ = decode(encode(msg))
    (b,) = got.tensors
    assert b.dtype == dtype
    assert b.shape == shape
    np.testing.assert_array_equal(a, b)


def test_large_model_round_trip_with_spec() -> None:
    arrays = tuple(RNG.standard_normal(s).astype(np.float32) for s in [(1024, 512)] * 4)
    spec = TensorSpec.from_arrays(arrays)
    assert spec.nbytes == 4 * 1024 * 512 * 4
    msg = Update(
        client=1, task_id=2, base_version=3, round=4, num_samples=5, tensors=arrays
    )
    got, meta = decode(_as_bytes(encode(msg)), spec=spec)
    assert got == msg
    assert meta.nbytes > spec.nbytes


def test_non_contiguous_and_big_endian_arrays_are_sent_correctly() -> None:
    base = np.arange(24, dtype=np.float64).reshape(4, 6)
    arrays = (base.T, base[::2, ::3], base.astype(">f8"), np.asfortranarray(base))
    got, _ = decode(encode(Aggregate(round=0, version=0, tensors=arrays)))
    for sent, received in zip(arrays, got.tensors, strict=True):
        np.testing.assert_array_equal(sent, received)
        assert received.dtype == np.dtype("<f8")
        assert received.flags.c_contiguous


def test_header_layout() -> None:
    msg = Task(client=1, version=2, round=3, task_id=4, tensors=_arrays()[:2])
    header = msgpack.unpackb(encode(msg, sent_at=1.5, seq=3)[0])
    assert header == {
        "v": 1,
        "kind": "Task",
        "sent_at": 1.5,
        "seq": 3,
        "body": {"client": 1, "version": 2, "round": 3, "task_id": 4, "config": {}},
        "tensors": [["float32", [3, 4]], ["float32", [4]]],
    }


# ---------------------------------------------------------------------------
# Zero copy


def test_encode_does_not_copy() -> None:
    arrays = _arrays()
    frames = encode(Aggregate(round=0, version=0, tensors=arrays))
    assert isinstance(frames[0], bytes)
    for a, frame in zip(arrays, frames[1:], strict=True):
        assert isinstance(frame, memoryview)
        assert frame.nbytes == a.nbytes
        if a.size:
            assert np.shares_memory(np.frombuffer(frame, np.uint8), a)
    arrays[0][0, 0] = 123.0  # aliasing is visible: the frames are the arrays
    assert np.frombuffer(frames[1], np.float32)[0] == 123.0


def test_encode_copies_only_non_contiguous_arrays() -> None:
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    frames = encode(Aggregate(round=0, version=0, tensors=(a.T,)))
    assert not np.shares_memory(np.frombuffer(frames[1], np.uint8), a)


@pytest.mark.parametrize("convert", FRAME_TYPES, ids=lambda f: f.__name__[4:])
def test_decode_does_not_copy(convert: Callable) -> None:
    frames = convert(encode(MESSAGES[1]))
    got, _ = decode(frames)
    for a, frame in zip(got.tensors, frames[1:], strict=True):
        buffer = frame.buffer if isinstance(frame, zmq.Frame) else frame
        if a.size:
            assert np.shares_memory(a, np.frombuffer(buffer, np.uint8))
        assert not a.flags.writeable
        with pytest.raises(ValueError, match="read-only"):
            a[...] = 0


# ---------------------------------------------------------------------------
# Rejections

DELETE = object()


def _good() -> tuple[dict[str, Any], list[bytes]]:
    """A valid Task's header (as a dict) and frames (as bytes)."""
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    msg = Task(
        client=1, version=2, round=3, task_id=4, tensors=(a, np.array([1, 2], np.int32))
    )
    frames = _as_bytes(encode(msg, sent_at=1.0, seq=1))
    return msgpack.unpackb(frames[0]), frames


def _edit_header(edits: dict[str, Any]) -> list[bytes]:
    """The good frames with header entries (dotted paths) set or deleted."""
    header, frames = _good()
    for path, value in edits.items():
        *parents, last = path.split(".")
        node: Any = header
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        if value is DELETE:
            del node[last]
        elif isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value
    return [msgpack.packb(header), *frames[1:]]


def _header(kind: str, body: dict[str, Any], tensors: list[Any]) -> bytes:
    header = {"v": 1, "kind": kind, "sent_at": 0.0, "seq": 0}
    return msgpack.packb({**header, "body": body, "tensors": tensors})


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


# (id, header edits, WireError.reason, text in the message)
HEADER_CASES = [
    ("no version", {"v": DELETE}, "bad_header", "no schema version"),
    ("wrong version", {"v": 2}, "wrong_version", "version 2"),
    ("version as str", {"v": "1"}, "wrong_version", "'1'"),
    ("version as bool", {"v": True}, "wrong_version", "True"),
    ("unknown kind", {"kind": "Nope"}, "unknown_kind", "Nope"),
    ("kind not a str", {"kind": 5}, "unknown_kind", "int 5"),
    ("missing header key", {"seq": DELETE}, "bad_header", "missing ['seq']"),
    ("extra header key", {"x": 1}, "bad_header", "extra ['x']"),
    ("sent_at not float", {"sent_at": 1}, "bad_header", "sent_at"),
    ("sent_at nan", {"sent_at": float("nan")}, "bad_header", "sent_at"),
    ("negative seq", {"seq": -1}, "bad_header", "seq"),
    ("body not a map", {"body": []}, "bad_header", "body"),
    ("missing field", {"body.round": DELETE}, "bad_field", "missing fields ['round']"),
    ("extra field", {"body.evil": 1}, "bad_field", "extra ['evil']"),
    ("tensors in body", {"body.tensors": []}, "bad_field", "extra ['tensors']"),
    ("str for int", {"body.round": "3"}, "bad_field", "Task.round must be an int"),
    ("float for int", {"body.round": 3.0}, "bad_field", "Task.round"),
    ("bool for int", {"body.client": True}, "bad_field", "Task.client"),
    ("int beyond int64", {"body.version": 2**63}, "bad_field", "int64"),
    ("list for dict", {"body.config": [1]}, "bad_field", "config must be a dict"),
    ("descriptors not a list", {"tensors": {}}, "bad_header", "tensors"),
    ("bad descriptor", {"tensors.0": ["float32"]}, "bad_header", "tensor 0"),
    ("negative dim", {"tensors.0": ["float32", [-2, -3]]}, "bad_header", "shape"),
    ("float dim", {"tensors.0": ["float32", [2.0, 3]]}, "bad_header", "shape"),
    ("too many dims", {"tensors.0": ["float32", [1] * 33]}, "bad_header", "shape"),
    ("dtype not a str", {"tensors.0": [7, [2, 3]]}, "bad_header", "dtype"),
    ("complex dtype", {"tensors.0": ["complex64", [2, 3]]}, "bad_dtype", "complex64"),
    ("object dtype", {"tensors.0": ["object", [2, 3]]}, "bad_dtype", "object"),
    # Smuggling: anything but plain data is refused.
    ("ext type", {"body.config": {"x": msgpack.ExtType(5, b"!")}}, "bad_header", "ext"),
    ("timestamp", {"body.config": {"t": msgpack.Timestamp(1)}}, "bad_field", "Timest"),
    ("bytes value", {"body.config": {"b": b"\x80\x04"}}, "bad_field", "config['b']: b"),
    ("bytes key", {"body.config": {b"k": 1}}, "bad_field", "dict key bytes"),
    ("int key", {"body.config": {1: 1}}, "bad_header", "msgpack"),
    ("bytes field name", {"body": {b"round": 1}}, "bad_field", "extra [b'round']"),
    ("deep nesting", {"body.config": {"d": _nested(40)}}, "bad_field", "nested deeper"),
]

# (id, good frames -> bad frames, WireError.reason, text in the message)
FRAME_CASES: list[tuple[str, Callable[[list[Any]], list[Any]], str, str]] = [
    ("no frames", lambda f: [], "frame_count", "0 frames"),
    ("garbage", lambda f: [b"\xc1\xc1garbage"], "bad_header", "msgpack"),
    ("truncated msgpack", lambda f: [f[0][:-3], *f[1:]], "bad_header", "msgpack"),
    ("trailing bytes", lambda f: [f[0] + b"\x00", *f[1:]], "bad_header", "ExtraData"),
    ("empty header", lambda f: [b"", *f[1:]], "bad_header", "msgpack"),
    ("very deep", lambda f: [b"\x91" * 5000 + b"\x01"], "bad_header", "StackError"),
    ("not a map", lambda f: [msgpack.packb([1, 2]), *f[1:]], "bad_header", "not a map"),
    ("extra frame", lambda f: [*f, b"\x00" * 4], "frame_count", "2 tensors, got 3"),
    ("missing frame", lambda f: f[:-1], "frame_count", "2 tensors, got 1 frames"),
    ("short frame", lambda f: [f[0], f[1][:-1], f[2]], "size_mismatch", "23 bytes"),
    ("long frame", lambda f: [*f[:2], f[2] + b"\x00" * 4], "size_mismatch", "tensor 1"),
    ("swapped frames", lambda f: [f[0], f[2], f[1]], "size_mismatch", "tensor 0"),
    ("non-buffer frame", lambda f: [f[0], 12345, f[2]], "bad_frame", "frame 1"),
    (
        "strided frame",
        lambda f: [f[0], memoryview(np.zeros(48, np.uint8))[::2], f[2]],
        "bad_frame",
        "contiguous",
    ),
    (
        "tensors on a heartbeat",
        lambda f: [
            _header(
                "Heartbeat", {"sender": 1, "status": "ok", "info": {}}, [["uint8", [1]]]
            ),
            b"\x00",
        ],
        "bad_header",
        "no tensors",
    ),
    (
        "bytes for str",
        lambda f: [_header("Bye", {"sender": 1, "reason": b"x"}, [])],
        "bad_field",
        "Bye.reason must be a str",
    ),
    (
        "event not a record",
        lambda f: [_header("EventBatch", {"host": "h", "events": [1]}, [])],
        "bad_field",
        "EventBatch.events[0]",
    ),
]


def _check_rejected(frames: list[Any], reason: str, text: str) -> None:
    with pytest.raises(WireError) as info:
        decode(frames)
    assert info.value.reason == reason, str(info.value)
    assert text in str(info.value)


@pytest.mark.parametrize(
    ("edits", "reason", "text"),
    [case[1:] for case in HEADER_CASES],
    ids=[case[0] for case in HEADER_CASES],
)
def test_header_rejections(edits: dict[str, Any], reason: str, text: str) -> None:
    _check_rejected(_edit_header(edits), reason, text)


@pytest.mark.parametrize(
    ("edit", "reason", "text"),
    [case[1:] for case in FRAME_CASES],
    ids=[case[0] for case in FRAME_CASES],
)
def test_frame_rejections(edit: Callable, reason: str, text: str) -> None:
    _check_rejected(edit(_good()[1]), reason, text)


def test_unedited_good_frames_decode() -> None:
    assert decode(_good()[1])[0].round == 3
    assert decode(_edit_header({}))[0].round == 3


def test_oversize_is_checked_before_the_header() -> None:
    frames = _good()[1]
    total = sum(len(f) for f in frames)
    assert decode(frames, max_bytes=total)
    with pytest.raises(
        WireError, match=f"{total} bytes > max_bytes={total - 1}"
    ) as info:
        decode(frames, max_bytes=total - 1)
    assert info.value.reason == "oversize"
    with pytest.raises(WireError) as info:
        decode([b"\xc1" * 100], max_bytes=10)
    assert info.value.reason == "oversize"


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_rejected(dtype: type, bad: float) -> None:
    a = np.ones((4, 5), dtype)
    a[2, 3] = bad
    frames = encode(
        Update(
            client=1,
            task_id=1,
            base_version=0,
            round=0,
            num_samples=1,
            tensors=(np.ones(3, dtype), a),
        )
    )
    with pytest.raises(WireError, match=r"tensor 1 .*1 NaN or Inf") as info:
        decode(frames)
    assert info.value.reason == "non_finite"
    got, _ = decode(frames, check_finite=False)
    assert np.isnan(got.tensors[1][2, 3]) or np.isinf(got.tensors[1][2, 3])


def test_bool_frame_with_bytes_other_than_0_1_rejected() -> None:
    frames = _as_bytes(
        encode(Aggregate(round=0, version=0, tensors=(np.zeros(3, bool),)))
    )
    frames[1] = b"\x00\x02\x01"
    with pytest.raises(WireError) as info:
        decode(frames)
    assert info.value.reason == "bad_value"


SPEC = TensorSpec([((2, 3), "float32"), ((2,), np.int32)])


def test_spec_match_and_mismatches() -> None:
    frames = _good()[1]
    assert decode(frames, spec=SPEC)[0].round == 3
    cases = [
        (
            TensorSpec([((3, 2), "float32"), ((2,), "int32")]),
            "shape_mismatch",
            "tensor 0: shape (2, 3), expected (3, 2)",
        ),
        (
            TensorSpec([((2, 3), "float64"), ((2,), "int32")]),
            "dtype_mismatch",
            "tensor 0: dtype float32, expected float64",
        ),
        (
            TensorSpec([((2, 3), "float32"), ((2,), "int64")]),
            "dtype_mismatch",
            "tensor 1",
        ),
        (
            TensorSpec([((2, 3), "float32")]),
            "shape_mismatch",
            "expected 1 tensors, got 2",
        ),
    ]
    for spec, reason, text in cases:
        with pytest.raises(WireError) as info:
            decode(frames, spec=spec)
        assert info.value.reason == reason
        assert text in str(info.value)


def test_spec_is_checked_before_frame_sizes() -> None:
    frames = _good()[1]
    frames[1] = b"short"
    with pytest.raises(WireError) as info:
        decode(frames, spec=TensorSpec([((9,), "float32"), ((2,), "int32")]))
    assert info.value.reason == "shape_mismatch"


def test_spec_ignored_for_kinds_without_tensors() -> None:
    msg = Heartbeat(sender=1, status="ready")
    assert decode(encode(msg), spec=SPEC)[0] == msg


def test_spec_helpers() -> None:
    assert len(SPEC) == 2
    assert list(SPEC) == [((2, 3), "float32"), ((2,), "int32")]
    assert SPEC.nbytes == 6 * 4 + 2 * 4
    SPEC.check([np.zeros((2, 3), np.float32), np.zeros(2, np.int32)])
    with pytest.raises(WireError, match="dtype_mismatch"):
        SPEC.check([np.zeros((2, 3), np.float32), np.zeros(2, np.int64)])
    with pytest.raises(WireError, match="bad_dtype"):
        TensorSpec([((2,), np.complex64)])
    with pytest.raises(WireError, match="bad shape"):
        TensorSpec([((-1,), np.float32)])
    assert TensorSpec([((np.int64(2),), "<f4")]) == TensorSpec([((2,), "float32")])


# ---------------------------------------------------------------------------
# Building messages


def test_fields_are_keyword_only_and_checked() -> None:
    with pytest.raises(TypeError):
        Bye(3, "done")  # type: ignore[misc]
    bad: list[tuple[Callable[[], Any], str, str]] = [
        (lambda: Bye(sender="3", reason="x"), "bad_field", "Bye.sender must be an int"),
        (lambda: Bye(sender=np.int64(3), reason="x"), "bad_field", "int64"),
        (
            lambda: Heartbeat(sender=1, status="ready", info={"t": (1, 2)}),
            "bad_field",
            "use a list",
        ),
        (
            lambda: Heartbeat(sender=1, status="ready", info={"x": np.float32(1)}),
            "bad_field",
            "float32",
        ),
        (
            lambda: Aggregate(round=0, version=0, tensors=(torch.zeros(2),)),
            "bad_field",
            "tensors_to_numpy",
        ),
        (
            lambda: Aggregate(round=0, version=0, tensors=np.zeros(2)),
            "bad_field",
            "tuple or list",
        ),
        (
            lambda: Aggregate(round=0, version=0, tensors=(np.zeros(2, np.complex64),)),
            "bad_dtype",
            "complex64",
        ),
        (
            lambda: Aggregate(round=0, version=0, tensors=(np.array(["a"]),)),
            "bad_dtype",
            "<U1",
        ),
        (
            lambda: HostHello(host="h", clients=(1, "2"), pid=1),
            "bad_field",
            "HostHello.clients[1]",
        ),
        (
            lambda: EventBatch(host="h", events=(("x", (1, 2)),)),
            "bad_field",
            "events[0][1]",
        ),
        (
            lambda: EventBatch(host="h", events=(("x", {1: 2}),)),
            "bad_field",
            "dict key int",
        ),
    ]
    for make, reason, text in bad:
        with pytest.raises(WireError) as info:
            make()
        assert info.value.reason == reason
        assert text in str(info.value)


def test_lists_are_stored_as_tuples() -> None:
    a = np.zeros(2, np.float32)
    assert Aggregate(round=0, version=0, tensors=[a]).tensors == (a,)
    assert HostHello(host="h", clients=[1, 2], pid=1).clients == (1, 2)
    assert EventBatch(host="h", events=[["a", 1], {"b": 2}]).events == (
        ("a", 1),
        {"b": 2},
    )


def test_messages_are_frozen_and_compare_tensors_by_value() -> None:
    msg = MESSAGES[1]
    with pytest.raises(AttributeError):
        msg.round = 5  # type: ignore[misc]
    nan = Aggregate(round=0, version=0, tensors=(np.array([np.nan, 1.0]),))
    assert nan == Aggregate(round=0, version=0, tensors=(np.array([np.nan, 1.0]),))
    assert nan != Aggregate(round=0, version=0, tensors=(np.array([np.nan, 2.0]),))
    assert nan != Aggregate(
        round=0, version=0, tensors=(np.array([np.nan, 1.0], np.float32),)
    )
    assert nan != Aggregate(round=0, version=0, tensors=())
    assert Bye(sender=1, reason="x") != Error(sender=1, reason="x")
    assert "tensors=<5 tensors" in repr(msg)


def test_encode_argument_errors() -> None:
    with pytest.raises(TypeError, match=r"needs a fedsim\.wire message"):
        encode({"kind": "Task"})  # type: ignore[arg-type]
    msg = Bye(sender=1, reason="x")
    for kwargs in [
        {"sent_at": float("inf")},
        {"sent_at": "1"},
        {"seq": -1},
        {"seq": 1.0},
    ]:
        with pytest.raises(WireError, match="bad_field"):
            encode(msg, **kwargs)
    # A dict changed after construction into something msgpack cannot pack:
    hb = Heartbeat(sender=1, status="ready", info={})
    hb.info["x"] = object()
    with pytest.raises(WireError, match="cannot pack header"):
        encode(hb)


def test_wire_error() -> None:
    err = WireError("oversize", "too big")
    assert (err.reason, err.detail, str(err)) == (
        "oversize",
        "too big",
        "oversize: too big",
    )
    clone = pickle.loads(pickle.dumps(err))
    assert (clone.reason, clone.detail) == ("oversize", "too big")
    with pytest.raises(ValueError, match="Invalid WireError reason"):
        WireError("nope", "x")  # type: ignore[arg-type]
    assert {c[2] for c in HEADER_CASES + FRAME_CASES} | {
        "oversize",
        "non_finite",
        "bad_value",
        "shape_mismatch",
        "dtype_mismatch",
    } == wire.REASONS


# ---------------------------------------------------------------------------
# torch


def test_torch_round_trip_is_zero_copy_without_warnings() -> None:
    model = torch.nn.Linear(5, 3)
    arrays = wire.tensors_to_numpy(model.parameters())
    assert [a.shape for a in arrays] == [(3, 5), (3,)]
    assert np.shares_memory(arrays[0], model.weight.detach().numpy())
    snapshot = wire.tensors_to_numpy(model.parameters(), copy=True)
    assert not np.shares_memory(snapshot[0], arrays[0])

    msg = Update(
        client=1, task_id=1, base_version=0, round=0, num_samples=1, tensors=arrays
    )
    frames = _as_bytes(encode(msg))
    got, _ = decode(frames)
    tensors = wire.numpy_to_torch(got.tensors)  # read-only arrays: no warning
    assert torch.equal(tensors[0], model.weight.detach())
    assert tensors[0].data_ptr() == got.tensors[0].ctypes.data
    owned = wire.numpy_to_torch(got.tensors, copy=True)
    owned[0].add_(1.0)
    assert torch.equal(tensors[0], model.weight.detach())
    writable = np.zeros(3, np.float32)
    assert wire.numpy_to_torch([writable])[0].data_ptr() == writable.ctypes.data


def test_torch_dtypes() -> None:
    with pytest.raises(WireError, match="bfloat16"):
        wire.tensors_to_numpy([torch.zeros(2, dtype=torch.bfloat16)])
    with pytest.raises(WireError, match="bad_dtype"):
        wire.tensors_to_numpy([torch.zeros(2, dtype=torch.complex64)])
    with pytest.raises(TypeError, match=r"torch\.Tensor"):
        wire.tensors_to_numpy([np.zeros(2)])  # type: ignore[list-item]
    for dtype in [
        torch.bool,
        torch.uint8,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.float16,
        torch.float32,
        torch.float64,
    ]:
        (a,) = wire.tensors_to_numpy([torch.ones((), dtype=dtype)])
        (t,) = wire.numpy_to_torch(
            decode(encode(Aggregate(round=0, version=0, tensors=(a,))))[0].tensors
        )
        assert t.dtype == dtype
        assert t.shape == ()


def test_import_does_not_load_torch() -> None:
    code = "import sys, fedsim.wire; print('torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False"


# ---------------------------------------------------------------------------
# Real sockets


@pytest.mark.parametrize("transport", ["tcp", "inproc"])
def test_real_socket_round_trip(transport: str) -> None:
    ctx = zmq.Context()
    a = ctx.socket(zmq.PAIR)
    b = ctx.socket(zmq.PAIR)
    try:
        for s in (a, b):
            s.linger = 0
            s.rcvtimeo = 5000
            s.sndtimeo = 5000
        if transport == "tcp":
            port = a.bind_to_random_port("tcp://127.0.0.1")
            b.connect(f"tcp://127.0.0.1:{port}")
        else:
            a.bind("inproc://test-wire")
            b.connect("inproc://test-wire")
        for seq, msg in enumerate(MESSAGES):
            a.send_multipart(encode(msg, sent_at=seq / 2, seq=seq), copy=False)
            got, meta = decode(b.recv_multipart(copy=False))
            assert got == msg
            assert (meta.seq, meta.sent_at) == (seq, seq / 2)
        big = Task(
            client=1,
            version=1,
            round=1,
            task_id=1,
            tensors=tuple(
                RNG.standard_normal((256, 1024)).astype(np.float32) for _ in range(4)
            ),
        )
        a.send_multipart(encode(big), copy=False)
        frames = b.recv_multipart(copy=False)
        assert all(isinstance(f, zmq.Frame) for f in frames)
        got, _ = decode(frames, spec=TensorSpec.from_arrays(big.tensors))
        assert got == big
    finally:
        a.close(linger=0)
        b.close(linger=0)
        ctx.term()
