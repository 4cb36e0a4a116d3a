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
:class:`Checkpoints` is the part of :class:`~fedsim.actors.server.Server`
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
from fedsim.algorithms.api import ServerAlgorithm, Step, TaskMaker
from fedsim.results.writer import CHECKPOINT_FILE, CHECKPOINT_FORMAT, OLD_CHECKPOINT_HELP
from fedsim.scenario import Scenario
from fedsim.wire import statefile

__all__ = ["Checkpoints", "load_checkpoint"]

# the server actor's logger: its records keep their name wherever the code lives
log = logging.getLogger("fedsim.actors.server")


class Checkpoints:
    """The server's checkpoint writing and restoring (a mixin of Server)."""

    # what of the server's state it reads and writes (set by Server.__init__)
    sc: Scenario
    run_dir: Path
    real_clock: Callable[[], float]
    fedsim_version: str
    scenario_hash: str
    strategy: ServerAlgorithm
    state: RunState | None
    make_task: TaskMaker
    clamped: int
    _aggregations_since_checkpoint: int
    _checkpoint_real: float
    _writer: ThreadPoolExecutor | None = None
    _written: Future[None] | None = None
    _write_error: BaseException | None = None

    def checkpoint(self, now: float) -> Path:
        """Take a checkpoint: all a resumed run continues from, to be written to
        ``checkpoint.pt`` atomically by the writer thread (the path returned).

        The global model and the algorithm's state, the run's counters and
        records, the event log's and metrics' lengths (a resumed run
        truncates them back), the RNG states, the next task id. What happens
        after it (tasks in flight, updates not yet applied) is what a resume
        loses. A snapshot still queued when the next is taken is dropped (at
        most one is written while one waits), and a write that failed ends
        the run here, with the reason, as it did when the loop wrote.
        """
        assert self.state is not None
        if self._write_error is not None:
            raise OSError(f"the checkpoint could not be written: {self._write_error}")
        self.state.event(now, "checkpoint", version=self.strategy.version,
                         updates=self.state.updates, rounds=self.state.rounds)
        data = {
            "format": CHECKPOINT_FORMAT, "t": now, "fedsim_version": self.fedsim_version,
            "scenario_hash": self.scenario_hash, "version": self.strategy.version,
            "strategy": self.strategy.state_dict(), "run": self.state.checkpoint_state(),
            "next_task_id": self.make_task.next_id, "clamped": self.clamped,
            "rng": {"python": random.getstate(), "torch": torch.get_rng_state()},
        }
        payload = statefile.encode(data, "checkpoint")
        path = self.run_dir / CHECKPOINT_FILE
        if self._writer is None:
            self._writer = ThreadPoolExecutor(1, thread_name_prefix="fedsim-checkpoint")
        if self._written is not None:
            self._written.cancel()   # only if it has not started: a newer one replaces it
        self._written = self._writer.submit(_write_atomically, path, payload)
        self._written.add_done_callback(self._on_written)
        self._aggregations_since_checkpoint = 0
        self._checkpoint_real = self.real_clock()
        return path

    def _on_written(self, done: Future[None]) -> None:
        """(The writer thread.) Keep a failed write's error for the loop to raise."""
        if not done.cancelled() and done.exception() is not None:
            self._write_error = done.exception()

    def wait_for_checkpoints(self) -> None:
        """Block until the checkpoints taken are on disk (the run's end); a failed
        last write is logged (the run's results are all written by then)."""
        if self._writer is not None:
            self._writer.shutdown(wait=True)
            self._writer = None
        if self._write_error is not None:
            log.error("the last checkpoint could not be written (a resume would start from "
                      "an earlier one): %s", self._write_error)

    def _maybe_checkpoint(self, now: float, step: Step) -> None:
        run = self.sc.run
        n = step.rounds_closed if self.strategy.cadence == "rounds" else sum(
            a.updates for a in step.applied)
        self._aggregations_since_checkpoint += n
        due = (run.checkpoint_every and self._aggregations_since_checkpoint >= run.checkpoint_every
               ) or (run.checkpoint_seconds and self._aggregations_since_checkpoint and
                     self.real_clock() - self._checkpoint_real >= run.checkpoint_seconds)
        if due:
            self.checkpoint(now)

    def _restore(self, ckpt: dict[str, Any]) -> None:
        assert self.state is not None
        self.strategy.load_state_dict(ckpt["strategy"])
        self.state.restore(ckpt["run"])
        self.make_task.next_id = int(ckpt["next_task_id"])
        self.clamped = int(ckpt.get("clamped", 0))
        random.setstate(ckpt["rng"]["python"])
        torch.set_rng_state(ckpt["rng"]["torch"])
        t = float(ckpt["t"])
        self.state.resumed.append({"t": t, "updates": self.state.updates,
                                   "rounds": self.state.rounds})
        self.state.event(t, "resume", version=self.strategy.version,
                         updates=self.state.updates, rounds=self.state.rounds)
        log.warning("resumed at t=%.2f (version %d, %d updates, %d rounds)", t,
                    self.strategy.version, self.state.updates, self.state.rounds)


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
