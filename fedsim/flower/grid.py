"""The Grid a Flower ServerApp drives under fedsim, and where its thread meets the server's loop.

A Flower ``ServerApp`` is blocking code: its strategy calls
``grid.send_and_receive`` (or ``push_messages`` and ``pull_messages``) and
waits. fedsim runs it in a thread of the server process, as Flower's own
simulation does, and gives it :class:`FedsimGrid`, a subclass of Flower's
public :class:`flwr.serverapp.Grid`. The grid never touches a socket or a
clock: it serializes each pushed message's content (in the app's thread, at
the moment of the push: a strategy may change its records afterwards) and
hands it to an :class:`Exchange`, then waits on it; the server's event loop
(:class:`fedsim.flower.server.FlowerServer`, an ordinary
sans-I/O :class:`~fedsim.algorithms.api.ServerAlgorithm`) takes the messages
out, sends each as a task over the emulated network, and puts the replies
back as they arrive. So every wait of the strategy is a wait in emulated
time: a reply comes when its task has crossed the client's downlink, been
trained for the client's emulated compute time and crossed its uplink, and
``send_and_receive``'s ``timeout`` is counted in emulated seconds by the
server's own timers.

Replies that never come reach the strategy as Flower's own error replies
do (:class:`flwr.app.Error` with a :class:`flwr.common.constant.ErrorCode`):
``NODE_UNAVAILABLE`` for a message to a node that is gone or not in the
federation, or that went away while it had the message;
``REPLY_MESSAGE_UNAVAILABLE`` for one whose reply did not come within its
TTL (emulated seconds); a ``ClientApp`` that raised answers
``CLIENT_APP_RAISED_EXCEPTION`` itself.

Node ids: a fedsim client ``c`` is Flower node ``NODE_BASE + c`` (Flower's
own ids are large random integers, and 1 is its SuperLink's); its
``partition-id`` is ``c``.
"""

from __future__ import annotations

import hashlib
import math
import threading
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from flwr.app import Error, Message, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode
from flwr.serverapp import Grid
from flwr.supercore.run import Run

from fedsim.flower.content import content_bytes

__all__ = ["NODE_BASE", "Exchange", "FedsimGrid", "Pushed", "answer", "client_of", "error_reply",
           "node_of", "node_unavailable", "reply_unavailable"]

#: Flower node id of fedsim client 0
NODE_BASE = 1000

#: Flower's own reasons, so a strategy that logs them reads what it would under Flower
NODE_UNAVAILABLE_REASON = ("Error: Node Unavailable - the destination node is away, gone, or "
                           "not in the federation (fedsim)")
REPLY_UNAVAILABLE_REASON = "Error: Reply Message Unavailable - The reply message has expired."


def node_of(client: int) -> int:
    """The Flower node id of fedsim client ``client``."""
    return NODE_BASE + client


def client_of(node: int) -> int | None:
    """The fedsim client of Flower node ``node`` (None: not one of fedsim's)."""
    return node - NODE_BASE if isinstance(node, int) and node >= NODE_BASE else None


def answer(msg: Message, message_id: str, body: RecordDict | Error) -> Message:
    """The reply to ``msg`` (pushed as ``message_id``) holding ``body``: its metadata
    is derived from the message, as Flower derives a reply's."""
    reply = Message(body, reply_to=msg)
    reply.metadata.__dict__["_message_id"] = str(uuid.uuid4())
    reply.metadata.__dict__["_reply_to_message_id"] = message_id
    return reply


def error_reply(msg: Message, code: int, reason: str, message_id: str | None = None) -> Message:
    """Flower's error reply to ``msg`` as its SuperLink builds one: from and to the
    SuperLink's node id (1), not from the node the message was for (a ClientApp's own
    exception comes from its node: the server passes on the node's reply)."""
    reply = answer(msg, message_id or msg.metadata.message_id, Error(code=code, reason=reason))
    reply.metadata.__dict__["_src_node_id"] = SUPERLINK_NODE_ID
    reply.metadata.__dict__["_dst_node_id"] = SUPERLINK_NODE_ID
    return reply


def node_unavailable(msg: Message, message_id: str | None = None) -> Message:
    """The reply to a message whose destination is away, gone or unknown."""
    return error_reply(msg, ErrorCode.NODE_UNAVAILABLE, NODE_UNAVAILABLE_REASON, message_id)


