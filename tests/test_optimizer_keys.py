"""Each client optimizer reads only its own ``[client]`` keys; a scenario file that sets
another is refused, and ``fedsim check`` marks the rest.

The table (:data:`fedsim.scenario.sections.OPTIMIZER_KEYS`, from each optimizer's
own declaration in :mod:`fedsim.algorithms.optim`) is checked against
what a local run computes: for every optimizer, each key it does not read is
set to another valid value, and the run's trained model is the same, bit for
bit; each key it does read changes it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, get_args

import pytest
import torch

from fedsim.actors.setup import local_config
from fedsim.algorithms.local import local_train
from fedsim.algorithms.optim import OPTIMIZERS, optimizer_config
from fedsim.errors import OverrideError, ScenarioError
from fedsim.scenario import load, parse, resolved, to_toml, unused_keys
from fedsim.scenario.file import unread_options
from fedsim.scenario.sections import OPTIMIZER_KEYS, OPTIMIZER_OPTIONS, ClientConfig

#: another valid value for every optimizer option (each differs from the default)
OTHER: dict[str, Any] = {
    "lr": 0.11, "momentum": 0.5, "beta1": 0.5, "beta2": 0.9, "weight_decay": 0.01,
    "initial_accumulator": 0.3, "eta0": 0.05, "theta0": 3.0, "gamma": 0.2, "delta": 0.5,
    "eta_max": 0.02, "first_step": "code", "batch_mode": "previous", "sps_c": 0.2,
    "f_star": -1.0, "sps_mode": "smooth", "eps": 0.1, "adagrad_eps": 0.1, "lr_eps": 0.1,
    "mask_mode": "shared", "sps_eta0": 0.5, "sps_n_batches": 8,
}
#: the setting under which a key that the optimizer reads can show it in 4 steps
CONTEXT: dict[str, dict[str, Any]] = {
    "sps_eta0": {"sps_mode": "smooth"}, "sps_n_batches": {"sps_mode": "smooth"},
}


def _trained(optimizer: str, **client: Any) -> torch.Tensor:
    sc = parse({"client": {"optimizer": optimizer, "local_steps": 4, "batch_size": 8, **client},
                "model": {"name": "mlp", "hidden": [8]}})
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)   # the same initial model every time
    model = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    x0 = torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()
    data = torch.Generator().manual_seed(1)
    x = torch.randn(32, 5, generator=data)
    y = torch.randint(0, 3, (32,), generator=data)
    out, _ = local_train(model, x0, x, y, local_config(sc), gen)
    return out


def test_every_option_has_another_value_and_every_key_is_a_client_key() -> None:
    assert set(OTHER) == set(OPTIMIZER_OPTIONS)
    keys = set(parse({}).client.model_dump())
    assert set(OPTIMIZER_OPTIONS) <= keys


@pytest.mark.parametrize("optimizer", list(OPTIMIZER_KEYS))
def test_an_optimizer_reads_its_keys_and_only_them(optimizer: str) -> None:
    base = _trained(optimizer)
    unread = {k: v for k, v in OTHER.items() if k not in OPTIMIZER_KEYS[optimizer]}
    assert torch.equal(_trained(optimizer, **unread), base), "an unread key changed the run"
    for key in OPTIMIZER_KEYS[optimizer]:
        if key == "weight_decay" or (optimizer == "sps" and key == "f_star"):
            continue  # reads it, but a small change may not move 4 steps' float32 result
        if key == "mask_mode":
            continue  # dropout's masks: this MLP has none (tests/algorithms/test_adaptive.py)
        context = CONTEXT.get(key, {})
        assert not torch.equal(_trained(optimizer, **context, **{key: OTHER[key]}),
                               _trained(optimizer, **context)), key


def test_the_optimizer_names_are_the_optimizers_own() -> None:
    """``[client] optimizer`` allows exactly the optimizers that declare options."""
    assert get_args(ClientConfig.model_fields["optimizer"].annotation) == OPTIMIZERS
    assert tuple(OPTIMIZER_KEYS) == OPTIMIZERS


def test_a_key_the_chosen_optimizer_does_not_read_is_refused_below_the_scenario() -> None:
    """The flat [client] table keeps every optimizer's keys (a sweep switches optimizers);
    the optimizer's own config takes only its own."""
    with pytest.raises(ValueError, match=r"momentum\n  Extra inputs are not permitted"):
        optimizer_config("sgd", momentum=0.5)
    cfg = parse({"client": {"optimizer": "adam", "lr": 0.01, "momentum": 0.5}}).client
    assert cfg.optimizer_config() == optimizer_config("adam", lr=0.01)


def test_fedsim_check_marks_a_key_the_chosen_optimizer_does_not_read() -> None:
    unused = unused_keys(parse({"client": {"optimizer": "sgd", "gamma": 3.0}}))
    assert unused["client.gamma"] == "not used by optimizer sgd (it reads lr, weight_decay)"
    assert "client.lr" not in unused
    assert "client.gamma" not in unused_keys(parse({"client": {"optimizer": "deltasgd"}}))


# -- a key the file sets that its optimizer does not read is refused (issue: one declaration) --


def _file(tmp_path: Path, client: str) -> Path:
    path = tmp_path / "scenario.toml"
    path.write_text(f'[algorithm]\nname = "fedavg"\n\n[client]\n{client}\n')
    return path


