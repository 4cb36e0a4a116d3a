"""DGA over real sockets: the server's reducer, the client's driver, the worker's half.

Delayed Gradient Averaging (ALGORITHMS.md §3) keeps every client stepping
while its round's accumulated gradient travels to the server and the
round's average travels back. The pure state machines are in
:mod:`fedsim.algorithms.dga`; this module runs them:

* :class:`DGAStrategy` (server): sends every client the initial model once,
  reduces each round's uploads with :class:`~fedsim.algorithms.dga.DGAServer`
  and broadcasts the mean as an ``Aggregate`` (through each client's downlink).
  The model it evaluates is the *virtual average* ``x0 - lr * sum(mean_t)``
  (``x0 - sum(mean_t)`` with displacement accumulation), which every
  client's model equals on average once its corrections are in (the DGA
  mean invariant, Lemma A.1; with momentum it is the plain-SGD reading).
* :func:`drive` (client actor): asks the host's torch worker to take
  ``chunk_steps`` local steps at a time, holds each chunk until its emulated
  compute time has passed, sends a round's accumulator as soon as the
  client closes the round, passes every average that has arrived on to the
  worker before the next chunk (auto mode applies it there; paper mode
  holds it until step ``r``), and blocks for real when the client must wait.
  So the overlap of communication and computation, and in auto mode the
  delay ``D`` itself, come from the emulated network.
* :class:`DGAWorkerState` (torch worker): one :class:`DGAClient` per client,
  minibatch gradients at the client's current model.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from fedsim import wire
from fedsim.actors.strategies import Step
from fedsim.algorithms import ClientResult, NonFiniteUpdate, flatten
from fedsim.algorithms.dga import DGAClient, DGAConfig, DGAServer, Done, Send, Wait
from fedsim.algorithms.dga import Step as DGAStep
from fedsim.algorithms.local import _batches, load_vector
from fedsim.scenario import Scenario

if TYPE_CHECKING:
    from fedsim.actors.client import ClientActor

__all__ = ["DGAStrategy", "DGAWorkerState", "dga_config", "drive"]

log = logging.getLogger(__name__)


def dga_config(sc: Scenario) -> DGAConfig:
    """The pure DGA config of a scenario (lr and momentum from ``[client]``)."""
    alg, c = sc.algorithm, sc.client
    if c.optimizer not in ("sgd", "sgdm"):
        raise ValueError(f"client.optimizer = {c.optimizer!r}: DGA runs sgd or sgdm")
    return DGAConfig(
        local_steps=alg.local_steps, delay=alg.delay, lr=c.lr,
        momentum=c.momentum if c.optimizer == "sgdm" else 0.0, mode=alg.mode,
        accumulate=alg.accumulate, correction=alg.correction, c_beta=alg.c_beta,
        max_pending=alg.max_pending,
    )


class DGAStrategy:
    """Server side of DGA: start everyone once, reduce and broadcast each round."""

    kind = "sync"

    def __init__(self, sc: Scenario, x0: torch.Tensor) -> None:
        self.cfg = dga_config(sc)
        if self.cfg.momentum > 0 and self.cfg.c_beta == "paper" and self.cfg.delay > 1:
            log.warning("DGA: c_beta = 'paper' with momentum over-corrects (v already carries "
                        "the momentum) and clients drift apart; algorithm.c_beta = 1 is the "
                        "exact correction")
        self.server = DGAServer()
        self.x = x0
        self.version = 0
        self.joined: set[int] = set()
        self.alive: set[int] = set()
        self.started = False
        self.running: set[int] = set()
        self.broadcast: list[tuple[int, torch.Tensor]] = []

    @property
    def round(self) -> int:
        return self.version

    def start(self, now: float) -> Step:
        self.started = True
        self.running = set(self.joined)
        return Step(dispatch=sorted(self.joined))

    def on_join(self, client: int, now: float) -> Step:
        self.joined.add(client)
        self.alive.add(client)
        return Step()

    def on_away(self, client: int, now: float, event: str = "suspend") -> Step:
        if event == "lose":
            self.alive.discard(client)
            self.running.discard(client)
        return Step()

    def on_update(self, result: ClientResult, round_: int, now: float) -> Step:
        step = Step()
        try:
            mean = self.server.add(round_, result.client, result.params,
                                   expected=max(1, len(self.running)))
        except (NonFiniteUpdate, ValueError) as exc:
            step.rejected.append((result.client, str(exc)))
            return step
        if mean is None:
            return step
        scale = 1.0 if self.cfg.accumulate == "displacement" else self.cfg.lr
        self.x = self.x - scale * mean.to(self.x.dtype)
        self.version += 1
        self.broadcast.append((round_, mean))
        step.round_closed = round_
        step.applied.append({"round": round_, "version": self.version,
                             "clients": sorted(self.running), "staleness": 0})
        return step

    def bind(self, client: int, task_id: int) -> None:
        """DGA tasks are long-lived: nothing to track."""

    def task_config(self, client: int) -> dict[str, Any]:
        return {"op": "dga"}

    def on_timer(self, now: float) -> Step:
        return Step()

    def next_timer(self) -> float | None:
        return None

    def in_flight(self) -> int:
        return len(self.running)


# -- client actor ------------------------------------------------------------------
async def drive(actor: ClientActor, task: wire.Task) -> None:
    """Run one DGA client until the actor stops (see the module docstring)."""
    host = actor.host
    alg = host.sc.algorithm
    chunk = int(alg.chunk_steps)
    reply = await host.trainer.request(wire.Task(
        client=actor.cid, version=0, round=0, task_id=task.task_id, tensors=task.tensors,
        config={"op": "dga_init"}))
    if not isinstance(reply, wire.Update):
        log.error("client %d: DGA start failed: %s", actor.cid, reply)
        return
    averages: dict[int, tuple[Any, ...]] = {}
    sent: list[int] = []
    run_index = 0
    while not actor.stopped:
        for msg in actor.drain_inbox():
            if isinstance(msg, wire.Aggregate):
                averages[msg.round] = msg.tensors
            elif msg is None or isinstance(msg, wire.Bye):
                return
        rounds = sorted(averages)
        tensors = tuple(a for r in rounds for a in averages[r])
        averages.clear()
        t0 = host.clock.now()
        reply = await host.trainer.request(wire.Task(
            client=actor.cid, version=0, round=0, task_id=task.task_id, tensors=tensors,
            config={"op": "dga_step", "steps": chunk, "sent": sent, "averages": rounds}))
        sent = []
        if not isinstance(reply, wire.Update):
            log.error("client %d: DGA step failed: %s", actor.cid, reply)
            return
        st = reply.stats
        steps = int(st.get("steps", 0))
        for corr in st.get("corrections", []):
            host.emit("correction", client=actor.cid, round=corr[0], delay=corr[1])
        if steps:
            budget = host.compute_time(actor, steps, run_index)
            run_index += 1
            deadline = t0 + budget
            if host.clock.now() > deadline and budget > 0:
                actor.overruns += 1
                host.overruns += 1
            elif budget > 0:
                host.monitor.record_compute(budget, host.clock.now() - t0)
                await host.timers.sleep_until(deadline)
        action = st.get("action")
        if action == "send":
            r = int(st["round"])
            await actor.send(wire.Update(
                client=actor.cid, task_id=task.task_id, base_version=r, round=r,
                num_samples=actor.num_samples, tensors=reply.tensors,
                stats={"loss": st.get("loss")}))
            sent.append(r)
        elif action == "wait":
            r = int(st["round"])
            host.emit("dga_wait", client=actor.cid, round=r)
            while r not in averages:
                msg = await actor.inbox.get()
                if msg is None or isinstance(msg, wire.Bye):
                    return
                if isinstance(msg, wire.Aggregate):
                    averages[msg.round] = msg.tensors
            host.emit("dga_resume", client=actor.cid, round=r)
        elif action == "done":
            return


# -- torch worker ---------------------------------------------------------------------
class DGAWorkerState:
    """The worker's half: a :class:`DGAClient` and a minibatch stream per client."""

    def __init__(self, sc: Scenario, model: torch.nn.Module, seed: int) -> None:
        self.cfg = dga_config(sc)
        self.model = model
        self.batch_size = sc.client.batch_size
        self.seed = seed
        self.clients: dict[int, DGAClient] = {}
        self.batches: dict[int, Any] = {}
        self.loss_fn = torch.nn.CrossEntropyLoss()

    def init(self, client: int, w0: torch.Tensor, n: int) -> None:
        self.clients[client] = DGAClient(self.cfg, w0, client=client)
        gen = torch.Generator().manual_seed(self.seed + client)
        self.batches[client] = _batches(n, self.batch_size, gen)

    def grad(self, w: torch.Tensor, x: torch.Tensor, y: torch.Tensor, idx: Any) -> tuple[
            torch.Tensor, float]:
        load_vector(self.model, w)
        self.model.train()
        params = [p for p in self.model.parameters() if p.requires_grad]
        for p in params:
            p.grad = None
        loss = self.loss_fn(self.model(x[idx]), y[idx])
        loss.backward()
        return flatten([p.grad for p in params]), float(loss.detach())  # type: ignore[misc]

    def step(self, client: int, msg: wire.Task, x: torch.Tensor, y: torch.Tensor,
             n_params: int) -> tuple[torch.Tensor | None, dict[str, Any]]:
        dga = self.clients[client]
        cfg = msg.config
        corrections = []
        for r in cfg.get("sent", []):
            dga.sent(int(r))
        flat = np.concatenate([np.asarray(a, np.float32).reshape(-1) for a in msg.tensors]) \
            if msg.tensors else np.zeros(0, np.float32)
        for i, r in enumerate(cfg.get("averages", [])):
            mean = torch.from_numpy(flat[i * n_params:(i + 1) * n_params].copy())
            corrections.extend(dga.apply_average(int(r), mean))
        steps, losses = 0, []
        out: torch.Tensor | None = None
        stats: dict[str, Any] = {}
        while True:
            action = dga.next_action()
            if isinstance(action, DGAStep):
                if steps >= int(cfg.get("steps", 1)):
                    stats["action"] = "step"
                    break
                g, loss = self.grad(dga.w, x, y, next(self.batches[client]))
                corrections.extend(dga.step(g))
                losses.append(loss)
                steps += 1
            elif isinstance(action, Send):
                stats.update(action="send", round=action.round)
                out = action.m.to(torch.float32)
                break
            elif isinstance(action, Wait):
                stats.update(action="wait", round=action.round)
                break
            elif isinstance(action, Done):
                stats["action"] = "done"
                out = dga.w.to(torch.float32)
                break
        stats.update(steps=steps, loss=float(np.mean(losses)) if losses else None,
                     corrections=[[c.round, c.delay] for c in corrections])
        return out, stats
