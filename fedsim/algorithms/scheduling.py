"""Who trains when: the server's schedulers, sans-I/O.

Both schedulers are driven by plain calls carrying the emulated time; they
return decisions (which clients to dispatch, whether a round is complete)
and never wait. Client sessions and synchronous rounds follow transition
tables, as h11 writes its state machines: an illegal event raises
:class:`SchedulerError` naming the event, the actor and the state.
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

__all__ = [
    "CLIENT_TRANSITIONS",
    "ROUND_TRANSITIONS",
    "AsyncScheduler",
    "ClientTable",
    "RoundPlan",
    "RoundScheduler",
    "SchedulerError",
]


class SchedulerError(RuntimeError):
    """An event arrived that the current state cannot handle."""


# state -> {event: next state}
CLIENT_TRANSITIONS: dict[str, dict[str, str]] = {
    "idle": {"dispatch": "training", "suspend": "suspended", "lose": "lost"},
    "training": {
        "result": "idle",
        "timeout": "idle",
        "ready": "idle",
        "suspend": "suspended",
        "lose": "lost",
    },
    "suspended": {"ready": "idle", "lose": "lost", "suspend": "suspended"},
    "lost": {"ready": "idle", "lose": "lost"},
}

ROUND_TRANSITIONS: dict[str, dict[str, str]] = {
    "closed": {"open": "collecting"},
    "collecting": {"result": "collecting", "complete": "closed", "abandon": "closed"},
}


class _States(dict[int, str]):
    """client -> session state, keeping each state's clients in a sorted list.

    An asynchronous flow asks for the idle clients on every event; sorting
    them out of the whole table each time cost O(N log N) per event (5 ms
    at 10,000 clients, most of the server's time). Writes go through
    ``table[c] = s`` (and ``del``), which keep the lists in step with the
    table; the dict's other mutators are refused.
    """

    __slots__ = ("members",)

    def __init__(self) -> None:
        super().__init__()
        self.members: dict[str, list[int]] = {}

    def __setitem__(self, client: int, state: str) -> None:
        old = self.get(client)
        if old == state:
            return
        if old is not None:
            self._drop(client, old)
        bisect.insort(self.members.setdefault(state, []), client)
        super().__setitem__(client, state)

    def __delitem__(self, client: int) -> None:
        self._drop(client, self[client])
        super().__delitem__(client)

    def _drop(self, client: int, state: str) -> None:
        members = self.members[state]
        del members[bisect.bisect_left(members, client)]

    def _refused(self, *args: object, **kwargs: object) -> None:
        raise TypeError("a client table is changed by table[client] = state or del only")

    pop = popitem = clear = update = setdefault = __ior__ = _refused  # type: ignore[assignment]


class ClientTable:
    """Session state of every known client (idle, training, suspended, lost)."""

    def __init__(self) -> None:
        self.state = _States()

    def add(self, client: int) -> None:
        """Register a client as idle (a reconnecting client becomes idle)."""
        if self.state.get(client) in (None, "lost", "suspended"):
            self.state[client] = "idle"

    def fire(self, client: int, event: str) -> str:
        """Apply ``event`` to ``client`` and return its new state."""
        current = self.state.get(client)
        if current is None:
            raise SchedulerError(f"can't handle event {event!r} for unknown client {client}")
        nxt = CLIENT_TRANSITIONS[current].get(event)
        if nxt is None:
            raise SchedulerError(
                f"can't handle event {event!r} when client={client} and state={current!r}"
            )
        self.state[client] = nxt
        return nxt

    def in_state(self, state: str) -> list[int]:
        """Clients currently in ``state``, sorted (deterministic order); a copy.

        O(clients in that state), not O(all clients): the table keeps each
        state's clients sorted as it changes.
        """
        return list(self.state.members.get(state, ()))

    def view(self, state: str) -> Sequence[int]:
        """Clients currently in ``state``, sorted: the table's own list, not a copy
        (read it before the next change; never modify it)."""
        return self.state.members.get(state, ())

    def count(self, state: str) -> int:
        """How many clients are in ``state``."""
        return len(self.state.members.get(state, ()))


@dataclass(frozen=True, slots=True)
class RoundPlan:
    """A synchronous round: who was asked and how many results close it."""

    round: int
    selected: tuple[int, ...]
    needed: int
    deadline_at: float | None


@dataclass(slots=True)
class _Round:
    plan: RoundPlan
    results: list[int] = field(default_factory=list)
    dropped: set[int] = field(default_factory=set)


class RoundScheduler:
    """Synchronous rounds with client sampling, over-selection and a deadline.

    Parameters
    ----------
    fraction : float
        Fraction of all clients that a round needs (``m = ceil(fraction N)``,
        at least ``min_clients``).
    over_selection : float
        Ask ``ceil(m (1 + over_selection))`` clients and close the round on the
        first ``m`` results (Bonawitz et al.'s over-selection).
    deadline : float or None
        Emulated seconds after opening at which a round closes with whatever
        arrived (``None``: wait for every selected client; the paper-faithful
        mode, docs/algorithms.md#rounds-without-a-deadline-wait-for-suspended-clients).
    seed : int
        Seed of the scheduler's own sampling stream.
    """

    def __init__(
        self,
        fraction: float = 1.0,
        *,
        min_clients: int = 1,
        over_selection: float = 0.0,
        deadline: float | None = None,
        seed: int = 0,
    ) -> None:
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"Invalid fraction: {fraction} (must be in (0, 1])")
        if not over_selection >= 0:
            raise ValueError(f"Invalid over_selection: {over_selection} (must be >= 0)")
        if deadline is not None and not deadline > 0:
            raise ValueError(f"Invalid deadline: {deadline} (must be > 0 or None)")
        self.fraction = fraction
        self.min_clients = max(1, min_clients)
        self.over_selection = over_selection
        self.deadline = deadline
        self.rng = random.Random(seed)
        self.state = "closed"
        self.round = 0
        self.current: _Round | None = None

    def _fire(self, event: str) -> None:
        nxt = ROUND_TRANSITIONS[self.state].get(event)
        if nxt is None:
            raise SchedulerError(
                f"can't handle event {event!r} when role=round {self.round} "
                f"and state={self.state!r}"
            )
        self.state = nxt

    def open_round(self, now: float, available: Iterable[int], total: int) -> RoundPlan:
        """Open the next round over the ``available`` clients."""
        pool = sorted(available)
        if not pool:
            raise SchedulerError(f"can't open round {self.round + 1}: no client available")
        self._fire("open")
        self.round += 1
        # ceil with a tolerance: 0.07 * 100 is 7.000000000000001 in floats
        m = max(self.min_clients, math.ceil(self.fraction * total - 1e-9))
        ask = min(len(pool), math.ceil(m * (1.0 + self.over_selection) - 1e-9))
        selected = tuple(sorted(self.rng.sample(pool, ask)))
        deadline_at = None if self.deadline is None else now + self.deadline
        plan = RoundPlan(self.round, selected, min(m, ask), deadline_at)
        self.current = _Round(plan)
        return plan

    def on_result(self, round_: int, client: int) -> bool:
        """Count a result; return True if it belongs to the open round."""
        cur = self.current
        if (
            self.state != "collecting"
            or cur is None
            or round_ != cur.plan.round
            or client not in cur.plan.selected
            or client in cur.results
            or client in cur.dropped
            or len(cur.results) >= cur.plan.needed
        ):
            return False
        self._fire("result")
        cur.results.append(client)
        return True

    def on_dropped(self, client: int) -> None:
        """A selected client will not deliver (suspended, lost, discarded)."""
        cur = self.current
        if (cur is not None and self.state == "collecting" and client in cur.plan.selected
                and client not in cur.results):
            cur.dropped.add(client)

    def complete(self) -> bool:
        """True when the open round has all the results it can still get."""
        cur = self.current
        if cur is None or self.state != "collecting":
            return False
        if len(cur.results) >= cur.plan.needed:
            return True
        return len(cur.results) + len(cur.dropped) >= len(cur.plan.selected)

    def close(self, now: float) -> list[int]:
        """Close the open round (complete or deadline); return the clients used."""
        cur = self.current
        if cur is None:
            raise SchedulerError(f"can't close round {self.round}: none is open")
        self._fire("complete" if cur.results else "abandon")
        self.current = None
        return list(cur.results)

    def deadline_passed(self, now: float) -> bool:
        """True if the open round's deadline has passed."""
        cur = self.current
        return (
            cur is not None
            and cur.plan.deadline_at is not None
            and now >= cur.plan.deadline_at
        )


class AsyncScheduler:
    """Keep ``concurrency`` clients training at once (FedAsync's scheduler).

    Idle clients are picked uniformly at random from the scheduler's own
    seeded stream; a task whose result has not come back after
    ``task_timeout`` emulated seconds frees its client (the scheduler must
    not wait for a suspended client: docs/algorithms.md#asynchronous-flow). A late result is
    still accepted by the caller; it just carries a large staleness.
    """

    def __init__(
        self, concurrency: int, *, task_timeout: float | None = None, seed: int = 0
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"Invalid concurrency: {concurrency} (must be >= 1)")
        if task_timeout is not None and not task_timeout > 0:
            raise ValueError(f"Invalid task_timeout: {task_timeout} (must be > 0)")
        self.concurrency = concurrency
        self.task_timeout = task_timeout
        self.rng = random.Random(seed)
        self.clients = ClientTable()
        self.started: dict[int, float] = {}
        self.task_of: dict[int, int] = {}

    def bind(self, client: int, task_id: int) -> None:
        """Record the id of the task just dispatched to ``client``."""
        self.task_of[client] = task_id

    def add(self, client: int) -> None:
        """A client registered or announced it is ready."""
        if self.clients.state.get(client) in ("training", "suspended", "lost"):
            self.clients.fire(client, "ready")
        else:
            self.clients.add(client)
        self.started.pop(client, None)

    def remove(self, client: int, event: str = "lose") -> None:
        """A client suspended (``suspend``) or was lost (``lose``)."""
        if client in self.clients.state:
            self.clients.fire(client, event)
            self.started.pop(client, None)

    def training(self) -> list[int]:
        """Clients with a task in flight."""
        return self.clients.in_state("training")

    def fill(self, now: float) -> list[int]:
        """Pick idle clients to dispatch until ``concurrency`` are training."""
        free = self.concurrency - self.clients.count("training")
        idle = self.clients.view("idle")
        if free <= 0 or not idle:
            return []
        picked = self.rng.sample(idle, min(free, len(idle)))
        for c in picked:
            self.clients.fire(c, "dispatch")
            self.started[c] = now
        return picked

    def on_result(self, client: int, task_id: int | None = None) -> bool:
        """A result arrived; True if it answers the client's task in flight.

        A late result of a task that timed out (its id differs from the
        client's current task) leaves the client training its new task.
        Task ids start at 1: a ``task_id`` of 0 or None names no task (an
        update built by hand, :meth:`fedsim.wire.messages.Update.of`).
        """
        current = self.task_of.get(client)
        if task_id and current is not None and task_id != current:
            return False
        if self.clients.state.get(client) == "training":
            self.clients.fire(client, "result")
            self.started.pop(client, None)
            return True
        return False

    def expire(self, now: float) -> list[int]:
        """Free the clients whose task outlived ``task_timeout``."""
        if self.task_timeout is None:
            return []
        late = [c for c, t in self.started.items() if now - t >= self.task_timeout]
        for c in late:
            self.clients.fire(c, "timeout")
            del self.started[c]
        return sorted(late)

    def next_expiry(self) -> float | None:
        """Emulated time of the next task timeout, if any."""
        if self.task_timeout is None or not self.started:
            return None
        return min(self.started.values()) + self.task_timeout
