"""Reading a run directory: its summary, metrics and event log, whatever fedsim wrote it.

:func:`load_run` is the one way in for every tool that looks at results
(``fedsim plot``, ``fedsim compare``, sweeps, notebooks)::

    from fedsim.results.reader import load_run

    run = load_run("runs/quickstart-20261121-142526")
    run.summary["final_accuracy"], run.column("accuracy")
    [e for e in run.events if e["ev"] == "aggregate"]

It checks the directory's format version (``fedsim-run.json``; a directory
without one is format 1, fedsim's layout before the format was versioned)
and raises :class:`NotARunError` for a directory that holds no run and
:class:`RunFormatError` for a format this fedsim cannot read. Records come
back as their writer meant them, in one order: the event log is sorted by
emulated time (stably: records with the same ``t`` keep the order they were
appended in), since ``events.jsonl`` is appended to in the order each writer
produced its records (the server, and every client host in batches), not
in time order. Older formats are normalised to the current one (message
``kind`` in lower case). docs/run-directory.md describes every file.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedsim.errors import FedsimError
from fedsim.results.writer import FORMAT_FILE, RUN_FORMAT, read_events, read_metrics, read_summary

__all__ = [
    "FORMAT_FILE",
    "OLDEST_FORMAT",
    "RUN_FORMAT",
    "EventRecord",
    "NotARunError",
    "Run",
    "RunDirError",
    "RunFormatError",
    "load_run",
    "normalise_events",
    "run_format",
    "sort_events",
]

OLDEST_FORMAT = 1
"""The oldest run-directory format this fedsim reads."""

EventRecord = dict[str, Any]
"""One record of ``events.jsonl``: ``t``, ``real``, ``ev`` and its fields (as JSON)."""

#: The files a run directory may hold records in; a directory with none of them is no run.
_RECORD_FILES = ("summary.json", "metrics.csv", "events.jsonl")


class RunDirError(FedsimError):
    """A run directory cannot be read; ``path`` is the directory, the message says why."""

    def __init__(self, path: Path, message: str) -> None:
        super().__init__(message)
        self.path = path


class NotARunError(RunDirError):
    """The directory holds no fedsim run (no version file and none of its records)."""


class RunFormatError(RunDirError):
    """The run directory's format is unreadable here (newer than this fedsim, or damaged)."""


@dataclass(frozen=True, slots=True)
class Run:
    """What one run directory holds, read and checked by :func:`load_run`.

    Attributes
    ----------
    path
        The run directory.
    format
        Its format version (1 for a directory written before versions existed).
    summary
        ``summary.json`` (empty if the run was killed before writing one); a
        summary still saying ``running`` whose writer is gone reads as
        ``interrupted``.
    metrics
        The rows of ``metrics.csv``, one per evaluation, every value a float
        (an empty cell is NaN).
    events
        The records of ``events.jsonl`` sorted by ``t`` (stable), normalised
        to the current format; empty when loaded with ``events=False``.
    scenario
        The resolved scenario (``scenario.json``), or None if absent.
    skipped
        Event records left out because they had no numeric ``t`` or no ``ev``.
    """

    path: Path
    format: int
    summary: dict[str, Any]
    metrics: list[dict[str, float]]
    events: list[EventRecord] = field(default_factory=list)
    scenario: dict[str, Any] | None = None
    skipped: int = 0

    @property
    def name(self) -> str:
        """The run directory's name."""
        return self.path.name

    @property
    def algorithm(self) -> str:
        """The algorithm's name, from the summary or the scenario (``?`` if neither says)."""
        name = self.summary.get("algorithm")
        if name is None and self.scenario is not None:
            name = (self.scenario.get("algorithm") or {}).get("name")
        return str(name) if name is not None else "?"

    @property
    def status(self) -> str:
        """The summary's status (``unknown`` without a summary)."""
        return str(self.summary.get("status", "unknown"))

    def column(self, name: str) -> list[float]:
        """One column of ``metrics.csv`` (NaN where a row has no value)."""
        return [row.get(name, math.nan) for row in self.metrics]


