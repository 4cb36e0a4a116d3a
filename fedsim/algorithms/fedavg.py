r"""FedAvg (and FedProx's server): sample-weighted model averaging.

McMahan et al., "Communication-Efficient Learning of Deep Networks from
Decentralized Data" (https://arxiv.org/abs/1602.05629); docs/algorithms.md#fedavg-and-fedprox::

    x <- x + eta_g * sum_{i in S} w_i (y_i - x),   w_i = n_i / sum_j n_j  (or 1/|S|)

With ``eta_g = 1`` this is plain model averaging. FedProx (Li et al.,
https://arxiv.org/abs/1812.06127) uses this server with the proximal client
term ``mu/2 ||y - x||^2`` (``LocalConfig.prox_mu``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

from pydantic import model_validator

from fedsim.algorithms._kernels import check_round, weighted_average
from fedsim.algorithms.api import AlgorithmSpec, ServerContext
from fedsim.algorithms.flows import RoundRule, RoundsConfig, RoundsFlow
from fedsim.algorithms.robust import AggregatorKeys
from fedsim.algorithms.sgdclient import local_sgd_client
from fedsim.schema import FiniteNonNeg
from fedsim.wire.messages import Update

if TYPE_CHECKING:
    import torch

__all__ = ["SPEC", "FedAvg", "FedAvgConfig", "fedavg_aggregate"]

WEIGHTINGS = ("samples", "uniform")


def fedavg_aggregate(
    x: torch.Tensor,
    results: Sequence[Update],
    server_lr: float = 1.0,
    weighting: str = "samples",
) -> torch.Tensor:
    """Return the FedAvg step of ``x`` over ``results``."""
    if weighting not in WEIGHTINGS:
        raise ValueError(
            f"Invalid weighting: {weighting!r} (allowed: {', '.join(WEIGHTINGS)})"
        )
    if weighting == "samples":
        weights = [float(r.num_samples) for r in results]
    else:
        weights = [1.0] * len(results)
    avg = weighted_average([r.params for r in results], weights)
    if server_lr == 1.0:
        return avg
    return x + server_lr * (avg - x)


class FedAvgConfig(AggregatorKeys, RoundsConfig):
    """``[algorithm]`` of FedAvg and FedProx (``mu``: FedProx's proximal weight).

    :class:`FedAvg` reads ``server_lr`` (``eta_g``, > 0; 1 = plain averaging)
    and ``weighting``: ``samples`` weights by ``n_i`` (R-AF4), ``uniform`` is
    the plain mean. ``aggregator`` and ``trim``
    (:class:`~fedsim.algorithms.robust.AggregatorKeys`) may make the round's
    model a robust centre of the client models instead of their mean.
    """

    name: Literal["fedavg", "fedprox"] = "fedavg"
    weighting: Literal["samples", "uniform"] = "samples"
    mu: FiniteNonNeg = 0.0

    @model_validator(mode="after")
    def _mu_only_for_fedprox(self) -> FedAvgConfig:
        if self.name == "fedavg" and self.mu != 0.0:
            raise ValueError(f"mu={self.mu} is FedProx's proximal weight; use name = \"fedprox\"")
        return self

    def prox_mu(self) -> float:
        return self.mu


class FedAvg(RoundRule):
    """FedAvg server rule over one round's results; its parameters are ``cfg``'s."""

    def __init__(self, cfg: FedAvgConfig) -> None:
        self.cfg = cfg
        self.rounds = 0

    def aggregate(
        self, x: torch.Tensor, results: Sequence[Update]
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """Aggregate one round; non-finite results raise before anything changes."""
        check_round(x, results)
        new = fedavg_aggregate(x, results, self.cfg.server_lr, self.cfg.weighting)
        self.rounds += 1
        return new, {"clients": [r.client for r in results]}

    def state_dict(self) -> dict[str, Any]:
        """Return the rule's mutable state."""
        return {"rounds": self.rounds}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore state saved by :meth:`state_dict`."""
        self.rounds = int(state["rounds"])


def _server(cfg: FedAvgConfig, ctx: ServerContext) -> RoundsFlow:
    return RoundsFlow(FedAvg(cfg), cfg, ctx)


SPEC = AlgorithmSpec(
    names=("fedavg", "fedprox"), config=FedAvgConfig, server=_server, client=local_sgd_client,
    summary="synchronous rounds with sampling, deadline and over-selection; "
            "FedProx adds the proximal term mu")
