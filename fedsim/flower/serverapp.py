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

The server's side of it is :class:`ServerAppProcess`: it starts the
process and waits until the app is loaded, starts the app's run, and ends
the process with the run; its :class:`~.link.Relay` answers the process's
requests meanwhile.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import random
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flwr.app import Context, RecordDict
from flwr.app.user_config import UserConfig
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.serverapp import ServerApp
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity

import fedsim
from fedsim.actors import process
from fedsim.flower.apps import AppError, load
from fedsim.flower.exchange import Exchange
from fedsim.flower.grid import FedsimGrid
from fedsim.flower.link import AppLink, Pipe, Relay
from fedsim.flower.running import set_scenario
from fedsim.scenario.plugins import child_env

__all__ = ["BOOT_TIMEOUT", "END_TIMEOUT", "EXIT_GRACE", "Boot", "ServerAppProcess", "main"]

log = logging.getLogger(__name__)

#: real seconds the process's exit may take (its exit handlers, threads the app left)
EXIT_GRACE = 5.0
#: how long the ServerApp's process may take to import the app (s)
BOOT_TIMEOUT = 120.0
#: how long it may take to end once the run has (s)
END_TIMEOUT = 5.0


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


def crossable(scenario: object) -> bytes | None:
    """``scenario`` pickled to cross to the ServerApp's process, or None when it
    cannot (its data helpers then read the scenario the app's run config names)."""
    if scenario is None:
        return None
    try:
        return pickle.dumps(scenario)
    except Exception as exc:
        log.warning("the scenario cannot cross to the ServerApp's process (%s: %s): its "
                    "data helpers read the scenario its run config names", type(exc).__name__,
                    exc)
        return None


class ServerAppProcess:
    """The server's handle on the ServerApp's process.

    Built before the run's clock starts, it starts the process and waits
    until the app is loaded (its module may import torch and data), raising
    :class:`~.apps.AppError` when it cannot be. A fresh interpreter
    (``python -P -m fedsim.flower.serverapp``) over a Unix socket pair, not
    ``multiprocessing``'s spawn, which would import the parent's
    ``__main__`` (a user's script) again; ``-P``: the working directory does
    not shadow what the server imported. Its requests are answered from
    ``exchange`` by a :class:`~.link.Relay`, which calls ``on_done(error)``
    once the app returned (None), raised, or its process ended."""

    def __init__(self, boot: Boot, exchange: Exchange,
                 on_done: Callable[[str | None], None]) -> None:
        ours_sock, theirs_sock = socket.socketpair()
        env = child_env() or dict(os.environ)
        root = str(Path(fedsim.__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join([root, *(p for p in env.get("PYTHONPATH", "")
                                                      .split(os.pathsep) if p and p != root)])
        env["PYTHONUNBUFFERED"] = "1"     # its prints are not lost if it is killed
        self.process = subprocess.Popen(
            [sys.executable, "-P", "-m", "fedsim.flower.serverapp", str(theirs_sock.fileno()),
             str(os.getpid())],
            pass_fds=(theirs_sock.fileno(),), stdin=subprocess.DEVNULL, env=env)
        theirs_sock.close()
        ours = Pipe(ours_sock)
        try:
            kind, value = self._handshake(ours, boot)
        except BaseException:
            self._kill(ours)
            raise
        if kind != "ready":
            self._kill(ours)
            raise AppError(str(value))
        self.relay = Relay(ours, exchange, on_done)
        self.started = False
        self._ended = False

    def _handshake(self, ours: Pipe, boot: Boot) -> tuple[str, Any]:
        """Send ``boot``; the process's answer: ``("ready", None)`` or why not."""
        try:
            ours.send(vars(boot))
            if not ours.poll(BOOT_TIMEOUT):
                raise AppError(f"{boot.server_app!r}: the ServerApp's process did not "
                               f"load it within {BOOT_TIMEOUT:.0f} s")
            kind, _, value, _ = ours.recv()
        except (EOFError, OSError):
            try:
                code: int | None = self.process.wait(END_TIMEOUT)
            except subprocess.TimeoutExpired:
                code = None
            return "failed", (f"{boot.server_app!r}: the ServerApp's process ended while "
                              f"loading it (exit code {code}; its error is above)")
        return str(kind), value

    def _kill(self, ours: Pipe) -> None:
        self.process.kill()
        self.process.wait()
        ours.close()

    def start(self, run_id: int, seed: int, run_config: Mapping[str, Any]) -> None:
        """Start the app's run: ``server_app(grid=..., context=...)`` in its process."""
        self.started = True
        self.relay.start()
        # (its process gone: the relay sees the pipe end and says so)
        with contextlib.suppress(OSError):
            self.relay.send(("start", 0, {"run_id": run_id, "seed": seed,
                                          "run_config": dict(run_config)}, 0))

    def end(self) -> None:
        """End the process (the run is over: its exchange is closed, so the app's
        waits return and its next call raises): END_TIMEOUT to end before it is
        killed. Idempotent."""
        if self._ended:
            return
        self._ended = True
        if not self.started:              # it waits for its start: it has nothing to end
            with contextlib.suppress(OSError):
                self.relay.send(("stop", 0, None, 0))
        try:
            self.process.wait(END_TIMEOUT)
        except subprocess.TimeoutExpired:
            log.warning("the ServerApp's process did not end within %.0f s of the run's end: "
                        "ended", END_TIMEOUT)
            self.process.kill()
            self.process.wait()
        if self.started:
            self.relay.join(END_TIMEOUT)
        self.relay.close()


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
