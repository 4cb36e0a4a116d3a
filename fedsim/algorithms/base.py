"""How a client's local run fails, shared by the algorithm modules.

(A task and an update are the wire's records, :class:`fedsim.wire.messages.Task`
and :class:`fedsim.wire.messages.Update`.)"""

from __future__ import annotations

__all__ = ["LocalRunFailed", "NonFiniteUpdate", "StepOverflow",
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
