"""The zygote process itself: build and warm once, then fork workers on request.

Its protocol and the requester's side are in :mod:`fedsim.actors.zygote`.
Run as ``python -m fedsim.actors._zygote_server --scenario FILE --address
NAME --parent PID`` (what :meth:`~fedsim.actors.zygote.Zygote.start` does).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import logging
import os
import selectors
import signal
import socket
import sys
import traceback
from collections.abc import Callable
from typing import Any, NoReturn

from fedsim.actors import process
from fedsim.actors.setup import build_data
from fedsim.data import FederatedData
from fedsim.scenario import Scenario, parse

__all__ = ["USER_ERRORS", "forked", "listen", "main", "serve", "unix_address", "warm"]

log = logging.getLogger(__name__)

#: Errors building the data that are the scenario's (a bad value, a missing
#: file): raised again as the same type where the data was asked for.
USER_ERRORS: dict[str, type[Exception]] = {
    "ValueError": ValueError, "FileNotFoundError": FileNotFoundError,
    "PermissionError": PermissionError, "NotADirectoryError": NotADirectoryError,
}


def unix_address(name: str) -> str:
    """The abstract-namespace address of a zygote called ``name``."""
    return "\0" + name


def forked(name: str, body: Callable[[], int]) -> NoReturn:
    """In a freshly forked child: become a process of its own named ``name``
    (dies with its parent, SIGTERM unwinds), run ``body`` and ``os._exit``
    with its code; nothing of the parent's runs after it."""
    code = 1
    try:
        process.become_child(None, name)
        code = body()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def serve(sc: Scenario, data: FederatedData, listener: socket.socket,
          broken: tuple[str, str] | None) -> int:
    """Serve requests on ``listener`` until terminated."""
    listener.setblocking(False)
    _Server(sc, data, listener, broken).serve()
    return 0




class _Server:
    """The zygote's loop: accept requests, fork workers, report their exits."""

    def __init__(self, sc: Scenario | None, data: FederatedData | None,
                 listener: socket.socket, broken: tuple[str, str] | None = None) -> None:
        #: the scenario and its data (None when they could not be built: ``broken``)
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

    def _built(self) -> tuple[Scenario, FederatedData]:
        """The scenario and its data (a request is answered only when they were built)."""
        assert self.sc is not None
        assert self.data is not None
        return self.sc, self.data

    def describe(self) -> dict[str, Any]:
        _, data = self._built()
        return {"input_shape": list(data.input_shape),
                "num_classes": int(data.num_classes), "stats": data.stats()}

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

    def _child(self, role: str, endpoint: str, clients: list[int], state: str | None) -> NoReturn:
        """In the forked worker: drop the zygote's sockets and serve; never returns."""

        def work() -> int:
            from fedsim.actors.worker import run  # lazy: torch stays out of client hosts

            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            self.sel.close()
            for s in (self.listener, *self.buffers):
                s.close()
            os.close(self.rfd)
            os.close(self.wakeup)
            process.set_process_name(f"fedsim-{role}")
            sc, data = self._built()
            return run(sc, endpoint, clients, state, data=data)

        forked(f"worker-{role}-{os.getpid()}", work)

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
    if not process.become_child(args.parent, f"zygote-{os.getpid()}"):
        return 0
    # Listen first: requesters that come while torch is importing wait in the backlog.
    try:
        listener = listen(args.address)
    except OSError as exc:
        log.error("cannot listen at @%s: %s", args.address, exc)
        return 2 if exc.errno == errno.EADDRINUSE else 1

    built: list[tuple[Scenario, FederatedData]] = []  # (sc, data) once both are built

    def build() -> None:
        import torch  # lazy: after listen() (askers wait in the backlog); hosts stay torch-free

        torch.set_num_threads(1)
        with open(args.scenario) as fh:
            sc = parse(json.load(fh), args.scenario)
        built.append((sc, build_data(sc)))

    broken = _guard(build)
    if broken is None:  # built: build() returned
        broken = warm(*built[0])
    sc, data = built[0] if built else (None, None)
    listener.setblocking(False)
    _Server(sc, data, listener, broken).serve()
    return 0


def listen(name: str) -> socket.socket:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(unix_address(name))
        listener.listen(256)
    except OSError:
        listener.close()
        raise
    return listener


def _guard(step: Callable[[], None]) -> tuple[str, str] | None:
    """Run ``step()``; the error that keeps the zygote from serving, as (kind, message)."""
    try:
        step()
    except (ValueError, FileNotFoundError, PermissionError, NotADirectoryError) as exc:
        # the scenario's data cannot be built: every asker is told why
        return (type(exc).__name__ if type(exc).__name__ in USER_ERRORS else "ValueError",
                str(exc))
    except Exception as exc:
        log.exception("the zygote could not build the data and model")
        return ("RuntimeError", f"the zygote could not build the data and model: "
                                f"{type(exc).__name__}: {exc}")
    return None


def warm(sc: Scenario, data: FederatedData) -> tuple[str, str] | None:
    """Import what the workers use and run a step and an evaluation once, so
    none of torch's lazy start-up is left to the forked workers."""
    import torch  # lazy: torch stays out of client hosts

    torch.set_num_threads(1)

    def warm() -> None:
        from fedsim.actors.worker import Worker  # lazy: torch stays out of client hosts

        Worker(sc, [0] if len(data.clients) else [], data=data).warm_up()
        Worker(sc, [], data=data).warm_up()

    return _guard(warm)


if __name__ == "__main__":
    sys.exit(main())
