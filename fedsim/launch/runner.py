"""``fedsim run`` (one federation on one host) and the server side of ``fedsim server``.

The runner writes the resolved scenario to a fresh run directory, binds the
server's sockets, starts the client-host processes (one per core by
default, each hosting many client actors), runs the server actor on this
process's event loop, and leaves the summary and plots behind. Ctrl-C ends
the run cleanly (a second Ctrl-C aborts it); a crashed client host is
reported and the run goes on with the clients that remain.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedsim.actors.process import (
    cpu_placement,
    fedsim_version,
    freeze_heap,
    pin_process,
    run_loop,
    thaw_heap,
)
from fedsim.actors.server_gate import message_limit
from fedsim.actors.setup import build_data, build_model, model_shapes
from fedsim.actors.workers import WorkerHandle
from fedsim.actors.zygote import Zygote, can_fork_here
from fedsim.algorithms import flatten
from fedsim.errors import ResumeError
from fedsim.launch.local_hosts import HostProcess, start_hosts
from fedsim.launch.prep import finish, prepare, prepare_resume
from fedsim.results.values import RunResult
from fedsim.results.writer import write_json_atomic
from fedsim.scenario import Scenario, scenario_hash
from fedsim.scenario.plugins import child_env
from fedsim.wire.tensors import TensorSpec
from fedsim.wire.transport import ZmqContext, ipc_address

if TYPE_CHECKING:
    from fedsim.actors.runstate import Progress
    from fedsim.wire.curve import ServerKeys

__all__ = ["RunControl", "plan_hosts", "run_scenario", "serve"]

log = logging.getLogger(__name__)


class RunControl:
    """Stops a run from outside its event loop (another thread, a cancelled task).

    :meth:`interrupt` does what Ctrl-C does to ``fedsim run``: the first call
    ends the run cleanly with status ``interrupted`` (results written), a
    second aborts it. It is safe from any thread, and may come before the
    server exists: the run then stops as soon as it starts.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: Callable[[str], None] | None = None
        self._task: asyncio.Task[Any] | None = None
        self.interrupts = 0

    def _attach(self, loop: asyncio.AbstractEventLoop, stop: Callable[[str], None],
                task: asyncio.Task[Any] | None) -> None:
        with self._lock:
            self._loop, self._stop, self._task = loop, stop, task
            pending = self.interrupts
        for n in range(1, pending + 1):
            self._deliver(n)

    def _detach(self) -> None:
        with self._lock:
            self._loop = self._stop = self._task = None

    def interrupt(self) -> None:
        """Stop the run (first call: cleanly; second: abort)."""
        with self._lock:
            self.interrupts += 1
            n, attached = self.interrupts, self._loop is not None
        if attached:
            self._deliver(n)

    def _deliver(self, n: int) -> None:
        loop, stop, task = self._loop, self._stop, self._task
        if loop is None or stop is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop just closed: the run is over
            if n == 1:
                loop.call_soon_threadsafe(stop, "interrupted")
            elif task is not None:
                loop.call_soon_threadsafe(task.cancel)


def new_run_id() -> str:
    """A run's id on this machine (its ipc addresses are named after it)."""
    return f"{os.getpid()}-{int(time.time() * 1000) % 10**8}"


def plan_hosts(sc: Scenario) -> list[list[int]]:
    """Assign clients to client-host processes (round-robin)."""
    n = sc.deploy.hosts or len(os.sched_getaffinity(0))
    n = max(1, min(n, sc.data.num_clients))
    return [list(range(h, sc.data.num_clients, n)) for h in range(n)]


