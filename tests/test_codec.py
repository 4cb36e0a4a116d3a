"""Tests of fedsim.wire.messages and fedsim.wire.codec (schema 2): round trips, zero copy,
every rejection reason by name, field checks, real sockets, and a fuzz loop."""

from __future__ import annotations

import pickle
import random
import struct
import subprocess
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgpack
import numpy as np
import pytest
import zmq

from fedsim.wire import codec, errors, messages, records, tensors
from fedsim.wire.codec import Body, Meta, decode, encode, encode_body, stamp
from fedsim.wire.errors import REASONS, WireError
from fedsim.wire.messages import (
    EVENT_KINDS,
    HOST_EVENT_KINDS,
    HOST_PHASES,
    KINDS,
    SCHEMA_VERSION,
    Advance,
    Average,
    ClockProbe,
    ClockReply,
    Evaluate,
    Evaluated,
    Event,
    EventBatch,
    Failed,
    HostBye,
    HostHello,
    Leave,
    LocalWork,
    PhaseSample,
    Ready,
    Refused,
    Shutdown,
    Start,
    Stop,
    Task,
    Trained,
    Update,
    WorkerFailed,
    WorkerReady,
)
from fedsim.wire.tensors import WIRE_DTYPES, Model, TensorSpec

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


def _f32(n: int = 10) -> Model:
    flat = RNG.standard_normal(n).astype(np.float32)
    return Model.from_flat(flat, TensorSpec([("float32", (n,))]))


SPEC = TensorSpec([("float32", (2, 3)), ("float32", (4,))])


def _spec_model(copies: int = 1) -> Model:
    spec = SPEC.repeated(copies)
    return Model.from_flat(np.arange(10 * copies, dtype=np.float32), spec)


EVENTS = (
    Event(t=1.0, real=1.5, ev="send", client=3, dir="down", bytes=1200, kind="task"),
    Event(
        t=2.0,
        real=2.25,
        ev="aggregate",
        version=4,
        base_version=2,
        staleness=2,
        extra={"weight": 0.5, "names": ["a", None, True], "deep": {"x": -(2**63)}},
    ),
    Event(t=3, real=3, ev="warning", reason="host-ü said so"),
)

