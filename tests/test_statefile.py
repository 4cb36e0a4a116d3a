"""fedsim.wire.statefile: every value a state holds comes back exactly; a bad file is refused."""

from __future__ import annotations

import json
import math
import pickle
import random
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from fedsim.wire import statefile
from fedsim.wire.statefile import LegacyStateFile, StateFileError


def _round_trip(value: object, kind: str = "k") -> object:
    return statefile.loads(statefile.encode(value, kind).to_bytes(), kind)


def _enc(value: object) -> bytes:
    return statefile.encode(value, "k").to_bytes()


VALUES = {
    "scalars": {"a": None, "b": True, "c": -3, "d": 2**70, "e": 0.1, "f": "text"},
    "non_finite": [math.inf, -math.inf],
    "int_keys": {3: "x", -1: [1, 2], 2**40: None},
    "mixed_keys": {"a": 1, 2: 2, (1, "b"): 3, None: 4, 1.5: 5, True: 6},
    "dollar_key": {"$tensor": 1, "plain": 2},
    "tuples": (1, (2.5, "x"), ()),
    "bytes": b"\x00\x01\xff" * 7,
    "long_floats": [i / 7 for i in range(100)],
    "long_ints": list(range(-50, 50)),
    "huge_ints": [2**63] * 20,   # beyond int64: stays JSON
    "mixed_list": [1, 1.0, True] * 10,   # not one type: stays JSON, types kept
    "rng": random.Random(5).getstate(),
    "nested": {"x": [{"y": (1, {"z": b"q"})}]},
    "empty": {"l": [], "d": {}, "t": (), "b": b""},
}


@pytest.mark.parametrize("name", sorted(VALUES))
def test_plain_values_come_back_equal_with_their_types(name: str) -> None:
    value = VALUES[name]
    back = _round_trip(value)
    assert back == value
    assert _enc(back) == _enc(value)   # types too: a tuple stays a tuple, 3 is not "3"


def test_nan_comes_back() -> None:
    (x,) = _round_trip([math.nan])
    assert math.isnan(x)
    xs = _round_trip([math.nan] * 20)
    assert all(math.isnan(v) for v in xs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16,
                                   torch.int64, torch.int8, torch.uint8, torch.bool,
                                   torch.complex64])
