"""Running a sweep: each point a ``fedsim run`` subprocess, as many at once as the
host keeps verdicts passing, unfaithful points rerun with more dilation, and a
half-finished sweep resumed (see :mod:`fedsim.sweep` for the rules).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from fedsim.results.writer import FORMAT_FILE
from fedsim.sweep.launch import atomic_write, start_run
from fedsim.sweep.pick import Item, RunningItem, next_item
from fedsim.sweep.policy import (
    CROWDED_RETRIES,
    History,
    MachineLoad,
    Scheduler,
    dilation_for,
    is_done,
    next_dilation,
)
from fedsim.sweep.results import PointResult, figure, point_result, read_point
from fedsim.sweep.spec import Sweep, SweepError
from fedsim.sweep.tables import write_tables


@dataclass
class SweepResult:
    """A sweep's outcome: every point, and where the tables and figures are."""

    out: Path
    points: list[PointResult]
    files: list[Path]

    @property
    def flagged(self) -> list[PointResult]:
        """Points that finished but do not count (failed verdict or run, lost client work)."""
        return [p for p in self.points if not p.counts]


def _mem_available_gb() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return math.inf


#: Real seconds after which a run that has not reached t = 0 no longer holds
#: back the next one (see :func:`_starting`).
START_GRACE = 120.0
#: Real seconds the runs at once must have run unchanged (none started or
#: ended; the last started one past its start-up) before the machine's busy
#: cores over that stretch may let one more go (the live ramp,
#: :meth:`fedsim.sweep.policy.Scheduler.room_for_one_more`).
SETTLE = 20.0


def _starting(run_dir: Path, started: float) -> bool:
    """Whether a run is still starting: launched, but its emulated clock not yet running.

    Start-up (imports, data, worker processes) is the busiest stretch of a
    run, at normal priority; a neighbour's trainers, which run under
    ``SCHED_IDLE``, can wait seconds for a CPU behind it and overrun their
    compute budgets. So a sweep starts its runs one at a time: the next
    waits until this one has written ``fedsim-run.json`` (at t = 0).
    """
    return (not (run_dir / FORMAT_FILE).exists()
            and time.monotonic() - started < START_GRACE)


def run_sweep(sweep: Sweep, out: str | Path, *, jobs: int | str = "auto", max_jobs: int = 8,
              max_attempts: int = 3, python: str | None = None,
              report: Callable[[str], None] | None = None,
              run_plots: bool = False, max_scale: float = 4.0) -> SweepResult:
    """Run every point not yet finished in ``out``; write the tables and figures.

    ``out`` may hold an earlier run of the same sweep (it resumes) but not of
    a different one (:class:`SweepError`). Each run draws its own PNGs only
    with ``run_plots`` (``fedsim plot RUN`` draws them later; skipping them
    saves a few seconds of a core per run). With ``jobs = "auto"`` the
    sweep may run points at up to ``max_scale`` times their own dilation to
    run more of them at once (1: never).
    """
    return run_sweeps([(sweep, out)], jobs=jobs, max_jobs=max_jobs, max_attempts=max_attempts,
                      python=python, report=report, run_plots=run_plots,
                      max_scale=max_scale)[0]


