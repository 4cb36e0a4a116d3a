"""Files of tensors and plain values that load without running code: checkpoints, client state.

A checkpoint (``checkpoint.pt``) and a client host's saved client state
(``fedsim clients --state``) hold an algorithm's ``state_dict``, the run's
counters and RNG states. Reading a pickle (``pickle.load``,
``torch.load(weights_only=False)``) runs whatever code the file names, so
whoever could write the run or state directory would run code in the
process that resumes. This format is JSON plus raw buffers: reading it
parses JSON and copies bytes into tensors, and nothing else. (Not
``torch.load(weights_only=True)``: that is still an unpickler, restricted
to an allow-list of globals that has had bypasses, and what a state holds
is plain enough to be checked field by field instead.)

Layout (integers little-endian)::

    magic    8 bytes      b"FEDSIMST"
    length   8 bytes      unsigned: the header's length in bytes
    header   length bytes UTF-8 JSON, padded with spaces to a multiple of 64
    data     the raw buffers, each at a multiple of 64 from the data's start

The header is ``{"format": 1, "kind": KIND, "value": V}``. ``V`` is the
saved value in JSON, where an object with a single key starting with ``$``
is one of these tagged values (any other object is a dict with string keys):

=================================================  =====================================
``{"$tensor": [dtype, shape, offset, nbytes]}``    a torch tensor (dense, on the CPU)
``{"$ndarray": [dtype, shape, offset, nbytes]}``   a numpy array (numbers or booleans)
``{"$bytes": [offset, nbytes]}``                   ``bytes``
``{"$floats": [offset, n]}``                       a list of ``n`` floats (float64 buffer)
``{"$ints": [offset, n]}``                         a list of ``n`` ints (int64 buffer)
``{"$tuple": [...]}``                              a tuple (its items: a list, or
                                                   ``$floats`` or ``$ints``)
``{"$dict": [[key, value], ...]}``                 a dict whose keys are not all plain
                                                   strings (client ids, versions)
``{"$float": "nan" | "inf" | "-inf"}``             a non-finite float
``{"$dtype": name}``                               a torch dtype
=================================================  =====================================

``dtype`` is a torch dtype's name (``"float32"``) or a numpy dtype string
(``"<i8"``); ``offset`` counts from the data's start. Long lists of floats
or ints go to buffers (a checkpoint's samples of durations and stalenesses:
JSON's decimal floats cost ten times more to write). A value of any other
type is refused when the file is written, naming where it sits
(``strategy.rule.history``), so a ``state_dict`` that would not come back
fails at the first checkpoint, not at the resume.

On reading, every offset, length, shape and dtype is checked against the
file; a pickle (the formats before this one: a checkpoint of format 1 or 2,
a client state file of an earlier fedsim) is refused unread with
:class:`LegacyStateFile`, which says what to do.
"""

from __future__ import annotations

import functools
import json
import math
import os
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fedsim.lazy import lazy_module

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch")   # read_header (a resume's first check) needs none

__all__ = ["FORMAT", "Encoded", "LegacyStateFile", "StateFileError", "encode", "load",
           "loads", "read_header", "save", "torch_dtypes"]

#: The container's version (``"format"`` in the header).
FORMAT = 1
MAGIC = b"FEDSIMST"
_ALIGN = 64
#: lists of at least this many floats (or ints) are stored as a buffer
_LIST_BUFFER = 16



@functools.cache
def torch_dtypes() -> dict[str, torch.dtype]:
    """The torch dtypes a file may hold, by name."""
    return {str(d).removeprefix("torch."): d for d in (
        torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64,
        torch.complex128, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8,
        torch.bool)}

_INT64 = (-(2**63), 2**63 - 1)


class StateFileError(ValueError):
    """A file that is not a state file of this format, or one whose contents do not hold."""


class LegacyStateFile(StateFileError):
    """A pickle: a checkpoint or client state file of an older fedsim, refused unread."""


# -- writing --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Encoded:
    """A value taken apart for writing: its JSON tree and the buffers it points into.

    The buffers are copies (or immutable ``bytes``) made by :func:`encode`,
    so the value may change afterwards; :meth:`chunks` (the JSON text and
    padding) can run on another thread.
    """

    kind: str
    tree: Any
    buffers: tuple[memoryview, ...]

    def chunks(self) -> Iterator[bytes | memoryview]:
        """The file's bytes, in order (write them one after the other)."""
        text = json.dumps({"format": FORMAT, "kind": self.kind, "value": self.tree},
                          separators=(",", ":"), allow_nan=False).encode()
        text += b" " * (-(len(MAGIC) + 8 + len(text)) % _ALIGN)
        yield MAGIC + struct.pack("<Q", len(text))
        yield text
        for buf in self.buffers:
            yield buf
            pad = -buf.nbytes % _ALIGN
            if pad:
                yield bytes(pad)

    def to_bytes(self) -> bytes:
        """The whole file as one ``bytes``."""
        return b"".join(self.chunks())


