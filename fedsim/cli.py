"""The ``fedsim`` command line.

Exit codes: 0 success; 2 a bad scenario or bad usage (the message names the
key, the value and what is allowed); 3 a run that failed; 130 a run
interrupted with Ctrl-C (its results so far are written). The library
raises typed errors (:mod:`fedsim.errors`); this module alone turns them
into messages and exit codes.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import tomllib
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click

from fedsim.deploy.slurm import job_script
from fedsim.errors import (
    DeployError,
    FedsimError,
    ResumeError,
    RunFailed,
    RunInterrupted,
    ScenarioError,
)
from fedsim.results.report import format_summary, format_value
from fedsim.scenario import overrides as _overrides
from fedsim.scenario.ids import format_ids, parse_ids

if TYPE_CHECKING:
    from fedsim.actors.runstate import Progress
    from fedsim.scenario import Scenario

__all__ = ["main"]

EXIT_OK = 0
EXIT_SCENARIO = 2
EXIT_FAILED = 3
EXIT_INTERRUPTED = 130

#: The exit code of each error the library raises (the first match counts).
EXIT_CODES: tuple[tuple[type[BaseException], int], ...] = (
    (ScenarioError, EXIT_SCENARIO),
    (ResumeError, EXIT_SCENARIO),
    (DeployError, EXIT_SCENARIO),
    (RunInterrupted, EXIT_INTERRUPTED),
    (RunFailed, EXIT_FAILED),
    (FedsimError, EXIT_FAILED),
)

SET_HELP = ("Override a scenario key, e.g. --set algorithm.alpha=0.3 or "
            "--set 'model.hidden=[64, 32]' (a TOML value; repeatable).")


def _exit(exc: FedsimError, prefix: str = "", code: int | None = None) -> NoReturn:
    """Print a library error and exit with ``code`` (default: its :data:`EXIT_CODES` entry)."""
    if code is None:
        code = next(c for cls, c in EXIT_CODES if isinstance(exc, cls))
    click.echo(f"error: {prefix}{exc}", err=True)
    sys.exit(code)


@contextmanager
def _exits_on(*catch: type[BaseException], close: Callable[[], None] | None = None,
              report: bool = False, prefixes: Mapping[type[FedsimError], str] | None = None,
              code: int | None = None, interrupted: str = "interrupted") -> Iterator[None]:
    """Turn the errors of ``catch`` raised in the block into a message and an exit code.

    The one place a subcommand's errors become what the user sees; an error
    not in ``catch`` propagates untouched (a traceback: a bug). A caught
    error first calls ``close`` (the live progress line), then is handled by
    the first entry of ``catch`` it is an instance of, as an ``except``
    clause would be:

    * a :class:`FedsimError` class: with ``report``, a :class:`RunFailed` or
      :class:`RunInterrupted` that carries its run's result prints the run's
      summary and exits with the run's status (3 or 130), as a run that
      ended by itself does; any other prints ``error: <prefix><message>``
      (the prefix of its class in ``prefixes``) and exits with ``code`` if
      given, else with its :data:`EXIT_CODES` entry;
    * :class:`KeyboardInterrupt` (Ctrl-C): prints ``interrupted``, exits 130;
    * :class:`ValueError`: prints ``error: <message>``, exits 2;
    * :class:`Exception`: prints ``error: run failed: <type>: <message>``,
      exits 3.
    """
    try:
        yield
    except catch as exc:
        if close is not None:
            close()
        kind = next(c for c in catch if isinstance(exc, c))
        if isinstance(exc, FedsimError) and issubclass(kind, FedsimError):
            if (report and isinstance(exc, RunFailed | RunInterrupted)
                    and exc.result is not None):
                _report(exc.result)
                sys.exit(_status_code(exc.result.summary))
            prefix = next((p for cls, p in (prefixes or {}).items() if isinstance(exc, cls)), "")
            _exit(exc, prefix, code)
        if issubclass(kind, KeyboardInterrupt):
            click.echo(interrupted, err=True)
            sys.exit(EXIT_INTERRUPTED)
        if issubclass(kind, ValueError):
            click.echo(f"error: {exc}", err=True)
            sys.exit(EXIT_SCENARIO)
        if issubclass(kind, Exception):
            click.echo(f"error: run failed: {type(exc).__name__}: {exc}", err=True)
            sys.exit(EXIT_FAILED)
        raise


class ProgressLine:
    """A live status line (rich on a terminal, plain lines otherwise).

    Called with each :class:`~fedsim.actors.runstate.Progress` of a run.
    """

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.live = None
        self._last_plain = 0.0
        if enabled and sys.stdout.isatty():
            from rich.console import Console  # lazy: rich only for a terminal's live line
            from rich.live import Live  # lazy: rich only for a terminal's live line

            self.live = Live(console=Console(), auto_refresh=False, transient=True)
            self.live.start()

    def __call__(self, p: Progress) -> None:
        if not self.enabled:
            return
        budget = f"/{p.budget:.0f}" if p.budget else ""
        line = (f"t={p.t:7.2f}{budget} s (emulated)  real={p.real:6.1f} s  "
                f"updates={p.updates}  {f'rounds={p.rounds}  ' if p.rounds else ''}"
                f"in flight={p.in_flight}  "
                f"acc={format_value(p.accuracy)}  "
                f"staleness={format_value(p.staleness_mean, '.2f')}")
        if self.live is not None:
            from rich.text import Text  # lazy: rich only for a terminal's live line

            self.live.update(Text(line), refresh=True)
        elif p.real - self._last_plain >= 10.0:
            self._last_plain = p.real
            click.echo(line)

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()


@click.group()
@click.version_option(package_name="fedsim")
@click.option("-v", "--verbose", count=True, help="More log output (-v info, -vv debug).")
def cli(verbose: int) -> None:
    """fedsim: federated learning over a real, emulated network."""
    level = {0: logging.WARNING, 1: logging.INFO}.get(verbose, logging.DEBUG)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("FEDSIM_LOG", logging.getLevelName(level))


def _say_info(logger: str = "fedsim") -> None:
    """Show ``logger``'s INFO lines without ``-v``: all of fedsim's for ``fedsim server``
    and ``fedsim clients``, which run unattended on other machines (listening, each phase
    of a host); ``--dilation auto``'s one line for ``fedsim run``."""
    log_ = logging.getLogger(logger)
    if log_.getEffectiveLevel() > logging.INFO:
        log_.setLevel(logging.INFO)


