"""Client hosts never import torch or Flower; fedsim.lazy is how (docs/architecture.md).

Only the processes that train, evaluate or aggregate import torch (about
1.2 s and 185 MB each). A client host parses the scenario, which imports
every algorithm's home module, so those modules bind torch through
:func:`fedsim.lazy.lazy_module` and touch it only inside functions.

The check runs in a fresh interpreter: it imports what a host process
imports (one started by ``fedsim run`` or by ``fedsim clients``), parses
every shipped scenario and builds what a host builds from it (the network
plan, the local-training config, the expected local steps, a
:class:`~fedsim.actors.host.ClientHost`), then asserts that torch was never
imported and that every lazy proxy is still unloaded. The positive controls
show that the same probe sees torch where it is used (the server, a worker,
a proxy that is read), so a passing check is not a blind one.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from fedsim.lazy import LazyModule, is_loaded, lazy_module

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = sorted(
    p for p in [*ROOT.glob("scenarios/*.toml"), *ROOT.glob("scenarios/repro/*.toml"),
                *ROOT.glob("examples/flower/*.toml")]
    if not p.name.endswith(".sweep.toml")
)

# Reports what was loaded as the last line of its output, as JSON.
REPORT = """
import json, sys
from fedsim.lazy import LazyModule, is_loaded
proxies = {
    f"{name}.{attr}": is_loaded(value)
    for name, module in list(sys.modules.items()) if name.startswith("fedsim")
    for attr, value in list(vars(module).items()) if isinstance(value, LazyModule)
}
print(json.dumps({
    "torch": sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.")),
    "flwr": sorted(m for m in sys.modules if m == "flwr" or m.startswith("flwr.")),
    "proxies": proxies,
    "done": done,
    "first_torch": globals().get("first_torch", []),
}))
"""

HOST = """
import sys, traceback

# Who imports torch first, if anyone: the failure message shows the stack.
first_torch = []
class _Spy:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name == "torch" and not first_torch:
            first_torch.append("".join(traceback.format_stack(limit=30)))
        return None
sys.meta_path.insert(0, _Spy)

import fedsim.actors.client
import fedsim.actors.host
import fedsim.cli  # `fedsim clients` runs a host on another machine
import fedsim.deploy.run
from fedsim.actors.setup import local_config
from fedsim.actors.host import ClientHost
from fedsim.scenario.network import NetPlan
from fedsim.scenario import load, resolved

done = []
for path in sys.argv[1:]:
    sc = load(path)
    resolved(sc)
    plan = NetPlan(sc, host_step_time=sc.devices.host_step_time)
    steps = local_config(sc).num_steps(100)
    host = ClientHost(sc, "host-0", [0, 1], None, None, fedsim_version="test",
                      scenario_hash="0" * 64)
    assert host.local.num_steps(100) == steps >= 1, (path, steps)
    done.append([path, sc.algorithm.name, steps])
"""


def _probe(body: str, *args: str) -> dict:
    """Run ``body`` then :data:`REPORT` in a fresh interpreter; the report."""
    code = textwrap.dedent(body) + REPORT
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                         timeout=300, check=False, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_there_are_scenarios_to_check() -> None:
    assert len(SCENARIOS) >= 20
    assert any(p.parent.name == "repro" for p in SCENARIOS)


def test_a_client_host_never_imports_torch() -> None:
    report = _probe(HOST, *map(str, SCENARIOS))
    assert len(report["done"]) == len(SCENARIOS)
    # every algorithm home the scenarios use was parsed
    assert {alg for _, alg, _ in report["done"]} >= {
        "fedavg", "fedprox", "fedasync", "asyncfeded", "fedbuff", "fedspeed", "scaffold",
        "dga", "fedadam",
    }
    assert report["torch"] == [], "torch was imported here:\n" + "".join(report["first_torch"])
    # nor Flower, even for a scenario that names a Flower app (only its trainers run it)
    assert "flower" in {alg for _, alg, _ in report["done"]}
    assert report["flwr"] == []
    # the proxies are there (the scan works) and none of them was read
    assert any(name.startswith("fedsim.algorithms.") for name in report["proxies"])
    assert [name for name, loaded in report["proxies"].items() if loaded] == []


@pytest.mark.parametrize("module", ["fedsim.actors.server", "fedsim.actors.worker"])
def test_control_the_server_and_the_workers_import_torch(module: str) -> None:
    report = _probe(f"import {module}\ndone = []\n")
    assert "torch" in report["torch"]
    assert "torch._C" in report["torch"]


def test_control_the_flower_server_side_imports_flower() -> None:
    pytest.importorskip("flwr")
    report = _probe("import fedsim.flower.server\ndone = []\n")
    assert "flwr" in report["flwr"]


def test_control_using_an_algorithm_loads_its_proxy() -> None:
    body = """
    import fedsim.actors.host
    from fedsim.algorithms._kernels import flatten
    done = [int(flatten([]).numel())]
    """
    report = _probe(body)
    assert report["done"] == [0]
    assert "torch._C" in report["torch"]
    assert report["proxies"]["fedsim.algorithms._kernels.torch"] is True


# --------------------------------------------------------------------- the proxy


@pytest.fixture
def probe_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A module that counts its own imports in ``sys.lazy_probe_imports``."""
    name = f"lazy_probe_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent("""
        import sys
        sys.lazy_probe_imports = getattr(sys, "lazy_probe_imports", 0) + 1
        class Thing:
            pass
        VALUE = 42
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "lazy_probe_imports", 0, raising=False)
    yield name
    sys.modules.pop(name, None)


