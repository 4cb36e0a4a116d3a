"""fedsim's message schema, version 5: the value types and messages, one class per kind.

This module says *what* travels; :mod:`fedsim.wire.codec` says *how* (frames,
envelope, size caps). Import each name from the module that defines it: the
error type in :mod:`fedsim.wire.errors`, the model types in
:mod:`fedsim.wire.tensors`, the field checker in :mod:`fedsim.wire.records`.
None of them imports torch: client-host processes do not load it.

Rules
-----
1. One schema, versioned by :data:`SCHEMA_VERSION`. A message is a record
   (:class:`~fedsim.wire.records.Record`: frozen, slotted, keyword-only,
   every field checked when it is built, on the sending side and in
   :func:`fedsim.wire.codec.decode` alike, so a message that exists is
   well-typed). Dispatch on its class (``match msg: case Update(): ...``);
   :data:`KINDS` maps kind names (the class names) to classes and
   :data:`Message` is their union.
2. Field types are few and checked by annotation (:mod:`fedsim.wire.records`
   lists them). A bad value raises ``WireError("bad_field")`` naming the
   field and the value: ``Update.steps must be an int, got str 'lots'``.
3. Nothing is pickled. In the msgpack header a message or value type is an
   array of its field values in declaration order (no names: the schema
   version pins the layout); a tuple is an array; a
   :class:`~fedsim.wire.tensors.TensorSpec` is an array of
   ``[dtype name, [dims]]`` pairs; a Model field holds the model's spec
   there, its bytes follow as frames (see :mod:`fedsim.wire.codec`).
4. Errors carry a stable :data:`~fedsim.wire.errors.Reason` code: log it,
   count it, go on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeVar, get_args

from fedsim.wire.errors import describe
from fedsim.wire.records import VALUE_TYPES, AnyFloat, Bad, Record, non_negative, register
from fedsim.wire.tensors import Model, TensorSpec, flat_model, to_tensor

#: What follows a worker's piece of work (:attr:`Trained.next`): its values.
NextValue = Literal["done", "more", "wait"]
_NEXT_VALUES: tuple[str, ...] = get_args(NextValue)

if TYPE_CHECKING:
    import torch

    Next = NextValue
else:
    # On the wire a str, which Trained._validate keeps to NextValue's values:
    # fedsim.wire.records checks fields by annotation and has no Literal kind.
    Next = str

__all__ = [
    "EVENT_KINDS",
    "FAILURE_CAUSES",
    "HOST_EVENT_KINDS",
    "HOST_PHASES",
    "KINDS",
    "MAX_PHASE_VALUES",
    "SCHEMA_VERSION",
    "Advance",
    "Average",
    "ClockProbe",
    "ClockReply",
    "Evaluate",
    "Evaluated",
    "Event",
    "EventBatch",
    "Failed",
    "HostBye",
    "HostHello",
    "Leave",
    "LocalWork",
    "Message",
    "PhaseSample",
    "Ready",
    "Refused",
    "Shutdown",
    "Start",
    "Stop",
    "Task",
    "Trained",
    "Update",
    "WorkerFailed",
    "WorkerReady",
    "worker_answer",
]

SCHEMA_VERSION = 5
"""Version written in every envelope; :func:`fedsim.wire.codec.decode` rejects any other."""

_R = TypeVar("_R", bound=type[Record])

KINDS: dict[str, type[Any]] = {}
"""Kind name (class name) -> message class, for dispatch in :func:`fedsim.wire.codec.decode`."""


def _value(cls: _R) -> _R:
    return register(cls, VALUE_TYPES, message=False)


def _message(cls: _R) -> _R:
    return register(cls, KINDS, message=True)


# ---------------------------------------------------------------------------
# Value types

EVENT_KINDS: tuple[str, ...] = (
    "send",
    "deliver",
    "drop",
    "reject",
    "train_start",
    "train_end",
    "train_error",
    "away",
    "back",
    "aggregate",
    "discard",
    "evaluate",
    "correction",
    "barrier_wait",
    "barrier_resume",
    "client_failed",
    "host_lost",
    "host_joined",
    "host_rejected",
    "start",
    "checkpoint",
    "resume",
    "missing",
    "end",
    "warning",
)
"""Every ``Event.ev`` value."""

#: The ``Event.ev`` values a client host may report (the rest are the server's).
HOST_EVENT_KINDS: frozenset[str] = frozenset({
    "send", "deliver", "drop", "reject", "train_start", "train_end", "train_error", "away",
    "back", "correction", "barrier_wait", "barrier_resume", "warning"})

_EVENT_KIND_SET = frozenset(EVENT_KINDS)


@_value
@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class LocalWork(Record):
    """A task's local budget: ``steps`` or ``epochs``, or neither (the scenario's default)."""

    steps: int | None = None
    epochs: float | None = None

    def _validate(self) -> None:
        if self.steps is not None and self.epochs is not None:
            raise Bad(": set steps or epochs, not both")
        if self.steps is not None and self.steps < 1:
            raise Bad(f" must be >= 1, got {self.steps}", ".steps")
        if self.epochs is not None and not self.epochs > 0:
            raise Bad(f" must be > 0, got {self.epochs}", ".epochs")


def _dict() -> dict[str, Any]:
    return {}


@_value
@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class Event(Record):
    """One record of the run's event log (a line of events.jsonl; see :meth:`to_json_dict`)."""

    t: float
    real: float
    ev: str
    client: int | None = None
    host: str | None = None
    kind: str | None = None
    dir: str | None = None
    bytes: int | None = None
    sent_at: float | None = None
    scheduled: float | None = None
    version: int | None = None
    base_version: int | None = None
    task_id: int | None = None
    round: int | None = None
    steps: int | None = None
    staleness: int | None = None
    reason: str | None = None
    extra: dict[str, Any] = field(default_factory=_dict)

    def _validate(self) -> None:
        if self.ev not in _EVENT_KIND_SET:
            raise Bad(f" must be one of EVENT_KINDS, got {describe(self.ev)}", ".ev")
        if self.extra:
            shadowed = [k for k in self.extra if k in _EVENT_NAMES]
            if shadowed:
                raise Bad(f": keys {shadowed} shadow Event fields; set those", ".extra")

    @classmethod
    def of(cls, t: float, real: float, ev: str, **fields: Any) -> Event:
        """An event from keyword fields: the typed ones in their slots, the rest in ``extra``.

        Fields set to None are left out.
        """
        typed = {k: v for k, v in fields.items() if k in _EVENT_NAMES and v is not None}
        extra = {k: v for k, v in fields.items() if k not in _EVENT_NAMES and v is not None}
        return cls(t=t, real=real, ev=ev, extra=extra, **typed)

    def to_json_dict(self) -> dict[str, Any]:
        """The events.jsonl line: ``t``, ``real``, ``ev``, the optional fields
        that are not None (in declaration order), then ``extra``'s items."""
        out: dict[str, Any] = {"t": self.t, "real": self.real, "ev": self.ev}
        for name in _EVENT_OPTIONAL:
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        out.update(self.extra)
        return out


