"""A torch worker: trains client tasks or evaluates the global model.

Training runs here, never on an event loop: a thread holding the GIL next to
a loop delays its timers by tens of milliseconds to seconds (measured on
this kind of machine), so a client host or the server hands the work to a
worker process over a private PAIR socket and decides, against emulated
time, when the result counts. The worker calls the scenario's
:class:`~fedsim.algorithms.api.ClientAlgorithm` and knows no algorithm by
name. Every request carries an id that its reply echoes.

:class:`InlineWorker` runs the same :class:`Worker` in the calling process
(tests on virtual time; the messages still go through the codec).

Run as ``python -m fedsim.actors.worker --scenario FILE --endpoint ADDR
--role trainer|evaluator [--clients 0,1,2 or 0:100:2]``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import math
import os
import sys
import time
from pathlib import Path
from typing import overload

import numpy as np
import torch
import zmq

from fedsim.actors import process
from fedsim.actors._requests import (
    AdvanceRequest,
    BadTask,
    Preemption,
    Reply,
    Request,
    Requests,
    TaskRequest,
    read_request,
    send_reply,
)
from fedsim.actors.setup import build_data, build_model, local_config, model_shapes
from fedsim.algorithms import check_finite, failure_cause, local_train
from fedsim.algorithms.api import ClientContext
from fedsim.algorithms.local import between_steps, load_vector
from fedsim.algorithms.sgdclient import LocalSGDClient
from fedsim.data import FederatedData
from fedsim.scenario import Scenario, parse
from fedsim.scenario.ids import parse_id_list
from fedsim.wire import statefile
from fedsim.wire.codec import Frames, decode, encode, peek
from fedsim.wire.messages import (
    Advance,
    Evaluate,
    Evaluated,
    Message,
    Shutdown,
    Trained,
    Update,
    WorkerFailed,
    WorkerReady,
    worker_answer,
)
from fedsim.wire.payloads import WINDOW, HeldVersions
from fedsim.wire.tensors import TensorSpec, flat_model, to_model, to_tensor

__all__ = ["InlineWorker", "Worker", "evaluate", "main", "run", "run_seed"]

log = logging.getLogger(__name__)


def _failing_clients() -> str:
    # Fault injection (tests, and users checking how their setup behaves when
    # devices fail): FEDSIM_FAIL_TRAIN = "all" or a comma-separated list of
    # client ids whose every local run raises, as a crashing trainer would.
    return os.environ.get("FEDSIM_FAIL_TRAIN", "").strip()


def _injected_failure(client: int) -> bool:
    spec = _failing_clients()
    return bool(spec) and (spec == "all" or str(client) in spec.replace(" ", "").split(","))


def run_seed(seed: int, *keys: int) -> int:
    """A 63-bit seed for one local run, from (scenario seed, client, task)."""
    ss = np.random.SeedSequence([seed, *[k & 0xFFFFFFFF for k in keys]])
    return int(ss.generate_state(2, dtype=np.uint64)[0] >> np.uint64(1))


@torch.no_grad()
def evaluate(
    model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int = 1024
) -> tuple[float, float]:
    """Mean cross-entropy loss and accuracy of ``model`` on ``(x, y)``."""
    model.eval()
    loss_fn = torch.nn.CrossEntropyLoss(reduction="sum")
    total_loss = 0.0
    correct = 0
    for start in range(0, len(y), batch):
        out = model(x[start : start + batch])
        total_loss += float(loss_fn(out, y[start : start + batch]))
        correct += int((out.argmax(dim=1) == y[start : start + batch]).sum())
    n = max(1, len(y))
    return total_loss / n, correct / n


class Worker:
    """The model, the shards of its clients, and the algorithm's client side.

    With ``state_path`` the client side's state (its ``state_dict``: whatever
    the algorithm keeps per client between tasks) is saved there as a
    :mod:`fedsim.wire.statefile`, atomically, at most every ``save_every``
    seconds after a task and at shutdown, and loaded from there at start: a
    client host restarted with the same state directory takes its clients'
    state back. A pickle there (an earlier fedsim's file) is refused unread.
    """

    def __init__(self, sc: Scenario, clients: list[int], state_path: str | None = None,
                 save_every: float = 2.0, data: FederatedData | None = None) -> None:
        self.sc = sc
        self.state_path = Path(state_path) if state_path else None
        self.save_every = save_every
        self._saved_at = -math.inf
        self._dirty = False
        if data is None:  # a worker forked from the zygote gets the data it built
            data = build_data(sc)
        self.model = build_model(sc, tuple(data.input_shape), int(data.num_classes))
        self.spec = TensorSpec([("float32", s) for s in model_shapes(self.model)])
        self.local = local_config(sc)
        self.clients = clients
        self.shards: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        for c in clients:
            shard = data.clients[c]
            self.shards[c] = (torch.as_tensor(shard.x), torch.as_tensor(shard.y))
        self.test = (torch.as_tensor(data.test_x), torch.as_tensor(data.test_y))
        ctx = ClientContext(model=self.model, local=self.local, seed=sc.seed,
                            num_clients=sc.data.num_clients, scenario=sc)
        self.client = sc.algorithm.spec.client(sc.algorithm, ctx)
        #: the models of the versions this worker's tasks train from
        self.held = HeldVersions()
        #: the round averages its Advances carried (its host counts on twice
        #: the versions' window: ClientHost.rounds_to_trainer)
        self.held_rounds = HeldVersions(4 * WINDOW)
        #: per client, the task its (pipelined) session answers: id, version, round
        self.sessions: dict[int, tuple[int, int, int]] = {}
        self.restored = False
        #: per request being answered (outermost first): real seconds spent on
        #: more urgent requests answered in the middle of it (see Preemption)
        self.nested: list[float] = []
        if self.state_path is not None and self.state_path.exists():
            self._restore_state(self.state_path)

    def _restore_state(self, path: Path) -> None:
        """Take the clients' state back from ``path`` (a :mod:`fedsim.wire.statefile`).

        A file of an older fedsim (a pickle) or one that is not a state file
        is refused with the reason (:class:`~fedsim.wire.statefile.StateFileError`,
        which ends the worker: its host then fails with it); a file of
        another host's or another algorithm's clients is left alone.
        """
        saved = statefile.load(path, "client-state", what_to_do=(
            "It was written by an earlier fedsim: delete it (the clients start afresh, as "
            "after a restart without --state) or move it away, then start the host again"))
        if not isinstance(saved, dict) or not {"algorithm", "clients", "state"} <= set(saved):
            raise statefile.StateFileError(f"{path} does not hold a host's client state")
        if saved["algorithm"] == self.sc.algorithm.state_key() and saved["clients"] == self.clients:
            self.client.load_state_dict(saved["state"])
            self.restored = True
            log.warning("restored the client state of %d clients from %s", len(self.clients),
                        path)
        else:
            log.warning("%s holds another host's or algorithm's client state; not restored", path)

    def save_state(self, force: bool = False) -> None:
        """Save the client side's state (if a state path is set and it changed)."""
        if self.state_path is None or not self._dirty:
            return
        now = time.monotonic()
        if not force and now - self._saved_at < self.save_every:
            return
        try:
            self.state_path.parent.mkdir(parents=True, exist_ok=True)
            statefile.save(self.state_path, {
                "algorithm": self.sc.algorithm.state_key(), "clients": self.clients,
                "state": self.client.state_dict()}, "client-state")
        except OSError as exc:  # a lost save costs a restart, not the run
            log.warning("could not save the client state to %s: %s", self.state_path, exc)
        except TypeError as exc:  # a state_dict holding what a state file cannot
            log.error("could not save the client state to %s: %s", self.state_path, exc)
        self._saved_at, self._dirty = now, False

    def warm_up(self) -> None:
        """Run one throw-away step so torch's lazy start-up is not billed to a task."""
        x0 = torch.nn.utils.parameters_to_vector(self.model.parameters()).detach().clone()
        if self.shards:
            x, y = next(iter(self.shards.values()))
            local_train(self.model, x0, x[:8], y[:8], self.local, torch.Generator().manual_seed(0))
        else:
            evaluate(self.model, self.test[0][:8], self.test[1][:8])
        load_vector(self.model, x0)

    def ready(self) -> WorkerReady:
        return WorkerReady(samples=tuple(len(self.shards[c][1]) for c in self.clients),
                           spec=self.spec)

    def handle(self, msg: Request) -> Reply:
        """Answer one request: the reply and the update it uploads, if any.

        An exception becomes a WorkerFailed (the worker goes on)."""
        rid = getattr(msg, "request_id", -1)
        try:
            return self._handle(msg)
        except Exception as exc:
            cause = failure_cause(exc)
            if cause == "error":
                log.exception("request %d failed", rid)
            else:  # the run's own numbers went out of range: no traceback to read
                log.error("request %d failed (%s): %s", rid, cause, exc)
            return WorkerFailed(request_id=rid, cause=cause,
                                reason=f"{type(exc).__name__}: {exc}"[:1000]), None

    def _handle(self, msg: Request) -> Reply:
        started = time.perf_counter()
        self.nested.append(0.0)
        try:
            return self._answer(msg, started)
        finally:
            self.nested.pop()

    def _compute_s(self, started: float) -> float:
        """Real seconds since ``started`` spent on this request (not on runs it let go first)."""
        return time.perf_counter() - started - self.nested[-1]

    def _answer(self, msg: Request, started: float) -> Reply:
        if isinstance(msg, Evaluate):
            load_vector(self.model, to_tensor(msg.model))
            loss, acc = evaluate(self.model, *self.test)
            return Evaluated(request_id=msg.request_id, version=msg.version, loss=loss,
                             accuracy=acc, seconds=self._compute_s(started)), None
        if isinstance(msg, BadTask):
            raise ValueError(msg.reason)
        if not isinstance(msg, TaskRequest | AdvanceRequest):
            raise ValueError(f"a worker does not take a {type(msg).__name__}")
        c = msg.client
        if c not in self.shards:
            raise ValueError(f"client {c} is not served by this worker")
        x, y = self.shards[c]
        if _injected_failure(c):
            raise RuntimeError(f"injected training failure of client {c} (FEDSIM_FAIL_TRAIN)")
        if isinstance(msg, AdvanceRequest):
            averages = [(r, to_tensor(model)) for r, model in msg.averages]
            out = self.client.advance(c, averages, x, y)
            task_id, version, round_ = self.sessions.get(c, (0, 0, 0))
        else:
            task = msg.task
            gen = torch.Generator().manual_seed(run_seed(self.sc.seed, c, task.task_id))
            out = self.client.begin(task, x, y, gen)
            task_id, version, round_ = self.sessions[c] = (task.task_id, task.version,
                                                           task.round)
        upload = None
        if out.upload is not None:
            # a run whose model went to NaN or an infinity is that client's failed
            # run (counted with its cause), not a message the server would refuse
            if out.upload.dtype == torch.uint8:   # a byte payload, not a model
                model = flat_model(out.upload)
            else:
                check_finite(out.upload, f"trained model of client {c}")
                copies = out.upload.numel() * 4 // self.spec.nbytes
                model = to_model(out.upload, self.spec.repeated(copies))
            r = out.upload_round
            upload = Update(client=c, task_id=task_id,
                            base_version=version if r is None else r,
                            round=round_ if r is None else r, num_samples=len(y),
                            steps=out.steps, loss=out.loss, model=model)
        self._dirty = True
        self.save_state()
        return Trained(request_id=msg.request_id, client=c, steps=out.steps, loss=out.loss,
                       compute_s=self._compute_s(started), upload=upload is not None,
                       next=out.next, wait_round=out.wait_round, notes=dict(out.notes),
                       cpu_s=out.cpu_s), upload


class InlineWorker:
    """A :class:`Worker` in this process, with the interface of a worker handle."""

    def __init__(self, sc: Scenario, clients: list[int], state_path: str | None = None,
                 save_every: float = 2.0) -> None:
        self.worker = Worker(sc, clients, state_path, save_every)
        self._ids = itertools.count(1)
        self._uploads: dict[int, Frames] = {}

    async def start(self) -> WorkerReady:
        return self.worker.ready()

    def next_id(self) -> int:
        return next(self._ids)

    @overload
    async def request(self, msg: Advance) -> Trained | WorkerFailed: ...
    @overload
    async def request(self, msg: Evaluate) -> Evaluated | WorkerFailed: ...
    async def request(self, msg: Advance | Evaluate) -> Trained | Evaluated | WorkerFailed:
        """Answer at once (the work runs on this loop; virtual time does not move)."""
        reply = self._reply(read_request(encode(msg), self.worker))
        if isinstance(msg, Evaluate):
            return worker_answer(reply, msg.request_id, Evaluated)
        return worker_answer(reply, msg.request_id, Trained)

    async def train(self, frames: Frames) -> Trained | WorkerFailed:
        """Answer a task's frames (stamped with its due time and request id) at once."""
        rid = peek(frames).seq
        return worker_answer(self._reply(read_request(frames, self.worker)), rid, Trained)

    def upload(self, request_id: int) -> Frames | None:
        """The frames of the update the reply to ``request_id`` uploads (None: none)."""
        return self._uploads.pop(request_id, None)

    def _reply(self, request: Request) -> Message:
        reply, upload = self.worker.handle(request)
        if upload is not None:
            self._uploads[getattr(reply, "request_id", 0)] = encode(
                upload, seq=getattr(reply, "request_id", 0))
        msg, _ = decode(encode(reply), max_header=None, check_finite=False)
        return msg

    async def close(self) -> None:
        self.worker.save_state(force=True)


def serve(sock: zmq.Socket[bytes], worker: Worker) -> None:
    """Answer requests until a Shutdown arrives or the socket closes.

    Before each request it takes every request already waiting on the
    socket and answers the earliest due (:class:`Requests`); a trainer of
    plain local-training clients also lets a more urgent request go first
    in the middle of a run (:class:`Preemption`).
    """
    sock.send_multipart(encode(worker.ready()), copy=False)
    waiting = Requests()
    preempt = Preemption(sock, worker, waiting)
    if isinstance(getattr(worker, "client", None), LocalSGDClient) and getattr(
            worker, "shards", None):
        between_steps(preempt)
    try:
        while True:
            if not waiting:
                waiting.push(read_request(sock.recv_multipart(copy=False), worker))
            preempt.read()
            msg = waiting.pop()
            if isinstance(msg, Shutdown):
                worker.save_state(force=True)
                return
            send_reply(sock, preempt.answer(msg))
    finally:
        between_steps(None)


def run(sc: Scenario, endpoint: str, clients: list[int], state: str | None = None,
        data: FederatedData | None = None) -> int:
    """Build the worker (from ``data`` when given: a forked worker's) and serve ``endpoint``."""
    torch.set_num_threads(1)
    # A spawned worker builds the data (a long set-up): in the idle class from
    # the start. A forked one's set-up is a few ms, done at normal priority (in
    # the idle class the evaluator's waited 0.37 s behind the client hosts'
    # imports, and the federation's start with it), and it enters the class
    # after. Either way before its ZeroMQ I/O thread is made, which inherits it.
    if data is None:
        process.yield_cpu_to_loops()
    try:
        worker = Worker(sc, clients, state, data=data)
    except statefile.StateFileError as exc:   # --state holds a file it must not read
        log.error("%s", exc)
        return 2
    worker.warm_up()
    if data is not None:
        process.yield_cpu_to_loops()
    process.freeze_heap()  # a full collection mid-run would be a compute overrun
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PAIR)
    sock.connect(endpoint)
    try:
        serve(sock, worker)
    finally:
        sock.close(linger=1000)
        ctx.term()
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of a worker process."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--scenario", required=True, help="resolved scenario JSON file")
    ap.add_argument("--endpoint", required=True)
    ap.add_argument("--role", choices=["trainer", "evaluator"], required=True)
    ap.add_argument("--clients", default="")
    ap.add_argument("--state", default=None, help="file for the clients' state (restarts)")
    ap.add_argument("--parent", type=int, default=None)
    args = ap.parse_args(argv)
    if not process.become_child(args.parent, f"worker-{args.role}-{os.getpid()}"):
        return 0
    with open(args.scenario) as fh:
        sc = parse(json.load(fh), args.scenario)
    clients = parse_id_list(args.clients)
    return run(sc, args.endpoint, clients, args.state)


if __name__ == "__main__":
    sys.exit(main())