def _scenario_or_resume(scenario: str | None, resume: str | None, sets: tuple[str, ...],
                        dilation: str | None, out: str | None) -> Scenario | None:
    """The scenario to run, or None when resuming (the run directory holds it)."""
    if resume is not None:
        if scenario is not None or sets or dilation is not None or out is not None:
            raise click.UsageError("--resume RUN_DIR continues a run as it was: give no "
                                   "SCENARIO, --set, --dilation or --out with it")
        return None
    if scenario is None:
        raise click.UsageError("give a SCENARIO file (or --resume RUN_DIR)")
    return _load(scenario, sets, dilation)


def _load(path: str, sets: tuple[str, ...], dilation: str | None = None, *,
          runs_here: bool = True) -> Scenario:
    """The validated scenario (``fedsim.load``); exit 2 naming what is wrong.

    ``runs_here=False``: a command that runs nothing here (``fedsim keys``,
    ``fedsim slurm`` on a login node) does not look for ``data.path``.
    """
    from fedsim.api import load  # lazy: fedsim --help stays fast

    with _exits_on(ScenarioError):
        return load(path, _overrides.from_cli(sets, dilation), runs_here=runs_here)


def _report(result: Any) -> None:
    """Print a run's summary (:func:`fedsim.results.report.format_summary`)."""
    for line in format_summary(result.summary, result.run_dir):
        click.echo(line)


def _status_code(summary: Any) -> int:
    status = str(summary.get("status", ""))
    if status == "interrupted":
        return EXIT_INTERRUPTED
    if status.startswith(("failed", "error")):
        return EXIT_FAILED
    return EXIT_OK


@cli.command()
@click.argument("scenario", type=click.Path(dir_okay=False), required=False)
@click.option("--out", type=click.Path(file_okay=False),
              help="Run directory (default runs/NAME-TIME).")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help=SET_HELP)
@click.option("--dilation", help="Real seconds per emulated second, or 'auto'.")
@click.option("--resume", type=click.Path(exists=True, file_okay=False),
              help="Continue RUN_DIR from its last checkpoint (no SCENARIO).")