@pytest.mark.parametrize("shape", [(), (0,), (5,), (2, 3), (0, 4)])
def test_tensors_come_back_bit_for_bit(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    t = (torch.randn(shape, generator=torch.Generator().manual_seed(1)) * 50).to(dtype)
    back = _round_trip({"t": t, "dtype": dtype})
    assert back["dtype"] is dtype
    got = back["t"]
    assert got.dtype == dtype
    assert got.shape == t.shape
    assert torch.equal(got.view(-1).view(torch.uint8) if got.numel() else got,
                       t.reshape(-1).view(torch.uint8) if t.numel() else t)


def test_a_tensor_is_copied_when_encoded_and_owned_when_decoded() -> None:
    t = torch.arange(4.0)
    view = t[::2]   # not contiguous, shares storage
    enc = statefile.encode({"t": t, "v": view}, "k")
    t.add_(100)   # after the snapshot: not in the file
    back = statefile.loads(enc.to_bytes(), "k")
    assert back["t"].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert back["v"].tolist() == [0.0, 2.0]
    back["t"].add_(1)   # writable, and its own memory
    assert back["v"].tolist() == [0.0, 2.0]


def test_arrays_and_numpy_scalars() -> None:
    a = np.arange(12, dtype=np.int32).reshape(3, 4)[:, 1:3]
    back = _round_trip({"a": a, "b": np.array([True, False]), "s": np.float32(1.5),
                        "i": np.int64(7)})
    assert back["a"].dtype == np.int32
    assert (back["a"] == a).all()
    assert back["b"].tolist() == [True, False]
    assert back["s"] == 1.5
    assert type(back["s"]) is float
    assert back["i"] == 7
    assert type(back["i"]) is int


def test_torch_optimizer_and_rng_states() -> None:
    x = torch.zeros(3, requires_grad=True)
    opt = torch.optim.Adam([x], lr=0.1, betas=(0.8, 0.9))
    x.sum().backward()
    opt.step()
    state = {"opt": opt.state_dict(), "rng": torch.get_rng_state()}
    back = _round_trip(state)
    assert _enc(back) == _enc(state)
    assert back["opt"]["param_groups"][0]["betas"] == (0.8, 0.9)


class _Thing:
    pass


@pytest.mark.parametrize(("value", "where"), [
    ({"a": {"b": [1, _Thing()]}}, r"k\.a\.b\[1\]: a .*_Thing cannot be saved"),
    ({"s": {1, 2}}, r"k\.s: a builtins\.set cannot be saved"),
    ({"k": {frozenset(): 1}}, r"a dict key frozenset cannot be saved"),
    ({"a": np.array(["x"], dtype=object)}, r"k\.a: an array of object cannot be saved"),
    ({"t": torch.zeros(2).to_sparse()}, r"k\.t: a torch\.sparse_coo tensor"),
])
def test_a_value_the_format_cannot_hold_is_refused_when_written(value: object,
                                                                where: str) -> None:
    with pytest.raises(TypeError, match=where):
        statefile.encode(value, "k")


def test_save_and_load_a_file(tmp_path: Path) -> None:
    path = tmp_path / "s.pt"
    statefile.save(path, {"x": torch.ones(3)}, "client-state")
    assert torch.equal(statefile.load(path, "client-state")["x"], torch.ones(3))
    assert not (tmp_path / "s.pt.tmp").exists()
    with pytest.raises(StateFileError, match="holds 'client-state', not 'checkpoint'"):
        statefile.load(path, "checkpoint")


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        return (Path.touch, (self.marker,))


@pytest.mark.parametrize("writer", ["pickle-2", "pickle-5", "torch.save", "torch.save-legacy"])
def test_a_pickle_is_refused_unread(tmp_path: Path, writer: str) -> None:
    marker = tmp_path / "code-ran"
    path = tmp_path / "state.pt"
    value = {"x": _Payload(marker)}
    if writer.startswith("pickle"):
        path.write_bytes(pickle.dumps(value, protocol=int(writer[-1])))
    else:
        torch.save(value, path, _use_new_zipfile_serialization=writer == "torch.save")
    with pytest.raises(LegacyStateFile, match=r"state\.pt is a pickle .* can run any code"
                       r".*\. Do this\.$"):
        statefile.load(path, "k", what_to_do="Do this.")
    assert not marker.exists()


def _file(header: object, data: bytes = b"", raw: bytes | None = None) -> bytes:
    text = raw if raw is not None else json.dumps(header).encode()
    text += b" " * (-(16 + len(text)) % 64)
    return b"FEDSIMST" + struct.pack("<Q", len(text)) + text + data


def _h(value: object) -> dict[str, object]:
    return {"format": 1, "kind": "k", "value": value}


@pytest.mark.parametrize(("data", "why"), [
    (b"", "not a fedsim state file"),
    (b"garbage", "not a fedsim state file"),
    (b"FEDSIMST\x01", "cut short"),
    (b"FEDSIMST" + struct.pack("<Q", 10**9) + b"{}", "cut short"),
    (_file(None, raw=b"{not json"), "not valid JSON"),
    (_file(None, raw=b'{"format": 1, "kind": "k", "value": NaN}'), "not valid JSON"),
    (_file(None, raw=b"\xff\xfe"), "not valid JSON"),
    (_file([1, 2]), "not a state file's"),
    (_file({"format": 1, "kind": "k"}), "not a state file's"),
    (_file({"format": 2, "kind": "k", "value": 1}), "state file format 2"),
    (_file(_h({"$tensor": ["float32", [2], 0, 8]})), "outside the data"),
    (_file(_h({"$tensor": ["float32", [3], 0, 8]}), bytes(64)), "in 8 bytes"),
    (_file(_h({"$tensor": ["float32", [2], 4, 8]}), bytes(64)), "outside the data"),
    (_file(_h({"$tensor": ["float32", [2], -64, 8]}), bytes(64)), "outside the data"),
    (_file(_h({"$tensor": ["float32", [-2], 0, 8]}), bytes(64)), "malformed"),
    (_file(_h({"$tensor": ["object", [2], 0, 8]}), bytes(64)), "unknown dtype"),
    (_file(_h({"$tensor": ["float32", [2], 0]}), bytes(64)), "malformed"),
    (_file(_h({"$ndarray": ["|O", [1], 0, 8]}), bytes(64)), "unknown dtype"),
    (_file(_h({"$ndarray": ["[('a', '<i4')]", [1], 0, 4]}), bytes(64)), "unknown dtype"),
    (_file(_h({"$ndarray": ["V8", [1], 0, 8]}), bytes(64)), "unknown dtype"),
    (_file(_h({"$bytes": [0, 65]}), bytes(64)), "outside the data"),
    (_file(_h({"$floats": [0, 9]}), bytes(64)), "outside the data"),
    (_file(_h({"$ints": [0, True]}), bytes(64)), "malformed"),
    (_file(_h({"$dtype": "Tensor"})), "unknown torch dtype"),
    (_file(_h({"$float": "1e400"})), "malformed"),
    (_file(_h({"$reduce": ["os.system", "touch x"]})), "unknown tag"),
    (_file(_h({"$tuple": 3})), "malformed"),
    (_file(_h({"$dict": [[[1], 2]]})), "dict key of type list"),
    (_file(_h({"$dict": [[1]]})), "malformed"),
    (_file(_h({"$tensor": ["float32", [1], 0, 4], "x": 1})), "a tag among other keys"),
    (_file(None, raw=b'{"format":1,"kind":"k","value":' + b"[" * 100_000 + b"]" * 100_000
           + b"}"), "nested too deeply|not valid JSON"),
    (_file(None, raw=b'{"format":1,"kind":"k","value":' + b'{"$tuple":' * 5_000 + b"[]"
           + b"}" * 5_000 + b"}"), "nested too deeply|not valid JSON"),
])
def test_a_malformed_file_is_refused_with_the_reason(data: bytes, why: str) -> None:
    with pytest.raises(StateFileError, match=why) as err:
        statefile.loads(data, "k", name="FILE")
    assert str(err.value).startswith("FILE")
