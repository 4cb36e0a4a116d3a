"""Checkpoints of a federation: the server writes them, a resumed run reads one back.

``checkpoint.pt`` holds all a resumed run continues from: the global model
and the algorithm's state, the run's counters and records, the event log's
and metrics' lengths, the RNG states and the next task id. Format 3 is a
:mod:`fedsim.wire.statefile` (JSON plus raw tensor buffers), read without running
any code; formats 1 (``torch.save``) and 2 (a pickle) are refused unread,
since whoever could write the run directory could have put code in them.

The server's loop only takes the snapshot (the state's tensors copied, its
values laid out for JSON); the JSON text, writing, ``fsync`` and the atomic
rename happen on a writer thread, in order, and the run waits for the last
one before it ends.
``torch.save`` and ``fsync`` on the loop had stalled it 4-6 ms at every
checkpoint: deliveries due meanwhile came that late, the largest lateness
of the quickstart run.
:class:`Checkpointer` is the part of :class:`~fedsim.actors.server.Server`
that writes one every ``run.checkpoint_every`` aggregations (rounds closed
or updates applied, by the algorithm's cadence) or, once one was applied,
every ``run.checkpoint_seconds`` real seconds, and restores one at the start
of a resumed run; :func:`load_checkpoint` reads it and truncates the run
directory's logs back to it.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from fedsim.actors.runstate import RunState
from fedsim.algorithms.api import ServerAlgorithm, Step
from fedsim.results.writer import CHECKPOINT_FILE, CHECKPOINT_FORMAT, OLD_CHECKPOINT_HELP
from fedsim.wire import statefile

__all__ = ["Checkpointer", "load_checkpoint"]

# the server actor's logger: its records keep their name wherever the code lives
log = logging.getLogger("fedsim.actors.server")


class Checkpointer:
    """The server's checkpoints: when one is due, its writer thread, its restore.

    A part of :class:`~fedsim.actors.server.Server` that owns its state: how
    many aggregations since the last checkpoint and when it was taken, the
    writer thread, the write in flight and a failed write's error. What a
    checkpoint holds is the server's (:meth:`take` is handed it); what a
    restore puts back, the server's parts (:meth:`restore`).
    """

    def __init__(self, run_dir: Path, every: int | None, seconds: float | None,
                 cadence: str, real_clock: Callable[[], float]) -> None:
        self.path = run_dir / CHECKPOINT_FILE
        self.every = every
        self.seconds = seconds
        self.cadence = cadence
        self.real_clock = real_clock
        #: aggregations (rounds closed or updates applied, by the cadence) since the last
        self.since = 0
        self.taken_real = real_clock()
        self._writer: ThreadPoolExecutor | None = None
        self._written: Future[None] | None = None
        self._write_error: BaseException | None = None

    def due(self, step: Step) -> bool:
        """Count ``step``'s aggregations; whether a checkpoint is due now (every
        ``run.checkpoint_every`` of them or, once one was made, every
        ``run.checkpoint_seconds`` real seconds)."""
        self.since += step.rounds_closed if self.cadence == "rounds" else sum(
            a.updates for a in step.applied)
        return bool((self.every and self.since >= self.every) or (
            self.seconds and self.since
            and self.real_clock() - self.taken_real >= self.seconds))

    def take(self, data: dict[str, Any]) -> Path:
        """Write ``data`` (a snapshot: later steps do not change it) to ``checkpoint.pt``
        atomically on the writer thread; the path.

        A snapshot still queued when the next is taken is dropped (at most one
        is written while one waits), and a write that failed ends the run
        here, with the reason, as it did when the loop wrote.
        """
        if self._write_error is not None:
            raise OSError(f"the checkpoint could not be written: {self._write_error}")
        payload = statefile.encode(data, "checkpoint")
        if self._writer is None:
            self._writer = ThreadPoolExecutor(1, thread_name_prefix="fedsim-checkpoint")
        if self._written is not None:
            self._written.cancel()   # only if it has not started: a newer one replaces it
        self._written = self._writer.submit(_write_atomically, self.path, payload)
        self._written.add_done_callback(self._on_written)
        self.since = 0
        self.taken_real = self.real_clock()
        return self.path

    def _on_written(self, done: Future[None]) -> None:
        """(The writer thread.) Keep a failed write's error for the loop to raise."""
        if not done.cancelled() and done.exception() is not None:
            self._write_error = done.exception()

    def wait(self) -> None:
        """Block until the checkpoints taken are on disk (the run's end); a failed
        last write is logged (the run's results are all written by then)."""
        if self._writer is not None:
            self._writer.shutdown(wait=True)
            self._writer = None
        if self._write_error is not None:
            log.error("the last checkpoint could not be written (a resume would start from "
                      "an earlier one): %s", self._write_error)

    @staticmethod
    def snapshot(now: float, fedsim_version: str, scenario_hash: str,
                 strategy: ServerAlgorithm, state: RunState, next_task_id: int,
                 clamped: int) -> dict[str, Any]:
        """All a resumed run continues from, at emulated ``now``: the global model
        and the algorithm's state, the run's counters and records (the event
        log's and metrics' lengths: a resumed run truncates them back), the RNG
        states, the next task id. What happens after it (tasks in flight,
        updates not yet applied) is what a resume loses."""
        state.event(now, "checkpoint", version=strategy.version, updates=state.updates,
                    rounds=state.rounds)
        return {
            "format": CHECKPOINT_FORMAT, "t": now, "fedsim_version": fedsim_version,
            "scenario_hash": scenario_hash, "version": strategy.version,
            "strategy": strategy.state_dict(), "run": state.checkpoint_state(),
            "next_task_id": next_task_id, "clamped": clamped,
            "rng": {"python": random.getstate(), "torch": torch.get_rng_state()},
        }

    @staticmethod
    def restore(ckpt: dict[str, Any], strategy: ServerAlgorithm, state: RunState) -> float:
        """Put ``ckpt``'s algorithm state, run records and RNG states back; its
        emulated time (the server takes its next task id and counters itself)."""
        strategy.load_state_dict(ckpt["strategy"])
        state.restore(ckpt["run"])
        random.setstate(ckpt["rng"]["python"])
        torch.set_rng_state(ckpt["rng"]["torch"])
        t = float(ckpt["t"])
        state.resumed.append({"t": t, "updates": state.updates, "rounds": state.rounds})
        state.event(t, "resume", version=strategy.version, updates=state.updates,
                    rounds=state.rounds)
        log.warning("resumed at t=%.2f (version %d, %d updates, %d rounds)", t,
                    strategy.version, state.updates, state.rounds)
        return t


