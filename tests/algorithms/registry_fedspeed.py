"""Registry entries for FedSpeed (fedsim.algorithms.fedspeed).

``FedSpeedServer.aggregate(x, results)`` has FedAvg's signature, so the shared
round draw and apply fit. The FL-Simulator aggregation adds the mean of every
client's ``h_i`` to the average, so one fresh result is not returned as is.
"""

from __future__ import annotations

from _registry import AlgoInfo, AlgoInput, _apply_round, _configured, _draw_round, _err, _refused

from fedsim.algorithms.fedspeed import FedSpeedConfig, FedSpeedScenarioConfig, FedSpeedServer

ENTRIES: list[AlgoInfo] = [
    AlgoInfo(
        name="FedSpeedServer",
        factory=_configured(FedSpeedServer, FedSpeedScenarioConfig, "total_clients"),
        draw=_draw_round,
        apply=_apply_round,
        sync_kwargs={"server_lr": 1.0},
        inputs=[
            AlgoInput({}, "defaults"),
            AlgoInput({"weighting": "samples"}, "samples"),
            AlgoInput({"server_lr": 0.5}, "lr0.5"),
            AlgoInput(
                {"server_rule": "fl_simulator", "total_clients": 10},
                "fl-simulator",
                fresh_is_sync=False,
            ),
            # the authors' rule averages uniformly (FedSpeedScenarioConfig refuses
            # weighting = "samples" beside it)
            AlgoInput(
                {"server_rule": "fl_simulator", "total_clients": 12, "server_lr": 1.5},
                "fl-simulator-lr1.5",
                fresh_is_sync=False,
            ),
        ],
        error_inputs=[
            _refused({"server_lr": 0.0}, "server_lr"),
            _refused({"server_lr": float("nan")}, "server_lr"),
            _refused({"server_lr": float("inf")}, "server_lr"),
            _refused({"weighting": "median"}, "weighting"),
            _refused({"server_rule": "feddyn"}, "server_rule"),
            _err({"server_rule": "fl_simulator"}, r"Invalid total_clients: None"),
            _err({"total_clients": 0}, r"Invalid total_clients: 0"),
        ],
    ),
    AlgoInfo(
        name="FedSpeedConfig",
        factory=FedSpeedConfig,
        inputs=[
            AlgoInput({}, "defaults"),
            AlgoInput({"perturb_alpha": 1.0}, "fl-simulator-alpha1"),
            AlgoInput({"ascent_mode": "constant", "ascent_rho": 0.05}, "constant-rho"),
            AlgoInput({"prox": False, "correction": False, "perturbation": False}, "fedavg"),
            AlgoInput({"correction": False, "perturbation": False}, "fedprox"),
            AlgoInput({"clip_norm": 10.0, "upload": "local"}, "fl-simulator-clip"),
            AlgoInput({"ascent_rho": 0.0, "perturb_alpha": 0.0}, "zero-ascent"),
        ],
        error_inputs=[
            _refused({"prox_lambda": 0.0}, "prox_lambda"),
            _refused({"prox_lambda": -10.0}, "prox_lambda"),
            _refused({"prox_lambda": float("inf")}, "prox_lambda"),
            _refused({"prox_lambda": float("nan")}, "prox_lambda"),
            _refused({"perturb_alpha": 1.5}, "perturb_alpha"),
            _refused({"perturb_alpha": -0.1}, "perturb_alpha"),
            _refused({"perturb_alpha": float("nan")}, "perturb_alpha"),
            _refused({"ascent_rho": -0.1}, "ascent_rho"),
            _refused({"ascent_rho": float("nan")}, "ascent_rho"),
            _refused({"ascent_mode": "adaptive"}, "ascent_mode"),
            _refused({"ascent_eps": 0.0}, "ascent_eps"),
            _refused({"prox": 1}, "prox"),
            _refused({"perturbation": "yes"}, "perturbation"),
            _refused({"clip_norm": 0.0}, "clip_norm"),
            _refused({"upload": "delta"}, "upload"),
        ],
    ),
]
