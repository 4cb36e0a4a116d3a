"""NormTrim: FedAvg that leaves out the updates farthest from the global model.

Each round, the ``drop`` client models farthest from the round's global
model ``x`` (Euclidean distance) are left out; the rest are averaged by
sample count, and the step is applied with server momentum::

    d_i   = ||y_i - x||                        kept: all but the `drop` largest d_i
    delta = sum_kept n_i y_i / sum_kept n_i - x
    m    <- beta m + delta
    x    <- x + server_lr m

One bad client per round costs nothing (a client uploading garbage is far
away); on honest non-IID clients it costs the most different client's
update. The whole algorithm is this file: a rule (the math), its
``[algorithm]`` config (validated by fedsim with this model, keys and
bounds included), and the :class:`~fedsim.algorithms.api.AlgorithmSpec`
that a scenario names as ``algorithm.name = "mylab.rules:SPEC"``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal

import torch
from pydantic import Field

from fedsim.algorithms import check_finite
from fedsim.algorithms.api import AlgorithmSpec, ServerContext
from fedsim.algorithms.flows import RoundRule, RoundsConfig, RoundsFlow
from fedsim.algorithms.sgdclient import local_sgd_client
from fedsim.wire.messages import Update

__all__ = ["SPEC", "NormTrim", "NormTrimConfig", "normtrim_step"]


def normtrim_step(x: torch.Tensor, results: Sequence[Update], drop: int,
                  ) -> tuple[torch.Tensor, list[int], float]:
    """The round's pseudo-gradient without the ``drop`` farthest models.

    Returns ``(delta, dropped clients, largest distance kept)``; at least
    one model is always kept.
    """
    dist = [float(torch.linalg.vector_norm((r.params - x).double())) for r in results]
    order = sorted(range(len(results)), key=lambda i: (dist[i], results[i].client))
    keep = order[:max(1, len(results) - drop)]
    weights = torch.tensor([float(results[i].num_samples) for i in keep], dtype=torch.float64)
    models = torch.stack([results[i].params.double() for i in keep])
    avg = (weights[:, None] * models).sum(0) / weights.sum()
    dropped = sorted(results[i].client for i in order[len(keep):])
    return (avg - x.double()).float(), dropped, dist[keep[-1]]


class NormTrimConfig(RoundsConfig):
    """``[algorithm]`` of NormTrim: FedAvg's round keys plus ``drop`` and ``beta``."""

    name: Literal["normtrim"] = "normtrim"
    drop: Annotated[int, Field(ge=0)] = 1
    beta: Annotated[float, Field(ge=0, lt=1)] = 0.0


class NormTrim(RoundRule):
    """The server rule: :func:`normtrim_step` with server momentum, as ``cfg`` says."""

    def __init__(self, cfg: NormTrimConfig) -> None:
        self.cfg = cfg
        self.momentum: torch.Tensor | None = None

    def aggregate(self, x: torch.Tensor, results: Sequence[Update]
                  ) -> tuple[torch.Tensor, dict[str, Any]]:
        for r in results:  # refuse before changing any state
            check_finite(r.params, f"update from client {r.client}")
        delta, dropped, radius = normtrim_step(x, results, self.cfg.drop)
        m = delta if self.momentum is None else self.cfg.beta * self.momentum + delta
        self.momentum = m
        return x + self.cfg.server_lr * m, {
            "clients": [r.client for r in results], "dropped": len(dropped),
            "first_dropped": dropped[0] if dropped else None, "radius": radius}

    def state_dict(self) -> dict[str, Any]:
        return {"momentum": None if self.momentum is None else self.momentum.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.momentum = state["momentum"]


def _server(cfg: NormTrimConfig, ctx: ServerContext) -> RoundsFlow:
    return RoundsFlow(NormTrim(cfg), cfg, ctx)


SPEC = AlgorithmSpec(
    names=("normtrim",), config=NormTrimConfig, server=_server, client=local_sgd_client,
    summary="FedAvg without the round's farthest models, with server momentum")
