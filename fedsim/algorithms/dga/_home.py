"""DGA as fedsim runs it: the scenario config, the server side, the client side.

* :class:`DGAFlow` (server): sends every client the initial model once,
  reduces each round's uploads with :class:`DGAServer` and broadcasts the
  mean. The model it evaluates is the *virtual average*
  ``x0 - lr * sum(mean_t)`` (``x0 - sum(mean_t)`` with displacement
  accumulation), which every client's model equals on average once its
  corrections are in (the DGA mean invariant, Lemma A.1; with momentum it is
  the plain-SGD reading). A lost client leaves the reduction: rounds it has
  not reported complete with the others.
* :class:`DGAClientWork` (torch worker): one :class:`DGAClient` and a
  minibatch stream per client. A task begins a client that never stops
  stepping; each :meth:`~DGAClientWork.advance` takes up to ``chunk_steps``
  steps and returns what to send, or the round whose average it must wait
  for. The client actor holds each chunk until its emulated compute time
  has passed and passes on the averages that arrived, so the overlap of
  communication and computation, and in auto mode the delay ``D`` itself,
  come from the emulated network.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field, StrictInt

from fedsim.algorithms._kernels import flatten, pack_tensor, unpack_tensor
from fedsim.algorithms.api import (
    AlgorithmConfig,
    Applied,
    Broadcast,
    ClientAlgorithm,
    ClientContext,
    Discarded,
    Outcome,
    ServerAlgorithm,
    Step,
    TaskMaker,
)
from fedsim.algorithms.base import NonFiniteUpdate
from fedsim.algorithms.dga._client import Corrected, DGAClient, Done, Send, Wait
from fedsim.algorithms.dga._client import Step as DGAStep
from fedsim.algorithms.dga._core import DGAConfig, DGAKeys, DGAProtocolError
from fedsim.algorithms.dga._reducer import DGAServer
from fedsim.algorithms.local import LocalConfig, batches, load_vector
from fedsim.algorithms.optim import SGDMOptions, SGDOptions
from fedsim.lazy import lazy_module
from fedsim.wire.messages import Task, Update

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch")

__all__ = ["DGAClientWork", "DGAFlow", "DGAScenarioConfig", "dga_config"]

log = logging.getLogger(__name__)


class DGAScenarioConfig(DGAKeys, AlgorithmConfig):
    """``[algorithm]`` of DGA: clients keep stepping while their round's average travels.

    DGA's own keys are :class:`~fedsim.algorithms.dga.DGAKeys` (``delay`` is D
    in local steps, ``local_steps`` is K; ``mode = "paper"``: a real barrier
    at step D after sending; ``"auto"``: the correction lands whenever the
    average arrives); the client's lr and momentum come from ``[client]``
    (``optimizer = "sgd"`` or ``"sgdm"``). ``chunk_steps`` local steps are
    taken per request to the torch worker."""

    name: Literal["dga"]
    chunk_steps: Annotated[StrictInt, Field(ge=1)] = 1

    def sent_at_once(self, num_clients: int) -> int:
        """A closed round's average goes to every client at that instant."""
        return num_clients

    def local_work(self) -> str:
        return (f"algorithm.local_steps = {self.local_steps} local steps per round (K); a DGA "
                "client steps without end until the run stops")


def dga_config(cfg: DGAScenarioConfig, local: LocalConfig) -> DGAConfig:
    """The pure DGA config: the table's :class:`DGAKeys`; lr, momentum and weight
    decay from the client optimizer."""
    opt = local.optimizer
    if not isinstance(opt, SGDOptions | SGDMOptions):
        raise ValueError(f"client.optimizer = {opt.name!r}: DGA runs sgd or sgdm")
    return DGAConfig(**cfg.model_dump(include=set(DGAKeys.model_fields)), lr=opt.lr,
                     momentum=opt.momentum if isinstance(opt, SGDMOptions) else 0.0,
                     weight_decay=opt.weight_decay)