@click.option("--no-progress", is_flag=True, help="No live progress line.")
@click.option("--no-plots", is_flag=True,
              help="Draw no PNGs at the end (fedsim plot RUN draws them later).")
def run(scenario: str | None, out: str | None, sets: tuple[str, ...], dilation: str | None,
        resume: str | None, no_progress: bool, no_plots: bool) -> None:
    """Run SCENARIO (a TOML file) on this machine."""
    from fedsim.actors.process import set_up_in_background  # lazy: fedsim --help stays fast

    set_up_in_background()   # a sweep's run sets up in the idle class (its neighbours train)
    from fedsim import api  # lazy: fedsim --help stays fast

    sc = _scenario_or_resume(scenario, resume, sets, dilation, out)
    _say_info("fedsim.launch.dilation")  # the dilation --dilation auto chose
    progress = ProgressLine(not no_progress)
    # a failed or interrupted run prints its summary, as one that ended by itself
    with _exits_on(FedsimError, KeyboardInterrupt, Exception, close=progress.close,
                   report=True, prefixes={ResumeError: "cannot resume: "}):
        if sc is None:
            assert resume is not None
            result = api.resume(resume, progress=progress, plots=not no_plots)
        else:
            result = api.run(sc, out=out, progress=progress, plots=not no_plots)
    progress.close()
    _report(result)


@cli.command()
@click.argument("scenario", type=click.Path(dir_okay=False))
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help=SET_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of TOML.")
def check(scenario: str, sets: tuple[str, ...], as_json: bool) -> None:
    """Validate SCENARIO and print it with every default filled in.

    Keys the algorithm or model does not read (client.local_steps under DGA,
    which takes algorithm.local_steps per round) are marked with a comment.
    """
    from fedsim.api import as_toml  # lazy: fedsim --help stays fast
    from fedsim.scenario import resolved  # lazy: fedsim --help stays fast

    sc = _load(scenario, sets)
    click.echo(json.dumps(resolved(sc), indent=2) if as_json else as_toml(sc), nl=False)


def _window(text: str | None) -> tuple[float, float | None] | None:
    """``--window START:END`` (emulated seconds; either side may be empty)."""
    if text is None:
        return None
    lo, sep, hi = text.partition(":")
    try:
        start = float(lo) if lo.strip() else 0.0
        end = float(hi) if hi.strip() else None
    except ValueError:
        sep = ""
    if not sep or start < 0 or (end is not None and end <= start):
        raise click.BadParameter(f"{text!r}: write START:END in emulated seconds with "
                                 "0 <= START < END, e.g. 2:6, :10 or 30:", param_hint="--window")
    return start, end


def _load_runs(paths: tuple[str, ...]) -> list[Any]:
    """Every run directory read and checked; exit 2 with a one-line reason for one that is not."""
    from fedsim.results.reader import RunDirError, load_run  # lazy: fedsim --help stays fast

    with _exits_on(RunDirError, code=EXIT_SCENARIO):
        return [load_run(p) for p in paths]


def _compare(runs: list[Any], out: str | None, target: float | None,
             labels: tuple[str, ...]) -> None:
    """Print the comparison table of ``runs``; write it and the overlay figures to ``out``."""
    from fedsim.results.compare import (  # lazy: fedsim --help stays fast
        comparison_rows,
        comparison_warnings,
        default_labels,
        format_table,
        plot_comparison,
        shared_target,
        write_csv,
    )

    if labels and len(labels) != len(runs):
        raise click.BadParameter(f"{len(labels)} labels for {len(runs)} runs: give one "
                                 "--label per RUN, in order", param_hint="--label")
    names = list(labels) or default_labels(runs)
    if target is None:
        target = shared_target(runs)
    out_dir = Path(out) if out is not None else runs[0].path.parent
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = comparison_rows(runs, names, target)
    click.echo(format_table(rows))
    for p in [write_csv(rows, out_dir / "compare.csv"),
              *plot_comparison(runs, names, out_dir, target)]:
        click.echo(str(p))
    # last, where it is read: the table above compares what may not compare
    for warning in comparison_warnings(runs, names):
        click.echo(warning, err=True)


