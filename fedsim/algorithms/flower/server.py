"""The server side of a Flower app: its ServerApp in a thread, its messages as fedsim tasks.

:class:`FlowerServer` is an ordinary sans-I/O
:class:`~fedsim.algorithms.api.ServerAlgorithm`. At the start it runs the
app's ``ServerApp`` in a thread of the server process (as Flower's own
simulation does) with a :class:`~.grid.FedsimGrid` whose node ids are the
federation's client ids. The app's blocking calls never touch the server's
event loop: a push lands in the :class:`~.grid.Exchange` and wakes the loop
(:class:`~fedsim.algorithms.api.Waker`), which calls :meth:`timer`; there
each message becomes a :class:`~fedsim.wire.messages.Task` to its node, and
each update that comes back becomes the reply the app waits for.

Rules (docs/flower.md):

- A node works on one message at a time; more messages to a busy node wait
  in order. A message to a node that is away, gone or unknown is answered
  at once with Flower's ``NODE_UNAVAILABLE`` error; a message whose node
  goes away while it works on it gets the same answer when the server
  learns of it (the node is back, or lost).
- A message's TTL counts in emulated seconds from its send: a reply that
  has not come by then is answered ``REPLY_MESSAGE_UNAVAILABLE`` (the late
  one, when it comes, is discarded and counted). ``send_and_receive``'s
  timeout runs from the moment its messages leave, also emulated.
- Each distinct content the app pushes (by object, or by its serialized
  bytes) is one payload version: a strategy's round (one ``RecordDict``, a
  message per node) crosses to each host once.
  A train reply is an update, its staleness the payload versions pushed
  between its message and its arrival.
- A reply's ``MetricRecord`` key ``num-examples`` is replaced by the
  server's record of the client's partition size (as native algorithms
  weigh by it): a client cannot claim more weight than its data.
- The global model fedsim evaluates (``[eval]``) is the newest message's
  first ``ArrayRecord`` whose size is the scenario model's: a round's train
  messages carry the model it starts from, its evaluate messages (federated
  evaluation) the aggregate it ended with.
- A round is the app's: it starts with each new train content; a run's
  ``rounds`` count them (and ``run.max_rounds`` can end it early).
- The run ends when the ServerApp returns (``stop_reason``
  ``"server_app_finished"``), raises (``"failed: ..."``), or at the
  scenario's own limits; then the grid refuses further sends.
"""

from __future__ import annotations

import hashlib
import logging
import sys
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.app.user_config import UserConfig
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode
from flwr.serverapp import ServerApp
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity

from fedsim.algorithms.api import Applied, Discarded, ServerAlgorithm, ServerContext, Step
from fedsim.algorithms.flower.apps import load
from fedsim.algorithms.flower.config import FlowerConfig
from fedsim.algorithms.flower.content import content_bytes, header, reply_of, to_bytes, to_model
from fedsim.algorithms.flower.grid import (
    Exchange,
    FedsimGrid,
    Pushed,
    error_reply,
    node_unavailable,
    reply_unavailable,
)
from fedsim.algorithms.flower.running import set_scenario
from fedsim.wire.messages import Task, Update
from fedsim.wire.tensors import Model

__all__ = ["FlowerServer"]

log = logging.getLogger(__name__)

#: how many recent content objects keep their payload (a round's messages share one)
_CONTENTS = 8
#: the GIL's switch interval while a ServerApp's thread runs beside the loop (s)
SWITCH_INTERVAL = 0.0005


@dataclass
class _Sent:
    """A message out as task ``task_id``: what answers it, when it expires."""

    message: Message
    client: int
    version: int
    expires: float
    train: bool
    expired: bool = False


