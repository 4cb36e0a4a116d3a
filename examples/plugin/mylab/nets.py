"""A model for fedsim: ``model.name = "mylab.nets:TinyMLP"``.

fedsim calls ``TinyMLP(input_shape, num_classes, **model.options)`` on the
``meta`` device and draws its weights from the scenario's seed, so every
process builds the same model: keep to layers it knows how to initialise
(Linear, Conv, RNNs, Embedding, GroupNorm, LayerNorm) and no buffers.
"""

from __future__ import annotations

import math

from torch import Tensor, nn

__all__ = ["TinyMLP"]


class TinyMLP(nn.Module):
    """Flatten, ``Linear(hidden)``, LayerNorm, tanh, ``Linear(num_classes)``."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, *,
                 hidden: int = 32) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Flatten(), nn.Linear(math.prod(input_shape), hidden), nn.LayerNorm(hidden),
            nn.Tanh(), nn.Linear(hidden, num_classes))

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.net(x)
        return out
