"""Registry entries for FedBuff (gathered by conftest.py).

The draw is the shared asynchronous one: one client's *local model*, made by
perturbing the current global model, with a base version up to 5 updates
old. FedBuff clients upload a delta, so ``_apply`` turns the model into its
update relative to the point the draw perturbed (the current ``x``); a real
client computes ``x_local - x_base`` itself. The delta is taken in float64
(:func:`pseudo_gradient`), so a fresh update with ``buffer_size = 1`` and
``server_lr = 1`` returns the client's model exactly.
"""

from __future__ import annotations

import torch
from _registry import AlgoInfo, AlgoInput, _configured, _draw_async, _refused

from fedsim.algorithms._kernels import pseudo_gradient
from fedsim.algorithms.fedbuff import FedBuff, FedBuffConfig


def _apply(rule: FedBuff, x: torch.Tensor, version: int, results):
    (result,) = results
    upload = result.with_params(pseudo_gradient(x, result.params))
    return rule.aggregate(x, version, upload)


ENTRIES = [
    AlgoInfo(
        name="FedBuff",
        factory=_configured(FedBuff, FedBuffConfig),
        draw=_draw_async,
        apply=_apply,
        sync_kwargs={"buffer_size": 1, "server_lr": 1.0},
        inputs=[
            AlgoInput({}, "defaults"),
            AlgoInput({"buffer_size": 1}, "k1"),
            AlgoInput({"buffer_size": 3, "server_lr": 0.5}, "k3-lr0.5"),
            AlgoInput({"buffer_size": 5, "staleness": "const"}, "k5-const"),
            AlgoInput({"buffer_size": 4, "staleness": "hinge", "a": 10.0, "b": 2.0}, "k4-hinge"),
            AlgoInput({"buffer_size": 2, "server_lr": 1.5, "max_staleness": 2}, "max-staleness"),
        ],
        error_inputs=[
            _refused({"buffer_size": 0}, "buffer_size"),
            _refused({"buffer_size": 2.5}, "buffer_size"),
            _refused({"server_lr": 0.0}, "server_lr"),
            _refused({"server_lr": float("nan")}, "server_lr"),
            _refused({"staleness": "exp"}, "staleness"),
            _refused({"a": 0.0}, "a"),
            _refused({"b": -1.0}, "b"),
            _refused({"max_staleness": -1}, "max_staleness"),
        ],
    )
]
