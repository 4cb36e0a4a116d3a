"""Starting one point's run: ``fedsim run`` forked from the sweep's own process
(which imports torch and the run's code once), or as a new interpreter
(:mod:`fedsim.sweep.execute` schedules the runs and reaps them).
"""

from __future__ import annotations

import contextlib
import importlib
import itertools
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import traceback
from pathlib import Path
from typing import Any

from fedsim.actors.process import SETUP_IDLE_ENV
from fedsim.sweep.spec import Point, Sweep

__all__ = ["FORK_ENV", "PRELOAD", "atomic_write", "start_run"]


def start_run(p: Point, sweep: Sweep, run_dir: Path, python: str, dilation: float | None,
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
    forking = _forking(python)
    # forked: from the sweep's process, as its command would run in a new interpreter
    meta = {"variant": p.variant, "grid": dict(p.grid), "seed": p.seed, "attempts": attempt,
            "dilation": dilation, "command": cmd[1:], "forked": forking, **history}
    atomic_write(run_dir / "point.json", json.dumps(meta, indent=2) + "\n")
    if forking:
        return _fork_run(cmd[3:], run_dir / "output.log")
    log = open(run_dir / "output.log", "wb")   # noqa: SIM115 (the child owns it)
    # its set-up in the idle class, beside the runs already going (fedsim.actors.process)
    env = {**os.environ, SETUP_IDLE_ENV: "1"}
    try:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env)
    finally:
        log.close()


# ---------------------------------------------------------------------------
# Runs forked from the sweep's own process
#
# ``python -m fedsim.cli run`` spent 2.4 s of CPU importing torch before its
# set-up could start (a run of 3.5 emulated s took 7.1 s of wall; 2026-11-29),
# and the sweep starts one run at a time (each once the last one's clock
# runs), so for short runs the imports were the sweep's pace. Where it can,
# the sweep imports the run's code and torch once and forks each run from
# itself, as fedsim's zygote forks trainers: the child is what a fresh
# ``fedsim run`` would be (its output to output.log, stdin closed, signals and
# logging as at start, set-up in the idle class) and exits without running
# the sweep's exit handlers. ``FEDSIM_SWEEP_FORK=0`` starts each run as a new
# interpreter instead, as does a sweep given another ``python``, or one whose
# process runs threads (a fork copies only the calling thread: a lock another
# one held would stay locked in the child).

#: ``"0"``: start each run as a new interpreter (``python -m fedsim.cli run``).
FORK_ENV = "FEDSIM_SWEEP_FORK"


def _forking(python: str) -> bool:
    """Whether this sweep's runs fork from its process (see above)."""
    if (os.environ.get(FORK_ENV, "1") == "0" or not hasattr(os, "fork")
            or os.path.realpath(python) != os.path.realpath(sys.executable)):
        return False
    return threading.active_count() == 1


#: What ``python -m fedsim.cli run`` imports, by name (the sweep runs that command,
#: as a new interpreter would, and depends on it no more than that), torch first.
PRELOAD = ("torch", "fedsim.cli", "fedsim.launch.runner")


def _preload() -> None:
    """Import :data:`PRELOAD` (once per sweep process: 2.4 s for torch)."""
    for name in PRELOAD:
        importlib.import_module(name)


class _Forked:
    """A run forked from this process: the part of ``subprocess.Popen`` the sweep
    uses (``pid``, ``returncode``, ``send_signal``, ``wait``)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def wait(self) -> int | None:
        if self.returncode is None:
            try:
                _, status = os.waitpid(self.pid, 0)
            except ChildProcessError:     # reaped already (by the sweep's wait4)
                return self.returncode
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode


def _fork_run(args: list[str], log_path: Path) -> _Forked:
    """Fork ``fedsim <args>`` from this process, its output to ``log_path``."""
    _preload()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()               # nothing of the sweep's is written twice
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    pid = os.fork()
    if pid:
        os.close(log)
        return _Forked(pid)
    code = 1
    try:                             # the child: never returns into the sweep
        code = _child(args, log)
    finally:
        os._exit(code)


def _child(args: list[str], log: int) -> int:
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(null)
    os.close(log)
    sys.stdin = open(0, closefd=False)       # noqa: SIM115
    sys.stdout = open(1, "w", buffering=1, closefd=False)    # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, closefd=False)    # noqa: SIM115
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)   # as a new interpreter
    # logging as at start: the run configures its own (the sweep's handlers write
    # to the sweep's streams, a test's to its capture)
    for logger in [logging.getLogger(), *(lg for lg in logging.root.manager.loggerDict.values()
                                          if isinstance(lg, logging.Logger))]:
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
        logger.setLevel(logging.NOTSET)
        logger.propagate = True
        logger.disabled = False
    logging.getLogger().setLevel(logging.WARNING)
    os.environ[SETUP_IDLE_ENV] = "1"   # its set-up in the idle class (fedsim.actors.process)
    code: Any = 0
    try:                               # `python -m fedsim.cli <args>`, in this process
        sys.argv = ["fedsim", *args]
        importlib.import_module("fedsim.cli").main()
    except SystemExit as exc:
        code = exc.code
    except BaseException:  # as an uncaught exception would, in a new interpreter
        traceback.print_exc()
        code = 1
    with contextlib.suppress(Exception):   # the run's own results are written already
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
    if code is None:
        return 0
    return code if isinstance(code, int) else 1


def atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
