"""A sweep's policy: how many runs go at once and at what dilation, when a point
is done, and what a point's attempts taught (:mod:`fedsim.sweep` gives the rules;
:mod:`fedsim.sweep.pick` which waiting point goes next;
:mod:`fedsim.sweep.execute` runs the processes).
"""

from __future__ import annotations

import itertools
import os
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from fedsim.sweep.results import PointResult

__all__ = ["CROWDED_RETRIES", "MAX_STEP", "History", "MachineLoad", "Scheduler", "dilation_for",
           "is_done", "next_dilation"]


class Scheduler:
    """How many runs may go at once, and at what multiple of their dilation
    (see the :mod:`fedsim.sweep` docstring)."""

    #: Share of the cores the measured mean load of the runs at once may fill.
    #: A run's CPU comes in bursts (a round's local training on every core it
    #: has), and bursts of runs side by side coincide; the mean leaves room.
    HEADROOM = 0.5

    def __init__(self, jobs: int | str, max_jobs: int, max_scale: float = 4.0,
                 headroom: float | None = None) -> None:
        if headroom is not None:
            if not 0.0 < headroom <= 1.0:
                raise ValueError(f"headroom must be in (0, 1], got {headroom}")
            self.HEADROOM = headroom
        self.cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
            os.cpu_count() or 1)
        self.fixed = None if jobs == "auto" else int(jobs)
        self.max_jobs = max(1, max_jobs)
        self.max_scale = 1.0 if self.fixed is not None else max(1.0, max_scale)
        #: cores one run uses at scale 1 (the largest seen recently): a run
        #: at ``scale`` times its dilation spreads the same work over that
        #: much more time
        self.load: float | None = None
        # Grown by one per faithful run (from one), halved by an unfaithful
        # one beside others: the mean load says how many could fit, not
        # whether their bursts collide, so the sweep finds out step by step.
        self.ceiling = 1
        #: below the concurrency that last broke a verdict; it climbs back by one
        #: once as many faithful runs as it allows have ended there in a row
        self.cap = self.max_jobs
        self._at_cap = 0                  # faithful runs in a row at the cap
        #: faithful runs in a row at the cap before it climbs (at least the cap):
        #: doubled at each crowded failure, so that where any company fails a run,
        #: the sweep probes one more at once ever more rarely, not every other run
        self._climb = 1
        #: every run's own dilation is multiplied by this (1, 2, 4, ...)
        self.scale = 1.0
        #: how many runs at their own dilation went at once without trouble
        #: (known when the sweep first doubled the dilation)
        self.cap_at_one = self.max_jobs
        #: the share of the cores that runs whose loads are known in advance
        #: (:meth:`fits`) may fill: HEADROOM, times 0.8 at each crowded failure,
        #: back up by 0.02 a faithful run
        self.budget = self.HEADROOM
        #: when the budget last shrank (a run that started before then went under
        #: the larger one: its crowded failure is already answered)
        self._shrunk_at: float | None = None

    def fits(self, busy: float, load: float, running: int) -> bool:
        """Whether a run of ``load`` cores (its measured load before, at the
        multiple of its dilation it will go at) fits beside ``running`` runs
        under way whose loads add up to ``busy``: packing by each run's own
        load, where :meth:`allowed` counts runs of one shared load (a pool of
        every claim's sweeps mixes runs of 0.05 to 0.5 cores). Always the
        first run; never more than the cap or ``max_jobs``."""
        if running == 0:
            return True
        if running >= min(self.cap, self.max_jobs):
            return False
        return busy + load <= self.budget * self.cores

    def scale_for(self, remaining: int, crowded: bool = False, alone: bool = True) -> float:
        """The multiple of its dilation the next run goes at, with ``remaining``
        runs left to finish (this one and those under way included): at the end
        of a sweep, once no more are left than could go at their own dilation,
        they do (a last long run at 4x its dilation would be the sweep's tail).
        Not a run whose last attempt was ``crowded`` out, unless it goes
        ``alone``: beside runs at the sweep's multiple it would crowd out again
        (FA-2 on 2026-11-29 lost two 127 s attempts of its longest point so)."""
        if crowded and not alone:
            return self.scale
        return 1.0 if remaining <= self.cap_at_one else self.scale

    def _fit(self, scale: float) -> int:
        assert self.load is not None
        return int(self.HEADROOM * self.cores * scale / max(self.load, 0.05))

    def allowed(self) -> int:
        if self.fixed is not None:
            return self.fixed
        if self.load is None:           # none has finished: as far as the live ramp went
            return max(1, min(self.ceiling, self.cap, self.max_jobs))
        return max(1, min(self._fit(self.scale), self.ceiling, self.cap, self.max_jobs))

    #: Share of the cores the runs' busiest second may fill with one more run's
    #: share (the live ramp): a synchronous round's training fills the cores for
    #: a moment while the mean leaves room (2026-11-29: FS-1's 32 s FedAvg runs,
    #: 0.27 cores each on average, failed three at once; AsyncFedED's too).
    PEAK_SHARE = 0.9

    def room_for_one_more(self, running: int, busy: float,
                          peak: float | None = None) -> bool:
        """Whether one more run fits beside ``running`` runs under way, by the
        machine's busy cores measured while they ran (``busy``): each takes
        its share of that (or, if more, the load measured of finished runs,
        at today's multiple of their dilation), and the sum stays within the
        HEADROOM share of the cores, and the busiest second's (``peak``) with
        it within PEAK_SHARE. The live ramp: a pool whose first runs are its
        longest (455 real s) would otherwise wait that long for its second
        run, as a first measured run does."""
        if self.fixed is not None or running < 1:
            return False
        per_run = busy / running
        if self.load is not None:
            per_run = max(per_run, self.load / self.scale)
        if peak is not None and peak + per_run > self.PEAK_SHARE * self.cores:
            return False
        return busy + per_run <= self.HEADROOM * self.cores

    def grow(self) -> None:
        """One run more at once (:meth:`room_for_one_more` said it fits)."""
        self.ceiling = min(self.max_jobs, self.ceiling + 1)

    def finished(self, cores: float | None, verdict: str | None, shared: bool = True,
                 at: int | None = None, scale: float = 1.0,
                 started: float | None = None) -> None:
        """A run ended; ``shared``: another run was running at some moment of it;
        ``at``: how many runs were allowed at once when it started; ``scale``:
        the multiple of its dilation it ran at.

        An unfaithful run that had the machine to itself says its point needs
        more dilation, not that the sweep runs too many at once: it leaves
        the concurrency alone. One that shared it says the runs at once
        crowded each other. If the cores had room for more runs than that,
        the sweep doubles every later run's dilation (up to ``max_scale``)
        and runs twice as many at once, minus one, from then on: each then
        uses half the CPU and has twice the timing margin, so it finishes its
        work sooner overall than one run at a time (a ramp back up from the
        old count would do less, while it lasted, than one run at a time);
        only if that does more work per unit of time than one fewer run at
        once at today's dilation would: with ``max_jobs`` at once the most,
        doubling the dilation of 7 runs to run 8 is half the work of 6
        (2026-11-29: a pool of every claim's sweep went to 4x its dilation
        with 8 runs at once, 0.06 cores each, on an idle machine). Otherwise it halves the
        concurrency, and goes no higher than where it failed until as many
        faithful runs in a row as the cap allows (and at least 2, 4, 8 ... after
        each crowding episode, so that where any company fails a run the sweep
        probes ever more rarely) have ended with that many at once: then one
        more (additive increase, multiplicative decrease, as TCP's congestion
        window: a verdict that broke early in a sweep, or at a sensitive
        point, no longer holds a pool of 300 runs of other sweeps at 1 or 3
        at once for hours, as on 2026-11-29). Once the runs allowed at once
        are no more than the multiple of their dilation, one run at a time at
        its own dilation does as much, and the sweep goes back to that.
        """
        if cores is not None:
            at_one = cores * scale
            self.load = at_one if self.load is None else max(at_one, 0.7 * self.load)
        if verdict == "fail" and shared:
            if scale < self.scale:         # it ran before the last doubling: already answered
                return
            self._at_cap = 0
            if started is None or self._shrunk_at is None or started >= self._shrunk_at:
                # once per crowding episode (a run that started before the last
                # answer went under what that answer changed)
                self.budget = max(0.25 * self.HEADROOM, 0.8 * self.budget)
                self._climb = min(64, 2 * self._climb)
                self._shrunk_at = time.monotonic()
            level = at if at is not None else self.allowed()
            doubled = min(self.max_jobs, 2 * level - 1)
            if (self.scale * 2 <= self.max_scale and self.load is not None
                    and self._fit(2 * self.scale) >= doubled
                    # runs' worth per unit of time: doubled at 2x against level - 1 at 1x
                    and doubled > 2 * max(1, level - 1)):
                if self.scale == 1.0:
                    self.cap_at_one = max(1, level - 1)
                self.scale *= 2
                # at once: as many as the doubling was for, not a ramp from ``level``
                # again: at twice the dilation and no more runs than before, the
                # sweep would do less work per unit of time than one run at a time
                # at its own dilation (2026-11-29: FA-1's last runs went 3 at once
                # at 4x, 110 real s each for 27 emulated s)
                self.cap = self.ceiling = doubled
                return
            self.cap = max(1, min(self.cap, level - 1))
            self.ceiling = max(1, level // 2)
            if self.scale > 1 and self.cap <= self.scale:
                # no more work per unit of time than one run at a time at its own
                # dilation: go back to that, for the rest of the sweep
                self.scale = self.max_scale = 1.0
                self.cap = self.ceiling = self.cap_at_one = 1
        elif verdict == "pass":
            self.budget = min(self.HEADROOM, self.budget + 0.02)
            self.ceiling = min(self.max_jobs, self.ceiling + 1)
            # only a run that went with as many at once as the cap allows says the cap holds
            if (self.cap < self.max_jobs and self.ceiling >= self.cap and scale >= self.scale
                    and (at is None or at >= self.cap)):
                self._at_cap += 1
                if self._at_cap >= max(self.cap, self._climb):
                    self.cap += 1
                    self._at_cap = 0


def is_done(res: PointResult, max_attempts: int) -> bool:
    """Finished for good: faithful, unfaithful after every attempt, or failed as a run.

    A point never run, interrupted or crashed (no summary) is not: a resumed
    sweep runs it again.
    """
    if res.status in ("pending", "interrupted", "running", "crashed"):
        return False
    if res.status == "completed" and res.verdict == "fail":
        return res.attempts >= max_attempts
    return True   # faithful, or a run that failed (its output.log says why)


#: A rerun's dilation grows at most this much over the failed attempt's: one
#: starved stretch (another process holding the cores) can make a run suggest
#: twenty times its dilation, which for a long run is an hour for nothing.
MAX_STEP = 4.0


def next_dilation(res: PointResult, shared: bool = False) -> float:
    """The failed attempt's suggestion, at least 1.5x and at most 4x its dilation.

    An attempt that failed while it ``shared`` the machine with another run
    says the sweep ran too many at once, not that its point needs more
    dilation: it goes again at the same dilation, with fewer runs beside it.
    """
    current = res.dilation or 1.0
    if shared:
        return round(current, 3)
    suggested = ((res.summary or {}).get("fidelity") or {}).get("suggested_dilation")
    want = float(suggested or 0.0)
    return round(min(max(want, 1.5 * current), MAX_STEP * current), 3)


def dilation_for(prev: PointResult, base: float | None, scale: float, shared: bool,
                  need: float | None = None) -> float | None:
    """The dilation of a point's next attempt (None: its scenario's own).

    A point runs at its own dilation ``base`` times the sweep's ``scale``,
    or at ``need`` (the dilation an attempt that failed alone asked for),
    whichever is larger. An attempt that failed beside other runs says
    nothing about the point: it goes again as a first attempt would, at the
    scale the sweep has now. A point whose scenario picks its dilation
    itself (``"auto"``) is not scaled: it goes again as
    :func:`next_dilation` says.
    """
    failed_alone = prev.verdict == "fail" and not shared
    if base is None:
        return next_dilation(prev, shared=shared) if prev.verdict == "fail" else None
    if failed_alone:
        need = max(need or 0.0, next_dilation(prev))
    want = max(base * scale, need or 0.0)
    return None if want == base and need is None else round(want, 3)


class MachineLoad:
    """The machine's busy cores, averaged between two moments, from ``/proc/stat``
    (every CPU's time outside idle and I/O wait; a run's trainers, in the idle
    class, count as busy). Sampled each time the sweep's loop looks (about once
    a second); None where ``/proc/stat`` cannot be read."""

    def __init__(self) -> None:
        self.samples: deque[tuple[float, int, int]] = deque(maxlen=600)

    @staticmethod
    def _read() -> tuple[int, int] | None:
        try:
            with open("/proc/stat") as f:
                fields = [int(x) for x in f.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        if len(fields) < 5:
            return None
        total = sum(fields[:8])
        return total - fields[3] - fields[4], total

    def sample(self, now: float) -> None:
        got = self._read()
        if got is not None:
            self.samples.append((now, *got))

    def busy_cores(self, since: float) -> float | None:
        """Mean busy cores from the first sample at or after ``since`` to the last
        (None: fewer than two such samples)."""
        points = [s for s in self.samples if s[0] >= since]
        return self._cores(points[0], points[-1]) if len(points) > 1 else None

    def peak_cores(self, since: float) -> float | None:
        """The most busy cores between two consecutive samples (about a second
        apart) from ``since`` on (None: fewer than two such samples)."""
        points = [s for s in self.samples if s[0] >= since]
        peaks = [c for a, b in itertools.pairwise(points) if (c := self._cores(a, b)) is not None]
        return max(peaks) if peaks else None

    @staticmethod
    def _cores(a: tuple[float, int, int], b: tuple[float, int, int]) -> float | None:
        """Busy cores on average between samples ``a`` and ``b`` (None: no time passed)."""
        total = b[2] - a[2]
        return (b[1] - a[1]) / total * (os.cpu_count() or 1) if total > 0 else None


#: Attempts a point may lose to a crowded machine before they count against it
#: (halving from ``max_jobs = 8`` reaches one run at a time in three).
CROWDED_RETRIES = 4


@dataclass
class History:
    """What a point's attempts so far taught; kept in its point.json, so that a
    resumed sweep knows it too."""

    crowded: int = 0             # attempts that failed while sharing the machine
    last_crowded: bool = False   # whether the last one did
    need: float | None = None    # the dilation an attempt that failed alone asked for

    @classmethod
    def of(cls, meta: dict[str, Any]) -> History:
        need = meta.get("needed_dilation")
        return cls(int(meta.get("crowded_attempts") or 0), bool(meta.get("last_crowded")),
                   None if need is None else float(need))

    def to_json(self) -> dict[str, Any]:
        return {"crowded_attempts": self.crowded, "last_crowded": self.last_crowded,
                "needed_dilation": self.need}