_EVENT_NAMES = frozenset(Event.FIELDS)
_EVENT_OPTIONAL = Event.FIELDS[3:-1]

#: The phases a client host measures and reports (``PhaseSample.phase``): the
#: names of their distributions in the summary's ``phases``
#: (:data:`fedsim.results.phases.PHASES`, docs/run-directory.md "Where time goes").
HOST_PHASES: frozenset[str] = frozenset({
    "encode.hosts", "decode.hosts", "queueing.hosts", "compute.real", "compute.budget"})

#: Most values one PhaseSample may carry.
MAX_PHASE_VALUES = 65536


@_value
@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class PhaseSample(Record):
    """A client host's durations of one phase since its previous event batch (seconds).

    ``count`` durations summing to ``sum``, the largest ``max``; ``values`` is
    a uniform sample of them (all of them when there were few): what a
    :class:`fedsim.results.phases.Durations` exports.
    """

    phase: str
    count: int
    sum: float
    max: float
    values: tuple[float, ...]

    def _validate(self) -> None:
        if self.phase not in HOST_PHASES:
            raise Bad(f" must be one of {sorted(HOST_PHASES)}, got {describe(self.phase)}",
                       ".phase")
        if not 1 <= len(self.values) <= min(self.count, MAX_PHASE_VALUES):
            raise Bad(f": {len(self.values)} values for a count of {self.count} (1 to "
                       f"min(count, {MAX_PHASE_VALUES}) values)", ".values")
        if self.sum < 0 or self.max < 0 or any(not 0 <= v <= self.max for v in self.values):
            raise Bad(": durations must be >= 0 and at most max")


# ---------------------------------------------------------------------------
# Client <-> server, through the emulated network. Each carries the client id:
# a client host speaks for many clients over one connection.


