"""CIFAR-10 "python version" batches (Krizhevsky 2009, https://www.cs.toronto.edu/~kriz/cifar.html).

The official archive unpacks to ``cifar-10-batches-py/`` holding
``data_batch_1`` ... ``data_batch_5`` and ``test_batch``: Python 2 pickles of
dicts with ``b'data'`` (uint8, ``(10000, 3072)``, channel-major 32x32) and
``b'labels'`` (a list of ints).

Pickle is the file format, so these files must be unpickled; to keep that
safe, :class:`_BatchUnpickler` resolves only the handful of globals that a
numpy array needs (``numpy.core.multiarray._reconstruct`` or its numpy 2
spelling, ``numpy.ndarray``, ``numpy.dtype``, the protocol-5
``_frombuffer``, numpy scalars) and ``_codecs.encode`` (how Python 3 writes
bytes under protocol 2). Any other global, the usual vehicle for code
execution, raises ``pickle.UnpicklingError``, and the loaded arrays must be
plain uint8 data. The old ``numpy.core`` names are mapped to the functions
themselves, without importing the deprecated module.
"""

from __future__ import annotations

import codecs
import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["load_cifar10", "load_cifar_batch"]

_RECONSTRUCT = np.array(0).__reduce__()[0]
_FROMBUFFER = np.arange(1).__reduce_ex__(5)[0]
_SCALAR = np.int64(0).__reduce__()[0]
_ALLOWED: dict[tuple[str, str], Any] = {
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    ("_codecs", "encode"): codecs.encode,
}
for _mod in ("numpy.core", "numpy._core"):
    _ALLOWED[(f"{_mod}.multiarray", "_reconstruct")] = _RECONSTRUCT
    _ALLOWED[(f"{_mod}.multiarray", "scalar")] = _SCALAR
    _ALLOWED[(f"{_mod}.numeric", "_frombuffer")] = _FROMBUFFER

_TRAIN = tuple(f"data_batch_{i}" for i in range(1, 6))
_TEST = "test_batch"
_SIDE = 32


class _BatchUnpickler(pickle.Unpickler):
    """An unpickler that can rebuild numpy arrays and nothing else."""

    def find_class(self, module: str, name: str) -> Any:
        try:
            return _ALLOWED[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(
                f"Refusing to load global {module}.{name} from a CIFAR batch: "
                "only numpy array reconstruction is allowed"
            ) from None


def _get(batch: dict[Any, Any], key: str) -> Any:
    for k in (key.encode(), key):
        if k in batch:
            return batch[k]
    raise ValueError(f"Invalid CIFAR batch: no {key!r} entry")


def load_cifar_batch(path: str | os.PathLike[str]) -> tuple[np.ndarray, np.ndarray]:
    """Read one CIFAR-10 batch file with the restricted unpickler.

    Returns
    -------
    tuple of numpy.ndarray
        uint8 images ``(n, 3, 32, 32)`` and int64 labels ``(n,)``.
    """
    path = Path(path)
    with path.open("rb") as fh:
        try:
            batch = _BatchUnpickler(fh, encoding="bytes").load()
        except (EOFError, ValueError, TypeError) as exc:
            raise ValueError(f"Invalid CIFAR batch {path}: {exc}") from None
    if not isinstance(batch, dict):
        raise ValueError(f"Invalid CIFAR batch {path}: not a dict")
    data = np.asarray(_get(batch, "data"))
    labels = np.asarray(_get(batch, "labels"))
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * _SIDE * _SIDE:
        raise ValueError(
            f"Invalid CIFAR batch {path}: data must be uint8 (n, 3072), got "
            f"{data.dtype} {data.shape}"
        )
    if labels.ndim != 1 or labels.shape[0] != data.shape[0]:
        raise ValueError(
            f"Invalid CIFAR batch {path}: {labels.shape} labels for "
            f"{data.shape[0]} images"
        )
    if not np.issubdtype(labels.dtype, np.integer) or (
        labels.size and (labels.min() < 0 or labels.max() > 9)
    ):
        raise ValueError(f"Invalid CIFAR batch {path}: labels must be integers 0..9")
    return data.reshape(-1, 3, _SIDE, _SIDE), labels.astype(np.int64)


def load_cifar10(
    path: str | os.PathLike[str],
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Load CIFAR-10's five training batches and its test batch.

    Parameters
    ----------
    path : str or os.PathLike
        The ``cifar-10-batches-py`` directory, or a directory containing it.

    Returns
    -------
    tuple of numpy.ndarray
        ``(train_images, train_labels, test_images, test_labels)``: uint8
        ``(n, 3, 32, 32)`` images and int64 labels.
    """
    root = Path(path)
    if not (root / _TEST).is_file() and (root / "cifar-10-batches-py").is_dir():
        root = root / "cifar-10-batches-py"
    missing = [n for n in (*_TRAIN, _TEST) if not (root / n).is_file()]
    if missing:
        raise FileNotFoundError(
            f"CIFAR-10 batches missing under {root}: {', '.join(missing)}"
        )
    parts = [load_cifar_batch(root / n) for n in _TRAIN]
    x_test, y_test = load_cifar_batch(root / _TEST)
    x_train = np.concatenate([p[0] for p in parts])
    y_train = np.concatenate([p[1] for p in parts])
    return x_train, y_train, x_test, y_test
