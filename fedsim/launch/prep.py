"""A run's directory before and after the run: made fresh with its resolved
scenario (``prepare``), read back to resume (``prepare_resume``), its plots
drawn at the end (``finish``). Used by ``fedsim run``, ``fedsim server`` and
the deployment commands."""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import logging
from pathlib import Path
from typing import Any

from fedsim.errors import ResumeError, ScenarioError
from fedsim.launch.dilation import calibrate_dilation, measure_step_time
from fedsim.results.values import Summary
from fedsim.results.writer import (
    CHECKPOINT_FILE,
    CHECKPOINT_FORMAT,
    OLD_CHECKPOINT_HELP,
    write_json_atomic,
)
from fedsim.scenario import Scenario, key_notes, parse, resolved, to_toml
from fedsim.scenario.network import NetPlan
from fedsim.wire import statefile

__all__ = ["finish", "new_run_dir", "prepare", "prepare_resume"]

log = logging.getLogger("fedsim.launch.runner")


def new_run_dir(sc: Scenario, out: str | Path | None) -> Path:
    """``out`` if given, else ``runs/<name>-<timestamp>``; created empty."""
    if out is None:
        stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        path = Path("runs") / f"{sc.name}-{stamp}"
        i = 1
        while path.exists():
            i += 1
            path = Path("runs") / f"{sc.name}-{stamp}-{i}"
    else:
        path = Path(out)
    path.mkdir(parents=True, exist_ok=True)
    for name in ("events.jsonl", "metrics.csv", "summary.json", "fedsim-run.json",
                 "accuracy.png", "staleness.png", "timeline.png"):
        with contextlib.suppress(FileNotFoundError):
            (path / name).unlink()
    return path


def prepare(sc: Scenario, out: str | Path | None, dilation: float | str | None,
            hosts: int) -> tuple[Scenario, Path, float, dict[str, Any]]:
    """Settle a run's runtime values and write its resolved scenario.

    Measures this machine's step time when the device model needs it,
    resolves ``dilation`` (``"auto"`` calibrates for ``hosts`` client
    hosts), and writes scenario.json, scenario.toml and heterogeneity.json
    into a fresh run directory. Returns the scenario as run, the run
    directory, the dilation and the resolved data.
    """
    run_dir = new_run_dir(sc, out)
    real_step = None
    if sc.devices.model == "speed_factor" and sc.devices.host_step_time is None:
        real_step = measure_step_time(sc)
        sc = sc.model_copy(update={"devices": sc.devices.model_copy(
            update={"host_step_time": real_step})})
    data = resolved(sc)
    choice = dilation if dilation is not None else sc.run.dilation
    if choice == "auto":
        if sc.algorithm.client_table() is not None:
            raise ScenarioError(
                "run.dilation = \"auto\" times fedsim's own local training; this "
                f"algorithm's clients run code of their own ({sc.algorithm.client_table()}), "
                "which nothing can time before the run: give a number (2 to start with; a "
                "run whose fidelity verdict fails names the one that passes)",
                problems=["run.dilation: 'auto' cannot time a Flower app's ClientApp"])
        choice = calibrate_dilation(sc, hosts, real_step)  # logs its one line at INFO
    data["run"]["dilation"] = choice
    # one record per client: written on one line (start-up time at 10,000 clients)
    write_json_atomic(run_dir / "heterogeneity.json",
                      NetPlan(sc, host_step_time=sc.devices.host_step_time).record(),
                      indent=None)
    write_json_atomic(run_dir / "scenario.json", data)
    (run_dir / "scenario.toml").write_text(
        "# Resolved scenario: every default filled in (keys set to none are omitted).\n"
        + to_toml(data, key_notes(sc)))
    return sc, run_dir, float(choice), data


def prepare_resume(run_dir: str | Path) -> tuple[Scenario, Path, float, dict[str, Any]]:
    """The scenario, run directory, dilation and resolved data of a run to resume."""
    path = Path(run_dir)
    try:
        data = json.loads((path / "scenario.json").read_text())
    except FileNotFoundError:
        raise ResumeError(f"{path} is not a run directory (no scenario.json)") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise ResumeError(f"{path / 'scenario.json'}: {exc}") from None
    sc = parse(data, str(path / "scenario.json"))
    why = sc.algorithm.resumable()
    if why is not None:
        raise ResumeError(f"{path}: {why}")
    _refuse_finished(path)
    _check_checkpoint(path / CHECKPOINT_FILE)
    return sc, path, float(data["run"]["dilation"]), data


def _refuse_finished(run_dir: Path) -> None:
    """A run that completed (its stop rule fired) has nothing to resume: resuming it
    would run its tail again and overwrite its results. An interrupted, failed or
    killed run (``running`` in a summary no one finished) is resumed."""
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, json.JSONDecodeError):
        return  # killed before its first summary: the checkpoint decides
    if isinstance(summary, dict) and Summary(summary).completed:
        raise ResumeError(
            f"{run_dir}: the run completed ({summary.get('stop_reason') or 'its stop rule'}): "
            "nothing to resume, and resuming would overwrite its results; a longer run "
            "is a new one (fedsim run SCENARIO --set run.time_budget=...)")


def _check_checkpoint(path: Path) -> None:
    """Refuse a missing, pickled or unknown checkpoint now, before any process starts
    (the server reads it whole, and checks its version and scenario, later)."""
    try:
        value = statefile.read_header(path, "checkpoint", OLD_CHECKPOINT_HELP)
    except FileNotFoundError:
        raise ResumeError(f"{path}: the run wrote no checkpoint (nothing to resume)") from None
    except (OSError, ValueError) as exc:
        raise ResumeError(str(exc)) from None
    got = value.get("format") if isinstance(value, dict) else None
    if got != CHECKPOINT_FORMAT:
        raise ResumeError(f"{path}: unknown checkpoint format {got!r} (this fedsim reads "
                          f"format {CHECKPOINT_FORMAT})")


def finish(run_dir: Path) -> None:
    """Draw a finished (or stopped) run's plots; never lose the run for them.

    The per-client timeline is drawn unless the run is large
    (:func:`fedsim.results.plots.timeline_is_large`; then ``fedsim plot RUN --timeline``).
    """
    from fedsim.results.plots import (  # lazy: matplotlib stays out of client hosts
        plot_run,
        timeline_is_large,
    )

    try:
        plot_run(run_dir)
    except Exception as exc:  # plots are a convenience
        log.warning("plotting failed: %s", exc)
        return
    if timeline_is_large(run_dir):
        log.warning("a large run: no timeline.png (fedsim plot %s --timeline draws it)",
                    run_dir)