def test_loading_a_file_that_sets_a_key_its_optimizer_does_not_read_fails(
        tmp_path: Path) -> None:
    """``fedsim check`` and ``fedsim run`` load with :func:`fedsim.scenario.load`."""
    path = _file(tmp_path, 'optimizer = "sgd"\nlr = 0.1\ngamma = 0.5\nmomentum = 0.9')
    with pytest.raises(ScenarioError) as info:
        load(path)
    assert not isinstance(info.value, OverrideError)
    assert list(info.value.problems) == [
        "client.momentum: set to 0.9, but optimizer 'sgd' does not read it (it reads lr, "
        "weight_decay; momentum is read by sgdm): remove it, or choose an optimizer that "
        "reads it",
        "client.gamma: set to 0.5, but optimizer 'sgd' does not read it (it reads lr, "
        "weight_decay; gamma is read by deltasgd): remove it, or choose an optimizer that "
        "reads it",
    ]
    assert load(_file(tmp_path, 'optimizer = "deltasgd"\ngamma = 0.5')).client.gamma == 0.5


def test_an_override_that_sets_a_key_the_optimizer_does_not_read_is_blamed(
        tmp_path: Path) -> None:
    path = _file(tmp_path, 'optimizer = "sgd"')
    with pytest.raises(OverrideError, match=r"client\.eps: .*optimizer 'sgd' does not read it"
                                            r".*\(from --set client\.eps=0\.1\)"):
        load(path, ["client.eps=0.1"])
    with pytest.raises(OverrideError, match=r"client\.momentum: .*'adam' does not read it"):
        load(_file(tmp_path, 'optimizer = "sgdm"\nmomentum = 0.5'),
             ["client.optimizer=adam", "client.momentum=0.7"])


def test_an_override_that_switches_optimizers_keeps_the_files_own_options(
        tmp_path: Path) -> None:
    """A sweep's point that switches optimizers (ds1.sweep.toml, dg2.sweep.toml) keeps
    the options the file set for its own optimizer; ``fedsim check`` marks them."""
    path = _file(tmp_path, 'optimizer = "sgdm"\nlr = 0.1\nmomentum = 0.5')
    sc = load(path, ["client.optimizer=sgd"])
    assert sc.client.optimizer_config() == optimizer_config("sgd", lr=0.1)
    assert unused_keys(sc)["client.momentum"].startswith("not used by optimizer sgd")
    # ... but not a key that no optimizer of the file's reads either
    with pytest.raises(ScenarioError, match=r"client\.gamma: set to 0\.5, but optimizer 'sgd'"):
        load(_file(tmp_path, 'optimizer = "sgdm"\ngamma = 0.5'), ["client.optimizer=sgd"])


def test_a_resolved_scenario_holds_every_key_and_parses() -> None:
    """A resolved scenario (a run's scenario.json, what the hosts parse) sets every key."""
    sc = parse({"client": {"optimizer": "sgd", "lr": 0.1}})
    assert "gamma" in parse(resolved(sc)).client.model_fields_set
    assert unread_options(parse(resolved(sc)).client) != []   # what load() would refuse


def test_pythons_load_holds_a_mapping_and_a_derived_scenarios_overrides_to_the_rule(
        ) -> None:
    """``fedsim.load`` of a mapping is a scenario as a person wrote it; of a scenario,
    only the keys its overrides set were written (the rest is resolved)."""
    import fedsim  # lazy: the public entry point under test

    with pytest.raises(ScenarioError, match=r"client\.gamma: set to 0\.5, but optimizer 'sgd'"):
        fedsim.load({"algorithm": {"name": "fedavg"},
                     "client": {"optimizer": "sgd", "gamma": 0.5}})
    sc = fedsim.load({"algorithm": {"name": "fedavg"}, "client": {"optimizer": "sgdm",
                                                                  "momentum": 0.5}})
    assert sc.client.momentum == 0.5
    # derived: the resolved keys of other optimizers are no problem, an override's are
    assert fedsim.load(sc, {"run.time_budget": 3.0}).client.optimizer == "sgdm"
    assert fedsim.load(sc, {"client.optimizer": "adam"}).client.optimizer == "adam"
    for overrides in ({"client.gamma": 0.5}, {"client": {"gamma": 0.5}}):
        with pytest.raises(OverrideError, match=r"client\.gamma: .*'sgdm' does not read it"):
            fedsim.load(sc, overrides)


def test_a_resolved_scenario_file_loads_and_only_its_overrides_are_held_to_the_rule(
        tmp_path: Path) -> None:
    """``fedsim check``'s output, and a run's ``scenario.toml``, hold every key (the other
    optimizers' at their defaults): filled in, not written, so they load again."""
    sc = load(_file(tmp_path, 'optimizer = "sgdm"\nmomentum = 0.5'), ["client.optimizer=sgd"])
    path = tmp_path / "resolved.toml"
    path.write_text(to_toml(resolved(sc), unused_keys(sc)))
    again = load(path)
    assert again == sc
    assert again.client.optimizer_config() == optimizer_config("sgd", lr=sc.client.lr)
    with pytest.raises(OverrideError, match=r"client\.gamma: .*'sgd' does not read it"):
        load(path, ["client.gamma=0.3"])
    assert load(path, ["client.optimizer=deltasgd", "client.gamma=0.3"]).client.gamma == 0.3
    # a table that lacks one key a resolved one holds is a person's: held whole
    written = dict(resolved(sc)["client"])
    del written["lr"]
    with pytest.raises(ScenarioError, match=r"client\.momentum: set to 0\.5"):
        parse({"client": written}, written=True, runs_here=True)
