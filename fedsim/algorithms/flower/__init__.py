"""A Flower app, unchanged, as a fedsim algorithm: its ServerApp and ClientApp on fedsim's network.

``[algorithm] name = "flower"`` names a Flower Message-API app (Flower 1.21
and later): a ``flwr.serverapp.ServerApp`` and a ``flwr.clientapp.ClientApp``
as ``module:attribute`` references, found like fedsim's plug-ins (installed,
on ``PYTHONPATH``, or next to the scenario file), and the app's run config::

    [algorithm]
    name = "flower"
    server_app = "mylab.app:server_app"
    client_app = "mylab.app:client_app"
    run_config = { "num-server-rounds" = 20, "lr" = 0.05 }

The server side (:mod:`.server`) runs the ServerApp in a thread of the
server process with a :class:`~.grid.FedsimGrid`; every message the app
pushes becomes a task to its node (a fedsim client) and every reply an
update, over the emulated network (:mod:`.grid` says how waiting, timeouts
and missing replies work). The client side (:mod:`.client`) calls the
ClientApp in fedsim's trainer processes with each client's own
``Context``. docs/flower.md is the user's guide.

Flower is an optional extra (``pip install fedsim[flower]``): this module
imports nothing of it, so a scenario names an app without it installed and
is refused with the extra's name when its run is built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fedsim.algorithms.api import AlgorithmSpec, register
from fedsim.algorithms.flower.config import (
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
    from fedsim.algorithms.flower.server import FlowerServer  # lazy: flwr is an optional extra

    return FlowerServer(cfg, ctx)


def _client(cfg: FlowerConfig, ctx: ClientContext) -> ClientAlgorithm:
    require_flower()
    from fedsim.algorithms.flower.client import FlowerClient  # lazy: flwr is an optional extra

    return FlowerClient(cfg, ctx)


def _payload_bytes(cfg: Any, model: TensorSpec) -> int:
    return int(cfg.payload_bytes(model.nbytes))


SPEC = register(AlgorithmSpec(
    names=("flower",),
    config=FlowerConfig,
    server=_server,
    client=_client,
    summary="a Flower app (ServerApp and ClientApp, Message API), unchanged, over fedsim's "
            "network",
    payload_bytes=_payload_bytes,
))
