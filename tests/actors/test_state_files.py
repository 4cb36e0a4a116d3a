"""What a run saves (checkpoint.pt, ``--state`` files) loads back for every algorithm, unpickled.

Each registered algorithm runs through the real actors (in memory, virtual
time) with checkpoints and a state directory; the files it leaves are read
back with :mod:`fedsim.wire.statefile` and loaded into a freshly built server side
and client side, which must then hold exactly the saved state. A pickle
planted where a ``--state`` file goes is refused without being unpickled.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch
from actor_scenarios import build, of

from fedsim.actors.checkpoint import load_checkpoint
from fedsim.actors.setup import build_data, build_model, local_config
from fedsim.actors.worker import Worker
from fedsim.algorithms import algorithm_names, flatten, get
from fedsim.algorithms.api import ServerContext
from fedsim.scenario import resolved, scenario_hash
from fedsim.testing.federation import VERSION, plan, run_in_memory
from fedsim.wire import statefile

pytestmark = pytest.mark.timeout(120)

#: what each algorithm needs beyond its name to run a few rounds in two seconds
EXTRA: dict[str, dict[str, object]] = {
    "fedasync": {"concurrency": 3}, "asyncfeded": {"concurrency": 3},
    "fedbuff": {"concurrency": 4, "buffer_size": 3},
    "dga": {"local_steps": 2, "delay": 2},
}


def _encoded(value: object) -> bytes:
    return statefile.encode(value, "x").to_bytes()


# a Flower app's server side is a running process, whose state no checkpoint holds
# (tests/flower: its clients' Context.state through the state file, its refusal)
@pytest.mark.parametrize("name", [n for n in algorithm_names() if n != "flower"])
def test_every_algorithms_checkpoint_and_client_state_load_back(tmp_path: Path,
                                                               name: str) -> None:
    sc = build({"name": name, **EXTRA.get(name, {})},
               run={"time_budget": 2.0, "checkpoint_every": 2, "checkpoint_seconds": 0})
    run = run_in_memory(sc, tmp_path / "run", hosts=2, state_dir=tmp_path / "state")
    assert run.summary["status"] == "completed", run.summary["status"]
    assert of(run.events(), "checkpoint")

    ckpt = load_checkpoint(tmp_path / "run", VERSION, scenario_hash(resolved(sc)))
    fed = build_data(sc)
    model = build_model(sc, tuple(fed.input_shape), int(fed.num_classes))
    ctx = ServerContext(x0=flatten(list(model.parameters())), num_clients=sc.data.num_clients,
                        seed=sc.seed, local=local_config(sc))
    server = get(name).server(sc.algorithm, ctx)
    server.load_state_dict(ckpt["strategy"])
    assert _encoded(server.state_dict()) == _encoded(ckpt["strategy"])
    assert server.version == ckpt["version"] > 0

    for i, clients in enumerate(plan(sc, 2)):
        path = tmp_path / "state" / f"host-{i}-clients.pt"
        saved = statefile.load(path, "client-state")
        assert saved["clients"] == clients
        worker = Worker(sc, clients, str(path))
        assert worker.restored
        assert _encoded(worker.client.state_dict()) == _encoded(saved["state"])


class _Payload:
    """Unpickled, it makes ``marker``: what any code a pickle runs could do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        return (Path.touch, (self.marker,))


@pytest.mark.parametrize("writer", ["pickle", "torch.save"])
def test_a_pickled_state_file_is_refused_unread(tmp_path: Path, writer: str) -> None:
    sc = build({"name": "scaffold"})
    marker = tmp_path / "code-ran"
    path = tmp_path / "host-0-clients.pt"
    planted = {"algorithm": "scaffold", "clients": [0, 2, 4], "state": _Payload(marker)}
    if writer == "pickle":
        path.write_bytes(pickle.dumps(planted))
    else:
        torch.save(planted, path)
    with pytest.raises(statefile.LegacyStateFile, match="is a pickle") as err:
        Worker(sc, [0, 2, 4], str(path))
    assert str(path) in str(err.value)
    assert "delete it" in str(err.value)
    assert not marker.exists()