MESSAGES: list[Any] = [
    Task(client=3, task_id=11, version=7, round=2, work=LocalWork(steps=5), model=_f32()),
    Task(client=0, task_id=0, version=0, round=0, work=None, model=Model.from_arrays(_arrays())),
    Update(
        client=3,
        task_id=11,
        base_version=7,
        round=2,
        num_samples=120,
        steps=5,
        loss=0.25,
        model=_f32(),
    ),
    Update(
        client=1,
        task_id=1,
        base_version=0,
        round=0,
        num_samples=1,
        steps=1,
        loss=float("nan"),
        model=Model.from_arrays(_arrays()),
    ),
    Average(client=4, round=9, version=9, model=Model.from_arrays([np.ones(10, np.float16)])),
    Ready(client=3, reset=True),
    Failed(client=0, cause="non_finite", reason="training failed: non_finite"),
    Leave(client=0, reason="done"),
    HostHello(
        host="h1",
        pid=4321,
        clients=(1, 2, 3),
        samples=(10, 20, 30),
        boot_id="b-00",
        fedsim_version="0.1.0",
        scenario_hash="abc123",
    ),
    Start(epoch=12345.5, dilation=2.0, spec=TensorSpec.from_arrays(_arrays())),
    Refused(reason="scenario mismatch"),
    EventBatch(host="h1", events=EVENTS),
    EventBatch(host="h2", events=()),
    EventBatch(host="h3", events=EVENTS[:1], phases=(
        PhaseSample(phase="encode.hosts", count=3, sum=6e-5, max=3e-5,
                    values=(1e-5, 2e-5, 3e-5)),
        PhaseSample(phase="compute.budget", count=1000, sum=12.0, max=0.5, values=(0.012,)),
    )),
    Stop(reason="end"),
    HostBye(
        host="h1",
        overruns=2,
        compute_deadlines=0,
        rejected=1,
        fidelity={"lateness": {"n": 3, "samples": [0.1, 0.2]}, "overruns": 2, "kinds": {}},
    ),
    ClockProbe(seq=1, t_sent=0.5),
    ClockReply(seq=1, t_sent=0.5, t_server=1000.25),
    WorkerReady(samples=(5, 6), spec=SPEC),
    Advance(request_id=2, client=3, rounds=(4, 5), model=_spec_model(2)),
    Advance(request_id=3, client=3, rounds=(), model=None),
    Advance(request_id=4, client=3, rounds=(6,), model=_spec_model(1), held=(4, 5)),
    Trained(
        request_id=2,
        client=3,
        steps=10,
        loss=0.5,
        compute_s=0.01,
        upload=True,
        next="more",
        wait_round=None,
        notes={"eta": 0.01, "corrections": [1, 2]},
    ),
    Trained(
        request_id=4,
        client=3,
        steps=0,
        loss=None,
        compute_s=0.0,
        upload=False,
        next="wait",
        wait_round=6,
        notes={},
    ),
    Evaluate(request_id=5, version=9, model=_spec_model()),
    Evaluated(request_id=5, version=9, loss=float("inf"), accuracy=0.1, seconds=0.5),
    WorkerFailed(request_id=6, cause="error", reason="RuntimeError: boom"),
    Shutdown(),
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


def _buffer(frame: Any) -> Any:
    return frame.buffer if isinstance(frame, zmq.Frame) else frame


# ---------------------------------------------------------------------------
# Round trips


@pytest.mark.parametrize("msg", MESSAGES, ids=lambda m: type(m).__name__)
@pytest.mark.parametrize("convert", FRAME_TYPES, ids=lambda f: f.__name__[4:])
def test_round_trip_every_kind(msg: Any, convert: Callable) -> None:
    frames = encode(msg, sent_at=12.5, seq=42)
    got, meta = decode(convert(frames))
    assert type(got) is type(msg)
    assert got == msg
    assert meta == Meta(
        version=SCHEMA_VERSION,
        kind=type(msg).__name__,
        sent_at=12.5,
        seq=42,
        nbytes=sum(memoryview(f).nbytes for f in frames),
    )


ODD_VALUES = [-1, 0, 1.5, -0.0, float("nan"), float("inf"), 2**63, -(2**63) - 1, True, None,
              "x", b"x", [], [1, "a"], {}, {"a": 1}]


def _outcome(make: Callable[[], Any]) -> Any:
    try:
        return ("ok", make())
    except Exception as exc:  # the very exception is compared
        return ("raised", type(exc), str(exc))


@pytest.mark.parametrize("msg", MESSAGES, ids=lambda m: type(m).__name__)
def test_the_straight_line_checks_agree_with_the_generic_loop(msg: Any) -> None:
    """register() writes each class's checks out as code (records._compile_checks);
    on every field of every kind, given the values a peer might send instead, it
    accepts, converts and rejects exactly as the generic loop, with the same error."""
    cls = type(msg)
    header = msgpack.unpackb(encode(msg)[1], raw=False)
    model = getattr(msg, cls.MODEL_FIELD) if cls.MODEL_FIELD else None
    def generic_new(fields: dict[str, Any]) -> Any:
        obj = object.__new__(cls)
        for k, v in fields.items():
            object.__setattr__(obj, k, v)
        records.Record.__post_init__(obj)
        return obj

    def same(a: Any, b: Any) -> bool:
        return a[:1] == b[:1] and (a[1:] == b[1:] if a[0] == "raised" else a[1] == b[1])

    for i, name in enumerate(cls.FIELDS):
        for odd in ODD_VALUES:
            raw = list(header)
            raw[i] = odd
            fast = _outcome(lambda raw=raw: cls.from_wire(raw, model))
            slow = _outcome(lambda raw=raw: _generic_from_wire(cls, raw, model))
            assert same(fast, slow), (name, odd, fast, slow)
            fields = {n: getattr(msg, n) for n in cls.FIELDS} | {name: odd}
            fast = _outcome(lambda fields=fields: cls(**fields))
            slow = _outcome(lambda fields=fields: generic_new(fields))
            assert same(fast, slow), (name, odd, fast, slow)


def _generic_from_wire(cls: Any, raw: Any, model: Any) -> Any:
    try:
        return records.Record._load.__func__(cls, raw, model)  # type: ignore[attr-defined]
    except records.Bad as bad:
        raise bad.error(cls.KIND) from None


def test_every_kind_is_covered() -> None:
    assert {type(m).__name__ for m in MESSAGES} == set(KINDS)
    assert set(KINDS) == {c.__name__ for c in messages.Message.__args__}


SHAPES = [(), (0,), (3, 0, 2), (1,), (7,), (2, 3, 4), (1, 1, 1, 1, 5)]


@pytest.mark.parametrize("name", list(WIRE_DTYPES))
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_every_dtype_and_shape(name: str, shape: tuple[int, ...]) -> None:
    dtype = WIRE_DTYPES[name]
    a = np.asarray(RNG.standard_normal(shape) * 50).astype(dtype)
    msg = Average(client=0, round=0, version=0, model=Model.from_arrays([a]))
    frames = encode(msg)
    assert len(frames) == 3
    got, _ = decode(_as_bytes(frames))
    (b,) = got.model.arrays()
    assert b.dtype == dtype
    assert b.shape == shape
    np.testing.assert_array_equal(a, b)
    assert got.model.spec == TensorSpec([(name, shape)])


def test_multi_dtype_model_layout() -> None:
    arrays = _arrays()
    model = Model.from_arrays(arrays)
    assert model.spec.dtypes == ("float32", "int64", "float64", "bool")
    assert model.spec.counts == (16, 1, 0, 3)
    assert [b.dtype.name for b in model.buffers] == ["float32", "int64", "float64", "bool"]
    np.testing.assert_array_equal(
        model.buffers[0], np.concatenate([arrays[0].ravel(), arrays[1]])
    )
    assert model.nbytes == sum(a.nbytes for a in arrays)
    frames = encode(Update(
        client=1, task_id=2, base_version=3, round=4, num_samples=5, steps=6, loss=None,
        model=model,
    ))
    assert len(frames) == 2 + 4
    got, _ = decode(frames, spec=model.spec)
    for sent, received in zip(arrays, got.model.arrays(), strict=True):
        np.testing.assert_array_equal(sent, received)
        assert sent.shape == received.shape
    with pytest.raises(ValueError, match=r"4 dtypes \['float32', 'int64', 'float64', 'bool'\]"):
        got.model.flat()


def test_float32_model_is_one_frame() -> None:
    arrays = [RNG.standard_normal(s).astype(np.float32) for s in [(64, 32), (32,), (10, 64)]]
    model = Model.from_arrays(arrays)
    frames = encode(Task(client=1, task_id=1, version=1, round=1, work=None, model=model))
    assert len(frames) == 3
    assert memoryview(frames[2]).nbytes == model.nbytes == sum(a.nbytes for a in arrays)


def test_large_model_round_trip_with_spec() -> None:
    arrays = tuple(RNG.standard_normal(s).astype(np.float32) for s in [(1024, 512)] * 4)
    model = Model.from_arrays(arrays)
    assert model.spec.nbytes == 4 * 1024 * 512 * 4
    msg = Update(
        client=1, task_id=2, base_version=3, round=4, num_samples=5, steps=1, loss=1.0,
        model=model,
    )
    got, meta = decode(_as_bytes(encode(msg)), spec=TensorSpec.from_arrays(arrays))
    assert got == msg
    assert meta.nbytes > model.nbytes


def test_nested_value_types_round_trip() -> None:
    msg = Task(client=2, task_id=3, version=4, round=5, work=LocalWork(epochs=2),
               model=_spec_model())
    got, _ = decode(encode(msg))
    assert got.work == LocalWork(epochs=2.0)
    assert type(got.work.epochs) is float
    batch, _ = decode(encode(EventBatch(host="h", events=EVENTS)))
    assert batch.events == EVENTS
    assert all(type(e) is Event for e in batch.events)
    assert batch.events[1].extra["deep"] == {"x": -(2**63)}


def test_wire_layout() -> None:
    msg = Task(
        client=1, task_id=4, version=2, round=3, work=LocalWork(steps=2),
        model=Model.from_arrays(_arrays()[:3]),
    )
    frames = encode(msg, sent_at=1.5, seq=3)
    assert frames[0] == b"\x94\x05\xa4Task" + struct.pack(">BdBQ", 0xCB, 1.5, 0xCF, 3)
    assert msgpack.unpackb(frames[0]) == [5, "Task", 1.5, 3]
    assert msgpack.unpackb(frames[1]) == [
        1, 4, 2, 3, [2, None],
        [["float32", [3, 4]], ["float32", [4]], ["int64", []]], "",
    ]
    assert len(frames) == 4  # float32 buffer, int64 buffer


def test_encode_body_and_stamp() -> None:
    msg = MESSAGES[0]
    body = encode_body(msg)
    assert isinstance(body, Body)
    assert body.kind == "Task"
    a = stamp(body, sent_at=1.0, seq=1)
    b = stamp(body, sent_at=2.0, seq=2**64 - 1)
    assert _as_bytes(a) == _as_bytes(encode(msg, sent_at=1.0, seq=1))
    assert _as_bytes(b) == _as_bytes(encode(msg, sent_at=2.0, seq=2**64 - 1))
    assert a[1:] == b[1:] == list(body.frames)  # the body is shared, not re-encoded
    for frames in (a, b, encode(msg)):
        assert body.nbytes == sum(memoryview(f).nbytes for f in frames)
        assert decode(frames)[1].nbytes == body.nbytes
    assert decode(b)[1].seq == 2**64 - 1


def test_non_contiguous_and_big_endian_arrays_are_copied_correctly() -> None:
    base = np.arange(24, dtype=np.float64).reshape(4, 6)
    arrays = (base.T, base[::2, ::3], base.astype(">f8"), np.asfortranarray(base))
    model = Model.from_arrays(arrays)
    got, _ = decode(encode(Evaluate(request_id=0, version=0, model=model)))
    for sent, received in zip(arrays, got.model.arrays(), strict=True):
        np.testing.assert_array_equal(sent, received)
        assert received.dtype == np.dtype("<f8")
        assert received.flags.c_contiguous


# ---------------------------------------------------------------------------
# Model and TensorSpec


def test_model_from_flat_does_not_copy() -> None:
    flat = np.arange(10, dtype=np.float32)
    model = Model.from_flat(flat, SPEC)
    assert model.flat() is flat or np.shares_memory(model.flat(), flat)
    w, b = model.arrays()
    assert w.shape == (2, 3)
    assert b.shape == (4,)
    assert np.shares_memory(w, flat)
    assert np.shares_memory(b, flat)
    flat[0] = 99.0
    assert w[0, 0] == 99.0
    two_d = np.zeros((2, 5), np.float32)  # any contiguous shape is viewed as 1-D
    assert np.shares_memory(Model.from_flat(two_d, SPEC).flat(), two_d)
    assert Model.from_flat(np.zeros(0, np.float32), TensorSpec(())).buffers == ()


def test_model_from_arrays_copies_once() -> None:
    arrays = _arrays()
    model = Model.from_arrays(arrays)
    for a, view in zip(arrays, model.arrays(), strict=True):
        assert not np.shares_memory(a, model.buffers[0]) or a.size == 0
        np.testing.assert_array_equal(a, view)
    assert all(v.base is not None for v in model.arrays() if v.size)


@pytest.mark.parametrize(
    ("make", "reason", "text"),
    [
        (lambda: Model.from_flat(np.zeros(9, np.float32), SPEC), "size_mismatch", "9 elements"),
        (lambda: Model.from_flat(np.zeros(10, np.float64), SPEC), "dtype_mismatch", "float64"),
        (
            lambda: Model.from_flat(np.zeros(20, np.float32)[::2], SPEC),
            "bad_field",
            "C-contiguous",
        ),
        (
            lambda: Model.from_flat(np.zeros(2), TensorSpec.from_arrays(_arrays())),
            "bad_field",
            "use from_arrays",
        ),
        (lambda: Model.from_flat([0.0] * 10, SPEC), "bad_field", "numpy.ndarray"),
        (lambda: Model(SPEC, ()), "bad_field", "0 buffers"),
        (lambda: Model(SPEC, (np.zeros((2, 5), np.float32),)), "bad_field", "1-D"),
        (lambda: Model(SPEC, (np.zeros(10, ">f4"),)), "dtype_mismatch", ">f4"),
        # past the one-test fast path for a wire-dtype 1-D array of the right size
        (lambda: Model(SPEC, (np.zeros(20, np.float32)[::2],)), "bad_field", "C-contiguous"),
        (lambda: Model(SPEC, (np.zeros(10, np.float32)[::-1],)), "bad_field", "C-contiguous"),
        (lambda: Model(SPEC, (np.zeros(11, np.float32),)), "size_mismatch", "11 elements"),
        (lambda: Model(SPEC, (np.zeros(10, np.float64),)), "dtype_mismatch", "float64"),
        (lambda: Model((), ()), "bad_field", "TensorSpec"),
        (lambda: Model.from_arrays([np.zeros(2, np.complex64)]), "bad_dtype", "complex64"),
        (lambda: Model.from_arrays([np.array(["a"])]), "bad_dtype", "<U1"),
        (lambda: Model.from_arrays([[1.0]]), "bad_field", "numpy.ndarray"),
    ],
)
def test_model_construction_errors(make: Callable, reason: str, text: str) -> None:
    with pytest.raises(WireError) as info:
        make()
    assert info.value.reason == reason, str(info.value)
    assert text in str(info.value)


def test_model_helpers() -> None:
    model = Model.from_arrays(_arrays())
    assert repr(model) == "Model(float32+int64+float64+bool, 5 tensors, 75 B)"
    assert model == Model.from_arrays(model.arrays())
    assert model != Model.from_arrays(model.arrays()[:4])
    nan = Model.from_arrays([np.array([np.nan, 1.0])])
    assert nan == Model.from_arrays([np.array([np.nan, 1.0])])
    assert nan != Model.from_arrays([np.array([np.nan, 2.0])])
    assert nan != Model.from_arrays([np.array([np.nan, 1.0], np.float32)])
    assert Model.from_arrays([np.zeros(3, np.float32)]).flat().shape == (3,)
    with pytest.raises(ValueError, match=r"0 dtypes \[\]"):
        Model(TensorSpec(()), ()).flat()
    assert Model(SPEC, [np.zeros(10, np.float32)]).buffers[0].shape == (10,)


def test_spec_helpers() -> None:
    assert len(SPEC) == 2
    assert list(SPEC) == [("float32", (2, 3)), ("float32", (4,))]
    assert SPEC.nbytes == 40
    assert SPEC.dtypes == ("float32",)
    assert SPEC.counts == (10,)
    assert SPEC.layout == ((0, 0, 6), (0, 6, 4))
    two = SPEC.repeated(2)
    assert len(two) == 4
    assert two.counts == (20,)
    assert two.layout[2] == (0, 10, 6)
    assert SPEC.repeated(0) == TensorSpec(())
    SPEC.check([np.zeros((2, 3), np.float32), np.zeros(4, np.float32)])
    with pytest.raises(WireError, match="dtype_mismatch"):
        SPEC.check([np.zeros((2, 3), np.float32), np.zeros(4, np.int64)])
    with pytest.raises(WireError, match="bad_dtype"):
        TensorSpec([(np.complex64, (2,))])
    with pytest.raises(WireError, match="bad shape"):
        TensorSpec([(np.float32, (-1,))])
    with pytest.raises(WireError, match=r"\(dtype, shape\) pairs"):
        TensorSpec([((2,), "float32")])  # schema 1's order
    assert TensorSpec([("<f4", (np.int64(2),))]) == TensorSpec([("float32", [2])])
    assert hash(TensorSpec([("float32", (2,))])) == hash(TensorSpec([(np.float32, (2,))]))
    assert TensorSpec.from_wire(SPEC.to_wire()) == SPEC
    assert repr(two) == "TensorSpec(float32[2, 3], float32[4], float32[2, 3], float32[4]; 80 B)"
    assert repr(SPEC.repeated(3)).endswith("float32[4], ... 2 more; 120 B)")
    with pytest.raises(WireError, match="MAX_TENSORS"):
        TensorSpec([("uint8", (1,))] * (tensors.MAX_TENSORS + 1))


# ---------------------------------------------------------------------------
# Zero copy


def test_encode_does_not_copy() -> None:
    model = Model.from_arrays(_arrays())
    frames = encode(Average(client=0, round=0, version=0, model=model))
    assert isinstance(frames[0], bytes)
    assert isinstance(frames[1], bytes)
    for buf, frame in zip(model.buffers, frames[2:], strict=True):
        assert isinstance(frame, memoryview)
        assert frame.nbytes == buf.nbytes
        if buf.size:
            assert np.shares_memory(np.frombuffer(frame, np.uint8), buf)
    model.buffers[0][0] = 123.0  # aliasing is visible: the frames are the buffers
    assert np.frombuffer(frames[2], np.float32)[0] == 123.0


@pytest.mark.parametrize("convert", FRAME_TYPES, ids=lambda f: f.__name__[4:])
def test_decode_does_not_copy(convert: Callable) -> None:
    frames = convert(encode(MESSAGES[1]))
    got, _ = decode(frames)
    for buf, frame in zip(got.model.buffers, frames[2:], strict=True):
        if buf.size:
            assert np.shares_memory(buf, np.frombuffer(_buffer(frame), np.uint8))
        assert not buf.flags.writeable
        with pytest.raises(ValueError, match="read-only"):
            buf[...] = 0
    for view in got.model.arrays():
        assert not view.flags.writeable


def test_encode_decode_round_trip_shares_the_senders_memory() -> None:
    flat = RNG.standard_normal(25_000).astype(np.float32)  # 100 KB
    msg = Update(
        client=1, task_id=1, base_version=0, round=0, num_samples=1, steps=1, loss=0.0,
        model=Model.from_flat(flat, TensorSpec([("float32", (25_000,))])),
    )
    got, _ = decode(encode(msg))  # frames passed as they are, as inproc:// does
    assert np.shares_memory(got.model.flat(), flat)
    assert got.model.flat().ctypes.data == flat.ctypes.data


# ---------------------------------------------------------------------------
# Rejections

DELETE = object()


def _good() -> tuple[list[Any], list[bytes]]:
    """A valid Task's header (as a list) and frames (as bytes): float32 and int32 buffers."""
    model = Model.from_arrays([np.arange(6, dtype=np.float32).reshape(2, 3),
                               np.array([1, 2], np.int32)])
    msg = Task(client=1, task_id=4, version=2, round=3, work=None, model=model)
    frames = _as_bytes(encode(msg, sent_at=1.0, seq=1))
    return msgpack.unpackb(frames[1]), frames


GOOD_SPEC = TensorSpec([("float32", (2, 3)), ("int32", (2,))])


def _edit(edits: dict[str, Any], frame: int = 1) -> list[bytes]:
    """The good frames with items of frame 0 or 1 (dotted index paths) set or deleted."""
    header, frames = _good()
    doc = msgpack.unpackb(frames[frame]) if frame == 0 else header
    for path, value in edits.items():
        *parents, last = path.split(".")
        node: Any = doc
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        if value is DELETE:
            del node[int(last) if isinstance(node, list) else last]
        elif isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value
    frames[frame] = msgpack.packb(doc)
    return frames


def _envelope(kind: str) -> bytes:
    return msgpack.packb([SCHEMA_VERSION, kind, 0.0, 0])


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


# (id, envelope edits, reason, text)
ENVELOPE_CASES = [
    ("wrong version", {"0": 1}, "wrong_version", "version 1"),
    ("version as str", {"0": "2"}, "wrong_version", "'2'"),
    ("version as bool", {"0": True}, "wrong_version", "True"),
    ("unknown kind", {"1": "Nope"}, "unknown_kind", "Nope"),
    ("kind not a str", {"1": 5}, "unknown_kind", "int 5"),
    ("missing item", {"3": DELETE}, "bad_envelope", "3 items"),
    ("sent_at not float", {"2": 1}, "bad_envelope", "sent_at"),
    ("sent_at nan", {"2": float("nan")}, "bad_envelope", "sent_at"),
    ("sent_at inf", {"2": float("inf")}, "bad_envelope", "sent_at"),
    ("negative seq", {"3": -1}, "bad_envelope", "seq"),
    ("float seq", {"3": 1.0}, "bad_envelope", "seq"),
]

# (id, header edits, reason, text). Task header: client, task_id, version, round, work, spec,
# tag.
HEADER_CASES = [
    ("missing field", {"3": DELETE}, "bad_field", "Task: 6 field values, Task has 7"),
    ("str for int", {"3": "3"}, "bad_field", "Task.round must be an int, got str '3'"),
    ("float for int", {"3": 3.0}, "bad_field", "Task.round"),
    ("bool for int", {"0": True}, "bad_field", "Task.client"),
    ("int beyond int64", {"2": 2**63}, "bad_field", "int64"),
    ("value type not an array", {"4": {"steps": 1}}, "bad_field", "Task.work must be an array"),
    ("value type short", {"4": [1]}, "bad_field", "Task.work: 1 field values, LocalWork has 2"),
    ("nested bad field", {"4": ["x", None]}, "bad_field", "Task.work.steps must be an int"),
    ("nested rule", {"4": [0, None]}, "bad_field", "Task.work.steps must be >= 1"),
    ("nested both", {"4": [1, 1.0]}, "bad_field", "set steps or epochs, not both"),
    ("spec not a list", {"5": {}}, "bad_header", "Task model spec"),
    ("bad descriptor", {"5.0": ["float32"]}, "bad_header", "tensor 0"),
    ("negative dim", {"5.0": ["float32", [-2, -3]]}, "bad_header", "shape"),
    ("float dim", {"5.0": ["float32", [2.0, 3]]}, "bad_header", "shape"),
    ("too many dims", {"5.0": ["float32", [1] * 33]}, "bad_header", "MAX_NDIM"),
    ("dtype not a str", {"5.0": [7, [2, 3]]}, "bad_header", "dtype"),
    ("complex dtype", {"5.0": ["complex64", [2, 3]]}, "bad_dtype", "complex64"),
    ("object dtype", {"5.0": ["object", [2, 3]]}, "bad_dtype", "object"),
    ("numpy alias", {"5.0": ["<f4", [2, 3]]}, "bad_dtype", "<f4"),
    # a task may leave its model out (its receiver holds it), but not keep its frames
    ("model left out, frames kept", {"5": None}, "frame_count", "lists 0 model buffers"),
    ("huge shape", {"5.0": ["float32", [2**62, 2**62]]}, "size_mismatch", "frame has 24 bytes"),
    ("header ext type", {"0": msgpack.ExtType(5, b"!")}, "bad_header", "extension type 5"),
    ("timestamp", {"0": msgpack.Timestamp(1)}, "bad_field", "Timestamp"),
    ("bytes for int", {"0": b"\x80\x04"}, "bad_field", "Task.client must be an int, got bytes"),
]

# (id, good frames -> bad frames, reason, text)
FRAME_CASES: list[tuple[str, Callable[[list[Any]], list[Any]], str, str]] = [
    ("no frames", lambda f: [], "frame_count", "0 frames"),
    ("too many frames", lambda f: f + [b""] * 9, "frame_count", "13 frames"),
    ("envelope only", lambda f: f[:1], "frame_count", "no header"),
    ("garbage envelope", lambda f: [b"\xc1\xc1garbage", *f[1:]], "bad_envelope", "msgpack"),
    ("truncated envelope", lambda f: [f[0][:-3], *f[1:]], "bad_envelope", "msgpack"),
    ("trailing bytes", lambda f: [f[0] + b"\x00", *f[1:]], "bad_envelope", "ExtraData"),
    ("empty envelope", lambda f: [b"", *f[1:]], "bad_envelope", "msgpack"),
    ("envelope a map", lambda f: [msgpack.packb({"a": 1}), *f[1:]], "bad_envelope", "dict"),
    ("envelope empty", lambda f: [msgpack.packb([]), *f[1:]], "bad_envelope", "list []"),
    ("int key", lambda f: [b"\x81\x01\x01", *f[1:]], "bad_envelope", "msgpack"),
    ("envelope ext", lambda f: [b"\xd4\x05\x00", *f[1:]], "bad_envelope", "extension type 5"),
    (
        "schema 1 header",
        lambda f: [msgpack.packb({"v": 1, "kind": "Task"}), *f[1:]],
        "wrong_version",
        f"schema version 1, expected {SCHEMA_VERSION}",
    ),
    ("very deep", lambda f: [f[0], b"\x91" * 5000 + b"\x01"], "bad_header", "StackError"),
    ("garbage header", lambda f: [f[0], b"\xc1", *f[2:]], "bad_header", "msgpack"),
    ("header a map", lambda f: [f[0], msgpack.packb({}), *f[2:]], "bad_header", "not an array"),
    ("extra frame", lambda f: [*f, b"\x00" * 4], "frame_count", "2 model buffers, got 3"),
    ("missing frame", lambda f: f[:-1], "frame_count", "2 model buffers, got 1"),
    ("short frame", lambda f: [*f[:2], f[2][:-1], f[3]], "size_mismatch", "23 bytes"),
    ("long frame", lambda f: [*f[:3], f[3] + b"\x00" * 4], "size_mismatch", "buffer 1 (int32"),
    ("swapped frames", lambda f: [*f[:2], f[3], f[2]], "size_mismatch", "buffer 0"),
    ("non-buffer frame", lambda f: [*f[:2], 12345, f[3]], "bad_frame", "frame 2"),
    (
        "strided frame",
        lambda f: [*f[:2], memoryview(np.zeros(48, np.uint8))[::2], f[3]],
        "bad_frame",
        "contiguous",
    ),
    (
        "model frames on a kind without one",
        lambda f: [_envelope("Stop"), msgpack.packb(["x"]), b"\x00"],
        "frame_count",
        "Stop header lists 0 model buffers, got 1",
    ),
    (
        "bytes for str",
        lambda f: [_envelope("Stop"), msgpack.packb([b"x"], use_bin_type=True)],
        "bad_field",
        "Stop.reason must be a str, got bytes",
    ),
    (
        "event not a record",
        lambda f: [_envelope("EventBatch"), msgpack.packb(["h", [1], []])],
        "bad_field",
        "EventBatch.events[0] must be an array, got int 1",
    ),
    (
        "event field named",
        lambda f: [
            _envelope("EventBatch"),
            msgpack.packb(["h", [[0.0, 0.0, "send", *([None] * 14), {}],
                                 [0.0, 0.0, "send", "x", *([None] * 13), {}]], []]),
        ],
        "bad_field",
        "EventBatch.events[1].client must be an int, got str 'x'",
    ),
    (
        "unknown event kind",
        lambda f: [_envelope("EventBatch"),
                   msgpack.packb(["h", [[0.0, 0.0, "nope", *([None] * 14), {}]], []])],
        "bad_field",
        "EventBatch.events[0].ev must be one of EVENT_KINDS, got str 'nope'",
    ),
    (
        "plain dict smuggling bytes",
        lambda f: [
            _envelope("EventBatch"),
            msgpack.packb(["h", [[0.0, 0.0, "send", *([None] * 14), {"b": b"\x80"}]], []],
                          use_bin_type=True),
        ],
        "bad_field",
        "EventBatch.events[0].extra['b']: bytes",
    ),
    (
        "phase of the server's",
        lambda f: [_envelope("EventBatch"),
                   msgpack.packb(["h", [], [["aggregation.server", 1, 1.0, 1.0, [1.0]]]])],
        "bad_field",
        "EventBatch.phases[0].phase must be one of",
    ),
    (
        "phase value not a float",
        lambda f: [_envelope("EventBatch"),
                   msgpack.packb(["h", [], [["decode.hosts", 2, 1.0, 1.0, [0.5, "x"]]]])],
        "bad_field",
        "EventBatch.phases[0].values[1] must be a float, got str 'x'",
    ),
    (
        "plain dict bytes key",
        lambda f: [
            _envelope("HostBye"),
            msgpack.packb(["h", 0, 0, 0, {b"k": 1}, []], use_bin_type=True),
        ],
        "bad_field",
        "HostBye.fidelity: dict key bytes",
    ),
    (
        "plain dict too deep",
        lambda f: [_envelope("HostBye"), msgpack.packb(["h", 0, 0, 0, {"d": _nested(40)}, []])],
        "bad_field",
        "nested deeper",
    ),
    (
        "nan in a float field",
        lambda f: [_envelope("ClockProbe"), msgpack.packb([1, float("nan")])],
        "bad_field",
        "ClockProbe.t_sent must be finite, got nan",
    ),
    (
        "bad spec field",
        lambda f: [_envelope("Start"),
                   msgpack.packb([0.0, 1.0, [["float32"]], 1, None, "", 0.0, 0])],
        "bad_field",
        "Start.spec: tensor 0",
    ),
    (
        "unequal host lists",
        lambda f: [_envelope("HostHello"),
                   msgpack.packb(["h", 1, [1, 2], [1], "b", "v", "s", 0.0, 0.0])],
        "bad_field",
        "HostHello: 2 clients but 1 samples",
    ),
    (
        "advance without model",
        lambda f: [_envelope("Advance"), msgpack.packb([1, 1, [3], None, None, []])],
        "bad_field",
        "model must be None exactly when rounds is empty",
    ),
]


def _check_rejected(frames: list[Any], reason: str, text: str, **kwargs: Any) -> None:
    with pytest.raises(WireError) as info:
        decode(frames, **kwargs)
    assert info.value.reason == reason, str(info.value)
    assert text in str(info.value), str(info.value)


@pytest.mark.parametrize(
    ("edits", "reason", "text"),
    [case[1:] for case in ENVELOPE_CASES],
    ids=[case[0] for case in ENVELOPE_CASES],
)
def test_envelope_rejections(edits: dict[str, Any], reason: str, text: str) -> None:
    _check_rejected(_edit(edits, frame=0), reason, text)


@pytest.mark.parametrize(
    ("edits", "reason", "text"),
    [case[1:] for case in HEADER_CASES],
    ids=[case[0] for case in HEADER_CASES],
)
def test_header_rejections(edits: dict[str, Any], reason: str, text: str) -> None:
    _check_rejected(_edit(edits), reason, text)


@pytest.mark.parametrize(
    ("edit", "reason", "text"),
    [case[1:] for case in FRAME_CASES],
    ids=[case[0] for case in FRAME_CASES],
)
def test_frame_rejections(edit: Callable, reason: str, text: str) -> None:
    _check_rejected(edit(_good()[1]), reason, text)


def test_unedited_good_frames_decode() -> None:
    assert decode(_good()[1])[0].round == 3
    assert decode(_edit({}))[0].round == 3
    assert decode(_edit({}, frame=0))[0].round == 3


def test_oversize_is_checked_before_the_envelope() -> None:
    frames = _good()[1]
    total = sum(len(f) for f in frames)
    assert decode(frames, max_bytes=total)
    with pytest.raises(WireError, match=f"{total} bytes > max_bytes={total - 1}") as info:
        decode(frames, max_bytes=total - 1)
    assert info.value.reason == "oversize"
    _check_rejected([b"\xc1" * 100, b"\xc1"], "oversize", "101 bytes", max_bytes=10)


def _hostile_header(nbytes: int) -> bytes:
    """A msgpack array of ``nbytes`` empty arrays: about 64 bytes of objects per byte."""
    return b"\xdd" + nbytes.to_bytes(4, "big") + b"\x90" * nbytes


def test_an_oversize_header_is_refused_without_being_unpacked(
        monkeypatch: pytest.MonkeyPatch) -> None:
    unpacked: list[int] = []
    real = msgpack.unpackb

    def spy(data: Any, **kwargs: Any) -> Any:
        unpacked.append(len(memoryview(data)))
        return real(data, **kwargs)

    monkeypatch.setattr(codec.msgpack, "unpackb", spy)
    envelope = _envelope("EventBatch")
    header = _hostile_header(30 * 1024 * 1024)   # 30 MB: once +230 MB of RSS on a server
    _check_rejected([envelope, header], "oversize_header",
                    f"EventBatch: frame 1 (header) of {len(header)} bytes > max_header=65536")
    assert unpacked == [len(envelope)]           # the envelope only
    # a receiver may allow a kind more, and a trusted channel no limit at all
    small = _hostile_header(100_000)
    _check_rejected([envelope, small], "bad_field", "EventBatch", max_header=200_000)
    _check_rejected([envelope, small], "bad_field", "EventBatch", max_header=None)
    unpacked.clear()
    _check_rejected([envelope + b"\x00" * 100, b"\x90"], "oversize_header",
                    f"frame 0 (envelope) of {len(envelope) + 100} bytes "
                    "(an envelope has at most 64)")
    assert unpacked == []


def test_the_header_limit_is_checked_after_the_total_size() -> None:
    frames = [_envelope("ClockProbe"), _hostile_header(codec.MAX_HEADER_BYTES)]
    _check_rejected(frames, "oversize", "bytes > max_bytes=1000", max_bytes=1000)


def test_a_30_mb_header_costs_no_memory() -> None:
    """Measured in a fresh process: the peak RSS decoding it adds beyond the frame itself."""
    script = """
import resource
from fedsim.wire.codec import decode
from fedsim.wire.errors import WireError
from fedsim.wire.messages import SCHEMA_VERSION
import msgpack
env = msgpack.packb([SCHEMA_VERSION, "EventBatch", 0.0, 0])
header = b"\\xdd" + (30 << 20).to_bytes(4, "big") + b"\\x90" * (30 << 20)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    decode([env, header])
except WireError as exc:
    reason = exc.reason
print(reason, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True, timeout=60).stdout.split()
    assert out[0] == "oversize_header"
    assert int(out[1]) < 4 * 1024, f"peak RSS grew by {out[1]} KB"   # unpacked: ~2 GB


@pytest.mark.parametrize("copies", [1, 2, 3])
def test_max_message_bytes_bounds_every_message_with_the_spec(copies: int) -> None:
    spec = TensorSpec([("float32", (64, 60)), ("float32", (64,)), ("int64", (3, 3))])
    bound = codec.max_message_bytes(spec, copies)
    full = spec.repeated(copies)
    assert bound == (codec.MAX_ENVELOPE_BYTES + codec.MAX_HEADER_BYTES
                     + len(msgpack.packb(full.to_wire())) + full.nbytes)
    model = Model.from_arrays([np.zeros(s, WIRE_DTYPES[d]) for d, s in full.entries])
    big = Update(client=2**62, task_id=2**62, base_version=2**62, round=2**62,
                 num_samples=2**62, steps=2**62, loss=1.0, model=model)
    frames = encode(big, sent_at=1.0, seq=2**63)
    assert encode_body(big).nbytes <= bound
    assert decode(frames, max_bytes=bound, max_header=codec.header_bound(full),
                  spec=full)[0].client == 2**62
    assert codec.header_bound(None) == codec.MAX_HEADER_BYTES


def test_the_stamped_envelope_is_read_by_its_layout_any_other_by_msgpack() -> None:
    """stamp()'s envelope (a kind's head, a float64 and a uint64) is read with one
    struct; the same values in another msgpack encoding are read alike, and the
    stamped layout with a bad value is refused as msgpack's reading refuses it."""
    _, frames = _good()
    meta = decode(frames)[1]
    env = bytes(frames[0])
    short = msgpack.packb([messages.SCHEMA_VERSION, meta.kind, meta.sent_at, meta.seq])
    assert short != env                      # seq 1 as a fixint, not a uint64
    again = decode([short, *frames[1:]])[1]
    assert (again.kind, again.sent_at, again.seq) == (meta.kind, meta.sent_at, meta.seq)
    head = env[:-struct.calcsize(">BdBQ")]
    for bad in (float("nan"), float("inf")):
        _check_rejected([head + struct.pack(">BdBQ", 0xCB, bad, 0xCF, 1), *frames[1:]],
                        "bad_envelope", "sent_at")


