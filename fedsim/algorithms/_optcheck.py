"""The client optimizers' option values and field checks, without torch.

:class:`~fedsim.algorithms.optim.OptimizerConfig` validates a scenario's
optimizer with these in every process, client hosts included, which never
import torch (docs/architecture.md#processes); the optimizers of
:mod:`fedsim.algorithms.adaptive` check their own arguments with the same
functions, so a value is accepted or refused with the same message in both.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = [
    "BATCH_MODES", "FIRST_STEPS", "MASK_MODES", "SPS_MODES", "check_choice", "check_count",
    "check_finite", "check_nonnegative", "check_positive",
]  # fmt: skip

#: Delta-SGD's ``first_step``, ``batch_mode`` and ``mask_mode`` (docs/algorithms.md#delta-sgd).
FIRST_STEPS = ("paper", "code")
BATCH_MODES = ("same", "previous")
MASK_MODES = ("independent", "shared")
#: SPS's ``mode`` (docs/algorithms.md#sps).
SPS_MODES = ("constant", "smooth")


def check_positive(name: str, value: float, *, allow_inf: bool = False) -> None:
    """Raise ValueError unless ``value > 0`` (and finite unless ``allow_inf``)."""
    if not value > 0 or (not allow_inf and math.isinf(value)):
        rule = "must be > 0; inf allowed" if allow_inf else "must be finite and > 0"
        raise ValueError(f"Invalid {name}: {value} ({rule})")


def check_nonnegative(name: str, value: float) -> None:
    """Raise ValueError unless ``0 <= value < inf``."""
    if not 0 <= value < math.inf:
        raise ValueError(f"Invalid {name}: {value} (must be finite and >= 0)")


def check_finite(name: str, value: float) -> None:
    """Raise ValueError unless ``value`` is a finite number."""
    if not math.isfinite(value):
        raise ValueError(f"Invalid {name}: {value} (must be finite)")


def check_choice(name: str, value: str, allowed: Sequence[str]) -> None:
    """Raise ValueError unless ``value`` is one of ``allowed``."""
    if value not in allowed:
        raise ValueError(f"Invalid {name}: {value!r} (allowed: {', '.join(allowed)})")


def check_count(name: str, value: int) -> None:
    """Raise ValueError unless ``value`` is an integer >= 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"Invalid {name}: {value} (must be an integer >= 1)")
