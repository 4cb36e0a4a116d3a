"""Zero-copy conversion between torch tensors and wire arrays.

Private module; import from :mod:`fedsim.wire`. torch is imported on first
call, so that ``import fedsim.wire`` stays light for processes without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from fedsim._wire_types import WIRE_DTYPES, WireError, describe, wire_dtype_name

if TYPE_CHECKING:
    from collections.abc import Iterable

    import torch
    from numpy.typing import NDArray

__all__ = ["numpy_to_torch", "tensors_to_numpy"]


def tensors_to_numpy(
    tensors: Iterable[torch.Tensor], *, copy: bool = False
) -> tuple[NDArray[Any], ...]:
    """Return numpy arrays for ``tensors``, ready for a message's ``tensors``.

    Parameters
    ----------
    tensors : iterable of torch.Tensor
        E.g. ``model.parameters()`` or ``model.state_dict().values()``.
        They are detached; tensors on another device are moved to the CPU
        (which copies).
    copy : bool, optional
        If False (the default), each array shares memory with its CPU tensor,
        so a later in-place update of the model (``optimizer.step()``) shows
        through any message built from it that has not been sent yet. Pass
        True to take a snapshot, e.g. of a global model that keeps changing
        while a Task waits in the network emulator.

    Returns
    -------
    tuple of numpy.ndarray

    Raises
    ------
    WireError
        ``"bad_dtype"`` for a dtype the wire does not carry (bfloat16: convert
        with ``.float()`` first; complex).
    """
    import torch

    out: list[NDArray[Any]] = []
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"tensor {i}: expected a torch.Tensor, got {describe(t)}")
        if t.dtype == torch.bfloat16:
            raise WireError(
                "bad_dtype", f"tensor {i} is bfloat16, which numpy lacks; use .float()"
            )
        t = t.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        array = t.resolve_conj().resolve_neg().numpy()
        if wire_dtype_name(array.dtype) is None:
            raise WireError(
                "bad_dtype",
                f"tensor {i} has dtype {t.dtype}; allowed: {', '.join(WIRE_DTYPES)}",
            )
        out.append(array.copy() if copy else array)
    return tuple(out)


def numpy_to_torch(
    arrays: Iterable[NDArray[Any]], *, copy: bool = False
) -> list[torch.Tensor]:
    """Return CPU torch tensors for ``arrays`` (e.g. a decoded message's tensors).

    Parameters
    ----------
    arrays : iterable of numpy.ndarray
    copy : bool, optional
        If False (the default), each tensor shares memory with its array: no
        copy, no warning. Writable arrays go through ``torch.from_numpy``;
        read-only ones (all arrays from :func:`fedsim.wire.decode`) through
        DLPack, because ``torch.from_numpy`` and ``torch.frombuffer`` warn
        on them. torch has no read-only tensors, so **do not modify such a
        tensor in place**: the memory is the received frame and, over
        ``inproc://``, may be the sender's own array. Read from it
        (``param.copy_(t)``, ``torch._foreach_add_(params, ts)``) or pass
        ``copy=True`` to get tensors you own.

    Returns
    -------
    list of torch.Tensor
    """
    import torch
    from torch.utils.dlpack import from_dlpack

    out: list[torch.Tensor] = []
    for i, a in enumerate(arrays):
        if not isinstance(a, np.ndarray):
            raise TypeError(f"array {i}: expected a numpy.ndarray, got {describe(a)}")
        if copy:
            native = a.dtype.newbyteorder("=")
            out.append(torch.from_numpy(np.array(a, dtype=native, copy=True)))
        elif a.flags.writeable:
            out.append(torch.from_numpy(a))
        else:
            out.append(from_dlpack(a))
    return out
