"""How a Flower message crosses fedsim's wire: Flower's own protobuf, as one byte buffer.

One encoding, documented in docs/flower.md: a message's records
(:class:`flwr.app.RecordDict`: its ``ArrayRecord``, ``MetricRecord`` and
``ConfigRecord``) are serialized with Flower's own protobuf serializer
(``flwr.common.serde``), the bytes Flower's transport carries for them, and
travel as the task's or update's model: a single ``uint8`` buffer, sent as
a raw ZeroMQ frame like any model. The emulated links are charged for those
bytes plus fedsim's envelope, so a model of N float32 parameters costs
about 4 N bytes, as it would in Flower.

Downlink (server to client): the content alone is the task's payload, so
one content sent to many clients (a strategy's round: one ``RecordDict``,
a ``Message`` per node) is one payload, which crosses to each client host
and trainer once, as a native algorithm's model version does; the
message's own metadata (id, type, group, TTL) rides in the task's ``tag``
as a small JSON object. Uplink (client to server): the whole reply message
(metadata and content, or an error) is the update's payload.
"""

from __future__ import annotations

import json
import math
from typing import NamedTuple

import numpy as np
from flwr.app import Message, Metadata, RecordDict
from flwr.app.message import make_message
from flwr.common.serde import (
    message_from_proto,
    message_to_proto,
    recorddict_from_proto,
    recorddict_to_proto,
)
from flwr.proto.message_pb2 import Message as ProtoMessage
from flwr.proto.message_pb2 import Metadata as ProtoMetadata
from flwr.proto.recorddict_pb2 import RecordDict as ProtoRecordDict

from fedsim.wire.tensors import Model, TensorSpec

__all__ = ["SERVER_NODE_ID", "Head", "content_bytes", "content_of", "head_of", "header",
           "message_at_client", "reply_bytes", "reply_head", "reply_of", "to_bytes", "to_model"]

#: the node id the ServerApp's messages come from (Flower's SuperLink's)
SERVER_NODE_ID = 1


def content_bytes(content: RecordDict) -> bytes:
    """A message's records, serialized as Flower serializes them."""
    return bytes(recorddict_to_proto(content).SerializeToString())


def content_of(data: bytes | bytearray | memoryview) -> RecordDict:
    """A message's records back from :func:`content_bytes`."""
    return recorddict_from_proto(ProtoRecordDict.FromString(bytes(data)))


def reply_bytes(reply: Message) -> bytes:
    """A whole reply message (metadata and content, or its error)."""
    return bytes(message_to_proto(reply).SerializeToString())


def reply_of(data: bytes | bytearray | memoryview) -> Message:
    """The reply message back from :func:`reply_bytes`."""
    return message_from_proto(ProtoMessage.FromString(bytes(data)))


def _varint(view: memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(view) or shift > 63:
            raise ValueError("a truncated or overlong varint")
        b = view[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7


def reply_head(data: bytes | bytearray | memoryview) -> tuple[str, bool, bool]:
    """What the server checks of a serialized reply, read in place without
    building Flower's records (or parsing the content's bytes): the message id
    it answers, whether it holds an error, whether it holds content. Only the
    top-level fields are walked and the small metadata parsed. ValueError (or
    protobuf's DecodeError) for bytes that are not such a message."""
    view = memoryview(data).cast("B")
    answers: str | None = None
    has_error = has_content = False
    pos = 0
    while pos < len(view):
        key, pos = _varint(view, pos)
        field, wire = key >> 3, key & 7
        if wire != 2:             # every field of a Message is length-delimited
            raise ValueError(f"field {field} has wire type {wire}, not a Flower message's")
        size, pos = _varint(view, pos)
        end = pos + size
        if end > len(view):
            raise ValueError("a field runs past the message's end")
        if field == ProtoMessage.METADATA_FIELD_NUMBER:
            answers = ProtoMetadata.FromString(bytes(view[pos:end])).reply_to_message_id
        elif field == ProtoMessage.CONTENT_FIELD_NUMBER:
            has_content = True
        elif field == ProtoMessage.ERROR_FIELD_NUMBER:
            has_error = True
        pos = end
    if answers is None:
        raise ValueError("it has no metadata")
    return answers, has_error, has_content


def to_model(data: bytes | bytearray) -> Model:
    """Bytes as a wire model: one uint8 tensor, without a copy."""
    arr = np.frombuffer(data, dtype=np.uint8)
    return Model.from_flat(arr, TensorSpec([("uint8", (arr.size,))]))


def to_bytes(model: Model) -> memoryview:
    """A received model's bytes (no copy)."""
    return model.flat().data


class Head(NamedTuple):
    """What the server's side needs of a pushed message's metadata: where it goes,
    its TTL and kind, and what the client's copy of it is rebuilt from."""

    dst: int
    ttl: float
    type: str
    group: str
    created: float
    run: int

    @property
    def kind(self) -> str:
        """``train``, ``evaluate``, ``query`` or ``system`` (the type's first part)."""
        return self.type.split(".")[0]


def head_of(msg: Message) -> Head:
    """A message's :class:`Head`."""
    md = msg.metadata
    return Head(int(md.dst_node_id), float(md.ttl), str(md.message_type), str(md.group_id),
                float(md.created_at), int(md.run_id))


def header(head: Head, message_id: str) -> str:
    """The metadata a task carries beside its content (JSON), with the id the
    message was pushed under."""
    return json.dumps({"id": message_id, "type": head.type, "group": head.group,
                       "ttl": head.ttl, "created": head.created, "run": head.run},
                      separators=(",", ":"))


def message_at_client(tag: str, content: bytes | memoryview, node_id: int) -> Message:
    """The message a ClientApp receives: the task's content and its tag's metadata.

    Raises ValueError for a tag or content that is not what the server sends."""
    try:
        h = json.loads(tag)
    except ValueError:
        raise ValueError("the task's tag is not a Flower message header") from None
    if not isinstance(h, dict):
        raise ValueError("the task's tag is not a Flower message header")
    want: dict[str, type | tuple[type, ...]] = {
        "id": str, "type": str, "group": str, "ttl": (int, float), "created": (int, float),
        "run": int}
    for key, kind in want.items():
        if not isinstance(h.get(key), kind) or isinstance(h.get(key), bool):
            raise ValueError(f"the Flower message header's {key!r} is missing or malformed")
    if not (math.isfinite(h["ttl"]) and h["ttl"] > 0):
        raise ValueError("the Flower message header's 'ttl' must be a positive number")
    records = content_of(content)
    metadata = Metadata(run_id=h["run"], message_id=h["id"], src_node_id=SERVER_NODE_ID,
                        dst_node_id=node_id, reply_to_message_id="", group_id=h["group"],
                        created_at=float(h["created"]), ttl=float(h["ttl"]),
                        message_type=h["type"])
    return make_message(metadata=metadata, content=records)
