"""Registry entries for DGA (gathered by conftest.py).

``DGAConfig`` takes part in the construction tests. ``DGAServer`` is the
reducer; the adapter reads the step's results as the round-``version``
reports of ``len(results)`` clients (their ``params`` are the clients' m)
and returns ``mbar`` as the new ``x``. The mean of one report is that
report, accumulated in float64, so the zero-staleness contract holds
exactly. The adapter validates every report (shape against ``x``, then the
reducer's own :meth:`DGAServer.check`) before adding any, so a poisoned
round leaves the reducer unchanged, as a real driver would by checking each
message on arrival.
"""

from __future__ import annotations

import torch
from _registry import AlgoInfo, AlgoInput, _draw_round, _err, _refused

from fedsim.algorithms._kernels import check_shape
from fedsim.algorithms.dga import DGAConfig, DGAServer


def _apply(rule: DGAServer, x: torch.Tensor, version: int, results):
    n = len(results)
    for r in results:
        check_shape(x, r.params, f"update from client {r.client}")
        rule.check(version, r.client, r.params, expected=n)
    mean = None
    for r in results:
        mean = rule.add(version, r.client, r.params, expected=n)
    return mean, {"round": version, "clients": [r.client for r in results]}


ENTRIES = [
    AlgoInfo(
        name="DGAServer",
        factory=DGAServer,
        draw=_draw_round,
        apply=_apply,
        inputs=[
            AlgoInput({}, "defaults"),
            AlgoInput({"num_clients": 4}, "n4-overridden"),
        ],
        error_inputs=[
            _err({"num_clients": 0}, r"Invalid num_clients: 0"),
            _err({"num_clients": 2.5}, r"Invalid num_clients: 2\.5"),
            _err({"num_clients": True}, r"Invalid num_clients: True"),
        ],
    ),
    AlgoInfo(
        name="DGAConfig",
        factory=DGAConfig,
        inputs=[
            AlgoInput({}, "defaults"),
            AlgoInput({"local_steps": 5, "delay": 0}, "fedavg-mode"),
            AlgoInput({"local_steps": 5, "delay": 20, "momentum": 0.9}, "paper-k5-d20"),
            AlgoInput({"delay": 3, "mode": "auto", "max_pending": 2}, "auto-cap2"),
            AlgoInput({"accumulate": "displacement", "c_beta": 1.0}, "displacement"),
            AlgoInput({"correction": "none", "rounds": 10}, "no-correction"),
            AlgoInput({"correction": "overwrite", "lr": 2}, "overwrite"),
        ],
        error_inputs=[
            _refused({"local_steps": 0}, "local_steps"),
            _refused({"local_steps": 2.0}, "local_steps"),
            _refused({"delay": -1}, "delay"),
            _refused({"lr": 0.0}, "lr"),
            _refused({"lr": float("nan")}, "lr"),
            _refused({"lr": float("inf")}, "lr"),
            _refused({"momentum": 1.0}, "momentum"),
            _refused({"momentum": -0.1}, "momentum"),
            _refused({"mode": "eager"}, "mode"),
            _refused({"accumulate": "mean"}, "accumulate"),
            _refused({"correction": "partial"}, "correction"),
            _refused({"c_beta": "auto"}, "c_beta"),
            _refused({"c_beta": 0.0}, "c_beta"),
            _refused({"c_beta": float("nan")}, "c_beta"),
            _refused({"max_pending": 0}, "max_pending"),
            _refused({"rounds": 0}, "rounds"),
        ],
    ),
]
