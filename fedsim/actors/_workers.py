"""An asyncio handle on a torch worker process (see :mod:`.worker`)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import sys
from typing import Any

from fedsim import wire
from fedsim.transport import Transport

__all__ = ["WorkerDied", "WorkerHandle"]

log = logging.getLogger(__name__)


class WorkerDied(RuntimeError):
    """The worker process exited while requests were pending."""


class WorkerHandle:
    """Spawn a worker, send it requests, get replies in order.

    Parameters
    ----------
    transport : Transport
        The process's transport (owns the PAIR socket).
    endpoint : str
        ipc:// address the parent binds and the worker connects to.
    scenario_file : str
        Path of the resolved scenario JSON the worker loads.
    role : {"trainer", "evaluator"}
    clients : list[int]
        Clients whose shards the worker holds.
    """

    def __init__(
        self,
        transport: Transport,
        endpoint: str,
        scenario_file: str,
        role: str,
        clients: list[int] | None = None,
    ) -> None:
        self.transport = transport
        self.endpoint = endpoint
        self.scenario_file = scenario_file
        self.role = role
        self.clients = clients or []
        self.sock = transport.pair(endpoint, bind=True)
        self.proc: asyncio.subprocess.Process | None = None
        self._pending: collections.deque[asyncio.Future[Any]] = collections.deque()
        self._reader: asyncio.Task[None] | None = None
        self._watch: asyncio.Task[None] | None = None
        self.hello: wire.Control | None = None
        self.died = asyncio.Event()
        self.closing = False

    async def start(self, ready_within: float = 120.0) -> wire.Control:
        """Start the process and wait for its hello (dataset built, model ready)."""
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "fedsim.actors.worker",
            "--scenario", self.scenario_file, "--endpoint", self.endpoint,
            "--role", self.role, "--clients", ",".join(map(str, self.clients)),
            "--parent", str(os.getpid()),
            stdin=asyncio.subprocess.DEVNULL,
        )
        self._watch = asyncio.create_task(self._watch_exit())
        hello_task = asyncio.ensure_future(self.sock.recv_multipart(copy=False))
        died = asyncio.ensure_future(self.died.wait())
        done, _ = await asyncio.wait({hello_task, died}, timeout=ready_within,
                                     return_when=asyncio.FIRST_COMPLETED)
        died.cancel()
        if hello_task not in done:
            hello_task.cancel()
            raise WorkerDied(f"{self.role} worker did not start (exit {self.returncode})")
        msg, _ = wire.decode(hello_task.result(), check_finite=False)
        if not isinstance(msg, wire.Control) or msg.op != "ready":
            raise WorkerDied(f"{self.role} worker sent {msg!r} instead of its hello")
        self.hello = msg
        self._reader = asyncio.create_task(self._read())
        return msg

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.returncode

    async def _watch_exit(self) -> None:
        assert self.proc is not None
        await self.proc.wait()
        self.died.set()
        if not self.closing:
            log.error("%s worker exited with %s", self.role, self.proc.returncode)
        while self._pending:
            fut = self._pending.popleft()
            if not fut.done():
                fut.set_exception(WorkerDied(f"{self.role} worker exited ({self.proc.returncode})"))

    async def _read(self) -> None:
        while True:
            frames = await self.sock.recv_multipart(copy=False)
            msg, _ = wire.decode(frames, check_finite=False)
            if not self._pending:
                log.warning("%s worker sent an unrequested %s", self.role, type(msg).__name__)
                continue
            fut = self._pending.popleft()
            if not fut.done():
                fut.set_result(msg)

    async def request(self, msg: Any) -> Any:
        """Send one request and wait for its reply."""
        if self.died.is_set():
            raise WorkerDied(f"{self.role} worker is not running")
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending.append(fut)
        await self.sock.send_multipart(wire.encode(msg), copy=False)
        return await fut

    @property
    def queued(self) -> int:
        """Requests sent and not yet answered."""
        return len(self._pending)

    async def close(self, grace: float = 5.0) -> None:
        """Ask the worker to exit; kill it if it does not."""
        self.closing = True
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(
                    self.sock.send_multipart(wire.encode(wire.Bye(sender=-1, reason="close"))),
                    0.5,
                )
            try:
                await asyncio.wait_for(self.proc.wait(), grace)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        for task in (self._reader, self._watch):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        self.transport.close_socket(self.sock)
