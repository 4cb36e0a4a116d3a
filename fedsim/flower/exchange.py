"""Where the ServerApp's calls meet the server's event loop: pushed messages in, replies out.

A Flower ``ServerApp`` is blocking code: its strategy calls
``grid.send_and_receive`` (or ``push_messages`` and ``pull_messages``) and
waits. It runs in a process of its own (:mod:`.serverapp`); each call of its
grid arrives in the server process over a pipe (:mod:`.link`) and lands
here. The :class:`Exchange` holds what the two sides share: the messages
pushed and not yet sent, the replies not yet pulled, the
``send_and_receive`` calls waiting and their emulated deadlines, and the
node ids of the federation. The server's event loop
(:class:`fedsim.flower.server.FlowerServer`, a sans-I/O
:class:`~fedsim.algorithms.api.ServerAlgorithm`) is the only one that reads
the emulated clock or sends anything: it drains the pushed messages, sends
each as a task over the emulated network, files the replies as they
arrive and expires deadlines. So every wait of the strategy is a wait in
emulated time.

The server side handles no Flower ``Message``: a pushed message is its
:class:`~.content.Head` (what routing and the client's copy need), its id
and its serialized content; a reply is a :class:`Reply`, the node's reply
as it came (checked by the loop) or the code and reason of an error the
server answers. The ServerApp's process builds the ``Message`` its strategy
receives from it (:mod:`.grid`), with the metadata Flower derives from the
message it answers.

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

import threading
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from flwr.common.constant import ErrorCode

from fedsim.flower.content import Head

__all__ = ["NODE_BASE", "NODE_UNAVAILABLE_REASON", "REPLY_UNAVAILABLE_REASON", "Exchange",
           "Pushed", "Reply", "RunEnded", "client_of", "node_of"]

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


class RunEnded(RuntimeError):
    """The fedsim run has ended: the ServerApp can send nothing more."""


@dataclass(frozen=True, slots=True)
class Reply:
    """The answer to one pushed message (``message_id``): the node's reply as it
    came (``data``: Flower's serialized reply, whose content or error the
    strategy receives; ``num_examples``: the server's record of the node's
    samples, which replaces the reply's claim in a train reply), or an error
    the server answers (``code``, ``reason``: one of Flower's)."""

    message_id: str
    data: bytes | bytearray | memoryview | None = None
    num_examples: int | None = None
    code: int = 0
    reason: str = ""

    @classmethod
    def node_unavailable(cls, message_id: str) -> Reply:
        """The answer to a message whose destination is away, gone or unknown."""
        return cls(message_id, code=ErrorCode.NODE_UNAVAILABLE, reason=NODE_UNAVAILABLE_REASON)

    @classmethod
    def reply_unavailable(cls, message_id: str) -> Reply:
        """The answer to a message whose reply did not come within its TTL."""
        return cls(message_id, code=ErrorCode.REPLY_MESSAGE_UNAVAILABLE,
                   reason=REPLY_UNAVAILABLE_REASON)

    @classmethod
    def error(cls, message_id: str, reason: str) -> Reply:
        """fedsim's ``UNKNOWN`` error: it could not send the message or use its reply."""
        return cls(message_id, code=ErrorCode.UNKNOWN, reason=reason)

    @property
    def from_node(self) -> bool:
        """Whether this is the node's own reply (else an error the server answers)."""
        return self.data is not None


@dataclass
class Pushed:
    """A message the ServerApp pushed, waiting for the server's loop to send it:
    its head, its id (fixed at the push), its content serialized then, and that
    serialization's digest (the loop's payload versions go by it)."""

    head: Head
    message_id: str
    data: bytes | bytearray
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
    #: replies still to come (the waiting call is woken when none are left)
    missing: int = 0
    #: set when its wait returns: every reply came, its deadline passed, or the run ended
    done: threading.Event = field(default_factory=threading.Event)
    #: called then too (:meth:`Exchange.watch`), once
    notify: Callable[[], None] | None = None

    def fire(self) -> None:
        """Its wait may return now."""
        if not self.done.is_set():
            self.done.set()
            if self.notify is not None:
                self.notify()


@dataclass
class Exchange:
    """What the ServerApp's calls and the server's event loop share.

    The app's side (:meth:`push`, :meth:`pull`, :meth:`wait`,
    :meth:`node_ids`) is called by the pipe's relay threads
    (:class:`~.link.Relay`); the loop's side by the loop alone. Every field
    is guarded by ``lock``; a waiting send_and_receive is woken by its own
    batch's event. ``wake`` is set by the server: a thread-safe call that
    makes its loop look at the exchange soon.
    """

    lock: threading.Lock = field(default_factory=threading.Lock)
    pushed: deque[Pushed] = field(default_factory=deque)
    #: reply per message id, until pulled (in arrival order)
    replies: dict[str, Reply] = field(default_factory=dict)
    #: message ids pushed and not yet pulled (pull_messages answers only these; a
    #: send_and_receive that timed out leaves its missing ones for a later pull,
    #: as Flower's own grid does)
    open: set[str] = field(default_factory=set)
    #: a filed reply's TTL: when it is replaced by the error reply that says it
    #: expired (what Flower answers a pull after the TTL), which frees the reply
    lapse: dict[str, float] = field(default_factory=dict)
    batches: dict[int, _Batch] = field(default_factory=dict)
    #: the batch a message id waits in (while its send_and_receive waits)
    batch_of: dict[str, int] = field(default_factory=dict)
    #: the node ids the federation has now (the loop keeps it)
    nodes: list[int] = field(default_factory=list)
    wake: Callable[[], None] = lambda: None
    #: the run is over (the ServerApp's waits return what they have)
    closed: bool = False
    _batch_ids: int = 0

    # -- the ServerApp's side (the relay's threads) -----------------------------------
    def push(self, messages: list[Pushed], timeout: float | None = None,
             batch: bool = False) -> tuple[list[str], int | None]:
        """Queue ``messages`` for sending; their ids, and the batch number when ``batch``.
        Raises :class:`RunEnded` once the run is over."""
        with self.lock:
            if self.closed:
                raise RunEnded("the fedsim run has ended: no more messages can be sent")
            number = None
            if batch:
                self._batch_ids += 1
                number = self._batch_ids
                ids = {p.message_id for p in messages}
                self.batches[number] = _Batch(ids, timeout, missing=len(ids))
            for p in messages:
                p.batch = number
                if number is not None:
                    self.batch_of[p.message_id] = number
                self.open.add(p.message_id)
                self.pushed.append(p)
        self.wake()
        return [p.message_id for p in messages], number

    def pull(self, ids: Iterable[str]) -> list[Reply]:
        """The replies that arrived for ``ids`` (each once), in arrival order.
        Raises :class:`RunEnded` once the run is over (a polling app ends)."""
        with self.lock:
            if self.closed:
                raise RunEnded("the fedsim run has ended")
            return self._take(set(ids))

    def wait(self, number: int) -> list[Reply]:
        """Block until batch ``number`` has every reply or its deadline passed; then
        its replies (in arrival order, :meth:`finish`)."""
        with self.lock:
            b = self.batches.get(number)
            if b is None:
                return []
            if b.missing <= 0 or b.expired or self.closed:
                b.fire()
        b.done.wait()
        return self.finish(number)

    def watch(self, number: int, notify: Callable[[], None]) -> None:
        """Call ``notify`` once batch ``number``'s wait may return (every reply came,
        its deadline passed, or the run ended): at once if it may now, else from
        the thread that completes it (keep it short: a queue's put). Then
        :meth:`finish` gives its replies without waiting."""
        with self.lock:
            b = self.batches.get(number)
            if b is not None:
                b.notify = notify
                if not (b.done.is_set() or b.missing <= 0 or b.expired or self.closed):
                    return        # the delivery, deadline or end that completes it tells
                b.done.set()
        notify()                  # complete already (perhaps before anyone watched)

    def finish(self, number: int) -> list[Reply]:
        """Batch ``number``'s replies, in arrival order, once its wait may return.
        Raises :class:`RunEnded` when the run ended before they all came (what
        came is not handed to a strategy that cannot go on)."""
        with self.lock:
            b = self.batches.pop(number, None)
            if b is None:
                return []
            for key in b.ids:
                self.batch_of.pop(key, None)
            if self.closed and b.missing > 0 and not b.expired:
                raise RunEnded("the fedsim run has ended")
            return self._take(b.ids)

    def _take(self, ids: set[str]) -> list[Reply]:
        out = [r for k, r in self.replies.items() if k in ids]   # dicts keep arrival order
        for r in out:
            key = r.message_id
            del self.replies[key]
            self.open.discard(key)
            self.lapse.pop(key, None)
        return out

    def node_ids(self) -> list[int]:
        with self.lock:
            if self.closed:
                raise RunEnded("the fedsim run has ended")
            return list(self.nodes)

    # -- the server loop's side -------------------------------------------------------
    def drain(self) -> list[Pushed]:
        """Take every pushed message (the loop sends them)."""
        with self.lock:
            out = list(self.pushed)
            self.pushed.clear()
            return out

    def sent(self, number: int | None, now: float) -> None:
        """Batch ``number``'s messages leave at emulated ``now``: its deadline starts."""
        with self.lock:
            b = self.batches.get(number) if number is not None else None
            if b is not None and b.timeout is not None and b.deadline is None:
                b.deadline = now + b.timeout

    def deliver(self, reply: Reply, lapse: float | None = None) -> bool:
        """File a reply for the message it answers; whether it was filed (False:
        that message has one already, or was pulled). ``lapse``: when the reply
        expires unpulled (Flower's ``REPLY_MESSAGE_UNAVAILABLE`` then replaces
        it). A send_and_receive waiting is woken only when it has every reply
        (a pull does not wait)."""
        with self.lock:
            key = reply.message_id
            if key not in self.open or key in self.replies:
                return False
            self.replies[key] = reply
            if lapse is not None:
                self.lapse[key] = lapse
            b = self.batches.get(self.batch_of.get(key, 0))
            if b is not None:
                b.missing -= 1
                if b.missing <= 0:
                    b.fire()
            return True

    def expire(self, now: float) -> None:
        """Mark the batches whose deadline has passed (their waits return), and
        replace the unpulled replies whose TTL passed by their error reply."""
        with self.lock:
            for key in [k for k, t in self.lapse.items() if t <= now]:
                del self.lapse[key]
                if key in self.replies:
                    self.replies[key] = Reply.reply_unavailable(key)
            for b in self.batches.values():
                if b.deadline is not None and not b.expired and b.deadline <= now:
                    b.expired = True
                    b.fire()

    def next_lapse(self) -> float | None:
        """When the next unpulled reply expires, if any."""
        with self.lock:
            return min(self.lapse.values(), default=None)

    def next_deadline(self) -> float | None:
        """The earliest deadline of a batch still waiting, if any."""
        with self.lock:
            return min((b.deadline for b in self.batches.values()
                        if b.deadline is not None and not b.expired), default=None)

    def set_nodes(self, nodes: Iterable[int]) -> None:
        with self.lock:
            self.nodes = sorted(nodes)

    def close(self) -> None:
        """The run is over: every wait returns, every further call raises."""
        with self.lock:
            self.closed = True
            for b in self.batches.values():
                b.fire()
