"""The Grid a Flower ServerApp drives under fedsim, in the ServerApp's own process.

:class:`FedsimGrid` is a subclass of Flower's public
:class:`flwr.serverapp.Grid`. It never touches a socket to a client or a
clock: it serializes each pushed message's content (at the moment of the
push: a strategy may change its records afterwards) and hands it over the
pipe (:class:`~.link.AppLink`) to the server process, whose event loop
sends it as a task over the emulated network and files the replies as they
arrive (:mod:`.exchange`). So every wait of the strategy is a wait in
emulated time: a reply comes when its task has crossed the client's
downlink, been trained for the client's emulated compute time and crossed
its uplink, and ``send_and_receive``'s ``timeout`` is counted in emulated
seconds by the server's own timers.

The replies the strategy receives are built here from what the server
filed: the node's reply gives its content or error, its metadata is
derived from the message it answers (as Flower derives a reply's), and
every ``MetricRecord``'s ``num-examples`` in a train reply is the server's
record of the node's samples; an error the server answers comes from the
SuperLink's node id (1), as Flower's own error replies do. Once the run is
over, every call raises Flower's ``RunNotRunningException``.
"""

from __future__ import annotations

import copy
import hashlib
import math
import uuid
from collections import OrderedDict
from collections.abc import Iterable

from flwr.app import Error, Message, MetricRecord, RecordDict
from flwr.app.message import make_message
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode
from flwr.serverapp import Grid
from flwr.supercore.run import Run, RunNotRunningException

from fedsim.flower.content import content_bytes, head_of, reply_of
from fedsim.flower.exchange import Reply, RunEnded
from fedsim.flower.link import AppLink, Sent, replies_of

__all__ = ["FedsimGrid", "answer", "error_reply"]

#: messages in flight the grid remembers to build their replies (oldest dropped first)
_REMEMBERED = 1 << 16


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


class FedsimGrid(Grid):
    """Flower's Grid over fedsim's emulated network (see the module docstring);
    ``link`` is the pipe to the server process; ``limit`` the most bytes a
    message's content may have (the run's payload limit)."""

    def __init__(self, link: AppLink, run: Run, limit: int) -> None:
        self.link = link
        self.limit = limit
        self._run = run
        #: message id -> the message pushed, without its content (what a reply is built from)
        self._sent: OrderedDict[str, Message] = OrderedDict()

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

    def _call(self, op: str, args: tuple[object, ...] = (),
              payloads: list[bytes] | None = None) -> tuple[object, list[bytearray]]:
        try:
            return self.link.call(op, args, payloads or [])
        except RunEnded as exc:
            raise RunNotRunningException(str(exc)) from None

    def get_node_ids(self) -> Iterable[int]:
        nodes, _ = self._call("nodes")
        assert isinstance(nodes, list)
        return nodes

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        sent, payloads = self._stamped(messages)
        value, _ = self._call("push", (sent, None, False), payloads)
        assert isinstance(value, tuple)
        ids: list[str] = value[0]
        return list(ids)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        value, payloads = self._call("pull", (list(message_ids),))
        return self._replies(value, payloads)

    def send_and_receive(self, messages: Iterable[Message], *,
                         timeout: float | None = None) -> Iterable[Message]:
        if timeout is not None and not (timeout >= 0 and math.isfinite(timeout)):
            raise ValueError(f"timeout must be None or a finite number of seconds >= 0, "
                             f"got {timeout!r}")
        sent, payloads = self._stamped(messages)
        if not sent:
            return []
        value, _ = self._call("push", (sent, timeout, True), payloads)
        assert isinstance(value, tuple)
        number: int = value[1]
        value, replies = self._call("wait", (number,))
        return self._replies(value, replies)

    def _replies(self, wire: object, payloads: list[bytearray]) -> list[Message]:
        out = []
        for r in replies_of(wire, payloads):  # type: ignore[arg-type]
            msg = self._sent.pop(r.message_id, None)
            if msg is not None:
                out.append(self._reply(msg, r))
        return out

    @staticmethod
    def _reply(msg: Message, r: Reply) -> Message:
        """The Message the strategy receives for ``r``, the answer to ``msg``."""
        if r.data is None:
            return error_reply(msg, r.code, r.reason, r.message_id)
        try:
            theirs = reply_of(r.data)
        except Exception as exc:   # the server checked its head, not its records
            return error_reply(msg, ErrorCode.UNKNOWN,
                               f"fedsim refused the reply of node {msg.metadata.dst_node_id}: "
                               f"{type(exc).__name__}: {exc}"[:300], r.message_id)
        if theirs.has_error():
            return answer(msg, r.message_id, theirs.error)
        reply = answer(msg, r.message_id, theirs.content)
        if r.num_examples is not None:
            for record in reply.content.values():
                if isinstance(record, MetricRecord) and "num-examples" in record:
                    record["num-examples"] = r.num_examples
        return reply

    def _stamped(self, messages: Iterable[Message]) -> tuple[list[Sent], list[bytes]]:
        """Each message with a fresh id, checked as Flower's own in-memory grid does,
        its content serialized now (once per content object of the call)."""
        sent: list[Sent] = []
        payloads: list[bytes] = []
        done: dict[int, tuple[RecordDict, bytes, int]] = {}
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
                if len(data) > self.limit:
                    raise ValueError(
                        f"a message of {len(data)} bytes: the run takes at most "
                        f"{self.limit} (algorithm.max_message_mb; by default 3 x the "
                        "scenario model's size + 1 MB, at least 16 MB)")
                payloads.append(data)
                held = done[id(content)] = (content, hashlib.blake2b(data, digest_size=16)
                                            .digest(), len(payloads) - 1)
            sent.append((head_of(m), md.message_id, held[1], held[2]))
            self._remember(m)
        return sent, payloads

    def _remember(self, m: Message) -> None:
        shell = make_message(metadata=copy.copy(m.metadata), content=RecordDict())
        self._sent[m.metadata.message_id] = shell
        while len(self._sent) > _REMEMBERED:
            self._sent.popitem(last=False)
