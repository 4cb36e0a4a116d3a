"""The run directory: event log, metrics table, summary and plots.

Every file is written so that a run killed at any moment leaves it readable
up to its last complete record: ``events.jsonl`` and ``metrics.csv`` are
append-only and line-oriented (readers skip a torn last line), and
``summary.json`` is replaced atomically (write, fsync, rename), refreshed at
every evaluation and at the end.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "METRIC_FIELDS",
    "EventLog",
    "MetricsTable",
    "StalenessStats",
    "read_events",
    "read_metrics",
    "write_json_atomic",
]

METRIC_FIELDS = (
    "t", "real", "version", "round", "updates", "accuracy", "loss",
    "staleness_mean", "bytes_up", "bytes_down",
)


def write_json_atomic(path: Path, data: Any, *, durable: bool = False) -> None:
    """Replace ``path`` with ``data`` as JSON, never leaving a torn file.

    The rename alone protects against a killed process; ``durable`` adds an
    fsync (milliseconds, so not on an event loop's hot path) against a crash
    of the machine.
    """
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w") as fh:
        json.dump(data, fh, indent=2, sort_keys=False, default=_json_default)
        fh.write("\n")
        fh.flush()
        if durable:
            os.fsync(fh.fileno())
    os.replace(tmp, path)


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return float(obj)
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")


class EventLog:
    """Append-only JSON-lines event log, flushed in batches.

    Each record has ``t`` (emulated seconds), ``real`` (real seconds since the
    run's epoch) and ``ev`` (the event type), then event fields.
    """

    def __init__(self, path: Path, flush_every: int = 512) -> None:
        self.path = path
        self._fh = open(path, "a", buffering=1 << 16)  # noqa: SIM115 - closed in close()
        self._pending = 0
        self.flush_every = flush_every
        self.count = 0

    def write(self, record: dict[str, Any]) -> None:
        """Append one record."""
        self._fh.write(json.dumps(record, separators=(",", ":"), default=_json_default))
        self._fh.write("\n")
        self.count += 1
        self._pending += 1
        if self._pending >= self.flush_every:
            self.flush()

    def flush(self) -> None:
        """Push buffered records to the OS (whole lines only)."""
        self._fh.flush()
        self._pending = 0

    def close(self) -> None:
        """Flush and close."""
        if not self._fh.closed:
            self._fh.flush()
            os.fsync(self._fh.fileno())
            self._fh.close()


class MetricsTable:
    """``metrics.csv``: one row per evaluation, flushed per row."""

    def __init__(self, path: Path) -> None:
        new = not path.exists() or path.stat().st_size == 0
        self._fh = open(path, "a", newline="")  # noqa: SIM115 - closed in close()
        self._w = csv.DictWriter(self._fh, fieldnames=METRIC_FIELDS, extrasaction="ignore")
        if new:
            self._w.writeheader()
        self.rows: list[dict[str, Any]] = []

    def append(self, row: dict[str, Any]) -> None:
        """Write one row and flush it."""
        clean = {k: _fmt(row.get(k)) for k in METRIC_FIELDS}
        self._w.writerow(clean)
        self._fh.flush()
        self.rows.append(row)

    def close(self) -> None:
        """Close the file."""
        if not self._fh.closed:
            self._fh.close()


def _fmt(v: Any) -> Any:
    if isinstance(v, float):
        return "" if math.isnan(v) else f"{v:.6g}"
    return "" if v is None else v


class StalenessStats:
    """Collects the staleness of every applied update."""

    def __init__(self) -> None:
        self.values: list[int] = []
        self._window_start = 0

    def add(self, d: int) -> None:
        """Record one applied update's staleness."""
        self.values.append(int(d))

    def window_mean(self) -> float:
        """Mean staleness since the previous call (NaN if none)."""
        window = self.values[self._window_start :]
        self._window_start = len(self.values)
        return float(np.mean(window)) if window else math.nan

    def summary(self) -> dict[str, float | int | None]:
        """``mean``, ``p50``, ``p99``, ``max`` (None when nothing was applied)."""
        if not self.values:
            return {"mean": None, "p50": None, "p99": None, "max": None, "count": 0}
        a = np.asarray(self.values)
        return {
            "mean": float(a.mean()),
            "p50": float(np.percentile(a, 50)),
            "p99": float(np.percentile(a, 99)),
            "max": int(a.max()),
            "count": int(a.size),
        }


def _complete_lines(path: Path) -> Iterator[str]:
    with open(path, newline="") as fh:
        data = fh.read()
    if not data:
        return
    lines = data.split("\n")
    if not data.endswith("\n"):
        lines = lines[:-1]  # a torn last record
    yield from (line for line in lines if line)


def read_events(path: Path) -> Iterator[dict[str, Any]]:
    """Every complete record of an event log (a torn last line is skipped)."""
    for line in _complete_lines(path):
        try:
            yield json.loads(line)
        except json.JSONDecodeError:
            continue


def read_metrics(path: Path) -> list[dict[str, float]]:
    """Rows of ``metrics.csv`` as floats (empty cells become NaN)."""
    text = "\n".join(_complete_lines(path))
    rows = []
    for raw in csv.DictReader(io.StringIO(text)):
        row: dict[str, float] = {}
        for k, v in raw.items():
            try:
                row[k] = float(v) if v not in ("", None) else math.nan
            except ValueError:
                row[k] = math.nan
        rows.append(row)
    return rows
