"""Shared tensor kernels over flat parameter vectors.

Every algorithm module builds on these instead of re-writing its own loops
(STYLE.md anti-pattern 3: copy-pasted averaging).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from fedsim.algorithms.base import NonFiniteUpdate

__all__ = [
    "check_finite",
    "check_shape",
    "flatten",
    "lerp",
    "norm64",
    "unflatten",
    "weighted_average",
]


def flatten(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Concatenate tensors into one contiguous float32 vector (one copy)."""
    if not tensors:
        return torch.zeros(0, dtype=torch.float32)
    return torch.cat([t.detach().reshape(-1).to(torch.float32) for t in tensors])


def unflatten(vec: torch.Tensor, shapes: Sequence[tuple[int, ...]]) -> list[torch.Tensor]:
    """Split a flat vector into views with the given shapes (no copy)."""
    need = sum(math.prod(shape) for shape in shapes)
    if need != vec.numel():
        raise ValueError(
            f"Invalid vector length {vec.numel()}: the shapes {list(shapes)} "
            f"need {need} elements"
        )
    out: list[torch.Tensor] = []
    offset = 0
    for shape in shapes:
        n = math.prod(shape)
        out.append(vec[offset : offset + n].view(shape))
        offset += n
    return out


def check_shape(x: torch.Tensor, update: torch.Tensor, what: str = "update") -> None:
    """Raise ValueError unless ``update`` has the global model's shape."""
    if update.shape != x.shape:
        raise ValueError(
            f"Invalid {what}: shape {tuple(update.shape)}, the model has {tuple(x.shape)}"
        )


def norm64(vec: torch.Tensor) -> float:
    """L2 norm of a whole flattened vector, accumulated in float64 (§0.1)."""
    return float(torch.linalg.vector_norm(vec.to(torch.float64)))


def check_finite(vec: torch.Tensor, what: str = "update") -> None:
    """Raise :class:`NonFiniteUpdate` if ``vec`` holds a NaN or an infinity."""
    if not bool(torch.isfinite(vec).all()):
        bad = int((~torch.isfinite(vec)).sum())
        raise NonFiniteUpdate(f"Invalid {what}: {bad} non-finite value(s)")


def lerp(x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
    """Return ``(1 - alpha) * x + alpha * y`` as a new tensor."""
    return torch.lerp(x, y, float(alpha))


def weighted_average(
    vectors: Sequence[torch.Tensor], weights: Sequence[float]
) -> torch.Tensor:
    """Return ``sum_i w_i v_i / sum_i w_i``, accumulated in float64.

    Accumulating in float64 keeps the result independent of the order in
    which updates arrived (up to float32 rounding of the final cast).
    """
    if len(vectors) != len(weights):
        raise ValueError(
            f"Invalid weights: {len(weights)} weights for {len(vectors)} vectors"
        )
    if not vectors:
        raise ValueError("Invalid input: cannot average zero vectors")
    total = float(sum(weights))
    if not total > 0 or any(w < 0 for w in weights):
        raise ValueError(f"Invalid weights {list(weights)}: need w >= 0, sum > 0")
    acc = torch.zeros_like(vectors[0], dtype=torch.float64)
    for v, w in zip(vectors, weights, strict=True):
        if w:
            acc.add_(v.to(torch.float64), alpha=w / total)
    return acc.to(vectors[0].dtype)
