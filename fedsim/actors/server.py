"""The server actor: one ROUTER for clients, one for client hosts (:mod:`._hostctl`).

Every client message passes through that client's uplink on arrival: the
timer heap holds it until the link delivers it, then the actor's single
event queue hands it to the strategy (:mod:`.strategies`), one event at a
time, so updates are applied strictly in delivery order and staleness is
whatever really happened. Evaluation runs in a torch worker process and
never blocks the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedsim import wire
from fedsim.actors._hostctl import HostControl
from fedsim.actors._setup import build_data, build_model, local_config, model_shapes
from fedsim.actors._workers import WorkerHandle
from fedsim.actors.runstate import RunState
from fedsim.algorithms import ClientResult, flatten, get, unflatten
from fedsim.algorithms.api import ServerContext, Step
from fedsim.network import NetPlan
from fedsim.scenario import Scenario
from fedsim.transport import Transport, ipc_address
from netem.clock import Clock, monotonic
from netem.fidelity import FidelityMonitor
from netem.timers import TimerHeap

__all__ = ["Server"]

log = logging.getLogger(__name__)


class Server:
    """Runs the server side of one federation."""

    def __init__(self, sc: Scenario, run_dir: Path, *, hosts: int, scenario_file: str,
                 run_id: str, dilation: float, bind_host: str = "127.0.0.1") -> None:
        self.sc = sc
        self.run_dir = run_dir
        self.scenario_file = scenario_file
        self.run_id = run_id
        self.dilation = dilation
        self.bind_host = bind_host
        self.transport = Transport(max_sockets=64)
        self.clock = Clock(dilation=dilation)
        self.timers: TimerHeap | None = None
        self.queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self.clients = set(range(sc.data.num_clients))
        self.joined: set[int] = set()
        self.hostctl = HostControl(hosts, self.queue)
        self.task_ids = itertools.count(1)
        self.seq = itertools.count()
        self.max_bytes = int(sc.deploy.max_message_mb * 1e6)
        self.state: RunState | None = None
        self.stop_reason: str | None = None
        self.on_progress: Callable[[dict[str, Any]], None] | None = None
        self.egress: Any = None
        self._sends: set[asyncio.Future[None]] = set()
        self.monitor: FidelityMonitor | None = None

    @property
    def hosts(self) -> dict[str, dict[str, Any]]:
        """The client hosts' bookkeeping (see :attr:`HostControl.hosts`)."""
        return self.hostctl.hosts

    # -- setup ----------------------------------------------------------------
    def bind(self) -> tuple[str, str]:
        """Bind the client and host sockets; return (data, control) addresses."""
        if self.sc.deploy.transport == "ipc":
            data, control = ipc_address(self.run_id, "data"), ipc_address(self.run_id, "ctl")
        else:
            data = control = f"tcp://{self.bind_host}:0"
        self.data_sock, self.data_address = self.transport.router(data)
        self.control_address = self.hostctl.bind(self.transport, control)
        return self.data_address, self.control_address

    async def run(self, host_exits: asyncio.Queue[tuple[str, int]] | None = None) -> dict[str, Any]:
        """Run the federation to its end; return the summary."""
        data = build_data(self.sc)
        model = build_model(self.sc, tuple(data.input_shape), int(data.num_classes))
        shapes = model_shapes(model)
        self.shapes = shapes
        self.alg = get(self.sc.algorithm.name)
        model_spec = wire.TensorSpec([(s, "float32") for s in shapes])
        self.spec = model_spec.repeated(self.alg.update_copies)
        trainable = [p for p in model.parameters() if p.requires_grad]
        ctx = ServerContext(x0=flatten(trainable), num_clients=self.sc.data.num_clients,
                            seed=self.sc.seed, local=local_config(self.sc))
        strategy = self.alg.server(self.sc.algorithm, ctx)
        self.strategy = strategy
        self.state = state = RunState(self.sc, self.run_dir, strategy.cadence, data.stats())
        self.evaluator = WorkerHandle(self.transport, ipc_address(self.run_id, "eval"),
                                      self.scenario_file, "evaluator")
        readers: list[asyncio.Task[Any]] = []
        try:
            await asyncio.gather(
                self.evaluator.start(),
                self.hostctl.wait_ready(host_exits, within=self.sc.deploy.start_timeout))
            self.clock = Clock(dilation=self.dilation, epoch=monotonic() + 0.05)
            self.timers = TimerHeap(self.clock)
            state.start(self.clock)
            await self.hostctl.start(self.clock.epoch, self.dilation, shapes)
            self.plan = plan = NetPlan(self.sc, host_step_time=self.sc.devices.host_step_time)
            self.monitor = FidelityMonitor(dilation=self.dilation)
            for kind, params in plan.expectations().items():
                self.monitor.expect_link(kind, params)
            shared_up = plan.bottleneck("up")
            self.egress = plan.bottleneck("down")
            self.links = {c: plan.make_link(c, "up", shared_up) for c in self.clients}
            self.availability = {c: plan.availability(c) for c in self.clients}
            readers = [asyncio.create_task(self._read_data()),
                       *self.hostctl.readers(state, host_exits),
                       asyncio.create_task(self._ticker())]
            budget = self.sc.run.time_budget
            if budget is not None:
                self.timers.call_at(budget, self.queue.put_nowait, ("stop", "time_budget"))
            if self.sc.eval.every_seconds:
                self._arm_eval_timer(self.sc.eval.every_seconds)
            state.request_eval(self, 0.0, strategy)
            await self._begin()
            await self._loop()
            state.stopped_at = self.clock.now()
            state.request_eval(self, self.clock.now(), strategy, final=True)
            await state.drain_evals()
        except BaseException as exc:
            self.stop_reason = self.stop_reason or f"error: {type(exc).__name__}: {exc}"
            raise
        finally:
            await self._shutdown(readers)
            state.finish(self, self.stop_reason or "completed")
        return state.summary

    # -- readers --------------------------------------------------------------
    async def _read_data(self) -> None:
        assert self.state is not None
        assert self.timers is not None
        state = self.state
        while True:
            frames = await self.data_sock.recv_multipart(copy=False)
            ident = frames[0].bytes
            try:
                msg, meta = wire.decode(frames[1:], max_bytes=self.max_bytes, spec=self.spec)
                cid = _client_id(ident)
                if cid not in self.clients:
                    raise wire.WireError("bad_field", f"unknown sender {ident!r}")
                claimed = getattr(msg, "client", getattr(msg, "sender", cid))
                if claimed != cid:
                    raise wire.WireError("bad_field", f"sender {ident!r} claims client {claimed}")
            except wire.WireError as exc:
                state.rejected(self.clock.now(), ident, exc)
                continue
            d = self.links[cid].schedule(meta.sent_at, meta.nbytes)
            if d.dropped:
                state.event(self.clock.now(), "drop", client=cid, kind=meta.kind, dir="up",
                            bytes=meta.nbytes, reason=d.reason)
                continue
            self.timers.call_at(d.t_deliver, self._delivered, cid, msg, meta, d)

    def _away_between(self, cid: int, t_send: float, t_now: float) -> str | None:
        """Whether the in-flight policy loses a message of an away client."""
        policy = self.sc.network.in_flight
        if policy == "held":
            return None
        av = self.availability[cid]
        if not av.is_available(t_now):
            return f"away ({policy})"
        if policy == "reset" and av.next_change(t_send)[0] <= t_now:
            return "connection reset"
        return None

    def _delivered(self, cid: int, msg: Any, meta: Any, d: Any) -> None:
        assert self.state is not None
        now = self.clock.now()
        self.monitor.record_delivery(self.plan.kind(cid, "up"), d, now)
        lost = self._away_between(cid, meta.sent_at, now)
        self.state.event(now, "drop" if lost else "deliver", client=cid, kind=meta.kind,
                         dir="up", bytes=meta.nbytes, sent_at=meta.sent_at,
                         scheduled=d.t_deliver, version=getattr(msg, "base_version", None),
                         **({"reason": lost} if lost else {}))
        if lost:
            return
        if isinstance(msg, wire.Update):
            self.state.bytes_up += meta.nbytes
        self.queue.put_nowait(("client", (cid, msg)))

    async def _ticker(self) -> None:
        while True:
            await asyncio.sleep(0.5)
            self.queue.put_nowait(("tick", None))

    def _arm_eval_timer(self, period: float) -> None:
        assert self.timers is not None
        self.timers.call_later(period, self.queue.put_nowait, ("eval_timer", period))

    # -- the event loop ---------------------------------------------------------
    async def _loop(self) -> None:
        assert self.state is not None
        assert self.timers is not None
        state, strategy = self.state, self.strategy
        while self.stop_reason is None:
            kind, item = await self.queue.get()
            now = self.clock.now()
            step: Step | None = None
            if kind == "client":
                cid, msg = item
                try:
                    step = self._on_client(now, cid, msg)
                except Exception as exc:  # an algorithm error must not end the run
                    log.exception("the algorithm failed on %s from client %d", type(msg).__name__,
                                  cid)
                    state.event(now, "discard", client=cid,
                                reason=f"algorithm error: {type(exc).__name__}: {exc}")
            elif kind == "strategy_timer":
                step = strategy.on_timer(now)
            elif kind == "eval_timer":
                state.request_eval(self, now, strategy)
                self._arm_eval_timer(item)
            elif kind == "stop":
                self.stop_reason = item
            elif kind == "host_exit":
                step = self._host_lost(now, *item)
            elif kind == "tick":
                if self.on_progress is not None:
                    self.on_progress(state.progress(now, strategy))
                state.flush()
            if step is not None:
                await self._apply(now, step)
            reason = state.should_stop(strategy)
            if reason and self.stop_reason is None:
                self.stop_reason = reason

    async def _begin(self) -> None:
        """The federation begins (t = 0) with every client its hosts registered."""
        assert self.state is not None
        registered = self.hostctl.registered()
        missing = sorted(self.clients - set(registered))
        if missing:
            log.warning("%d of %d clients never registered: %s", len(missing),
                        len(self.clients), _ranges(missing))
            self.state.event(0.0, "missing", clients=missing)
            self.clients -= set(missing)
        for cid, n in registered.items():
            self.state.samples[cid] = n
        self.joined = set(registered)
        step = self.strategy.start(sorted(registered), 0.0)
        if not step.dispatch and self.strategy.in_flight() == 0:
            self.stop_reason = ("failed: no round could start "
                                f"({len(registered)} of {self.sc.data.num_clients} clients "
                                "registered)")
            return
        await self._apply(0.0, step)

    def _on_client(self, now: float, cid: int, msg: Any) -> Step | None:
        assert self.state is not None
        strategy = self.strategy
        if isinstance(msg, wire.Register):  # back after a connection reset
            return strategy.rejoin(cid, now, reset=True)
        if isinstance(msg, wire.Heartbeat):
            return strategy.rejoin(cid, now, reset=False) if msg.status == "ready" else None
        if isinstance(msg, wire.Update):
            steps = msg.stats.get("steps", 0)
            if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
                self.state.event(now, "discard", client=cid, reason=f"bad steps {steps!r}")
                return None
            arrays = msg.tensors
            flat = (np.concatenate([np.asarray(a).reshape(-1) for a in arrays]) if arrays
                    else np.zeros(0, np.float32))
            result = ClientResult(client=cid, base_version=msg.base_version,
                                  params=torch.from_numpy(flat), num_samples=msg.num_samples,
                                  steps=steps, task_id=msg.task_id, round=msg.round)
            return strategy.update(result, now)
        if isinstance(msg, wire.Bye):
            return strategy.lost(cid, now)
        if isinstance(msg, wire.Error):
            return self._client_failed(cid, now, msg.reason)
        return None

    def _client_failed(self, cid: int, now: float, reason: str) -> Step | None:
        """A client reported a fatal failure: it is out; with no client left, so is the run."""
        assert self.state is not None
        if cid not in self.clients:
            return None
        log.error("client %d failed: %s", cid, reason)
        self.state.event(now, "client_failed", client=cid, reason=reason)
        self.clients.discard(cid)
        step = self.strategy.lost(cid, now)
        if not self.clients:
            self.stop_reason = f"failed: every client failed (last: {reason})"
        return step

    async def _apply(self, now: float, step: Step) -> None:
        assert self.state is not None
        assert self.timers is not None
        self.state.applied(self, now, step)
        for cid in step.dispatch:
            await self._dispatch(now, cid)
        for b in step.broadcasts:
            await self._broadcast(now, b)
        nxt = self.strategy.next_timer()
        if nxt is not None:
            self.timers.call_at(nxt, self.queue.put_nowait, ("strategy_timer", nxt))

    async def _dispatch(self, now: float, cid: int) -> None:
        assert self.state is not None
        d = self.strategy.task(cid, next(self.task_ids))
        config: dict[str, Any] = {}
        if d.budget is not None and d.budget.steps is not None:
            config["steps"] = d.budget.steps
        if d.budget is not None and d.budget.epochs is not None:
            config["epochs"] = d.budget.epochs
        task = wire.Task(client=cid, version=d.version, round=d.round, task_id=d.task_id,
                         tensors=self._frames(d.payload), config=config)
        if self.egress is not None:
            # A shared downlink bottleneck at the server: the message really
            # waits here until the shared stage has sent it.
            nbytes = wire_size(task)
            p = self.plan.params(cid, "down")
            _, end = self.egress.reserve(now, nbytes + p.packets(nbytes) * p.overhead)
            if end > now:
                assert self.timers is not None
                self.timers.call_at(end, self._send_later, cid, task)
                return
        await self._send_task(cid, task, now)

    def _frames(self, payload: torch.Tensor) -> tuple[np.ndarray, ...]:
        """A flat payload (one or more model copies) as wire tensors (views, no copy)."""
        vec = payload.detach().to(torch.float32).contiguous()
        copies = vec.numel() // max(1, sum(int(np.prod(s)) for s in self.shapes))
        return tuple(t.numpy() for t in unflatten(vec, self.shapes * max(1, copies)))

    async def _broadcast(self, now: float, b: Any) -> None:
        """Send a round's result (e.g. an average) to the clients it is for."""
        msg = wire.Aggregate(round=b.round, version=self.strategy.version,
                             tensors=self._frames(b.payload))
        for cid in b.clients:
            await self._send(cid, msg, now, kind="aggregate", round=b.round)

    def _send_later(self, cid: int, task: wire.Task) -> None:
        t = asyncio.ensure_future(self._send_task(cid, task, self.clock.now()))
        self._sends.add(t)
        t.add_done_callback(self._sends.discard)

    async def _send_task(self, cid: int, task: wire.Task, now: float) -> None:
        if not await self._send(cid, task, now, kind="task", version=task.version,
                                task_id=task.task_id, round=task.round):
            # the client's connection is gone (host crash)
            self.queue.put_nowait(("client", (cid, wire.Bye(sender=cid, reason="unreachable"))))

    async def _send(self, cid: int, msg: Any, now: float, **fields: Any) -> bool:
        """Stamp, send and log one message to a client; False if it could not go."""
        assert self.state is not None
        frames = wire.encode(msg, sent_at=now, seq=next(self.seq))
        nbytes = sum(len(memoryview(f)) for f in frames)
        try:
            await self.data_sock.send_multipart([f"c{cid}".encode(), *frames], copy=False)
        except Exception as exc:
            self.state.event(now, "send_failed", client=cid, reason=str(exc))
            return False
        self.state.bytes_down += nbytes
        self.state.event(now, "send", client=cid, dir="down", bytes=nbytes, **fields)
        return True

    def _host_lost(self, now: float, name: str, code: int) -> Step | None:
        """A client host exited: its clients are lost; with no host left, so is the run."""
        assert self.state is not None
        if self.stop_reason is not None:
            return None
        lost = self.hostctl.lose(now, name, code, self.state)
        if lost is None:
            return None
        step = Step()
        for cid in lost:
            self.clients.discard(cid)
            step.then(self.strategy.lost(cid, now))
        if not self.hostctl.any_alive:
            self.stop_reason = "failed: all client hosts lost"
        return step

    async def _shutdown(self, readers: list[asyncio.Task[Any]]) -> None:
        await self.hostctl.stop()
        for task in readers:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        with contextlib.suppress(Exception):
            await self.evaluator.close()
        if self.timers is not None:
            self.timers.close()
        self.transport.close(linger_ms=500)


def wire_size(msg: Any) -> int:
    """Bytes ``msg`` takes on the wire (header and tensor frames)."""
    return sum(len(memoryview(f)) for f in wire.encode(msg))


def _ranges(ids: list[int]) -> str:
    """``[0, 1, 2, 5]`` as ``"0-2, 5"``."""
    out: list[str] = []
    for i in ids:
        if out and out[-1].split("-")[-1] == str(i - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{i}"
        else:
            out.append(str(i))
    return ", ".join(out)


def _client_id(ident: bytes) -> int:
    if not ident.startswith(b"c") or not ident[1:].isdigit() or len(ident) > 12:
        raise wire.WireError("bad_field", f"unknown sender {ident!r}")
    return int(ident[1:])