class DGAFlow(ServerAlgorithm):
    """Server side of DGA: start everyone once, reduce and broadcast each round."""

    cadence = "rounds"
    one_upload = False  # a session uploads once per round (the client's numbering)

    def __init__(self, cfg: DGAConfig, x0: torch.Tensor, tasks: TaskMaker | None = None
                 ) -> None:
        self.cfg = cfg
        self.make_task = tasks if tasks is not None else TaskMaker()
        if cfg.momentum > 0 and cfg.c_beta == "paper" and cfg.delay > 1:
            log.warning("DGA: c_beta = 'paper' with momentum over-corrects (v already carries "
                        "the momentum) and clients drift apart; algorithm.c_beta = 1 is the "
                        "exact correction")
        self.reducer = DGAServer()
        self.x = x0
        self.version = 0
        self.running: set[int] = set()

    @property
    def round(self) -> int:  # type: ignore[override]
        return self.version

    def model(self) -> torch.Tensor:
        return self.x

    def start(self, clients: Sequence[int], now: float) -> Step:
        self.running = set(clients)
        return Step(tasks=[self.make_task(c, self.version, 0, self.x)
                           for c in sorted(self.running)])

    def rejoin(self, client: int, now: float, reset: bool) -> Step:
        # A DGA client pauses while away and resumes its session where it was.
        return Step()

    def lost(self, client: int, now: float) -> Step:
        self.running.discard(client)
        step = Step()
        for round_, mean in self.reducer.forget(client):
            step.then(self._closed(round_, mean))
        return step

    def least_steps(self, task_steps: int, upload_round: int) -> int:
        """A session sends round ``t``'s accumulated gradient after its ``t K``-th step."""
        return max(0, upload_round) * self.cfg.local_steps

    def update(self, upload: Update, now: float) -> Step:
        if upload.client not in self.running:
            return Step(discarded=[Discarded(upload.client, "not a running client")])
        round_ = upload.round
        expected = self.reducer.expected(round_) or max(1, len(self.running))
        try:
            mean = self.reducer.add(round_, upload.client, upload.params, expected=expected)
        except (NonFiniteUpdate, ValueError, DGAProtocolError) as exc:
            return Step(discarded=[Discarded(upload.client, str(exc))])
        return Step() if mean is None else self._closed(round_, mean)

    def _closed(self, round_: int, mean: torch.Tensor) -> Step:
        scale = 1.0 if self.cfg.accumulate == "displacement" else self.cfg.lr
        self.x = self.x - scale * mean.to(self.x.dtype)
        self.version += 1
        clients = tuple(sorted(self.running))
        return Step(
            broadcasts=[Broadcast(round=round_, payload=mean.to(torch.float32),
                                  clients=clients)],
            applied=[Applied(version=self.version, clients=clients, round=round_)],
            rounds_closed=1)

    def timer(self, now: float) -> Step:
        return Step()

    def next_timer(self) -> float | None:
        return None

    def in_flight(self) -> int:
        return len(self.running)

    def state_dict(self) -> dict[str, Any]:
        return {"x": pack_tensor(self.x), "version": self.version,
                "running": sorted(self.running), "reducer": self.reducer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.x = unpack_tensor(state["x"])
        self.version = int(state["version"])
        self.running = set(state["running"])
        self.reducer.load_state_dict(state["reducer"])


class DGAClientWork(ClientAlgorithm):
    """The client side: a :class:`DGAClient` and a minibatch stream per client."""

    def __init__(self, cfg: DGAConfig, chunk_steps: int, ctx: ClientContext) -> None:
        self.cfg = cfg
        self.chunk = chunk_steps
        self.ctx = ctx
        self.clients: dict[int, DGAClient] = {}
        self.batches: dict[int, Any] = {}
        self.loss_fn = torch.nn.CrossEntropyLoss()

    def _grad(self, w: torch.Tensor, x: torch.Tensor, y: torch.Tensor,
              idx: torch.Tensor) -> tuple[torch.Tensor, float]:
        model = self.ctx.model
        load_vector(model, w)
        model.train()
        params = [p for p in model.parameters() if p.requires_grad]
        for p in params:
            p.grad = None
        loss = self.loss_fn(model(x[idx]), y[idx])
        loss.backward()
        g = flatten([p.grad for p in params])  # type: ignore[misc]
        if self.cfg.weight_decay:
            g.add_(w.to(g.dtype), alpha=self.cfg.weight_decay)
        return g, float(loss.detach())

    def begin(
        self, task: Task, x: torch.Tensor, y: torch.Tensor, gen: torch.Generator
    ) -> Outcome:
        self.clients[task.client] = DGAClient(self.cfg, task.params, client=task.client)
        stream = torch.Generator().manual_seed(self.ctx.seed + task.client)
        self.batches[task.client] = batches(len(y), self.ctx.local.batch_size, stream)
        return self.advance(task.client, (), x, y)

    def advance(
        self,
        client: int,
        averages: Sequence[tuple[int, torch.Tensor]],
        x: torch.Tensor,
        y: torch.Tensor,
    ) -> Outcome:
        dga = self.clients[client]
        corrections: list[Corrected] = []
        for round_, mean in averages:
            corrections.extend(dga.apply_average(round_, mean))
        steps, losses = 0, []
        while True:
            action = dga.next_action()
            if isinstance(action, DGAStep):
                if steps >= self.chunk:
                    out = Outcome(steps=steps, next="more")
                    break
                g, loss = self._grad(dga.w, x, y, next(self.batches[client]))
                corrections.extend(dga.step(g))
                losses.append(loss)
                steps += 1
            elif isinstance(action, Send):
                dga.sent(action.round)
                out = Outcome(steps=steps, upload=action.m.to(torch.float32),
                              upload_round=action.round, next="more")
                break
            elif isinstance(action, Wait):
                out = Outcome(steps=steps, next="wait", wait_round=action.round)
                break
            elif isinstance(action, Done):
                out = Outcome(steps=steps, next="done")
                break
        notes = {"corrections": [[c.round, c.delay] for c in corrections]} if corrections else {}
        return Outcome(steps=out.steps, loss=sum(losses) / len(losses) if losses else None,
                       upload=out.upload, upload_round=out.upload_round, next=out.next,
                       wait_round=out.wait_round, notes=notes)

    def state_dict(self) -> dict[str, Any]:
        return {"clients": {c: d.state_dict() for c, d in sorted(self.clients.items())}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for c, s in state["clients"].items():
            client = DGAClient(self.cfg, torch.zeros(0), client=int(c)) \
                if int(c) not in self.clients else self.clients[int(c)]
            client.load_state_dict(s)
            self.clients[int(c)] = client
