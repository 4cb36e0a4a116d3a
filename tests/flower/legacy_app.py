"""A legacy Flower app (before the Message API): ServerApp(server_fn) with the old
FedAvg strategy, ClientApp(client_fn) with a NumPyClient. Flower converts both to
messages itself; fedsim runs what it converts."""

from __future__ import annotations

import numpy as np
from flwr.client import NumPyClient
from flwr.clientapp import ClientApp
from flwr.common import Context, ndarrays_to_parameters
from flwr.server import ServerApp, ServerAppComponents, ServerConfig
from flwr.server.strategy import FedAvg

DIM = 4
HISTORY: list[object] = []


class Client(NumPyClient):
    def __init__(self, pid: int) -> None:
        rng = np.random.default_rng(pid)
        self.x = rng.normal(size=(10, DIM)).astype(np.float32)
        self.y = (self.x @ np.arange(1, DIM + 1, dtype=np.float32)).astype(np.float32)

    def fit(self, parameters, config):  # type: ignore[no-untyped-def]
        w = parameters[0].copy()
        for _ in range(5):
            w -= 0.05 * 2 * self.x.T @ (self.x @ w - self.y) / len(self.y)
        return [w], len(self.y), {}

    def evaluate(self, parameters, config):  # type: ignore[no-untyped-def]
        w = parameters[0]
        return float(np.mean((self.x @ w - self.y) ** 2)), len(self.y), {}


def client_fn(context: Context):  # type: ignore[no-untyped-def]
    return Client(int(context.node_config["partition-id"])).to_client()


client_app = ClientApp(client_fn=client_fn)


def server_fn(context: Context) -> ServerAppComponents:
    strategy = FedAvg(fraction_fit=1.0, fraction_evaluate=1.0, min_fit_clients=2,
                      min_evaluate_clients=2, min_available_clients=2,
                      initial_parameters=ndarrays_to_parameters([np.zeros(DIM, np.float32)]))
    return ServerAppComponents(strategy=strategy, config=ServerConfig(num_rounds=2))


server_app = ServerApp(server_fn=server_fn)
