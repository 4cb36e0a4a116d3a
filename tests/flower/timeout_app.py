"""A ServerApp that waits for two nodes with a timeout, then pulls the missing reply."""

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
    msgs = [Message(content, n, "train", ttl=20.0) for n in sorted(grid.get_node_ids())]
    replies = list(grid.send_and_receive(msgs, timeout=5.0))
    applog.write(context, got=sorted(r.metadata.src_node_id - 1000 for r in replies))
    missing = msgs[1].metadata.message_id
    while True:
        late = list(grid.pull_messages([missing]))
        if late:
            applog.write(context, late=[r.error.code for r in late if r.has_error()])
            return
        time.sleep(0.001)
