"""fedsim: a federated-learning simulator in which time is real.

The server and every client are asyncio actors that exchange msgpack-encoded
tensors over ZeroMQ, through the user-space network emulator :mod:`netem`.

From Python (:mod:`fedsim.api`)::

    import fedsim
    sc = fedsim.load("scenarios/quickstart.toml", overrides={"run.time_budget": 5})
    result = fedsim.run(sc)            # await fedsim.arun(sc) inside an event loop
    result.summary.final_accuracy, result.metrics["accuracy"], result.plot()

The names below are imported on first use: ``import fedsim`` stays cheap
(no torch) for the processes that only need a part of it.
"""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

logging.getLogger(__name__).addHandler(logging.NullHandler())

if TYPE_CHECKING:
    from fedsim.api import aresume, arun, as_toml, load, open_run, resume, run
    from fedsim.errors import (
        DeployError,
        FedsimError,
        OverrideError,
        PluginError,
        ResumeError,
        RunFailed,
        RunInterrupted,
        ScenarioError,
    )
    from fedsim.results.values import Metrics, RunResult, Summary
    from fedsim.scenario import Scenario

#: Public name -> the module that defines it.
_EXPORTS = {
    **dict.fromkeys(("load", "run", "arun", "resume", "aresume", "open_run", "as_toml"),
                    "fedsim.api"),
    **dict.fromkeys(("FedsimError", "ScenarioError", "OverrideError", "PluginError",
                     "ResumeError", "DeployError", "RunFailed", "RunInterrupted"),
                    "fedsim.errors"),
    **dict.fromkeys(("RunResult", "Summary", "Metrics"), "fedsim.results.values"),
    "Scenario": "fedsim.scenario",
}

__all__ = [
    "DeployError",
    "FedsimError",
    "Metrics",
    "OverrideError",
    "PluginError",
    "ResumeError",
    "RunFailed",
    "RunInterrupted",
    "RunResult",
    "Scenario",
    "ScenarioError",
    "Summary",
    "aresume",
    "arun",
    "as_toml",
    "load",
    "open_run",
    "resume",
    "run",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'fedsim' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