async def serve(sc: Scenario, run_dir: Path, dilation: float, data: dict[str, Any], *,
                bind: str | None = None, keys: ServerKeys | None = None,
                allowed: dict[str, tuple[int, ...]] | None = None,
                local_hosts: list[list[int]] | None = None, resume: bool = False,
                on_progress: Callable[[Progress], None] | None = None,
                control: RunControl | None = None, zygote: Zygote | None = None,
                fed: Any = None, trainer_cpus: list[int] | None = None,
                run_id: str | None = None,
                started: dict[str, HostProcess] | None = None) -> dict[str, Any]:
    """Run the server of one federation; return its summary.

    ``bind`` is the address client hosts connect to (default: a local one).
    ``local_hosts`` are client-host processes to start on this machine
    (``fedsim run``); without them, hosts connect from wherever they run
    (``fedsim server``). With ``keys`` the socket is a CURVE server that
    admits only the keys on ``allowed``'s allow-list. With ``resume`` the run
    continues from ``run_dir``'s checkpoint. SIGINT and SIGTERM (on the main
    thread) and ``control`` end the run with status ``interrupted`` (a second
    one aborts). ``trainer_cpus`` gives local host ``h``'s trainer the CPU
    ``trainer_cpus[h]`` (``deploy.pin_trainers``). ``started`` are the local
    hosts already started (by :func:`run_scenario`, before it imported
    torch) for ``run_id``'s ipc address.
    """
    from fedsim.actors.checkpoint import load_checkpoint  # lazy: torch stays out of client hosts
    from fedsim.actors.server import Server  # lazy: torch stays out of client hosts

    run_id = run_id or new_run_id()
    scenario_file = str((run_dir / "scenario.json").resolve())
    ckpt = None
    if resume:
        try:
            ckpt = load_checkpoint(run_dir, fedsim_version(), scenario_hash(data))
        except (FileNotFoundError, ValueError) as exc:
            raise ResumeError(str(exc)) from None
    zmq_ctx = ZmqContext()
    if bind is None:
        bind = (ipc_address(run_id, "server") if sc.deploy.transport == "ipc"
                else "tcp://127.0.0.1:0")
    procs: dict[str, HostProcess] = dict(started or {})
    try:
        # The data and the model first: the server's socket bounds every frame
        # by the largest message the model allows, set when it binds. Hosts
        # started already connect meanwhile (libzmq tries again every 50 ms);
        # they need the data too before they register.
        if fed is None and zygote is not None:  # the zygote built it: no second copy
            shape = await zygote.describe()
            input_shape, num_classes = tuple(shape["input_shape"]), int(shape["num_classes"])
            stats = shape["stats"]
        else:
            fed = build_data(sc) if fed is None else fed
            stats = fed.stats()
            input_shape, num_classes = tuple(fed.input_shape), int(fed.num_classes)
            del fed
        write_json_atomic(run_dir / "data.json", stats, indent=None)
        # each client's training samples as the seed partitions the data: the
        # server's record of the weights (a host must register these counts)
        partition = [int(c["num_samples"]) for c in stats["clients"]]
        model = build_model(sc, input_shape, num_classes)
        spec = TensorSpec([("float32", s) for s in model_shapes(model)])
        alg = sc.algorithm.spec
        endpoint = zmq_ctx.endpoint(
            bind, keys, max_message_bytes=message_limit(
                sc, spec, max(alg.task_copies, alg.update_copies)),
            handshake_timeout=sc.deploy.handshake_timeout)
    except BaseException:  # no federation: the hosts started for it go
        for p in procs.values():
            with contextlib.suppress(ProcessLookupError):
                p.kill()
            await p.wait()
        zmq_ctx.close(linger_ms=0)
        raise
    stopping = {"flag": False}
    if started is None:
        procs = start_hosts(
            local_hosts or [], connect=endpoint.address, scenario_file=scenario_file,
            run_id=run_id, zygote=None if zygote is None else zygote.name,
            trainer_cpus=trainer_cpus, env=child_env())
    write_json_atomic(run_dir / "endpoints.json", {
        "server": endpoint.address, "run_id": run_id, "pid": os.getpid(),
        "node": socket.gethostname(), "authenticated": keys is not None,
        "hosts": {n: {"pid": p.pid, "clients": (local_hosts or [])[i]}
                  for i, (n, p) in enumerate(procs.items())},
    })
    x0 = flatten([p for p in model.parameters() if p.requires_grad])
    del model
    evaluator = WorkerHandle(zmq_ctx, ipc_address(run_id, "eval"), scenario_file, "evaluator",
                             zygote=None if zygote is None else zygote.name)
    try:
        server = Server(sc, run_dir, endpoint=endpoint, evaluator=evaluator,
                        dilation=dilation, fedsim_version=fedsim_version(),
                        scenario_hash=scenario_hash(data), model_x0=x0, model_spec=spec,
                        partition=partition, allowed=allowed, resume=ckpt)
    except BaseException:  # the algorithm cannot be built (a missing extra, a plug-in's
        # error): the hosts started for the run go, and its sockets close
        for p in procs.values():
            with contextlib.suppress(ProcessLookupError):
                p.kill()
            await p.wait()
        with contextlib.suppress(Exception):
            await evaluator.close()
        endpoint.close()
        zmq_ctx.close(linger_ms=0)
        raise
    server.on_progress = on_progress

    async def watch(name: str, proc: HostProcess) -> None:
        code = await proc.wait()
        if code != 0 or not stopping["flag"]:
            server.host_exited(name, f"exit code {code}")

    if local_hosts is None:
        log.info("server listening at %s%s; waiting for client hosts", endpoint.address,
                 " (CURVE)" if keys is not None else "")
    watchers = [asyncio.create_task(watch(n, p)) for n, p in procs.items()]
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()
    interrupts = {"n": 0}

    def on_signal() -> None:
        interrupts["n"] += 1
        if interrupts["n"] == 1:
            server.request_stop("interrupted")
        elif main is not None:
            main.cancel()

    with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):  # not the main thread
        loop.add_signal_handler(signal.SIGINT, on_signal)
        loop.add_signal_handler(signal.SIGTERM, on_signal)
    if control is not None:
        control._attach(loop, server.request_stop, main)
    try:
        summary = await server.run()
    finally:
        if control is not None:
            control._detach()
        stopping["flag"] = True
        for p in procs.values():
            if p.returncode is None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(p.wait(), 10.0)
            if p.returncode is None:
                p.kill()
                await p.wait()
        for w in watchers:
            w.cancel()
        with contextlib.suppress(Exception):
            await evaluator.close()
        endpoint.close()
        zmq_ctx.close(linger_ms=500)
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.remove_signal_handler(signal.SIGINT)
            loop.remove_signal_handler(signal.SIGTERM)
    return summary


