"""Everything a run records: events, metrics, staleness, bytes, evaluations, summary.

Kept apart from the server actor, which only routes messages; it is given
what it needs (the evaluator, a fidelity report, the hosts' totals), never
the server. The summary is rewritten atomically at every evaluation, so a
run killed at any moment leaves a summary of what it had done.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter
from typing import Any, Protocol

import numpy as np

from fedsim.algorithms.api import Step
from fedsim.results.phases import PhaseStats
from fedsim.results.writer import (
    RUN_FORMAT,
    EventLog,
    MetricsTable,
    StalenessStats,
    TransferStats,
    write_json_atomic,
    write_run_format,
    writer_record,
)
from fedsim.scenario import Scenario
from fedsim.wire.messages import (
    HOST_EVENT_KINDS,
    Evaluate,
    Evaluated,
    Event,
    PhaseSample,
    WorkerFailed,
    WorkerReady,
)
from fedsim.wire.tensors import Model
from netem.clock import Clock

__all__ = ["STOP_REASONS", "Evaluator", "Progress", "RunState"]

#: Reasons a run ends normally.
#: the ends of a run that completed it (``server_app_finished``: the algorithm's
#: own end, ``Step.stop``)
STOP_REASONS = ("time_budget", "max_updates", "max_rounds", "target_accuracy",
                "server_app_finished")
#: Real seconds between rewrites of summary.json while a run goes on, after an
#: evaluation or at a flush() (the final one is always written).
#: A rewrite holds the server's event loop, and so its link timers, for 4-8 ms
#: (fidelity, phase quantiles and the indented JSON, a third each; measured
#: 2026-11-30 in AF-1's P = 0.9 run): at 1 s, after every evaluation, it made
#: 1.7 % of that run's timers late at dilation 0.5 (35 of 2,106, alone), where
#: at 10 s 0.47 % were (7 of 1,492). metrics.csv has every evaluation.
SUMMARY_EVERY = 10.0

log = logging.getLogger(__name__)


class Evaluator(Protocol):
    """Something that evaluates a model (a torch worker)."""

    async def start(self) -> WorkerReady:
        """Start it."""
        ...

    def next_id(self) -> int:
        """A fresh request id."""
        ...

    async def request(self, msg: Evaluate) -> Evaluated | WorkerFailed:
        """Send an evaluation; its result, or why it failed (matched by id)."""
        ...


@dataclass(frozen=True, slots=True)
class Progress:
    """Where a run stands, for a live status line (emulated ``t``, ``real`` seconds)."""

    t: float
    budget: float | None
    updates: int
    rounds: int
    version: int
    accuracy: float | None
    in_flight: int
    staleness_mean: float | None
    real: float


@dataclass(frozen=True, slots=True)
class _Snapshot:
    t: float
    version: int
    round: int
    updates: int
    bytes_up: int
    bytes_down: int
    staleness_mean: float
    final: bool


class RunState:
    """The run's records and counters (owned by the server actor).

    Parameters
    ----------
    cadence
        ``"updates"`` or ``"rounds"``: what ``eval.every_*`` counts.
    clock
        The run's emulated clock (its epoch is the run's real start).
    fidelity, totals
        Callables giving the fidelity report and the hosts' totals
        (overruns, compute deadlines, rejected messages) when the summary
        is written.
    on_target
        Called once when the target accuracy is reached and the scenario
        says to stop there.
    fedsim_version
        Written with the run directory's format version (``fedsim-run.json``).
    delays_ms
        The configured one-way delay per direction (``"up"``, ``"down"``),
        written next to the realised transfer times in the summary.
    phases
        Where the run's time goes (the summary's ``phases``): the server
        records its own phases into it, this adds the evaluations' and the
        hosts' reports (a fresh one if None).
    """

    def __init__(self, sc: Scenario, run_dir: Path, cadence: str, clock: Clock,
                 evaluator: Evaluator, *, fidelity: Callable[[], dict[str, Any]],
                 totals: Callable[[], dict[str, Any]], on_target: Callable[[], None],
                 fedsim_version: str,
                 delays_ms: dict[str, float | None] | None = None,
                 phases: PhaseStats | None = None) -> None:
        self.sc = sc
        self.run_dir = run_dir
        self.cadence = cadence
        self.clock = clock
        self.evaluator = evaluator
        self._fidelity = fidelity
        self._totals = totals
        self._on_target = on_target
        write_run_format(run_dir, fedsim_version)
        self.events = EventLog(run_dir / "events.jsonl")
        self.metrics = MetricsTable(run_dir / "metrics.csv")
        self.staleness = StalenessStats()
        self.transfers = TransferStats()
        self.phases = phases if phases is not None else PhaseStats()
        self.delays_ms = delays_ms or {}
        self.bytes_up = 0
        self.bytes_down = 0
        #: bytes of the server's messages to the hosts as they really went (a task
        #: whose host holds its version's model goes without it; bytes_down counts
        #: every task with its model, as the emulated links carry it)
        self.wire_bytes_down = 0
        self.updates = 0
        self.rounds = 0
        self.rejects: dict[str, int] = {}
        #: updates the update guard rejected or clipped
        self.guard = {"rejected": 0, "clipped": 0}
        self.samples: dict[int, int] = {}
        self.host_failures: list[dict[str, Any]] = []
        #: client runs that failed, and clients lost with their host: one record
        #: each ({t, client, cause, reason}), summarised as ``lost_work``
        self.lost: list[dict[str, Any]] = []
        self.missing: list[int] = []
        self.best = (math.nan, 0.0)
        self.final_accuracy: float | None = None
        self.final_loss: float | None = None
        self.time_to_target: float | None = None
        self._evals: set[asyncio.Task[None]] = set()
        self._evals_since = 0
        self._eval_seq = itertools.count()
        self.summary: dict[str, Any] = {}
        self.stopped_at: float | None = None
        self.resumed: list[dict[str, Any]] = []
        #: real seconds from the server process's launch to t = 0, and the
        #: unix time of t = 0 (set by the server when its clock starts)
        self.startup_s: float | None = None
        self.t0_wall: float = 0.0
        self._summary_real = -math.inf

    def real(self) -> float:
        """Real seconds since the run's epoch."""
        return self.clock.real() - self.clock.epoch

    # -- records ----------------------------------------------------------------
    def event(self, t: float, ev: str, **fields: Any) -> None:
        """Write one record of the event log (a :class:`~fedsim.wire.messages.Event`)."""
        e = Event.of(round(t, 6), round(self.real(), 6), ev, **fields)
        rec = e.to_json_dict()
        self.transfers.record(rec)
        self.events.write(rec)

    def write_events(self, events: tuple[Event, ...], host: str,
                     clients: AbstractSet[int],
                     budget: Callable[[int | None], str | None] | None = None) -> list[str]:
        """Write the records a host sent, stamped with its name; return why others were not.

        A host may report only what happens on its side (``HOST_EVENT_KINDS``)
        to its own clients, with plain extra fields: nothing it sends can
        pass for the server's records (an evaluation, an aggregation). With
        ``budget`` (``budget(client)``: why a record about ``client``, None
        for the host itself, is one too many, or None), only as many records
        as the server's traffic with each client allows.
        """
        bad: list[str] = []
        for e in events:
            why = _host_event_problem(e, host, clients)
            if why is None and budget is not None:
                why = budget(e.client)
            if why is not None:
                bad.append(why)
                continue
            rec = e.to_json_dict()
            rec["host"] = host
            self.transfers.record(rec)
            self.events.write(rec)
        return bad

    def count_up(self, nbytes: int) -> None:
        """An update of ``nbytes`` reached the server (``bytes_up``)."""
        self.bytes_up += nbytes

    def count_down(self, nbytes: int, wire_nbytes: int) -> None:
        """The server sent a message: ``nbytes`` as the emulated links carry it
        (``bytes_down``), ``wire_nbytes`` as it really went (``wire_bytes_down``)."""
        self.bytes_down += nbytes
        self.wire_bytes_down += wire_nbytes

    def host_phases(self, samples: tuple[PhaseSample, ...]) -> None:
        """Add a host's phase durations (checked by the schema: only ``HOST_PHASES``)."""
        for p in samples:
            self.phases[p.phase].merge(p.count, p.sum, p.max, p.values)

    def lose_work(self, t: float, client: int, cause: str, reason: str) -> None:
        """A client's run failed (or its host was lost): recorded, and counted in the summary."""
        self.lost.append({"t": round(t, 6), "client": client, "cause": cause,
                          "reason": reason[:300]})

    def lost_work(self) -> dict[str, Any]:
        """``summary.json``'s ``lost_work``: the failed client runs by cause and by client."""
        by_reason: dict[str, int] = {}
        by_client: dict[str, dict[str, int]] = {}
        first: dict[str, str] = {}
        for rec in self.lost:
            cause, cid = rec["cause"], str(rec["client"])
            by_reason[cause] = by_reason.get(cause, 0) + 1
            mine = by_client.setdefault(cid, {})
            mine[cause] = mine.get(cause, 0) + 1
            first.setdefault(cid, rec["reason"])
        return {"runs": len(self.lost), "by_reason": by_reason, "by_client": by_client,
                "clients": sorted(int(c) for c in by_client),
                "first_reason": dict(list(first.items())[:50])}

    def flush(self) -> None:
        """Write pending event records; rewrite the summary if it is SUMMARY_EVERY real seconds old.

        The summary's ``writer.updated_at`` is how a reader on another machine
        tells a live run from one whose server was killed.
        """
        self.events.flush()
        if self.real() - self._summary_real >= SUMMARY_EVERY:
            self.write_summary("running")

    # -- checkpoints --------------------------------------------------------------
    def checkpoint_state(self) -> dict[str, Any]:
        """The counters and records a resumed run continues from (event log flushed)."""
        self.events.flush()
        return {
            "updates": self.updates, "rounds": self.rounds, "bytes_up": self.bytes_up,
            "bytes_down": self.bytes_down, "wire_bytes_down": self.wire_bytes_down,
            "staleness": list(self.staleness.values),
            "rejects": dict(self.rejects), "guard": dict(self.guard),
            "samples": _pack_counts(self.samples),
            "host_failures": list(self.host_failures), "lost": list(self.lost),
            "missing": list(self.missing),
            "best": list(self.best), "final_accuracy": self.final_accuracy,
            "final_loss": self.final_loss, "time_to_target": self.time_to_target,
            "resumed": list(self.resumed), "transfers": self.transfers.state(),
            "phases": self.phases.state(),
            "events_offset": self.events.offset,
            "metrics_offset": self.metrics.offset,
        }

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`checkpoint_state` (the files already truncated to it)."""
        self.updates, self.rounds = int(state["updates"]), int(state["rounds"])
        self.bytes_up, self.bytes_down = int(state["bytes_up"]), int(state["bytes_down"])
        self.wire_bytes_down = int(state.get("wire_bytes_down", 0))
        for x in state["staleness"]:
            self.staleness.add(int(x))
        self.rejects = dict(state["rejects"])
        self.guard.update(state.get("guard", {}))
        self.samples.update(_unpack_counts(state["samples"]))
        self.host_failures = list(state["host_failures"])
        self.lost = list(state.get("lost", []))
        self.missing = list(state["missing"])
        self.best = (float(state["best"][0]), float(state["best"][1]))
        self.final_accuracy, self.final_loss = state["final_accuracy"], state["final_loss"]
        self.time_to_target = state["time_to_target"]
        self.resumed = list(state["resumed"])
        self.transfers.restore(state.get("transfers", {}))
        self.phases.restore(state.get("phases", {}))

    def applied(self, now: float, step: Step) -> bool:
        """Record a step's outcome; True when an evaluation is due.

        An update the guard rejected is in ``step.discarded`` (a ``discard``
        record with the reason); one it clipped is applied and logged as a
        ``warning``; both are counted (the summary's ``guard``).
        """
        for g in step.guarded:
            self.guard[g.action] += 1
            if g.action == "clipped":
                self.event(now, "warning", client=g.client,
                           reason=f"guard: update norm {g.norm:.4g} clipped to {g.bound:.4g}")
        for d in step.discarded:
            self.event(now, "discard", client=d.client, reason=d.reason, staleness=d.staleness)
        self.rounds += step.rounds_closed
        for a in step.applied:
            self.updates += a.updates
            for x in a.staleness:
                self.staleness.add(x)
            self.event(now, "aggregate", version=a.version, clients=list(a.clients),
                       round=a.round, base_version=a.base_version,
                       staleness=a.staleness[0] if len(a.staleness) == 1 else None,
                       stalenesses=list(a.staleness) if len(a.staleness) > 1 else None,
                       updates=self.updates, **a.metrics)
            self._evals_since += 1 if self.cadence == "rounds" else a.updates
        return self._eval_due()

    def _eval_due(self) -> bool:
        ev = self.sc.eval
        if self.cadence == "rounds":
            every = ev.every_rounds
        else:
            every = ev.every_updates or (None if ev.every_seconds else self.sc.data.num_clients)
        return every is not None and self._evals_since >= every

    # -- evaluation -------------------------------------------------------------
    def request_eval(self, now: float, version: int, round_: int, model: Model,
                     final: bool = False) -> None:
        """Evaluate ``model`` in the background (at most 3 at once, the final always)."""
        self._evals_since = 0
        if len(self._evals) >= 3 and not final:
            return
        snap = _Snapshot(now, version, round_, self.updates, self.bytes_up, self.bytes_down,
                         self.staleness.window_mean(), final)
        msg = Evaluate(request_id=self.evaluator.next_id(), version=version, model=model)
        task = asyncio.ensure_future(self._eval(msg, snap))
        self._evals.add(task)
        task.add_done_callback(self._evals.discard)

    async def _eval(self, msg: Evaluate, snap: _Snapshot) -> None:
        t0 = perf_counter()
        try:
            reply = await self.evaluator.request(msg)
        except Exception as exc:
            log.error("evaluation failed: %s", exc)
            return
        if isinstance(reply, WorkerFailed):
            log.error("evaluation failed (%s): %s", reply.cause, reply.reason)
            return
        self.phases.add("evaluation.round_trip", perf_counter() - t0)
        self.phases.add("evaluation.worker", reply.seconds)
        acc, loss = reply.accuracy, reply.loss
        self.metrics.append({
            "t": snap.t, "real": round(self.real(), 3), "version": snap.version,
            "round": snap.round, "updates": snap.updates, "accuracy": acc, "loss": loss,
            "staleness_mean": snap.staleness_mean, "bytes_up": snap.bytes_up,
            "bytes_down": snap.bytes_down})
        self.event(snap.t, "evaluate", version=snap.version, accuracy=acc,
                   loss=loss if math.isfinite(loss) else None, updates=snap.updates)
        self.final_accuracy, self.final_loss = acc, loss
        if math.isnan(self.best[0]) or acc > self.best[0]:
            self.best = (acc, snap.t)
        target = self.sc.run.target_accuracy
        if target is not None and self.time_to_target is None and acc >= target:
            self.time_to_target = snap.t
            if self.sc.run.stop_at_target:
                self._on_target()
        if self.real() - self._summary_real >= SUMMARY_EVERY:
            # Not after every evaluation: building the summary (phase
            # distributions, fidelity) took 3 ms of the server's loop per
            # round of the overhead task; metrics.csv has every evaluation.
            self.write_summary("running")

    async def drain_evals(self) -> None:
        if self._evals:
            await asyncio.gather(*self._evals, return_exceptions=True)

    # -- control ----------------------------------------------------------------
    def should_stop(self) -> str | None:
        run = self.sc.run
        if run.max_updates is not None and self.updates >= run.max_updates:
            return "max_updates"
        if run.max_rounds is not None and self.rounds >= run.max_rounds:
            return "max_rounds"
        return None

    def progress(self, now: float, version: int, in_flight: int) -> Progress:
        s = self.staleness.values
        return Progress(t=now, budget=self.sc.run.time_budget, updates=self.updates,
                        rounds=self.rounds, version=version, accuracy=self.final_accuracy,
                        in_flight=in_flight, staleness_mean=float(np.mean(s)) if s else None,
                        real=self.real())

    # -- summary ----------------------------------------------------------------
    def write_summary(self, status: str, durable: bool = False) -> None:
        now = self.stopped_at if self.stopped_at is not None else max(0.0, self.clock.now())
        totals = self._totals()
        self.summary = {
            "format": RUN_FORMAT,
            "status": "completed" if status in STOP_REASONS else status,
            "stop_reason": status if status in STOP_REASONS else None,
            "scenario": self.sc.name,
            "algorithm": self.sc.algorithm.name,
            "clients": self.sc.data.num_clients,
            "clients_missing": self.missing,
            "updates": self.updates,
            "rounds": self.rounds,
            "emulated_seconds": round(now, 6),
            "real_seconds": round(self.real(), 3),
            "startup_s": self.startup_s,
            "final_accuracy": self.final_accuracy,
            "final_loss": self.final_loss,
            "best_accuracy": None if math.isnan(self.best[0]) else self.best[0],
            "target_accuracy": self.sc.run.target_accuracy,
            "time_to_target_s": self.time_to_target,
            "bytes_up": self.bytes_up,
            "bytes_down": self.bytes_down,
            "wire_bytes_down": self.wire_bytes_down,
            "staleness": self.staleness.summary(),
            "transfer": self.transfers.summary(self.delays_ms),
            "phases": self.phases.summary(),
            "rejected_messages": {"server": dict(self.rejects),
                                  "clients": totals.get("rejected", 0),
                                  "unlogged": totals.get("unlogged", {})},
            "unregistered_messages": totals.get("unregistered_messages", 0),
            "host_failures": self.host_failures,
            "lost_work": self.lost_work(),
            "hosts": totals.get("hosts"),
            "guard": (dict(self.guard) if getattr(self.sc.algorithm, "guard", None) is not None
                      else None),
            "send_times_clamped": totals.get("clamped", 0),
            "send_time_corrections": totals.get("corrections"),
            "late_arrivals": totals.get("late_arrivals", 0),
            "fidelity": self._fidelity(),
            "resumed": self.resumed,
            "writer": writer_record(),
        }
        self._summary_real = self.real()
        write_json_atomic(self.run_dir / "summary.json", self.summary, durable=durable)

    def finish(self, status: str) -> None:
        self.event(self.stopped_at if self.stopped_at is not None else self.clock.now(), "end",
                   status=status)
        self.write_summary(status, durable=True)
        self.events.close()
        self.metrics.close()


_EXTRA_SCALARS = (bool, int, float, str)


def _pack_counts(counts: dict[int, int]) -> dict[str, np.ndarray]:
    """Client id -> count as two arrays: ``torch.save`` pickled a dict of 10,000
    ints in 2.9 ms (on the server's loop, at every checkpoint), two arrays in
    microseconds (a state file copies them as two buffers)."""
    return {"ids": np.fromiter(counts.keys(), np.int64, len(counts)),
            "counts": np.fromiter(counts.values(), np.int64, len(counts))}


def _unpack_counts(packed: Any) -> dict[int, int]:
    """:func:`_pack_counts` undone (a dict is taken as it is)."""
    if isinstance(packed, dict) and set(packed) == {"ids", "counts"} and isinstance(
            packed["ids"], np.ndarray):
        return dict(zip(packed["ids"].tolist(), packed["counts"].tolist(), strict=True))
    return {int(k): int(v) for k, v in packed.items()}


def _host_event_problem(e: Event, host: str, clients: AbstractSet[int]) -> str | None:
    """Why a host's event-log record is not acceptable (None: it is)."""
    if e.ev not in HOST_EVENT_KINDS:
        return f"a host may not report {e.ev!r} events"
    if e.host is not None and e.host != host:
        return f"an event for host {e.host!r} from {host}"
    if e.client is not None and e.client not in clients:
        return f"an event for client {e.client}, which does not run on {host}"
    if not (math.isfinite(e.t) and math.isfinite(e.real)):
        return "an event with a non-finite time"
    if len(e.extra) > 16:
        return f"an event with {len(e.extra)} extra fields (at most 16)"
    for k, v in e.extra.items():
        if not (isinstance(k, str) and k.isidentifier() and len(k) <= 32):
            return "an event with a bad extra field name"
        items = v if isinstance(v, list) and len(v) <= 64 else [v]
        for x in items:
            if x is not None and not isinstance(x, _EXTRA_SCALARS):
                return f"extra field {k!r} is not a plain value"
            if isinstance(x, str) and len(x) > 300:
                return f"extra field {k!r} is over 300 characters"
            if isinstance(x, float) and not math.isfinite(x):
                return f"extra field {k!r} is not finite"
    return None