def _write_atomically(path: Path, payload: statefile.Encoded | bytes) -> None:
    """``payload`` as ``path``, whole or not at all (a temporary file, fsync, rename);
    on a failure, logged and raised, the previous checkpoint stays."""
    try:
        statefile.write_atomically(
            path, payload.chunks() if isinstance(payload, statefile.Encoded) else payload)
    except OSError as exc:
        log.error("could not write the checkpoint %s: %s", path, exc)
        raise


def load_checkpoint(run_dir: Path, fedsim_version: str, scenario_hash: str) -> dict[str, Any]:
    """A run directory's checkpoint, its event log and metrics truncated back to it.

    Raises ValueError naming what does not match (another fedsim version,
    another scenario) or FileNotFoundError if the run never checkpointed.
    """
    path = run_dir / CHECKPOINT_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path}: the run wrote no checkpoint (nothing to resume)")
    ckpt = statefile.load(path, "checkpoint", what_to_do=OLD_CHECKPOINT_HELP)
    if not isinstance(ckpt, dict) or ckpt.get("format") != CHECKPOINT_FORMAT:
        got = ckpt.get("format") if isinstance(ckpt, dict) else None
        raise ValueError(f"{path}: unknown checkpoint format {got!r} (this fedsim reads "
                         f"format {CHECKPOINT_FORMAT})")
    if ckpt["fedsim_version"] != fedsim_version:
        raise ValueError(f"{path} was written by fedsim {ckpt['fedsim_version']}, "
                         f"this is {fedsim_version}")
    if ckpt["scenario_hash"] != scenario_hash:
        raise ValueError(f"{path} belongs to another scenario (hash "
                         f"{ckpt['scenario_hash'][:12]}, the run directory's is "
                         f"{scenario_hash[:12]})")
    for name, key in (("events.jsonl", "events_offset"), ("metrics.csv", "metrics_offset")):
        f = run_dir / name
        if f.exists():
            with open(f, "r+b") as fh:
                fh.truncate(int(ckpt["run"][key]))
    return ckpt
