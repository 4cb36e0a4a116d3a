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

Run as ``python -m fedsim.actors.zygote --scenario FILE --address NAME
--parent PID``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import json
import logging
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
import traceback
from typing import Any

from fedsim.actors import _proc

__all__ = ["ForkedProcess", "Zygote", "can_fork_here", "describe", "main", "spawn"]

log = logging.getLogger(__name__)

#: How long a requester keeps trying to reach a zygote that is still starting.
CONNECT_WITHIN = 60.0

#: Errors building the data that are the scenario's (a bad value, a missing
#: file): raised again as the same type where the data was asked for.
_USER_ERRORS: dict[str, type[Exception]] = {
    "ValueError": ValueError, "FileNotFoundError": FileNotFoundError,
    "PermissionError": PermissionError, "NotADirectoryError": NotADirectoryError,
}


def _unix_address(name: str) -> str:
    """The abstract-namespace address of a zygote called ``name``."""
    return "\0" + name


async def _connect(name: str, within: float) -> tuple[asyncio.StreamReader,
                                                      asyncio.StreamWriter]:
    """Connect to the zygote, retrying while it is not yet listening."""
    deadline = time.monotonic() + within
    while True:
        # A Unix connect is answered at once (queued in the backlog or refused),
        # so a blocking one is fine; uvloop takes no abstract address itself.
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(_unix_address(name))
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
        raise _USER_ERRORS.get(str(reply.get("kind")), RuntimeError)(reply["error"])
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
    import threading

    return threading.current_thread() is threading.main_thread() and \
        threading.active_count() == 1


