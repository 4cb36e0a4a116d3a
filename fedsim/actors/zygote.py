"""The zygote: torch imported and the data built once, every torch worker forked from it.

A torch worker started from scratch imports torch (about 1.1 s and 220 MB
here), builds the scenario's whole federated dataset and model, and warms
torch up; with two trainers and an evaluator doing it at once on two cores,
that was most of the 3 s between a run's server binding its socket and its
emulated clock starting. ``fedsim run`` therefore starts one zygote, which
does all of that once and then forks each worker on request: a forked
worker shares the zygote's pages (torch's heap, the dataset) until it writes
to them, builds its clients' tensors from the shared arrays and is ready in
milliseconds. Client hosts stay torch-free: they ask the zygote for their
trainer instead of starting one.

The protocol, over a Unix socket in the abstract namespace (no file left
behind), one JSON object per line:

* ``{"op": "describe"}`` -> ``{"input_shape": [...], "num_classes": n,
  "stats": {...}}``: what the server needs to build the initial model and
  write ``data.json`` without building the data itself;
* ``{"op": "spawn", "role": ..., "endpoint": ..., "clients": [...],
  "state": ...}`` -> ``{"pid": p}``, and later, on the same connection,
  ``{"exit": code}`` when the worker ends (the code as
  :attr:`subprocess.Popen.returncode` gives it: negative for a signal).
  The requester keeps the connection open for the worker's life: if it
  closes (the requester died), the zygote kills the worker.

A worker's parent is the zygote, so :class:`ForkedProcess` gives the
requester the part of :class:`asyncio.subprocess.Process` it uses (``pid``,
``returncode``, ``wait``, ``kill``) from that connection. The zygote dies
with the process that started it, and its workers die with the zygote.
``deploy.workers = "spawn"`` starts every worker from scratch instead.

The zygote process itself is :mod:`fedsim.actors._zygote_server`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any

from fedsim.actors import process
from fedsim.actors._zygote_server import USER_ERRORS, forked, listen, serve, unix_address, warm
from fedsim.data import FederatedData
from fedsim.scenario import Scenario
from fedsim.scenario.plugins import child_env

__all__ = ["ForkedProcess", "Zygote", "can_fork_here", "describe", "spawn"]

log = logging.getLogger(__name__)

#: How long a requester keeps trying to reach a zygote that is still starting.
CONNECT_WITHIN = 60.0


async def _connect(name: str, within: float) -> tuple[asyncio.StreamReader,
                                                      asyncio.StreamWriter]:
    """Connect to the zygote, retrying while it is not yet listening."""
    deadline = time.monotonic() + within
    while True:
        # A Unix connect is answered at once (queued in the backlog or refused),
        # so a blocking one is fine; uvloop takes no abstract address itself.
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(unix_address(name))
            sock.setblocking(False)
            return await asyncio.open_unix_connection(sock=sock)
        except (ConnectionRefusedError, FileNotFoundError):
            sock.close()
            if time.monotonic() > deadline:
                raise ConnectionRefusedError(
                    f"no zygote listening at @{name} after {within:.0f} s") from None
            await asyncio.sleep(0.02)


async def _ask(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
               request: dict[str, Any]) -> dict[str, Any]:
    writer.write(json.dumps(request).encode() + b"\n")
    await writer.drain()
    line = await reader.readline()
    if not line:
        raise ConnectionError("the zygote closed the connection (did it die?)")
    reply: dict[str, Any] = json.loads(line)
    if "error" in reply:
        # A scenario the zygote could not build from (a bad data path, say)
        # is the user's error, as it would be in this process.
        raise USER_ERRORS.get(str(reply.get("kind")), RuntimeError)(reply["error"])
    return reply


async def describe(name: str, within: float = CONNECT_WITHIN) -> dict[str, Any]:
    """The dataset's shape and statistics, once the zygote has built it.

    A ValueError if the zygote could not build the data from the scenario
    (its message says why).
    """
    reader, writer = await _connect(name, within)
    try:
        return await _ask(reader, writer, {"op": "describe"})
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


class ForkedProcess:
    """A worker forked by the zygote, as its requester sees it."""

    def __init__(self, pid: int, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._reader, self._writer = reader, writer
        self._exit: asyncio.Task[int] | None = None

    async def _read_exit(self) -> int:
        line = await self._reader.readline()
        try:
            code = int(json.loads(line)["exit"]) if line else None
        except (ValueError, KeyError, TypeError):
            code = None
        if code is None:  # the zygote is gone, and the worker with it
            log.error("lost the zygote while worker %d ran", self.pid)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(self.pid, signal.SIGKILL)
            code = -signal.SIGKILL
        self.returncode = code
        self._writer.close()
        return code

    async def wait(self) -> int:
        """Wait for the worker to end; its exit code."""
        if self._exit is None:
            self._exit = asyncio.ensure_future(self._read_exit())
        return await asyncio.shield(self._exit)

    def kill(self) -> None:
        """SIGKILL the worker (its exit is still reported by :meth:`wait`)."""
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(self.pid, signal.SIGKILL)


async def spawn(name: str, role: str, endpoint: str, clients: list[int],
                state: str | None = None, within: float = CONNECT_WITHIN) -> ForkedProcess:
    """Ask the zygote ``name`` for a worker serving ``endpoint``."""
    reader, writer = await _connect(name, within)
    try:
        reply = await _ask(reader, writer, {"op": "spawn", "role": role, "endpoint": endpoint,
                                            "clients": clients, "state": state})
    except BaseException:
        writer.close()
        raise
    return ForkedProcess(int(reply["pid"]), reader, writer)


class _Child:
    """A child forked by this process, with the part of :class:`subprocess.Popen` used here."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            with contextlib.suppress(ChildProcessError):
                pid, status = os.waitpid(self.pid, os.WNOHANG)
                if pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0)
            time.sleep(0.01)
        assert self.returncode is not None
        return self.returncode

    def terminate(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGTERM)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)


