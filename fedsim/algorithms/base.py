"""Plain values shared by the algorithm modules."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["ClientResult", "LocalRunFailed", "NonFiniteUpdate", "StepOverflow",
           "failure_cause"]


class NonFiniteUpdate(ValueError):
    """An update holds NaN or infinite values and must not be applied."""


class LocalRunFailed(RuntimeError):
    """A client's local run cannot produce a result.

    ``cause`` is how results count it (one of :data:`fedsim.wire.messages.FAILURE_CAUSES`).
    """

    cause = "error"


class StepOverflow(LocalRunFailed):
    """A step size beyond the range of the parameters' dtype (the step cannot be taken)."""

    cause = "overflow"


def failure_cause(exc: BaseException) -> str:
    """How a local run that raised ``exc`` is counted: ``overflow``, ``non_finite`` or
    ``error`` (:data:`fedsim.wire.messages.FAILURE_CAUSES`)."""
    if isinstance(exc, LocalRunFailed):
        return exc.cause
    if isinstance(exc, NonFiniteUpdate):
        return "non_finite"
    return "error"


@dataclass(frozen=True, slots=True)
class ClientResult:
    """What a client's local run hands to a server rule.

    Attributes
    ----------
    client : int
        Client id.
    base_version : int
        Version ``tau`` of the global model the run started from.
    params : torch.Tensor
        Flat float32 vector: the client's local model after its run
        (``x_{i,K}``), or whatever the algorithm's upload is.
    num_samples : int
        The client's number of training samples ``n_i``.
    steps : int
        Local steps actually taken.
    stats : Mapping[str, Any]
        Extra per-run statistics (loss, step sizes ...), logged as given.
    task_id : int or None
        Id of the task this result answers (None when not tracked).
    round : int
        The round the result belongs to (synchronous and pipelined rules).
    """

    client: int
    base_version: int
    params: torch.Tensor
    num_samples: int = 1
    steps: int = 0
    stats: Mapping[str, Any] = field(default_factory=dict)
    task_id: int | None = None
    round: int = 0