class _Writer:
    def __init__(self) -> None:
        self.buffers: list[memoryview] = []
        self.offset = 0

    def add(self, buf: memoryview) -> int:
        at = self.offset
        self.buffers.append(buf)
        self.offset += buf.nbytes + (-buf.nbytes % _ALIGN)
        return at

    def value(self, x: Any, where: str) -> Any:
        # the order of the checks: bool before int (a bool is an int), exact
        # containers before their subclasses' fallbacks
        if x is None or isinstance(x, bool | str):
            return x
        if isinstance(x, int):
            return int(x)
        if isinstance(x, float):
            x = float(x)
            return x if math.isfinite(x) else {"$float": repr(x)}
        if isinstance(x, dict):
            if all(isinstance(k, str) and not k.startswith("$") for k in x):
                return {k: self.value(v, f"{where}.{k}") for k, v in x.items()}
            return {"$dict": [[self.key(k, where), self.value(v, f"{where}[{k!r}]")]
                              for k, v in x.items()]}
        if isinstance(x, list):
            packed = self.numbers(x)
            if packed is not None:
                return packed
            return [self.value(v, f"{where}[{i}]") for i, v in enumerate(x)]
        if isinstance(x, tuple):
            packed = self.numbers(x)
            return {"$tuple": packed if packed is not None else
                    [self.value(v, f"{where}[{i}]") for i, v in enumerate(x)]}
        if isinstance(x, bytes):
            return {"$bytes": [self.add(memoryview(x)), len(x)]}
        if isinstance(x, torch.Tensor):
            return {"$tensor": self.tensor(x, where)}
        if isinstance(x, torch.dtype):
            name = str(x).removeprefix("torch.")
            if name not in torch_dtypes():
                raise TypeError(f"{where}: a torch dtype {name} cannot be saved")
            return {"$dtype": name}
        if isinstance(x, np.ndarray):
            return {"$ndarray": self.array(x, where)}
        if isinstance(x, np.generic) and x.dtype.kind in "biuf":
            return self.value(x.item(), where)
        raise TypeError(f"{where}: a {type(x).__module__}.{type(x).__qualname__} cannot be "
                        "saved (a state holds tensors, arrays, bytes, numbers, strings, "
                        "None, and lists, tuples and dicts of them)")

    def key(self, k: Any, where: str) -> Any:
        if k is None or isinstance(k, bool | int | float | str):
            return self.value(k, where)
        if isinstance(k, tuple):
            return {"$tuple": [self.key(v, where) for v in k]}
        if isinstance(k, np.generic) and k.dtype.kind in "biuf":
            return self.value(k.item(), where)
        raise TypeError(f"{where}: a dict key {type(k).__qualname__} cannot be saved "
                        "(keys are numbers, strings, None or tuples of them)")

    def numbers(self, xs: list[Any] | tuple[Any, ...]) -> dict[str, list[int]] | None:
        """A long list of plain floats, or of int64 ints, as a buffer (None: not one)."""
        if len(xs) < _LIST_BUFFER:
            return None
        types = set(map(type, xs))
        if types == {float}:
            a = np.array(xs, dtype="<f8")
            return {"$floats": [self.add(_raw(a)), len(xs)]}
        if types == {int}:
            try:
                a = np.array(xs, dtype="<i8")
            except OverflowError:
                return None
            return {"$ints": [self.add(_raw(a)), len(xs)]}
        return None

    def tensor(self, t: torch.Tensor, where: str) -> list[Any]:
        name = str(t.dtype).removeprefix("torch.")
        if name not in torch_dtypes() or t.layout != torch.strided or t.is_quantized:
            raise TypeError(f"{where}: a {t.layout} tensor of {t.dtype} cannot be saved")
        flat = t.detach().to("cpu", copy=True).contiguous()   # a copy: the value may change
        raw = flat.reshape(-1).view(torch.uint8) if flat.numel() else torch.empty(
            0, dtype=torch.uint8)
        buf = _raw(raw.numpy())
        return [name, list(flat.shape), self.add(buf), buf.nbytes]

    def array(self, a: np.ndarray[Any, Any], where: str) -> list[Any]:
        if a.dtype.kind not in "biufc" or a.dtype.fields is not None:
            raise TypeError(f"{where}: an array of {a.dtype} cannot be saved")
        c = np.array(a, copy=True, order="C")
        buf = _raw(c)
        return [c.dtype.str, list(c.shape), self.add(buf), buf.nbytes]


def _raw(a: np.ndarray[Any, Any]) -> memoryview:
    """A C-contiguous array's bytes, as a flat byte view (no copy)."""
    return a.reshape(-1).view(np.uint8).data


