"""A torch worker process: trains client tasks or evaluates the global model.

Training runs here, in its own process with one torch thread, never on an
event loop: a thread holding the GIL next to a loop delays its timers by
tens of milliseconds to seconds (MEASUREMENTS.md §2). The worker serves
one request at a time over a private PAIR socket; the client host (or the
server, for evaluation) decides when the result counts, against emulated
time.

Run as ``python -m fedsim.actors.worker --scenario FILE --endpoint ADDR
--role trainer|evaluator [--clients 0,1,2]``.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import signal
import sys
import time
from typing import Any

import numpy as np
import torch
import zmq

from fedsim import wire
from fedsim.actors import _proc
from fedsim.actors._setup import build_data, build_model, local_config, model_shapes
from fedsim.algorithms import get, local_train, unflatten
from fedsim.algorithms.api import Budget, ClientContext, LocalRun
from fedsim.algorithms.local import load_vector
from fedsim.scenario import Scenario, parse

__all__ = ["evaluate", "main", "run_seed"]

# Fault injection (tests, and users checking how their setup behaves when
# devices fail): FEDSIM_FAIL_TRAIN = "all" or a comma-separated list of client
# ids whose every local run raises, as a crashing on-device trainer would.
_FAIL_TRAIN = os.environ.get("FEDSIM_FAIL_TRAIN", "").strip()


def _injected_failure(client: int) -> bool:
    if not _FAIL_TRAIN:
        return False
    return _FAIL_TRAIN == "all" or str(client) in _FAIL_TRAIN.replace(" ", "").split(",")

log = logging.getLogger(__name__)


def run_seed(seed: int, *keys: int) -> int:
    """A 63-bit seed for one local run, from (scenario seed, client, task)."""
    ss = np.random.SeedSequence([seed, *[k & 0xFFFFFFFF for k in keys]])
    return int(ss.generate_state(2, dtype=np.uint64)[0] >> np.uint64(1))


def to_vector(arrays: tuple[np.ndarray, ...]) -> torch.Tensor:
    """One writable float32 vector from received (read-only) arrays."""
    if not arrays:
        return torch.zeros(0)
    flat = np.concatenate([np.asarray(a, dtype=np.float32).reshape(-1) for a in arrays])
    return torch.from_numpy(flat)


def vector_frames(vec: torch.Tensor, shapes: list[tuple[int, ...]]) -> tuple[np.ndarray, ...]:
    """Zero-copy numpy views of a flat vector, one per parameter tensor."""
    return tuple(t.numpy() for t in unflatten(vec.contiguous(), shapes))


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
    """Holds the model, the shards of its clients and the algorithm's client side."""

    def __init__(self, sc: Scenario, role: str, clients: list[int]) -> None:
        self.sc = sc
        self.role = role
        data = build_data(sc)
        self.model = build_model(sc, tuple(data.input_shape), int(data.num_classes))
        self.shapes = model_shapes(self.model)
        self.n_params = sum(math.prod(s) for s in self.shapes)
        self.local = local_config(sc)
        self.shards: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        for c in clients:
            shard = data.clients[c]
            self.shards[c] = (torch.as_tensor(shard.x), torch.as_tensor(shard.y))
        self.test = (torch.as_tensor(data.test_x), torch.as_tensor(data.test_y))
        ctx = ClientContext(model=self.model, local=self.local, seed=sc.seed)
        self.client = get(sc.algorithm.name).client(sc.algorithm, ctx)

    def warm_up(self) -> None:
        """Run one throw-away step so torch's lazy start-up is not billed to a task."""
        x0 = torch.nn.utils.parameters_to_vector(self.model.parameters()).detach().clone()
        if self.shards:
            x, y = next(iter(self.shards.values()))
            local_train(self.model, x0, x[:8], y[:8], self.local, torch.Generator().manual_seed(0))
        else:
            evaluate(self.model, self.test[0][:8], self.test[1][:8])
        load_vector(self.model, x0)

    def hello(self) -> wire.Control:
        return wire.Control(
            op="ready",
            args={"samples": {str(c): len(y) for c, (_, y) in self.shards.items()}},
        )

    def handle(self, msg: Any) -> Any:
        if not isinstance(msg, wire.Task):
            raise ValueError(f"worker got unexpected message {type(msg).__name__}")
        x0 = to_vector(msg.tensors)
        started = time.perf_counter()
        op = msg.config.get("op")
        if op == "eval":
            load_vector(self.model, x0)
            loss, acc = evaluate(self.model, *self.test)
            return wire.Control(
                op="evaluated",
                args={
                    "version": msg.version, "task_id": msg.task_id, "loss": loss,
                    "accuracy": acc, "seconds": time.perf_counter() - started,
                },
            )
        c = msg.client
        x, y = self.shards[c]
        if _injected_failure(c):
            raise RuntimeError(f"injected training failure of client {c} (FEDSIM_FAIL_TRAIN)")
        if op == "advance":
            rounds = [int(r) for r in msg.config.get("rounds", [])]
            averages = [(r, x0[i * self.n_params:(i + 1) * self.n_params])
                        for i, r in enumerate(rounds)]
            out = self.client.advance(c, averages, x, y)
        else:
            budget = None
            if "steps" in msg.config or "epochs" in msg.config:
                budget = Budget(steps=msg.config.get("steps"), epochs=msg.config.get("epochs"))
            gen = torch.Generator().manual_seed(run_seed(self.sc.seed, c, msg.task_id))
            run = LocalRun(client=c, task_id=msg.task_id, version=msg.version, round=msg.round,
                           payload=x0, budget=budget)
            out = self.client.begin(run, x, y, gen)
        stats: dict[str, Any] = {
            "steps": out.steps, "loss": out.loss, "next": out.next,
            "compute_s": time.perf_counter() - started, **out.notes}
        if out.upload_round is not None:
            stats["upload_round"] = out.upload_round
        if out.wait_round is not None:
            stats["wait_round"] = out.wait_round
        vec = out.upload
        tensors = () if vec is None else vector_frames(
            vec.to(torch.float32), self.shapes * (vec.numel() // self.n_params))
        return wire.Update(client=c, task_id=msg.task_id, base_version=msg.version,
                           round=msg.round, num_samples=len(y), tensors=tensors, stats=stats)


def serve(sock: zmq.Socket, worker: Worker) -> None:
    """Answer requests until a Bye arrives or the socket closes."""
    sock.send_multipart(wire.encode(worker.hello()), copy=False)
    while True:
        frames = sock.recv_multipart(copy=False)
        msg, _ = wire.decode(frames, check_finite=False)
        if isinstance(msg, wire.Bye):
            return
        try:
            reply = worker.handle(msg)
        except Exception as exc:  # report, keep serving
            log.exception("request failed")
            reply = wire.Error(sender=-1, reason=f"{type(exc).__name__}: {exc}")
        sock.send_multipart(wire.encode(reply), copy=False)


def main(argv: list[str] | None = None) -> int:
    """Entry point of a worker process."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--scenario", required=True, help="resolved scenario JSON file")
    ap.add_argument("--endpoint", required=True)
    ap.add_argument("--role", choices=["trainer", "evaluator"], required=True)
    ap.add_argument("--clients", default="")
    ap.add_argument("--parent", type=int, default=None)
    args = ap.parse_args(argv)
    _proc.die_with_parent(args.parent)
    _proc.ignore_sigint()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    _proc.configure_child_logging(f"worker-{args.role}-{os.getpid()}")
    torch.set_num_threads(1)
    _proc.yield_cpu_to_loops()
    with open(args.scenario) as fh:
        sc = parse(json.load(fh), args.scenario)
    clients = [int(c) for c in args.clients.split(",") if c]
    worker = Worker(sc, args.role, clients)
    worker.warm_up()
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PAIR)
    sock.connect(args.endpoint)
    try:
        serve(sock, worker)
    finally:
        sock.close(linger=1000)
        ctx.term()
    return 0


if __name__ == "__main__":
    sys.exit(main())
