"""The client side of a Flower app: its ClientApp called in fedsim's trainer, per client.

:class:`FlowerClient` is a :class:`~fedsim.algorithms.api.ClientAlgorithm`
in a trainer process. A task's payload and tag become the
:class:`flwr.app.Message` the node receives (:mod:`.content`); the app is
called as Flower's simulation calls it, ``client_app(message, context)``,
with the client's own :class:`flwr.app.Context`:

- ``node_id`` is the client's Flower node id (``1000 +`` the fedsim client id,
  the id the ServerApp sends to and reads in replies' ``src_node_id``);
  ``node_config`` holds Flower's ``partition-id`` (the client id) and
  ``num-partitions`` (the client count);
- ``state`` persists per client across messages, in the trainer's saved
  state (checkpoints and ``fedsim clients --state``);
- ``run_config`` is the scenario's ``algorithm.run_config``.

While a handler runs, :func:`fedsim.flower.partition` returns that client's
data as fedsim partitioned it. A handler that raises is answered with
Flower's ``CLIENT_APP_RAISED_EXCEPTION`` error reply, as Flower's
simulation answers it; the run goes on.

Compute time: the handler's thread CPU time (``compute = "cpu"``) or the
count in the reply's metric ``steps_metric`` (``compute = "steps"``), which
the client actor turns into emulated seconds with the client's device.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch
from flwr.app import Context, Error, Message, MetricRecord, RecordDict
from flwr.app.user_config import UserConfig
from flwr.clientapp import ClientApp
from flwr.common.constant import ErrorCode
from flwr.common.serde import recorddict_from_proto, recorddict_to_proto
from flwr.proto.recorddict_pb2 import RecordDict as ProtoRecordDict
from flwr.supercore.task_identity import TaskIdentity

from fedsim.algorithms.api import ClientAlgorithm, ClientContext, Outcome
from fedsim.flower.apps import load
from fedsim.flower.config import FlowerConfig
from fedsim.flower.content import message_at_client, reply_bytes, to_bytes
from fedsim.flower.exchange import node_of
from fedsim.flower.running import serving, set_scenario
from fedsim.scenario import Scenario
from fedsim.wire.messages import Task

__all__ = ["FlowerClient"]

log = logging.getLogger(__name__)

def _warm_torch_optim() -> None:
    """Take one torch.optim step on a throw-away parameter: its first step imports
    torch._dynamo (0.7 s here), which a ClientApp's first call would otherwise pay
    inside its compute budget (fedsim's own clients step without torch.optim)."""
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=0.1)
    p.grad = torch.ones(1)
    opt.step()


class FlowerClient(ClientAlgorithm):
    """A Flower ClientApp run for fedsim's clients (see the module docstring)."""

    def __init__(self, cfg: FlowerConfig, ctx: ClientContext) -> None:
        self.cfg = cfg
        self.num_clients = ctx.num_clients
        #: the most bytes a reply may have (the run's payload limit, less its envelope)
        self.limit = cfg.payload_bytes(
            sum(int(p.numel()) * 4 for p in ctx.model.parameters() if p.requires_grad)) - 4096
        if isinstance(ctx.scenario, Scenario):
            set_scenario(ctx.scenario)
        # imported now, while the trainer starts: a first call that imported it
        # (torch, Flower, the app's own module) would overrun its compute budget
        self._app: ClientApp | None = load(cfg.client_app, ClientApp)
        _warm_torch_optim()
        #: Context.state per client
        self.states: dict[int, RecordDict] = {}
        self._warned_steps = False

    @property
    def app(self) -> ClientApp:
        if self._app is None:
            self._app = load(self.cfg.client_app, ClientApp)
        return self._app

    def begin(self, task: Task, x: torch.Tensor, y: torch.Tensor,
              gen: torch.Generator) -> Outcome:
        if task.model is None:
            raise ValueError(f"task {task.task_id} carries no message")
        client = task.client
        node = node_of(client)
        msg = message_at_client(task.tag, to_bytes(task.model), node)
        context = Context(run_id=msg.metadata.run_id, node_id=node,
                          node_config=UserConfig({"partition-id": client,
                                                  "num-partitions": self.num_clients}),
                          state=self.states.get(client) or RecordDict(),
                          run_config=UserConfig(self.cfg.run_config))
        TaskIdentity.run_id = msg.metadata.run_id
        TaskIdentity.task_id = task.task_id
        TaskIdentity.node_id = node
        with serving(client, x, y):
            t0 = time.thread_time()
            try:
                reply = self.app(msg, context)
                if not isinstance(reply, Message):
                    raise TypeError(f"the ClientApp returned a {type(reply).__name__}, "
                                    "not a flwr Message")
            except Exception as exc:
                log.error("client %d: the ClientApp raised %s: %s", client,
                          type(exc).__name__, exc)
                reply = Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION,
                                      reason=f"{type(exc)}:<'{exc}'>"), reply_to=msg)
            cpu = time.thread_time() - t0
        self.states[client] = context.state
        steps = 0
        if self.cfg.compute == "steps" and reply.has_content():
            found = False
            for record in reply.content.values():
                if isinstance(record, MetricRecord) and self.cfg.steps_metric in record:
                    value = record[self.cfg.steps_metric]
                    if isinstance(value, int | float) and value >= 0:
                        steps, found = int(value), True
                    break
            if not found and not self._warned_steps:
                self._warned_steps = True
                log.warning("compute = \"steps\": a reply of the ClientApp has no metric %r "
                            "(a number >= 0): it is charged no compute time, an instant "
                            "device (said once)", self.cfg.steps_metric)
        data = reply_bytes(reply)
        if len(data) > self.limit:
            log.error("client %d: a reply of %d bytes, over the run's %d", client, len(data),
                      self.limit)
            data = reply_bytes(Message(Error(
                code=ErrorCode.UNKNOWN,
                reason=f"the reply has {len(data)} bytes, more than the run takes "
                       f"({self.limit}: algorithm.max_message_mb)"), reply_to=msg))
        upload = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        return Outcome(steps=steps, upload=upload,
                       cpu_s=cpu if self.cfg.compute == "cpu" else None,
                       notes={"flower_type": msg.metadata.message_type,
                              "error": reply.has_error()})

    def state_dict(self) -> dict[str, Any]:
        """Each client's Context.state, as Flower serializes a RecordDict."""
        return {"context_state": {c: bytes(recorddict_to_proto(s).SerializeToString())
                                  for c, s in sorted(self.states.items())}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.states = {int(c): recorddict_from_proto(ProtoRecordDict.FromString(bytes(b)))
                       for c, b in state["context_state"].items()}
