"""The ServerApp's own process: it imports the app, runs it on a FedsimGrid, says when it ends.

fedsim's server starts this process (``python -m fedsim.flower.serverapp
FD``, over a Unix socket pair) when it builds the Flower algorithm, before
the run's clock starts: the app's
module, and whatever it imports (torch, its data), is loaded then. The
process says ``ready`` (or why the app could not be loaded), waits for the
``start`` command with the run's id, seed and run config, then calls the
app as Flower's simulation does, ``server_app(grid=..., context=...)``,
with a :class:`~.grid.FedsimGrid` whose every call crosses the pipe
(:mod:`.link`). When the app returns or raises it sends ``done`` and the
process exits; when the server closes the pipe first (the run ended), the
app's next call raises Flower's ``RunNotRunningException``.
"""

from __future__ import annotations

import logging
import os
import pickle
import random
import signal
import sys
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection

__all__ = ["Boot", "main"]

log = logging.getLogger(__name__)


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


def main(conn: Connection) -> None:
    """The process's body (see the module docstring)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)      # the server ends the run, and this
    code = 0
    try:
        boot = Boot(**conn.recv())
        sys.path[:0] = [p for p in boot.path if p not in sys.path]
        code = _run(conn, boot)
    except (EOFError, OSError):
        code = 0                                       # the server went before it began
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        # a thread the app left running (Flower's legacy node refresh) must not hold
        # the process: the run is over for it
        os._exit(code)


def _run(conn: Connection, boot: Boot) -> int:
    from flwr.app import Context, RecordDict
    from flwr.app.user_config import UserConfig
    from flwr.common.constant import SUPERLINK_NODE_ID
    from flwr.serverapp import ServerApp
    from flwr.supercore.run import Run
    from flwr.supercore.task_identity import TaskIdentity

    from fedsim.flower.apps import load
    from fedsim.flower.grid import FedsimGrid
    from fedsim.flower.link import AppLink
    from fedsim.flower.running import set_scenario

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
        conn.send(("failed", 0, str(exc), 0))
        return 1
    conn.send(("ready", 0, None, 0))
    try:
        kind, _, run, _ = conn.recv()
    except (EOFError, OSError):
        return 0                                       # the run ended before it started
    if kind != "start":
        return 0
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
    except BaseException as exc:                       # noqa: BLE001 - reported, then exit
        if link.ended is None:
            error = f"raised {type(exc).__name__}: {exc}"[:300]
            traceback.print_exc()
    link.notify("done", (error,))
    return 0


if __name__ == "__main__":
    main(Connection(int(sys.argv[1])))
