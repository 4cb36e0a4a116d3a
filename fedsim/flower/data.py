"""What a Flower app imports from fedsim: each client's data, as fedsim partitions it.

A Flower ``ClientApp`` finds its data from its node config
(``partition-id``, ``num-partitions``). Under fedsim
(``[algorithm] name = "flower"``, docs/flower.md) :func:`partition` returns
the partition fedsim built for that client from the scenario's ``[data]``
(the trainer already holds it: nothing is read again, nothing downloaded),
and :func:`eval_set` the scenario's test set. The same app run by Flower's
own simulation, or anywhere else, gets the same data, built the same way,
from the scenario its run config names (``fedsim-scenario =
"path/to/scenario.toml"``) or, failing that, the one it passes::

    from fedsim.flower import partition, eval_set

    SCENARIO = Path(__file__).with_name("lan.toml")   # used outside fedsim

    @app.train()
    def train(msg, context):
        x, y = partition(context, SCENARIO)
        ...

Everything here needs torch; none of it needs Flower.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedsim.flower import running
from fedsim.flower.running import current
from fedsim.scenario import load

if TYPE_CHECKING:
    import torch

__all__ = ["SCENARIO_KEY", "eval_set", "partition", "scenario_data"]

#: the run-config key that names the scenario outside fedsim
SCENARIO_KEY = "fedsim-scenario"


def _ids(context: Any) -> tuple[int, int]:
    cfg = context.node_config
    try:
        pid, n = int(cfg["partition-id"]), int(cfg["num-partitions"])
    except (KeyError, TypeError, ValueError):
        raise ValueError("the Context's node_config has no partition-id and num-partitions "
                         "(Flower's simulation and fedsim both set them)") from None
    return pid, n


@lru_cache(maxsize=2)
def scenario_data(path: str) -> Any:
    """The scenario at ``path`` and its data, built as a fedsim run builds them."""
    return _built(load(path))


_data: dict[int, Any] = {}


def _built(sc: Any) -> Any:
    from fedsim.actors.setup import build_data  # lazy: torch and the datasets only when asked

    key = id(sc)
    if key not in _data:
        _data.clear()
        _data[key] = (sc, build_data(sc))
    return _data[key]


def _scenario_and_data(context: Any, scenario: str | Path | None) -> Any:
    sc = running.scenario()
    if sc is not None:
        return _built(sc)
    path = context.run_config.get(SCENARIO_KEY) or scenario
    if not isinstance(path, str | Path) or not str(path):
        raise ValueError(f"outside a fedsim run, name the scenario whose data to use: in the "
                         f"app's run config ({SCENARIO_KEY} = \"path/to/scenario.toml\") or "
                         "as the helper's scenario argument")
    return scenario_data(str(Path(path).resolve()))


def partition(context: Any, scenario: str | Path | None = None,
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """This node's training data ``(x, y)`` as tensors (see the module docstring).

    ``scenario``: the scenario file to use outside a fedsim run when the run
    config names none (under fedsim, the run's own). ValueError when the
    node config has no partition, or when, outside fedsim, no scenario is
    named or the partition count differs from its ``data.num_clients``."""
    import torch  # lazy: fedsim's client hosts import fedsim without torch

    pid, n = _ids(context)
    now = current()
    if now is not None and now[0] == pid:
        return now[1], now[2]
    sc, data = _scenario_and_data(context, scenario)
    if n != sc.data.num_clients:
        raise ValueError(f"num-partitions is {n}, the scenario has {sc.data.num_clients} "
                         "clients: run the app with as many nodes")
    shard = data.clients[pid]
    return torch.as_tensor(shard.x), torch.as_tensor(shard.y)


def eval_set(context: Any, scenario: str | Path | None = None,
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """The scenario's test set ``(x, y)``, for an app's centralized evaluation
    (``scenario`` as for :func:`partition`)."""
    import torch  # lazy: as in partition

    _, data = _scenario_and_data(context, scenario)
    return torch.as_tensor(data.test_x), torch.as_tensor(data.test_y)