class FlowerServer(ServerAlgorithm):
    """A Flower ServerApp driven by fedsim's server (see the module docstring)."""

    cadence = "updates"

    def __init__(self, cfg: FlowerConfig, ctx: ServerContext) -> None:
        self.cfg, self.ctx = cfg, ctx
        if ctx.scenario is not None:
            set_scenario(ctx.scenario)
        self.version = 0
        self.round = 0
        self.exchange = Exchange(wake=ctx.wake)
        self.available: set[int] = set()
        self.nodes: list[int] = []
        self.busy: dict[int, int] = {}                     # client -> task id it works on
        self.waiting: dict[int, deque[Pushed]] = {}        # client -> messages for later
        self.sent: dict[int, _Sent] = {}                   # task id -> the message
        #: recent contents: the object, its version, its payload, its bytes' digest
        self._contents: deque[tuple[RecordDict, int, Model, bytes]] = deque(maxlen=_CONTENTS)
        self._x = ctx.x0.detach().clone()
        self._thread: threading.Thread | None = None
        self._finished = False
        self._error: BaseException | None = None
        self._stopped = False
        self._interval = sys.getswitchinterval()
        self.late_replies = 0

    # -- the ServerApp's thread -----------------------------------------------------------
    def _serve(self, app: ServerApp, grid: FedsimGrid, context: Context) -> None:
        try:
            app(grid=grid, context=context)
        except BaseException as exc:
            if not self.exchange.closed:
                self._error = exc
                log.error("the ServerApp raised %s: %s", type(exc).__name__, exc)
        finally:
            self._finished = True
            self.exchange.wake()

    def start(self, clients: Sequence[int], now: float) -> Step:
        run_id = int(self.ctx.seed) + 1
        TaskIdentity.run_id = run_id
        TaskIdentity.task_id = 1
        TaskIdentity.node_id = SUPERLINK_NODE_ID
        self.available = set(clients)
        self.nodes = sorted(clients)
        app = load(self.cfg.server_app, ServerApp)
        run = Run.create_empty(run_id)
        run.override_config = UserConfig(self.cfg.run_config)
        context = Context(run_id=run_id, node_id=SUPERLINK_NODE_ID, node_config=UserConfig(),
                          state=RecordDict(), run_config=UserConfig(self.cfg.run_config))
        grid = FedsimGrid(self.exchange, self.nodes, run)
        # The ServerApp's Python code and the server's event loop share the GIL:
        # a thread computing keeps it up to the switch interval (5 ms by default)
        # before a due timer's callback can run. 0.5 ms bounds that wait below the
        # fidelity allowance of the smallest link (1 ms).
        self._interval = sys.getswitchinterval()
        sys.setswitchinterval(min(self._interval, SWITCH_INTERVAL))
        self._thread = threading.Thread(target=self._serve, args=(app, grid, context),
                                        name="flower-serverapp", daemon=True)
        self._thread.start()
        return Step()

    # -- the loop's side ------------------------------------------------------------------
    def timer(self, now: float) -> Step:
        step = Step()
        for p in self.exchange.drain():
            self._route(p, now, step)
        self._expire(now, step)
        if self._finished and not self._stopped:
            self._stopped = True
            step.rounds_closed += 1 if self.round else 0     # the app's last round
            err = self._error
            step.stop = ("server_app_finished" if err is None else
                         f"failed: the ServerApp raised {type(err).__name__}: {err}"[:300])
        return step

    def next_timer(self) -> float | None:
        times = [s.expires for s in self.sent.values() if not s.expired]
        deadline = self.exchange.next_deadline()
        if deadline is not None:
            times.append(deadline)
        return min(times) if times else None

    def _route(self, p: Pushed, now: float, step: Step) -> None:
        dst = p.message.metadata.dst_node_id
        if dst not in self.available:
            self.exchange.deliver(node_unavailable(p.message))
            return
        if dst in self.busy:
            self.waiting.setdefault(dst, deque()).append(p)
            return
        self._send(p, now, step)

    def _send(self, p: Pushed, now: float, step: Step) -> None:
        msg = p.message
        round_ = self.round
        version, model = self._payload(msg)
        if self.round > round_ > 0:   # a new train content: the app's previous round is over
            step.rounds_closed += 1
        tasks = self.ctx.tasks
        task_id, tasks.next_id = tasks.next_id, tasks.next_id + 1
        client = msg.metadata.dst_node_id
        train = msg.metadata.message_type.split(".")[0] == "train"
        self.sent[task_id] = _Sent(msg, client, version, now + msg.metadata.ttl, train)
        self.busy[client] = task_id
        self.exchange.sent(p.batch, now)
        step.tasks.append(Task(client=client, task_id=task_id, version=version,
                               round=self.round, work=None, model=model, tag=header(msg)))

    def _payload(self, msg: Message) -> tuple[int, Model]:
        """The payload version of ``msg``'s content: a recent one's when the content is
        the same object or serializes to the same bytes, else a new one."""
        content = msg.content
        for held, version, model, _ in self._contents:
            if held is content:
                return version, model
        data = content_bytes(content)
        digest = hashlib.blake2b(data, digest_size=16).digest()
        for _, version, model, seen in self._contents:
            if seen == digest:
                self._contents.append((content, version, model, digest))
                return version, model
        self.version += 1
        model = to_model(data)
        self._contents.append((content, self.version, model, digest))
        if msg.metadata.message_type.split(".")[0] == "train":
            self.round += 1
        self._take_model(content)
        return self.version, model

    def _take_model(self, content: RecordDict) -> None:
        """The global model fedsim evaluates: the content's first ArrayRecord, when it
        is the scenario model's size."""
        arrays = next((r for r in content.values() if isinstance(r, ArrayRecord)), None)
        if arrays is None:
            return
        parts = [np.asarray(a, dtype=np.float32).reshape(-1)
                 for a in arrays.to_numpy_ndarrays()]
        n = sum(p.size for p in parts)
        if n == self._x.numel():
            self._x = torch.from_numpy(np.concatenate(parts)) if parts else self._x

    def _expire(self, now: float, step: Step) -> None:
        for s in self.sent.values():
            if not s.expired and s.expires <= now:
                s.expired = True
                self.exchange.deliver(reply_unavailable(s.message))
        self.exchange.expire(now)

    def _free(self, client: int, now: float, step: Step) -> None:
        """``client`` answered (or its work ended): send its next waiting message."""
        self.busy.pop(client, None)
        queue = self.waiting.get(client)
        while queue and client not in self.busy:
            self._send(queue.popleft(), now, step)

    def update(self, upload: Update, now: float) -> Step:
        step = Step()
        s = self.sent.pop(upload.task_id, None)
        if s is None:
            step.discarded.append(Discarded(upload.client, "a reply to no message in flight"))
            return step
        self._free(s.client, now, step)
        try:
            reply = reply_of(to_bytes(upload.model))
            if reply.metadata.reply_to_message_id != s.message.metadata.message_id:
                raise ValueError("it answers another message")
        except Exception as exc:
            if not s.expired:
                self.exchange.deliver(error_reply(
                    s.message, ErrorCode.UNKNOWN,
                    f"fedsim refused the reply of node {s.client}: {exc}"[:300]))
            step.discarded.append(Discarded(upload.client, f"malformed Flower reply: {exc}"[:200]))
            return step
        if s.expired:
            self.late_replies += 1
            step.discarded.append(Discarded(upload.client, "reply after its message's TTL"))
            return step
        if reply.has_content():
            for record in reply.content.values():
                if isinstance(record, MetricRecord) and "num-examples" in record:
                    record["num-examples"] = upload.num_samples
        self.exchange.deliver(reply)
        if s.train and not reply.has_error():
            step.applied.append(Applied(version=self.version, clients=(upload.client,),
                                        staleness=(self.version - s.version,),
                                        round=self.round))
        return step

    def _abandon(self, client: int) -> None:
        """``client``'s message in flight will not be answered: say so now."""
        task_id = self.busy.pop(client, None)
        s = self.sent.pop(task_id, None) if task_id is not None else None
        if s is not None and not s.expired:
            self.exchange.deliver(node_unavailable(s.message))

    def rejoin(self, client: int, now: float, reset: bool) -> Step:
        step = Step()
        self._abandon(client)
        self.available.add(client)
        self._free(client, now, step)
        return step

    def lost(self, client: int, now: float) -> Step:
        self._abandon(client)
        self.available.discard(client)
        for p in self.waiting.pop(client, deque()):
            self.exchange.deliver(node_unavailable(p.message))
        return Step()

    def in_flight(self) -> int:
        return len(self.busy)

    def waiting(self) -> bool:
        return not self._finished

    def model(self) -> torch.Tensor:
        return self._x

    def close(self) -> None:
        self.exchange.close()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            if self._thread.is_alive():
                log.warning("the ServerApp's thread did not end within 5 s of the run's end")
            sys.setswitchinterval(self._interval)

    def state_dict(self) -> dict[str, Any]:
        return {"version": self.version, "round": self.round}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        raise RuntimeError("a Flower app's run cannot resume from a checkpoint: its ServerApp "
                           "is a running thread whose state fedsim cannot save; run it again "
                           "(its clients' Context.state is kept by --state)")