def reply_unavailable(msg: Message, message_id: str | None = None) -> Message:
    """The reply to a message whose reply did not come within its TTL."""
    return error_reply(msg, ErrorCode.REPLY_MESSAGE_UNAVAILABLE, REPLY_UNAVAILABLE_REASON,
                       message_id)


@dataclass
class Pushed:
    """A message the ServerApp pushed, waiting for the server's loop to send it:
    its id (fixed at the push), its content serialized then, and that
    serialization's digest (the loop's payload versions go by it)."""

    message: Message
    message_id: str
    data: bytes
    digest: bytes
    #: a send_and_receive batch's number, or None for push_messages
    batch: int | None = None


@dataclass
class _Batch:
    """One send_and_receive call: the ids it waits for and its emulated deadline."""

    ids: set[str]
    timeout: float | None
    deadline: float | None = None     # set by the loop when it sends the batch
    expired: bool = False
    #: replies still to come (the waiting thread is woken when none are left)
    missing: int = 0


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
    #: message ids pushed and not yet pulled (pull_messages answers only these; a
    #: send_and_receive that timed out leaves its missing ones for a later pull,
    #: as Flower's own grid does)
    open: set[str] = field(default_factory=set)
    #: a filed reply's TTL: when it is replaced by the error reply that says it
    #: expired (what Flower answers a pull after the TTL), which frees the reply;
    #: with the message it answers, to build that error reply then
    lapse: dict[str, tuple[float, Message]] = field(default_factory=dict)
    batches: dict[int, _Batch] = field(default_factory=dict)
    #: the batch a message id waits in (while its send_and_receive waits)
    batch_of: dict[str, int] = field(default_factory=dict)
    #: the node ids the federation has now (the loop keeps it)
    nodes: list[int] = field(default_factory=list)
    wake: Callable[[], None] = lambda: None
    #: the run is over (the ServerApp's waits return what they have)
    closed: bool = False
    #: the most bytes a message's content may have (the run's payload limit)
    limit: int = 2**62
    _batch_ids: int = 0

    # -- the ServerApp's side (its thread) ------------------------------------------
    def push(self, messages: list[Pushed], timeout: float | None = None,
             batch: bool = False) -> tuple[list[str], int | None]:
        """Queue ``messages`` for sending; their ids, and the batch number when ``batch``."""
        with self.cond:
            if self.closed:
                raise RuntimeError("the fedsim run has ended: no more messages can be sent")
            number = None
            if batch:
                self._batch_ids += 1
                number = self._batch_ids
                self.batches[number] = _Batch({p.message_id for p in messages}, timeout,
                                              missing=len({p.message_id for p in messages}))
            for p in messages:
                p.batch = number
                if number is not None:
                    self.batch_of[p.message_id] = number
                self.open.add(p.message_id)
                self.pushed.append(p)
        self.wake()
        return [p.message_id for p in messages], number

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
            for key in b.ids:
                self.batch_of.pop(key, None)
            return self._take(b.ids)

    def _take(self, ids: set[str]) -> list[Message]:
        out = [m for k, m in self.replies.items() if k in ids]   # dicts keep arrival order
        for m in out:
            key = m.metadata.reply_to_message_id
            del self.replies[key]
            self.open.discard(key)
            self.lapse.pop(key, None)
        return out

    def node_ids(self) -> list[int]:
        with self.cond:
            if self.closed:
                raise RuntimeError("the fedsim run has ended")
            return list(self.nodes)

    # -- the server loop's side -----------------------------------------------------
    def drain(self) -> list[Pushed]:
        """Take every pushed message (the loop sends them)."""
        with self.cond:
            out = list(self.pushed)
            self.pushed.clear()
            return out

    def sent(self, number: int | None, now: float) -> None:
        """Batch ``number``'s messages leave at emulated ``now``: its deadline starts."""
        with self.cond:
            b = self.batches.get(number) if number is not None else None
            if b is not None and b.timeout is not None and b.deadline is None:
                b.deadline = now + b.timeout

    def deliver(self, reply: Message, lapse: tuple[float, Message] | None = None) -> bool:
        """File a reply (or an error reply) for the message it answers; whether it
        was filed (False: that message has one already, or was pulled). ``lapse``:
        when the reply expires unpulled, and the message it answers (whose
        ``REPLY_MESSAGE_UNAVAILABLE`` then replaces it). The ServerApp's thread
        is woken only when a send_and_receive it waits in has every reply (a
        pull does not wait)."""
        with self.cond:
            key = reply.metadata.reply_to_message_id
            if key not in self.open or key in self.replies:
                return False
            self.replies[key] = reply
            if lapse is not None:
                self.lapse[key] = lapse
            b = self.batches.get(self.batch_of.get(key, 0))
            if b is not None:
                b.missing -= 1
                if b.missing <= 0:
                    self.cond.notify_all()
            return True

    def expire(self, now: float) -> None:
        """Mark the batches whose deadline has passed (their waits return), and
        replace the unpulled replies whose TTL passed by their error reply."""
        with self.cond:
            for key in [k for k, (t, _) in self.lapse.items() if t <= now]:
                _, message = self.lapse.pop(key)
                if key in self.replies:
                    self.replies[key] = reply_unavailable(message, key)
            for b in self.batches.values():
                if b.deadline is not None and not b.expired and b.deadline <= now:
                    b.expired = True
                    self.cond.notify_all()

    def next_lapse(self) -> float | None:
        """When the next unpulled reply expires, if any."""
        with self.cond:
            return min((t for t, _ in self.lapse.values()), default=None)

    def next_deadline(self) -> float | None:
        """The earliest deadline of a batch still waiting, if any."""
        with self.cond:
            return min((b.deadline for b in self.batches.values()
                        if b.deadline is not None and not b.expired), default=None)

    def set_nodes(self, nodes: Iterable[int]) -> None:
        with self.cond:
            self.nodes = sorted(nodes)

    def close(self) -> None:
        """The run is over: every wait returns, every further call raises."""
        with self.cond:
            self.closed = True
            self.cond.notify_all()