def run_sweeps(sweeps: Sequence[tuple[Sweep, str | Path]], *, jobs: int | str = "auto",
               max_jobs: int = 8, max_attempts: int = 3, python: str | None = None,
               report: Callable[[str], None] | None = None, run_plots: bool = False,
               max_scale: float = 4.0,
               expected: Mapping[tuple[int, str], float] | None = None,
               headroom: float | None = None,
               loads: Mapping[tuple[int, str], float] | None = None) -> list[SweepResult]:
    """:func:`run_sweep` of several sweeps at once: their points in one queue, run by
    one scheduler, so that the machine fills with the runs of all of them (no
    sweep's first run alone, nor its last ones, leaves it idle); each sweep's
    tables and figures are written in its own ``out`` once all have run. The
    points go longest first, so that the shortest fill the gaps at the end: by
    ``expected`` (real seconds per (sweep index, point key), e.g. measured by
    an earlier run of the same sweeps) where it has the point, else by their
    emulated budget times their dilation (an upper bound: a run that ends by
    its rounds ends sooner). ``headroom``: the share of the cores the runs
    at once may keep busy on average (default
    :attr:`~fedsim.sweep.policy.Scheduler.HEADROOM`, a half). ``loads``: the
    cores a point's run used at its own dilation, measured before (e.g. by an
    earlier run of the same sweeps): where every run under way and the next
    have one, runs are packed by them, first fit in the order above (a light
    run goes while the heaviest waits for room), instead of counted as runs
    of one shared load. A point without one takes the load its sweep's
    finished runs showed (the largest lately, at their own dilation)."""
    say = report or (lambda _: None)
    many = len(sweeps) > 1
    items: list[Item] = []
    bases: dict[tuple[int, str], float | None] = {}
    for i, (sweep, out_) in enumerate(sweeps):
        out = Path(out_)
        own = sweep.check()
        out.mkdir(parents=True, exist_ok=True)
        spec_file = out / "sweep.json"
        spec = sweep.to_json()
        if spec_file.exists():
            old = json.loads(spec_file.read_text())
            if old != spec:
                diff = sorted(k for k in spec if spec.get(k) != old.get(k))
                raise SweepError(f"{out} holds a different sweep (it differs in: "
                                 f"{', '.join(diff)}); choose another --out, or resume it "
                                 f"with `fedsim sweep {out}`")
        else:
            atomic_write(spec_file, json.dumps(spec, indent=2) + "\n")
        for pt in sweep.points():
            items.append(Item(i, sweep.name or out.name, pt, sweep, out / "runs"))
            bases[(i, pt.key)] = own.get(pt.key)
    results = {it.key: point_result(it.point, it.runs / it.point.key) for it in items}
    history = {it.key: History.of(read_point(it.runs / it.point.key) or {}) for it in items}
    todo = [it for it in items
            if not is_done(results[it.key], max_attempts + history[it.key].crowded)]
    expect = {(i, k): v for i, (sw, _) in enumerate(sweeps)
              for k, v in sw.expected_real().items()}
    expect.update(expected or {})
    if many:
        todo.sort(key=lambda it: -expect.get(it.key, 0.0))
    kept = len(items) - len(todo)
    names = ", ".join(sw.name or Path(o).name for sw, o in sweeps)
    say(f"sweep{'s' if many else ''} {names}: {len(items)} points"
        + (f", {kept} already finished" if kept else "")
        + ("" if many else f"; results in {Path(sweeps[0][1])}"))
    # Several sweeps: the multiple of their dilation the runs go at is each sweep's own,
    # doubled when its runs fail beside others (up to max_scale), and the pool's
    # concurrency answers only a crowded failure its sweep cannot slow down from; one
    # sweep's crowding no longer slows every other sweep's runs (see fedsim.sweep).
    per_sweep = many and jobs == "auto"
    # a sweep's own max_jobs (measured: its runs break their verdicts beside more of
    # their kind) caps its runs at once: the scheduler's, for one sweep; in a pool,
    # its own runs under way (the others may fill the rest)
    caps = {i: s.max_jobs for i, (s, _) in enumerate(sweeps) if s.max_jobs}
    if not many and 0 in caps:
        max_jobs = min(max_jobs, caps[0])
    sched = Scheduler(jobs, max_jobs, 1.0 if per_sweep else max_scale, headroom)
    multiple: dict[int, float] = {}    # by sweep (per_sweep): its runs' multiple

    def mult(it: Item) -> float:
        return multiple.get(it.which, 1.0)
    running: dict[int, RunningItem] = {}
    python = python or sys.executable
    t0 = time.monotonic()
    finished = 0
    shared: set[int] = set()       # runs that had company at some moment
    live = MachineLoad() if sched.fixed is None else None
    known_loads = dict(loads or {})
    learned: dict[int, float] = {}     # by sweep: its finished runs' load, at own dilation

    def own_load(it: Item) -> float | None:
        """Its load at its own dilation: measured before, or its sweep's (None: not
        known, or a fixed number of runs at once)."""
        if sched.fixed is not None:
            return None
        known = known_loads.get(it.key)
        return known if known is not None else learned.get(it.which)

    def load_of(it: Item) -> float | None:
        """Its load at the multiple of its dilation it would go at now (None: not known)."""
        load = own_load(it)
        if load is None:
            return None
        return load / (mult(it) * sched.scale_for(len(todo) + len(running),
                                                  crowded=history[it.key].last_crowded,
                                                  alone=not running))

    def seconds_of(it: Item) -> float | None:
        return expect.get(it.key) or None

    peak: dict[int, int] = {}      # by run: the most runs under way at once in its life

    changed = t0                   # when the runs at once last changed (the live ramp)
    was_starting = False
    try:
        while todo or running:
            now = time.monotonic()
            starting = any(_starting(r.item.runs / r.item.point.key, r.started)
                           for r in running.values())
            if was_starting and not starting:
                changed = now      # the last one started is past its start-up
            was_starting = starting
            ramping = live is not None and sched.load is None   # until a run has finished
            if ramping:
                assert live is not None
                live.sample(now)
                if (todo and running and not starting and len(running) >= sched.allowed()
                        and now - changed >= SETTLE):
                    busy = live.busy_cores(changed)
                    if busy is not None and sched.room_for_one_more(
                            len(running), busy, live.peak_cores(changed)):
                        sched.grow()
                        changed = now
            while todo and not starting and (not running or _mem_available_gb() > 3.0):
                full = {i for i, cap in caps.items()
                        if sum(r.item.which == i for r in running.values()) >= cap}
                open_ = [k for k, it in enumerate(todo) if it.which not in full]
                if not open_:
                    break
                pick = next_item([todo[k] for k in open_], running, sched, load_of, seconds_of, now)
                if pick is None:
                    break
                it = todo.pop(open_[pick])
                h = history[it.key]
                scale = mult(it) * sched.scale_for(len(todo) + 1 + len(running),
                                                   crowded=h.last_crowded, alone=not running)
                prev = results[it.key]
                dilation = dilation_for(prev, bases[it.key], scale, h.last_crowded, h.need)
                proc = start_run(it.point, it.sweep, it.runs / it.point.key, python, dilation,
                              run_plots, prev.attempts + 1, h.to_json())
                if running:            # every run under way now shares the machine
                    shared.update(running)
                    shared.add(proc.pid)
                known = own_load(it)
                running[proc.pid] = RunningItem(
                    it, proc, time.monotonic(), sched.allowed() if known is None else 0, scale,
                    None if known is None else known / scale, dilation)
                for p in running:      # how many each run under way has beside it, at most
                    peak[p] = max(peak.get(p, 0), len(running))
                starting = True
            # while more wait, look again soon (one is starting, or the live ramp may let
            # one more go); else sleep until one ends
            pid, status, usage = os.wait4(-1, os.WNOHANG if todo and (starting or ramping) else 0)
            if pid == 0:
                time.sleep(0.2 if starting else 1.0)
                continue
            if pid not in running:
                continue
            changed = time.monotonic()
            it, proc, started, level, scale, _, ran_at = running.pop(pid)
            # the most runs it had beside it (packed), at least as many as were allowed
            # when it started (counted)
            level = max(level, peak.pop(pid, 0)) if sched.fixed is None else level
            proc.returncode = os.waitstatus_to_exitcode(status)
            real = time.monotonic() - started
            cores = (usage.ru_utime + usage.ru_stime) / real if real > 0 else None
            run_dir = it.runs / it.point.key
            meta = read_point(run_dir) or {}
            meta["cores"] = cores
            meta["exit_code"] = proc.returncode
            atomic_write(run_dir / "point.json", json.dumps(meta, indent=2) + "\n")
            res = point_result(it.point, run_dir)
            results[it.key] = res
            was_shared = pid in shared
            verdict = res.verdict
            if per_sweep and verdict == "fail" and was_shared and res.status == "completed":
                if scale < mult(it):
                    # it started before its sweep's last doubling, which answered it
                    verdict = None
                elif 2 * mult(it) <= max_scale:
                    multiple[it.which] = 2 * mult(it)
                    say(f"  {it.name}: its runs crowd each other; from now on at "
                        f"{multiple[it.which]:g}x their dilation")
                    verdict = None         # the sweep answered it: the pool's concurrency stays
            sched.finished(cores, verdict, shared=was_shared, at=level, scale=scale,
                           started=started)
            base = bases[it.key]
            if cores is not None and res.status == "completed":
                at_own = cores * (ran_at / base) if ran_at and base else cores
                seen = learned.get(it.which)
                learned[it.which] = at_own if seen is None else max(at_own, 0.7 * seen)
            shared.discard(pid)
            h = history[it.key]
            h.last_crowded = False
            if res.verdict == "fail" and not was_shared and res.status == "completed":
                h.need = max(h.need or 0.0, next_dilation(res))
            if res.verdict == "fail" and was_shared and h.crowded < CROWDED_RETRIES:
                # the machine was crowded: this attempt does not count against the point
                h.crowded += 1
                h.last_crowded = True
            meta.update(h.to_json())
            atomic_write(run_dir / "point.json", json.dumps(meta, indent=2) + "\n")
            if res.status == "completed" and not is_done(res, max_attempts + h.crowded):
                todo.insert(0, it)     # an unfaithful run goes again, with more dilation
                why = " beside other runs" if h.last_crowded else ""
                nxt = dilation_for(res, bases[it.key], mult(it) * sched.scale, h.last_crowded,
                                    h.need)
                say(f"  rerun {it.label(many)}: verdict {res.verdict} at dilation "
                    f"{res.dilation}{why}; next {nxt or 'its own'} "
                    f"(concurrency now {sched.allowed()}{_scaled(sched.scale)})")
                continue
            finished += 1
            say(_progress_line(res, finished, len(todo) + len(running) + finished, kept,
                               time.monotonic() - t0, sched.allowed(), sched.scale,
                               it.label(many)))
    except KeyboardInterrupt:
        for r in running.values():
            r.proc.send_signal(2)
        for r in running.values():
            r.proc.wait()
        raise
    out_results = []
    for i, (sweep, out_) in enumerate(sweeps):
        final = [results[(i, pt.key)] for pt in sweep.points()]
        files = write_tables(sweep, Path(out_), final)
        out_results.append(SweepResult(Path(out_), final, files))
    return out_results


def _scaled(scale: float) -> str:
    return f", every run at {scale:g}x its dilation" if scale > 1 else ""


def _progress_line(res: PointResult, done: int, total: int, kept: int, elapsed: float,
                   jobs: int, scale: float = 1.0, label: str | None = None) -> str:
    s = res.summary or {}
    acc = figure(s, "final_accuracy")
    emu = figure(s, "emulated_seconds")
    real = figure(s, "real_seconds")
    rate = elapsed / done
    eta = rate * (total - done)
    flag = "" if res.counts else "  FLAGGED"
    if res.lost_runs:
        flag += f" (lost client work: {res.lost_work})"
    return (f"[{done + kept:>3}/{total + kept}] {label or res.point.key}: {res.status}, verdict "
            f"{res.verdict}, acc {'-' if acc is None else f'{acc:.3f}'}, "
            f"{'-' if emu is None else f'{emu:.1f}'} emulated s in "
            f"{'-' if real is None else f'{real:.1f}'} real s, "
            f"{'-' if res.cores is None else f'{res.cores:.2f}'} cores; "
            f"{jobs} at once{_scaled(scale)}, about {eta / 60:.0f} min left{flag}")
