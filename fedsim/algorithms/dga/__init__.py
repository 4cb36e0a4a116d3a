r"""DGA: Delayed Gradient Averaging, as a sans-I/O client and reducer.

Zhu, Lin, Lu, Lin and Han, "Delayed Gradient Averaging: Tolerate the
Communication Latency in Federated Learning" (NeurIPS 2021,
https://dga.hanlab.ai). No authors' code exists, so every choice below (the
``R-DG`` ids) rests on the paper alone; they are explained in docs/algorithms.md#dga.

Client ``i`` runs rounds of ``K`` local steps. With ``D = s K + r``,
``r in [1, K]`` (R-DG1; ``D = 0`` gives ``s = -1, r = K``, R-DG2)::

    u <- beta u + g ;  d = u (momentum) or g ;  m_t <- m_t + d      C6-C8
    at k == r of round t, t0 = t - 1 - s >= 1:
        w <- w - eta d + eta c_beta (m_{t0} - mbar_{t0})            C12-C13
    else:
        w <- w - eta d                                              C16
    after k == K: send (t, m_t), keep m_t, keep stepping            C17

``c_beta = (1 - beta^D) / (1 - beta)`` (R-DG3; 1 without momentum and for
``D <= 1``). The corrections cancel in the client mean, so
``mean_i w^i`` follows ``- (eta / N) sum_i d_i`` exactly (Lemma A.1).

:class:`DGAClient` is a state machine: three events (``step``, ``average``,
``sent``) and one query, ``next_action()`` -> :class:`Step` | :class:`Send` |
:class:`Wait` | :class:`Done`. :class:`DGAServer` reduces per-round sums.
"""

from __future__ import annotations

from fedsim.algorithms.api import AlgorithmSpec
from fedsim.algorithms.dga._client import (
    CLIENT_TRANSITIONS,
    Corrected,
    DGAClient,
    Done,
    Send,
    Step,
    Wait,
)
from fedsim.algorithms.dga._core import (
    DGAConfig,
    DGAKeys,
    DGAProtocolError,
    dga_c_beta,
    dga_correction,
    dga_direction,
    dga_final_average,
    dga_split_delay,
)
from fedsim.algorithms.dga._home import DGAClientWork, DGAFlow, DGAScenarioConfig, dga_config
from fedsim.algorithms.dga._reducer import DGAServer

SPEC = AlgorithmSpec(
    names=("dga",), config=DGAScenarioConfig,
    server=lambda cfg, ctx: DGAFlow(dga_config(cfg, ctx.local), ctx.x0, ctx.tasks),
    client=lambda cfg, ctx: DGAClientWork(dga_config(cfg, ctx.local), cfg.chunk_steps, ctx),
    summary="delayed gradient averaging: clients keep stepping while the average travels",
    optimizers=("sgd", "sgdm"))

__all__ = [
    "CLIENT_TRANSITIONS",
    "SPEC",
    "Corrected",
    "DGAClient",
    "DGAClientWork",
    "DGAConfig",
    "DGAFlow",
    "DGAKeys",
    "DGAProtocolError",
    "DGAScenarioConfig",
    "DGAServer",
    "Done",
    "Send",
    "Step",
    "Wait",
    "dga_c_beta",
    "dga_config",
    "dga_correction",
    "dga_direction",
    "dga_final_average",
    "dga_split_delay",
]