def test_peek_reads_the_envelope_only() -> None:
    _, frames = _good()
    meta = codec.peek(frames)
    assert (meta.kind, meta.seq, meta.nbytes) == ("Task", 1, sum(len(f) for f in frames))
    frames[1] = b"\xc1"  # a broken header is not peek's business
    assert codec.peek(frames).kind == "Task"
    with pytest.raises(WireError) as info:
        codec.peek(frames, max_bytes=10)
    assert info.value.reason == "oversize"
    with pytest.raises(WireError) as info:
        codec.peek([b"\xc1", b""])
    assert info.value.reason == "bad_envelope"


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_rejected(dtype: type, bad: float) -> None:
    a = np.ones((4, 5), dtype)
    a[2, 3] = bad
    model = Model.from_arrays([np.ones(3, dtype), a, np.ones(2, np.int8)])
    frames = encode(Update(
        client=1, task_id=1, base_version=0, round=0, num_samples=1, steps=1, loss=None,
        model=model,
    ))
    name = np.dtype(dtype).name
    _check_rejected(frames, "non_finite", f"tensor 1 ({name}[4, 5]): first of 1 NaN or Inf")
    got, _ = decode(frames, check_finite=False)
    assert not np.isfinite(got.model.arrays()[1][2, 3])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_huge_finite_values_pass_the_finiteness_check(dtype: type) -> None:
    # Their sum of squares overflows; the exact check then finds them finite.
    big = np.full(100, np.finfo(dtype).max / 2, dtype)
    msg = Average(client=0, round=0, version=0, model=Model.from_arrays([big]))
    assert decode(encode(msg))[0] == msg
    big[-1] = np.inf
    msg = Average(client=0, round=0, version=0, model=Model.from_arrays([big]))
    _check_rejected(encode(msg), "non_finite", "tensor 0 (")