_TARGET = click.option("--target", type=click.FloatRange(0.0, 1.0), metavar="ACC",
                       help="Target accuracy for the target line and time to target "
                       "(default: the runs' own, if they share one).")
_OUT = click.option("--out", type=click.Path(file_okay=False),
                    help="Where several runs' figures and compare.csv go "
                    "(default: the first run's parent directory).")
_LABEL = click.option("--label", "labels", multiple=True, metavar="NAME",
                      help="A run's name in legends and the table, once per RUN in order "
                      "(default: the directory names).")


@cli.command()
@click.argument("runs", nargs=-1, required=True, type=click.Path(file_okay=False))
@click.option("--out", type=click.Path(), metavar="PATH",
              help="Several runs: the directory for their figures and compare.csv (default: "
              "the first run's parent directory). One run: the directory for its figures "
              "(default: its own), or with --timeline, --window or --clients a FILE.png for "
              "its timeline.")
@_TARGET
@_LABEL
@click.option("--timeline", is_flag=True,
              help="Draw the per-client timeline even for a large run.")
@click.option("--clients", "client_ids", metavar="RANGE",
              help="Draw only the timeline, of these clients, e.g. 0-9,20 (default: all, or "
              "a sample of 40).")
@click.option("--window", metavar="START:END",
              help="Draw only the timeline, of this emulated-time window in seconds, e.g. "
              "2:6 (default: all). Without --out it goes beside the run's own timeline.png, "
              "as timeline-START-END.png.")
def plot(runs: tuple[str, ...], out: str | None, target: float | None, labels: tuple[str, ...],
         timeline: bool, client_ids: str | None, window: str | None) -> None:
    """Draw the plots of one run, or compare several.

    One RUN: accuracy.png (accuracy and loss), staleness.png and timeline.png
    in its directory (also on a run that was killed); with --window or
    --clients only the timeline of that part, named after it
    (timeline-2-6.png, timeline-clients-0-9.png), coloured on the whole
    run's staleness scale. Several: overlay figures and a comparison table,
    as `fedsim compare` draws.
    """
    from fedsim.results.plots import (  # lazy: fedsim --help stays fast
        plot_run,
        plot_timeline,
        timeline_is_large,
        timeline_name,
    )

    span = _window(window)
    to_file = out is not None and out.lower().endswith(".png")
    if len(runs) > 1:
        if timeline or client_ids or span:
            raise click.UsageError("--timeline, --clients and --window draw one run's "
                                   "timeline: give one RUN")
        if to_file:
            raise click.BadParameter(f"{out!r}: several runs' figures go to a directory",
                                     param_hint="--out")
        _compare(_load_runs(runs), out, target, labels)
        return
    if labels:
        raise click.UsageError("--label names each of several runs; give it with more than "
                               "one RUN")
    part = client_ids is not None or span is not None
    if to_file and not (timeline or part):
        raise click.UsageError(f"--out {out} names one figure: give --timeline, --window or "
                               "--clients to draw the timeline there, or a directory for all "
                               "of the run's figures")
    (run,) = _load_runs(runs)
    ids = None
    if client_ids is not None:
        total = run.summary.get("clients")
        try:
            ids = parse_ids(client_ids, total if isinstance(total, int) else None)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--clients") from None
    why = run.summary.get("interrupted_reason") or run.summary.get("stop_reason")
    click.echo(f"{run.path}: {run.status}" + (f" ({why})" if why else ""))
    if to_file or part:
        # one figure: the timeline (of a part of the run), never over the run's own
        where = Path(out) if out is not None else run.path
        path = where if to_file else where / timeline_name(span, ids)
        path.parent.mkdir(parents=True, exist_ok=True)
        click.echo(str(plot_timeline(run, path, clients=ids, window=span)))
        return
    wants_timeline = True if timeline else None
    for p in plot_run(run, timeline=wants_timeline, target=target, out_dir=out):
        click.echo(str(p))
    if wants_timeline is None and timeline_is_large(run.path):
        click.echo("no timeline.png: a large run's timeline is drawn on request (--timeline, "
                   "or --window/--clients for a part of it)")


