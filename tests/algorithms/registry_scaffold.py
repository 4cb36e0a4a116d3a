"""Registry entries for SCAFFOLD (fedsim.algorithms.scaffold).

``Scaffold.aggregate(x, results, delta_c)`` also takes the clients' control
updates; the adapter derives them from the drawn models (``delta_c_i =
(y_i - x) / 2``), so they are deterministic and poisoned with the model.
"""

from __future__ import annotations

import torch
from _registry import AlgoInfo, AlgoInput, _configured, _draw_round, _err, _refused

from fedsim.algorithms.scaffold import Scaffold, ScaffoldConfig
from fedsim.wire.messages import Update


def _apply_scaffold(rule: Scaffold, x: torch.Tensor, version: int, results: list[Update]):
    return rule.aggregate(x, results, [0.5 * (r.params - x) for r in results])


ENTRIES: list[AlgoInfo] = [
    AlgoInfo(
        name="Scaffold",
        factory=_configured(Scaffold, ScaffoldConfig, "total_clients"),
        draw=_draw_round,
        apply=_apply_scaffold,
        sync_kwargs={"server_lr": 1.0},
        inputs=[
            AlgoInput({"total_clients": 10}, "N10"),
            AlgoInput({"total_clients": 100, "server_lr": 0.5}, "N100-lr0.5"),
            AlgoInput({"total_clients": 5, "server_lr": 2.0}, "N5-lr2"),
        ],
        error_inputs=[
            _err({"total_clients": 0}, r"Invalid total_clients: 0"),
            _err({"total_clients": -3}, r"Invalid total_clients: -3"),
            _err({"total_clients": 2.5}, r"Invalid total_clients: 2\.5"),
            _err({"total_clients": True}, r"Invalid total_clients: True"),
            _refused({"total_clients": 10, "server_lr": 0.0}, "server_lr"),
            _refused({"total_clients": 10, "server_lr": -1.0}, "server_lr"),
            _refused({"total_clients": 10, "server_lr": float("nan")}, "server_lr"),
            _err({}, r"total_clients", TypeError),
        ],
    ),
]
