"""The ``fedsim`` command line.

Exit codes: 0 success; 2 a bad scenario or bad usage (the message names the
key, the value and what is allowed); 3 a run that failed; 130 a run
interrupted with Ctrl-C (its results so far are written).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from fedsim.scenario import ScenarioError, load, resolved, to_toml

if TYPE_CHECKING:
    from fedsim.actors.runstate import Progress

__all__ = ["main"]

EXIT_OK = 0
EXIT_SCENARIO = 2
EXIT_FAILED = 3
EXIT_INTERRUPTED = 130


def _fmt(v: Any, spec: str = ".4f") -> str:
    return "-" if v is None else format(v, spec)


class Progress:
    """A live status line (rich on a terminal, plain lines otherwise)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.live = None
        self._last_plain = 0.0
        if enabled and sys.stdout.isatty():
            from rich.console import Console
            from rich.live import Live

            self.live = Live(console=Console(), auto_refresh=False, transient=True)
            self.live.start()

    def __call__(self, p: Progress) -> None:
        if not self.enabled:
            return
        budget = f"/{p.budget:.0f}" if p.budget else ""
        line = (f"t={p.t:7.2f}{budget} s (emulated)  real={p.real:6.1f} s  "
                f"updates={p.updates}  rounds={p.rounds}  in flight={p.in_flight}  "
                f"acc={_fmt(p.accuracy)}  staleness={_fmt(p.staleness_mean, '.2f')}")
        if self.live is not None:
            from rich.text import Text

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


def _load(path: str, sets: tuple[str, ...]) -> Any:
    from fedsim.network import NetPlan, NetworkError

    try:
        sc = load(path, list(sets))
        NetPlan(sc).check()
    except (ScenarioError, NetworkError) as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_SCENARIO)
    return sc


@cli.command()
@click.argument("scenario", type=click.Path(dir_okay=False))
@click.option("--out", type=click.Path(file_okay=False),
              help="Run directory (default runs/NAME-TIME).")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="Override a scenario key, e.g. --set algorithm.alpha=0.3 (repeatable).")
@click.option("--dilation", help="Real seconds per emulated second, or 'auto'.")
@click.option("--no-progress", is_flag=True, help="No live progress line.")
def run(scenario: str, out: str | None, sets: tuple[str, ...], dilation: str | None,
        no_progress: bool) -> None:
    """Run SCENARIO (a TOML file) on this machine."""
    from fedsim.runner import run_scenario

    if dilation is not None:
        value = '"auto"' if dilation == "auto" else dilation
        sets = (*sets, f"run.dilation={value}")
    sc = _load(scenario, sets)
    progress = Progress(not no_progress)
    try:
        result = run_scenario(sc, out, on_progress=progress)
    except KeyboardInterrupt:
        progress.close()
        click.echo("interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except Exception as exc:
        progress.close()
        click.echo(f"error: run failed: {type(exc).__name__}: {exc}", err=True)
        sys.exit(EXIT_FAILED)
    progress.close()
    s = result.summary
    st = s.get("staleness") or {}
    fid = s.get("fidelity") or {}
    lat = fid.get("lateness_ms") or {}
    why = f" ({s['stop_reason']})" if s.get("stop_reason") else ""
    click.echo(f"{s['algorithm']} on {s['clients']} clients: {s['status']}{why}")
    click.echo(f"  final accuracy   {_fmt(s.get('final_accuracy'))}  "
               f"(best {_fmt(s.get('best_accuracy'))})")
    click.echo(f"  updates          {s['updates']} in {s['emulated_seconds']:.1f} emulated s "
               f"({s['real_seconds']:.1f} real s)")
    if st.get("count"):
        click.echo(f"  staleness        mean {st['mean']:.2f}  p50 {st['p50']:.0f}  "
                   f"p99 {st['p99']:.0f}  max {st['max']}  (as it really occurred)")
    if s.get("time_to_target_s") is not None:
        click.echo(f"  time to target   {s['time_to_target_s']:.2f} s "
                   f"(accuracy {s['target_accuracy']})")
    click.echo(f"  fidelity         {fid.get('verdict')}: "
               f"lateness p50 {_fmt(lat.get('p50'), '.3f')} ms, "
               f"p99 {_fmt(lat.get('p99'), '.3f')} ms; "
               f"{(fid.get('compute') or {}).get('overruns', 0)} compute overruns")
    for reason in fid.get("reasons", []):
        click.echo(f"    fail: {reason}")
    if fid.get("verdict") == "fail":
        click.echo(f"    suggested dilation {fid.get('suggested_dilation')} "
                   "(fedsim run --dilation X, or --dilation auto)")
    click.echo(f"  run directory    {result.run_dir}")
    status = s.get("status", "")
    if status == "interrupted":
        sys.exit(EXIT_INTERRUPTED)
    if status.startswith("failed") or status.startswith("error"):
        sys.exit(EXIT_FAILED)


@cli.command()
@click.argument("scenario", type=click.Path(dir_okay=False))
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of TOML.")
def check(scenario: str, sets: tuple[str, ...], as_json: bool) -> None:
    """Validate SCENARIO and print it with every default filled in."""
    sc = _load(scenario, sets)
    data = resolved(sc)
    click.echo(json.dumps(data, indent=2) if as_json else to_toml(data), nl=False)


@cli.command()
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False))
def plot(run_dir: str) -> None:
    """Redraw the plots of RUN_DIR (also works on a run that was killed)."""
    from fedsim.plots import plot_run

    for p in plot_run(Path(run_dir)):
        click.echo(str(p))


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="fedsim")


if __name__ == "__main__":
    main()
