"""A Flower app as a Flower user writes one: FedAvg on scikit-learn's digits with a torch MLP.

Nothing here is written for fedsim but where the data come from:
``fedsim.flower.partition`` gives each node its partition (its
``partition-id`` of ``num-partitions``) of the scenario's dataset, under
fedsim or under Flower's own simulation alike, and ``eval_set`` the
scenario's test set for the strategy's centralized evaluation. Run it with
Flower (``python examples/flower/run_flower.py``) or with fedsim
(``fedsim run examples/flower/lan.toml``); docs/flower.md compares them.
"""

from __future__ import annotations

from pathlib import Path

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg
from torch import nn

from fedsim.flower import eval_set, partition

#: the scenario whose data the app trains on outside fedsim (Flower's own simulation);
#: under fedsim, the run's own scenario
SCENARIO = Path(__file__).with_name("lan.toml")
#: the run config's defaults (Flower's simulation API passes none)
DEFAULTS = {"num-server-rounds": 30, "fraction-train": 0.5, "lr": 0.1, "local-epochs": 1,
            "batch-size": 16}


def config(context: Context) -> dict[str, bool | int | float | str]:
    """The run config over its defaults."""
    return {**DEFAULTS, **context.run_config}


class Net(nn.Module):
    """64 pixels -> 64 hidden ReLU units -> 10 digits (fedsim's ``mlp``, hidden = [64])."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def train(net: Net, x: torch.Tensor, y: torch.Tensor, epochs: int, lr: float,
          batch_size: int, seed: int) -> tuple[float, int]:
    """Local SGD; the mean training loss and the steps taken."""
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed)
    net.train()
    total, steps = 0.0, 0
    for _ in range(epochs):
        for idx in torch.randperm(len(y), generator=gen).split(batch_size):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(net(x[idx]), y[idx])
            loss.backward()
            opt.step()
            total, steps = total + loss.item(), steps + 1
    return total / max(steps, 1), steps


@torch.no_grad()
def evaluate(net: Net, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """Loss and accuracy on ``(x, y)``."""
    net.eval()
    out = net(x)
    return float(nn.functional.cross_entropy(out, y)), float((out.argmax(1) == y).float().mean())


client_app = ClientApp()


@client_app.train()
def client_train(msg: Message, context: Context) -> Message:
    net = Net()
    net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    x, y = partition(context, SCENARIO)
    cfg = msg.content["config"]
    seed = int(context.node_config["partition-id"]) * 10_007 + int(cfg["server-round"])
    run = config(context)
    loss, steps = train(net, x, y, int(run["local-epochs"]), float(cfg["lr"]),
                        int(run["batch-size"]), seed)
    metrics = MetricRecord({"train_loss": loss, "num-examples": len(y), "num-steps": steps})
    return Message(RecordDict({"arrays": ArrayRecord(net.state_dict()), "metrics": metrics}),
                   reply_to=msg)


@client_app.evaluate()
def client_evaluate(msg: Message, context: Context) -> Message:
    net = Net()
    net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    x, y = partition(context, SCENARIO)
    loss, acc = evaluate(net, x, y)
    metrics = MetricRecord({"eval_loss": loss, "eval_acc": acc, "num-examples": len(y)})
    return Message(RecordDict({"metrics": metrics}), reply_to=msg)


server_app = ServerApp()


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = config(context)
    torch.manual_seed(1)
    x_test, y_test = eval_set(context, SCENARIO)

    def central(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        net = Net()
        net.load_state_dict(arrays.to_torch_state_dict())
        loss, acc = evaluate(net, x_test, y_test)
        return MetricRecord({"accuracy": acc, "loss": loss})

    strategy = FedAvg(fraction_train=float(cfg["fraction-train"]), fraction_evaluate=0.0,
                      min_available_nodes=2, min_train_nodes=2, min_evaluate_nodes=2)
    strategy.start(grid=grid, initial_arrays=ArrayRecord(Net().state_dict()),
                   num_rounds=int(cfg["num-server-rounds"]),
                   train_config=ConfigRecord({"lr": float(cfg["lr"])}),
                   evaluate_fn=central)