@_message
@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class Task(Record):
    """A client's task, from the algorithm that makes it to the trainer that runs it.

    The server's algorithm builds it (:class:`fedsim.algorithms.api.Step`'s
    ``tasks``) with ``model``, the payload of ``version`` (every task of a
    version trains from the same payload); it then travels unchanged, only
    its envelope restamped per hop: server -> client host (``sent_at``: the
    emulated send time) -> trainer (``sent_at``: when the result is due,
    ``seq``: the request id). On a hop, ``model`` is None when the receiver
    already holds that version's payload (each version crosses to a host,
    and from it to a trainer, once): the receiver puts its copy back
    (:meth:`with_model`) as it decodes the task. The emulated links are
    charged for the full task (:func:`fedsim.wire.codec.model_cost`).
    ``tag`` is the algorithm's own words about this one task, beside the
    payload its version shares (a Flower message's metadata:
    :mod:`fedsim.flower.content`); empty for fedsim's own algorithms.
    """

    client: int
    task_id: int
    version: int
    round: int
    work: LocalWork | None
    model: Model | None
    tag: str = ""

    def _validate(self) -> None:
        non_negative(self, "client", "task_id", "version", "round")

    @property
    def params(self) -> torch.Tensor:
        """The payload as a flat tensor (a read-only view of ``model``)."""
        if self.model is None:
            raise ValueError(f"task {self.task_id} carries no model (its receiver holds it)")
        return to_tensor(self.model)

    def with_model(self, model: Model | None) -> Task:
        """This task with ``model`` in place of its own (None: without it, for a hop)."""
        return replace(self, model=model)


@_message
@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class Update(Record):
    """A client's upload, from the trainer that makes it to the algorithm that applies it.

    The trainer builds it once from its client algorithm's
    :class:`~fedsim.algorithms.api.Outcome` (pipeline rounds: base_version =
    round); the client host forwards its frames with a new envelope (the
    emulated send time), and the server hands the same record to its
    algorithm with the fields it decides by its own record put in place:
    the base version (and, for a task answered by one upload, the round) of
    the task ``task_id`` it sent, the client's partition size as its weight.
    What the client claims for ``base_version`` and ``num_samples`` is
    checked for type and range, never trusted. Inside an algorithm, an
    update whose model is derived (a delta, a clipped model) is
    ``upload.with_params(t)``; tests build one with :meth:`of`.
    """

    client: int
    task_id: int
    base_version: int
    round: int
    num_samples: int
    steps: int
    loss: AnyFloat | None
    model: Model

    def _validate(self) -> None:
        non_negative(self, "client", "task_id", "base_version", "round", "steps")
        if self.num_samples < 1:
            raise Bad(f" must be >= 1, got {self.num_samples}", ".num_samples")

    @property
    def params(self) -> torch.Tensor:
        """The upload as a flat tensor (a read-only view of ``model``)."""
        return to_tensor(self.model)

    def with_params(self, params: torch.Tensor, **fields: Any) -> Update:
        """This update carrying ``params`` (a flat tensor of any wire dtype) instead,
        and ``fields`` changed."""
        return replace(self, model=flat_model(params), **fields)

    @classmethod
    def of(cls, *, client: int, base_version: int, params: torch.Tensor, num_samples: int = 1,
           steps: int = 0, task_id: int = 0, round: int = 0,
           loss: float | None = None) -> Update:
        """An update carrying the flat tensor ``params`` (``task_id`` 0: it answers
        no task in particular, as task ids start at 1)."""
        return cls(client=client, task_id=task_id, base_version=base_version, round=round,
                   num_samples=num_samples, steps=steps, loss=loss, model=flat_model(params))


@_message
@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class Average(Record):
    """Server -> client, after a DGA round: that round's average (one message per client).

    As a task's model, a round's average crosses to a host once: ``model`` is
    None when the host already holds that round's (:mod:`fedsim.wire.payloads`).
    """

    client: int
    round: int
    version: int
    model: Model | None

    def _validate(self) -> None:
        non_negative(self, "client", "round", "version")

    def with_model(self, model: Model | None) -> Average:
        """This average with ``model`` in place of its own (None: without it)."""
        return replace(self, model=model)


@_message
@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class Ready(Record):
    """Client -> server, back from away (``reset``: its connection was reset, its task is gone)."""

    client: int
    reset: bool

    def _validate(self) -> None:
        non_negative(self, "client")


