"""The ``flower`` algorithm's spec: a Flower app's config, server side and client side, joined.

The scenario loader finds it by name, as a built-in whose home lives
outside :mod:`fedsim.algorithms` (:func:`fedsim.algorithms.api.get`
imports this module on first use): the server side runs a process and the
client side measures CPU time, which the sans-I/O algorithms package does
not allow. Nothing here imports Flower; the builders do, when a run is
built, and say which extra to install when it is missing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fedsim.algorithms.api import AlgorithmSpec
from fedsim.flower.config import (
    FLOWER_VERSIONS,
    FlowerConfig,
    FlowerMissing,
    require_flower,
)
from fedsim.wire.tensors import TensorSpec

if TYPE_CHECKING:
    from fedsim.algorithms.api import ClientAlgorithm, ClientContext, ServerAlgorithm, ServerContext

__all__ = ["FLOWER_VERSIONS", "SPEC", "FlowerConfig", "FlowerMissing", "require_flower"]


def _server(cfg: FlowerConfig, ctx: ServerContext) -> ServerAlgorithm:
    require_flower()
    from fedsim.flower.server import FlowerServer  # lazy: flwr is an optional extra

    return FlowerServer(cfg, ctx)


def _client(cfg: FlowerConfig, ctx: ClientContext) -> ClientAlgorithm:
    require_flower()
    from fedsim.flower.client import FlowerClient  # lazy: flwr is an optional extra

    return FlowerClient(cfg, ctx)


def _payload_bytes(cfg: Any, model: TensorSpec) -> int:
    return int(cfg.payload_bytes(model.nbytes))


#: Not registered: :func:`fedsim.algorithms.api.get` finds it by its reference
#: (``register_elsewhere`` in :mod:`fedsim.algorithms`), so that parsing a
#: scenario never changes the registry.
SPEC = AlgorithmSpec(
    names=("flower",),
    config=FlowerConfig,
    server=_server,
    client=_client,
    summary="a Flower app (ServerApp and ClientApp, Message API), unchanged, over fedsim's "
            "network",
    payload_bytes=_payload_bytes,
)
