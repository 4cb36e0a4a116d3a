"""A small Flower app (Message API) for fedsim's bridge tests: FedAvg over a linear model.

Written as a Flower user writes one; its ClientApp trains with numpy on a
fixed per-partition problem, so runs are deterministic."""

from __future__ import annotations

import applog
import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp import strategy as strategies

DIM = 4


def _data(pid: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(pid)
    x = rng.normal(size=(8 + 4 * pid, DIM)).astype(np.float32)
    w = np.arange(1, DIM + 1, dtype=np.float32)
    return x, (x @ w).astype(np.float32)


client_app = ClientApp()
#: (Context.node_id, the message's dst_node_id) of every train call, for the tests
SEEN: list[tuple[int, int]] = []


@client_app.train()
def train(msg: Message, context: Context) -> Message:
    SEEN.append((context.node_id, msg.metadata.dst_node_id))
    w = msg.content["arrays"].to_numpy_ndarrays()[0].copy()
    x, y = _data(int(context.node_config["partition-id"]))
    lr = float(msg.content["config"]["lr"])
    for _ in range(int(context.run_config.get("local-steps", 5))):
        w -= lr * 2 * x.T @ (x @ w - y) / len(y)
    calls = int(context.state["calls"]["n"]) + 1 if "calls" in context.state else 1
    context.state["calls"] = MetricRecord({"n": calls})
    content = RecordDict({"arrays": ArrayRecord([w]),
                          "metrics": MetricRecord({"num-examples": 10_000, "calls": calls})})
    return Message(content=content, reply_to=msg)


@client_app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    w = msg.content["arrays"].to_numpy_ndarrays()[0]
    x, y = _data(int(context.node_config["partition-id"]))
    loss = float(np.mean((x @ w - y) ** 2))
    return Message(content=RecordDict({"metrics": MetricRecord(
        {"num-examples": len(y), "loss": loss})}), reply_to=msg)


server_app = ServerApp()


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    receive = grid.send_and_receive

    def recorded(messages, **kw):  # type: ignore[no-untyped-def]
        """The train replies' num-examples as the strategy receives them (for the tests)."""
        replies = list(receive(messages, **kw))
        applog.write(context, seen=[[r.metadata.src_node_id - 1000,
                                     int(r.content["metrics"]["num-examples"])]
                                    for r in replies if r.has_content()
                                    and "calls" in r.content["metrics"]])
        return replies

    grid.send_and_receive = recorded  # type: ignore[method-assign]
    kind = getattr(strategies, str(context.run_config.get("strategy", "FedAvg")))
    strategy = kind(fraction_train=1.0, fraction_evaluate=1.0,
                    min_train_nodes=2, min_evaluate_nodes=2, min_available_nodes=2)
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord([np.zeros(DIM, np.float32)]),
                            num_rounds=int(context.run_config.get("num-server-rounds", 3)),
                            train_config=ConfigRecord({"lr": 0.05}))
    arrays = result.arrays.to_numpy_ndarrays()[0].tolist() if result.arrays else None
    applog.write(context, arrays=arrays)
