"""The server's control socket: bookkeeping of the client-host processes.

Every client host says hello (its clients, pid and monotonic clock), then
``ready`` once its data is built; the server starts them all on one epoch.
During the run hosts stream their event-log batches here and answer a
``stop`` with a ``bye`` that carries their own measurements (fidelity,
overruns). A host process that exits early takes its clients with it.
:class:`HostControl` keeps all of this apart from the federation protocol,
which stays in :mod:`.server`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any

from fedsim import wire
from fedsim.actors.host import boot_id
from fedsim.transport import Transport
from netem.clock import monotonic

if TYPE_CHECKING:
    from fedsim.actors.runstate import RunState

__all__ = ["HostControl"]

log = logging.getLogger(__name__)


class HostControl:
    """The client hosts of one federation, seen through the control socket.

    Parameters
    ----------
    expected
        How many hosts must report ready before the run starts.
    queue
        The server's event queue; ``host_bye`` and ``host_exit`` events go there.

    Attributes
    ----------
    hosts
        Per host name: its ``clients``, ``pid``, clock ``offset``, ``samples``,
        whether it is ``alive``, and once it has said goodbye, its ``bye`` args.
    """

    def __init__(self, expected: int, queue: asyncio.Queue[tuple[str, Any]]) -> None:
        self.expected = expected
        self.queue = queue
        self.hosts: dict[str, dict[str, Any]] = {}
        self.sock: Any = None

    def bind(self, transport: Transport, address: str) -> str:
        """Bind the control ROUTER at ``address``; return the bound address."""
        self.sock, bound = transport.router(address)
        return bound

    # -- start-up ---------------------------------------------------------------
    async def wait_ready(self, host_exits: asyncio.Queue[tuple[str, int]] | None,
                         within: float = 120.0) -> None:
        """Collect every host's hello and ready, for at most ``timeout`` real seconds.

        Registration is set-up, before the emulated clock starts. When the time
        is up the federation starts with the hosts that are ready (the server
        names the clients that are missing); a host that exits during start-up
        is counted as missing.
        """
        deadline = monotonic() + within
        while sum("samples" in h for h in self.hosts.values()) < self.expected:
            left = deadline - monotonic()
            if left <= 0:
                log.warning("start timeout (%.0f s): %d of %d client hosts ready", within,
                            sum("samples" in h for h in self.hosts.values()), self.expected)
                return
            got = await self._recv(host_exits, left)
            if got is None:
                continue
            ident, msg = got
            name = ident.decode(errors="replace")
            if isinstance(msg, wire.HostHello):
                self.hosts[name] = {"clients": list(msg.clients), "pid": msg.pid,
                                    "offset": monotonic() - float(msg.info.get("mono", 0.0)),
                                    "alive": True}
            elif isinstance(msg, wire.Control) and msg.op == "ready":
                samples = msg.args.get("samples")
                if not isinstance(samples, dict):
                    log.warning("host %s: ready without samples", name)
                    continue
                self.hosts.setdefault(name, {"alive": True})["samples"] = samples

    def registered(self) -> dict[int, int]:
        """Client id -> sample count, over every host that is ready and alive."""
        out: dict[int, int] = {}
        for info in self.hosts.values():
            if not info.get("alive", True):
                continue
            for cid, n in (info.get("samples") or {}).items():
                try:
                    out[int(cid)] = int(n)
                except (TypeError, ValueError):
                    log.warning("ignoring a bad sample count %r for client %r", n, cid)
        return dict(sorted(out.items()))

    async def _recv(self, host_exits: asyncio.Queue[tuple[str, int]] | None,
                    within: float) -> tuple[bytes, Any] | None:
        """The next control message; None on a timeout or a host's exit."""
        recv = asyncio.ensure_future(self.sock.recv_multipart(copy=False))
        waits: set[asyncio.Future[Any]] = {recv}
        died = None
        if host_exits is not None:
            died = asyncio.ensure_future(host_exits.get())
            waits.add(died)
        done, _ = await asyncio.wait(waits, timeout=within, return_when=asyncio.FIRST_COMPLETED)
        if died is not None and died in done:
            name, code = died.result()
            log.error("client %s exited with %s during start-up", name, code)
            self.hosts.setdefault(name, {})["alive"] = False
        elif died is not None:
            died.cancel()
        if recv not in done:
            recv.cancel()
            return None
        frames = recv.result()
        try:
            msg, _ = wire.decode(frames[1:], check_finite=False)
        except wire.WireError as exc:
            log.warning("rejected a control message: %s", exc)
            return None
        return frames[0].bytes, msg

    async def start(self, epoch: float, dilation: float, shapes: list[Any]) -> None:
        """Start every host on the run's clock epoch."""
        for name, info in self.hosts.items():
            await self.send(name, wire.Control(op="start", args={
                "epoch": epoch, "dilation": dilation,
                "boot_id": boot_id(), "offset": info.get("offset", 0.0),
                "shapes": [list(s) for s in shapes]}))

    async def send(self, host: str, msg: Any) -> None:
        """Send ``msg`` to one host; a host that is gone is not an error."""
        with contextlib.suppress(Exception):
            await self.sock.send_multipart([host.encode(), *wire.encode(msg)], copy=False)

    # -- during the run -----------------------------------------------------------
    def readers(self, state: RunState,
                host_exits: asyncio.Queue[tuple[str, int]] | None) -> list[asyncio.Task[None]]:
        """Start the tasks that read the control socket and watch the host processes."""
        tasks = [asyncio.create_task(self.read(state))]
        if host_exits is not None:
            tasks.append(asyncio.create_task(self.watch(host_exits)))
        return tasks

    async def read(self, state: RunState) -> None:
        """Log the hosts' event batches and note their goodbyes, until cancelled."""
        while True:
            frames = await self.sock.recv_multipart(copy=False)
            try:
                msg, _ = wire.decode(frames[1:], check_finite=False)
            except wire.WireError as exc:
                log.warning("rejected a control message: %s", exc)
                continue
            name = frames[0].bytes.decode(errors="replace")
            if isinstance(msg, wire.EventBatch):
                state.host_events(msg.events)
            elif isinstance(msg, wire.Control) and msg.op == "bye":
                self.hosts.setdefault(name, {})["bye"] = msg.args
                self.queue.put_nowait(("host_bye", name))

    async def watch(self, host_exits: asyncio.Queue[tuple[str, int]]) -> None:
        """Turn host process exits into ``host_exit`` events, until cancelled."""
        while True:
            name, code = await host_exits.get()
            self.queue.put_nowait(("host_exit", (name, code)))

    def lose(self, now: float, name: str, code: int, state: RunState) -> list[int] | None:
        """Mark a live host dead and record it; return its clients (None if not live)."""
        info = self.hosts.get(name, {})
        if not info.get("alive", False):
            return None
        info["alive"] = False
        state.host_failures.append({"host": name, "exit": code, "t": now})
        state.event(now, "host_lost", host=name, exit=code)
        log.error("client host %s exited with %s; its clients are lost", name, code)
        return info.get("clients", [])

    @property
    def any_alive(self) -> bool:
        """Whether any host is still alive."""
        return any(h.get("alive") for h in self.hosts.values())

    # -- shutdown -----------------------------------------------------------------
    async def stop(self) -> None:
        """Tell live hosts to stop; wait up to 10 s for each one's bye or exit."""
        for name, info in self.hosts.items():
            if info.get("alive", True):
                await self.send(name, wire.Control(op="stop", args={}))
        deadline = monotonic() + 10.0
        while monotonic() < deadline and any(
            info.get("alive", True) and "bye" not in info for info in self.hosts.values()
        ):
            try:
                kind, item = await asyncio.wait_for(self.queue.get(), 0.2)
            except TimeoutError:
                continue
            if kind == "host_exit":
                self.hosts.get(item[0], {})["alive"] = False
