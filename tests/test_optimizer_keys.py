"""Each client optimizer reads only its own ``[client]`` keys, and ``fedsim check`` says so.

The table (:data:`fedsim.scenario.sections.OPTIMIZER_KEYS`, from each optimizer's
own declaration in :mod:`fedsim.algorithms.optim`) is checked against
what a local run computes: for every optimizer, each key it does not read is
set to another valid value, and the run's trained model is the same, bit for
bit; each key it does read changes it.
"""

from __future__ import annotations

from typing import Any, get_args

import pytest
import torch

from fedsim.actors.setup import local_config
from fedsim.algorithms.local import local_train
from fedsim.algorithms.optim import OPTIMIZERS, optimizer_config
from fedsim.scenario import parse, unused_keys
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
