"""fedsim from Python: load a scenario, run it, read its results.

::

    import fedsim

    sc = fedsim.load("scenarios/quickstart.toml", overrides={"run.time_budget": 5})
    result = fedsim.run(sc, out="runs/qs")       # or: await fedsim.arun(sc, ...)
    result.summary.final_accuracy                 # typed; result.summary["fidelity"] too
    result.metrics["accuracy"]                    # a column; result.metrics.columns
    result.plot()                                 # accuracy.png, staleness.png

The validation is the command line's (the same errors, raised as
:class:`~fedsim.errors.ScenarioError` instead of printed), and so is the
run: the same server, client-host processes and torch workers. A library
never exits: a run that ends ``failed`` or ``error`` raises
:class:`~fedsim.errors.RunFailed`, one that is stopped raises
:class:`~fedsim.errors.RunInterrupted`; both carry the
:class:`~fedsim.results.values.RunResult` of what it wrote.

:func:`run` works inside a running event loop (Jupyter runs one): the run
then gets its own loop in a worker thread while the caller waits.
:func:`arun` awaits it without blocking the caller's loop; cancelling the
awaiting task stops the run cleanly (a second cancel aborts it). Interrupting
the kernel (Ctrl-C) stops a :func:`run` cleanly too.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedsim.errors import FedsimError, RunFailed, RunInterrupted, ScenarioError
from fedsim.results.values import RunResult
from fedsim.scenario import overrides as _overrides
from fedsim.scenario.overrides import Override

if TYPE_CHECKING:
    from fedsim.actors.runstate import Progress
    from fedsim.launch.runner import RunControl
    from fedsim.scenario import Scenario

__all__ = ["aresume", "arun", "as_toml", "load", "open_run", "resume", "run"]

Overrides = Mapping[str, Any] | Sequence[str]
ProgressArg = Callable[["Progress"], None] | bool | None


def load(source: str | Path | Mapping[str, Any] | Scenario,
         overrides: Overrides | Sequence[Override] | None = None, *,
         runs_here: bool = True) -> Scenario:
    """A validated scenario, as ``fedsim check`` validates it.

    Parameters
    ----------
    source
        A scenario file (TOML), a mapping shaped like one
        (``{"algorithm": {"name": "fedavg"}, ...}``), or a scenario to derive
        another from.
    overrides
        Keys to set, as a mapping of dotted keys to values
        (``{"run.time_budget": 5, "model.hidden": [64, 32]}``; a mapping
        value sets the keys under it), or ``"key=value"`` strings in the
        command line's syntax.
    runs_here
        False for a scenario that runs on other machines (a batch script
        written on a login node): a built-in dataset's ``data.path`` is not
        looked for here.

    Raises
    ------
    ScenarioError
        Naming every bad key, its value and what is allowed;
        :class:`~fedsim.errors.OverrideError` when only the overrides are to
        blame, :class:`~fedsim.errors.PluginError` when a plug-in is missing.
    """
    from fedsim.scenario import (  # lazy: api stays pydantic-free (test_api)
        Scenario,
        parse,
        resolved,
    )
    from fedsim.scenario import load as load_file  # lazy: api stays pydantic-free (test_api)
    from fedsim.scenario.network import (  # lazy: api stays pydantic-free (test_api)
        NetPlan,
        NetworkError,
    )

    if overrides is None or isinstance(overrides, Mapping):
        ovs = _overrides.from_python(overrides)
    elif all(isinstance(o, Override) for o in overrides):
        ovs = list(overrides)  # type: ignore[arg-type]
    else:
        ovs = _overrides.from_python([str(o) for o in overrides])
    # an optimizer option the chosen optimizer does not read is refused as in
    # a file (of a resolved scenario, only the keys the overrides set)
    if isinstance(source, Scenario):
        label = f"scenario {source.name!r}"
        raw = resolved(source)
        sc = parse(_overrides.apply(raw, ovs), label, ovs, base=raw, written=True,
                   runs_here=runs_here)
    elif isinstance(source, Mapping):
        label = "scenario"
        sc = parse(_overrides.apply(source, ovs), label, ovs, base=source, written=True,
                   runs_here=runs_here)
    else:
        label = str(source)
        sc = load_file(source, ovs, runs_here=runs_here)
    try:
        NetPlan(sc).check()
    except NetworkError as exc:
        raise ScenarioError(f"{label}: invalid scenario\n  {exc}", source=label,
                            problems=[str(exc)]) from None
    return sc


def as_toml(scenario: Scenario) -> str:
    """The scenario with every default filled in, as ``fedsim check`` prints it
    (keys the algorithm or model does not read are marked, and so are keys that
    replace the named network profile's values)."""
    from fedsim.scenario import (  # lazy: api stays pydantic-free (test_api)
        key_notes,
        resolved,
        to_toml,
    )

    return to_toml(resolved(scenario), key_notes(scenario))


def open_run(run_dir: str | Path) -> RunResult:
    """The result of a run directory: finished, stopped, killed, or still running."""
    return RunResult.of(run_dir)


def run(scenario: Scenario | str | Path, *, out: str | Path | None = None,
        dilation: float | str | None = None, progress: ProgressArg = None,
        plots: bool = True) -> RunResult:
    """Run a scenario to its end on this machine; its result.

    Parameters
    ----------
    scenario
        A scenario from :func:`load` (a path is loaded first).
    out
        The run directory (default ``runs/NAME-TIME``).
    dilation
        Real seconds per emulated second, or ``"auto"`` (default: the scenario's).
    progress
        Called with a :class:`~fedsim.actors.runstate.Progress` as the run
        goes (from the run's thread); ``True`` prints a line every 10 real
        seconds.
    plots
        Draw the run's PNGs (accuracy, staleness, timeline) when it ends
        (``False``: :func:`fedsim.results.plots.plot_run` or ``fedsim plot RUN`` draws
        them later).

    Raises
    ------
    RunFailed
        The run ended ``failed: ...`` or ``error: ...``, or could not go on
        (``.result`` holds what it wrote, if anything; the cause is chained).
    RunInterrupted
        Ctrl-C, or the process was told to stop (``.result`` holds what it did).
    """
    sc = scenario if not isinstance(scenario, str | Path) else load(scenario)
    return _wait(_Job(sc, out, dilation, None, progress, plots))


async def arun(scenario: Scenario | str | Path, *, out: str | Path | None = None,
               dilation: float | str | None = None, progress: ProgressArg = None,
               plots: bool = True) -> RunResult:
    """:func:`run` for a coroutine: awaits the run without blocking this event loop.

    Cancelling the awaiting task stops the run cleanly (status
    ``interrupted``) and waits for it to write its results; a second cancel
    aborts it.
    """
    sc = scenario if not isinstance(scenario, str | Path) else load(scenario)
    return await _await(_Job(sc, out, dilation, None, progress, plots))


def resume(run_dir: str | Path, *, progress: ProgressArg = None,
           plots: bool = True) -> RunResult:
    """Continue a run from its last checkpoint (raises :class:`~fedsim.errors.ResumeError`
    when it cannot); otherwise as :func:`run`."""
    return _wait(_Job(None, None, None, run_dir, progress, plots))


async def aresume(run_dir: str | Path, *, progress: ProgressArg = None,
                  plots: bool = True) -> RunResult:
    """:func:`resume` for a coroutine (as :func:`arun`)."""
    return await _await(_Job(None, None, None, run_dir, progress, plots))


# -- running ---------------------------------------------------------------------------


def _printer() -> Callable[[Progress], None]:
    last = [-float("inf")]

    def show(p: Progress) -> None:
        if p.real - last[0] >= 10.0:
            last[0] = p.real
            acc = "-" if p.accuracy is None else f"{p.accuracy:.4f}"
            print(f"t={p.t:.1f} s (emulated)  real={p.real:.0f} s  updates={p.updates}  "
                  f"rounds={p.rounds}  acc={acc}", flush=True)

    return show


class _Job:
    """One run, on the calling thread or a worker thread, stoppable from outside."""

    def __init__(self, sc: Scenario | None, out: str | Path | None,
                 dilation: float | str | None, resume: str | Path | None,
                 progress: ProgressArg, plots: bool = True) -> None:
        from fedsim.launch.runner import RunControl  # lazy: api stays pydantic-free (test_api)

        self.sc, self.out, self.dilation, self.resume = sc, out, dilation, resume
        self.plots = plots
        self.progress = _printer() if progress is True else (progress or None)
        self.control: RunControl = RunControl()

    def __call__(self) -> RunResult:
        from fedsim.launch.runner import run_scenario  # lazy: api stays pydantic-free (test_api)

        try:
            result = run_scenario(self.sc, self.out, dilation=self.dilation,
                                  resume=self.resume, on_progress=self.progress,
                                  control=self.control, plots=self.plots)
        except FedsimError:
            raise
        except Exception as exc:  # the run could not go on (a plug-in's model fails, ...)
            raise RunFailed(f"the run failed: {type(exc).__name__}: {exc}",
                            self._partial()) from exc
        status = result.status
        if status == "interrupted":
            raise RunInterrupted(f"the run was interrupted; its results are in {result.run_dir}",
                                 result)
        if status.startswith(("failed", "error")):
            raise RunFailed(f"the run ended {status!r}; see {result.run_dir}", result)
        return result

    def _partial(self) -> RunResult | None:
        """What a run that failed on its way wrote, if it got as far as a summary."""
        where = self.resume if self.resume is not None else self.out
        if where is None:
            return None
        try:
            return RunResult.of(where)
        except FileNotFoundError:
            return None

    def start(self) -> concurrent.futures.Future[RunResult]:
        """Run on a new thread (which gets its own event loop)."""
        fut: concurrent.futures.Future[RunResult] = concurrent.futures.Future()

        def target() -> None:
            if not fut.set_running_or_notify_cancel():
                return
            try:
                fut.set_result(self())
            except BaseException as exc:  # handed to the waiting caller
                fut.set_exception(exc)

        threading.Thread(target=target, name="fedsim-run", daemon=True).start()
        return fut


def _running_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _wait(job: _Job) -> RunResult:
    """Run ``job`` here, or on a worker thread when this thread runs an event loop."""
    if not _running_loop():
        return job()
    fut = job.start()
    while True:
        try:
            return fut.result()
        except KeyboardInterrupt:  # a kernel interrupt: stop cleanly (again: abort), wait
            job.control.interrupt()


async def _await(job: _Job) -> RunResult:
    """Await ``job`` on a worker thread.

    A cancel stops the run cleanly and waits for it to write its results (a
    second cancel aborts it); a KeyboardInterrupt stops it and goes on at once.
    """
    fut = asyncio.wrap_future(job.start())
    try:
        return await asyncio.shield(fut)
    except KeyboardInterrupt:
        job.control.interrupt()
        fut.add_done_callback(lambda f: f.cancelled() or f.exception())  # nobody awaits it
        raise
    except asyncio.CancelledError:
        job.control.interrupt()
        while not fut.done():
            try:
                await asyncio.shield(fut)
            except asyncio.CancelledError:
                job.control.interrupt()
            except BaseException:  # the run's own outcome: the cancel is what we report
                break
        raise
