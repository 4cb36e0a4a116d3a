"""MNIST in its original IDX files (LeCun et al., http://yann.lecun.com/exdb/mnist/).

IDX layout: two zero bytes, a type code, the number of dimensions ``k``, then
``k`` big-endian uint32 sizes, then the data in big-endian C order. Files may
be gzip-compressed (detected from the gzip magic bytes, not the suffix).

:func:`load_mnist` looks in a directory (and in its ``raw/`` subdirectory,
torchvision's layout) for::

    train-images-idx3-ubyte  train-labels-idx1-ubyte
    t10k-images-idx3-ubyte   t10k-labels-idx1-ubyte

each optionally with ``.gz``; the dotted spelling ``train-images.idx3-ubyte``
is accepted too. Fashion-MNIST ships under the same names and loads the same
way. Nothing is ever downloaded.
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np

__all__ = ["load_mnist", "read_idx"]

_IDX_TYPES: dict[int, str] = {
    0x08: "u1",
    0x09: "i1",
    0x0B: ">i2",
    0x0C: ">i4",
    0x0D: ">f4",
    0x0E: ">f8",
}
_GZIP_MAGIC = b"\x1f\x8b"


def read_idx(path: str | os.PathLike[str]) -> np.ndarray:
    """Read one IDX file (plain or gzip) into an array of its own dtype.

    Raises
    ------
    ValueError
        If the header is malformed or the payload size does not match it.
    """
    path = Path(path)
    raw = path.read_bytes()
    if raw[:2] == _GZIP_MAGIC:
        raw = gzip.decompress(raw)
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise ValueError(f"Invalid IDX file {path}: bad magic number")
    code, ndim = raw[2], raw[3]
    if code not in _IDX_TYPES:
        raise ValueError(f"Invalid IDX file {path}: unknown type code 0x{code:02x}")
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise ValueError(f"Invalid IDX file {path}: truncated header")
    shape = tuple(int(s) for s in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    dtype = np.dtype(_IDX_TYPES[code])
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(raw) - header != expected:
        raise ValueError(
            f"Invalid IDX file {path}: header shape {shape} needs {expected} bytes, "
            f"found {len(raw) - header}"
        )
    data = np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape)
    return data.astype(dtype.newbyteorder("="))


def _find(root: Path, split: str, kind: str, ndim: int) -> Path:
    names = [f"{split}-{kind}-idx{ndim}-ubyte", f"{split}-{kind}.idx{ndim}-ubyte"]
    tried: list[str] = []
    for folder in (root, root / "raw"):
        for name in names:
            for suffix in ("", ".gz"):
                candidate = folder / (name + suffix)
                if candidate.is_file():
                    return candidate
                tried.append(str(candidate))
    raise FileNotFoundError(
        f"MNIST file {names[0]}[.gz] not found under {root} (tried {', '.join(tried)})"
    )


def _split(root: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    images = read_idx(_find(root, split, "images", 3))
    labels = read_idx(_find(root, split, "labels", 1))
    if images.ndim != 3 or labels.ndim != 1 or images.shape[0] != labels.shape[0]:
        raise ValueError(
            f"Invalid MNIST {split} split under {root}: images {images.shape}, "
            f"labels {labels.shape}"
        )
    return images.astype(np.uint8), labels.astype(np.int64)


def load_mnist(
    path: str | os.PathLike[str],
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Load MNIST's train and test (``t10k``) splits from IDX files.

    Parameters
    ----------
    path : str or os.PathLike
        Directory holding the four IDX files (or a ``raw/`` subdirectory).

    Returns
    -------
    tuple of numpy.ndarray
        ``(train_images, train_labels, test_images, test_labels)``; images
        are uint8 ``(n, 28, 28)`` (or whatever size the files hold), labels
        int64.
    """
    root = Path(path)
    if not root.is_dir():
        raise FileNotFoundError(f"MNIST path {root} is not a directory")
    x_train, y_train = _split(root, "train")
    x_test, y_test = _split(root, "t10k")
    return x_train, y_train, x_test, y_test
