"""An asyncio handle on a torch worker process (see :mod:`.worker`).

Requests carry ids and replies are matched by id, not by position: a reply
to a request that was abandoned or answered out of order can never be
handed to another request. If the process dies, every pending request fails
with :class:`WorkerDied` naming the worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import sys
from typing import overload

from fedsim.actors.process import own_cpus
from fedsim.actors.zygote import ForkedProcess, spawn
from fedsim.scenario.ids import format_id_list
from fedsim.scenario.plugins import child_env
from fedsim.wire.codec import Frames, decode, encode, peek
from fedsim.wire.errors import WireError
from fedsim.wire.messages import (
    Advance,
    Evaluate,
    Evaluated,
    Message,
    Shutdown,
    Trained,
    WorkerFailed,
    WorkerReady,
    worker_answer,
)
from fedsim.wire.transport import ZmqContext

__all__ = ["WorkerDied", "WorkerHandle"]

log = logging.getLogger(__name__)


class WorkerDied(RuntimeError):
    """The worker process exited while requests were pending."""


class WorkerHandle:
    """Spawn a worker, send it requests, get each reply by its request id.

    Parameters
    ----------
    zmq_ctx
        The process's ZeroMQ context (owns the PAIR socket).
    endpoint
        ipc:// address this process binds and the worker connects to.
    scenario_file
        Path of the resolved scenario JSON the worker loads.
    role
        ``"trainer"`` or ``"evaluator"``.
    clients
        Clients whose shards the worker holds.
    state_path
        Where the worker keeps its clients' state across restarts (None: nowhere).
    zygote
        The name of a :mod:`~fedsim.actors.zygote` to fork the worker from
        (None: start a fresh Python process).
    cpus
        CPUs that only this worker uses (``deploy.pin_trainers``): once it is
        ready, every thread of it is kept on them, at normal priority
        (:func:`~fedsim.actors.process.own_cpus`). None: where it was started.
    """

    def __init__(self, zmq_ctx: ZmqContext, endpoint: str, scenario_file: str, role: str,
                 clients: list[int] | None = None, state_path: str | None = None,
                 zygote: str | None = None, cpus: set[int] | None = None) -> None:
        self.zygote = zygote
        self.cpus = cpus
        self.state_path = state_path
        self.endpoint = endpoint
        self.scenario_file = scenario_file
        self.role = role
        self.clients = clients or []
        self.conn = zmq_ctx.pair(endpoint, bind=True)
        self.proc: asyncio.subprocess.Process | ForkedProcess | None = None
        self._pending: dict[int, asyncio.Future[Message]] = {}
        self._uploads: dict[int, Frames] = {}
        self._ids = itertools.count(1)
        self._tasks: list[asyncio.Task[None]] = []
        self.died = asyncio.Event()
        self.closing = False

    def next_id(self) -> int:
        """A fresh request id."""
        return next(self._ids)

    async def start(self, ready_within: float = 120.0) -> WorkerReady:
        """Start the process and wait for its WorkerReady (data built, model ready)."""
        if self.zygote is not None:
            try:
                self.proc = await spawn(self.zygote, self.role, self.endpoint, self.clients,
                                        self.state_path, within=ready_within)
            except (OSError, RuntimeError) as exc:
                raise WorkerDied(f"{self.role} worker did not start: {exc}") from None
        else:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "fedsim.actors.worker",
                "--scenario", self.scenario_file, "--endpoint", self.endpoint,
                "--role", self.role, "--clients", format_id_list(self.clients),
                "--parent", str(os.getpid()),
                *(("--state", self.state_path) if self.state_path else ()),
                stdin=asyncio.subprocess.DEVNULL, env=child_env(),
            )
        self._tasks.append(asyncio.create_task(self._watch_exit()))
        hello = asyncio.ensure_future(self.conn.recv())
        died = asyncio.ensure_future(self.died.wait())
        done, _ = await asyncio.wait({hello, died}, timeout=ready_within,
                                     return_when=asyncio.FIRST_COMPLETED)
        died.cancel()
        if hello not in done or hello.exception() is not None:
            # (it exited first: its connection was closed under the wait)
            hello.cancel()
            raise WorkerDied(f"{self.role} worker did not start (exit {self.returncode})")
        msg, _ = decode(hello.result(), max_header=None, check_finite=False)
        if not isinstance(msg, WorkerReady):
            raise WorkerDied(f"{self.role} worker sent {type(msg).__name__} instead of ready")
        if self.cpus is not None and self.proc is not None:
            own_cpus(self.proc.pid, self.cpus)
        self._tasks.append(asyncio.create_task(self._read()))
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
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(WorkerDied(f"{self.role} worker exited "
                                             f"({self.proc.returncode})"))
        self._pending.clear()
        # a request whose send waits for a peer that is gone (a PAIR socket with no
        # peer holds it) fails now instead of waiting forever
        self.conn.close()

    async def _read(self) -> None:
        while True:
            try:
                frames = await self.conn.recv()
            except ConnectionError:  # closed: the worker exited, or the handle closes
                return
            try:
                meta = peek(frames)
                if meta.kind == "Update":
                    # an upload comes just before the reply that says so, under its
                    # request's id: kept as frames, to be forwarded as they are
                    self._uploads[meta.seq] = frames
                    continue
                msg, _ = decode(frames, max_header=None, check_finite=False)
            except WireError as exc:
                log.error("%s worker sent an unreadable reply: %s", self.role, exc)
                continue
            fut = self._pending.pop(getattr(msg, "request_id", -1), None)
            if fut is None:
                log.warning("%s worker sent a reply to no request: %s", self.role,
                            type(msg).__name__)
            elif not fut.done():
                fut.set_result(msg)

    @overload
    async def request(self, msg: Advance) -> Trained | WorkerFailed: ...
    @overload
    async def request(self, msg: Evaluate) -> Evaluated | WorkerFailed: ...
    async def request(self, msg: Advance | Evaluate) -> Trained | Evaluated | WorkerFailed:
        """Send one request (its ``request_id`` from :meth:`next_id`) and await its reply:
        what the request asks for, or why it failed."""
        reply = await self._exchange(msg.request_id, encode(msg))
        if isinstance(msg, Evaluate):
            return worker_answer(reply, msg.request_id, Evaluated)
        return worker_answer(reply, msg.request_id, Trained)

    async def train(self, frames: Frames) -> Trained | WorkerFailed:
        """Send a task's frames (stamped with its due time and, as ``seq``, its request
        id from :meth:`next_id`) and await the reply: how the work went, or why it
        failed."""
        rid = peek(frames).seq
        return worker_answer(await self._exchange(rid, frames), rid, Trained)

    def upload(self, request_id: int) -> Frames | None:
        """The frames of the update the reply to ``request_id`` uploads (None: none)."""
        return self._uploads.pop(request_id, None)

    async def _exchange(self, rid: int | None, frames: Frames) -> Message:
        if self.died.is_set():
            raise WorkerDied(f"{self.role} worker is not running")
        if rid is None or rid in self._pending:
            raise ValueError(f"Invalid request id {rid!r}: missing or already pending")
        fut: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        try:
            try:
                await self.conn.send(frames)
            except ConnectionError:
                raise WorkerDied(f"{self.role} worker is not running") from None
            return await fut
        finally:
            self._pending.pop(rid, None)

    async def close(self, grace: float = 5.0) -> None:
        """Ask the worker to exit; kill it if it does not."""
        self.closing = True
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.conn.send(encode(Shutdown())), 0.5)
            try:
                await asyncio.wait_for(self.proc.wait(), grace)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self.conn.close()

    def pending(self) -> int:
        """Requests sent and not yet answered."""
        return len(self._pending)

