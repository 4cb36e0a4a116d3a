"""Registry entries for FedOpt (fedsim.algorithms.fedopt).

``FedOpt.aggregate(x, results)`` has FedAvg's signature and takes the
clients' models, so the shared round draw and apply fit. ``sync_kwargs``
(``server_lr = 1``, ``momentum = 0``) make FedAvgM plain FedAvg, which returns
one fresh result exactly; the adaptive rules divide by ``sqrt(v) + tau`` and
do not.
"""

from __future__ import annotations

from _registry import (
    AlgoInfo,
    AlgoInput,
    ErrorInput,
    _apply_round,
    _configured,
    _draw_round,
    _refused,
)
from pydantic import ValidationError

from fedsim.algorithms.fedopt import FedOpt, FedOptConfig

ENTRIES: list[AlgoInfo] = [
    AlgoInfo(
        name="FedOpt",
        factory=_configured(FedOpt, FedOptConfig),
        draw=_draw_round,
        apply=_apply_round,
        sync_kwargs={"server_lr": 1.0, "momentum": 0.0},
        inputs=[
            AlgoInput({"name": "fedadam"}, "adam-defaults", fresh_is_sync=False),
            AlgoInput({"name": "fedyogi"}, "yogi-defaults", fresh_is_sync=False),
            AlgoInput({"name": "fedadagrad"}, "adagrad-defaults", fresh_is_sync=False),
            AlgoInput({"name": "fedavgm"}, "avgm-defaults"),
            AlgoInput(
                {
                    "name": "fedadam",
                    "server_lr": 0.01,
                    "beta1": 0.0,
                    "beta2": 0.0,
                    "tau": 0.1,
                    "weighting": "samples",
                },
                "adam-betas0-samples",
                fresh_is_sync=False,
            ),
            AlgoInput(
                {"name": "fedyogi", "server_lr": 1.0, "tau": 1e-5, "weighting": "samples"},
                "yogi-tau1e-5-samples",
                fresh_is_sync=False,
            ),
            AlgoInput(
                {"name": "fedadagrad", "beta1": 0.0, "tau": 1e-2},
                "adagrad-beta1-0",
                fresh_is_sync=False,
            ),
            AlgoInput({"name": "fedavgm", "momentum": 0.0}, "avgm-momentum0"),
            AlgoInput(
                {"name": "fedavgm", "server_lr": 0.5, "momentum": 0.99, "weighting": "samples"},
                "avgm-lr0.5-m0.99-samples",
            ),
        ],
        error_inputs=[
            _refused({"name": "fedsgd"}, "name"),
            _refused({"name": "fedadam", "server_lr": 0.0}, "server_lr"),
            _refused({"name": "fedavgm", "server_lr": -1.0}, "server_lr"),
            _refused({"name": "fedyogi", "server_lr": float("nan")}, "server_lr"),
            _refused({"name": "fedadam", "server_lr": float("inf")}, "server_lr"),
            _refused({"name": "fedadam", "beta1": 1.0}, "beta1"),
            _refused({"name": "fedadagrad", "beta1": -0.1}, "beta1"),
            _refused({"name": "fedadam", "beta1": float("nan")}, "beta1"),
            _refused({"name": "fedyogi", "beta2": 1.0}, "beta2"),
            _refused({"name": "fedadam", "beta2": -0.5}, "beta2"),
            _refused({"name": "fedadam", "tau": 0.0}, "tau"),
            _refused({"name": "fedyogi", "tau": -0.001}, "tau"),
            _refused({"name": "fedadagrad", "tau": float("inf")}, "tau"),
            _refused({"name": "fedavgm", "momentum": 1.0}, "momentum"),
            _refused({"name": "fedavgm", "momentum": -0.1}, "momentum"),
            _refused({"name": "fedavgm", "momentum": float("nan")}, "momentum"),
            _refused({"name": "fedadam", "weighting": "median"}, "weighting"),
            # the server optimizer is the config's name: it has no default
            ErrorInput({}, ValidationError, r"\nname\n  Field required"),
        ],
    ),
]