def test_bool_frame_with_bytes_other_than_0_1_rejected() -> None:
    model = Model.from_arrays([np.zeros(2, np.float32), np.zeros(3, bool)])
    frames = _as_bytes(encode(Average(client=0, round=0, version=0, model=model)))
    frames[3] = b"\x00\x02\x01"
    _check_rejected(frames, "bad_value", "tensor 1 (bool[3]) (bool): bytes other than 0 and 1")


def test_spec_match_and_mismatches() -> None:
    frames = _good()[1]
    assert decode(frames, spec=GOOD_SPEC)[0].round == 3
    cases = [
        (
            TensorSpec([("float32", (3, 2)), ("int32", (2,))]),
            "shape_mismatch",
            "tensor 0: shape (2, 3), expected (3, 2)",
        ),
        (
            TensorSpec([("float64", (2, 3)), ("int32", (2,))]),
            "dtype_mismatch",
            "tensor 0: dtype float32, expected float64",
        ),
        (TensorSpec([("float32", (2, 3)), ("int64", (2,))]), "dtype_mismatch", "tensor 1"),
        (TensorSpec([("float32", (2, 3))]), "shape_mismatch", "expected 1 tensors, got 2"),
    ]
    for spec, reason, text in cases:
        _check_rejected(frames, reason, text, spec=spec)