#: Why a client's local run failed, as results count it (``summary.json``'s
#: ``lost_work``): ``overflow``, a step beyond the range of the parameters'
#: dtype; ``non_finite``, a trained model holding NaN or an infinity;
#: ``error``, any other exception in training; ``host_lost``, its client host
#: was lost (the server's own record, never sent).
FAILURE_CAUSES: tuple[str, ...] = ("overflow", "non_finite", "error", "host_lost")


def _check_cause(rec: Any) -> None:
    if rec.cause not in FAILURE_CAUSES[:3]:
        raise Bad(f" must be one of {', '.join(FAILURE_CAUSES[:3])}, got {rec.cause!r}",
                   ".cause")


@_message
@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class Failed(Record):
    """Client -> server, when its training failed for good; the server drops it.

    ``cause`` counts it (:data:`FAILURE_CAUSES`), ``reason`` says it in words.
    """

    client: int
    cause: str
    reason: str

    def _validate(self) -> None:
        non_negative(self, "client")
        _check_cause(self)


@_message
@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class Leave(Record):
    """Client -> server, on an orderly departure."""

    client: int
    reason: str

    def _validate(self) -> None:
        non_negative(self, "client")


# ---------------------------------------------------------------------------
# Client host <-> server control path (not emulated)


@_message
@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class HostHello(Record):
    """Host -> server, once its data and workers are ready: who it is and which clients it runs."""

    host: str
    pid: int
    clients: tuple[int, ...]
    samples: tuple[int, ...]
    boot_id: str
    fedsim_version: str
    scenario_hash: str
    #: the host's estimate of (server monotonic - host monotonic), in real
    #: seconds, from the minimum-RTT ClockProbe exchange, and its uncertainty
    #: (half that round trip)
    clock_offset: float = 0.0
    clock_uncertainty: float = 0.0

    def _validate(self) -> None:
        if not (math.isfinite(self.clock_offset) and math.isfinite(self.clock_uncertainty)
                and self.clock_uncertainty >= 0):
            raise Bad(": clock offset and uncertainty must be finite (uncertainty >= 0)")
        if len(self.samples) != len(self.clients):
            raise Bad(f": {len(self.clients)} clients but {len(self.samples)} samples")


@_message
@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class Start(Record):
    """Server -> host, when the federation begins: clock epoch (server monotonic), dilation,
    the model's tensor spec, and how many model copies a Task carries."""

    epoch: float
    dilation: float
    spec: TensorSpec
    task_copies: int = 1
    #: the real seconds one local step takes on the server's machine, when the
    #: scenario's device model scales it (measured there, once, for every host)
    host_step_time: float | None = None
    #: the server process's incarnation (random, new at every start or resume):
    #: a ClockReply with another one tells a host the server restarted
    server: str = ""
    #: the emulated time the host's clients start at: 0, a resumed run's
    #: checkpoint time, or the server's time when a host joins a running federation
    t0: float = 0.0
    #: 0: a task's and an update's model are copies of ``spec``; N > 0: each is one
    #: uint8 buffer of at most N bytes (a Flower message: :mod:`fedsim.flower`)
    payload_bytes: int = 0

    def _validate(self) -> None:
        non_negative(self, "payload_bytes")


@_message
@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class Refused(Record):
    """Server -> host, instead of Start: it may not join (version or scenario mismatch, ...)."""

    reason: str


@_message
@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class EventBatch(Record):
    """Host -> server, periodically: event-log records, and the host's phase
    durations since its previous batch (see :class:`PhaseSample`)."""

    host: str
    events: tuple[Event, ...]
    phases: tuple[PhaseSample, ...] = ()


@_message
@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class Stop(Record):
    """Server -> host, when the run ends: stop the clients and say HostBye."""

    reason: str


@_message
@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class HostBye(Record):
    """Host -> server, after Stop: its own measurements (fidelity: FidelityMonitor.export())."""

    host: str
    overruns: int
    compute_deadlines: int
    rejected: int
    fidelity: dict[str, Any]
    #: the clock offset re-estimated during the run (real seconds); its
    #: spread from the first estimate is drift the verdict must account for
    clock_offsets: tuple[float, ...] = ()


@_message
@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class ClockProbe(Record):
    """Host -> server, before Start: an NTP-style probe sent at host monotonic ``t_sent``."""

    seq: int
    t_sent: float


@_message
@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class ClockReply(Record):
    """Server -> host, on a ClockProbe: the probe echoed with the server's monotonic time,
    and the server's incarnation (see :class:`Start`)."""

    seq: int
    t_sent: float
    t_server: float
    server: str = ""


