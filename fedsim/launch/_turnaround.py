"""How long a round's messages take through two processes on this host (``--dilation auto``).

:func:`measure_turnaround` starts a second Python process (this module run as
``python -m fedsim.launch._turnaround ADDRESS LOOP PARENT MAX_BYTES``: an event loop of the
scenario's kind, like a client host's), sends it bursts of task messages
carrying the scenario's model over the scenario's transport, and times each
burst until every message has come back as an update: the sender encodes
each task, the echo decodes it and encodes an update from it, the sender
decodes that. It is the work a synchronous round's tasks cost between the
server's loop and a client host's, plus the wake-ups of a second process,
at the machine's load of the moment; :func:`fedsim.launch.dilation.calibrate_dilation`
sizes the dilation for links too short to hide it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import TYPE_CHECKING

import numpy as np
import zmq

from fedsim.actors import process
from fedsim.wire.codec import decode, encode_body, header_bound, max_message_bytes, stamp
from fedsim.wire.messages import Task, Update
from fedsim.wire.tensors import Model
from fedsim.wire.transport import ZmqContext, ipc_address

if TYPE_CHECKING:
    from fedsim.scenario import Scenario
    from fedsim.wire.tensors import TensorSpec

__all__ = ["measure_turnaround"]

#: the most messages one burst carries; a round of more is timed pro rata
MAX_BURST = 16


def measure_turnaround(sc: Scenario, spec: TensorSpec, messages: int, bursts: int = 15) -> float:
    """Median real seconds for ``messages`` task messages to go out and come back.

    ``spec`` is the :class:`~fedsim.wire.tensors.TensorSpec` a task carries.
    Bursts of at most :data:`MAX_BURST` messages are timed (the first one
    warms up) and the median is scaled to ``messages``. Takes about 0.3 s,
    most of it starting the second process.
    """
    from fedsim.scenario.plugins import child_env  # lazy: the echo process runs without pydantic

    burst = max(1, min(messages, MAX_BURST))
    flat = np.zeros(spec.nbytes // 4, dtype=np.float32)
    max_bytes = (max_message_bytes(spec) if sc.deploy.max_message_mb is None
                 else int(sc.deploy.max_message_mb * 1e6))
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 30_000)
    if sc.deploy.transport == "ipc":
        sock.bind(ipc_address(f"{os.getpid()}-{time.monotonic_ns()}", "turnaround"))
    else:
        sock.bind("tcp://127.0.0.1:0")
    address = sock.getsockopt_string(zmq.LAST_ENDPOINT)
    echo = subprocess.Popen([sys.executable, "-m", "fedsim.launch._turnaround", address,
                             sc.deploy.loop, str(os.getpid()), str(max_bytes)],
                            stdin=subprocess.DEVNULL, env=child_env())
    times: list[float] = []
    try:
        peer, _ = sock.recv_multipart()
        for b in range(bursts + 1):
            t0 = time.perf_counter()
            for i in range(burst):
                body = encode_body(Task(client=0, task_id=i, version=0, round=0, work=None,
                                        model=Model.from_flat(flat, spec)))
                sock.send_multipart([peer, *stamp(body, sent_at=0.0, seq=i)], copy=False)
            for _ in range(burst):
                decode(sock.recv_multipart(copy=False)[1:], max_bytes=max_bytes,
                       max_header=header_bound(spec), spec=spec)
            if b:
                times.append(time.perf_counter() - t0)
        sock.send_multipart([peer, b"bye"])
    except zmq.Again:
        raise RuntimeError("the turnaround probe's second process did not answer") from None
    finally:
        try:
            echo.wait(5.0)
        except subprocess.TimeoutExpired:
            echo.kill()
            echo.wait()
        sock.close()
        ctx.term()
    return float(np.median(times)) * messages / burst


async def _echo(address: str, max_bytes: int) -> None:
    """Answer every task with an update carrying its model, until a one-frame message."""
    ctx = ZmqContext(max_message_bytes=max_bytes)
    conn = ctx.connect(address, b"echo", None)
    try:
        await conn.send([b"hello"])
        while True:
            frames = await conn.recv()
            if len(frames) == 1:
                return
            msg, _ = decode(frames, max_bytes=max_bytes, max_header=None)
            assert isinstance(msg, Task)
            assert msg.model is not None  # the probe sends every task with its model
            body = encode_body(Update(client=msg.client, task_id=msg.task_id, base_version=0,
                                      round=0, num_samples=1, steps=1, loss=None,
                                      model=msg.model))
            await conn.send(stamp(body, sent_at=0.0, seq=msg.task_id))
    finally:
        conn.close(linger_ms=0)
        ctx.close(linger_ms=0)


def main(argv: list[str] | None = None) -> int:
    """The echo process.

    ``python -m fedsim.launch._turnaround ADDRESS LOOP PARENT_PID MAX_BYTES``.
    """
    address, loop, parent, max_bytes = (sys.argv[1:] if argv is None else argv)[:4]
    if not process.die_with_parent(int(parent)):
        return 0
    process.ignore_sigint()
    process.run_loop(_echo(address, int(max_bytes)), loop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
