"""The one place a wire :class:`~fedsim.messages.Model` meets a torch tensor.

Both directions are views, not copies: a flat float32 tensor becomes the
model's single buffer, and a received buffer becomes a tensor through DLPack
(which, unlike ``torch.from_numpy``, takes read-only memory without a
warning). The algorithms read such a tensor and never write to it.
"""

from __future__ import annotations

import torch
from torch.utils.dlpack import from_dlpack

from fedsim.messages import Model, TensorSpec

__all__ = ["to_model", "to_tensor"]


def to_tensor(model: Model) -> torch.Tensor:
    """A received model's flat buffer as a tensor, without a copy (read-only memory)."""
    return from_dlpack(model.flat())


def to_model(vec: torch.Tensor, spec: TensorSpec) -> Model:
    """A flat tensor as a wire model (a view when it is already contiguous float32)."""
    return Model.from_flat(vec.detach().to(torch.float32).contiguous().numpy(), spec)