def run_scenario(sc: Scenario | None, out: str | Path | None = None, *,
                 dilation: float | str | None = None, resume: str | Path | None = None,
                 on_progress: Callable[[Progress], None] | None = None,
                 control: RunControl | None = None, plots: bool = True) -> RunResult:
    """Run a scenario to its end on this machine and return where its results are.

    With ``resume`` (a run directory) the run continues from its last
    checkpoint instead (``sc`` is read from the directory). The run's event
    loop is this thread's (it must have none running: :func:`fedsim.run`
    takes care of that); ``control`` stops it from elsewhere. ``plots=False``
    skips drawing the run's PNGs at the end (``fedsim plot RUN`` draws them
    later; a sweep of many runs saves a few seconds per run).
    """
    if resume is not None:
        sc, run_dir, choice, data = prepare_resume(resume)
    assert sc is not None
    hosts = plan_hosts(sc)
    # refused before a run directory is made
    placement = cpu_placement(len(hosts)) if sc.deploy.pin_trainers else None
    if resume is None:
        sc, run_dir, choice, data = prepare(sc, out, dilation, len(hosts))
    cpus_before = os.sched_getaffinity(0)
    try:
        summary = _run_here(sc, run_dir, choice, data, hosts, resume is not None,
                            on_progress, control, placement)
    finally:
        if placement is not None:
            pin_process(os.getpid(), cpus_before)
    if plots:
        finish(run_dir)
    return RunResult.of(run_dir, summary)


def _run_here(sc: Scenario, run_dir: Path, choice: float, data: dict[str, Any],
              hosts: list[list[int]], resume: bool,
              on_progress: Callable[[Progress], None] | None, control: RunControl | None,
              placement: tuple[set[int], list[int]] | None) -> dict[str, Any]:
    """The federation of :func:`run_scenario` (local hosts, a zygote, the server's loop);
    its summary. ``placement``: ``deploy.pin_trainers``' CPUs (the rest, the trainers')."""
    name = f"fedsim-{os.getpid()}-{time.monotonic_ns()}-zygote"
    run_id, started = new_run_id(), None
    rest, trainer_cpus = placement if placement is not None else (None, None)
    if sc.deploy.transport == "ipc":
        # The hosts start now, while this process imports torch and builds the
        # data: they need only the server's address (an ipc name, known now)
        # and the zygote's (they wait for both to appear).
        started = start_hosts(hosts, connect=ipc_address(run_id, "server"),
                              scenario_file=str((run_dir / "scenario.json").resolve()),
                              run_id=run_id,
                              zygote=name if sc.deploy.workers == "fork" else None,
                              trainer_cpus=trainer_cpus, env=child_env(), background=True,
                              cpus=rest)
    try:
        return _federation(sc, run_dir, choice, data, hosts, resume, on_progress, control,
                           placement, name, run_id, started)
    finally:
        for p in (started or {}).values():   # a start that failed leaves none behind
            if p.returncode is None:
                p.kill()
                p.popen.wait()


def _federation(sc: Scenario, run_dir: Path, choice: float, data: dict[str, Any],
                hosts: list[list[int]], resume: bool,
                on_progress: Callable[[Progress], None] | None, control: RunControl | None,
                placement: tuple[set[int], list[int]] | None, name: str, run_id: str,
                started: dict[str, HostProcess] | None) -> dict[str, Any]:
    trainer_cpus = None
    if placement is not None:
        # From here (the imports and data of the set-up done, or about to be
        # in a zygote of their own) this process, and every process and thread
        # it starts (the zygote, the evaluator, hosts not started yet), stays
        # off the trainers' CPUs; hosts started already confine themselves.
        rest, trainer_cpus = placement
        pin_process(os.getpid(), rest)
        log.info("trainers on CPUs %s, the rest of the run on %s", trainer_cpus, sorted(rest))
    zygote, fed = None, None
    if sc.deploy.workers == "fork" and not can_fork_here():
        # a fresh zygote imports torch while this process does
        zygote = Zygote.start(name, str((run_dir / "scenario.json").resolve()))
    import torch  # lazy: torch stays out of client hosts, and loads after they start

    # The server's tensor math is small and sequential; torch's intra-op
    # threads would only spin on the cores the client hosts need.
    torch.set_num_threads(1)
    if sc.deploy.workers == "fork" and zygote is None:
        # this process imported torch and builds the data once; the zygote
        # and every worker share them (before any loop, socket or thread)
        fed = build_data(sc)
        freeze_heap()  # torch and the data: the zygote's and this process's collections skip them
        zygote = Zygote.fork(name, sc, fed)
    try:
        return run_loop(serve(sc, run_dir, choice, data, local_hosts=hosts, resume=resume,
                              on_progress=on_progress, control=control, zygote=zygote,
                              fed=fed, trainer_cpus=trainer_cpus, run_id=run_id,
                              started=started),
                        sc.deploy.loop)
    finally:
        thaw_heap()
        if zygote is not None:
            zygote.close()
