"""``build_model`` and ``param_spec``."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from fedsim.models._init import init_parameters
from fedsim.models._nets import CNN, MLP, CharLSTM, CNNMnist

__all__ = ["MODELS", "build_from", "build_model", "param_spec"]

logger = logging.getLogger(__name__)

_REGISTRY: dict[str, Callable[..., nn.Module]] = {
    "mlp": MLP,
    "cnn": CNN,
    "cnn_mnist": CNNMnist,
    "char_lstm": CharLSTM,
}
MODELS: tuple[str, ...] = tuple(_REGISTRY)


def _options_of(factory: Callable[..., nn.Module]) -> tuple[str, ...]:
    params = inspect.signature(factory).parameters.values()
    return tuple(p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY)


def _check_shape(input_shape: Any) -> tuple[int, ...]:
    ok = isinstance(input_shape, Sequence) and not isinstance(input_shape, str)
    dims = tuple(input_shape) if ok else ()
    if not dims or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in dims
    ):
        raise ValueError(
            f"Invalid input_shape: {input_shape!r} (must be a non-empty tuple of "
            "ints >= 1)"
        )
    return dims


def build_model(
    name: str,
    input_shape: Sequence[int],
    num_classes: int,
    *,
    seed: int,
    **options: Any,
) -> nn.Module:
    """Build a model with weights determined by ``seed`` alone.

    Parameters
    ----------
    name : {"mlp", "cnn", "cnn_mnist", "char_lstm"}
        ``mlp`` (``hidden_sizes=(200,)``), ``cnn`` (``channels=(32, 64)``,
        ``hidden=128``, ``norm="none"|"group"``, ``groups=2``), ``cnn_mnist``
        (the Delta-SGD authors' CNNMnist, no options), ``char_lstm``
        (``vocab_size``, ``embedding_dim=8``, ``hidden_size=256``,
        ``num_layers=2``).
    input_shape : sequence of int
        Shape of one example, ``FederatedData.input_shape``.
    num_classes : int
        Number of outputs.
    seed : int
        Seed of the local generator that initializes the weights; the
        global torch RNG is neither read nor changed.
    **options
        Model options listed above; anything else is an error.

    Returns
    -------
    torch.nn.Module
        The model on the CPU, in training mode, float32.
    """
    if name not in _REGISTRY:
        raise ValueError(f"Unknown model: {name!r} (allowed: {', '.join(MODELS)})")
    factory = _REGISTRY[name]
    allowed = _options_of(factory)
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ValueError(
            f"Unknown option(s) {unknown} for model {name!r} "
            f"(allowed: {', '.join(allowed) or 'none'})"
        )
    return build_from(factory, input_shape, num_classes, seed=seed, name=name, **options)


def build_from(
    factory: Callable[..., nn.Module],
    input_shape: Sequence[int],
    num_classes: int,
    *,
    seed: int,
    name: str = "",
    **options: Any,
) -> nn.Module:
    """Build ``factory(input_shape, num_classes, **options)`` as :func:`build_model` does.

    For a plug-in model (:mod:`fedsim.scenario.plugins`): the module is made on the
    ``meta`` device and its weights drawn from ``seed`` alone, so every
    process builds the same model. It must hold trainable parameters only
    (no buffers), in layers :func:`~fedsim.models.init_parameters` knows
    (Linear, Conv, RNN/LSTM/GRU, Embedding, GroupNorm, LayerNorm).
    """
    name = name or getattr(factory, "__qualname__", repr(factory))
    shape = _check_shape(input_shape)
    if (
        isinstance(num_classes, bool)
        or not isinstance(num_classes, int)
        or num_classes < 1
    ):
        raise ValueError(f"Invalid num_classes: {num_classes!r} (must be an int >= 1)")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"Invalid seed: {seed!r} (must be an int >= 0)")
    with torch.device("meta"):  # no memory and no draws from the global RNG
        model = factory(shape, num_classes, **options)
    if not isinstance(model, nn.Module):
        raise ValueError(f"Invalid model {name!r}: its factory returned "
                         f"{type(model).__name__}, not a torch.nn.Module")
    buffers = [n for n, _ in model.named_buffers()]
    if buffers:
        raise ValueError(f"Invalid model {name!r}: it holds buffers ({', '.join(buffers[:3])}); "
                         "a fedsim model is its trainable parameters only (no BatchNorm: use "
                         "GroupNorm or LayerNorm)")
    _materialize(model)
    try:
        init_parameters(model, seed)
    except TypeError as exc:
        raise ValueError(
            f"Invalid model {name!r}: {str(exc).split(';')[0]} (fedsim draws the weights of "
            "Linear, Conv, RNN/LSTM/GRU, Embedding, GroupNorm and LayerNorm layers from the "
            "seed, so that every process builds the same model)") from None
    logger.debug(
        "built model %s for input %s: %d parameters",
        name,
        shape,
        sum(p.numel() for p in model.parameters()),
    )
    return model


def _materialize(model: nn.Module) -> None:
    """Give every ``meta`` parameter uninitialized CPU memory, as ``to_empty`` would.

    ``Module.to_empty`` costs 0.24 s the first time in a process (it imports
    torch's symbolic-shape machinery, and sympy with it) on this kind of
    machine; this takes microseconds and is on every worker's start-up path.
    A parameter shared by several modules stays shared. Assigning through
    ``setattr`` keeps modules that index their parameters (RNN's flat weights)
    in step.
    """
    made: dict[int, nn.Parameter] = {}
    for module in model.modules():
        for pname, p in list(module._parameters.items()):
            if p is None or p.device.type != "meta":
                continue
            new = made.get(id(p))
            if new is None:
                data = torch.empty_strided(p.size(), p.stride(), dtype=p.dtype, device="cpu")
                new = made[id(p)] = nn.Parameter(data, requires_grad=p.requires_grad)
            setattr(module, pname, new)
        if isinstance(module, nn.RNNBase):
            module._init_flat_weights()


def param_spec(model: nn.Module) -> list[tuple[str, tuple[int, ...], str]]:
    """Name, shape and dtype (e.g. ``"float32"``) of each trainable parameter.

    The order is ``model.named_parameters()`` order, the order in which flat
    model vectors are laid out.
    """
    return [
        (n, tuple(p.shape), str(p.dtype).removeprefix("torch."))
        for n, p in model.named_parameters()
        if p.requires_grad
    ]
