r"""Sweeps: one scenario run over a grid of overrides, variants and seeds.

A sweep is a base scenario, overrides applied to every point (``set``), a
grid (the cartesian product of every key's values), optional named
*variants* (override sets, each crossed with the grid: "FedAvg K=5" beside
"DGA K=5 D=20") and seeds. Every point is a whole ``fedsim run`` in its own
process and its own run directory, so a point that crashes takes nothing
else with it, and any point can be rerun by hand with the command recorded
in its ``point.json``.

The output directory holds::

    sweep.json        the resolved sweep (what resumes it)
    runs/<point>/     one run directory per point (summary, metrics, events, plots)
    sweep.csv         one row per point: variant, grid values, seed, status,
                      verdict, attempts, dilation and the summary's figures
    aggregate.csv     per variant and grid point: n seeds, mean and 95 %
                      confidence half-width of every figure (Student's t)
    <figure>.png      each figure against a grid key (or the variants), with
                      the confidence interval as error bars: a line per
                      variant against a numeric key, a key's values (const,
                      poly) side by side on the axis otherwise
                      (:func:`fedsim.sweep.plots.x_key` chooses it)

Faithfulness comes first. A point's figures count only if its fidelity
verdict passed. A point whose verdict fails is rerun with the dilation the
run suggested, at least 1.5x and at most 4x its own (one starved stretch
can make a run ask for twenty times its dilation), up to
``max_attempts`` times, and then kept but *flagged* (``verdict = fail`` in
``sweep.csv``, left out of ``aggregate.csv``, named in the report), never
silently averaged in. So is a run that lost client work (a client whose
local run failed and was dropped: ``lost_runs`` in ``sweep.csv``, the
summary's ``lost_work`` says which and why): it measured a federation
without that client, not the one the point asked for.

Points run in parallel only as far as the host keeps verdicts passing, and
they start one at a time: a run is launched only once the previous one's
emulated clock runs, because a run's start-up (imports, data, processes, at
normal priority) would starve its neighbours' trainers (``SCHED_IDLE``) of
CPU and make them overrun. With
``jobs = "auto"`` the sweep starts with one run, measures how many cores a
finished run really used (its process tree's CPU time over its real time,
from ``wait4``), and admits as many concurrent runs as fit in 50 % of the
cores by that measure (a run that mostly waits on emulated latency uses a
fraction of a core; the other half is room for bursts, which coincide),
never more than ``max_jobs`` (or the sweep file's own ``max_jobs``, for runs
measured to fail beside more of their kind whatever their mean load) nor
more than memory allows, and climbs
there one run at a time: each faithful run lets one more go at once, and
so does the machine itself before any has finished (the live ramp: when the
runs at once have gone unchanged for 20 s, the machine's busy cores over
that stretch, from ``/proc/stat``, leave room in that 50 % for one more
of their share), so a pool whose first runs take minutes does not wait
that long for its second. Where the load of every run is known in advance
(``run_sweeps(loads=)``: the cores each point's run used before, as the
claims tool keeps them), runs are packed by those loads instead, first fit
in the queue's order (a light run goes while the heaviest waits for room),
within a share of the cores that shrinks by a fifth at each crowded failure
and grows back by 0.02 a faithful run. A
failed verdict of a run that shared the machine with another says the runs
at once crowded each other (their event loops waited for a core, their
trainers overran), not that its point needs more dilation: it goes again
and does not count against the point's ``max_attempts`` (up to four such
attempts do not). Then, if the cores have room for more runs by the
measured load, the sweep doubles the dilation of every later run (up to
``max_scale``, 4 by default) and lets twice as many go at once, minus
one, straight away (climbing there again one by one would do less work
per unit of time, meanwhile, than one run at a time): each run then
needs half the CPU per real second and has twice the timing margin, so
the runs finish sooner together than one at a time (at 2 runs crowded, 3
at twice the dilation do 1.5 runs' work per unit of time); the last runs
of the sweep, once no more are left than went at once at their own
dilation, go at it again. Otherwise the concurrency halves. Either way
the sweep runs no more at once than when it failed until as many faithful
runs in a row have ended at that level as it allows (and at least 2, 4,
8 ... after each crowding); then one more may go (additive increase,
multiplicative decrease). Sweeps run together in one pool
(``run_sweeps``) each have their own multiple: a crowded failure doubles
the dilation of that sweep's later runs (up to ``max_scale``), and leaves
the other sweeps' runs and the pool's concurrency as they were; only a
crowded failure of a sweep already at ``max_scale`` cuts the concurrency
(a pool of every claim's sweeps once slowed every run to 4x its dilation
after two sweeps' failures, and with no multiple at all fell to one run at
a time). A run that failed alone asks its point for more dilation. A
dilation changes how long a run takes, not what it computes: a faithful
run's emulated-time results are the same at any dilation.

Each run forks from the sweep's process, which imports torch and the run's
code once (``fedsim.sweep.launch``; ``FEDSIM_SWEEP_FORK=0``: a new
interpreter per run, ``python -m fedsim.cli run``, as with another
``python``).

A half-finished sweep resumes: run the same command again (or ``fedsim
sweep OUT_DIR``) and finished points are kept; a point whose run was
interrupted is run again from the start.

The package's modules, in the order they build on each other: ``spec``
(the sweep file and command line into a :class:`Sweep` of :class:`Point`\ s),
``results`` (what became of each point, read from its run directory),
``plots`` and ``tables`` (the figures, sweep.csv and aggregate.csv), ``launch``
(starting one run: forked or a new interpreter) and
``execute`` (running the points: scheduling, reruns, resume, progress).
"""

from fedsim.sweep.execute import SweepResult, run_sweep, run_sweeps
from fedsim.sweep.plots import sweep_figures, x_key
from fedsim.sweep.results import FIGURES, PointResult, figure, read_results
from fedsim.sweep.spec import (
    Point,
    Sweep,
    SweepError,
    Variant,
    load_sweep,
    parse_grid,
    short_key,
    sweep_from_scenario,
)
from fedsim.sweep.tables import aggregate, mean_ci, t_quantile, write_tables

__all__ = [
    "FIGURES",
    "Point",
    "PointResult",
    "Sweep",
    "SweepError",
    "SweepResult",
    "Variant",
    "aggregate",
    "figure",
    "load_sweep",
    "mean_ci",
    "parse_grid",
    "read_results",
    "run_sweep",
    "run_sweeps",
    "short_key",
    "sweep_figures",
    "sweep_from_scenario",
    "t_quantile",
    "write_tables",
    "x_key",
]
