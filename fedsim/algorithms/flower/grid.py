"""The Grid a Flower ServerApp drives under fedsim, and where its thread meets the server's loop.

A Flower ``ServerApp`` is blocking code: its strategy calls
``grid.send_and_receive`` (or ``push_messages`` and ``pull_messages``) and
waits. fedsim runs it in a thread of the server process, as Flower's own
simulation does, and gives it :class:`FedsimGrid`, a subclass of Flower's
public :class:`flwr.serverapp.Grid`. The grid never touches a socket or a
clock: it hands each pushed message to an :class:`Exchange` and waits on it;
the server's event loop (:class:`fedsim.flower.server.FlowerServer`, an
ordinary sans-I/O :class:`~fedsim.algorithms.api.ServerAlgorithm`) takes the
messages out, sends each as a task over the emulated network, and puts the
replies back as they arrive. So every wait of the strategy is a wait in
emulated time: a reply comes when its task has crossed the client's
downlink, been trained for the client's emulated compute time and crossed
its uplink, and ``send_and_receive``'s ``timeout`` is counted in emulated
seconds by the server's own timers.

Replies that never come reach the strategy as Flower's own error replies
do (:class:`flwr.app.Error` with a :class:`flwr.common.constant.ErrorCode`):
``NODE_UNAVAILABLE`` for a message to a client that is away, gone or not in
the federation; ``REPLY_MESSAGE_UNAVAILABLE`` for one whose reply did not
come within its TTL (emulated seconds); a ``ClientApp`` that raised answers
``CLIENT_APP_RAISED_EXCEPTION`` itself.
"""

from __future__ import annotations

import threading
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from flwr.app import Error, Message, RecordDict
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid
from flwr.supercore.run import Run

__all__ = ["Exchange", "FedsimGrid", "Pushed", "error_reply", "node_unavailable",
           "reply_unavailable"]

#: Flower's own reasons, so a strategy that logs them reads what it would under Flower
NODE_UNAVAILABLE_REASON = ("Error: Node Unavailable - the destination node is away, gone, or "
                           "not in the federation (fedsim)")
REPLY_UNAVAILABLE_REASON = "Error: Reply Message Unavailable - The reply message has expired."


def error_reply(msg: Message, code: int, reason: str) -> Message:
    """Flower's error reply to ``msg`` (as its SuperLink builds one)."""
    reply = Message(Error(code=code, reason=reason), reply_to=msg)
    reply.metadata.__dict__["_message_id"] = str(uuid.uuid4())
    return reply


@dataclass
class Pushed:
    """A message the ServerApp pushed, waiting for the server's loop to send it."""

    message: Message
    #: a send_and_receive batch's number, or None for push_messages
    batch: int | None = None


@dataclass
class _Batch:
    """One send_and_receive call: the ids it waits for and its emulated deadline."""

    ids: set[str]
    timeout: float | None
    deadline: float | None = None     # set by the loop when it sends the batch
    expired: bool = False