def test_spec_is_checked_before_buffers_are_read() -> None:
    # Buffers of the wrong length and full of NaN: the spec mismatch is found
    # first, from the header alone.
    frames = _good()[1]
    frames[2] = np.full(5, np.nan, np.float32).tobytes()
    frames[3] = b"\xff"
    spec = TensorSpec([("float32", (9,)), ("int32", (2,))])
    _check_rejected(frames, "shape_mismatch", "tensor 0", spec=spec)
    _check_rejected(frames, "size_mismatch", "buffer 0", spec=GOOD_SPEC)


def test_spec_ignored_for_kinds_without_a_model() -> None:
    msg = Stop(reason="end")
    assert decode(encode(msg), spec=GOOD_SPEC)[0] == msg
    none = next(m for m in MESSAGES if isinstance(m, Advance) and m.model is None)
    assert decode(encode(none), spec=SPEC)[0] == none


def test_advance_spec_is_repeated_per_round() -> None:
    msg = Advance(request_id=1, client=1, rounds=(4, 5), model=_spec_model(2))
    assert decode(encode(msg), spec=SPEC)[0] == msg
    short = Advance(request_id=1, client=1, rounds=(4, 5, 6), model=_spec_model(2))
    _check_rejected(encode(short), "shape_mismatch", "expected 6 tensors, got 4", spec=SPEC)
    frames = _as_bytes(encode(msg))
    header = msgpack.unpackb(frames[1])
    header[2] = 7
    frames[1] = msgpack.packb(header)
    _check_rejected(frames, "bad_field", "Advance.rounds must be an array", spec=SPEC)
    # a round is carried or held, not both
    with pytest.raises(WireError, match=r"rounds \[5\] both carried and held"):
        Advance(request_id=1, client=1, rounds=(4, 5), model=_spec_model(2), held=(5,))


