"""Refusal: a well-formed message an actor will not take."""

from __future__ import annotations

__all__ = ["Refusal"]


class Refusal(Exception):
    """A decoded message that is not acceptable here (``reason`` is a stable code).

    Codes: ``unknown_client`` (a client message from a peer that does not run
    that client), ``unexpected_kind`` (a message kind this actor never
    receives), ``shape_mismatch`` (a model of the wrong layout for its kind).
    The receiver counts it by code, logs it and goes on, as for a
    :class:`~fedsim.messages.WireError`.
    """

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