# ---------------------------------------------------------------------------
# Host or server <-> torch worker process (private socket, not emulated).
# Every request carries a request_id and its reply echoes it.


@_message
@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class WorkerReady(Record):
    """Worker -> parent, once built: samples per client (in the parent's order) and the spec."""

    samples: tuple[int, ...]
    spec: TensorSpec


@_message
@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class Advance(Record):
    """Parent -> worker, on DGA averages: continue the pipeline with the averages of
    ``rounds`` and of ``held``.

    ``model`` holds the averages of ``rounds``, one spec copy per round, back to
    back (``spec.repeated(len(rounds))``), or is None when ``rounds`` is empty;
    ``held`` names rounds whose average an earlier Advance to this worker
    carried (:mod:`fedsim.wire.payloads`: each round's average crosses to a
    trainer once, whichever of its clients needs it first).
    """

    MODEL_COPIES_FIELD: ClassVar[str | None] = "rounds"

    request_id: int
    client: int
    rounds: tuple[int, ...]
    model: Model | None
    due: float | None = None   # as a task's: when the result is due (None: now)
    held: tuple[int, ...] = ()

    def _validate(self) -> None:
        if (self.model is None) != (not self.rounds):
            raise Bad(
                ": model must be None exactly when rounds is empty"
                f" ({len(self.rounds)} rounds, model {'None' if self.model is None else 'set'})"
            )
        if set(self.rounds) & set(self.held):
            raise Bad(f": rounds {sorted(set(self.rounds) & set(self.held))} both carried "
                      "and held")


@_message
@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class Trained(Record):
    """Worker -> parent, on a Task or an Advance: how the piece of work went.

    ``next`` is "done", "more" or "wait" (see
    :class:`~fedsim.algorithms.api.Outcome`). When the piece uploads, the
    worker sends the :class:`Update` first, its envelope's ``seq`` the
    request id, and ``upload`` says so.
    """

    request_id: int
    client: int
    steps: int
    loss: AnyFloat | None
    compute_s: float
    upload: bool
    next: Next
    wait_round: int | None
    notes: dict[str, Any]
    #: the piece's real CPU seconds, for an algorithm charged by CPU time (a Flower
    #: app's ``compute = "cpu"``); None: charged by ``steps``
    cpu_s: float | None = None

    def _validate(self) -> None:
        if self.next not in _NEXT_VALUES:
            raise Bad(f" must be 'done', 'more' or 'wait', got {describe(self.next)}", ".next")


@_message
@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class Evaluate(Record):
    """Parent (server) -> worker, to evaluate a global model on the test set."""

    request_id: int
    version: int
    model: Model


@_message
@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class Evaluated(Record):
    """Worker -> parent, on Evaluate: test loss (may be NaN/inf: AnyFloat), accuracy, time taken."""

    request_id: int
    version: int
    loss: AnyFloat
    accuracy: float
    seconds: float


@_message
@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class WorkerFailed(Record):
    """Worker -> parent, instead of the reply to request ``request_id``: why it failed
    (``cause``: :data:`FAILURE_CAUSES`)."""

    request_id: int
    cause: str
    reason: str

    def _validate(self) -> None:
        _check_cause(self)


_A = TypeVar("_A", Trained, Evaluated)


def worker_answer(reply: Message, request_id: int, expected: type[_A]) -> _A | WorkerFailed:
    """A worker's ``reply`` to request ``request_id`` as the request's kind of answer
    (``expected``: :class:`Trained` or :class:`Evaluated`) or
    :class:`WorkerFailed`: any other message in its place becomes the request's
    failure, named."""
    if isinstance(reply, (expected, WorkerFailed)):
        return reply
    return WorkerFailed(request_id=request_id, cause="error",
                        reason=f"the worker answered with {type(reply).__name__}, "
                               f"not {expected.__name__}")


@_message
@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class Shutdown(Record):
    """Parent -> worker, at the end: exit."""


Message = (
    Task
    | Update
    | Average
    | Ready
    | Failed
    | Leave
    | HostHello
    | Start
    | Refused
    | EventBatch
    | Stop
    | HostBye
    | ClockProbe
    | ClockReply
    | WorkerReady
    | Advance
    | Trained
    | Evaluate
    | Evaluated
    | WorkerFailed
    | Shutdown
)
"""Any message of this schema; ``match`` on the class to dispatch."""
