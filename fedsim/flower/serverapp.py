"""The ServerApp's own process: it imports the app, runs it on a FedsimGrid, says when it ends.

fedsim's server starts this process (``python -P -m fedsim.flower.serverapp
FD PARENT``, over a Unix socket pair) when it builds the Flower algorithm,
before the run's clock starts: the app's module, and whatever it imports
(torch, its data), is loaded then. The process dies with its parent, leaves
Ctrl-C to it, and logs as fedsim's other processes do. It says ``ready``
(or why the app could not be loaded), waits for the ``start`` command with
the run's id, seed and run config, then calls the app as Flower's
simulation does, ``server_app(grid=..., context=...)``, with a
:class:`~.grid.FedsimGrid` whose every call crosses the pipe (:mod:`.link`).
When the app returns or raises it sends ``done`` and the process exits (its
exit handlers run; a thread the app left running gets
:data:`EXIT_GRACE` seconds). Once the server has ended the run, the app's
next call raises Flower's ``RunNotRunningException``.
"""

from __future__ import annotations

import logging
import os
import pickle
import random
import socket
import sys
import threading
import time
import traceback
from dataclasses import dataclass

from flwr.app import Context, RecordDict
from flwr.app.user_config import UserConfig
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.serverapp import ServerApp
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity

from fedsim.actors import process
from fedsim.flower.apps import load
from fedsim.flower.grid import FedsimGrid
from fedsim.flower.link import AppLink, Pipe
from fedsim.flower.running import set_scenario

__all__ = ["EXIT_GRACE", "Boot", "main"]

log = logging.getLogger(__name__)

#: real seconds the process's exit may take (its exit handlers, threads the app left)
EXIT_GRACE = 5.0


@dataclass(frozen=True)
class Boot:
    """What the ServerApp's process starts from."""

    server_app: str
    #: the server process's import path (the scenario's directory is on it)
    path: tuple[str, ...]
    #: the most bytes a message's content may have
    limit: int
    #: the run's resolved scenario, pickled (None: it could not cross to the process)
    scenario: bytes | None = None


def main(conn: Pipe) -> int:
    """The process's body (see the module docstring); its exit code."""
    try:
        boot = Boot(**conn.recv())
    except (EOFError, OSError):
        return 0                                       # the server went before it began
    sys.path[:0] = [p for p in boot.path if p not in sys.path]
    try:
        return _run(conn, boot)
    except BaseException:
        traceback.print_exc()
        return 1


def _run(conn: Pipe, boot: Boot) -> int:
    if boot.scenario is not None:      # before the app's module: it may read its data
        try:
            set_scenario(pickle.loads(boot.scenario))
        except Exception as exc:
            log.warning("the run's scenario could not be read in the ServerApp's process "
                        "(%s: %s): its data helpers read the one its run config names",
                        type(exc).__name__, exc)
    try:
        app = load(boot.server_app, ServerApp)
    except Exception as exc:
        traceback.print_exc()
        conn.send(("failed", 0, str(exc), 0))
        return 1
    conn.send(("ready", 0, None, 0))
    try:
        kind, _, run, _ = conn.recv()
    except (EOFError, OSError):
        return 0                                       # the run ended before it started
    if kind != "start":
        return 0
    # the run's clock has started: the strategy's work yields the cores to the event
    # loops, which keep emulated time, as the torch workers' does (SCHED_IDLE)
    process.yield_cpu_to_loops()
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)       # as the server's own torch
    run_id, seed, run_config = int(run["run_id"]), int(run["seed"]), dict(run["run_config"])
    TaskIdentity.run_id = run_id
    TaskIdentity.task_id = 1
    TaskIdentity.node_id = SUPERLINK_NODE_ID
    # Flower's strategies sample nodes with Python's global random (sample_nodes):
    # seeded from the scenario, a run samples the same nodes each time it is run
    random.seed(seed)
    flwr_run = Run.create_empty(run_id)
    flwr_run.override_config = UserConfig(run_config)
    context = Context(run_id=run_id, node_id=SUPERLINK_NODE_ID, node_config=UserConfig(),
                      state=RecordDict(), run_config=UserConfig(run_config))
    link = AppLink(conn)
    link.start()
    grid = FedsimGrid(link, flwr_run, boot.limit)
    error: str | None = None
    try:
        app(grid=grid, context=context)
    except BaseException as exc:
        if link.ended is None:
            error = f"raised {type(exc).__name__}: {exc}"[:300]
            traceback.print_exc()
    link.notify("done", (error,))
    return 0


def _exit_within(seconds: float, code: int) -> None:
    """End the process ``seconds`` from now whatever holds it (a thread the app left)."""
    def watchdog() -> None:
        time.sleep(seconds)
        os._exit(code)

    threading.Thread(target=watchdog, name="fedsim-exit", daemon=True).start()


if __name__ == "__main__":
    if process.become_child(int(sys.argv[2]), "flower-serverapp"):
        process.set_process_name("fedsim-serverapp")
        # Flower's logger has a console handler of its own: its lines once, not again
        # through the root handler fedsim's child logging sets
        logging.getLogger("flwr").propagate = False
        code = main(Pipe(socket.socket(fileno=int(sys.argv[1]))))
        _exit_within(EXIT_GRACE, code)
        sys.exit(code)
