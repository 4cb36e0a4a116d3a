"""A Flower app's ``[algorithm]`` table, and what the run needs to know before Flower loads."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import math
import re
from typing import Literal

from pydantic import Field, field_validator

from fedsim.algorithms.api import AlgorithmConfig
from fedsim.schema import FinitePos

__all__ = ["FLOWER_VERSIONS", "FlowerConfig", "FlowerMissing", "require_flower"]

#: the Flower versions fedsim is tested with: the oldest (1.38, the first with
#: every module the bridge uses) and the newest (constraints.txt pins it)
FLOWER_VERSIONS = ">=1.38,<2"
_OLDEST, _BEYOND = (1, 38), (2, 0)

_REFERENCE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")

#: a run-config value: what Flower's UserConfig holds
ConfigValue = bool | int | float | str


class FlowerMissing(ImportError):
    """A scenario names a Flower app and Flower is not installed."""


def require_flower() -> None:
    """Raise :class:`FlowerMissing` naming the extra when ``flwr`` cannot be imported,
    or when the installed Flower is outside :data:`FLOWER_VERSIONS`."""
    if importlib.util.find_spec("flwr") is None:
        raise FlowerMissing(
            "this scenario runs a Flower app (algorithm.name = \"flower\"), and Flower is not "
            "installed: pip install \"fedsim[flower]\"")
    try:
        found = importlib.metadata.version("flwr")
    except importlib.metadata.PackageNotFoundError:    # a source tree on the path
        return
    release = tuple(int(x) for x in re.findall(r"\d+", found)[:2])
    if not _OLDEST <= release < _BEYOND:
        raise FlowerMissing(
            f"this scenario runs a Flower app, and Flower {found} is installed; fedsim runs "
            f"flwr{FLOWER_VERSIONS}: pip install \"fedsim[flower]\"")


class FlowerConfig(AlgorithmConfig):
    """``[algorithm]`` of a Flower app (``name = "flower"``).

    ``compute`` sets a ClientApp call's emulated compute time: ``"cpu"``
    (default) its thread's real CPU time, scaled by the client's device
    (``[devices]``: its mean step time over the scenario's ``step_time``);
    ``"steps"``: the number the reply's metric ``steps_metric`` holds,
    times the device's step time, as fedsim's own clients are charged.
    ``max_message_mb`` bounds a message either way (the wire refuses a larger
    one before reading it); by default three times the scenario model's size
    plus 1 MB, at least 16 MB.
    """

    name: Literal["flower"] = "flower"
    server_app: str
    client_app: str
    run_config: dict[str, ConfigValue] = Field(default_factory=dict)
    compute: Literal["cpu", "steps"] = "cpu"
    steps_metric: str = "num-steps"
    max_message_mb: FinitePos | None = None

    @field_validator("server_app", "client_app")
    @classmethod
    def _reference(cls, v: str) -> str:
        if not _REFERENCE.match(v):
            raise ValueError(f"{v!r} is not a 'module:attribute' reference "
                             "(e.g. 'mylab.app:server_app')")
        return v

    @field_validator("run_config")
    @classmethod
    def _finite(cls, v: dict[str, ConfigValue]) -> dict[str, ConfigValue]:
        for key, value in v.items():
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"run_config.{key}: {value!r} is not a finite number")
        return v

    def resumable(self) -> str:
        return ("a Flower app's run cannot resume from a checkpoint: its ServerApp is a "
                "running process whose state fedsim cannot save (run it again; its clients' "
                "Context.state is kept by fedsim clients --state)")

    def state_key(self) -> str:
        return f"flower {self.client_app}"     # another app's Context.state is not this one's

    def local_work(self) -> str:
        return (f"the ClientApp's handlers ({self.client_app}); compute time: "
                + ("their CPU time x the device's speed" if self.compute == "cpu"
                   else f"metric {self.steps_metric!r} x the device's step time"))

    def client_table(self) -> str:
        return f"the ClientApp ({self.client_app}) trains with its own optimizer and steps"

    def modules(self) -> dict[str, str]:
        return {"server_app": self.server_app, "client_app": self.client_app}

    def payload_bytes(self, model_bytes: int) -> int:
        """The most bytes a message may have, for a scenario model of ``model_bytes``."""
        if self.max_message_mb is not None:
            return int(self.max_message_mb * 1e6)
        return max(16_000_000, 3 * model_bytes + 1_000_000)