# ---------------------------------------------------------------------------
# Building messages: field checks name the field and the value


@pytest.mark.parametrize(
    ("make", "reason", "text"),
    [
        (
            lambda: Update(client=1, task_id=1, base_version=1, round=1, num_samples=1,
                           steps="lots", loss=None, model=_f32()),
            "bad_field",
            "Update.steps must be an int, got str 'lots'",
        ),
        (lambda: Failed(client=np.int64(3), cause="error", reason="x"), "bad_field",
         "Failed.client"),
        (lambda: Failed(client=2**63, cause="error", reason="x"), "bad_field",
         "does not fit in int64"),
        (lambda: Failed(client=1, cause="error", reason=None), "bad_field",
         "Failed.reason must be a str"),
        (lambda: Failed(client=1, cause="boom", reason="x"), "bad_field",
         "Failed.cause must be one of overflow, non_finite, error"),
        (lambda: Ready(client=1, reset=1), "bad_field", "Ready.reset must be a bool, got int 1"),
        (lambda: ClockProbe(seq=1, t_sent="1"), "bad_field", "ClockProbe.t_sent must be a float"),
        (lambda: ClockProbe(seq=1, t_sent=True), "bad_field", "must be a float, got bool"),
        (lambda: ClockProbe(seq=1, t_sent=float("inf")), "bad_field", "must be finite, got inf"),
        (lambda: ClockProbe(seq=1, t_sent=10**400), "bad_field", "is too large for a float"),
        (
            lambda: Evaluated(request_id=1, version=1, loss=0.0, accuracy=float("nan"),
                              seconds=0.0),
            "bad_field",
            "Evaluated.accuracy must be finite",
        ),
        (lambda: LocalWork(steps=0), "bad_field", "LocalWork.steps must be >= 1, got 0"),
        (lambda: LocalWork(epochs=0.0), "bad_field", "LocalWork.epochs must be > 0"),
        (lambda: LocalWork(epochs=-1), "bad_field", "LocalWork.epochs must be > 0"),
        (lambda: LocalWork(steps=1, epochs=1.0), "bad_field", "set steps or epochs, not both"),
        (
            lambda: Task(client=1, task_id=1, version=1, round=1, work={"steps": 1},
                         model=_f32()),
            "bad_field",
            "Task.work must be a LocalWork, got dict",
        ),
        (
            lambda: Task(client=1, task_id=1, version=1, round=1, work=None,
                         model=_arrays()),
            "bad_field",
            "Model.from_arrays",
        ),
        (
            lambda: HostHello(host="h", pid=1, clients=(1, "2"), samples=(1, 2), boot_id="b",
                              fedsim_version="v", scenario_hash="s"),
            "bad_field",
            "HostHello.clients[1] must be an int, got str '2'",
        ),
        (
            lambda: HostHello(host="h", pid=1, clients=(1, 2), samples=(1,), boot_id="b",
                              fedsim_version="v", scenario_hash="s"),
            "bad_field",
            "HostHello: 2 clients but 1 samples",
        ),
        (
            lambda: HostHello(host="h", pid=1, clients=1, samples=(1,), boot_id="b",
                              fedsim_version="v", scenario_hash="s"),
            "bad_field",
            "HostHello.clients must be a tuple, got int 1",
        ),
        (lambda: Event(t=0, real=0, ev="nope"), "bad_field", "Event.ev must be one of"),
        (lambda: Leave(client=-1, reason="x"), "bad_field", "Leave.client must be >= 0, got -1"),
        (lambda: Update(client=0, task_id=1, base_version=0, round=0, num_samples=0, steps=1,
                        loss=None, model=_f32(3)),
         "bad_field", "Update.num_samples must be >= 1, got 0"),
        (lambda: Update(client=0, task_id=1, base_version=0, round=0, num_samples=5, steps=-1,
                        loss=None, model=_f32(3)),
         "bad_field", "Update.steps must be >= 0, got -1"),
        (
            lambda: Event(t=0, real=0, ev="send", extra={"client": 3}),
            "bad_field",
            "Event.extra: keys ['client'] shadow Event fields",
        ),
        (
            lambda: Event(t=0, real=0, ev="send", extra={"t": (1, 2)}),
            "bad_field",
            "use a list",
        ),
        (
            lambda: Event(t=0, real=0, ev="send", extra={"x": np.bool_(True)}),
            "bad_field",
            "Event.extra['x']: bool np.True_ is not a plain type",
        ),
        (
            lambda: EventBatch(host="h", events=({"ev": "send"},)),
            "bad_field",
            "EventBatch.events[0] must be an Event, got dict",
        ),
        (
            lambda: PhaseSample(phase="aggregation.server", count=1, sum=0.0, max=0.0,
                                values=(0.0,)),
            "bad_field",
            "PhaseSample.phase must be one of ['compute.budget', 'compute.real', ",
        ),
        (
            lambda: PhaseSample(phase="decode.hosts", count=1, sum=0.1, max=0.1, values=()),
            "bad_field",
            "PhaseSample.values: 0 values for a count of 1",
        ),
        (
            lambda: PhaseSample(phase="decode.hosts", count=1, sum=0.2, max=0.1,
                                values=(0.1, 0.1)),
            "bad_field",
            "PhaseSample.values: 2 values for a count of 1",
        ),
        (
            lambda: PhaseSample(phase="decode.hosts", count=2, sum=0.2, max=0.1,
                                values=(0.1, 0.3)),
            "bad_field",
            "PhaseSample: durations must be >= 0 and at most max",
        ),
        (
            lambda: PhaseSample(phase="decode.hosts", count=1, sum=-1.0, max=0.0,
                                values=(0.0,)),
            "bad_field",
            "PhaseSample: durations must be >= 0",
        ),
        (
            lambda: PhaseSample(phase="decode.hosts", count=1, sum=1.0, max=float("inf"),
                                values=(1.0,)),
            "bad_field",
            "PhaseSample.max must be finite, got inf",
        ),
        (
            lambda: EventBatch(host="h", events=(), phases=({"phase": "decode.hosts"},)),
            "bad_field",
            "EventBatch.phases[0] must be a PhaseSample, got dict",
        ),
        (lambda: Start(epoch=0.0, dilation=1.0, spec=[]), "bad_field", "Start.spec must be a"),
        (
            lambda: Advance(request_id=1, client=1, rounds=(), model=_spec_model()),
            "bad_field",
            "model must be None exactly when rounds is empty",
        ),
        (
            lambda: Trained(request_id=1, client=1, steps=1, loss=None, compute_s=0.0,
                            upload=False, next="later", wait_round=None,
                            notes={}),
            "bad_field",
            "Trained.next must be 'done', 'more' or 'wait', got str 'later'",
        ),
        (
            lambda: Trained(request_id=1, client=1, steps=1, loss=None, compute_s=0.0,
                            upload=False, next="done", wait_round=None,
                            notes=[]),
            "bad_field",
            "Trained.notes must be a dict",
        ),
    ],
)
def test_field_errors_name_the_field(make: Callable, reason: str, text: str) -> None:
    with pytest.raises(WireError) as info:
        make()
    assert info.value.reason == reason, str(info.value)
    assert text in str(info.value), str(info.value)


