"""What the server actor's event queue carries: one frozen value per kind of item.

:class:`~fedsim.actors.server.Server` takes them off its queue one at a time
and dispatches on their type (``match``), so every decision is made in one
place and in one order; the reader, the timers and the outside world only
put items on the queue.
"""

from __future__ import annotations

from dataclasses import dataclass

from fedsim.actors._server_tasks import TaskRecord
from fedsim.wire.messages import Failed, Leave, Ready, Update

__all__ = ["AlgorithmTimer", "ClientMessage", "EvalTimer", "FromClient", "HostExited",
           "HostJoined", "Item", "StopRun", "Tick", "Wake"]

#: what a client sends the server (through its emulated uplink)
ClientMessage = Update | Ready | Failed | Leave


@dataclass(frozen=True, slots=True)
class FromClient:
    """A client's message, delivered by its emulated uplink.

    ``queued`` is when it was put on the queue (``time.perf_counter()``; None
    for a message the server made up itself): the server's queueing phase is
    the real time from then until its loop takes the message. ``task`` is
    the server's record of the task an update answers.
    """

    client: int
    msg: ClientMessage
    queued: float | None = None
    task: TaskRecord | None = None


@dataclass(frozen=True, slots=True)
class AlgorithmTimer:
    """A deadline the algorithm asked for (``next_timer``) has come."""

    at: float


@dataclass(frozen=True, slots=True)
class Wake:
    """The algorithm asked, from another thread, to be looked at (its ``timer``)."""


@dataclass(frozen=True, slots=True)
class EvalTimer:
    """Time to evaluate the global model (every ``eval.every_seconds``)."""

    period: float


@dataclass(frozen=True, slots=True)
class StopRun:
    """End the run (a time budget, the target accuracy, Ctrl-C)."""

    reason: str


@dataclass(frozen=True, slots=True)
class HostExited:
    """A client host is gone (its process ended, it went silent, it restarted)."""

    host: str
    why: str
    #: its clients, when the host table already marked it lost (a restart)
    clients: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class HostJoined:
    """A lost client host registered again after the start: its clients rejoin."""

    host: str


@dataclass(frozen=True, slots=True)
class Tick:
    """Half a real second passed: report progress, flush the logs."""


#: every item the queue carries
Item = (FromClient | AlgorithmTimer | Wake | EvalTimer | StopRun | HostExited | HostJoined
        | Tick)

