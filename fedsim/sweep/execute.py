"""Running a sweep: each point a ``fedsim run`` subprocess, as many at once as the
host keeps verdicts passing, unfaithful points rerun with more dilation, and a
half-finished sweep resumed (see :mod:`fedsim.sweep` for the rules).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from fedsim.actors.process import SETUP_IDLE_ENV
from fedsim.results.writer import FORMAT_FILE
from fedsim.sweep.results import PointResult, _read_point, _result, figure
from fedsim.sweep.spec import Point, Sweep, SweepError
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


class _Scheduler:
    """How many runs may go at once, and at what multiple of their dilation
    (see the :mod:`fedsim.sweep` docstring)."""

    #: Share of the cores the measured mean load of the runs at once may fill.
    #: A run's CPU comes in bursts (a round's local training on every core it
    #: has), and bursts of runs side by side coincide; the mean leaves room.
    HEADROOM = 0.5

    def __init__(self, jobs: int | str, max_jobs: int, max_scale: float = 4.0) -> None:
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
        self.cap = self.max_jobs          # below the least concurrency that broke a verdict
        #: every run's own dilation is multiplied by this (1, 2, 4, ...)
        self.scale = 1.0
        #: how many runs at their own dilation went at once without trouble
        #: (known when the sweep first doubled the dilation)
        self.cap_at_one = self.max_jobs

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
        if self.load is None:
            return 1
        return max(1, min(self._fit(self.scale), self.ceiling, self.cap, self.max_jobs))

    def finished(self, cores: float | None, verdict: str | None, shared: bool = True,
                 at: int | None = None, scale: float = 1.0) -> None:
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
        old count would do less, while it lasted, than one run at a time). Otherwise it halves the
        concurrency, and never again goes as high as where it failed; once
        the runs allowed at once are no more than the multiple of their
        dilation, one run at a time at its own dilation does as much, and the
        sweep goes back to that.
        """
        if cores is not None:
            at_one = cores * scale
            self.load = at_one if self.load is None else max(at_one, 0.7 * self.load)
        if verdict == "fail" and shared:
            if scale < self.scale:         # it ran before the last doubling: already answered
                return
            level = at if at is not None else self.allowed()
            if (self.scale * 2 <= self.max_scale and self.load is not None
                    and self._fit(2 * self.scale) >= 2 * level - 1 > max(1, level - 1)):
                if self.scale == 1.0:
                    self.cap_at_one = max(1, level - 1)
                self.scale *= 2
                # at once: as many as the doubling was for, not a ramp from ``level``
                # again: at twice the dilation and no more runs than before, the
                # sweep would do less work per unit of time than one run at a time
                # at its own dilation (2026-11-29: FA-1's last runs went 3 at once
                # at 4x, 110 real s each for 27 emulated s)
                self.cap = self.ceiling = min(self.max_jobs, 2 * level - 1)
                return
            self.cap = max(1, min(self.cap, level - 1))
            self.ceiling = max(1, level // 2)
            if self.scale > 1 and self.cap <= self.scale:
                # no more work per unit of time than one run at a time at its own
                # dilation: go back to that, for the rest of the sweep
                self.scale = self.max_scale = 1.0
                self.cap = self.ceiling = self.cap_at_one = 1
        elif verdict == "pass":
            self.ceiling = min(self.max_jobs, self.ceiling + 1)


def _mem_available_gb() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return math.inf


def _done(res: PointResult, max_attempts: int) -> bool:
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


def _next_dilation(res: PointResult, shared: bool = False) -> float:
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


def _dilation_for(prev: PointResult, base: float | None, scale: float, shared: bool,
                  need: float | None = None) -> float | None:
    """The dilation of a point's next attempt (None: its scenario's own).

    A point runs at its own dilation ``base`` times the sweep's ``scale``,
    or at ``need`` (the dilation an attempt that failed alone asked for),
    whichever is larger. An attempt that failed beside other runs says
    nothing about the point: it goes again as a first attempt would, at the
    scale the sweep has now. A point whose scenario picks its dilation
    itself (``"auto"``) is not scaled: it goes again as
    :func:`_next_dilation` says.
    """
    failed_alone = prev.verdict == "fail" and not shared
    if base is None:
        return _next_dilation(prev, shared=shared) if prev.verdict == "fail" else None
    if failed_alone:
        need = max(need or 0.0, _next_dilation(prev))
    want = max(base * scale, need or 0.0)
    return None if want == base and need is None else round(want, 3)


#: Attempts a point may lose to a crowded machine before they count against it
#: (halving from ``max_jobs = 8`` reaches one run at a time in three).
CROWDED_RETRIES = 4


#: Real seconds after which a run that has not reached t = 0 no longer holds
#: back the next one (see :func:`_starting`).
START_GRACE = 120.0


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


class _Item(NamedTuple):
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


def run_sweeps(sweeps: Sequence[tuple[Sweep, str | Path]], *, jobs: int | str = "auto",
               max_jobs: int = 8, max_attempts: int = 3, python: str | None = None,
               report: Callable[[str], None] | None = None, run_plots: bool = False,
               max_scale: float = 4.0) -> list[SweepResult]:
    """:func:`run_sweep` of several sweeps at once: their points in one queue, run by
    one scheduler, so that the machine fills with the runs of all of them (no
    sweep's first run alone, nor its last ones, leaves it idle); each sweep's
    tables and figures are written in its own ``out`` once all have run. The
    points go longest first (by their emulated budget times their dilation),
    so that the shortest fill the gaps at the end."""
    say = report or (lambda _: None)
    many = len(sweeps) > 1
    items: list[_Item] = []
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
            _atomic_write(spec_file, json.dumps(spec, indent=2) + "\n")
        for pt in sweep.points():
            items.append(_Item(i, sweep.name or out.name, pt, sweep, out / "runs"))
            bases[(i, pt.key)] = own.get(pt.key)
    results = {it.key: _result(it.point, it.runs / it.point.key) for it in items}
    history = {it.key: _History.of(_read_point(it.runs / it.point.key) or {}) for it in items}
    todo = [it for it in items
            if not _done(results[it.key], max_attempts + history[it.key].crowded)]
    if many:
        expect = {(i, k): v for i, (sw, _) in enumerate(sweeps)
                  for k, v in sw.expected_real().items()}
        todo.sort(key=lambda it: -expect.get(it.key, 0.0))
    kept = len(items) - len(todo)
    names = ", ".join(sw.name or Path(o).name for sw, o in sweeps)
    say(f"sweep{'s' if many else ''} {names}: {len(items)} points"
        + (f", {kept} already finished" if kept else "")
        + ("" if many else f"; results in {Path(sweeps[0][1])}"))
    sched = _Scheduler(jobs, max_jobs, max_scale)
    running: dict[int, _RunningItem] = {}
    python = python or sys.executable
    t0 = time.monotonic()
    finished = 0
    shared: set[int] = set()       # runs that had company at some moment
    try:
        while todo or running:
            starting = any(_starting(r.item.runs / r.item.point.key, r.started)
                           for r in running.values())
            while (todo and len(running) < sched.allowed() and not starting
                   and (not running or _mem_available_gb() > 3.0)):
                it = todo.pop(0)
                h = history[it.key]
                scale = sched.scale_for(len(todo) + 1 + len(running),
                                        crowded=h.last_crowded, alone=not running)
                prev = results[it.key]
                dilation = _dilation_for(prev, bases[it.key], scale, h.last_crowded, h.need)
                proc = _start(it.point, it.sweep, it.runs / it.point.key, python, dilation,
                              run_plots, prev.attempts + 1, h.to_json())
                if running:            # every run under way now shares the machine
                    shared.update(running)
                    shared.add(proc.pid)
                running[proc.pid] = _RunningItem(it, proc, time.monotonic(),
                                                 sched.allowed(), scale)
                starting = True
            # while one is starting and more wait, look again soon; else sleep until one ends
            pid, status, usage = os.wait4(-1, os.WNOHANG if starting and todo else 0)
            if pid == 0:
                time.sleep(0.2)
                continue
            if pid not in running:
                continue
            it, proc, started, level, scale = running.pop(pid)
            proc.returncode = os.waitstatus_to_exitcode(status)
            real = time.monotonic() - started
            cores = (usage.ru_utime + usage.ru_stime) / real if real > 0 else None
            run_dir = it.runs / it.point.key
            meta = _read_point(run_dir) or {}
            meta["cores"] = cores
            meta["exit_code"] = proc.returncode
            _atomic_write(run_dir / "point.json", json.dumps(meta, indent=2) + "\n")
            res = _result(it.point, run_dir)
            results[it.key] = res
            was_shared = pid in shared
            sched.finished(cores, res.verdict, shared=was_shared, at=level, scale=scale)
            shared.discard(pid)
            h = history[it.key]
            h.last_crowded = False
            if res.verdict == "fail" and not was_shared and res.status == "completed":
                h.need = max(h.need or 0.0, _next_dilation(res))
            if res.verdict == "fail" and was_shared and h.crowded < CROWDED_RETRIES:
                # the machine was crowded: this attempt does not count against the point
                h.crowded += 1
                h.last_crowded = True
            meta.update(h.to_json())
            _atomic_write(run_dir / "point.json", json.dumps(meta, indent=2) + "\n")
            if res.status == "completed" and not _done(res, max_attempts + h.crowded):
                todo.insert(0, it)     # an unfaithful run goes again, with more dilation
                why = " beside other runs" if h.last_crowded else ""
                nxt = _dilation_for(res, bases[it.key], sched.scale, h.last_crowded, h.need)
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


class _RunningItem(NamedTuple):
    """A point's run under way: what it is, its process, when it started, how many runs
    were allowed at once then, and the multiple of its dilation it goes at."""

    item: _Item
    proc: Any
    started: float
    level: int
    scale: float


@dataclass
class _History:
    """What a point's attempts so far taught; kept in its point.json, so that a
    resumed sweep knows it too."""

    crowded: int = 0             # attempts that failed while sharing the machine
    last_crowded: bool = False   # whether the last one did
    need: float | None = None    # the dilation an attempt that failed alone asked for

    @classmethod
    def of(cls, meta: dict[str, Any]) -> _History:
        need = meta.get("needed_dilation")
        return cls(int(meta.get("crowded_attempts") or 0), bool(meta.get("last_crowded")),
                   None if need is None else float(need))

    def to_json(self) -> dict[str, Any]:
        return {"crowded_attempts": self.crowded, "last_crowded": self.last_crowded,
                "needed_dilation": self.need}


def _start(p: Point, sweep: Sweep, run_dir: Path, python: str, dilation: float | None,
           plots: bool, attempt: int, history: dict[str, Any]) -> Any:
    if run_dir.exists():          # an interrupted or unfaithful attempt: keep its log
        old = run_dir.with_name(f"{run_dir.name}.attempt-{attempt - 1}")
        shutil.rmtree(old, ignore_errors=True)
        run_dir.rename(old)
    run_dir.mkdir(parents=True)
    cmd = [python, "-m", "fedsim.cli", "run", str(sweep.scenario), "--out", str(run_dir),
           "--no-progress", *itertools.chain.from_iterable(("--set", s) for s in p.set_args())]
    if not plots:
        cmd.append("--no-plots")
    if dilation is not None:
        cmd += ["--dilation", str(dilation)]
    meta = {"variant": p.variant, "grid": dict(p.grid), "seed": p.seed, "attempts": attempt,
            "dilation": dilation, "command": cmd[1:], **history}
    _atomic_write(run_dir / "point.json", json.dumps(meta, indent=2) + "\n")
    log = open(run_dir / "output.log", "wb")   # noqa: SIM115 (the child owns it)
    # its set-up in the idle class, beside the runs already going (fedsim.actors.process)
    env = {**os.environ, SETUP_IDLE_ENV: "1"}
    try:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env)
    finally:
        log.close()


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


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
