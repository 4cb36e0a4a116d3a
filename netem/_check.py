"""Validation helpers shared by netem's parameter dataclasses.

Every error names the field, the offending value and what is allowed, so a
message like ``LinkParams.rate = -5.0: must be > 0 bits/s or None`` can be
fixed without reading the source.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, NoReturn


def fail(owner: str, name: str, value: Any, allowed: str) -> NoReturn:
    """Raise the standard netem ``ValueError``."""
    raise ValueError(f"{owner}.{name} = {value!r}: {allowed}")


def finite(owner: str, name: str, value: float) -> None:
    """Reject NaN, infinities and non-numbers."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        fail(owner, name, value, "must be a real number")
    if not math.isfinite(value):
        fail(owner, name, value, "must be finite")


def nonneg(owner: str, name: str, value: float, unit: str = "") -> None:
    """Require a finite value ``>= 0``."""
    finite(owner, name, value)
    if value < 0:
        fail(owner, name, value, f"must be >= 0{unit}")


def positive(owner: str, name: str, value: float, unit: str = "") -> None:
    """Require a finite value ``> 0``."""
    finite(owner, name, value)
    if value <= 0:
        fail(owner, name, value, f"must be > 0{unit}")


def prob(owner: str, name: str, value: float) -> None:
    """Require a probability in ``[0, 1]``."""
    finite(owner, name, value)
    if not 0.0 <= value <= 1.0:
        fail(owner, name, value, "must be a probability in [0, 1]")


def integer(owner: str, name: str, value: int, lo: int, hi: int | None = None) -> None:
    """Require an ``int`` in ``[lo, hi]``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        fail(owner, name, value, "must be an int")
    if value < lo or (hi is not None and value > hi):
        rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        fail(owner, name, value, f"must be {rng}")


def choice(owner: str, name: str, value: Any, allowed: tuple[Any, ...]) -> None:
    """Require one of a fixed set of values."""
    if value not in allowed:
        fail(owner, name, value, f"must be one of {', '.join(map(repr, allowed))}")
