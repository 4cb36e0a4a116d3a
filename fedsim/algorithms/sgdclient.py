"""The client side of every algorithm whose clients simply train locally.

FedAvg, FedProx, FedAsync, FedBuff, AsyncFedED and FedOpt clients all run
:func:`fedsim.algorithms.local.local_train` from the task's model (with the
scenario's optimizer, proximal term and the task's own budget) and upload
the local model; what differs is only the server side.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fedsim.algorithms.api import ClientAlgorithm, ClientContext, Outcome
from fedsim.algorithms.local import local_train

if TYPE_CHECKING:
    import torch

    from fedsim.wire.messages import Task

__all__ = ["LocalSGDClient", "local_sgd_client"]

_STEP_SIZES = ("lr_last", "lr_mean", "lr_min", "lr_max")


class LocalSGDClient(ClientAlgorithm):
    """Local training from the task's model; the upload is the local model."""

    def __init__(self, ctx: ClientContext) -> None:
        self.ctx = ctx

    def begin(
        self, task: Task, x: torch.Tensor, y: torch.Tensor, gen: torch.Generator
    ) -> Outcome:
        local = self.ctx.local.with_work(task.work)
        vec, stats = local_train(self.ctx.model, task.params, x, y, local, gen)
        return Outcome(steps=int(stats["steps"]), loss=float(stats["loss"]), upload=vec,
                       notes={k: stats[k] for k in _STEP_SIZES if k in stats})

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state:
            raise ValueError(f"Invalid state for {type(self).__name__}: {sorted(state)}")


def local_sgd_client(cfg: Any, ctx: ClientContext) -> LocalSGDClient:
    """The :class:`~fedsim.algorithms.api.AlgorithmSpec` ``client`` builder."""
    return LocalSGDClient(ctx)
