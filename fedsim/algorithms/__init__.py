"""Federated-learning algorithms, sans-I/O.

Rules
-----
1. Nothing in this package performs I/O, sleeps, awaits or reads a clock: it
   imports no ``asyncio``, ``zmq`` or ``netem``. Time, when a rule needs it,
   is passed in as a plain float of emulated seconds.
2. Server rules map ``(global state, client result(s))`` to a new global
   state plus a small ``info`` dict for the event log; client rules map
   ``(model, data, config)`` to a result. The actors in ``fedsim.actors``
   decide *when* these run; the functions here decide *what* they compute.
3. Every process that parses a scenario imports this package, client hosts
   included, and those never import torch (docs/architecture.md#processes):
   a module here binds torch with :func:`fedsim.lazy.lazy_module` (or
   under ``TYPE_CHECKING`` alone) and touches it only inside functions.

Every built-in algorithm's home defines its :class:`AlgorithmSpec`
(:mod:`fedsim.algorithms.api`) as ``SPEC``, and this package registers those
of :data:`BUILTIN` when it is imported; :func:`get` finds one by
``algorithm.name``.

Models travel through these functions as flat float32 vectors (one
contiguous ``torch.Tensor`` of the trainable parameters); norms and inner
products that drive a decision are accumulated in float64
(docs/algorithms.md#the-model-vector).
"""

from fedsim.algorithms import (
    asyncfeded,
    dga,
    fedasync,
    fedavg,
    fedbuff,
    fedopt,
    fedspeed,
    scaffold,
)
from fedsim.algorithms._kernels import (
    check_finite,
    flatten,
    lerp,
    norm64,
    pack_tensor,
    unflatten,
    unpack_tensor,
    weighted_average,
)
from fedsim.algorithms.api import (
    AlgorithmConfig,
    AlgorithmSpec,
    ClientAlgorithm,
    ServerAlgorithm,
    algorithm_names,
    get,
    register,
    register_elsewhere,
)
from fedsim.algorithms.base import (
    LocalRunFailed,
    NonFiniteUpdate,
    StepOverflow,
    failure_cause,
)
from fedsim.algorithms.fedasync import FedAsync, fedasync_mix, staleness_weight
from fedsim.algorithms.fedavg import FedAvg, fedavg_aggregate
from fedsim.algorithms.local import LocalConfig, local_train
from fedsim.algorithms.optim import (
    OPTIMIZERS,
    OptimizerConfig,
    make_optimizer,
    optimizer_config,
)
from fedsim.algorithms.scheduling import (
    AsyncScheduler,
    RoundScheduler,
    SchedulerError,
)

#: The built-in homes, each with its :class:`AlgorithmSpec` as ``SPEC``: the
#: registry holds them from here, the one place it is filled (a plug-in is
#: resolved by reference, ``module:attribute``, and never registered by parsing).
BUILTIN = (fedavg, fedasync, asyncfeded, fedbuff, fedspeed, scaffold, dga, fedopt)
for _home in BUILTIN:
    register(_home.SPEC)
# a Flower app (fedsim.flower): a built-in whose home is outside this sans-I/O package
register_elsewhere("flower", "fedsim.flower.spec:SPEC")

__all__ = [
    "BUILTIN",
    "OPTIMIZERS",
    "AlgorithmConfig",
    "AlgorithmSpec",
    "AsyncScheduler",
    "ClientAlgorithm",
    "FedAsync",
    "FedAvg",
    "LocalConfig",
    "LocalRunFailed",
    "NonFiniteUpdate",
    "OptimizerConfig",
    "RoundScheduler",
    "SchedulerError",
    "ServerAlgorithm",
    "StepOverflow",
    "algorithm_names",
    "check_finite",
    "failure_cause",
    "fedasync_mix",
    "fedavg_aggregate",
    "flatten",
    "get",
    "lerp",
    "local_train",
    "make_optimizer",
    "norm64",
    "optimizer_config",
    "pack_tensor",
    "register",
    "staleness_weight",
    "unflatten",
    "unpack_tensor",
    "weighted_average",
]
