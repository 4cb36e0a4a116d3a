"""A trainer lets a more urgent run go first in the middle of a long one, over a real ZeroMQ pair.

Seen in the AF-1 sweep: AsyncFedED with five clients per trainer overran 2 % of
its compute deadlines at dilation 1 while using a fifth of a core, because a
client's two-step run waited behind another client's hundred-step run. The
interrupted run must end exactly where it would have without the interruption.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import zmq

from fedsim.actors._requests import read_request
from fedsim.actors.worker import Worker, serve
from fedsim.scenario import parse
from fedsim.wire.codec import decode, encode
from fedsim.wire.messages import LocalWork, Shutdown, Task, Trained, Update, WorkerReady
from fedsim.wire.tensors import Model

SCENARIO = {
    "name": "preempt", "seed": 3,
    "data": {"dataset": "synthetic", "num_clients": 4},
    "model": {"name": "mlp", "hidden": [32]},
    "algorithm": {"name": "fedasync"},
    "client": {"local_steps": 4, "lr": 0.05},
    "run": {"max_updates": 1},
}
LONG = 3000   # local steps of the long run: well over 100 ms here


def _train(rid: int, client: int, steps: int, due: float, x0: np.ndarray,
           spec: object) -> list[Any]:
    """A task's frames as a host sends them to its trainer: due time and request id in
    the envelope (each its own version: their models differ)."""
    task = Task(client=client, task_id=rid, version=rid, round=0, work=LocalWork(steps=steps),
                model=Model.from_flat(x0, spec))  # type: ignore[arg-type]
    return encode(task, sent_at=due, seq=rid)


@pytest.fixture
def trainer() -> Iterator[tuple[zmq.Socket[bytes], WorkerReady]]:
    sc = parse(SCENARIO, "test")
    worker = Worker(sc, [0, 1, 2])
    ctx = zmq.Context()
    parent, child = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    addr = f"inproc://preempt-{time.monotonic_ns()}"
    parent.bind(addr)
    child.connect(addr)
    t = threading.Thread(target=serve, args=(child, worker), daemon=True)
    t.start()
    ready, _ = decode(parent.recv_multipart(), check_finite=False)
    assert isinstance(ready, WorkerReady)
    try:
        yield parent, ready
    finally:
        parent.send_multipart(encode(Shutdown()))
        t.join(30)
        parent.close(0)
        child.close(0)
        ctx.term()


def _replies(sock: zmq.Socket[bytes], n: int) -> list[tuple[Trained, Update | None]]:
    """``n`` replies, each with the update sent just before it (under its request id)."""
    out, uploads = [], {}
    while len(out) < n:
        msg, meta = decode(sock.recv_multipart(), check_finite=False)
        if isinstance(msg, Update):
            uploads[meta.seq] = msg
            continue
        assert isinstance(msg, Trained), msg
        out.append((msg, uploads.pop(msg.request_id, None)))
    return out


def _alone(requests: list[list[Any]]) -> dict[int, tuple[Trained, Update | None]]:
    """The same requests answered one by one by a fresh worker, never interrupted."""
    worker = Worker(parse(SCENARIO, "test"), [0, 1, 2])
    out = {}
    for frames in requests:
        reply, upload = worker.handle(read_request(frames, worker))
        assert isinstance(reply, Trained)
        out[reply.request_id] = (reply, upload)
    return out


def test_an_urgent_run_goes_first_and_the_interrupted_one_ends_as_if_alone(trainer) -> None:
    sock, ready = trainer
    x0 = np.full(ready.spec.nbytes // 4, 0.01, dtype=np.float32)
    long_run = _train(1, 0, LONG, due=10.0, x0=x0, spec=ready.spec)
    short_run = _train(2, 1, 3, due=0.5, x0=x0 + 0.02, spec=ready.spec)
    sock.send_multipart(long_run)
    time.sleep(0.03)                  # the long run is under way
    sent = time.perf_counter()
    sock.send_multipart(short_run)
    (first, _), (second, _) = replies = _replies(sock, 2)
    waited = time.perf_counter() - sent
    assert [first.request_id, second.request_id] == [2, 1]   # the short one did not wait
    assert second.steps == LONG
    assert first.compute_s < waited
    # the long run's compute leaves out the short one's (it was measured apart)
    alone = _alone([long_run, short_run])
    for got, upload in replies:
        ref, ref_upload = alone[got.request_id]
        assert got.steps == ref.steps
        assert got.loss == ref.loss
        assert upload is not None
        assert ref_upload is not None
        assert np.array_equal(upload.model.flat(), ref_upload.model.flat())


def test_a_later_due_or_the_same_clients_request_waits_for_the_run(trainer) -> None:
    sock, ready = trainer
    x0 = np.full(ready.spec.nbytes // 4, 0.01, dtype=np.float32)
    sock.send_multipart(_train(1, 0, LONG, due=10.0, x0=x0, spec=ready.spec))
    time.sleep(0.03)
    sock.send_multipart(_train(2, 2, 3, due=20.0, x0=x0, spec=ready.spec))  # later
    sock.send_multipart(_train(3, 0, 3, due=1.0, x0=x0, spec=ready.spec))   # same client
    order = [r.request_id for r, _ in _replies(sock, 3)]
    assert order == [1, 3, 2]   # then earliest due first
