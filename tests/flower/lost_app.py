"""A ServerApp that pushes two messages to one node and pulls until both are answered:
the first is lost on the network (the test never answers it), the second must still go."""

from __future__ import annotations

import time

import applog
import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.serverapp import Grid, ServerApp

server_app = ServerApp()


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    content = RecordDict({"arrays": ArrayRecord([np.zeros(4, np.float32)]),
                          "config": ConfigRecord({"lr": 0.05, "server-round": 1})})
    (node,) = grid.get_node_ids()
    ids = list(grid.push_messages([Message(content, node, "train", ttl=5.0),
                                   Message(content, node, "train", ttl=100.0)]))
    got = 0
    while got < 2:      # (message index, error code or None) in the order the answers came
        for r in grid.pull_messages(ids):
            got += 1
            applog.write(context, got=[ids.index(r.metadata.reply_to_message_id),
                                       r.error.code if r.has_error() else None])
        time.sleep(0.001)
