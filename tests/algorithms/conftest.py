"""The algorithm registry that drives the contract tests (torch's ``optim_db`` pattern).

Modeled on torch's ``OptimizerInfo`` / ``optim_db``: one :class:`AlgoInfo` per
server rule (or config class), listing valid constructions
(:class:`AlgoInput`) and invalid ones (``error_inputs``: kwargs, the
exception, and a regex the message must match, naming the bad value).

Tests ask for these through fixture names, and :func:`pytest_generate_tests`
parametrizes them over the table:

* ``algo_case``  -- ``(AlgoInfo, AlgoInput)`` for every server rule input
* ``valid_case`` -- ``(AlgoInfo, AlgoInput)`` for every entry, configs included
* ``error_case`` -- ``(AlgoInfo, ErrorInput)`` for every entry

A new algorithm is a ``registry_<name>.py`` file here exporting ``ENTRIES``
(gathered below) plus its reference in ``tests/reference/``.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from fedsim.algorithms import FedAsync, FedAvg, LocalConfig, optimizer_config
from fedsim.algorithms.fedasync import FedAsyncConfig
from fedsim.algorithms.fedavg import FedAvgConfig

# tests/reference holds the paper-shaped reference modules; put the folder
# itself (not tests/, whose netem/ folder would shadow the real netem) on
# the path so tests can ``import fedasync_reference``.
_REFERENCE = Path(__file__).resolve().parents[1] / "reference"
if str(_REFERENCE) not in sys.path:
    sys.path.insert(0, str(_REFERENCE))

# conftest.py's folder is on sys.path (rootdir conftest, no __init__.py).
from _registry import (  # noqa: E402
    AlgoInfo,
    AlgoInput,
    _apply_async,
    _apply_round,
    _configured,
    _draw_async,
    _draw_round,
    _err,
    _refused,
)

ALGO_DB: list[AlgoInfo] = [
    AlgoInfo(
        name="FedAsync",
        factory=_configured(FedAsync, FedAsyncConfig),
        draw=_draw_async,
        apply=_apply_async,
        sync_kwargs={"alpha": 1.0},
        inputs=[
            AlgoInput({}, "defaults"),
            AlgoInput({"alpha": 0.6, "staleness": "const"}, "const"),
            AlgoInput({"alpha": 0.9, "staleness": "poly", "a": 0.5}, "poly-a0.5"),
            AlgoInput(
                {"alpha": 0.9, "staleness": "hinge", "a": 10, "b": 4}, "hinge-a10-b4"
            ),
            AlgoInput(
                {"alpha": 0.8, "staleness": "hinge", "a": 10, "b": 0}, "hinge-b0"
            ),
            AlgoInput(
                {
                    "alpha": 0.9,
                    "staleness": "hinge",
                    "a": 10,
                    "b": 2,
                    "staleness_offset": 1,
                },
                "hinge-literal-offset",
            ),
            # Literal Algorithm 1: a fresh update is weighted by s(1) = 2^-a < 1.
            AlgoInput(
                {"alpha": 0.9, "staleness": "poly", "a": 0.5, "staleness_offset": 1},
                "poly-literal-offset",
                fresh_is_sync=False,
            ),
            AlgoInput({"alpha": 0.9, "alpha_decay": 0.9}, "const-alpha-decay"),
            AlgoInput(
                {"alpha": 0.7, "staleness": "poly", "a": 1.0, "max_staleness": 2},
                "poly-max-staleness",
            ),
            AlgoInput(
                {
                    "alpha": 1.0,
                    "staleness": "hinge",
                    "a": 2.0,
                    "b": 1.0,
                    "staleness_offset": 1,
                    "alpha_decay": 0.95,
                    "max_staleness": 3,
                },
                "hinge-everything",
            ),
        ],
        error_inputs=[
            _refused({"alpha": 0.0}, "alpha"),
            _refused({"alpha": 1.5}, "alpha"),
            _refused({"alpha": -0.1}, "alpha"),
            _refused({"alpha": float("nan")}, "alpha"),
            _refused({"staleness": "linear"}, "staleness"),
            _refused({"staleness": "poly", "a": 0.0}, "a"),
            _refused({"staleness": "poly", "a": -1.0}, "a"),
            _refused({"staleness": "hinge", "b": -1.0}, "b"),
            _refused({"staleness": "hinge", "b": float("nan")}, "b"),
            _refused({"staleness_offset": 2}, "staleness_offset"),
            _refused({"staleness_offset": -1}, "staleness_offset"),
            _refused({"alpha_decay": 0.0}, "alpha_decay"),
            _refused({"alpha_decay": 1.1}, "alpha_decay"),
            _refused({"max_staleness": -1}, "max_staleness"),
        ],
    ),
    AlgoInfo(
        name="FedAvg",
        factory=_configured(FedAvg, FedAvgConfig),
        draw=_draw_round,
        apply=_apply_round,
        sync_kwargs={"server_lr": 1.0},
        inputs=[
            AlgoInput({}, "defaults"),
            AlgoInput({"weighting": "samples"}, "samples"),
            AlgoInput({"weighting": "uniform"}, "uniform"),
            AlgoInput({"weighting": "samples", "server_lr": 0.5}, "samples-lr0.5"),
            AlgoInput({"weighting": "uniform", "server_lr": 1.5}, "uniform-lr1.5"),
        ],
        error_inputs=[
            _refused({"server_lr": 0.0}, "server_lr"),
            _refused({"server_lr": -1.0}, "server_lr"),
            _refused({"server_lr": float("nan")}, "server_lr"),
            _refused({"weighting": "median"}, "weighting"),
        ],
    ),
    AlgoInfo(
        name="OptimizerConfig",
        factory=optimizer_config,
        inputs=[
            AlgoInput({}, "defaults"),
            AlgoInput({"name": "sgdm", "lr": 0.1, "momentum": 0.0}, "sgdm-momentum0"),
            AlgoInput(
                {"name": "adam", "lr": 1e-3, "beta1": 0.0, "beta2": 0.0}, "adam-betas0"
            ),
            AlgoInput({"name": "sgd", "weight_decay": 1e-4}, "sgd-wd"),
        ],
        error_inputs=[
            _err({"name": "rmsprop"}, r"Invalid optimizer: 'rmsprop'"),
            _refused({"lr": 0.0}, "lr"),
            _refused({"lr": -0.1}, "lr"),
            _refused({"lr": float("nan")}, "lr"),
            _refused({"lr": float("inf")}, "lr"),
            _refused({"name": "sgdm", "momentum": 1.0}, "momentum"),
            _refused({"name": "sgdm", "momentum": -0.5}, "momentum"),
            _refused({"name": "adam", "beta1": 1.0}, "beta1"),
            _refused({"name": "adam", "beta2": -0.1}, "beta2"),
            _refused({"name": "adam", "eps": 0.0}, "eps"),
            _refused({"name": "sgd", "momentum": 0.9}, "momentum"),  # sgd does not read it
            _refused({"weight_decay": -1e-4}, "weight_decay"),
        ],
    ),
    AlgoInfo(
        name="LocalConfig",
        factory=LocalConfig,
        inputs=[
            AlgoInput({}, "defaults"),
            AlgoInput({"steps": 1, "batch_size": 1}, "one-step"),
            AlgoInput({"steps": None, "epochs": 0.5}, "half-epoch"),
            AlgoInput({"steps": 5, "prox_mu": 0.01}, "prox"),
        ],
        error_inputs=[
            # the checks of LocalWorkKeys, the [client] keys LocalConfig is built from
            _err({"steps": 3, "epochs": 1.0}, r"local_steps=3, local_epochs=1\.0"),
            _err({"steps": 0}, r"\nlocal_steps\n  [^\n]*input_value=0,"),
            _err({"steps": -3}, r"\nlocal_steps\n  [^\n]*input_value=-3,"),
            _err({"steps": None, "epochs": 0.0}, r"\nlocal_epochs\n  [^\n]*input_value=0\.0,"),
            _err({"steps": None, "epochs": float("nan")},
                 r"\nlocal_epochs\n  [^\n]*input_value=nan,"),
            _err({"batch_size": 0}, r"\nbatch_size\n  [^\n]*input_value=0,"),
            _err({"prox_mu": -0.1}, r"Invalid prox_mu: -0\.1"),
            _err({"prox_mu": float("nan")}, r"Invalid prox_mu: nan"),
        ],
    ),
]


for _path in sorted(Path(__file__).parent.glob("registry_*.py")):
    ALGO_DB.extend(importlib.import_module(_path.stem).ENTRIES)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    names = metafunc.fixturenames
    if "algo_case" in names:
        cases = [(i, c) for i in ALGO_DB if i.apply is not None for c in i.inputs]
        metafunc.parametrize(
            "algo_case", cases, ids=[f"{i.name}-{c.desc}" for i, c in cases]
        )
    if "valid_case" in names:
        cases = [(i, c) for i in ALGO_DB for c in i.inputs]
        metafunc.parametrize(
            "valid_case", cases, ids=[f"{i.name}-{c.desc}" for i, c in cases]
        )
    if "error_case" in names:
        cases = [(i, e) for i in ALGO_DB for e in i.error_inputs]
        metafunc.parametrize(
            "error_case",
            cases,
            ids=[
                f"{i.name}-{'-'.join(f'{k}={v}' for k, v in e.kwargs.items())}"
                for i, e in cases
            ],
        )
