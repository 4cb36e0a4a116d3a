"""Registry entries for the adaptive client optimizers' config (deltasgd, adagrad, sps)."""

from __future__ import annotations

import math

from _registry import AlgoInfo, AlgoInput, _err, _refused

from fedsim.algorithms.optim import optimizer_config

ENTRIES: list[AlgoInfo] = [
    AlgoInfo(
        name="OptimizerConfig-adaptive",
        factory=optimizer_config,
        inputs=[
            AlgoInput({"name": "deltasgd"}, "deltasgd-defaults"),
            AlgoInput(
                {"name": "deltasgd", "theta0": math.inf, "first_step": "code"},
                "deltasgd-code-theta-inf",
            ),
            AlgoInput(
                {
                    "name": "deltasgd",
                    "eta0": 0.05,
                    "gamma": 1.0,
                    "delta": 0.0,
                    "lr_eps": 0.0,
                    "eta_max": 2.0,
                    "batch_mode": "previous",
                    "mask_mode": "shared",
                },
                "deltasgd-everything",
            ),
            AlgoInput({"name": "adagrad", "lr": 0.01}, "adagrad"),
            AlgoInput(
                {"name": "adagrad", "initial_accumulator": 0.1, "adagrad_eps": 1e-8},
                "adagrad-accumulator",
            ),
            AlgoInput({"name": "sps"}, "sps-defaults"),
            AlgoInput(
                {"name": "sps", "sps_c": 0.2, "f_star": -1.0, "eta_max": 10.0},
                "sps-max",
            ),
            AlgoInput(
                {"name": "sps", "sps_mode": "smooth", "sps_eta0": 0.5, "sps_n_batches": 8},
                "sps-smooth",
            ),
        ],
        error_inputs=[
            _err({"name": "delta-sgd"}, r"Invalid optimizer: 'delta-sgd'"),
            _refused({"name": "adagrad", "initial_accumulator": -0.1}, "initial_accumulator"),
            _refused({"name": "adagrad", "adagrad_eps": 0.0}, "adagrad_eps"),
            _refused({"name": "deltasgd", "eta0": 0.0}, "eta0"),
            _refused({"name": "deltasgd", "eta0": math.inf}, "eta0"),
            _refused({"name": "deltasgd", "theta0": 0.0}, "theta0"),
            _refused({"name": "deltasgd", "theta0": math.nan}, "theta0"),
            _refused({"name": "deltasgd", "gamma": -2.0}, "gamma"),
            _refused({"name": "deltasgd", "delta": -0.1}, "delta"),
            _refused({"name": "deltasgd", "delta": math.inf}, "delta"),
            _refused({"name": "deltasgd", "lr_eps": -1e-8}, "lr_eps"),
            _refused({"name": "deltasgd", "eta_max": 0.0}, "eta_max"),
            _refused({"name": "deltasgd", "eta_max": math.nan}, "eta_max"),
            _refused({"name": "deltasgd", "first_step": "auto"}, "first_step"),
            _refused({"name": "deltasgd", "batch_mode": "different"}, "batch_mode"),
            _refused({"name": "deltasgd", "mask_mode": "forked"}, "mask_mode"),
            _refused({"name": "sps", "sps_c": 0.0}, "sps_c"),
            _refused({"name": "sps", "f_star": math.inf}, "f_star"),
            _refused({"name": "sps", "sps_mode": "smooth_iter"}, "sps_mode"),
            _refused({"name": "sps", "sps_eta0": -1.0}, "sps_eta0"),
            _refused({"name": "sps", "sps_n_batches": 0}, "sps_n_batches"),
            _refused({"name": "sps", "eta_max": math.nan}, "eta_max"),
            _refused({"name": "deltasgd", "lr": 0.1}, "lr"),  # deltasgd picks its own step
        ],
    ),
]