def test_a_hosts_phases_are_named_as_the_summary_names_them() -> None:
    from fedsim.results.phases import PHASES

    assert set(PHASES) > HOST_PHASES
    assert EventBatch(host="h", events=()).phases == ()


def test_fields_are_keyword_only_and_normalized() -> None:
    with pytest.raises(TypeError):
        Failed(3, "done")  # type: ignore[misc]
    hello = HostHello(host="h", pid=1, clients=[1, 2], samples=[3, 4], boot_id="b",
                      fedsim_version="v", scenario_hash="s")
    assert hello.clients == (1, 2)
    assert hello.samples == (3, 4)
    probe = ClockProbe(seq=1, t_sent=2)
    assert type(probe.t_sent) is float
    assert LocalWork() == LocalWork(steps=None, epochs=None)
    assert EventBatch(host="h", events=list(EVENTS)).events == EVENTS


def test_non_finite_floats_only_where_annotated() -> None:
    # Losses are AnyFloat: a diverged loss is reported, and NaN == NaN for equality.
    nan = Evaluated(request_id=1, version=1, loss=float("nan"), accuracy=0.1, seconds=1.0)
    got, _ = decode(encode(nan))
    assert got == nan
    assert got != Evaluated(request_id=1, version=1, loss=1.0, accuracy=0.1, seconds=1.0)
    assert Trained.__dataclass_fields__["loss"].type == "AnyFloat | None"


def test_dict_fields_only_where_allowed() -> None:
    @dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
    class Rogue(records.Record):
        info: dict[str, Any]

    with pytest.raises(TypeError, match=r"Rogue\.info: no wire type"):
        records.register(Rogue, {}, message=True)


def test_messages_are_frozen_compare_by_value_and_repr_short() -> None:
    msg = MESSAGES[0]
    with pytest.raises(AttributeError):
        msg.round = 5  # type: ignore[misc]
    assert Failed(client=1, cause="error", reason="x") != Leave(client=1, reason="x")
    assert Failed(client=1, cause="error", reason="x") == Failed(client=1, cause="error",
                                                               reason="x")
    text = repr(MESSAGES[1])
    assert "model=Model(float32+int64+float64+bool, 5 tensors, 75 B)" in text
    assert len(repr(Average(client=0, round=0, version=0, model=_f32(1_000_000)))) < 100


def test_event_to_json_dict() -> None:
    event = Event(
        t=1.5, real=2.0, ev="deliver", staleness=0, client=3, bytes=10, sent_at=1.0,
        extra={"z": 1, "a": [2]},
    )
    out = event.to_json_dict()
    assert out == {"t": 1.5, "real": 2.0, "ev": "deliver", "client": 3, "bytes": 10,
                   "sent_at": 1.0, "staleness": 0, "z": 1, "a": [2]}
    assert list(out) == ["t", "real", "ev", "client", "bytes", "sent_at", "staleness", "z", "a"]
    assert Event(t=0, real=0, ev="end").to_json_dict() == {"t": 0.0, "real": 0.0, "ev": "end"}
    assert "send" in EVENT_KINDS
    assert len(EVENT_KINDS) == 25
    assert HOST_EVENT_KINDS.issubset(EVENT_KINDS)


def test_encode_argument_errors() -> None:
    with pytest.raises(TypeError, match=r"needs a fedsim\.wire\.messages message"):
        encode({"kind": "Task"})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"needs a fedsim\.wire\.messages message"):
        encode(LocalWork(steps=1))  # type: ignore[arg-type]
    msg = Stop(reason="x")
    for kwargs in [{"sent_at": float("inf")}, {"sent_at": "1"}, {"seq": -1}, {"seq": 1.0},
                   {"seq": 2**64}, {"sent_at": True}]:
        with pytest.raises(WireError, match="bad_field"):
            encode(msg, **kwargs)
    # A dict changed after construction into something msgpack cannot pack:
    bye = HostBye(host="h", overruns=0, compute_deadlines=0, rejected=0, fidelity={})
    bye.fidelity["x"] = object()
    with pytest.raises(WireError, match="cannot pack header"):
        encode(bye)


def test_wire_error() -> None:
    err = WireError("oversize", "too big")
    assert (err.reason, err.detail, str(err)) == ("oversize", "too big", "oversize: too big")
    clone = pickle.loads(pickle.dumps(err))
    assert (clone.reason, clone.detail) == ("oversize", "too big")
    with pytest.raises(ValueError, match="Invalid WireError reason"):
        WireError("nope", "x")  # type: ignore[arg-type]
    tested = {c[2] for c in ENVELOPE_CASES + HEADER_CASES + FRAME_CASES} | {
        "oversize", "non_finite", "bad_value", "shape_mismatch", "dtype_mismatch",
        "oversize_header",  # test_an_oversize_header_is_refused_without_being_unpacked
        "unknown_payload",  # tests/test_payloads.py
    }
    assert tested == REASONS


