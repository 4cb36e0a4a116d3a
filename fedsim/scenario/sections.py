"""The scenario's own sections: ``[data]``, ``[model]``, ``[client]``, ``[run]``,
``[eval]``, ``[deploy]`` (the network's are in :mod:`fedsim.scenario.netconfig`, the
algorithm's in each algorithm's home).

``data.dataset`` and ``model.name`` are a built-in name or a plug-in
(:mod:`fedsim.scenario.plugins`), whose ``options`` are checked against its signature.
A built-in dataset's ``partition`` is held to :mod:`fedsim.data`'s own rule
(:func:`~fedsim.data.dataset_partitions`) here, so that ``fedsim check`` refuses what
the run would fail on.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from fedsim.algorithms.local import LocalWorkKeys
from fedsim.algorithms.optim import (
    OPTIMIZER_MODELS,
    AdagradKeys,
    AdamKeys,
    DeltaSGDKeys,
    OptimizerConfig,
    OptimizerName,
    SGDMKeys,
    SPSKeys,
    optimizer_config,
)
from fedsim.data import DATASETS, dataset_partitions
from fedsim.scenario import plugins
from fedsim.schema import AtLeastOne, NonNeg, NonNegInt, Pos, Prob, SchemaModel

__all__ = [
    "DATASETS",
    "MODELS",
    "ClientConfig",
    "DataConfig",
    "DeployConfig",
    "EvalConfig",
    "ModelConfig",
    "RunConfig",
    "optimizer_options",
]

#: Built-in ``model.name`` values (anything else is a plug-in; the built-in datasets
#: are :data:`fedsim.data.DATASETS`).
MODELS = ("mlp", "cnn", "cnn_mnist", "char_lstm")


class DataConfig(SchemaModel):
    """Dataset, partition and number of clients."""

    dataset: str = "synthetic"
    num_clients: Annotated[int, Field(ge=1, le=1_000_000)] = 20
    partition: Literal["natural", "iid", "dirichlet", "shards"] = "natural"
    synthetic_alpha: NonNeg = 1.0
    synthetic_beta: NonNeg = 1.0
    synthetic_iid: bool = False
    #: the synthetic users' sizes: the generator's "lognormal" ones (FedProx), or a
    #: number, every user that many examples before the holdout (a paper that
    #: gives each client the same number of examples, as Delta-SGD's 500)
    synthetic_sizes: Literal["lognormal"] | Annotated[int, Field(ge=10)] = "lognormal"
    max_samples_per_client: AtLeastOne | None = None
    dirichlet_alpha: Pos = 0.5
    dirichlet_recipe: Literal["hsu", "deltasgd_code", "feddyn_sequential"] = "hsu"
    samples_per_client: AtLeastOne | None = None
    classes_per_client: AtLeastOne = 2
    test_fraction: Annotated[float, Field(gt=0, lt=1)] | None = None
    path: str | None = None
    # keyword arguments of a plug-in dataset's loader
    options: dict[str, Any] = {}

    @field_validator("dataset")
    @classmethod
    def _known_dataset(cls, name: str) -> str:
        if name not in DATASETS:
            plugins.dataset(name, DATASETS)
        return name

    @field_validator("options")
    @classmethod
    def _dataset_options(cls, options: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        name = info.data.get("dataset")
        if name in DATASETS and options:
            raise ValueError(f"only a plug-in dataset takes options ({name!r} is built in: "
                             "its keys are those of [data])")
        if name is not None and name not in DATASETS:
            plugins.check_options(f"dataset {name!r}", plugins.dataset(name, DATASETS),
                                  options, fixed=("num_clients", "seed"), positional=0)
        return options

    @model_validator(mode="after")
    def _plugin_keys(self) -> DataConfig:
        if self.dataset not in DATASETS:
            for key in ("path", "test_fraction"):
                if getattr(self, key) is not None:
                    raise ValueError(f"{key} = {getattr(self, key)!r} is for the built-in "
                                     f"datasets; the plug-in {self.dataset!r} takes its own in "
                                     "data.options")
        return self

    @model_validator(mode="after")
    def _built_in_dataset_fits(self) -> DataConfig:
        """A built-in dataset's partition, as an error at its own key.

        The run would fail on it (:func:`fedsim.data.build_federated`): the
        partition must be one the dataset takes (the default, ``natural``, fits
        only ``synthetic`` and ``leaf``: no other dataset has one of its own). A
        plug-in's loader says what it returns only when it runs. (``data.path``
        is checked where a scenario is given to run, not read back:
        :func:`fedsim.scenario.parse`'s ``runs_here``.)
        """
        if self.dataset not in DATASETS:
            return self
        allowed = dataset_partitions(self.dataset)
        if self.partition not in allowed:
            unset = "" if "partition" in self.model_fields_set else "not set, and the default "
            raise _key_error(self, "partition", (
                f"{unset}{self.partition!r} is not a partition of dataset {self.dataset!r} "
                f"(allowed: {', '.join(allowed)})"))
        return self


def _key_error(model: SchemaModel, key: str, text: str) -> ValidationError:
    """A rule of a whole table broken at ``key``, as an error at that key.

    A validator that raises a ``ValidationError`` adds its errors' locations
    to its own (pydantic-core), so :mod:`fedsim.scenario.explain` names the key
    (``data.partition: ...``), as for an error of the key's own type.
    """
    return ValidationError.from_exception_data(type(model).__name__, [InitErrorDetails(
        type=PydanticCustomError("value_error", text), loc=(key,), input=getattr(model, key))])


class ModelConfig(SchemaModel):
    """The torch model every client trains."""

    name: str = "mlp"
    hidden: list[AtLeastOne] = [200]
    lstm_hidden: AtLeastOne = 256
    # keyword arguments of a plug-in model's factory
    options: dict[str, Any] = {}

    @field_validator("name")
    @classmethod
    def _known_model(cls, name: str) -> str:
        if name not in MODELS:
            plugins.model(name, MODELS)
        return name

    @field_validator("options")
    @classmethod
    def _model_options(cls, options: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        name = info.data.get("name")
        if name in MODELS and options:
            raise ValueError(f"only a plug-in model takes options ({name!r} is built in: "
                             "hidden for mlp, lstm_hidden for char_lstm)")
        if name is not None and name not in MODELS:
            plugins.check_options(f"model {name!r}", plugins.model(name, MODELS), options,
                                  fixed=(), positional=2)
        return options


#: The ``[client]`` keys each client optimizer reads (the others are its
#: neighbours' options), from the optimizers' own declarations
#: (:data:`fedsim.algorithms.optim.OPTIMIZER_MODELS`): ``fedsim check`` marks a
#: key the chosen optimizer does not read, and ``tests/test_optimizer_keys.py``
#: checks that changing one changes nothing a local run computes.
OPTIMIZER_KEYS: dict[str, tuple[str, ...]] = {
    name: tuple(k for k in model.model_fields if k != "name")
    for name, model in OPTIMIZER_MODELS.items()
}
#: Every optimizer option among the ``[client]`` keys.
OPTIMIZER_OPTIONS: tuple[str, ...] = tuple(dict.fromkeys(
    k for keys in OPTIMIZER_KEYS.values() for k in keys))


class _Chosen(SchemaModel):
    #: the names the optimizers' own models declare (fedsim.algorithms.optim)
    optimizer: OptimizerName = "sgd"


# the bases in reverse of the order the table lists their keys in (pydantic orders
# fields by the reversed MRO): optimizer, the shared keys, sgdm's, adam's, ... sps's,
# then the local work's
class ClientConfig(LocalWorkKeys, SPSKeys, DeltaSGDKeys, AdagradKeys, AdamKeys, SGDMKeys,
                   _Chosen):
    """Client optimizer and local work per task.

    The table is flat, as a sweep that switches optimizers needs it: it takes
    every optimizer's options from the optimizer's own declaration
    (:mod:`fedsim.algorithms.optim`; each optimizer reads :data:`OPTIMIZER_KEYS`
    of them: a scenario file that sets one the chosen optimizer does not read
    is refused, :func:`fedsim.scenario.file.load`, and ``fedsim check`` marks
    the rest), and :meth:`optimizer_config` builds the chosen one. The local
    work's keys, defaults and checks are :class:`~fedsim.algorithms.local.LocalWorkKeys`'."""

    def optimizer_config(self) -> OptimizerConfig:
        """The chosen optimizer with this table's values of its keys."""
        return optimizer_config(self.optimizer,
                                **self.model_dump(include=set(OPTIMIZER_KEYS[self.optimizer])))