@cli.command()
@click.argument("runs", nargs=-1, required=True, type=click.Path(file_okay=False))
@_OUT
@_TARGET
@_LABEL
def compare(runs: tuple[str, ...], out: str | None, target: float | None,
            labels: tuple[str, ...]) -> None:
    """Compare RUNS: a table (printed, and compare.csv) and overlay figures.

    compare-time.png (accuracy and loss against emulated time),
    compare-progress.png (against rounds or updates) and compare-bytes.png
    (against megabytes communicated), each with the target line and the
    time each run first reached it.
    """
    _compare(_load_runs(runs), out, target, labels)


@cli.command()
@click.argument("scenario", type=click.Path(dir_okay=False), required=False)
@click.option("--bind", required=True, metavar="ADDRESS",
              help="Where client hosts connect, e.g. tcp://0.0.0.0:5555.")
@click.option("--keys", "keys_dir", type=click.Path(file_okay=False),
              help="Directory made by `fedsim keys` (server.key_secret, allowed.toml).")
@click.option("--insecure", is_flag=True,
              help="No authentication (a trusted lab network only).")
@click.option("--out", type=click.Path(file_okay=False),
              help="Run directory (default runs/NAME-TIME).")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help=SET_HELP + " Client hosts must use the same overrides.")
@click.option("--dilation", help="Real seconds per emulated second, or 'auto'.")
@click.option("--resume", type=click.Path(exists=True, file_okay=False),
              help="Continue RUN_DIR from its last checkpoint (no SCENARIO).")
@click.option("--no-progress", is_flag=True, help="No live progress line.")
def server(scenario: str | None, bind: str, keys_dir: str | None, insecure: bool,
           out: str | None, sets: tuple[str, ...], dilation: str | None, resume: str | None,
           no_progress: bool) -> None:
    """Serve SCENARIO to client hosts on other machines (see `fedsim clients`).

    The federation starts when every client of the scenario has registered,
    or after deploy.start_timeout real seconds with those present. CURVE
    authentication is on for any non-loopback address.
    """
    from fedsim.deploy.run import run_server  # lazy: fedsim --help stays fast

    _say_info()
    sc = _scenario_or_resume(scenario, resume, sets, dilation, out)
    progress = ProgressLine(not no_progress)
    # unlike `run`: a RunFailed prints its message, not a summary, and a
    # ResumeError has no "cannot resume: " prefix
    with _exits_on(FedsimError, KeyboardInterrupt, close=progress.close):
        result = run_server(sc, bind=bind, out=out, keys_dir=keys_dir, insecure=insecure,
                            resume=resume, on_progress=progress)
    progress.close()
    _report(result)
    sys.exit(_status_code(result.summary))


@cli.command()
@click.argument("scenario", type=click.Path(dir_okay=False))
@click.option("--connect", required=True, metavar="ADDRESS",
              help="The server's address, e.g. tcp://server.example:5555.")
@click.option("--ids", required=True, metavar="RANGE",
              help="Client ids this host runs, e.g. 0-49 or 0-9,20-29.")
@click.option("--name", help="This host's name (default host-<first id>); with --keys, the "
              "name its key was made for.")
@click.option("--keys", "keys_dir", type=click.Path(file_okay=False),
              help="Directory holding NAME.key_secret and server.key (from `fedsim keys`).")
@click.option("--insecure", is_flag=True, help="No authentication (the server runs --insecure).")
@click.option("--state", "state_dir", type=click.Path(file_okay=False),
              help="Keep the clients' algorithm state here, so that a restarted host takes it "
              "back (SCAFFOLD's control variates, FedSpeed's correction).")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help=SET_HELP + " Use the server's overrides.")
def clients(scenario: str, connect: str, ids: str, name: str | None, keys_dir: str | None,
            insecure: bool, state_dir: str | None, sets: tuple[str, ...]) -> None:
    """Run a client host: clients IDS of SCENARIO, for the server at CONNECT.

    Exits 0 when the server ends the run, 4 if the server refused this host
    (its version, scenario or key), 3 if the server went silent, 2 if its
    torch worker could not start (e.g. a --state file of an earlier fedsim).
    """
    from fedsim.deploy.run import run_clients  # lazy: fedsim --help stays fast

    _say_info()
    sc = _load(scenario, sets)
    try:
        id_list = parse_ids(ids, sc.data.num_clients)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--ids") from None
    name = name or f"host-{id_list[0]}"
    with _exits_on(FedsimError, KeyboardInterrupt):
        code = run_clients(sc, connect=connect, ids=id_list, name=name, keys_dir=keys_dir,
                           insecure=insecure, state_dir=state_dir)
    sys.exit(code)


