"""Each client optimizer reads only its own ``[client]`` keys, and ``fedsim check`` says so.

The table (:data:`fedsim.scenario.sections.OPTIMIZER_KEYS`) is checked against
what a local run computes: for every optimizer, each key it does not read is
set to another valid value, and the run's trained model is the same, bit for
bit; each key it does read changes it.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from fedsim.actors.setup import local_config
from fedsim.algorithms.local import local_train
from fedsim.scenario import parse, unused_keys
from fedsim.scenario.sections import OPTIMIZER_KEYS, OPTIMIZER_OPTIONS

#: another valid value for every optimizer option (each differs from the default)
OTHER: dict[str, Any] = {
    "lr": 0.11, "momentum": 0.5, "beta1": 0.5, "beta2": 0.9, "weight_decay": 0.01,
    "initial_accumulator": 0.3, "eta0": 0.05, "theta0": 3.0, "gamma": 0.2, "delta": 0.5,
    "eta_max": 0.02, "first_step": "code", "batch_mode": "previous", "sps_c": 0.2,
    "f_star": -1.0, "sps_mode": "smooth",
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
        assert not torch.equal(_trained(optimizer, **{key: OTHER[key]}), base), key


def test_fedsim_check_marks_a_key_the_chosen_optimizer_does_not_read() -> None:
    unused = unused_keys(parse({"client": {"optimizer": "sgd", "gamma": 3.0}}))
    assert unused["client.gamma"] == "not used by optimizer sgd (it reads lr, weight_decay)"
    assert "client.lr" not in unused
    assert "client.gamma" not in unused_keys(parse({"client": {"optimizer": "deltasgd"}}))
