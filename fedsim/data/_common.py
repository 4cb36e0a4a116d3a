"""Seeds, random streams and argument checks shared by the data modules.

Every random choice in :mod:`fedsim.data` comes from a ``numpy.random.Generator``
built here from an explicit integer seed and a fixed stream number, so the
server process and every client-host process rebuild identical data from
``(dataset, options, seed)``. Nothing reads the global ``np.random`` state or
depends on ``PYTHONHASHSEED``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

__all__ = [
    "STREAM_DATA",
    "STREAM_HOLDOUT",
    "STREAM_PARTITION",
    "STREAM_SELECT",
    "check_choice",
    "check_fraction",
    "check_int",
    "check_labels",
    "check_nonneg_float",
    "check_seed",
    "make_rng",
]

# Fixed stream numbers: one independent random stream per purpose, so that
# changing, e.g., the holdout fraction never changes the generated features.
STREAM_DATA = 0
STREAM_HOLDOUT = 1
STREAM_PARTITION = 2
STREAM_SELECT = 3


def check_seed(seed: Any) -> int:
    """Return ``seed`` if it is a non-negative ``int`` (not ``bool``)."""
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise ValueError(f"Invalid seed: {seed!r} (must be an int >= 0)")
    return int(seed)


def make_rng(seed: int, *stream: int) -> np.random.Generator:
    """A PCG64 generator for ``seed`` and an optional stream key.

    ``make_rng(s)`` equals ``np.random.default_rng(s)``; ``make_rng(s, k)``
    is an independent stream derived through ``SeedSequence([s, k])``.
    """
    seed = check_seed(seed)
    entropy: int | list[int] = [seed, *stream] if stream else seed
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(entropy)))


def check_int(name: str, value: Any, minimum: int) -> int:
    """Return ``value`` as ``int`` if it is an integer ``>= minimum``."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ValueError(f"Invalid {name}: {value!r} (must be an int >= {minimum})")
    if value < minimum:
        raise ValueError(f"Invalid {name}: {value} (must be an int >= {minimum})")
    return int(value)


def check_nonneg_float(name: str, value: Any, *, positive: bool = False) -> float:
    """Return ``value`` as ``float`` if it is finite and ``>= 0`` (``> 0``)."""
    bound = "> 0" if positive else ">= 0"
    if isinstance(value, bool) or not isinstance(value, int | float | np.number):
        raise ValueError(f"Invalid {name}: {value!r} (must be a finite number {bound})")
    v = float(value)
    if not math.isfinite(v) or v < 0 or (positive and v == 0):
        raise ValueError(f"Invalid {name}: {value!r} (must be a finite number {bound})")
    return v


def check_fraction(name: str, value: Any) -> float:
    """Return ``value`` as ``float`` if it lies strictly between 0 and 1."""
    v = check_nonneg_float(name, value)
    if not 0.0 < v < 1.0:
        raise ValueError(
            f"Invalid {name}: {value!r} (must be in the open range (0, 1))"
        )
    return v


def check_choice(name: str, value: Any, allowed: Iterable[str]) -> str:
    """Return ``value`` if it is one of ``allowed``."""
    allowed = tuple(allowed)
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(f"Invalid {name}: {value!r} (allowed: {', '.join(allowed)})")
    return value


def check_labels(labels: Any) -> np.ndarray:
    """Return ``labels`` as a 1-D int64 array of non-negative class ids."""
    arr = np.asarray(labels)
    if arr.ndim != 1 or not (np.issubdtype(arr.dtype, np.integer) or arr.size == 0):
        raise ValueError(
            f"Invalid labels: expected a 1-D integer array, got dtype {arr.dtype} "
            f"and shape {arr.shape}"
        )
    if arr.size and int(arr.min()) < 0:
        raise ValueError(f"Invalid labels: negative class id {int(arr.min())}")
    return arr.astype(np.int64, copy=False)
