r"""FedBuff: buffered asynchronous aggregation.

Implementation of Nguyen, Malik, Zhan, Yousefpour, Rabbat, Malek and Huba,
"Federated Learning with Buffered Asynchronous Aggregation", AISTATS 2022
(https://arxiv.org/abs/2106.06639), Algorithm 1; docs/algorithms.md#fedbuff.

Each client trains from the global model ``x_tau`` (version ``tau``) and
uploads ``Delta_i = x_local - x_tau`` (the paper's ``y_0 - y_Q`` with the
sign flipped, so the server adds it). The server, at version ``t``, buffers
updates until it holds ``K`` of them, then takes one step::

    d_i  = t - tau_i                         staleness (0 for a fresh update)
    s_i  = s(d_i)                            default 1 / sqrt(1 + d_i)  (poly, a = 1/2)
    acc <- acc + s_i * Delta_i               per arrival, in float64
    when K updates are buffered:
        x   <- x + eta_g * acc / K           (the mean of the weighted deltas)
        acc <- 0 ;  t <- t + 1

``s`` is FedAsync's staleness function (``const``, ``poly``, ``hinge``,
:func:`fedsim.algorithms.fedasync.staleness_weight`). The global model and its
version change only at a flush, so every buffered update's staleness is
measured against the same ``t``. The buffer is stored as its running float64
sum (the only thing the step uses) plus one small record per update.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from fedsim.algorithms._kernels import check_async_update, check_shape, pack_tensor, unpack_tensor
from fedsim.algorithms.api import AlgorithmSpec, ServerContext
from fedsim.algorithms.fedasync import StalenessFn, StalenessKeys, staleness_weight
from fedsim.algorithms.flows import AsyncConfig, AsyncFlow, AsyncRule
from fedsim.algorithms.sgdclient import local_sgd_client
from fedsim.lazy import lazy_module
from fedsim.schema import AtLeastOne, FinitePos
from fedsim.wire.messages import Update

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch")

__all__ = ["SPEC", "FedBuff", "FedBuffConfig", "fedbuff_step"]


def fedbuff_step(x: torch.Tensor, acc: torch.Tensor, count: int, server_lr: float) -> torch.Tensor:
    """Return ``x + server_lr * acc / count`` in float64, cast to ``x``'s dtype.

    ``acc`` is the sum of the staleness-weighted deltas of ``count`` updates.
    """
    if count < 1:
        raise ValueError(f"Invalid count: {count} (must be >= 1)")
    f64 = torch.float64
    return x.to(f64).add(acc.to(f64), alpha=float(server_lr) / count).to(x.dtype)


class FedBuffConfig(StalenessKeys, AsyncConfig):
    """``[algorithm]`` of FedBuff: buffered asynchronous aggregation.

    ``staleness``, ``a``, ``b`` and ``max_staleness`` are FedAsync's
    (:class:`~fedsim.algorithms.fedasync.StalenessKeys`), but ``staleness``
    defaults to ``poly`` (with ``a = 0.5``: the paper's ``1 / sqrt(1 + d)``);
    an update over ``max_staleness`` is discarded without being buffered.

    Attributes
    ----------
    buffer_size : int
        ``K``, the number of updates per server step (>= 1; 1 makes FedBuff
        an asynchronous server-lr rule with no buffering). The paper uses 10.
    server_lr : float
        ``eta_g`` (> 0, finite).
    """

    name: Literal["fedbuff"] = "fedbuff"
    staleness: StalenessFn = "poly"
    buffer_size: AtLeastOne = 4
    server_lr: FinitePos = 1.0


class FedBuff(AsyncRule):
    """FedBuff server rule: average every ``buffer_size`` weighted deltas.

    Its parameters are ``cfg``'s (:class:`FedBuffConfig`); the buffer is its state.
    """

    def __init__(self, cfg: FedBuffConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.flushes = 0
        self._acc: torch.Tensor | None = None
        self._entries: list[tuple[int, int, float]] = []  # (client, staleness, weight)

    takes = "delta"

    def weight(self, d: int) -> float:
        """Return ``s(d)``, the weight of an update with staleness ``d``."""
        return staleness_weight(self.cfg.staleness, d, self.cfg.a, self.cfg.b)

    def buffered(self) -> int:
        """Return the number of updates waiting in the buffer."""
        return len(self._entries)

    def aggregate(
        self, x: torch.Tensor, version: int, result: Update
    ) -> tuple[torch.Tensor | None, dict[str, Any]]:
        """Buffer one client's delta; step when the buffer holds ``buffer_size``.

        ``result.params`` is ``Delta = x_local - x_base`` (any float dtype;
        see :func:`fedsim.algorithms.asyncfeded.pseudo_gradient`), and
        ``result.base_version`` the version it was trained from. Returns the
        new global vector on a flush (the caller bumps the version), else
        ``None``. Info: ``staleness``, ``weight`` and ``buffered`` (updates
        waiting after this call); a flush adds ``clients`` and
        ``stalenesses`` of the applied updates; a ``max_staleness`` discard
        adds ``discarded: True``.

        Raises
        ------
        NonFiniteUpdate
            If ``Delta`` holds NaN or infinite values; the buffer is untouched.
        """
        delta = result.params
        d = check_async_update(x, result, version)
        if self._acc is not None:
            check_shape(x, self._acc, "buffer (the model changed shape mid-buffer)")
        if self.cfg.max_staleness is not None and d > self.cfg.max_staleness:
            return None, {
                "staleness": d,
                "weight": 0.0,
                "buffered": self.buffered(),
                "discarded": True,
            }
        w = self.weight(d)
        term = delta.to(torch.float64) * w
        acc = term if self._acc is None else self._acc + term
        entries = [*self._entries, (result.client, d, w)]
        if len(entries) < self.cfg.buffer_size:
            self._acc, self._entries = acc, entries
            return None, {"staleness": d, "weight": w, "buffered": len(entries)}
        new = fedbuff_step(x, acc, len(entries), self.cfg.server_lr)
        self._acc, self._entries = None, []
        self.flushes += 1
        return new, {
            "staleness": d,
            "weight": w,
            "buffered": 0,
            "clients": [c for c, _, _ in entries],
            "stalenesses": [s for _, s, _ in entries],
        }

    def state_dict(self) -> dict[str, Any]:
        """Return the rule's mutable state, buffer included, as comparable data."""
        return {
            "flushes": self.flushes,
            "acc": None if self._acc is None else pack_tensor(self._acc),
            "entries": [tuple(e) for e in self._entries],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore state saved by :meth:`state_dict`."""
        entries = [(int(c), int(d), float(w)) for c, d, w in state["entries"]]
        acc = None if state["acc"] is None else unpack_tensor(state["acc"])
        size = self.cfg.buffer_size
        if (acc is None) != (not entries) or len(entries) >= size:
            raise ValueError(
                f"Invalid buffer in state: {len(entries)} entries "
                f"(buffer_size {size}), sum {'absent' if acc is None else 'present'}"
            )
        if acc is not None and not bool(torch.isfinite(acc).all()):
            raise ValueError("Invalid buffer in state: non-finite sum")
        self.flushes = int(state["flushes"])
        self._acc, self._entries = acc, entries


def _server(cfg: FedBuffConfig, ctx: ServerContext) -> AsyncFlow:
    return AsyncFlow(FedBuff(cfg), cfg, ctx)


SPEC = AlgorithmSpec(
    names=("fedbuff",), config=FedBuffConfig, server=_server, client=local_sgd_client,
    summary="buffered asynchronous aggregation of staleness-weighted deltas")
