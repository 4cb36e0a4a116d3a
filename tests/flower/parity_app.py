"""A Flower app that trains as fedsim's fedavg does, for the parity tests.

ClientApp: K full-batch steps of plain SGD on the node's partition (fedsim's
data, through fedsim.flower.partition) from the pushed model, fedsim's MLP.
ServerApp: Flower's FedAvg over every node for R rounds from fedsim's own
initial model, with federated evaluation; it saves the final arrays
(``final-path`` in the run config)."""

from __future__ import annotations

import os

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from fedsim.flower import partition, running

client_app = ClientApp()
#: outside fedsim (Flower's own simulation passes no run config): the run config and
#: the scenario whose data the nodes train on come from the environment
DEFAULTS = {"rounds": 3, "lr": 0.2, "steps": 5,
            "final-path": os.environ.get("PARITY_FINAL", ""),
            "fedsim-scenario": os.environ.get("PARITY_SCENARIO", "")}


def _cfg(context: Context) -> dict[str, object]:
    return {**DEFAULTS, **context.run_config}


def _model(context: Context) -> torch.nn.Module:
    from fedsim.actors.setup import build_model
    from fedsim.flower import scenario_data

    sc = running.scenario()
    if sc is None:
        sc, data = scenario_data(str(_cfg(context)["fedsim-scenario"]))
    else:
        from fedsim.flower.data import _built

        _, data = _built(sc)
    return build_model(sc, tuple(data.input_shape), int(data.num_classes))


@client_app.train()
def train(msg: Message, context: Context) -> Message:
    torch.set_num_threads(1)
    net = _model(context)
    params = list(net.parameters())
    for p, a in zip(params, msg.content["arrays"].to_numpy_ndarrays(), strict=True):
        p.data.copy_(torch.as_tensor(a))
    x, y = partition(context, str(_cfg(context)["fedsim-scenario"]) or None)
    lr, steps = float(msg.content["config"]["lr"]), int(msg.content["config"]["steps"])
    for _ in range(steps):
        for p in params:
            p.grad = None
        torch.nn.functional.cross_entropy(net(x), y).backward()
        with torch.no_grad():
            for p in params:
                p.add_(p.grad, alpha=-lr)
    arrays = ArrayRecord([p.detach().numpy().copy() for p in params])
    return Message(RecordDict({"arrays": arrays, "metrics": MetricRecord(
        {"num-examples": len(y), "num-steps": steps})}), reply_to=msg)


@client_app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    _, y = partition(context, str(_cfg(context)["fedsim-scenario"]) or None)
    return Message(RecordDict({"metrics": MetricRecord({"num-examples": len(y)})}),
                   reply_to=msg)


server_app = ServerApp()


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = _cfg(context)
    net = _model(context)
    nodes = len(list(grid.get_node_ids()))
    # federated evaluation carries each round's aggregate to the nodes (and so past
    # fedsim's evaluator): the final model crosses the grid too
    result = FedAvg(fraction_train=1.0, fraction_evaluate=1.0, min_train_nodes=nodes,
                    min_evaluate_nodes=nodes, min_available_nodes=nodes).start(
        grid=grid, initial_arrays=ArrayRecord([p.detach().numpy().copy()
                                               for p in net.parameters()]),
        num_rounds=int(cfg["rounds"]),
        train_config=ConfigRecord({"lr": float(cfg["lr"]), "steps": int(cfg["steps"])}))
    np.save(str(cfg["final-path"]), np.concatenate(
        [a.reshape(-1) for a in result.arrays.to_numpy_ndarrays()]))
