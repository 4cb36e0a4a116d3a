"""The order in which a torch worker answers its requests: earliest due first, with preemption.

:class:`Requests` is the queue of requests waiting for a worker;
:class:`Preemption` lets a more urgent one go first in the middle of a
local run. :func:`fedsim.actors.worker.serve` drives both.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, cast

import zmq

from fedsim.algorithms import flatten
from fedsim.algorithms.local import load_vector
from fedsim.wire.codec import Frames, decode, encode
from fedsim.wire.errors import WireError
from fedsim.wire.messages import Advance, Message, Shutdown, Task, Update
from fedsim.wire.payloads import HeldVersions
from fedsim.wire.tensors import Model, TensorSpec

if TYPE_CHECKING:
    from torch import nn

__all__ = ["AdvanceRequest", "BadTask", "Holder", "Preemption", "Reply", "Request", "Requests",
           "TaskRequest", "read_request", "send_reply"]


@dataclass(frozen=True, slots=True)
class TaskRequest:
    """A task as its trainer receives it: the task (its model held or its own), the
    request id and when its result is due (emulated s), from the envelope its host
    stamped on it."""

    task: Task
    request_id: int
    due: float

    @property
    def client(self) -> int:
        return self.task.client


@dataclass(frozen=True, slots=True)
class BadTask:
    """A task its trainer cannot run (it came without a model the trainer holds):
    answered with a failure, so its host does not wait for it."""

    request_id: int
    client: int
    reason: str
    due: float = -math.inf


@dataclass(frozen=True, slots=True)
class AdvanceRequest:
    """An Advance as its trainer receives it: every average it names, by round (those
    it carried, kept for the Advances after it, and those held from before)."""

    advance: Advance
    averages: tuple[tuple[int, Model], ...]

    @property
    def client(self) -> int:
        return self.advance.client

    @property
    def request_id(self) -> int:
        return self.advance.request_id

    @property
    def due(self) -> float | None:
        return self.advance.due

    @classmethod
    def of(cls, msg: Advance, rounds: HeldVersions, spec: TensorSpec) -> AdvanceRequest:
        """``msg`` with its averages (each of ``spec``): those it carries (then held)
        and those held (``WireError("unknown_payload")`` when one is not)."""
        got: dict[int, Model] = {}
        if msg.model is not None:
            flat = msg.model.flat()
            n = len(flat) // len(msg.rounds)
            for i, r in enumerate(msg.rounds):
                got[r] = Model.from_flat(flat[i * n:(i + 1) * n], spec)
                rounds.keep(r, got[r])
        for r in msg.held:
            got[r] = rounds.model(r, f"Advance of client {msg.client} names the average "
                                     "of a round the trainer does not hold: round")
        return cls(msg, tuple(sorted(got.items())))


Request = Message | TaskRequest | AdvanceRequest | BadTask
#: A reply, and the update it uploads (sent first, its envelope's ``seq`` the request id).
Reply = tuple[Message, Update | None]


class Holder(Protocol):
    """What a trainer holds of the models its requests name (:mod:`fedsim.wire.payloads`)."""

    #: the models of the versions its tasks train from
    held: HeldVersions
    #: the round averages its Advances carried (a pipelined algorithm's)
    held_rounds: HeldVersions
    #: the model's spec (one copy)
    spec: TensorSpec


def read_request(frames: Frames, holder: Holder) -> Request:
    """Decode one request from the trainer's parent, in the order they were sent: a
    task gets its version's model, an Advance its rounds' averages."""
    msg, meta = decode(frames, max_header=None, check_finite=False)
    if isinstance(msg, Task):
        try:
            return TaskRequest(holder.held.bind(msg), meta.seq, meta.sent_at)
        except WireError as exc:
            return BadTask(meta.seq, msg.client, str(exc))
    if isinstance(msg, Advance):
        try:
            return AdvanceRequest.of(msg, holder.held_rounds, holder.spec)
        except WireError as exc:
            return BadTask(msg.request_id, msg.client, str(exc))
    return msg


def send_reply(sock: zmq.Socket[bytes], reply: Reply) -> None:
    """Send a reply, its update first."""
    msg, upload = reply
    if upload is not None:
        sock.send_multipart(encode(upload, seq=getattr(msg, "request_id", 0)), copy=False)
    sock.send_multipart(encode(msg), copy=False)


class Worker(Holder, Protocol):
    """What :class:`Preemption` needs of a :class:`fedsim.actors.worker.Worker`."""

    model: nn.Module
    #: per request being answered: real seconds lent to more urgent ones
    nested: list[float]

    def handle(self, msg: Request) -> Reply: ...


class Requests:
    """Requests waiting for the worker, earliest ``due`` first (then in arrival order).

    A host's clients often start their local work at the same emulated
    instant (a synchronous round): taken first in, first out, a two-step run
    waits behind a hundred-step one and misses its compute deadline at any
    dilation. Earliest due first is the order that meets every deadline
    whenever any order can (one machine, no preemption, all released
    together). Requests without a due time (and Shutdown) go first.
    """

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Request]] = []
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, msg: Request) -> None:
        due = getattr(msg, "due", None)
        heapq.heappush(self._heap, (-math.inf if due is None else float(due),
                                    next(self._seq), msg))

    def pop(self) -> Request:
        return heapq.heappop(self._heap)[2]

    def first_due(self) -> float:
        """The earliest due time waiting (-inf for one without; +inf when none waits)."""
        return self._heap[0][0] if self._heap else math.inf

    def first(self) -> Request:
        return self._heap[0][2]


def _due(msg: Request) -> float:
    due = getattr(msg, "due", None)
    return -math.inf if due is None else float(due)


class Preemption:
    """Let a more urgent request go first, in the middle of a local run.

    A trainer serves several clients, and their local runs overlap in
    emulated time: answered one after another, a client's two-step run
    that arrives while another's hundred-step run trains waits for all of
    it and misses its compute deadline, at any dilation that the machine
    could otherwise keep (measured: an asynchronous algorithm with 5 clients per trainer
    overran 2 % of its runs at dilation 1 while using a fifth of a core).
    Earliest deadline first *with preemption* is the order that meets every
    deadline whenever any order on one machine can. So after every local
    step :func:`~fedsim.algorithms.local.local_train` calls this: it reads
    what waits on the socket and, while a request is due strictly earlier
    than the one training (and is for another client), saves the model's
    parameters, answers that request at once (which may itself let a still
    more urgent one go first), and puts the parameters back. Each run's
    result depends only on its own model, data, optimizer and random
    stream, so it is the same, bit for bit, whether it was interrupted or
    not; its ``compute_s`` leaves out the time spent on the others.

    Only for client algorithms that train with ``local_train`` and keep no
    state of their own between steps (:class:`~fedsim.algorithms.sgdclient.LocalSGDClient`).
    """

    def __init__(self, sock: zmq.Socket[bytes], worker: Worker, waiting: Requests) -> None:
        self.sock = sock
        self.worker = worker
        self.waiting = waiting
        self.running: list[tuple[float, int]] = []   # (due, client) of the runs under way
        self._looked = -math.inf

    def answer(self, msg: Request) -> Reply:
        """Answer ``msg`` (the outermost request, or one let in by :meth:`__call__`)."""
        self.running.append((_due(msg), getattr(msg, "client", -1)))
        try:
            return self.worker.handle(msg)
        finally:
            self.running.pop()

    def read(self) -> None:
        """Take every request waiting on the socket."""
        sock = self.sock
        while cast(int, sock.get(zmq.EVENTS)) & zmq.POLLIN:
            try:
                frames = sock.recv_multipart(flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            self.waiting.push(read_request(frames, self.worker))

    #: Real seconds between looks at the socket in the middle of a run (a look
    #: costs about 3 % of a small model's step; a run lets another in at most
    #: this much plus a step late).
    LOOK_EVERY = 0.0005

    def __call__(self) -> None:
        now = time.perf_counter()
        if now - self._looked < self.LOOK_EVERY:
            return
        self._looked = now
        self.read()
        waiting = self.waiting
        while self.running and waiting.first_due() < self.running[-1][0]:
            nxt = waiting.first()
            if isinstance(nxt, Shutdown) or getattr(nxt, "client", None) in {
                    c for _, c in self.running}:
                return
            waiting.pop()
            model = self.worker.model
            saved = flatten([p for p in model.parameters() if p.requires_grad])
            began = time.perf_counter()
            send_reply(self.sock, self.answer(nxt))
            load_vector(model, saved)
            self.worker.nested[-1] += time.perf_counter() - began
            self.read()