def run_format(path: str | Path) -> int:
    """The format version of the run directory ``path``.

    Read from ``fedsim-run.json``; without it, from ``summary.json``'s
    ``format`` (a directory copied without its version file); without
    either, 1. Raises :class:`NotARunError` if ``path`` is not a directory
    holding a run, and :class:`RunFormatError` if the version is unreadable
    or outside :data:`OLDEST_FORMAT` .. :data:`RUN_FORMAT`.
    """
    path = Path(path)
    if not path.is_dir():
        raise NotARunError(path, f"{path}: not a directory")
    marker = path / FORMAT_FILE
    if marker.exists():
        source = marker
        try:
            data = json.loads(marker.read_text())
            version = data["format"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise RunFormatError(path, f"{marker}: unreadable ({type(exc).__name__}: "
                                 f"{exc})") from None
    elif not any((path / name).exists() for name in _RECORD_FILES):
        raise NotARunError(path, f"{path} is not a run directory (none of {FORMAT_FILE}, "
                           f"{', '.join(_RECORD_FILES)})")
    else:
        source = path / "summary.json"
        try:
            data = json.loads(source.read_text())
        except (OSError, ValueError):
            data = {}
        if not isinstance(data, dict) or "format" not in data:
            return 1
        version = data["format"]
    if not isinstance(version, int) or isinstance(version, bool):
        raise RunFormatError(path, f"{source}: format must be an integer, got {version!r}")
    if version > RUN_FORMAT:
        by = f" ({data['fedsim_version']})" if data.get("fedsim_version") else ""
        raise RunFormatError(path, f"{path} has run-directory format {version}, written by a "
                             f"newer fedsim{by}; this one reads formats {OLDEST_FORMAT} to "
                             f"{RUN_FORMAT}: upgrade fedsim")
    if version < OLDEST_FORMAT:
        raise RunFormatError(path, f"{source}: format {version} does not exist (formats "
                             f"{OLDEST_FORMAT} to {RUN_FORMAT})")
    return version


def sort_events(events: Iterable[EventRecord]) -> tuple[list[EventRecord], int]:
    """Records with a numeric ``t`` and a string ``ev``, sorted by ``t`` (stable).

    Returns the sorted records and how many were left out. Records with
    equal ``t`` keep their order in the input (the order they were appended
    in, which within one writer is the order they happened in).
    """
    kept: list[EventRecord] = []
    skipped = 0
    for e in events:
        t = e.get("t") if isinstance(e, dict) else None
        if (isinstance(t, int | float) and not isinstance(t, bool) and math.isfinite(t)
                and isinstance(e.get("ev"), str)):
            kept.append(e)
        else:
            skipped += 1
    kept.sort(key=_time)
    return kept, skipped


def _time(e: EventRecord) -> float:
    return float(e["t"])


def normalise_events(events: list[EventRecord], fmt: int) -> list[EventRecord]:
    """Bring records of format ``fmt`` to the current format, in place; return them.

    Format 1 named a delivered or dropped message by its class (``Task``)
    and a sent one in lower case (``task``): every ``kind`` becomes lower case.
    """
    if fmt < 2:
        for e in events:
            kind = e.get("kind")
            if isinstance(kind, str):
                e["kind"] = kind.lower()
    return events


def load_run(path: str | Path, *, events: bool = True) -> Run:
    """Read and check the run directory ``path``.

    Parameters
    ----------
    path
        A directory written by ``fedsim run``, ``fedsim server`` or the
        in-memory harness (finished, still running, or killed: only complete
        records are read).
    events
        Read the event log too (the largest file; a table of results needs
        only the summary and the metrics).

    Raises
    ------
    NotARunError
        ``path`` is not a directory, or holds none of a run's files.
    RunFormatError
        Its format is newer than this fedsim reads, or its version file is damaged.
    """
    path = Path(path)
    fmt = run_format(path)
    summary = read_summary(path) or {}
    metrics_file = path / "metrics.csv"
    metrics = read_metrics(metrics_file) if metrics_file.exists() else []
    records: list[EventRecord] = []
    skipped = 0
    events_file = path / "events.jsonl"
    if events and events_file.exists():
        records, skipped = sort_events(read_events(events_file))
        normalise_events(records, fmt)
    scenario = None
    with contextlib.suppress(OSError, ValueError):
        scenario = json.loads((path / "scenario.json").read_text())
    return Run(path=path, format=fmt, summary=summary, metrics=metrics, events=records,
               scenario=scenario if isinstance(scenario, dict) else None, skipped=skipped)
