"""A whole federation in one process, on virtual time, over an in-memory network.

The same :class:`~fedsim.actors.server.Server` and
:class:`~fedsim.actors.host.ClientHost` that ``fedsim run`` starts in
separate processes, joined by a :class:`~fedsim.testing.memory_network.MemoryNetwork`
instead of ZeroMQ, with torch work done in-process
(:class:`~fedsim.actors.worker.InlineWorker`) and every clock on a
:class:`~fedsim.testing.virtual_time.VirtualTimeLoop`: emulated time jumps from one
timer to the next, so a minute of federation takes a fraction of a second
of real time, and timer lateness is exactly zero. Training takes no
emulated time beyond the device's compute budget, so there are no overruns.

This is the actor test harness (STYLE practice 12b, after trio's fake
network and h11's connection pairs): a test can script the network through
:attr:`InMemoryRun.network` (``route`` to drop, duplicate or delay
packets), kill a host or the server (and resume it from its checkpoint while
the hosts run on), or inject its own messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedsim.actors.checkpoint import load_checkpoint
from fedsim.actors.host import ClientHost
from fedsim.actors.server import Server
from fedsim.actors.setup import build_data, build_model, model_shapes
from fedsim.actors.worker import InlineWorker
from fedsim.algorithms import flatten
from fedsim.results.writer import read_events, write_json_atomic
from fedsim.scenario import Scenario, resolved, scenario_hash
from fedsim.testing.memory_network import MemoryNetwork, Packet
from fedsim.testing.virtual_time import run_virtual
from fedsim.wire.tensors import TensorSpec

__all__ = ["InMemoryRun", "run_in_memory"]

log = logging.getLogger(__name__)

ADDRESS = "mem://server"
VERSION = "in-memory"


@dataclass
class InMemoryRun:
    """What an in-memory federation left behind, and its live parts while it runs."""

    run_dir: Path
    network: MemoryNetwork
    server: Server | None = None
    hosts: list[ClientHost] = field(default_factory=list)
    host_tasks: list[asyncio.Task[int]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    host_codes: list[int | None] = field(default_factory=list)

    def events(self) -> list[dict[str, Any]]:
        """Every record of the run's event log, in the file's order (append order per
        writer, not time order: :func:`fedsim.results.reader.load_run` sorts by ``t``)."""
        return list(read_events(self.run_dir / "events.jsonl"))

    #: makes a host again (set by run_in_memory): index -> a new ClientHost and its task
    _restart: Callable[[int], None] | None = None
    #: makes a server resumed from the run's checkpoint (set by run_in_memory)
    _resume: Callable[[], None] | None = None
    _server_task: asyncio.Task[dict[str, Any]] | None = None
    _killed: set[asyncio.Task[dict[str, Any]]] = field(default_factory=set)
    _resumed: asyncio.Event | None = None

    def kill_host(self, index: int, tell_server: bool = True) -> None:
        """Crash a host: its task is cancelled, its connection closed, and (unless
        ``tell_server`` is False: then only its silence shows) the server is told."""
        self.host_tasks[index].cancel()
        self.hosts[index].conn.close()
        assert self.server is not None
        if tell_server:
            self.server.host_exited(self.hosts[index].name, "killed by the test")

    def restart_host(self, index: int) -> None:
        """Start host ``index`` again (after :meth:`kill_host`): same name, same clients."""
        assert self._restart is not None
        self._restart(index)

    async def kill_server(self) -> None:
        """The server dies as a killed process does, its hosts left running: nothing it
        sends from now on reaches anyone, its task is cancelled (what it still writes
        lies after its last checkpoint, which a resume truncates) and its address is
        free for :meth:`resume_server`."""
        server, task = self.server, self._server_task
        assert server is not None
        assert task is not None
        assert self._resumed is not None
        before = self.network.route

        def dead(packet: Packet) -> None:
            if packet.source != ADDRESS:
                (before or self.network.deliver)(packet)

        self._resumed.clear()
        self._killed.add(task)
        self.network.route = dead
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait([task])
        server.endpoint.close()
        self.network.route = before

    def resume_server(self) -> None:
        """Start a server that continues the run from its checkpoint (``fedsim server
        --resume``) at the same address: the hosts still running reconnect to it."""
        assert self._resume is not None
        self._resume()


def plan(sc: Scenario, hosts: int) -> list[list[int]]:
    """Clients of each host, round-robin."""
    n = max(1, min(hosts, sc.data.num_clients))
    return [list(range(h, sc.data.num_clients, n)) for h in range(n)]


def run_in_memory(sc: Scenario, run_dir: Path, *, hosts: int = 1, dilation: float = 1.0,
                  network: MemoryNetwork | None = None,
                  during: Callable[[InMemoryRun], Coroutine[Any, Any, None]] | None = None,
                  host_hashes: dict[int, str] | None = None,
                  allowed: dict[str, tuple[int, ...]] | None = None,
                  users: dict[int, str | None] | None = None,
                  resume: bool = False, state_dir: Path | None = None,
                  clock_skew: dict[int, float] | None = None) -> InMemoryRun:
    """Run ``sc`` to its end in this process; return its records.

    Parameters
    ----------
    hosts
        Client hosts (clients are dealt round-robin).
    network
        A network to use (e.g. with a ``route`` hook already set).
    during
        A coroutine started with the federation, given the live run (kill a
        host, send forged messages, ...).
    host_hashes
        Host index -> the scenario hash it claims (to test refusals).
    allowed
        An allow-list (host name -> client ids), as CURVE keys give the
        server; each host's connection authenticates as its own name unless
        ``users`` (host index -> name, or None) says otherwise.
    resume
        Continue the run in ``run_dir`` from its checkpoint.
    state_dir
        Where each host's worker keeps its clients' state (saved after every
        task), as ``fedsim clients --state`` does: a restarted host takes it back.
    clock_skew
        Host index -> seconds its monotonic clock is ahead of the server's
        (another machine, or a time namespace).
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    data = resolved(sc)
    write_json_atomic(run_dir / "scenario.json", data)
    run = InMemoryRun(run_dir=run_dir, network=network or MemoryNetwork())

    async def main() -> None:
        loop = asyncio.get_running_loop()
        fed = build_data(sc)
        model = build_model(sc, tuple(fed.input_shape), int(fed.num_classes))
        x0 = flatten([p for p in model.parameters() if p.requires_grad])
        spec = TensorSpec([("float32", s) for s in model_shapes(model)])
        groups = plan(sc, hosts)
        the_hash = scenario_hash(data)
        run._resumed = asyncio.Event()

        def start_server(ckpt: dict[str, Any] | None) -> None:
            run.server = Server(sc, run_dir, endpoint=run.network.bind(ADDRESS),
                                evaluator=InlineWorker(sc, []), dilation=dilation,
                                fedsim_version=VERSION, scenario_hash=the_hash, model_x0=x0,
                                model_spec=spec, partition=[c.num_samples for c in fed.clients],
                                allowed=allowed, resume=ckpt,
                                real_clock=loop.time, use_timerfd=False)
            run._server_task = asyncio.create_task(run.server.run(), name="server")
            run._resumed.set()   # type: ignore[union-attr]

        start_server(load_checkpoint(run_dir, VERSION, the_hash) if resume else None)
        run._resume = lambda: start_server(load_checkpoint(run_dir, VERSION, the_hash))
        def start_host(i: int) -> None:
            name, clients = f"host-{i}", groups[i]
            user = (users or {}).get(i, name) if allowed is not None else None
            conn = run.network.connect(ADDRESS, name.encode(), user=user)
            state = None if state_dir is None else str(state_dir / f"{name}-clients.pt")
            host = ClientHost(sc, name, clients, conn,
                              InlineWorker(sc, clients, state, save_every=0.0),
                              fedsim_version=VERSION,
                              scenario_hash=(host_hashes or {}).get(i, the_hash),
                              real_clock=_skewed(loop.time, (clock_skew or {}).get(i, 0.0)),
                              use_timerfd=False)
            if i < len(run.hosts):
                run.hosts[i] = host
                run.host_tasks[i] = asyncio.create_task(host.run(), name=name)
            else:
                run.hosts.append(host)
                run.host_tasks.append(asyncio.create_task(host.run(), name=name))

        run._restart = start_host
        for i in range(len(groups)):
            start_host(i)
        side: asyncio.Task[None] | None = (
            asyncio.create_task(during(run)) if during is not None else None)
        try:
            while True:
                task = run._server_task
                assert task is not None
                try:
                    run.summary = await task
                    break
                except asyncio.CancelledError:
                    if task not in run._killed:
                        raise
                await run._resumed.wait()   # the test resumes it (or never: its timeout)
        finally:
            if side is not None:
                side.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await side
            done, pending = await asyncio.wait(run.host_tasks, timeout=30.0)
            for t in pending:
                t.cancel()
            run.host_codes = [t.result() if t in done and not t.cancelled()
                              and t.exception() is None else None for t in run.host_tasks]

    run_virtual(main())
    return run


def _skewed(clock: Callable[[], float], skew: float) -> Callable[[], float]:
    """``clock`` shifted by ``skew`` seconds (``clock`` itself when 0)."""
    if not skew:
        return clock
    return lambda: clock() + skew
