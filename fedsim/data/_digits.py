"""scikit-learn's bundled handwritten digits (UCI Optical Recognition of Digits).

1,797 8x8 grayscale images of the digits 0-9 with pixel values 0..16, shipped
inside scikit-learn (``sklearn.datasets.load_digits``), so no download is
ever needed. Scaled here to [0, 1] by dividing by 16.

The file is read where scikit-learn keeps it (``datasets/data/digits.csv.gz``:
64 pixel columns and the label, what ``load_digits`` reads), found without
importing scikit-learn: importing it (and the scipy.stats it pulls in) cost
every run on digits 1.1-2.1 s of CPU before its federation could start, 28 ms
for the file (2026-11-29). Where the file is not there (another scikit-learn
layout), ``load_digits`` reads it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

__all__ = ["load_digits_arrays"]

_MAX_PIXEL = 16.0
_PIXELS = 64


def _bundled_file() -> Path | None:
    """scikit-learn's digits.csv.gz, located without importing scikit-learn."""
    try:
        spec = importlib.util.find_spec("sklearn")
    except (ImportError, ValueError):
        return None
    for where in (spec.submodule_search_locations or []) if spec else []:
        path = Path(where) / "datasets" / "data" / "digits.csv.gz"
        if path.is_file():
            return path
    return None


def _images_and_labels() -> tuple[np.ndarray, np.ndarray]:
    path = _bundled_file()
    if path is not None:
        table = np.loadtxt(path, delimiter=",", dtype=np.float64)
        if table.ndim == 2 and table.shape[1] == _PIXELS + 1:
            return table[:, :_PIXELS].reshape(-1, 8, 8), table[:, _PIXELS].astype(np.int64)
    from sklearn.datasets import load_digits  # type: ignore[import-untyped]  # lazy: 1-2 s

    bunch = load_digits()
    return np.asarray(bunch.images, dtype=np.float64), np.asarray(bunch.target, dtype=np.int64)


def load_digits_arrays(*, flatten: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Load the bundled digits as float32 features in [0, 1] and int64 labels.

    Parameters
    ----------
    flatten : bool
        ``True`` for ``(1797, 64)`` feature vectors, ``False`` for
        ``(1797, 1, 8, 8)`` images.

    Returns
    -------
    tuple of numpy.ndarray
        ``(x, y)`` in scikit-learn's file order.
    """
    images, y = _images_and_labels()
    x = (images / _MAX_PIXEL).astype(np.float32)
    if flatten:
        return x.reshape(x.shape[0], -1), y
    return x[:, None, :, :], y
