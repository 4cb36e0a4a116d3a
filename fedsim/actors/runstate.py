"""Everything a run records: events, metrics, staleness, bytes, summary.

Kept apart from the server actor so the actor only routes messages. The
summary is rewritten atomically at every evaluation, so a run killed at any
moment still leaves a summary of what it had done.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from fedsim import wire
from fedsim.algorithms import unflatten
from fedsim.metrics import EventLog, MetricsTable, StalenessStats, write_json_atomic
from fedsim.scenario import Scenario
from netem.clock import Clock, monotonic

if TYPE_CHECKING:
    from fedsim.actors.server import Server
    from fedsim.algorithms.api import Step

__all__ = ["STOP_REASONS", "RunState", "fidelity"]

#: Reasons a run ends normally.
STOP_REASONS = ("time_budget", "max_updates", "max_rounds", "target_accuracy")

log = logging.getLogger(__name__)


def _q(values: list[float] | np.ndarray, q: float) -> float | None:
    return float(np.percentile(values, q)) if len(values) else None


def fidelity(server: Server) -> dict[str, Any]:
    """netem's fidelity verdict over the server's and every client host's observations.

    The server measured the uplinks, each host its clients' downlinks and
    compute deadlines (sent in its ``bye``); their monitors are merged into a
    copy, so this can be called while the run goes on.
    """
    if server.monitor is None:
        return {"verdict": "fail", "reasons": ["the run never started"],
                "lateness_ms": {"p50": None, "p99": None, "max": None},
                "suggested_dilation": server.dilation}
    mon = copy.deepcopy(server.monitor)
    for cid, link in getattr(server, "links", {}).items():
        mon.record_loss(server.plan.kind(cid, "up"), link.loss_stats)
    hosts_reported = 0
    for info in server.hosts.values():
        data = (info.get("bye") or {}).get("fidelity")
        if data:
            mon.merge(data)
            hosts_reported += 1
    report = mon.report()
    report["hosts_reported"] = hosts_reported
    return report


class RunState:
    """The run's records and counters (owned by the server actor)."""

    def __init__(self, sc: Scenario, run_dir: Path, cadence: str,
                 data_stats: dict[str, Any]) -> None:
        self.sc = sc
        self.run_dir = run_dir
        self.cadence = cadence
        self.events = EventLog(run_dir / "events.jsonl")
        self.metrics = MetricsTable(run_dir / "metrics.csv")
        self.staleness = StalenessStats()
        write_json_atomic(run_dir / "data.json", data_stats)
        self.bytes_up = 0
        self.bytes_down = 0
        self.updates = 0
        self.rounds = 0
        self.rejects: dict[str, int] = {}
        self.samples: dict[int, int] = {}
        self.host_failures: list[dict[str, Any]] = []
        self.best = (math.nan, None)
        self.final_accuracy: float | None = None
        self.final_loss: float | None = None
        self.time_to_target: float | None = None
        self.clock: Clock | None = None
        self.real_start = time.monotonic()
        self._arrays: tuple[int, tuple[np.ndarray, ...]] | None = None
        self._evals: list[asyncio.Task[None]] = []
        self._evals_since = 0
        self.summary: dict[str, Any] = {}
        self.stopped_at: float | None = None

    def start(self, clock: Clock) -> None:
        self.clock = clock
        self.real_start = clock.epoch

    # -- records ----------------------------------------------------------------
    def event(self, t: float, ev: str, **fields: Any) -> None:
        rec = {"t": round(t, 6), "real": round(monotonic() - self.real_start, 6), "ev": ev}
        rec.update(fields)
        self.events.write(rec)

    def host_events(self, records: tuple[Any, ...]) -> None:
        for rec in records:
            self.events.write(rec if isinstance(rec, dict) else {"raw": list(rec)})

    def rejected(self, t: float, ident: bytes, exc: wire.WireError) -> None:
        self.rejects[exc.reason] = self.rejects.get(exc.reason, 0) + 1
        log.warning("rejected a message from %r: %s", ident, exc)
        self.event(t, "reject", sender=ident.decode(errors="replace"), reason=exc.reason,
                   detail=str(exc)[:300])

    def flush(self) -> None:
        self.events.flush()

    def model_arrays(self, version: int, x: torch.Tensor,
                     shapes: list[tuple[int, ...]]) -> tuple[np.ndarray, ...]:
        """The global model as wire tensors, built once per version (zero-copy views)."""
        if self._arrays is None or self._arrays[0] != version:
            self._arrays = (version, tuple(t.numpy() for t in unflatten(x.contiguous(), shapes)))
        return self._arrays[1]

    def applied(self, server: Server, now: float, step: Step) -> None:
        for d in step.discarded:
            self.event(now, "discard", client=d.client, reason=d.reason,
                       **({} if d.staleness is None else {"staleness": d.staleness}))
        self.rounds += step.rounds_closed
        for a in step.applied:
            self.updates += a.updates
            for x in a.staleness:
                self.staleness.add(x)
            fields: dict[str, Any] = {"version": a.version, "clients": list(a.clients)}
            if a.round is not None:
                fields["round"] = a.round
            if a.base_version is not None:
                fields["base_version"] = a.base_version
            if len(a.staleness) == 1:
                fields["staleness"] = a.staleness[0]
            elif a.staleness:
                fields["stalenesses"] = list(a.staleness)
            self.event(now, "aggregate", **fields, **a.metrics, updates=self.updates)
            self._evals_since += 1 if self.cadence == "rounds" else a.updates
            if self._eval_due():
                self.request_eval(server, now, server.strategy)

    def _eval_due(self) -> bool:
        ev = self.sc.eval
        if self.cadence == "rounds":
            every = ev.every_rounds
        else:
            every = ev.every_updates or (None if ev.every_seconds else self.sc.data.num_clients)
        return every is not None and self._evals_since >= every

    # -- evaluation -------------------------------------------------------------
    def request_eval(self, server: Server, now: float, strategy: Any, final: bool = False) -> None:
        self._evals_since = 0
        self._evals = [t for t in self._evals if not t.done()]
        if len(self._evals) >= 3 and not final:
            return
        snap = {"t": now, "version": strategy.version, "round": getattr(strategy, "round", 0),
                "updates": self.updates, "bytes_up": self.bytes_up, "bytes_down": self.bytes_down,
                "staleness_mean": self.staleness.window_mean(), "final": final}
        arrays = self.model_arrays(strategy.version, strategy.model(), server.shapes)
        task = wire.Task(client=-1, version=strategy.version, round=snap["round"], task_id=0,
                         tensors=arrays, config={"op": "eval"})
        self._evals.append(asyncio.create_task(self._eval(server, task, snap)))

    async def _eval(self, server: Server, task: wire.Task, snap: dict[str, Any]) -> None:
        try:
            reply = await server.evaluator.request(task)
        except Exception as exc:
            log.error("evaluation failed: %s", exc)
            return
        if not isinstance(reply, wire.Control):
            log.error("evaluation failed: %r", reply)
            return
        acc, loss = float(reply.args["accuracy"]), float(reply.args["loss"])
        row = dict(snap, accuracy=acc, loss=loss,
                   real=round(monotonic() - self.real_start, 3))
        self.metrics.append(row)
        self.event(snap["t"], "evaluate", version=snap["version"], accuracy=acc, loss=loss,
                   updates=snap["updates"])
        self.final_accuracy, self.final_loss = acc, loss
        if math.isnan(self.best[0]) or acc > self.best[0]:
            self.best = (acc, snap["t"])
        target = self.sc.run.target_accuracy
        if target is not None and self.time_to_target is None and acc >= target:
            self.time_to_target = snap["t"]
            if self.sc.run.stop_at_target:
                server.queue.put_nowait(("stop", "target_accuracy"))
        self.write_summary(server, "running")

    async def drain_evals(self) -> None:
        if self._evals:
            await asyncio.gather(*self._evals, return_exceptions=True)

    # -- control ----------------------------------------------------------------
    def should_stop(self, strategy: Any) -> str | None:
        run = self.sc.run
        if run.max_updates is not None and self.updates >= run.max_updates:
            return "max_updates"
        if run.max_rounds is not None and self.rounds >= run.max_rounds:
            return "max_rounds"
        return None

    def progress(self, now: float, strategy: Any) -> dict[str, Any]:
        s = self.staleness.values
        return {
            "t": now, "budget": self.sc.run.time_budget, "updates": self.updates,
            "rounds": self.rounds, "version": strategy.version,
            "accuracy": self.final_accuracy, "in_flight": strategy.in_flight(),
            "staleness_mean": float(np.mean(s)) if s else None,
            "real": monotonic() - self.real_start,
        }

    # -- summary ----------------------------------------------------------------
    def write_summary(self, server: Server, status: str, durable: bool = False) -> None:
        now = self.clock.now() if self.clock is not None else 0.0
        overruns = deadlines = 0
        host_rejects = 0
        for info in server.hosts.values():
            bye = info.get("bye") or {}
            overruns += int(bye.get("overruns", 0))
            deadlines += int(bye.get("compute_deadlines", 0))
            host_rejects += int(bye.get("rejected", 0))
        if self.stopped_at is not None:
            now = self.stopped_at
        self.summary = {
            "status": "completed" if status in STOP_REASONS else status,
            "stop_reason": status if status in STOP_REASONS else None,
            "scenario": self.sc.name,
            "algorithm": self.sc.algorithm.name,
            "clients": self.sc.data.num_clients,
            "updates": self.updates,
            "rounds": self.rounds,
            "emulated_seconds": round(now, 6),
            "real_seconds": round(monotonic() - self.real_start, 3),
            "final_accuracy": self.final_accuracy,
            "final_loss": self.final_loss,
            "best_accuracy": None if math.isnan(self.best[0]) else self.best[0],
            "target_accuracy": self.sc.run.target_accuracy,
            "time_to_target_s": self.time_to_target,
            "bytes_up": self.bytes_up,
            "bytes_down": self.bytes_down,
            "staleness": self.staleness.summary(),
            "rejected_messages": {"server": dict(self.rejects), "clients": host_rejects},
            "host_failures": self.host_failures,
            "fidelity": fidelity(server),
        }
        write_json_atomic(self.run_dir / "summary.json", self.summary, durable=durable)

    def finish(self, server: Server, status: str) -> None:
        self.event(self.clock.now() if self.clock else 0.0, "end", status=status)
        self.write_summary(server, status, durable=True)
        self.events.close()
        self.metrics.close()
