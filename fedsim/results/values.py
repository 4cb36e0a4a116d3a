"""A run's results as Python values: :class:`RunResult`, :class:`Summary`, :class:`Metrics`.

What :func:`fedsim.run` returns, and what :func:`fedsim.open_run` reads back
from any run directory (finished, stopped, killed or still running). Each
reads the files a run writes (``summary.json``, ``metrics.csv``,
``events.jsonl``), so a result is the same whether it came from the run
itself or from its directory a week later.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, overload

__all__ = ["LostWork", "Metrics", "Phase", "RunResult", "Staleness", "Summary", "Transfer"]


@dataclass(frozen=True, slots=True)
class Staleness:
    """The staleness of the updates applied, as it really occurred (None: none applied)."""

    count: int
    mean: float | None
    p50: float | None
    p99: float | None
    max: int | None


@dataclass(frozen=True, slots=True)
class Transfer:
    """Realised transfer time of the messages that carry a model, in one direction.

    ``configured_delay_ms`` is the mean configured one-way delay of the
    links; the realised time adds serialisation, queueing, TCP slow start
    and loss recovery (:class:`fedsim.results.writer.TransferStats`).
    """

    messages: int
    p50_ms: float | None
    p95_ms: float | None
    max_ms: float | None
    mean_bytes: float | None
    configured_delay_ms: float | None


@dataclass(frozen=True, slots=True)
class LostWork:
    """Client runs that failed, by cause and by client (``summary.json``'s ``lost_work``).

    Causes (:data:`fedsim.wire.messages.FAILURE_CAUSES`): ``overflow`` (a step
    beyond the parameters' dtype), ``non_finite`` (a trained model with NaN
    or an infinity), ``error`` (any other exception in training),
    ``host_lost`` (the client's host was lost). A client whose run failed
    is dropped for the rest of the run. ``first_reason``: the first failure
    of each client, in words.
    """

    runs: int
    by_reason: dict[str, int]
    by_client: dict[int, dict[str, int]]
    first_reason: dict[int, str]

    def __bool__(self) -> bool:
        return self.runs > 0


def _transfer(raw: Any) -> Transfer | None:
    if not isinstance(raw, Mapping):
        return None
    return Transfer(int(raw.get("messages", 0)), raw.get("p50_ms"), raw.get("p95_ms"),
                    raw.get("max_ms"), raw.get("mean_bytes"), raw.get("configured_delay_ms"))


@dataclass(frozen=True, slots=True)
class Phase:
    """The distribution of one phase's durations, in seconds (None: nothing measured).

    One entry of ``summary["phases"]`` (docs/run-directory.md, "Where time
    goes"): ``n``, ``mean`` and ``max`` are exact, the quantiles come from a
    bounded uniform sample.
    """

    n: int
    mean: float | None
    p50: float | None
    p95: float | None
    p99: float | None
    max: float | None


def _phase(raw: Any) -> Phase:
    r = raw if isinstance(raw, Mapping) else {}
    return Phase(int(r.get("n", 0)), r.get("mean"), r.get("p50"), r.get("p95"), r.get("p99"),
                 r.get("max"))


class Summary(Mapping[str, Any]):
    """A run's ``summary.json``: typed attributes for what is read most, and the
    whole mapping (``summary["fidelity"]["lateness_ms"]``) for the rest.

    docs/results.md and docs/run-directory.md list every key.
    """

    __slots__ = ("_data",)

    def __init__(self, data: Mapping[str, Any]) -> None:
        self._data = dict(data)

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return (f"Summary(status={self.status!r}, algorithm={self.algorithm!r}, "
                f"updates={self.updates}, final_accuracy={self.final_accuracy})")

    @property
    def status(self) -> str:
        """``completed``, ``failed: <reason>``, ``error: ...``, ``interrupted`` or ``running``."""
        return str(self._data.get("status", "unknown"))

    @property
    def stop_reason(self) -> str | None:
        """Why a completed run stopped: ``time_budget``, ``max_updates``, ``max_rounds``,
        ``target_accuracy``."""
        return self._data.get("stop_reason")

    @property
    def completed(self) -> bool:
        """Whether the run reached one of its limits."""
        return self.status == "completed"

    @property
    def algorithm(self) -> str:
        """``algorithm.name`` as the scenario gave it."""
        return str(self._data.get("algorithm", ""))

    @property
    def clients(self) -> int:
        """Clients in the scenario."""
        return int(self._data.get("clients", 0))

    @property
    def updates(self) -> int:
        """Client updates applied."""
        return int(self._data.get("updates", 0))

    @property
    def rounds(self) -> int:
        """Rounds closed (round-based algorithms)."""
        return int(self._data.get("rounds", 0))

    @property
    def emulated_seconds(self) -> float:
        """Emulated time the federation ran."""
        return float(self._data.get("emulated_seconds", 0.0))

    @property
    def real_seconds(self) -> float:
        """Real (wall-clock) time it took."""
        return float(self._data.get("real_seconds", 0.0))

    @property
    def final_accuracy(self) -> float | None:
        """Test accuracy of the last evaluation."""
        return self._data.get("final_accuracy")

    @property
    def best_accuracy(self) -> float | None:
        """Best test accuracy of any evaluation."""
        return self._data.get("best_accuracy")

    @property
    def time_to_target_s(self) -> float | None:
        """Emulated seconds until ``run.target_accuracy`` was first reached."""
        return self._data.get("time_to_target_s")

    @property
    def staleness(self) -> Staleness:
        """Staleness of the applied updates."""
        s = self._data.get("staleness") or {}
        return Staleness(int(s.get("count", 0)), s.get("mean"), s.get("p50"), s.get("p99"),
                         s.get("max"))

    @property
    def transfer_down(self) -> Transfer | None:
        """Realised transfer time of tasks and averages (server to client)."""
        return _transfer((self._data.get("transfer") or {}).get("down"))

    @property
    def transfer_up(self) -> Transfer | None:
        """Realised transfer time of updates (client to server)."""
        return _transfer((self._data.get("transfer") or {}).get("up"))

    @property
    def phases(self) -> dict[str, dict[str, Phase]]:
        """Where the run's time went: ``{phase: {part: Phase}}``, e.g.
        ``phases["compute"]["real"].p99`` (empty for a run that predates them).

        Phases overlap, so they are distributions, not shares of a total;
        the emulated transfer time per message is :attr:`transfer_down` and
        :attr:`transfer_up`.
        """
        raw = self._data.get("phases")
        if not isinstance(raw, Mapping):
            return {}
        return {str(phase): {str(part): _phase(d) for part, d in parts.items()}
                for phase, parts in raw.items() if isinstance(parts, Mapping)}

    @property
    def lost_work(self) -> LostWork:
        """Client runs that failed (and clients lost with their host): their work is lost
        and the clients were dropped. ``lost_work.runs == 0`` for a clean run."""
        raw = self._data.get("lost_work")
        r = raw if isinstance(raw, Mapping) else {}
        return LostWork(
            runs=int(r.get("runs", 0)),
            by_reason={str(k): int(v) for k, v in (r.get("by_reason") or {}).items()},
            by_client={int(c): {str(k): int(v) for k, v in d.items()}
                       for c, d in (r.get("by_client") or {}).items()},
            first_reason={int(c): str(v) for c, v in (r.get("first_reason") or {}).items()})

    @property
    def fidelity(self) -> str | None:
        """The timing verdict: ``pass`` or ``fail`` (its reasons in ``summary["fidelity"]``)."""
        return (self._data.get("fidelity") or {}).get("verdict")


class Metrics(Sequence[Mapping[str, float]]):
    """``metrics.csv``: one row per evaluation (emulated ``t``, ``updates``,
    ``accuracy``, ``loss``, ``staleness_mean``, bytes, ...), empty cells NaN.

    A sequence of rows, with :attr:`columns` for plotting
    (``plt.plot(m["t"], m["accuracy"])`` works too: a string index is a column).
    """

    __slots__ = ("_names", "_rows")

    def __init__(self, rows: Sequence[Mapping[str, float]], names: Sequence[str] = ()) -> None:
        self._rows = tuple(dict(r) for r in rows)
        self._names = tuple(names) or (tuple(self._rows[0]) if self._rows else ())

    @overload
    def __getitem__(self, key: int) -> Mapping[str, float]: ...
    @overload
    def __getitem__(self, key: slice) -> Sequence[Mapping[str, float]]: ...
    @overload
    def __getitem__(self, key: str) -> list[float]: ...

    def __getitem__(self, key: int | slice | str) -> Any:
        if isinstance(key, str):
            if key not in self._names:
                raise KeyError(f"no column {key!r} (columns: {', '.join(self._names)})")
            return [r.get(key, math.nan) for r in self._rows]
        return self._rows[key]

    def __len__(self) -> int:
        return len(self._rows)

    def __repr__(self) -> str:
        return f"Metrics({len(self)} rows; columns {', '.join(self._names)})"

    @property
    def names(self) -> tuple[str, ...]:
        """The column names, in file order."""
        return self._names

    @property
    def columns(self) -> dict[str, list[float]]:
        """Every column as a list (``pandas.DataFrame(m.columns)`` makes a frame)."""
        return {n: self[n] for n in self._names}


@dataclass(frozen=True)
class RunResult:
    """A run directory and its summary; metrics, events and plots on demand."""

    run_dir: Path
    summary: Summary

    @classmethod
    def of(cls, run_dir: str | Path, summary: Mapping[str, Any] | None = None) -> RunResult:
        """The result of ``run_dir`` (its ``summary.json`` unless ``summary`` is given)."""
        from fedsim.results.writer import read_summary  # lazy: RunResult is numpy-free (test_api)

        path = Path(run_dir)
        if summary is None:
            summary = read_summary(path)
            if summary is None:
                raise FileNotFoundError(f"{path} holds no summary.json (not a run directory, "
                                        "or a run that never started)")
        return cls(path, summary if isinstance(summary, Summary) else Summary(summary))

    @property
    def status(self) -> str:
        """The run's status (:attr:`Summary.status`)."""
        return self.summary.status

    @property
    def phases(self) -> dict[str, dict[str, Phase]]:
        """Where the run's time went, per phase (:attr:`Summary.phases`)."""
        return self.summary.phases

    @property
    def metrics(self) -> Metrics:
        """``metrics.csv`` as it is now (empty before the first evaluation)."""
        from fedsim.results.writer import (  # lazy: RunResult is numpy-free (test_api)
            METRIC_FIELDS,
            read_metrics,
        )

        path = self.run_dir / "metrics.csv"
        return Metrics(read_metrics(path) if path.exists() else [], METRIC_FIELDS)

    def events(self, kind: str | None = None) -> Iterator[dict[str, Any]]:
        """The records of ``events.jsonl`` (only those of ``kind``, e.g. ``"aggregate"``)."""
        from fedsim.results.writer import read_events  # lazy: RunResult is numpy-free (test_api)

        path = self.run_dir / "events.jsonl"
        if path.exists():
            for e in read_events(path):
                if kind is None or e.get("ev") == kind:
                    yield e

    def plot(self) -> list[Path]:
        """Draw the run's plots into its directory; return the files written."""
        from fedsim.results.plots import plot_run  # lazy: matplotlib stays out of client hosts

        return plot_run(self.run_dir)

    def scenario(self) -> Any:
        """The scenario as it ran (``scenario.json``, every default filled in)."""
        from fedsim.scenario import parse  # lazy: RunResult is pydantic-free (test_api)

        path = self.run_dir / "scenario.json"
        return parse(json.loads(path.read_text()), str(path))
