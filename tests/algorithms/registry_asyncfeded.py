"""Registry entries for AsyncFedED (gathered by conftest.py).

The draw is the shared asynchronous one: one client's *local model* near the
current global model, trained from a version up to 5 updates old. ``_apply``
plays the server and the client around the rule:

* the first call records the model the server starts from and holds it;
* the client's upload is its pseudo-gradient ``x_local - x_base``,
  with ``x_base`` taken from the rule's own history;
* after the update, the reply sends the newest model back (R-AF3), so that
  version is held; tasks older than the draw's window of 5 versions are
  abandoned and released, which keeps the history at most 7 models.

With ``lam == epsilon`` a fresh update has ``eta_g = 1`` and lands exactly on
the client's model, so every input passes the zero-staleness contract.
"""

from __future__ import annotations

import torch
from _registry import AlgoInfo, AlgoInput, _configured, _draw_async, _err, _refused
from pydantic import ValidationError

from fedsim.algorithms._kernels import pseudo_gradient
from fedsim.algorithms.asyncfeded import AsyncFedED, AsyncFedEDConfig

_WINDOW = 5  # the largest staleness _draw_async produces


def _apply(rule: AsyncFedED, x: torch.Tensor, version: int, results):
    (result,) = results
    if rule.history_size() == 0:
        rule.snapshot(version, x)
        rule.hold(version)
    base = x if result.base_version == version else rule.model(result.base_version)
    upload = result.with_params(pseudo_gradient(base, result.params))
    new, info = rule.aggregate(x, version, upload)
    now = version if new is None else version + 1
    if rule.refcount(now) == 0:
        rule.hold(now)
    for v in rule.versions():
        if v < now - _WINDOW and rule.refcount(v):
            rule.release(v)
    return new, info


ENTRIES = [
    AlgoInfo(
        name="AsyncFedED",
        factory=_configured(AsyncFedED, AsyncFedEDConfig),
        draw=_draw_async,
        apply=_apply,
        sync_kwargs={"lam": 1.0, "epsilon": 1.0},
        inputs=[
            AlgoInput({}, "defaults"),
            AlgoInput({"lam": 5.0, "epsilon": 5.0, "gamma_bar": 3.0, "kappa": 1.0}, "synthetic"),
            AlgoInput(
                {
                    "lam": 1.0,
                    "epsilon": 1.0,
                    "gamma_bar": 3.0,
                    "kappa": 0.05,
                    "k_rounding": "floor",
                },
                "femnist-floor",
            ),
            AlgoInput(
                {"lam": 5.0, "epsilon": 10.0, "gamma_bar": 3.0, "kappa": 1.0},
                "shakespeare",
            ),
            AlgoInput({"kappa": 0.0}, "constant-k"),
            AlgoInput({"gamma_bar": 0.1, "kappa": 0.5, "k_max": 12.0}, "k-max"),
            AlgoInput({"k_rounding": "ceil", "kappa": 0.3}, "ceil"),
            AlgoInput({"k_rounding": "round", "kappa": 0.7}, "round"),
            AlgoInput({"k_rounding": "trunc", "kappa": 0.7}, "trunc"),
            AlgoInput({"gamma_max": 0.5}, "gamma-max"),
            AlgoInput(
                {"k_unit": "steps", "reset_k_on_reconnect": True, "k_initial": 2.5},
                "steps-reset",
            ),
        ],
        error_inputs=[
            _refused({"lam": 0.0}, "lam"),
            _refused({"lam": -1.0}, "lam"),
            _refused({"lam": float("nan")}, "lam"),
            _refused({"epsilon": 0.0}, "epsilon"),
            _refused({"epsilon": float("inf")}, "epsilon"),
            _refused({"gamma_bar": -0.5}, "gamma_bar"),
            _refused({"gamma_bar": float("nan")}, "gamma_bar"),
            _refused({"kappa": -0.1}, "kappa"),
            _err({"k_initial": 0.5}, r"Invalid k_initial: 0\.5", ValidationError),
            _err({"k_initial": 20.0, "k_max": 15.0}, r"Invalid k_initial: 20\.0", ValidationError),
            _refused({"k_min": 0.0}, "k_min"),
            _err({"k_min": 5.0, "k_max": 4.0, "k_initial": 5.0}, r"Invalid k_max: 4\.0",
                 ValidationError),
            _err({"k_rounding": "floor", "k_initial": 7.5}, r"Invalid k_initial: 7\.5",
                 ValidationError),
            _refused({"k_rounding": "nearest"}, "k_rounding"),
            _refused({"k_unit": "passes"}, "k_unit"),
            _refused({"gamma_max": 0.0}, "gamma_max"),
            _refused({"zero_tol": -1e-9}, "zero_tol"),
        ],
    )
]