@cli.command()
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--hosts", type=click.IntRange(min=1), required=True,
              help="How many client hosts to make keys for.")
@click.option("--clients", "num_clients", type=click.IntRange(min=1),
              help="Clients in the federation (split evenly over the hosts).")
@click.option("--scenario", type=click.Path(dir_okay=False),
              help="Take the number of clients from this scenario.")
@click.option("--ids", "ranges", multiple=True, metavar="RANGE",
              help="Each host's client ids, in host order (repeat once per host).")
def keys(directory: str, hosts: int, num_clients: int | None, scenario: str | None,
         ranges: tuple[str, ...]) -> None:
    """Make CURVE keys: the server's, one pair per client host, and the allow-list.

    Give the server server.key_secret and allowed.toml; give client host i
    host-<i>.key_secret and server.key.
    """
    from fedsim.deploy.keys import make_keys  # lazy: fedsim --help stays fast

    if scenario is not None:
        num_clients = _load(scenario, (), runs_here=False).data.num_clients
    if num_clients is None:
        raise click.UsageError("give --clients N or --scenario FILE")
    with _exits_on(FedsimError, ValueError):
        made = make_keys(directory, hosts, num_clients, list(ranges) or None)
    where = Path(directory)  # keys/ and keys name one directory: no keys//server.key
    click.echo(f"wrote {where / 'server.key'}(_secret) and {where / 'allowed.toml'}")
    for h in made:
        click.echo(f"  {h.name}: clients {format_ids(h.ids)}  ({where / h.name}.key_secret)")


@cli.command()
@click.argument("scenario", type=click.Path(dir_okay=False, exists=True))
@click.option("--hosts", type=click.IntRange(min=1), required=True,
              help="Client hosts (Slurm tasks besides the server's).")
@click.option("--run-dir", required=True, type=click.Path(file_okay=False),
              help="Where the job writes keys, the run and its output (on a shared filesystem).")
@click.option("--out", "out_file", type=click.Path(dir_okay=False),
              help="Write the script here (default: print it).")
@click.option("--port", type=click.IntRange(1, 65535), default=5555, show_default=True)
@click.option("--time", "time_limit", help="Slurm time limit, e.g. 01:00:00.")
@click.option("--partition", help="Slurm partition.")
@click.option("--python", "python", help="Python with fedsim installed on the nodes "
              "(default: this one).")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help=SET_HELP + " Passed to the server and every client host.")
def slurm(scenario: str, hosts: int, run_dir: str, out_file: str | None, port: int,
          time_limit: str | None, partition: str | None, python: str | None,
          sets: tuple[str, ...]) -> None:
    """Write an sbatch script running SCENARIO as one Slurm job: a server and HOSTS hosts."""
    sc = _load(scenario, sets, runs_here=False)  # the job's nodes read the data
    text = job_script(scenario, hosts=min(hosts, sc.data.num_clients),
                      num_clients=sc.data.num_clients, run_dir=run_dir, port=port, sets=sets,
                      time=time_limit, partition=partition, python=python)
    Path(run_dir).mkdir(parents=True, exist_ok=True)  # Slurm writes its output there
    if out_file is None:
        click.echo(text, nl=False)
    else:
        Path(out_file).write_text(text)
        click.echo(f"wrote {out_file}: sbatch {out_file}")


@cli.command()
@click.argument("source", type=click.Path(exists=True))
@click.option("--grid", "grids", multiple=True, metavar="KEY=V1,V2,...",
              help="Sweep KEY over these values (TOML values; repeatable: the grid is the "
              "cartesian product).")
@click.option("--seeds", type=click.IntRange(min=1),
              help="Seeds 1..N for every point (a sweep file may list its own).")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="Override a scenario key on every point (repeatable).")
@click.option("--target", type=click.FloatRange(0, 1, min_open=True),
              help="Target accuracy: time to target is measured against it.")
@click.option("--out", type=click.Path(file_okay=False),
              help="Sweep directory (default sweeps/NAME-TIME). Running the same sweep into "
              "it again resumes it.")
