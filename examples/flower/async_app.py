"""An asynchronous strategy written as a Flower ServerApp: FedAsync with push and pull.

Flower's built-in strategies are synchronous (``send_and_receive`` a round at
a time). This ServerApp keeps ``concurrency`` nodes training at once with
``grid.push_messages`` and, as each reply arrives (``grid.pull_messages``),
mixes it into the model, ``x <- (1 - alpha) x + alpha x_i``, and sends that
node the new model. Nothing in it counts staleness: under fedsim the replies
arrive in the order the clients' links and devices set, and the run's
staleness (``fedsim run examples/flower/async.toml``: the summary's staleness
line, ``staleness.png``) is what emerges. The ClientApp is digits_app's.
"""

from __future__ import annotations

import random
import time

from digits_app import SCENARIO, Net, client_app, evaluate  # noqa: F401 (client_app: the app's)
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.serverapp import Grid, ServerApp

from fedsim.flower import eval_set

DEFAULTS = {"updates": 200, "concurrency": 5, "alpha": 0.5, "lr": 0.1, "local-epochs": 1,
            "batch-size": 16}

server_app = ServerApp()


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = {**DEFAULTS, **context.run_config}
    alpha, updates = float(cfg["alpha"]), int(cfg["updates"])
    net = Net()
    x = net.state_dict()
    rng = random.Random(1)
    x_test, y_test = eval_set(context, SCENARIO)
    version = 0

    def send(node: int) -> str:
        content = RecordDict({"arrays": ArrayRecord(x),
                              "config": ConfigRecord({"lr": float(cfg["lr"]),
                                                      "server-round": version})})
        (mid,) = grid.push_messages([Message(content, node, "train")])
        return mid

    idle = list(grid.get_node_ids())
    rng.shuffle(idle)
    # message id -> its node: an error reply comes from the SuperLink, not the node
    waiting: dict[str, int] = {}
    for _ in range(min(int(cfg["concurrency"]), len(idle))):
        node = idle.pop()
        waiting[send(node)] = node
    while version < updates:
        replies = list(grid.pull_messages(list(waiting)))
        if not replies:
            time.sleep(0.002)            # the grid's replies come in emulated time
            continue
        for reply in replies:
            node = waiting.pop(reply.metadata.reply_to_message_id)
            if not reply.has_error():
                theirs = reply.content["arrays"].to_torch_state_dict()
                x = {k: (1 - alpha) * v + alpha * theirs[k] for k, v in x.items()}
                version += 1
                if version % 20 == 0:
                    net.load_state_dict(x)
                    print(f"update {version}: test accuracy {evaluate(net, x_test, y_test)[1]:.3f}")
            idle.append(node)
            rng.shuffle(idle)
            if version < updates:
                node = idle.pop()
                waiting[send(node)] = node
