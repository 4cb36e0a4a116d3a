"""Registry entries for FedOpt (fedsim.algorithms.fedopt).

``FedOpt.aggregate(x, results)`` has FedAvg's signature and takes the
clients' models, so the shared round draw and apply fit. ``sync_kwargs``
(``server_lr = 1``, ``momentum = 0``) make FedAvgM plain FedAvg, which returns
one fresh result exactly; the adaptive rules divide by ``sqrt(v) + tau`` and
do not.
"""

from __future__ import annotations

from _registry import AlgoInfo, AlgoInput, _apply_round, _draw_round, _err

from fedsim.algorithms.fedopt import FedOpt

ENTRIES: list[AlgoInfo] = [
    AlgoInfo(
        name="FedOpt",
        factory=FedOpt,
        draw=_draw_round,
        apply=_apply_round,
        sync_kwargs={"server_lr": 1.0, "momentum": 0.0},
        inputs=[
            AlgoInput({"optimizer": "adam"}, "adam-defaults", fresh_is_sync=False),
            AlgoInput({"optimizer": "yogi"}, "yogi-defaults", fresh_is_sync=False),
            AlgoInput({"optimizer": "adagrad"}, "adagrad-defaults", fresh_is_sync=False),
            AlgoInput({"optimizer": "avgm"}, "avgm-defaults"),
            AlgoInput(
                {
                    "optimizer": "adam",
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
                {"optimizer": "yogi", "server_lr": 1.0, "tau": 1e-5, "weighting": "samples"},
                "yogi-tau1e-5-samples",
                fresh_is_sync=False,
            ),
            AlgoInput(
                {"optimizer": "adagrad", "beta1": 0.0, "tau": 1e-2},
                "adagrad-beta1-0",
                fresh_is_sync=False,
            ),
            AlgoInput({"optimizer": "avgm", "momentum": 0.0}, "avgm-momentum0"),
            AlgoInput(
                {"optimizer": "avgm", "server_lr": 0.5, "momentum": 0.99, "weighting": "samples"},
                "avgm-lr0.5-m0.99-samples",
            ),
        ],
        error_inputs=[
            _err({"optimizer": "sgd"}, r"Invalid optimizer: 'sgd'"),
            _err({"optimizer": "adam", "server_lr": 0.0}, r"Invalid server_lr: 0\.0"),
            _err({"optimizer": "avgm", "server_lr": -1.0}, r"Invalid server_lr: -1\.0"),
            _err({"optimizer": "yogi", "server_lr": float("nan")}, r"Invalid server_lr: nan"),
            _err({"optimizer": "adam", "server_lr": float("inf")}, r"Invalid server_lr: inf"),
            _err({"optimizer": "adam", "beta1": 1.0}, r"Invalid beta1: 1\.0"),
            _err({"optimizer": "adagrad", "beta1": -0.1}, r"Invalid beta1: -0\.1"),
            _err({"optimizer": "adam", "beta1": float("nan")}, r"Invalid beta1: nan"),
            _err({"optimizer": "yogi", "beta2": 1.0}, r"Invalid beta2: 1\.0"),
            _err({"optimizer": "adam", "beta2": -0.5}, r"Invalid beta2: -0\.5"),
            _err({"optimizer": "adam", "tau": 0.0}, r"Invalid tau: 0\.0"),
            _err({"optimizer": "yogi", "tau": -0.001}, r"Invalid tau: -0\.001"),
            _err({"optimizer": "adagrad", "tau": float("inf")}, r"Invalid tau: inf"),
            _err({"optimizer": "avgm", "momentum": 1.0}, r"Invalid momentum: 1\.0"),
            _err({"optimizer": "avgm", "momentum": -0.1}, r"Invalid momentum: -0\.1"),
            _err({"optimizer": "avgm", "momentum": float("nan")}, r"Invalid momentum: nan"),
            _err({"optimizer": "adam", "weighting": "median"}, r"Invalid weighting: 'median'"),
            _err({}, r"optimizer", TypeError),
        ],
    ),
]