class FedsimGrid(Grid):
    """Flower's Grid over fedsim's emulated network (see the module docstring);
    ``exchange`` is shared with the server's loop."""

    def __init__(self, exchange: Exchange, run: Run) -> None:
        self.exchange = exchange
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
        return self.exchange.node_ids()

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids, _ = self.exchange.push(self._stamped(messages))
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return self.exchange.pull(message_ids)

    def send_and_receive(self, messages: Iterable[Message], *,
                         timeout: float | None = None) -> Iterable[Message]:
        if timeout is not None and not (timeout >= 0 and math.isfinite(timeout)):
            raise ValueError(f"timeout must be None or a finite number of seconds >= 0, "
                             f"got {timeout!r}")
        msgs = self._stamped(messages)
        if not msgs:
            return []
        _, number = self.exchange.push(msgs, timeout, batch=True)
        assert number is not None
        return self.exchange.wait(number)

    def _stamped(self, messages: Iterable[Message]) -> list[Pushed]:
        """Each message with a fresh id, checked as Flower's own in-memory grid does,
        its content serialized now (once per content object of the call)."""
        out: list[Pushed] = []
        done: dict[int, tuple[RecordDict, bytes, bytes]] = {}
        for m in messages:
            if not isinstance(m, Message):
                raise TypeError(f"push a flwr Message, got {type(m).__name__}")
            md = m.metadata
            if not (md.reply_to_message_id == "" and md.delivered_at == ""
                    and md.ttl > 0 and math.isfinite(md.ttl)):
                raise ValueError(f"Invalid message (a new message with a finite ttl > 0 is "
                                 f"sent, not a reply): {m}")
            if not m.has_content():
                raise ValueError(f"Invalid message: it has no content: {m}")
            md.__dict__["_message_id"] = str(uuid.uuid4())
            md.__dict__["_run_id"] = self._run.run_id
            content = m.content
            held = done.get(id(content))
            if held is None or held[0] is not content:
                data = content_bytes(content)
                if len(data) > self.exchange.limit:
                    raise ValueError(
                        f"a message of {len(data)} bytes: the run takes at most "
                        f"{self.exchange.limit} (algorithm.max_message_mb; by default 3 x the "
                        "scenario model's size + 1 MB, at least 16 MB)")
                held = done[id(content)] = (content, data,
                                            hashlib.blake2b(data, digest_size=16).digest())
            out.append(Pushed(m, md.message_id, held[1], held[2]))
        return out
