"""Which waiting point of a sweep (or of several run together) starts next: first
fit by each run's load, with EASY backfilling (:mod:`fedsim.sweep.policy` decides
how many go at once and at what dilation; :mod:`fedsim.sweep.execute` runs them).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from fedsim.sweep.policy import Scheduler
from fedsim.sweep.spec import Point, Sweep


class Item(NamedTuple):
    """A point of one of the sweeps run together, and where its runs go."""

    which: int          # the sweep's place in the list
    name: str           # the sweep's name (its directory's, if it has none)
    point: Point
    sweep: Sweep
    runs: Path

    @property
    def key(self) -> tuple[int, str]:
        return self.which, self.point.key

    def label(self, many: bool) -> str:
        return f"{self.name}/{self.point.key}" if many else self.point.key


class RunningItem(NamedTuple):
    """A point's run under way: what it is, its process, when it started, how many runs
    were allowed at once then, the multiple of its dilation it goes at, and the cores
    it is expected to use (None: not known)."""

    item: Item
    proc: Any
    started: float
    level: int
    scale: float
    load: float | None = None
    dilation: float | None = None     # the one it was given (None: its own)


def next_item(todo: Sequence[Item], running: Mapping[int, RunningItem], sched: Scheduler,
          load_of: Callable[[Item], float | None],
          seconds_of: Callable[[Item], float | None] = lambda it: None,
          now: float = 0.0) -> int | None:
    """Which of ``todo`` starts next, if one may.

    Where the loads of the runs under way and of the first waiting one are known
    (``load_of``: cores at the multiple of its dilation it would go at), the first
    if it fits beside them (:meth:`~fedsim.sweep.policy.Scheduler.fits`); if it
    does not, a later one that fits and, where its real seconds are known
    (``seconds_of``), ends before the room the first needs is expected to free
    (EASY backfilling: the longest runs are not left for the tail while light
    ones take each gap). Else the first, by the count of runs allowed at once."""
    head = load_of(todo[0])
    if head is None or any(r.load is None for r in running.values()):
        return 0 if len(running) < sched.allowed() else None
    busy = sum(r.load or 0.0 for r in running.values())
    if sched.fits(busy, head, len(running)):
        return 0
    reserve = _room_at(head, busy, running, sched, seconds_of, now)
    for i, it in enumerate(todo[1:], 1):
        load = load_of(it)
        if load is None or not sched.fits(busy, load, len(running)):
            continue
        seconds = seconds_of(it)
        if seconds is None or now + seconds * sched.scale <= reserve:
            return i
    return None


def _room_at(load: float, busy: float, running: Mapping[int, RunningItem],
             sched: Scheduler, seconds_of: Callable[[Item], float | None],
             now: float) -> float:
    """When enough of the runs under way are expected to have ended for a run of
    ``load`` to fit (a run whose seconds are not known may end at any moment)."""
    need = busy + load - sched.budget * sched.cores
    freed = 0.0
    ends = sorted((r.started + (seconds_of(r.item) or 0.0) * r.scale, r.load or 0.0)
                  for r in running.values())
    for end, freed_load in ends:
        freed += freed_load
        if freed >= need:
            return max(end, now)
    return math.inf
