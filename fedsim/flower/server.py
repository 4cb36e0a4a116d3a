"""The server side of a Flower app: its ServerApp in a process of its own, its messages as tasks.

:class:`FlowerServer` is an ordinary sans-I/O
:class:`~fedsim.algorithms.api.ServerAlgorithm`. When it is built (before
the run's clock starts) it starts the app's ``ServerApp`` in a process of
its own (:mod:`.serverapp`), so the strategy's Python code and the native
code it calls never hold the server process's GIL while the event loop's
timers are due. The app's grid (:class:`~.grid.FedsimGrid`) sends each call
over a pipe; the server's end (:class:`~.link.Relay`) files it in the
:class:`~.exchange.Exchange` and wakes the loop
(:class:`~fedsim.algorithms.api.Waker`), which calls :meth:`timer`; there
each message becomes a :class:`~fedsim.wire.messages.Task` to its node, and
each update that comes back becomes the reply the app waits for.

Rules (docs/flower.md):

- A node works on one message at a time; more messages to a busy node wait
  in order. A message to a node that is gone or unknown is answered at once
  with Flower's ``NODE_UNAVAILABLE`` error; a message whose node went away
  while it had it gets the same answer when the server learns of it (the
  node is back, or lost).
- A message's TTL counts in emulated seconds from its push: a reply that
  has not come by then is answered ``REPLY_MESSAGE_UNAVAILABLE`` (the late
  one, when it comes, is discarded and counted), and a message still
  waiting for its busy node is answered so and never sent. A message whose
  TTL ran out frees its node for its next message, as ``task_timeout``
  frees a native client: a message the network lost (``loss_mode = "drop"``
  or ``"message"``, a TCP timeout) holds its node until then, not for the
  rest of the run.
  ``send_and_receive``'s timeout runs from the moment its messages leave.
- Each distinct content the app pushes (by its serialized bytes, taken at
  the push) is one payload version: a strategy's round (one ``RecordDict``,
  a message per node) crosses to each host once. A train reply the strategy
  takes is an update, its staleness the payload versions sent between its
  message and its arrival (a reply that came after its ``send_and_receive``
  timed out is kept for a later ``pull_messages``, as in Flower, until its
  TTL).
- A reply's metadata is the server's: only its content (or error) comes
  from the client. In a train reply, every ``MetricRecord``'s
  ``num-examples`` is replaced by the server's record of the client's
  partition size (as native algorithms weigh by it).
- The global model fedsim evaluates (``[eval]``) is the newest message's
  first ``ArrayRecord`` whose size is the scenario model's: a round's train
  messages carry the model it starts from, its evaluate messages (federated
  evaluation) the aggregate it ended with.
- A round is the app's: it starts with each new train content; a run's
  ``rounds`` count them (and ``run.max_rounds`` can end it early).
- The run ends when the ServerApp returns (``stop_reason``
  ``"server_app_finished"``), raises or its process ends without returning
  (``"failed: ..."``), or at the scenario's own limits; then the grid
  refuses further calls (Flower's ``RunNotRunningException``) and the
  process is ended.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord

from fedsim.algorithms.api import Applied, Discarded, ServerAlgorithm, ServerContext, Step
from fedsim.flower.config import FlowerConfig
from fedsim.flower.content import content_of, header, reply_head, to_bytes, to_model
from fedsim.flower.exchange import Exchange, Pushed, Reply, client_of, node_of
from fedsim.flower.running import set_scenario
from fedsim.flower.serverapp import Boot, ServerAppProcess, crossable
from fedsim.scenario import Scenario
from fedsim.wire.messages import Task, Update
from fedsim.wire.tensors import Model

__all__ = ["FlowerServer"]

log = logging.getLogger(__name__)

#: how many recent payloads stay known by their digest (a round's messages share one)
_CONTENTS = 8
#: how many messages whose TTL ran out stay known, to tell a late reply from a stray one
_LAPSED = 4096


@dataclass
class _Sent:
    """A message out as a task: what answers it, when it expires."""

    message_id: str
    client: int
    version: int
    expires: float
    train: bool


@dataclass
class _Queued:
    """A message waiting for its busy node, and when its TTL runs out."""

    pushed: Pushed
    expires: float


class FlowerServer(ServerAlgorithm):
    """A Flower ServerApp driven by fedsim's server (see the module docstring)."""

    cadence = "updates"

    def __init__(self, cfg: FlowerConfig, ctx: ServerContext) -> None:
        self.cfg, self.ctx = cfg, ctx
        if isinstance(ctx.scenario, Scenario):
            set_scenario(ctx.scenario)
        self.version = 0
        self.round = 0
        limit = cfg.payload_bytes(int(ctx.x0.numel()) * 4) - 4096
        self.exchange = Exchange(wake=ctx.wake)
        self.available: set[int] = set()
        self.busy: dict[int, int] = {}                     # client -> task id it works on
        self.queued: dict[int, deque[_Queued]] = {}        # client -> messages for later
        self.sent: dict[int, _Sent] = {}                   # task id -> the message
        #: task ids of messages whose TTL ran out before their reply came (oldest first)
        self._lapsed: dict[int, None] = {}
        #: recent payloads: digest -> (version, wire model)
        self._payloads: dict[bytes, tuple[int, Model]] = {}
        self._x = ctx.x0.detach().clone()
        #: the newest content pushed (serialized), not yet read for model()
        self._newest: bytes | bytearray | None = None
        self._finished = threading.Event()
        self._error: str | None = None
        self._stopped = False
        self._closed = False
        #: replies after their message's TTL
        self.late_replies = 0
        #: the ServerApp's process, its app loaded (before the run's clock starts)
        self.app = ServerAppProcess(Boot(cfg.server_app, tuple(sys.path), limit,
                                         crossable(ctx.scenario)), self.exchange, self._done)

    # -- the ServerApp's process --------------------------------------------------------
    def _done(self, error: str | None) -> None:
        """The ServerApp returned (None) or raised, or its process ended (from the relay)."""
        if not self.exchange.closed:
            self._error = error
            if error is not None:
                log.error("the ServerApp %s", error)
        self._finished.set()
        self.exchange.wake()

    def start(self, clients: Sequence[int], now: float) -> Step:
        self.available = set(clients)
        self.exchange.set_nodes(node_of(c) for c in self.available)
        self.app.start(int(self.ctx.seed) + 1, int(self.ctx.seed), self.cfg.run_config)
        return Step()

    # -- the loop's side ------------------------------------------------------------------
    def timer(self, now: float) -> Step:
        step = Step()
        for p in self.exchange.drain():
            try:
                self._route(p, now, step)
            except Exception as exc:
                log.error("a Flower message could not be sent: %s: %s", type(exc).__name__, exc)
                self.exchange.deliver(Reply.error(
                    p.message_id,
                    f"fedsim could not send the message: {type(exc).__name__}: {exc}"[:300]))
        self._expire(now, step)
        if self._finished.is_set() and not self._stopped:
            self._stopped = True
            step.rounds_closed += 1 if self.round else 0     # the app's last round
            err = self._error
            step.stop = ("server_app_finished" if err is None else
                         f"failed: the ServerApp {err}"[:300])
        return step

    def next_timer(self) -> float | None:
        times = [s.expires for s in self.sent.values()]
        lapse = self.exchange.next_lapse()
        if lapse is not None:
            times.append(lapse)
        times += [q.expires for queue in self.queued.values() for q in queue]
        deadline = self.exchange.next_deadline()
        if deadline is not None:
            times.append(deadline)
        return min(times) if times else None

    def _route(self, p: Pushed, now: float, step: Step) -> None:
        client = client_of(p.head.dst)
        if client is None or client not in self.available:
            self.exchange.deliver(Reply.node_unavailable(p.message_id))
            return
        if client in self.busy:
            self.queued.setdefault(client, deque()).append(_Queued(p, now + p.head.ttl))
            return
        self._send(p, client, now, now + p.head.ttl, step)

    def _send(self, p: Pushed, client: int, now: float, expires: float, step: Step) -> None:
        round_ = self.round
        version, model = self._payload(p)
        if self.round > round_ > 0:   # a new train content: the app's previous round is over
            step.rounds_closed += 1
        tasks = self.ctx.tasks
        task_id, tasks.next_id = tasks.next_id, tasks.next_id + 1
        self.sent[task_id] = _Sent(p.message_id, client, version, expires,
                                   p.head.kind == "train")
        self.busy[client] = task_id
        self.exchange.sent(p.batch, now)
        step.tasks.append(Task(client=client, task_id=task_id, version=version,
                               round=self.round, work=None, model=model,
                               tag=header(p.head, p.message_id)))

    def _payload(self, p: Pushed) -> tuple[int, Model]:
        """The payload version of a pushed content: a recent one's for the same
        bytes, else a new one (a new train content opens a round)."""
        held = self._payloads.get(p.digest)
        if held is not None:
            return held
        self.version += 1
        held = self._payloads[p.digest] = (self.version, to_model(p.data))
        while len(self._payloads) > _CONTENTS:
            del self._payloads[next(iter(self._payloads))]
        if p.head.kind == "train":
            self.round += 1
        self._newest = p.data      # read when fedsim evaluates (model()), not per push
        return held

    def _take_model(self, data: bytes | bytearray) -> None:
        """The global model fedsim evaluates: the content's first ArrayRecord, when it
        is the scenario model's size and numeric."""
        content = content_of(data)
        arrays = next((r for r in content.values() if isinstance(r, ArrayRecord)), None)
        if arrays is None:
            return
        try:
            parts = [np.asarray(a, dtype=np.float32).reshape(-1)
                     for a in arrays.to_numpy_ndarrays()]
        except (TypeError, ValueError):
            return
        if parts and sum(p.size for p in parts) == self._x.numel():
            # Flower's arrays, not a wire Model: fedsim.wire.tensors' to_tensor takes a Model
            self._x = torch.from_numpy(np.concatenate(parts))

    def _expire(self, now: float, step: Step) -> None:
        for task_id in [t for t, s in self.sent.items() if s.expires <= now]:
            s = self.sent.pop(task_id)
            self._lapsed[task_id] = None
            while len(self._lapsed) > _LAPSED:
                del self._lapsed[next(iter(self._lapsed))]
            self.exchange.deliver(Reply.reply_unavailable(s.message_id))
            if self.busy.get(s.client) == task_id:
                self._free(s.client, now, step)
        for queue in self.queued.values():
            while queue and queue[0].expires <= now:
                q = queue.popleft().pushed
                self.exchange.deliver(Reply.reply_unavailable(q.message_id))
        self.exchange.expire(now)

    def _free(self, client: int, now: float, step: Step) -> None:
        """``client`` answered (or its work ended): send its next waiting message."""
        self.busy.pop(client, None)
        queue = self.queued.get(client)
        while queue and client not in self.busy:
            q = queue.popleft()
            if q.expires <= now:
                self.exchange.deliver(Reply.reply_unavailable(q.pushed.message_id))
                continue
            self._send(q.pushed, client, now, q.expires, step)

    def update(self, upload: Update, now: float) -> Step:
        step = Step()
        s = self.sent.pop(upload.task_id, None)
        if s is None:
            if self._lapsed.pop(upload.task_id, 0) is None:
                self.late_replies += 1
                step.discarded.append(Discarded(upload.client, "reply after its message's TTL"))
            else:
                step.discarded.append(Discarded(upload.client, "a reply to no message in flight"))
            return step
        if self.busy.get(s.client) == upload.task_id:
            self._free(s.client, now, step)
        try:
            # its head only, read in place: the ServerApp's process builds Flower's
            # records from it (its bytes cross to that process from the frame they came in)
            data = to_bytes(upload.model)
            answers, has_error, has_content = reply_head(data)
            if answers != s.message_id:
                raise ValueError("it answers another message")
            if has_error == has_content:
                raise ValueError("it must hold either content or an error")
        except Exception as exc:
            self.exchange.deliver(Reply.error(
                s.message_id, f"fedsim refused the reply of node {node_of(s.client)}: {exc}"[:300]))
            step.discarded.append(Discarded(upload.client, f"malformed Flower reply: {exc}"[:200]))
            return step
        # the reply's metadata is the server's: the ServerApp's process takes only its
        # content or error, and a train reply's num-examples is the server's record
        reply = Reply(s.message_id, data=data,
                      num_examples=upload.num_samples if s.train else None)
        if not self.exchange.deliver(reply, s.expires):
            step.discarded.append(Discarded(upload.client, "a second reply to its message"))
            return step
        if s.train and not has_error:
            step.applied.append(Applied(version=self.version, clients=(upload.client,),
                                        staleness=(self.version - s.version,),
                                        round=self.round))
        return step

    def _abandon(self, client: int) -> None:
        """``client``'s message in flight will not be answered: say so now."""
        task_id = self.busy.pop(client, None)
        s = self.sent.pop(task_id, None) if task_id is not None else None
        if s is not None:
            self.exchange.deliver(Reply.node_unavailable(s.message_id))

    def rejoin(self, client: int, now: float, reset: bool) -> Step:
        step = Step()
        self._abandon(client)
        self.available.add(client)
        self.exchange.set_nodes(node_of(c) for c in self.available)
        self._free(client, now, step)
        return step

    def lost(self, client: int, now: float) -> Step:
        self._abandon(client)
        self.available.discard(client)
        self.exchange.set_nodes(node_of(c) for c in self.available)
        for q in self.queued.pop(client, deque()):
            self.exchange.deliver(Reply.node_unavailable(q.pushed.message_id))
        return Step()

    def least_steps(self, task_steps: int, upload_round: int) -> int:
        return 0      # a ClientApp's work is known only when it is done

    def in_flight(self) -> int:
        return len(self.busy)

    def waiting(self) -> bool:
        return not self._stopped

    def model(self) -> torch.Tensor:
        if self._newest is not None:
            data, self._newest = self._newest, None
            self._take_model(data)
        return self._x

    def close(self) -> None:
        """End the run for the ServerApp: its waits return, its next call raises,
        and its process is ended (:meth:`.serverapp.ServerAppProcess.end`)."""
        if self._closed:
            return
        self._closed = True
        if self.late_replies:
            log.warning("%d Flower replies came after their message's TTL and were discarded",
                        self.late_replies)
        self.exchange.close()
        self.app.end()

    def state_dict(self) -> dict[str, Any]:
        return {"version": self.version, "round": self.round}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        raise RuntimeError("a Flower app's run cannot resume from a checkpoint: its ServerApp "
                           "is a running process whose state fedsim cannot save; run it again "
                           "(its clients' Context.state is kept by --state)")