class RunConfig(SchemaModel):
    """When a run stops. Durations are emulated seconds."""

    time_budget: Pos | None = 60.0
    max_updates: AtLeastOne | None = None
    max_rounds: AtLeastOne | None = None
    target_accuracy: Prob | None = None
    stop_at_target: bool = False
    dilation: Pos | Literal["auto"] = 1.0
    # the server checkpoints (model, algorithm state, counters, log offsets)
    # every this many aggregations (updates or rounds, as the algorithm
    # counts them) or real seconds, whichever comes first; 0 turns either off
    checkpoint_every: NonNegInt = 50
    checkpoint_seconds: NonNeg = 30.0

    @model_validator(mode="after")
    def _some_limit(self) -> RunConfig:
        if self.time_budget is None and self.max_updates is None and self.max_rounds is None:
            raise ValueError("set at least one of time_budget, max_updates, max_rounds")
        return self


class EvalConfig(SchemaModel):
    """How often the global model is evaluated on the held-out test set."""

    every_updates: AtLeastOne | None = None
    every_rounds: AtLeastOne | None = 1
    every_seconds: Pos | None = None


class DeployConfig(SchemaModel):
    """Processes, sockets and limits (one host or many)."""

    # client-host processes of `fedsim run` (0: one per core)
    hosts: NonNegInt = 0
    transport: Literal["ipc", "tcp"] = "ipc"
    loop: Literal["uvloop", "asyncio"] = "uvloop"
    # how `fedsim run` starts its torch workers (trainers, evaluator): "fork"
    # them from one zygote process that imported torch and built the data
    # once (fast start, pages shared), or "spawn" each as a fresh process
    workers: Literal["fork", "spawn"] = "fork"
    # `fedsim run` only: give each client host's trainer a CPU of its own and
    # keep every other process of the run (server, host loops, evaluator) on
    # the rest; needs more usable CPUs than client hosts. For one run on an
    # otherwise idle machine (a benchmark): runs side by side would all put
    # their trainers on the same CPUs
    pin_trainers: bool = False
    # the largest message the server and its hosts accept from each other, in
    # MB; unset: the largest legitimate one of the scenario's algorithm and
    # model (a task or update of its model copies, a host's registration or
    # goodbye). A larger frame is dropped unread (and counted)
    max_message_mb: Pos | None = None
    # real seconds to wait for client hosts to register before the federation
    # starts with those present (the missing ones are named)
    start_timeout: Pos = 120.0
    # real seconds of silence after which a host (or, seen from a host, the
    # server) is taken for dead; hosts probe the server's clock every 2 s
    host_timeout: Annotated[float, Field(ge=5.0)] = 15.0
    # the longest real transit a message may claim (now - its send time); a
    # claim outside [now - this, now + clock uncertainty] is clamped and counted
    max_transit_ms: Pos = 1000.0
    # messages per real second one client host may send, averaged over 5 s;
    # beyond it messages are rejected (counted, logged)
    max_host_rate: Pos = 5000.0
    # messages per real second one client may send (updates, ready, leave),
    # averaged over 5 s, and the largest message without a model a host may
    # send (event batches, goodbyes), in MB
    max_client_rate: Pos = 200.0
    max_control_mb: Pos = 16.0
    # real seconds a connection may take to complete its handshake (CURVE with
    # keys) before the server closes it
    handshake_timeout: Pos = 5.0
    # messages per real second from one source that has not registered (a
    # key, or a connection without keys: clock probes, the registration),
    # averaged over 5 s; beyond it they are rejected unread (counted)
    max_unregistered_rate: Pos = 10.0
    # the share of the server's time one client host's messages may take
    # (decoding and handling them, measured), averaged over 5 s; beyond it its
    # control messages (event batches, probes) are rejected unread (counted)
    # until its share is back under; its clients' messages go on
    max_host_cpu: Annotated[float, Field(gt=0.0, le=1.0)] = 0.1
    # rejections logged (and written to events.jsonl) per source and reason;
    # the rest are counted, and summarised once at the end
    max_logged_rejects: NonNegInt = 10


def optimizer_options(client: ClientConfig) -> tuple[tuple[str, ...], list[str]]:
    """The options the client's optimizer reads, and the other optimizers' options."""
    reads = OPTIMIZER_KEYS[client.optimizer]
    return reads, [key for key in OPTIMIZER_OPTIONS if key not in reads]