def encode(value: Any, kind: str) -> Encoded:
    """Take ``value`` apart for writing (tensors and arrays are copied now).

    Raises TypeError naming where a value of a type the format does not hold sits.
    """
    w = _Writer()
    tree = w.value(value, kind)
    return Encoded(kind, tree, tuple(w.buffers))


def save(path: str | os.PathLike[str], value: Any, kind: str) -> None:
    """Write ``value`` to ``path`` atomically (a temporary file, fsync, rename)."""
    write_atomically(Path(path), encode(value, kind).chunks())


def write_atomically(path: Path, chunks: Iterator[bytes | memoryview] | bytes) -> None:
    """``chunks`` as ``path``, whole or not at all; on a failure the old file stays."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        if isinstance(chunks, bytes):
            fh.write(chunks)
        else:
            for c in chunks:
                fh.write(c)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


# -- reading --------------------------------------------------------------------------


def load(path: str | os.PathLike[str], kind: str, what_to_do: str = "") -> Any:
    """The value saved in ``path`` as ``kind``.

    Raises :class:`LegacyStateFile` for a pickle (an older fedsim's file; the
    message names the file, says why it is not read and adds ``what_to_do``),
    :class:`StateFileError` for anything else that is not a valid file of
    this format, OSError if it cannot be read.
    """
    with open(path, "rb") as fh:
        data = fh.read()
    return loads(data, kind, name=str(path), what_to_do=what_to_do)


def read_header(path: str | os.PathLike[str], kind: str, what_to_do: str = "") -> Any:
    """The header's value of the state file ``path`` (its tensors, arrays, bytes and
    number lists left as their tags), checked as :func:`load` checks it: a cheap first
    look, without torch, at a file that may be large."""
    with open(path, "rb") as fh:
        head = fh.read(len(MAGIC) + 8)
        length = struct.unpack_from("<Q", head, len(MAGIC))[0] if len(head) == 16 else 0
        if head.startswith(MAGIC):
            head += fh.read(min(length, 1 << 30))
    return _header(head, kind, str(path), what_to_do)[0]["value"]


def loads(data: bytes, kind: str, name: str = "the state", what_to_do: str = "") -> Any:
    """The value of a state file's bytes (see :func:`load`)."""
    header, end = _header(data, kind, name, what_to_do)
    reader = _Reader(memoryview(data)[end:], name)
    try:
        return reader.value(header["value"])
    except RecursionError:
        raise StateFileError(f"{name}: the value is nested too deeply") from None


