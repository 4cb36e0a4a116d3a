"""Deterministic parameter initialization from a local ``torch.Generator``.

Models are constructed on the ``meta`` device (no memory, no random draws),
moved to the CPU uninitialized, and then every parameter is initialized here
with PyTorch's own default scheme, but drawing from a generator seeded by the
caller. The global torch RNG is never read or seeded, so building a model
cannot disturb (or be disturbed by) training in another thread, and every
process that builds ``(name, input_shape, num_classes, seed)`` gets the same
weights bit for bit.

Default schemes reproduced (``torch.nn`` ``reset_parameters``):

- ``Linear``, ``Conv*``: weight ``kaiming_uniform_(a=sqrt(5))``, bias
  ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))``;
- ``LSTM``/``GRU``/``RNN``: every tensor ``U(-1/sqrt(hidden), 1/sqrt(hidden))``;
- ``Embedding``: ``N(0, 1)``;
- ``GroupNorm``/``LayerNorm``: weight 1, bias 0.
"""

from __future__ import annotations

import math

import torch
from torch import nn

__all__ = ["init_parameters"]


def _init_module(module: nn.Module, gen: torch.Generator) -> list[torch.Tensor]:
    """Initialize ``module``'s own parameters; return the tensors it covered."""
    own: list[torch.Tensor] = list(module.parameters(recurse=False))
    if not own:
        return []
    if isinstance(module, nn.Linear | nn.Conv1d | nn.Conv2d | nn.Conv3d):
        nn.init.kaiming_uniform_(module.weight, a=math.sqrt(5), generator=gen)
        if module.bias is not None:
            fan_in, _ = nn.init._calculate_fan_in_and_fan_out(module.weight)
            bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0.0
            nn.init.uniform_(module.bias, -bound, bound, generator=gen)
    elif isinstance(module, nn.RNNBase):
        bound = 1 / math.sqrt(module.hidden_size) if module.hidden_size > 0 else 0.0
        for p in own:
            nn.init.uniform_(p, -bound, bound, generator=gen)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, generator=gen)
        if module.padding_idx is not None:
            with torch.no_grad():
                module.weight[module.padding_idx].fill_(0)
    elif isinstance(module, nn.GroupNorm | nn.LayerNorm):
        if module.weight is not None:
            nn.init.ones_(module.weight)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    else:
        raise TypeError(
            f"No deterministic initializer for {type(module).__name__}; add one "
            "to fedsim.models._init"
        )
    return own


def init_parameters(model: nn.Module, seed: int) -> nn.Module:
    """Initialize every parameter of ``model`` in place from ``seed``.

    Parameters
    ----------
    model : torch.nn.Module
        A model on the CPU (possibly with uninitialized memory, e.g. after
        ``to_empty``).
    seed : int
        Seed of the local ``torch.Generator``; modules are visited in
        registration order, so the result depends on nothing else.

    Returns
    -------
    torch.nn.Module
        ``model`` itself.
    """
    gen = torch.Generator(device="cpu")
    gen.manual_seed(seed)
    covered: set[int] = set()
    for module in model.modules():
        covered.update(id(p) for p in _init_module(module, gen))
    missed = [n for n, p in model.named_parameters() if id(p) not in covered]
    if missed:  # a parameter left uninitialized would hold garbage memory
        raise TypeError(f"Parameters left uninitialized: {missed}")
    return model
