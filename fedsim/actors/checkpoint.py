"""Checkpoints of a federation: the server writes them, a resumed run reads one back.

``checkpoint.pt`` (format 1) holds all a resumed run continues from: the
global model and the algorithm's state, the run's counters and records, the
event log's and metrics' lengths, the RNG states and the next task id.
:class:`Checkpoints` is the part of :class:`~fedsim.actors.server.Server`
that writes one every ``run.checkpoint_every`` aggregations (rounds closed
or updates applied, by the algorithm's cadence) or, once one was applied,
every ``run.checkpoint_seconds`` real seconds, and restores one at the start
of a resumed run; :func:`load_checkpoint` reads it and truncates the run
directory's logs back to it.
"""

from __future__ import annotations

import itertools
import logging
import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from fedsim.actors.runstate import RunState
from fedsim.algorithms.api import ServerAlgorithm, Step
from fedsim.scenario import Scenario

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
    task_ids: itertools.count[int]
    clamped: int
    _aggregations_since_checkpoint: int
    _checkpoint_real: float

    def checkpoint(self, now: float) -> Path:
        """Write ``checkpoint.pt`` atomically: all a resumed run continues from.

        The global model and the algorithm's state, the run's counters and
        records, the event log's and metrics' lengths (a resumed run
        truncates them back), the RNG states, the next task id. What happens
        after it (tasks in flight, updates not yet applied) is what a resume
        loses.
        """
        assert self.state is not None
        self.state.event(now, "checkpoint", version=self.strategy.version,
                         updates=self.state.updates, rounds=self.state.rounds)
        data = {
            "format": 1, "t": now, "fedsim_version": self.fedsim_version,
            "scenario_hash": self.scenario_hash, "version": self.strategy.version,
            "strategy": self.strategy.state_dict(), "run": self.state.checkpoint_state(),
            "next_task_id": next(self.task_ids), "clamped": self.clamped,
            "rng": {"python": random.getstate(), "torch": torch.get_rng_state()},
        }
        path = self.run_dir / "checkpoint.pt"
        tmp = path.with_suffix(".pt.tmp")
        with open(tmp, "wb") as fh:
            torch.save(data, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        self._aggregations_since_checkpoint = 0
        self._checkpoint_real = self.real_clock()
        return path

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
        self.task_ids = itertools.count(int(ckpt["next_task_id"]))
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


def load_checkpoint(run_dir: Path, fedsim_version: str, scenario_hash: str) -> dict[str, Any]:
    """A run directory's checkpoint, its event log and metrics truncated back to it.

    Raises ValueError naming what does not match (another fedsim version,
    another scenario) or FileNotFoundError if the run never checkpointed.
    """
    path = run_dir / "checkpoint.pt"
    if not path.exists():
        raise FileNotFoundError(f"{path}: the run wrote no checkpoint (nothing to resume)")
    ckpt: dict[str, Any] = torch.load(path, weights_only=False)
    if ckpt.get("format") != 1:
        raise ValueError(f"{path}: unknown checkpoint format {ckpt.get('format')!r}")
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