@dataclass
class Exchange:
    """Where the ServerApp's thread and the server's event loop meet.

    The thread pushes messages and waits for replies; the loop (the only
    one that reads the emulated clock or sends anything) drains the pushed
    messages, files replies and expires deadlines. Every field is guarded
    by ``cond``'s lock. ``wake`` is set by the server: a thread-safe call
    that makes its loop look at the exchange soon.
    """

    cond: threading.Condition = field(default_factory=threading.Condition)
    pushed: deque[Pushed] = field(default_factory=deque)
    #: reply per message id, until pulled
    replies: dict[str, Message] = field(default_factory=dict)
    #: message ids pushed and not yet pulled (pull_messages answers only these)
    open: set[str] = field(default_factory=set)
    batches: dict[int, _Batch] = field(default_factory=dict)
    wake: Callable[[], None] = lambda: None
    #: the run is over (the ServerApp's waits return what they have)
    closed: bool = False
    _batch_ids: int = 0

    # -- the ServerApp's side (its thread) ------------------------------------------
    def push(self, messages: list[Message], timeout: float | None = None,
             batch: bool = False) -> tuple[list[str], int | None]:
        """Queue ``messages`` for sending; their ids, and the batch number when ``batch``."""
        with self.cond:
            if self.closed:
                raise RuntimeError("the fedsim run has ended: no more messages can be sent")
            number = None
            if batch:
                self._batch_ids += 1
                number = self._batch_ids
                self.batches[number] = _Batch({m.metadata.message_id for m in messages},
                                              timeout)
            for m in messages:
                self.open.add(m.metadata.message_id)
                self.pushed.append(Pushed(m, number))
        self.wake()
        return [m.metadata.message_id for m in messages], number

    def pull(self, ids: Iterable[str]) -> list[Message]:
        """The replies that arrived for ``ids`` (each once), in arrival order."""
        with self.cond:
            return self._take(set(ids))

    def wait(self, number: int) -> list[Message]:
        """Block until batch ``number`` has every reply, expired, or the run ended;
        then its replies (in arrival order)."""
        with self.cond:
            b = self.batches[number]
            self.cond.wait_for(lambda: self.closed or b.expired
                               or b.ids <= self.replies.keys())
            del self.batches[number]
            return self._take(b.ids)

    def _take(self, ids: set[str]) -> list[Message]:
        out = [m for k, m in self.replies.items() if k in ids]   # dicts keep arrival order
        for m in out:
            del self.replies[m.metadata.reply_to_message_id]
            self.open.discard(m.metadata.reply_to_message_id)
        return out

    # -- the server loop's side -----------------------------------------------------
    def drain(self) -> list[Pushed]:
        """Take every pushed message (the loop sends them)."""
        with self.cond:
            out = list(self.pushed)
            self.pushed.clear()
            return out

    def sent(self, number: int | None, now: float) -> float | None:
        """Batch ``number``'s messages leave at emulated ``now``: its deadline, if any."""
        with self.cond:
            b = self.batches.get(number) if number is not None else None
            if b is None or b.timeout is None:
                return None
            if b.deadline is None:
                b.deadline = now + b.timeout
            return b.deadline

    def deliver(self, reply: Message) -> None:
        """File a reply (or an error reply) for the message it answers."""
        with self.cond:
            key = reply.metadata.reply_to_message_id
            if key in self.open and key not in self.replies:
                self.replies[key] = reply
                self.cond.notify_all()

    def expire(self, now: float) -> None:
        """Mark the batches whose deadline has passed (their waits return)."""
        with self.cond:
            for b in self.batches.values():
                if b.deadline is not None and not b.expired and b.deadline <= now:
                    b.expired = True
                    self.cond.notify_all()

    def next_deadline(self) -> float | None:
        """The earliest deadline of a batch still waiting, if any."""
        with self.cond:
            return min((b.deadline for b in self.batches.values()
                        if b.deadline is not None and not b.expired), default=None)

    def close(self) -> None:
        """The run is over: every wait returns."""
        with self.cond:
            self.closed = True
            self.cond.notify_all()


class FedsimGrid(Grid):
    """Flower's Grid over fedsim's emulated network (see the module docstring).

    ``nodes`` are the node ids the ServerApp sees: fedsim's client ids, the
    clients registered when the federation began; ``exchange`` is shared
    with the server's loop.
    """

    def __init__(self, exchange: Exchange, nodes: Iterable[int], run: Run) -> None:
        self.exchange = exchange
        self._nodes = list(nodes)
        self._run = run

    def set_run(self, run: Run) -> None:
        if not isinstance(run, Run):
            raise TypeError(f"`run` must be an instance of Run, got {type(run).__name__}")
        self._run = run

    @property
    def run(self) -> Run:
        return Run(**vars(self._run))

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int,
                       group_id: str, ttl: float | None = None) -> Message:
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        return list(self._nodes)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids, _ = self.exchange.push(self._stamped(messages))
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return self.exchange.pull(message_ids)

    def send_and_receive(self, messages: Iterable[Message], *,
                         timeout: float | None = None) -> Iterable[Message]:
        if timeout is not None and not timeout >= 0:
            raise ValueError(f"timeout must be None or >= 0 seconds, got {timeout!r}")
        msgs = self._stamped(messages)
        if not msgs:
            return []
        _, number = self.exchange.push(msgs, timeout, batch=True)
        assert number is not None
        return self.exchange.wait(number)

    def _stamped(self, messages: Iterable[Message]) -> list[Message]:
        """Each message with a fresh id, checked as Flower's own in-memory grid does."""
        out = []
        for m in messages:
            if not isinstance(m, Message):
                raise TypeError(f"push a flwr Message, got {type(m).__name__}")
            md = m.metadata
            md.__dict__["_message_id"] = str(uuid.uuid4())
            md.__dict__["_run_id"] = self._run.run_id
            if not (md.reply_to_message_id == "" and md.ttl > 0 and md.delivered_at == ""):
                raise ValueError(f"Invalid message: {m}")
            out.append(m)
        return out


def node_unavailable(msg: Message) -> Message:
    """The reply to a message whose destination is away, gone or unknown."""
    return error_reply(msg, ErrorCode.NODE_UNAVAILABLE, NODE_UNAVAILABLE_REASON)


def reply_unavailable(msg: Message) -> Message:
    """The reply to a message whose reply did not come within its TTL."""
    return error_reply(msg, ErrorCode.REPLY_MESSAGE_UNAVAILABLE, REPLY_UNAVAILABLE_REASON)
