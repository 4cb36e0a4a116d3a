"""Refusal: a well-formed message an actor will not take."""

from __future__ import annotations

__all__ = ["Refusal"]


class Refusal(Exception):
    """A decoded message that is not acceptable here (``reason`` is a stable code).

    Codes: ``unknown_client`` (a client message from a peer that does not run
    that client), ``unknown_task`` (an update of a task the server did not
    send to that client, or sent long ago), ``unexpected_kind`` (a message kind this actor never
    receives), ``out_of_order`` (a kind it does receive, but not now),
    ``shape_mismatch`` (a model of the wrong layout for its kind),
    ``unauthenticated`` (a connection that is not the one its host registered
    with), ``replay`` (a sequence number not above the sender's last),
    ``rate_limited`` (over ``deploy.max_host_rate``), ``bad_event`` (an
    event-log record a host may not write), ``refused`` (a host not let in),
    ``internal_error`` (a handler failed: a bug, logged with its traceback).
    The receiver counts it by code, logs it and goes on, as for a
    :class:`~fedsim.wire.errors.WireError`.
    """

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
