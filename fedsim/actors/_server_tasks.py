"""The server's record of the tasks it sent: what an update may claim about time and version.

An update names the task it answers (``task_id``); everything else the
server needs to apply it comes from this record, never from the update:
the base version (the version the task was sent with), for a task answered
by one upload its round, and the earliest emulated time the update can
have been sent. That time is the task's emulated delivery at the client
(the server's copy of the client's downlink schedules each message as the
host's link does: the same netem link, seed and send times, so slow start
after idle, queueing and jitter are included; where the copy no longer
matches the host's, the server's send time plus the least the downlink
can take, :meth:`~fedsim.scenario.network.NetPlan.least_transfer`) plus the least compute time
of the work before the upload on the client's device
(:meth:`~fedsim.scenario.network.NetPlan.least_compute`; the steps from the task's
budget on the client's sample count in the server's record, and
:meth:`~fedsim.algorithms.api.ServerAlgorithm.least_steps` for a pipelined
session's later rounds). An honest client cannot send earlier: its
downlink delivers the task no sooner, its device computes no faster, and
its own clock's offset does not enter (it stamps the task's delivery and
its deadline from the server's send time). Nothing a host reports about
its clock widens the bound.

Each client keeps its last :data:`KEPT` tasks (an update of an older one
is refused as ``unknown_task``). Pure bookkeeping: no socket, no clock.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

__all__ = ["KEPT", "TOLERANCE", "TaskBook", "TaskRecord"]

#: tasks kept per client: a client answers its tasks in order, and one that
#: is sent a new task while it still works on an old one (a timeout, a
#: rejoin) answers both
KEPT = 8

#: emulated seconds a claimed send time may be below the bound without being
#: corrected: the bound and the client's own deadline are the same sums in
#: another order, equal up to rounding
TOLERANCE = 1e-6


@dataclass(frozen=True, slots=True)
class TaskRecord:
    """One task as the server sent it.

    ``delivered`` is its emulated delivery at the client (or the earliest
    possible one: see the module docstring), ``steps``
    the local steps of its work (its budget on the client's sample count).
    """

    task_id: int
    version: int
    round: int
    delivered: float
    steps: int


class TaskBook:
    """The tasks sent to each client, its last :data:`KEPT`."""

    def __init__(self) -> None:
        self._tasks: dict[int, deque[TaskRecord]] = {}

    def sent(self, client: int, record: TaskRecord) -> None:
        """Note a task sent to ``client``."""
        kept = self._tasks.get(client)
        if kept is None:
            kept = self._tasks[client] = deque(maxlen=KEPT)
        kept.append(record)

    def find(self, client: int, task_id: int) -> TaskRecord | None:
        """The task ``task_id`` sent to ``client`` (None: not sent to it, or long ago)."""
        for r in reversed(self._tasks.get(client, ())):
            if r.task_id == task_id:
                return r
        return None

    def __len__(self) -> int:
        return sum(len(v) for v in self._tasks.values())