def _header(data: bytes, kind: str, name: str, what_to_do: str) -> tuple[dict[str, Any], int]:
    """A state file's header, checked, and where its data begins."""
    if not data.startswith(MAGIC):
        if data[:1] == b"\x80" or data[:4] == b"PK\x03\x04":
            raise LegacyStateFile(
                f"{name} is a pickle (the format of an older fedsim); it is not loaded, "
                "because loading a pickle can run any code its writer put in it"
                + (f". {what_to_do}" if what_to_do else ""))
        raise StateFileError(f"{name} is not a fedsim state file (it does not start with "
                             f"{MAGIC.decode()})")
    if len(data) < len(MAGIC) + 8:
        raise StateFileError(f"{name} is cut short (no header)")
    (length,) = struct.unpack_from("<Q", data, len(MAGIC))
    start = len(MAGIC) + 8
    if length > len(data) - start:
        raise StateFileError(f"{name} is cut short (a header of {length} bytes, "
                             f"{len(data) - start} in the file)")
    try:
        header = json.loads(data[start:start + length].decode("utf-8"),
                            parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise StateFileError(f"{name}: the header is not valid JSON: {exc}") from None
    if not isinstance(header, dict) or set(header) != {"format", "kind", "value"}:
        raise StateFileError(f"{name}: the header is not a state file's")
    if header["format"] != FORMAT:
        raise StateFileError(f"{name} is of state file format {header['format']!r}; this "
                             f"fedsim reads format {FORMAT}")
    if header["kind"] != kind:
        raise StateFileError(f"{name} holds {header['kind']!r}, not {kind!r}")
    return header, start + length


def _no_constant(word: str) -> Any:
    raise ValueError(f"{word} is not JSON")


class _Reader:
    def __init__(self, data: memoryview, name: str) -> None:
        self.data = data
        self.name = name
        self.decoders: dict[str, Callable[[Any], Any]] = {
            "$tensor": self.tensor, "$ndarray": self.array, "$bytes": self.bytes_,
            "$floats": self.floats, "$ints": self.ints, "$tuple": self.tuple_,
            "$dict": self.dict_, "$float": self.float_, "$dtype": self.dtype}

    def bad(self, why: str) -> StateFileError:
        return StateFileError(f"{self.name}: {why}")

    def value(self, v: Any) -> Any:
        if isinstance(v, list):
            return [self.value(x) for x in v]
        if isinstance(v, dict):
            if len(v) == 1:
                (tag, body), = v.items()
                if tag.startswith("$"):
                    decoder = self.decoders.get(tag)
                    if decoder is None:
                        raise self.bad(f"unknown tag {tag[:40]!r}")
                    return decoder(body)
            if any(k.startswith("$") for k in v):
                raise self.bad("a tag among other keys")
            return {k: self.value(x) for k, x in v.items()}
        return v   # None, bool, int, float, str: json.loads made nothing else

    def span(self, offset: Any, nbytes: Any) -> memoryview:
        if not (_is_int(offset) and _is_int(nbytes) and offset >= 0 and nbytes >= 0
                and offset % _ALIGN == 0 and offset + nbytes <= self.data.nbytes):
            raise self.bad(f"a buffer at {offset!r} of {nbytes!r} bytes is outside the data "
                           f"({self.data.nbytes} bytes)")
        return self.data[offset:offset + nbytes]

    def shaped(self, body: Any, tag: str) -> tuple[Any, tuple[int, ...], memoryview]:
        if not (isinstance(body, list) and len(body) == 4 and isinstance(body[1], list)
                and all(_is_int(n) and n >= 0 for n in body[1])):
            raise self.bad(f"a malformed {tag}")
        shape = tuple(body[1])
        return body[0], shape, self.span(body[2], body[3])

    def tensor(self, body: Any) -> torch.Tensor:
        name, shape, buf = self.shaped(body, "$tensor")
        dtype = torch_dtypes().get(name) if isinstance(name, str) else None
        if dtype is None:
            raise self.bad(f"a tensor of an unknown dtype {str(name)[:40]!r}")
        size = torch.empty((), dtype=dtype).element_size()
        if buf.nbytes != math.prod(shape) * size:
            raise self.bad(f"a {name} tensor of shape {list(shape)} in {buf.nbytes} bytes")
        if not buf.nbytes:
            return torch.empty(shape, dtype=dtype)
        return torch.frombuffer(bytearray(buf), dtype=dtype).reshape(shape)

    def array(self, body: Any) -> np.ndarray[Any, Any]:
        name, shape, buf = self.shaped(body, "$ndarray")
        try:
            dtype = np.dtype(name) if isinstance(name, str) and len(name) <= 8 else None
        except TypeError:
            dtype = None
        if dtype is None or dtype.kind not in "biufc" or dtype.fields is not None:
            raise self.bad(f"an array of an unknown dtype {str(name)[:40]!r}")
        if buf.nbytes != math.prod(shape) * dtype.itemsize:
            raise self.bad(f"a {name} array of shape {list(shape)} in {buf.nbytes} bytes")
        return np.frombuffer(bytes(buf), dtype=dtype).reshape(shape).copy()

    def bytes_(self, body: Any) -> bytes:
        if not (isinstance(body, list) and len(body) == 2):
            raise self.bad("a malformed $bytes")
        return bytes(self.span(body[0], body[1]))

    def numbers(self, body: Any, tag: str, dtype: str) -> list[Any]:
        if not (isinstance(body, list) and len(body) == 2 and _is_int(body[1])
                and body[1] >= 0):
            raise self.bad(f"a malformed {tag}")
        buf = self.span(body[0], 8 * body[1])
        out: list[Any] = np.frombuffer(buf, dtype=dtype).tolist()
        return out

    def floats(self, body: Any) -> list[float]:
        return self.numbers(body, "$floats", "<f8")

    def ints(self, body: Any) -> list[int]:
        return self.numbers(body, "$ints", "<i8")

    def tuple_(self, body: Any) -> tuple[Any, ...]:
        items = self.value(body)   # a JSON list, or a buffer of numbers
        if not isinstance(items, list):
            raise self.bad("a malformed $tuple")
        return tuple(items)

    def dict_(self, body: Any) -> dict[Any, Any]:
        if not (isinstance(body, list) and all(isinstance(p, list) and len(p) == 2
                                               for p in body)):
            raise self.bad("a malformed $dict")
        out: dict[Any, Any] = {}
        for k, v in body:
            key, val = self.value(k), self.value(v)
            try:
                out[key] = val
            except TypeError:   # unhashable
                raise self.bad(f"a dict key of type {type(key).__name__}") from None
        return out

    def float_(self, body: Any) -> float:
        if body not in ("nan", "inf", "-inf"):
            raise self.bad(f"a malformed $float {str(body)[:40]!r}")
        return float(body)

    def dtype(self, body: Any) -> torch.dtype:
        dtype = torch_dtypes().get(body) if isinstance(body, str) else None
        if dtype is None:
            raise self.bad(f"an unknown torch dtype {str(body)[:40]!r}")
        return dtype


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and _INT64[0] <= x <= _INT64[1]
