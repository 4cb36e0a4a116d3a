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
import dataclasses
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
from fedsim.algorithms import LocalConfig, local_train, unflatten
from fedsim.algorithms.fedspeed import FedSpeedConfig, fedspeed_local_train
from fedsim.algorithms.local import load_vector
from fedsim.algorithms.scaffold import scaffold_local_train
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
    """Holds the model, the shards of its clients, and serves requests."""

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
        # Per-client state kept across rounds (FedSpeed's g_hat, SCAFFOLD's c_i).
        self.state: dict[int, torch.Tensor] = {}
        self.dga: Any = None

    def warm_up(self) -> None:
        """Run one throw-away step so torch's lazy start-up is not billed to a task."""
        x0 = torch.nn.utils.parameters_to_vector(self.model.parameters()).detach().clone()
        if self.shards:
            x, y = next(iter(self.shards.values()))
            local_train(self.model, x0, x[:8], y[:8], self.local, torch.Generator().manual_seed(0))
        else:
            evaluate(self.model, self.test[0][:8], self.test[1][:8])
        load_vector(self.model, x0)

    def local_for(self, msg: wire.Task) -> LocalConfig:
        """The local config, with the task's own budget (AsyncFedED's adaptive K)."""
        if "epochs" in msg.config:
            return dataclasses.replace(self.local, steps=None, epochs=float(msg.config["epochs"]))
        if "steps" in msg.config:
            return dataclasses.replace(self.local, epochs=None, steps=int(msg.config["steps"]))
        return self.local

    def train(self, msg: wire.Task, x0: torch.Tensor, x: torch.Tensor, y: torch.Tensor,
              gen: torch.Generator) -> tuple[torch.Tensor, dict[str, Any]]:
        """One local run of the scenario's client algorithm; returns the upload."""
        alg = self.sc.algorithm
        local = self.local_for(msg)
        c = msg.client
        if _injected_failure(c):
            raise RuntimeError(f"injected training failure of client {c} (FEDSIM_FAIL_TRAIN)")
        if alg.name == "fedspeed":
            cfg = FedSpeedConfig(
                prox_lambda=alg.prox_lambda, perturb_alpha=alg.perturb_alpha,
                ascent_rho=alg.ascent_rho, ascent_mode=alg.ascent_mode, prox=alg.prox,
                correction=alg.correction, perturbation=alg.perturbation,
                clip_norm=alg.clip_norm)
            upload, self.state[c], stats = fedspeed_local_train(
                self.model, x0, x, y, local, cfg, self.state.get(c), gen)
            return upload, stats
        if alg.name == "scaffold":
            n = x0.numel() // 2
            w, c_global = x0[:n], x0[n:]
            c_old = self.state.get(c)
            y_i, c_new, stats = scaffold_local_train(
                self.model, w, c_global, c_old, x, y, local, gen, option=alg.option)
            delta_c = c_new - (c_old if c_old is not None else torch.zeros_like(c_new))
            self.state[c] = c_new
            return torch.cat([y_i.to(torch.float32), delta_c.to(torch.float32)]), stats
        return local_train(self.model, x0, x, y, local, gen)

    def handle_dga(self, msg: wire.Task, x0: torch.Tensor, x: torch.Tensor,
                   y: torch.Tensor) -> wire.Update:
        from fedsim.actors.dga import DGAWorkerState

        if self.dga is None:
            self.dga = DGAWorkerState(self.sc, self.model, self.sc.seed)
        out: torch.Tensor | None = None
        if msg.config["op"] == "dga_init":
            self.dga.init(msg.client, x0, len(y))
            stats: dict[str, Any] = {"action": "init"}
        else:
            out, stats = self.dga.step(msg.client, msg, x, y, self.n_params)
        return wire.Update(
            client=msg.client, task_id=msg.task_id, base_version=int(stats.get("round", 0)),
            round=int(stats.get("round", 0)), num_samples=len(y),
            tensors=() if out is None else vector_frames(out, self.shapes), stats=stats)

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
        if msg.config.get("op") == "eval":
            load_vector(self.model, x0)
            loss, acc = evaluate(self.model, *self.test)
            return wire.Control(
                op="evaluated",
                args={
                    "version": msg.version, "task_id": msg.task_id, "loss": loss,
                    "accuracy": acc, "seconds": time.perf_counter() - started,
                },
            )
        x, y = self.shards[msg.client]
        op = msg.config.get("op")
        if op in ("dga_init", "dga_step"):
            return self.handle_dga(msg, x0, x, y)
        gen = torch.Generator().manual_seed(run_seed(self.sc.seed, msg.client, msg.task_id))
        vec, stats = self.train(msg, x0, x, y, gen)
        stats["compute_s"] = time.perf_counter() - started
        return wire.Update(
            client=msg.client, task_id=msg.task_id, base_version=msg.version,
            round=msg.round, num_samples=len(y),
            tensors=vector_frames(vec, self.shapes * (vec.numel() // self.n_params)),
            stats=stats,
        )


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
