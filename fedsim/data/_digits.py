"""scikit-learn's bundled handwritten digits (UCI Optical Recognition of Digits).

1,797 8x8 grayscale images of the digits 0-9 with pixel values 0..16, shipped
inside scikit-learn (``sklearn.datasets.load_digits``), so no download is
ever needed. Scaled here to [0, 1] by dividing by 16.
"""

from __future__ import annotations

import numpy as np

__all__ = ["load_digits_arrays"]

_MAX_PIXEL = 16.0


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
    from sklearn.datasets import load_digits  # type: ignore[import-untyped]  # lazy: 1.9 s, digits only

    bunch = load_digits()
    x = (np.asarray(bunch.images, dtype=np.float64) / _MAX_PIXEL).astype(np.float32)
    y = np.asarray(bunch.target, dtype=np.int64)
    if flatten:
        return x.reshape(x.shape[0], -1), y
    return x[:, None, :, :], y
