"""The trainer answers waiting requests earliest-due first, over a real ZeroMQ pair.

A host's clients often start their local work at one emulated instant (a
FedAvg round). Taken first in, first out, a two-step run waited behind a
hundred-step one and missed its compute deadline at any dilation (seen in
the DS-2 sweep: a 2-step client overran by 0.11 emulated s at dilation 4).
"""

from __future__ import annotations

import threading

import zmq

from fedsim.actors._requests import AdvanceRequest
from fedsim.actors.worker import Requests, serve
from fedsim.wire.codec import decode, encode
from fedsim.wire.messages import Advance, Message, Shutdown, WorkerFailed, WorkerReady
from fedsim.wire.payloads import HeldVersions
from fedsim.wire.tensors import TensorSpec


def _advance(client: int, due: float | None) -> Advance:
    return Advance(request_id=client, client=client, rounds=(), model=None, due=due)


def test_requests_come_out_earliest_due_first_then_in_arrival_order() -> None:
    q = Requests()
    for client, due in [(0, 9.3), (1, 0.2), (2, None), (3, 0.2), (4, 5.0)]:
        q.push(_advance(client, due))
    order = []
    while q:
        msg = q.pop()
        assert isinstance(msg, Advance)
        order.append(msg.client)
    assert order == [2, 1, 3, 4, 0]   # no due first; equal dues in arrival order


class _Recorder:
    """A worker that records the order it is asked in."""

    def __init__(self) -> None:
        self.order: list[int] = []
        self.saved = False
        self.held = HeldVersions()
        self.held_rounds = HeldVersions()
        self.spec = TensorSpec([])

    def ready(self) -> WorkerReady:
        return WorkerReady(samples=(), spec=TensorSpec([]))

    def handle(self, msg: Message | AdvanceRequest) -> tuple[Message, None]:
        assert isinstance(msg, AdvanceRequest)
        self.order.append(msg.client)
        return WorkerFailed(request_id=msg.request_id, cause="error", reason="recorded"), None

    def save_state(self, force: bool = False) -> None:
        self.saved = True


def test_the_worker_loop_takes_everything_waiting_and_answers_the_earliest_due() -> None:
    ctx = zmq.Context()
    parent, child = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    t: threading.Thread | None = None
    try:
        parent.bind("inproc://worker-order")
        child.connect("inproc://worker-order")
        # a long run (due late), then short ones, all queued before the worker looks
        for client, due in [(0, 3.72), (1, 0.08), (2, 0.12), (3, 0.04)]:
            parent.send_multipart(encode(_advance(client, due)))
        rec = _Recorder()
        t = threading.Thread(target=serve, args=(child, rec))
        t.start()
        ready, _ = decode(parent.recv_multipart(), check_finite=False)
        assert isinstance(ready, WorkerReady)
        replies = [decode(parent.recv_multipart(), check_finite=False)[0] for _ in range(4)]
        assert [r.request_id for r in replies if isinstance(r, WorkerFailed)] == [3, 1, 2, 0]
        assert rec.order == [3, 1, 2, 0]    # first in, first out would have been 0, 1, 2, 3
        parent.send_multipart(encode(Shutdown()))
        t.join(10)
        assert not t.is_alive()
        assert rec.saved
    finally:
        if t is not None and t.is_alive():   # a failed check: still end the worker loop
            parent.send_multipart(encode(Shutdown()))
            t.join(10)
        parent.close(0)
        child.close(0)
        ctx.term()


def test_a_reply_of_another_kind_is_its_requests_failure_named() -> None:
    """A trainer's reply reaches its client as what the request asks for (Trained,
    Evaluated) or a WorkerFailed; any other message in its place is the request's
    failure, named, never passed on untyped."""
    from fedsim.wire.messages import Evaluated, Trained
    from fedsim.wire.messages import worker_answer as answer

    ok = Evaluated(request_id=4, version=2, loss=0.5, accuracy=0.9, seconds=0.1)
    assert answer(ok, 4, Evaluated) is ok
    failed = WorkerFailed(request_id=4, cause="overflow", reason="step size")
    assert answer(failed, 4, Trained) is failed
    wrong = answer(ok, 4, Trained)
    assert isinstance(wrong, WorkerFailed)
    assert (wrong.request_id, wrong.cause) == (4, "error")
    assert wrong.reason == "the worker answered with Evaluated, not Trained"