def test_a_proxy_imports_its_module_once_on_first_attribute_access(probe_module: str) -> None:
    proxy = lazy_module(probe_module)
    assert probe_module not in sys.modules
    assert not is_loaded(proxy)
    assert repr(proxy) == f"<lazy module {probe_module!r} (not loaded)>"
    assert sys.lazy_probe_imports == 0  # type: ignore[attr-defined]

    assert proxy.VALUE == 42
    assert is_loaded(proxy)
    assert repr(proxy) == f"<lazy module {probe_module!r} (loaded)>"
    assert sys.lazy_probe_imports == 1  # type: ignore[attr-defined]
    module = sys.modules[probe_module]
    # later reads go straight to the module's own namespace: no second import
    assert proxy.__dict__ is module.__dict__
    assert proxy.Thing is module.Thing
    assert sys.lazy_probe_imports == 1  # type: ignore[attr-defined]


def test_isinstance_and_writes_go_to_the_real_module(probe_module: str) -> None:
    proxy = lazy_module(probe_module)
    thing = sys.modules.get(probe_module) or __import__(probe_module)
    obj = thing.Thing()
    assert isinstance(obj, proxy.Thing)
    proxy.VALUE = 7
    assert thing.VALUE == 7
    assert isinstance(proxy, LazyModule)
    assert not isinstance(proxy, ModuleType)


def test_introspection_does_not_import(probe_module: str) -> None:
    """``inspect``, ``doctest`` and pytest probe dunders; they must not import torch."""
    proxy = lazy_module(probe_module)
    assert not hasattr(proxy, "__wrapped__")
    assert not hasattr(proxy, "__file__")
    assert not is_loaded(proxy)
    assert probe_module not in sys.modules
    proxy.VALUE  # noqa: B018 - the first read imports
    assert proxy.__file__.endswith(f"{probe_module}.py")


def test_a_missing_attribute_is_the_modules_own_error(probe_module: str) -> None:
    proxy = lazy_module(probe_module)
    with pytest.raises(AttributeError, match="no_such_name"):
        proxy.no_such_name  # noqa: B018


def test_a_missing_module_fails_on_first_use_not_at_definition() -> None:
    proxy = lazy_module("fedsim_no_such_module_anywhere")
    with pytest.raises(ModuleNotFoundError, match="fedsim_no_such_module_anywhere"):
        proxy.anything  # noqa: B018


def test_the_lazy_torch_is_torch() -> None:
    import torch

    proxy = lazy_module("torch")
    assert proxy.Tensor is torch.Tensor
    assert isinstance(torch.zeros(1), proxy.Tensor)
    assert proxy.nn.functional is torch.nn.functional


def test_fedopts_server_optimizer_is_made_once_and_is_a_torch_optimizer() -> None:
    import torch

    from fedsim.algorithms import fedopt

    cls = fedopt.AdaptiveServerOptimizer
    assert cls is fedopt.AdaptiveServerOptimizer
    assert issubclass(cls, torch.optim.Optimizer)
    assert cls.__qualname__ == "AdaptiveServerOptimizer"
    assert cls.__module__ == "fedsim.algorithms.fedopt"
    with pytest.raises(AttributeError, match="no_such_name"):
        fedopt.no_such_name  # noqa: B018