class Zygote:
    """The zygote process, from the side of the process that started it."""

    def __init__(self, name: str, proc: subprocess.Popen[bytes] | _Child) -> None:
        self.name = name
        self.proc = proc

    @classmethod
    def fork(cls, name: str, sc: Any, data: Any) -> Zygote:
        """Fork the zygote from this process, which has imported torch and built ``data``.

        The zygote and the workers it forks then share this process's pages
        too (torch's heap, the dataset), and nothing is imported or built
        twice. Call it before any event loop, ZeroMQ context or thread exists
        (:func:`can_fork_here`); the zygote warms torch up while this
        process goes on.
        """
        listener = _listen(name)
        pid = os.fork()
        if pid == 0:  # the zygote
            code = 1
            try:
                _proc.die_with_parent()
                _proc.set_process_name("fedsim-zygote")
                _proc.ignore_sigint()
                signal.signal(signal.SIGTERM, _proc.terminated)
                _proc.configure_child_logging(f"zygote-{os.getpid()}")
                broken = _warm(sc, data)
                _proc.freeze_heap()  # the workers inherit it: their collections skip it
                listener.setblocking(False)
                _Server(sc, data, listener, broken).serve()
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            except BaseException:
                traceback.print_exc()
            finally:
                with contextlib.suppress(Exception):
                    sys.stderr.flush()
                os._exit(code)
        listener.close()
        return cls(name, _Child(pid))

    @classmethod
    def start(cls, name: str, scenario_file: str) -> Zygote:
        """Start a zygote for the resolved scenario in ``scenario_file``."""
        from fedsim.plugins import child_env

        proc = subprocess.Popen(
            [sys.executable, "-m", "fedsim.actors.zygote", "--scenario", scenario_file,
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


# --- the zygote process ------------------------------------------------------


class _Server:
    """The zygote's loop: accept requests, fork workers, report their exits."""

    def __init__(self, sc: Any, data: Any, listener: socket.socket,
                 broken: tuple[str, str] | None = None) -> None:
        self.sc, self.data, self.listener = sc, data, listener
        #: (kind, message) of the error that kept the zygote from building the
        #: data: every request is answered with it
        self.broken = broken
        self.sel = selectors.DefaultSelector()
        self.buffers: dict[socket.socket, bytes] = {}
        self.children: dict[int, socket.socket] = {}
        self.by_conn: dict[socket.socket, int] = {}
        rfd, self.wakeup = os.pipe()
        os.set_blocking(rfd, False)
        os.set_blocking(self.wakeup, False)
        self.rfd = rfd

    def describe(self) -> dict[str, Any]:
        return {"input_shape": list(self.data.input_shape),
                "num_classes": int(self.data.num_classes), "stats": self.data.stats()}

    def serve(self) -> None:
        signal.set_wakeup_fd(self.wakeup)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        self.sel.register(self.listener, selectors.EVENT_READ, "accept")
        self.sel.register(self.rfd, selectors.EVENT_READ, "child")
        self._reap()  # a child that ended before the handler was set
        while True:
            for key, _ in self.sel.select():
                if key.data == "accept":
                    with contextlib.suppress(BlockingIOError, InterruptedError):
                        conn, _ = self.listener.accept()
                        conn.setblocking(False)
                        self.buffers[conn] = b""
                        self.sel.register(conn, selectors.EVENT_READ, "conn")
                elif key.data == "child":
                    with contextlib.suppress(BlockingIOError):
                        while os.read(self.rfd, 512):
                            pass
                    self._reap()
                else:
                    assert isinstance(key.fileobj, socket.socket)
                    self._read(key.fileobj)

    def _read(self, conn: socket.socket) -> None:
        try:
            chunk = conn.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._drop(conn)
            return
        self.buffers[conn] += chunk
        while b"\n" in self.buffers.get(conn, b""):
            line, self.buffers[conn] = self.buffers[conn].split(b"\n", 1)
            try:
                request = json.loads(line)
                if self.broken is not None:
                    reply = {"kind": self.broken[0], "error": self.broken[1]}
                else:
                    reply = self._answer(conn, request)
            except Exception as exc:  # a bad request is answered, the zygote goes on
                reply = {"error": f"{type(exc).__name__}: {exc}"}
            self._send(conn, reply)

    def _answer(self, conn: socket.socket, request: dict[str, Any]) -> dict[str, Any]:
        op = request.get("op")
        if op == "describe":
            return self.describe()
        if op != "spawn":
            raise ValueError(f"unknown op {op!r} (describe, spawn)")
        if conn in self.by_conn:
            raise ValueError("one worker per connection")
        role = request["role"]
        if role not in ("trainer", "evaluator"):
            raise ValueError(f"role {role!r} is not trainer or evaluator")
        clients = [int(c) for c in request.get("clients", [])]
        pid = os.fork()
        if pid == 0:
            self._child(role, str(request["endpoint"]), clients, request.get("state"))
        self.children[pid] = conn
        self.by_conn[conn] = pid
        return {"pid": pid}

    def _child(self, role: str, endpoint: str, clients: list[int], state: str | None) -> None:
        """In the forked worker: drop the zygote's sockets and serve; never returns."""
        code = 1
        try:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            signal.signal(signal.SIGTERM, _proc.terminated)
            self.sel.close()
            for s in (self.listener, *self.buffers):
                s.close()
            os.close(self.rfd)
            os.close(self.wakeup)
            _proc.die_with_parent()
            _proc.set_process_name(f"fedsim-{role}")
            _proc.configure_child_logging(f"worker-{role}-{os.getpid()}")
            from fedsim.actors.worker import run

            code = run(self.sc, endpoint, clients, state, data=self.data)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:
            traceback.print_exc()
            code = 1
        finally:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)

    def _send(self, conn: socket.socket, reply: dict[str, Any]) -> None:
        # Replies are one short line: the blocking send cannot stall on a live
        # requester; a dead one fails and is dropped.
        try:
            conn.setblocking(True)
            conn.sendall(json.dumps(reply).encode() + b"\n")
            conn.setblocking(False)
        except OSError:
            self._drop(conn)

    def _drop(self, conn: socket.socket) -> None:
        """A requester closed its connection: its worker (if running) is killed."""
        pid = self.by_conn.pop(conn, None)
        if pid is not None and pid in self.children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.buffers.pop(conn, None)
        with contextlib.suppress(KeyError, ValueError):
            self.sel.unregister(conn)
        conn.close()

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.children.pop(pid, None)
            if conn is None:
                continue
            code = os.waitstatus_to_exitcode(status)
            if conn in self.by_conn:
                self.by_conn.pop(conn)
                self._send(conn, {"exit": code})
                if conn in self.buffers:
                    self._drop(conn)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the zygote process."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--scenario", required=True, help="resolved scenario JSON file")
    ap.add_argument("--address", required=True, help="abstract Unix socket name")
    ap.add_argument("--parent", type=int, default=None)
    args = ap.parse_args(argv)
    if not _proc.become_child(args.parent, f"zygote-{os.getpid()}"):
        return 0
    # Listen first: requesters that come while torch is importing wait in the backlog.
    try:
        listener = _listen(args.address)
    except OSError as exc:
        log.error("cannot listen at @%s: %s", args.address, exc)
        return 2 if exc.errno == errno.EADDRINUSE else 1

    built: dict[str, Any] = {}

    def build() -> None:
        import torch

        from fedsim.actors._setup import build_data
        from fedsim.scenario import parse

        torch.set_num_threads(1)
        with open(args.scenario) as fh:
            built["sc"] = parse(json.load(fh), args.scenario)
        built["data"] = build_data(built["sc"])

    broken = _guard(build)
    sc, data = built.get("sc"), built.get("data")
    if broken is None:
        broken = _warm(sc, data)
    listener.setblocking(False)
    _Server(sc, data, listener, broken).serve()
    return 0


def _listen(name: str) -> socket.socket:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(_unix_address(name))
        listener.listen(256)
    except OSError:
        listener.close()
        raise
    return listener


def _guard(step: Any) -> tuple[str, str] | None:
    """Run ``step()``; the error that keeps the zygote from serving, as (kind, message)."""
    try:
        step()
    except (ValueError, FileNotFoundError, PermissionError, NotADirectoryError) as exc:
        # the scenario's data cannot be built: every asker is told why
        return (type(exc).__name__ if type(exc).__name__ in _USER_ERRORS else "ValueError",
                str(exc))
    except Exception as exc:
        log.exception("the zygote could not build the data and model")
        return ("RuntimeError", f"the zygote could not build the data and model: "
                                f"{type(exc).__name__}: {exc}")
    return None


def _warm(sc: Any, data: Any) -> tuple[str, str] | None:
    """Import what the workers use and run a step and an evaluation once, so
    none of torch's lazy start-up is left to the forked workers."""
    import torch

    torch.set_num_threads(1)

    def warm() -> None:
        from fedsim.actors.worker import Worker

        Worker(sc, [0] if len(data.clients) else [], data=data).warm_up()
        Worker(sc, [], data=data).warm_up()

    return _guard(warm)


if __name__ == "__main__":
    sys.exit(main())
