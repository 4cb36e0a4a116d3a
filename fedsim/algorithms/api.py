"""The protocol between an algorithm and the actors that run it.

Rules
-----
1. An algorithm is one home: a module (or a small package) under
   :mod:`fedsim.algorithms` holding its scenario config, its server side
   and its client side, and one :class:`AlgorithmSpec` that joins them. The
   actors in :mod:`fedsim.actors` only call the two small interfaces below;
   they never name an algorithm.
2. Both sides are sans-I/O. The server side (:class:`ServerAlgorithm`)
   answers events (start, an update, a client back or lost, a timer) with a
   :class:`Step` of *decisions*: whom to dispatch a task to, what to
   broadcast, what was applied or discarded. A task
   (:class:`~fedsim.wire.messages.Task`) and an update
   (:class:`~fedsim.wire.messages.Update`) are the wire's own records: the
   task the server side puts in its step is the one the client side
   begins, and the update the trainer builds is the one the server side
   applies; only their envelopes change on the way. The client side
   (:class:`ClientAlgorithm`) runs in a torch worker and answers "begin this
   task" (and, for pipelined algorithms such as DGA, "advance with these
   averages") with an :class:`Outcome`: steps taken, what to upload, and
   whether the client is done, has more to do, or must wait for a round's
   average. Time is passed in as emulated seconds.
3. A model travels as one flat float32 vector (``task.params``,
   ``upload.params`` are its tensor views). An algorithm whose task or
   upload carries several model-sized vectors (SCAFFOLD: the model and a
   control variate) says so with ``task_copies`` / ``update_copies``. Every
   task of one version carries the same payload: on the real wire each
   version crosses to a host, and to a trainer, once.
4. A new algorithm, inside or outside this package, is one call to
   :func:`register`; the scenario loader then accepts its name under
   ``[algorithm]`` and validates its table with the spec's config class.
   A plug-in needs no call at all: ``algorithm.name = "module:attribute"``
   names its spec, which the loader finds (:mod:`fedsim.scenario.plugins`)
   and keeps with the table it validated (:attr:`AlgorithmConfig.spec`);
   reading a scenario never changes the registry.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Literal, Self

from pydantic import PrivateAttr

# typing's TypeVar takes a default from Python 3.13 (pyproject.toml requires typing_extensions)
from typing_extensions import TypeVar

from fedsim.algorithms.local import LocalConfig
from fedsim.schema import SchemaModel
from fedsim.wire.messages import LocalWork, Task, Update
from fedsim.wire.tensors import TensorSpec, to_model

if TYPE_CHECKING:
    import torch
    from torch import nn

__all__ = [
    "AlgorithmConfig",
    "AlgorithmSpec",
    "Applied",
    "Broadcast",
    "ClientAlgorithm",
    "ClientContext",
    "Discarded",
    "Guarded",
    "Outcome",
    "ServerAlgorithm",
    "ServerContext",
    "Step",
    "TaskMaker",
    "Waker",
    "algorithm_names",
    "get",
    "register",
    "register_elsewhere",
]

Number = float | int | bool | None


# -- scenario config ---------------------------------------------------------------


class AlgorithmConfig(SchemaModel):
    """Base of every ``[algorithm]`` table: ``name`` picks the registered spec."""

    name: str
    #: the spec the scenario loader validated this table with (a plug-in's)
    _spec: AlgorithmSpec[Any] | None = PrivateAttr(default=None)

    @property
    def spec(self) -> AlgorithmSpec[Any]:
        """The algorithm this table configures: the spec the scenario loader
        validated it with (a plug-in's, found from its reference), else the one
        registered under ``name``."""
        return self._spec if self._spec is not None else get(self.name)

    def with_spec(self, spec: AlgorithmSpec[Any]) -> Self:
        """This table, tied to ``spec`` (the loader's, for a plug-in)."""
        self._spec = spec
        return self

    def prox_mu(self) -> float:
        """Weight of the proximal term ``mu/2 ||y - x||^2`` in local training (0: none)."""
        return 0.0

    def tasks_at_once(self, num_clients: int) -> int:
        """How many clients train at the same time (sizes ``--dilation auto``)."""
        return num_clients

    def sent_at_once(self, num_clients: int) -> int:
        """How many model messages the server sends at one emulated instant (sizes
        ``--dilation auto``'s round burst): one task per update it applies."""
        return 1

    def local_work(self) -> str | None:
        """What sets a task's local work, when ``[client]`` ``local_steps`` and
        ``local_epochs`` do not (None: they do). ``fedsim check`` prints it."""
        return None

    def resumable(self) -> str | None:
        """None when a checkpoint of this algorithm's server can be resumed; else why not
        (the run then takes no checkpoints and ``fedsim run --resume`` refuses it)."""
        return None

    def state_key(self) -> str:
        """What a client host's saved state belongs to (``fedsim clients --state``):
        a file of another key is not restored. The algorithm's name, by default."""
        return self.name

    def client_table(self) -> str | None:
        """Why no ``[client]`` key is read, when the algorithm's clients train with
        their own code (a Flower app's); None: ``[client]`` configures them."""
        return None

    def modules(self) -> dict[str, str]:
        """The ``module:attribute`` references the run imports (a Flower app's), by
        their key: the scenario loader finds each without importing it, next
        to the scenario file if need be, so that every process of the run can."""
        return {}


#: An algorithm's config class (its spec's builders take its validated table); a bare
#: ``AlgorithmSpec`` is one of any config (the registry holds every algorithm's).
ConfigT = TypeVar("ConfigT", bound=AlgorithmConfig, default=Any)


# -- values exchanged with the actors -----------------------------------------------


@dataclass(frozen=True, slots=True)
class Broadcast:
    """A round's result sent to a set of clients (DGA's average)."""

    round: int
    payload: torch.Tensor
    clients: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Applied:
    """One change of the global model, for the log and the counters.

    ``updates`` client updates went into it; ``staleness`` holds one value
    per update for asynchronous rules (what really happened), and is empty
    for rounds. ``metrics`` are the rule's own numbers (alpha_t, eta_g, ...).
    """

    version: int
    clients: tuple[int, ...]
    staleness: tuple[int, ...] = ()
    round: int | None = None
    base_version: int | None = None
    metrics: Mapping[str, Number] = field(default_factory=dict)

    @property
    def updates(self) -> int:
        """Client updates applied."""
        return len(self.clients)


@dataclass(frozen=True, slots=True)
class Discarded:
    """A client's update that was not applied, and why."""

    client: int
    reason: str
    staleness: int | None = None


@dataclass(frozen=True, slots=True)
class Guarded:
    """An update the update guard bounded: ``"rejected"`` or ``"clipped"`` onto its bound."""

    client: int
    action: Literal["rejected", "clipped"]
    norm: float
    bound: float


@dataclass(slots=True)
class Step:
    """The decisions one event leads to.

    ``tasks`` are sent in order, each to its client. ``guarded`` lists the
    updates the update guard rejected (each is also in ``discarded``, with
    its reason) or clipped (applied, clipped).
    """

    tasks: list[Task] = field(default_factory=list)
    broadcasts: list[Broadcast] = field(default_factory=list)
    applied: list[Applied] = field(default_factory=list)
    discarded: list[Discarded] = field(default_factory=list)
    rounds_closed: int = 0
    guarded: list[Guarded] = field(default_factory=list)
    #: the algorithm ends the run, for this reason (a Flower ServerApp returned)
    stop: str | None = None

    def then(self, other: Step) -> Step:
        """This step followed by ``other`` (in place; returns self)."""
        self.tasks.extend(other.tasks)
        self.broadcasts.extend(other.broadcasts)
        self.applied.extend(other.applied)
        self.discarded.extend(other.discarded)
        self.rounds_closed += other.rounds_closed
        self.guarded.extend(other.guarded)
        self.stop = self.stop or other.stop
        return self


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a piece of local work produced.

    ``next`` is ``"done"`` (the task is finished), ``"more"`` (a pipelined
    client keeps stepping: call :meth:`ClientAlgorithm.advance` again) or
    ``"wait"`` (do not advance before the average of ``wait_round`` has
    arrived). ``upload`` is sent as the update of ``upload_round`` (the
    task's round when None). ``notes`` are numbers for the log. ``cpu_s``:
    the real CPU seconds the work took, for an algorithm whose compute is
    charged by CPU time (a Flower app's), in place of ``steps`` x the
    device's step time.
    """

    steps: int
    loss: float | None = None
    upload: torch.Tensor | None = None
    upload_round: int | None = None
    next: Literal["done", "more", "wait"] = "done"
    wait_round: int | None = None
    notes: Mapping[str, Any] = field(default_factory=dict)
    cpu_s: float | None = None


class TaskMaker:
    """Builds a server side's tasks: fresh task ids, one wire model per version.

    ``next_id`` is the next task's id (from 1; the server's checkpoint keeps
    it, and reading it takes nothing); the payload of a version is wrapped
    once (a view, not a copy, of a contiguous float32 tensor) in ``spec``,
    the task's wire layout, and every task of that version shares it.
    """

    __slots__ = ("_last", "next_id", "spec")

    def __init__(self, spec: TensorSpec | None = None, next_id: int = 1) -> None:
        self.spec = spec
        self.next_id = next_id
        self._last: tuple[int, torch.Tensor, Any] | None = None

    def __call__(self, client: int, version: int, round: int,
                 payload: torch.Tensor, work: LocalWork | None = None) -> Task:
        """The task of ``client`` training from ``payload``, the payload of ``version``."""
        last = self._last
        if last is None or last[0] != version or last[1] is not payload:
            spec = self.spec
            if spec is None or spec.nbytes != payload.numel() * 4:
                spec = TensorSpec([("float32", (payload.numel(),))])
            last = self._last = (version, payload, to_model(payload, spec))
        task_id, self.next_id = self.next_id, self.next_id + 1
        return Task(client=client, task_id=task_id, version=version, round=round,
                    work=work, model=last[2])


class Waker:
    """A thread-safe "look at me": how a server side that works beside another
    thread (the relay of a Flower ServerApp's process) asks the server's loop to call its
    :meth:`ServerAlgorithm.timer` soon. The server binds it once its loop runs;
    before that a call does nothing."""

    __slots__ = ("_target",)

    def __init__(self) -> None:
        self._target: Callable[[], None] | None = None

    def bind(self, target: Callable[[], None] | None) -> None:
        """Call ``target`` (thread-safe itself) from now on (None: nothing)."""
        self._target = target

    def __call__(self) -> None:
        target = self._target
        if target is not None:
            target()


@dataclass(frozen=True, slots=True)
class ServerContext:
    """What a server side is built from.

    ``tasks`` makes its tasks (the server passes one that numbers them with
    its own counter and wraps payloads in the task's wire spec); ``wake``
    asks, from any thread, for a :meth:`ServerAlgorithm.timer` call soon.
    """

    x0: torch.Tensor
    num_clients: int
    seed: int
    local: LocalConfig
    tasks: TaskMaker = field(default_factory=TaskMaker)
    wake: Waker = field(default_factory=Waker)
    #: the run's resolved Scenario (what a Flower app's helpers read), if any; opaque
    #: here (fedsim.scenario imports this module, so naming its class is a cycle):
    #: fedsim.flower, which reads it, narrows it with an isinstance check
    scenario: object = None


@dataclass(frozen=True, slots=True)
class ClientContext:
    """What a client side is built from (in a torch worker)."""

    model: nn.Module
    local: LocalConfig
    seed: int
    num_clients: int = 0
    #: the run's resolved Scenario (what a Flower app's helpers read), if any; opaque
    #: here (fedsim.scenario imports this module, so naming its class is a cycle):
    #: fedsim.flower, which reads it, narrows it with an isinstance check
    scenario: object = None


# -- the two interfaces ----------------------------------------------------------------


class ServerAlgorithm(ABC):
    """The server side: global state, scheduling decisions, aggregation.

    ``cadence`` says what the run's progress is counted in: ``"updates"``
    (asynchronous rules) or ``"rounds"``. ``one_upload`` says whether a task
    is answered by one upload at its end (the server then takes the
    upload's round from the task it sent), or, for a pipelined session, by
    one upload per round of the client's own numbering.
    """

    cadence: ClassVar[Literal["updates", "rounds"]]
    one_upload: ClassVar[bool] = True
    version: int
    round: int

    def least_steps(self, task_steps: int, upload_round: int) -> int:
        """The fewest local steps a client takes from the start of a task until it
        sends the upload of ``upload_round``.

        ``task_steps`` are the steps of the task's local work (its budget on
        the client's sample count). The server bounds an update's emulated
        send time by the device's least compute time for them. Default: the
        whole task (one upload, at its end).
        """
        return task_steps

    @abstractmethod
    def model(self) -> torch.Tensor:
        """The global model to evaluate (flat float32)."""

    @abstractmethod
    def start(self, clients: Sequence[int], now: float) -> Step:
        """The federation begins with these registered clients."""

    @abstractmethod
    def rejoin(self, client: int, now: float, reset: bool) -> Step:
        """``client`` is available again after being away; a task it held is abandoned."""

    @abstractmethod
    def lost(self, client: int, now: float) -> Step:
        """``client`` is gone for good (left, failed, unreachable, its host died)."""

    @abstractmethod
    def update(self, upload: Update, now: float) -> Step:
        """An update arrived (``upload.params`` has ``update_copies`` model sizes).

        Its ``base_version``, ``num_samples`` and (for a task answered by one
        upload) ``round`` are the server's record of the task, not the client's claim."""

    @abstractmethod
    def timer(self, now: float) -> Step:
        """The time asked for by :meth:`next_timer` has come."""

    @abstractmethod
    def next_timer(self) -> float | None:
        """Emulated time at which :meth:`timer` must be called, if any."""

    @abstractmethod
    def in_flight(self) -> int:
        """Clients currently working on a task."""

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """The server side's state, for a checkpoint: a snapshot (later steps do
        not change it) of tensors, arrays, bytes, numbers, strings, None, and
        lists, tuples and dicts of them (keys: numbers, strings, tuples), which
        :mod:`fedsim.wire.statefile` stores without pickling; anything else fails the
        first checkpoint, named. Tensors that share storage come back as
        copies; fedsim's algorithms keep theirs with
        :func:`fedsim.algorithms.pack_tensor` (and read them back with
        :func:`fedsim.algorithms.unpack_tensor`)."""

    @abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""

    def waiting(self) -> bool:
        """Whether tasks are still to come from elsewhere (a Flower ServerApp's process,
        which has not pushed yet): a start without tasks is then no failure."""
        return False

    def close(self) -> None:  # noqa: B027 - a hook with nothing to do by default
        """The run is over (however it ended): release what the server side holds
        (a Flower ServerApp's process). Default: nothing."""


class ClientAlgorithm(ABC):
    """The client side, in a torch worker: one object serves many clients.

    Per-client state that persists between tasks (FedSpeed's ``g_hat``,
    SCAFFOLD's ``c_i``, DGA's running client) lives here, keyed by client id,
    and is saved by :meth:`state_dict`.
    """

    @abstractmethod
    def begin(
        self, task: Task, x: torch.Tensor, y: torch.Tensor, gen: torch.Generator
    ) -> Outcome:
        """Start (and, for most algorithms, finish) a task's local work
        (``task.params``: its payload; ``task.work``: its own budget, if any)."""

    def advance(
        self,
        client: int,
        averages: Sequence[tuple[int, torch.Tensor]],
        x: torch.Tensor,
        y: torch.Tensor,
    ) -> Outcome:
        """Continue a pipelined client with the round averages that arrived."""
        raise NotImplementedError(f"{type(self).__name__} runs each task in one piece")

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """Per-client state, as plain comparable data (the values
        :meth:`ServerAlgorithm.state_dict` may hold: ``fedsim clients --state``
        saves it as a :mod:`fedsim.wire.statefile`)."""

    @abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""


# -- the registry -------------------------------------------------------------------


@dataclass(frozen=True)
class AlgorithmSpec(Generic[ConfigT]):
    """One algorithm as the rest of fedsim sees it (its config class ``ConfigT``).

    Attributes
    ----------
    names
        The ``algorithm.name`` values it answers to (FedAvg and FedProx share one).
    config
        The ``[algorithm]`` table's model (a subclass of :class:`AlgorithmConfig`
        whose ``name`` is a ``Literal`` of ``names``).
    server, client
        Builders of the two sides from the validated config.
    summary
        One line for ``fedsim algorithms`` and the docs.
    task_copies, update_copies
        Model-sized vectors a task / an update carries.
    optimizers
        Client optimizers it can drive (None: every one).
    payload_bytes
        For an algorithm whose tasks and updates are not model copies but
        byte payloads of varying length (a Flower app's messages): the most
        bytes one may have, from the validated config and the scenario
        model's spec (None: model copies).
    """

    names: tuple[str, ...]
    config: type[ConfigT]
    server: Callable[[ConfigT, ServerContext], ServerAlgorithm]
    client: Callable[[ConfigT, ClientContext], ClientAlgorithm]
    summary: str = ""
    task_copies: int = 1
    update_copies: int = 1
    optimizers: tuple[str, ...] | None = None
    payload_bytes: Callable[[ConfigT, TensorSpec], int] | None = None


#: every algorithm's spec, each of its own config class
_REGISTRY: dict[str, AlgorithmSpec[Any]] = {}
#: built-in names whose home lives outside this package, as ``module:attribute``
#: references to their spec, imported on first use (a Flower app's: its server
#: side runs a process and a thread, which this sans-I/O package does not allow)
_ELSEWHERE: dict[str, str] = {}


def register(spec: AlgorithmSpec[ConfigT], *, replace: bool = False) -> AlgorithmSpec[ConfigT]:
    """Make ``spec`` available under each of its names; returns it."""
    if not spec.names:
        raise ValueError("Invalid AlgorithmSpec: no names")
    if not (isinstance(spec.config, type) and issubclass(spec.config, AlgorithmConfig)):
        raise ValueError(f"Invalid config for {spec.names}: {spec.config!r} "
                         "(must subclass fedsim.algorithms.api.AlgorithmConfig)")
    for n in spec.names:
        if n in _REGISTRY and not replace and _REGISTRY[n] is not spec:
            raise ValueError(f"Invalid name {n!r}: already registered (pass replace=True)")
    for n in spec.names:
        _REGISTRY[n] = spec
    return spec


def register_elsewhere(name: str, reference: str) -> None:
    """Make ``name`` a built-in whose spec is ``reference`` (``module:attribute``),
    imported the first time :func:`get` is asked for it (its module does not
    register it: asking for it, as parsing a scenario does, leaves the
    registry as it was)."""
    _ELSEWHERE[name] = reference


def get(name: str) -> AlgorithmSpec[Any]:
    """The spec registered under ``name`` (a plug-in's: ``config.spec``), or the
    built-in one :func:`register_elsewhere` names."""
    if name not in _REGISTRY and name in _ELSEWHERE:
        module, _, attr = _ELSEWHERE[name].partition(":")
        spec = getattr(importlib.import_module(module), attr)
        if not isinstance(spec, AlgorithmSpec):  # pragma: no cover - a built-in's mistake
            raise TypeError(f"{_ELSEWHERE[name]} is not an AlgorithmSpec")
        return spec
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(
            f"unknown algorithm {name!r} (registered: {', '.join(algorithm_names())})"
        ) from None


def algorithm_names() -> tuple[str, ...]:
    """Every registered name, in registration order (then those imported on first use)."""
    return (*_REGISTRY, *(n for n in _ELSEWHERE if n not in _REGISTRY))