def can_fork_here() -> bool:
    """Whether this process may fork the zygote from itself: on its main thread,
    with no other Python thread (a lock another thread holds would stay held
    in the child). A notebook's or an API caller's thread starts it instead."""
    return threading.current_thread() is threading.main_thread() and \
        threading.active_count() == 1


class Zygote:
    """The zygote process, from the side of the process that started it."""

    def __init__(self, name: str, proc: subprocess.Popen[bytes] | _Child) -> None:
        self.name = name
        self.proc = proc

    @classmethod
    def fork(cls, name: str, sc: Scenario, data: FederatedData) -> Zygote:
        """Fork the zygote from this process, which has imported torch and built ``data``.

        The zygote and the workers it forks then share this process's pages
        too (torch's heap, the dataset), and nothing is imported or built
        twice. Call it before any event loop, ZeroMQ context or thread exists
        (:func:`can_fork_here`); the zygote warms torch up while this
        process goes on.
        """
        listener = listen(name)
        pid = os.fork()
        if pid == 0:  # the zygote
            def zygote() -> int:
                process.set_process_name("fedsim-zygote")
                broken = warm(sc, data)
                process.freeze_heap()  # the workers inherit it: their collections skip it
                return serve(sc, data, listener, broken)

            forked(f"zygote-{os.getpid()}", zygote)
        listener.close()
        return cls(name, _Child(pid))

    @classmethod
    def start(cls, name: str, scenario_file: str) -> Zygote:
        """Start a zygote for the resolved scenario in ``scenario_file``."""
        proc = subprocess.Popen(
            [sys.executable, "-m", "fedsim.actors._zygote_server", "--scenario", scenario_file,
             "--address", name, "--parent", str(os.getpid())],
            stdin=subprocess.DEVNULL, env=child_env())
        return cls(name, proc)

    async def describe(self) -> dict[str, Any]:
        """:func:`describe`, failing at once if the zygote process ends first."""
        ask = asyncio.ensure_future(describe(self.name))
        while not ask.done():
            await asyncio.wait({ask}, timeout=0.05)
            if not ask.done() and self.proc.poll() is not None:
                ask.cancel()
                raise RuntimeError(f"the zygote exited with {self.proc.returncode} "
                                   "before it was ready (its error is above)")
        return ask.result()

    def close(self, grace: float = 5.0) -> None:
        """Stop the zygote (its remaining workers get SIGTERM from the kernel)."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
