"""Plug-ins: an algorithm, a model and a dataset from the user's own module.

The example under examples/plugin/ (mylab) is the plug-in: its rule on
hand-made tensors, its keys validated by its own config, found by reference
or by entry point, a federation on virtual time, and one short real run
through ``fedsim run`` whose worker processes import it.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import fedsim
from fedsim import cli
from fedsim.algorithms import api
from fedsim.errors import PluginError, RunFailed, ScenarioError
from fedsim.scenario import plugins, resolved
from fedsim.wire.messages import Update

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "plugin"
SCENARIO = EXAMPLE / "normtrim.toml"


@pytest.fixture
def clean_plugins(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test finds mylab afresh: no import, cache or path left from another."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(plugins, "_cache", {})
    monkeypatch.setattr(plugins, "_roots", {})
    for name in [m for m in sys.modules if m == "mylab" or m.startswith("mylab.")]:
        monkeypatch.delitem(sys.modules, name)
    yield
    for name in [m for m in sys.modules if m == "mylab" or m.startswith("mylab.")]:
        del sys.modules[name]


@pytest.fixture
def mylab(clean_plugins: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLE))


def _result(client: int, params: list[float], samples: int = 10) -> Update:
    return Update.of(client=client, base_version=0, params=torch.tensor(params),
                        num_samples=samples, steps=1, round=1)


def test_normtrim_leaves_out_the_farthest_model_and_weights_the_rest_by_samples(
        mylab: None) -> None:
    from mylab.rules import NormTrim, NormTrimConfig, normtrim_step

    x = torch.zeros(2)
    results = [_result(0, [1.0, 0.0], 10), _result(1, [0.0, 2.0], 30),
               _result(2, [100.0, 100.0], 1000)]
    delta, dropped, radius = normtrim_step(x, results, drop=1)
    assert dropped == [2]
    assert torch.allclose(delta, torch.tensor([0.25, 1.5]))
    assert radius == pytest.approx(2.0)
    _, dropped, _ = normtrim_step(x, results, drop=5)  # one model is always kept
    assert dropped == [1, 2]
    rule = NormTrim(NormTrimConfig(drop=1, beta=0.5))
    x1, info = rule.aggregate(x, results)
    x2, _ = rule.aggregate(x1, [_result(c, (x1 + d).tolist()) for c, d in
                                ((0, torch.tensor([1.0, 0.0])), (1, torch.tensor([1.0, 0.0])))])
    assert info["dropped"] == 1
    assert info["first_dropped"] == 2
    assert torch.allclose(x2 - x1, 0.5 * (x1 - x) + torch.tensor([1.0, 0.0]))  # momentum


def test_the_plugins_keys_are_validated_by_its_own_config(clean_plugins: None) -> None:
    with pytest.raises(ScenarioError) as info:
        fedsim.load(SCENARIO, overrides={"algorithm.drop": -1, "algorithm.bta": 0.3,
                                         "model.options.hiden": 8, "data.options.dims": 3})
    text = str(info.value)
    assert "algorithm.drop: Input should be greater than or equal to 0 (got -1)" in text
    assert "algorithm.bta: unknown key (did you mean 'beta'?)" in text
    assert ("model.options: 'hiden' is not an option of model 'mylab.nets:TinyMLP' "
            "(its options: hidden); did you mean 'hidden'?") in text
    assert "data.options: 'dims' is not an option of dataset 'mylab.data:blobs'" in text


def test_a_plugin_is_found_next_to_its_scenario_and_its_directory_passed_on(
        clean_plugins: None) -> None:
    assert "mylab" not in sys.modules
    sc = fedsim.load(SCENARIO)
    assert sc.algorithm.name == "mylab.rules:SPEC"
    assert type(sc.algorithm).__name__ == "NormTrimConfig"
    assert (sc.algorithm.drop, sc.algorithm.beta) == (1, 0.5)
    assert plugins.import_roots() == (str(EXAMPLE),)
    env = plugins.child_env({"PYTHONPATH": "/elsewhere"})
    assert env is not None
    assert env["PYTHONPATH"] == f"{EXAMPLE}:/elsewhere"
    # a process that reads the run's resolved scenario (JSON) gets the same scenario
    again = fedsim.load(json.loads(json.dumps(resolved(sc))))
    assert again == sc
    assert again.algorithm.spec is sc.algorithm.spec


def test_reading_a_plugin_scenario_leaves_the_registry_as_it_was(clean_plugins: None) -> None:
    names = api.algorithm_names()
    sc = fedsim.load(SCENARIO)
    from mylab.rules import SPEC  # the module the loader imported

    # the table keeps the spec it was validated with; the registry is unchanged
    assert sc.algorithm.spec is SPEC
    assert api.algorithm_names() == names
    with pytest.raises(KeyError, match=r"unknown algorithm 'mylab\.rules:SPEC'"):
        api.get("mylab.rules:SPEC")
    # a copy of the scenario (an override, a dump) keeps it too
    assert sc.model_copy(update={"seed": 3}).algorithm.spec is SPEC


def test_a_missing_or_wrong_plugin_is_a_plugin_error(clean_plugins: None,
                                                     tmp_path: Path) -> None:
    with pytest.raises(PluginError) as info:
        fedsim.load({"model": {"name": "nolab.nets:Net"}})
    assert ("model.name: 'nolab.nets:Net': no module named 'nolab' on the Python path "
            "(install it, put its directory on PYTHONPATH, or place it next to the scenario "
            "file)") in str(info.value)
    path = tmp_path / "s.toml"
    path.write_text('[algorithm]\nname = "json:dumps"\n[model]\nname = "json:loads"\n')
    with pytest.raises(PluginError) as info:
        fedsim.load(path)
    assert "algorithm.name: 'json:dumps' is a function, not an AlgorithmSpec" in str(info.value)
    assert ("model.name: model 'json:loads' must accept input_shape, num_classes"
            in str(info.value))
    with pytest.raises(PluginError, match=r"module json has no attribute 'nothing'"):
        fedsim.load({"data": {"dataset": "json:nothing"}})


def test_entry_points_give_installed_plugins_short_names(mylab: None, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    """What ``pip install -e examples/plugin`` declares, as an installed distribution."""
    declared = {"fedsim.algorithms": 'normtrim = "mylab.rules:SPEC"',
                "fedsim.models": 'tinymlp = "mylab.nets:TinyMLP"',
                "fedsim.datasets": 'blobs = "mylab.data:blobs"'}
    pyproject = (EXAMPLE / "pyproject.toml").read_text()
    for group, line in declared.items():
        assert f'[project.entry-points."{group}"]\n{line}\n' in pyproject
    dist = tmp_path / "mylab-0.1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: mylab\nVersion: 0.1.0\n")
    (dist / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + line.replace('"', "") + "\n" for group, line in declared.items()))
    monkeypatch.syspath_prepend(str(tmp_path))
    assert plugins.entry_point_names("algorithm") == ["normtrim"]
    sc = fedsim.load(SCENARIO, overrides={"algorithm.name": "normtrim", "model.name": "tinymlp",
                                          "data.dataset": "blobs"})
    assert type(sc.algorithm).__name__ == "NormTrimConfig"
    assert sc.algorithm.name == "normtrim"
    with pytest.raises(ScenarioError, match=r"'scaffold', (.*, )?'normtrim', or a plug-in "
                                            r"'module:attribute'\); did you mean 'normtrim'\?"):
        fedsim.load(SCENARIO, overrides={"algorithm.name": "normtrm"})


class _Scaled(torch.nn.Module):
    def __init__(self, input_shape: tuple[int, ...], num_classes: int) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(num_classes))  # no initializer for it


@pytest.mark.parametrize(("factory", "message"), [
    (lambda shape, n: torch.nn.Sequential(torch.nn.Flatten(), torch.nn.BatchNorm1d(8)),
     r"it holds buffers \(1\.running_mean, 1\.running_var, 1\.num_batches_tracked\); a "
     r"fedsim model is its trainable parameters only \(no BatchNorm: use GroupNorm or "
     r"LayerNorm\)"),
    (_Scaled, "No deterministic initializer for _Scaled"),
    (lambda shape, n: "a model", "its factory returned str, not a torch.nn.Module"),
])
def test_a_plugin_model_fedsim_cannot_build_the_same_everywhere_is_refused(
        factory: Any, message: str) -> None:
    from fedsim.models import build_from

    with pytest.raises(ValueError, match=message):
        build_from(factory, (8,), 4, seed=0, name="mine")


def test_a_plugin_that_fails_during_a_run_is_a_run_failed(
        clean_plugins: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from fedsim.launch import runner

    def broken(*args: Any, **kw: Any) -> Any:
        raise ValueError("Invalid model 'mylab.nets:TinyMLP': it holds buffers")

    monkeypatch.setattr(runner, "run_scenario", broken)
    with pytest.raises(RunFailed, match="the run failed: ValueError: Invalid model") as info:
        fedsim.run(fedsim.load(SCENARIO), out=tmp_path)
    assert info.value.result is None
    assert isinstance(info.value.__cause__, ValueError)


def test_federate_splits_a_loaders_arrays_or_takes_its_clients(mylab: None) -> None:
    from mylab.data import blobs

    from fedsim.data import build_federated, federate

    fed = federate("blobs", blobs(6, 3), num_clients=6, partition="dirichlet", seed=3,
                   dirichlet_alpha=0.5)
    assert fed.num_clients == 6
    assert fed.num_classes == 4
    assert fed.num_train == 960
    assert fed.input_shape == (8,)
    again = federate("blobs", blobs(6, 3), num_clients=6, partition="dirichlet", seed=3,
                     dirichlet_alpha=0.5)
    assert fed.fingerprint() == again.fingerprint()
    with pytest.raises(ValueError, match=r"returns pooled arrays \(allowed: iid, dirichlet"):
        federate("blobs", blobs(6, 3), num_clients=6, partition="natural", seed=3)
    natural = build_federated("synthetic", num_clients=4, partition="natural", seed=1)
    assert federate("mine", natural, num_clients=4, partition="natural", seed=1) is natural
    with pytest.raises(ValueError, match="returned 4 clients for num_clients = 5"):
        federate("mine", natural, num_clients=5, partition="natural", seed=1)
    with pytest.raises(ValueError, match="returned ndarray, not a FederatedData"):
        federate("mine", np.zeros(3), num_clients=5, partition="iid", seed=1)


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """Train in this process on one thread, as a torch worker does (tests/actors/conftest.py)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_the_example_federates_on_virtual_time(mylab: None, one_torch_thread: None,
                                               tmp_path: Path) -> None:
    from fedsim.testing.federation import run_in_memory

    sc = fedsim.load(SCENARIO, overrides={"run.time_budget": 3.0})
    run = run_in_memory(sc, tmp_path)
    assert run.summary["status"] == "completed", run.summary["status"]
    aggregates = [e for e in run.events() if e["ev"] == "aggregate"]
    assert len(aggregates) >= 10
    assert all(len(e["clients"]) == 5 and e["dropped"] == 1 for e in aggregates)
    assert run.summary["best_accuracy"] > 0.6  # four separable blobs: chance is 0.25