def test_modules_import_without_torch_and_do_not_reexport() -> None:
    code = ("import sys, fedsim.wire.messages, fedsim.wire.codec, fedsim.wire.tensors;"
            " print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    wire = (errors, tensors, records, messages, codec)
    exported = [name for module in wire for name in module.__all__]
    assert len(exported) == len(set(exported))  # each name has one home
    for module in wire:
        assert all(getattr(module, name).__module__ == module.__name__
                   for name in module.__all__ if isinstance(getattr(module, name), type))


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
            a.bind("inproc://test-codec")
            b.connect("inproc://test-codec")
        for seq, msg in enumerate(MESSAGES):
            a.send_multipart(encode(msg, sent_at=seq / 2, seq=seq), copy=False)
            got, meta = decode(b.recv_multipart(copy=False))
            assert got == msg
            assert (meta.seq, meta.sent_at) == (seq, seq / 2)
        arrays = [RNG.standard_normal((256, 1024)).astype(np.float32) for _ in range(4)]
        big = Task(client=1, task_id=1, version=1, round=1, work=None,
                   model=Model.from_arrays(arrays))
        body = encode_body(big)
        a.send_multipart(stamp(body, sent_at=1.0, seq=1), copy=False)
        frames = b.recv_multipart(copy=False)
        assert all(isinstance(f, zmq.Frame) for f in frames)
        got, meta = decode(frames, spec=TensorSpec.from_arrays(arrays))
        assert got == big
        assert meta.nbytes == body.nbytes
        assert np.shares_memory(got.model.flat(), np.frombuffer(frames[2].buffer, np.uint8))
    finally:
        a.close(linger=0)
        b.close(linger=0)
        ctx.term()


# ---------------------------------------------------------------------------
# Fuzz: decode raises WireError and nothing else, for any input


def _random_plain(rng: random.Random, depth: int = 0) -> Any:
    choice = rng.randrange(12 if depth < 3 else 8)
    if choice == 0:
        return None
    if choice == 1:
        return rng.random() < 0.5
    if choice == 2:
        return rng.choice([0, 1, -1, 2**31, 2**63 - 1, 2**63, 2**64 - 1, -(2**63)])
    if choice == 3:
        return rng.choice([0.0, -1.5, float("nan"), float("inf"), 1e308])
    if choice == 4:
        return rng.choice(["", "x", "float32", "Task", "send", "é" * 3])
    if choice == 5:
        return rng.randbytes(rng.randrange(4))
    if choice == 6:
        return rng.choice([*WIRE_DTYPES, "complex64", "<f4"])
    if choice == 7:
        return [rng.choice(list(WIRE_DTYPES)), [rng.choice([0, 1, 3, 2**40, 2**63 - 1])
                                                for _ in range(rng.randrange(3))]]
    if choice in (8, 9, 10):
        return [_random_plain(rng, depth + 1) for _ in range(rng.randrange(6))]
    return {rng.choice(["a", "t", "client"]): _random_plain(rng, depth + 1)
            for _ in range(rng.randrange(3))}


def _unpack(frame: bytes) -> Any:
    try:
        return msgpack.unpackb(frame, strict_map_key=False)
    except Exception:
        return None


def _mutate(rng: random.Random, frames: list[bytes]) -> list[Any]:
    frames = list(frames)
    op = rng.randrange(10) if frames else 9
    i = rng.randrange(len(frames)) if frames else 0
    data = bytearray(frames[i] if frames else b"")
    if op == 0 and data:  # flip bits
        for _ in range(rng.randrange(1, 4)):
            j = rng.randrange(len(data))
            data[j] ^= 1 << rng.randrange(8)
        frames[i] = bytes(data)
    elif op == 1:  # truncate
        frames[i] = bytes(data[: rng.randrange(len(data) + 1)])
    elif op == 2:  # extend
        frames[i] = bytes(data) + rng.randbytes(rng.randrange(1, 9))
    elif op == 3:  # drop or duplicate a frame
        if rng.random() < 0.5:
            del frames[i]
        else:
            frames.insert(i, frames[i])
    elif op == 4 and len(frames) > 1:  # replace the header with random plain data
        frames[1] = msgpack.packb(_random_plain(rng), use_bin_type=True)
    elif op == 5:  # replace one header value with random plain data
        header = _unpack(frames[1]) if len(frames) > 1 else None
        if isinstance(header, list) and header:
            header[rng.randrange(len(header))] = _random_plain(rng)
            frames[1] = msgpack.packb(header, use_bin_type=True)
    elif op == 6:  # huge declared shapes
        header = _unpack(frames[1]) if len(frames) > 1 else None
        if isinstance(header, list) and header and isinstance(header[-1], list):
            header[-1] = [[rng.choice(list(WIRE_DTYPES)),
                           [rng.choice([2**31, 2**62, 2**63 - 1, 0]) for _ in range(3)]]]
            frames[1] = msgpack.packb(header)
    elif op == 7 and frames:  # another kind's envelope over this body
        frames[0] = msgpack.packb([SCHEMA_VERSION, rng.choice(list(KINDS)), 0.0, 0])
    elif op == 8:  # random bytes anywhere
        frames[i] = rng.randbytes(rng.randrange(40))
    else:  # random frame count of random bytes
        frames = [rng.randbytes(rng.randrange(12)) for _ in range(rng.randrange(14))]
    return frames


def test_fuzz_decode_raises_only_wire_error() -> None:
    rng = random.Random(20240601)
    seeds = [_as_bytes(encode(m, sent_at=1.0, seq=i)) for i, m in enumerate(MESSAGES)]
    outcomes: dict[str, int] = {}
    for case in range(4000):
        frames = _mutate(rng, rng.choice(seeds))
        if rng.random() < 0.3:
            frames = _mutate(rng, frames)
        spec = rng.choice([None, SPEC, GOOD_SPEC])
        try:
            msg, meta = decode(frames, spec=spec, max_bytes=1 << 20)
        except WireError as exc:
            outcomes[exc.reason] = outcomes.get(exc.reason, 0) + 1
        except Exception as exc:  # pragma: no cover - the failure this test looks for
            pytest.fail(f"case {case}: {type(exc).__name__}: {exc} for {frames!r:.300}")
        else:
            assert type(msg).__name__ == meta.kind
            # Whatever decoded re-encodes to a message that decodes equal.
            assert decode(encode(msg, sent_at=meta.sent_at, seq=meta.seq))[0] == msg
            outcomes["ok"] = outcomes.get("ok", 0) + 1
    # The loop reaches most checks, not just the first one.
    assert len(outcomes) >= 10, outcomes


def test_a_byte_payload_of_any_length_up_to_its_limit() -> None:
    """A Flower app's messages vary in size: a receiver expecting BytesUpTo(n) takes
    one uint8 buffer of at most n bytes, and refuses a longer one or another layout
    before reading its buffers."""
    from fedsim.wire.tensors import BytesUpTo

    limit = BytesUpTo(64)
    assert limit.nbytes == 64
    assert limit.repeated(1) is limit
    for n in (0, 1, 64):
        data = np.arange(n, dtype=np.uint8)
        msg = Task(client=1, task_id=2, version=3, round=0, work=None, tag='{"id":"x"}',
                   model=Model.from_flat(data, TensorSpec([("uint8", (n,))])))
        got, _ = decode(encode(msg), spec=limit, max_bytes=codec.max_message_bytes(limit))
        assert bytes(got.model.flat()) == bytes(data)
        assert got.tag == '{"id":"x"}'
    for bad in (TensorSpec([("uint8", (65,))]), TensorSpec([("float32", (4,))]),
                TensorSpec([("uint8", (2,)), ("uint8", (2,))])):
        msg = Task(client=1, task_id=2, version=3, round=0, work=None,
                   model=Model.from_flat(np.zeros(bad.counts[0], bad.dtypes[0]), bad)
                   if len(bad.entries) == 1 else Model.from_arrays(
                       [np.zeros(2, np.uint8), np.zeros(2, np.uint8)]))
        with pytest.raises(WireError, match="at most 64 bytes") as info:
            decode(encode(msg), spec=limit)
        assert info.value.reason == "shape_mismatch"
    with pytest.raises(ValueError, match="not repeated"):
        limit.repeated(2)
