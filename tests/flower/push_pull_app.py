"""A Flower app that uses push_messages / pull_messages itself: an asynchronous strategy.

Each node trains from the newest model; as each reply arrives (pull), the
server mixes it in (x <- (1 - a) x + a x_i) and sends that node the new
model straight away, for ``updates`` replies in all. Staleness emerges from
the arrival order, which fedsim's network sets."""

from __future__ import annotations

import time

import applog
import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.serverapp import Grid, ServerApp

server_app = ServerApp()


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    updates = int(context.run_config.get("updates", 9))
    alpha = 0.5
    x = np.zeros(4, np.float32)
    nodes = list(grid.get_node_ids())

    def send(node: int) -> str:
        content = RecordDict({"arrays": ArrayRecord([x.copy()]),
                              "config": ConfigRecord({"lr": 0.05, "server-round": 1})})
        (mid,) = grid.push_messages([Message(content, node, "train")])
        return mid

    waiting = {send(n) for n in nodes}
    done = 0
    while done < updates:
        replies = list(grid.pull_messages(waiting))
        if not replies:
            time.sleep(0.001)
            continue
        for r in replies:
            waiting.discard(r.metadata.reply_to_message_id)
            applog.write(context, node=r.metadata.src_node_id - 1000)
            if r.has_error():
                continue
            x = (1 - alpha) * x + alpha * r.content["arrays"].to_numpy_ndarrays()[0]
            done += 1
            if done < updates:
                waiting.add(send(r.metadata.src_node_id))