def test_the_example_runs_through_fedsim_run_with_its_workers_importing_it(
        clean_plugins: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real path: a client host and two torch workers, separate processes,
    rebuild mylab's model and data and run its client side; mylab is on no
    path but the scenario's directory."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # fedsim itself, as an install would
    out = tmp_path / "run"
    res = CliRunner().invoke(cli.cli, [
        "run", str(SCENARIO), "--out", str(out), "--no-progress",
        "--set", "run.time_budget=2.0", "--set", "eval.every_rounds=1"],
        catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert res.stdout.startswith("mylab.rules:SPEC on 10 clients: completed (time_budget)")
    result = fedsim.open_run(out)
    assert result.summary.algorithm == "mylab.rules:SPEC"
    aggregates = list(result.events("aggregate"))
    assert aggregates
    assert all(e["dropped"] == 1 for e in aggregates)
    assert result.summary.final_accuracy is not None
    assert 'name = "mylab.nets:TinyMLP"' in (out / "scenario.toml").read_text()


def test_a_flower_apps_module_is_located_next_to_its_scenario_without_importing_it(
        clean_plugins: None, tmp_path: Path) -> None:
    """A Flower app's module imports torch and Flower: reading its scenario (as a
    client host does) finds it and passes its directory on, but never imports it;
    a module found nowhere is named with the key that refers to it."""
    app = tmp_path / "lab"
    app.mkdir()
    (app / "myflowerapp.py").write_text("raise RuntimeError('imported')\n")
    scenario = app / "s.toml"
    scenario.write_text('[algorithm]\nname = "flower"\nserver_app = "myflowerapp:server_app"\n'
                        'client_app = "myflowerapp:client_app"\n')
    registry = dict(api._REGISTRY)
    sc = fedsim.load(scenario)
    assert "myflowerapp" not in sys.modules
    # the built-in "flower" is found by its reference: parsing leaves the registry as it was
    assert registry == api._REGISTRY
    assert "flower" not in api._REGISTRY
    assert api.get("flower").config is type(sc.algorithm)
    assert sc.algorithm.modules() == {"server_app": "myflowerapp:server_app",
                                      "client_app": "myflowerapp:client_app"}
    assert plugins.import_roots() == (str(app),)
    scenario.write_text(scenario.read_text().replace('client_app = "myflowerapp:',
                                                     'client_app = "nowhere_app:'))
    with pytest.raises(ScenarioError, match=r"algorithm\.client_app.*no module named "
                                            r"'nowhere_app'"):
        fedsim.load(scenario)
    scenario.write_text(scenario.read_text().replace('"nowhere_app:client_app"',
                                                     '"not a reference"'))
    with pytest.raises(ScenarioError, match="not a 'module:attribute' reference"):
        fedsim.load(scenario)