@click.option("--jobs", default="auto", show_default=True, metavar="N|auto",
              help="Runs at once; 'auto' admits as many as keep every verdict passing.")
@click.option("--max-jobs", type=click.IntRange(min=1), default=8, show_default=True,
              help="The most runs at once under --jobs auto.")
@click.option("--max-scale", type=click.FloatRange(min=1), default=4.0, show_default=True,
              help="Under --jobs auto, when runs side by side fail their verdicts but the "
              "cores have room, every later run goes at up to this multiple of its dilation "
              "so that more fit at once (1: never).")
@click.option("--attempts", type=click.IntRange(min=1), default=3, show_default=True,
              help="Runs per point before an unfaithful point is flagged.")
@click.option("--run-plots", is_flag=True,
              help="Each run draws its own PNGs too (default: only the sweep's figures; "
              "fedsim plot OUT/runs/POINT draws a run's later).")
@click.option("--dry-run", is_flag=True, help="List the points and exit.")
def sweep(source: str, grids: tuple[str, ...], seeds: int | None, sets: tuple[str, ...],
          target: float | None, out: str | None, jobs: str, max_jobs: int, max_scale: float,
          attempts: int, run_plots: bool, dry_run: bool) -> None:
    """Run SOURCE over a grid of overrides and seeds; tabulate and plot the results.

    SOURCE is a scenario (give --grid), a sweep file (a TOML file with a
    [sweep] table: base scenario, seeds, grid, variants, plot), or a sweep
    directory to resume. Each point is a whole run in SOURCE's directory
    under OUT/runs/; a point whose fidelity verdict fails is rerun with
    more dilation and flagged if it still fails, never averaged in.
    """
    from fedsim import sweep as sw  # lazy: fedsim --help stays fast

    if jobs != "auto" and not (jobs.isdigit() and int(jobs) >= 1):
        raise click.BadParameter(f"{jobs!r}: a number of runs >= 1, or 'auto'",
                                 param_hint="--jobs")
    src = Path(source)
    # a sweep's errors are usage errors (2); Ctrl-C keeps the finished points
    with _exits_on(sw.SweepError, KeyboardInterrupt, code=EXIT_SCENARIO,
                   interrupted="interrupted: run the same command again to resume"):
        if src.is_dir():
            if grids or seeds or sets or target is not None or out is not None:
                raise click.UsageError("resuming a sweep directory takes no --grid, --seeds, "
                                       "--set, --target or --out")
            spec, _ = sw.read_results(src)
            out_dir = src
        else:
            build = sw.load_sweep if _is_sweep_file(src) else sw.sweep_from_scenario
            spec = build(src, grid=grids, sets=sets, seeds=seeds, target=target)
            if not spec.grid and not spec.variants and len(spec.seeds) == 1:
                raise click.UsageError("nothing to sweep: give --grid KEY=V1,V2 or --seeds N")
            out_dir = Path(out) if out else Path("sweeps") / (
                f"{spec.name}-{time.strftime('%Y%m%d-%H%M%S')}")
        points = spec.points()
        if dry_run:
            spec.check()
            for p in points:
                click.echo(f"{p.key}: fedsim run {spec.scenario} "
                           + " ".join(f"--set '{s}'" for s in p.set_args()))
            click.echo(f"{len(points)} points")
            return
        result = sw.run_sweep(spec, out_dir, jobs=jobs if jobs == "auto" else int(jobs),
                              max_jobs=max_jobs, max_attempts=attempts, report=click.echo,
                              run_plots=run_plots, max_scale=max_scale)
    for f in result.files:
        click.echo(str(f))
    if result.flagged:
        click.echo(f"{len(result.flagged)} of {len(result.points)} points do not count "
                   "(flagged in sweep.csv):")
        for r in result.flagged[:10]:
            click.echo(f"  {r.point.key}: status {r.status}, verdict {r.verdict}, "
                       f"{r.attempts} attempts ({r.run_dir}/output.log)"
                       + (f"; lost client work: {r.lost_work}" if r.lost_runs else ""))
        sys.exit(EXIT_FAILED)


def _is_sweep_file(path: Path) -> bool:
    try:
        return isinstance(tomllib.loads(path.read_text()).get("sweep"), dict)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError):
        return False


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="fedsim")


if __name__ == "__main__":
    main()
