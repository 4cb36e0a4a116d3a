"""Writing the run directory: its event log, metrics table and summary, readable after a kill.

Every file is written so that a run killed at any moment leaves it readable
up to its last complete record: ``events.jsonl`` and ``metrics.csv`` are
append-only and line-oriented (readers skip a torn last line), and
``summary.json`` is replaced atomically (write, fsync, rename), refreshed at
every evaluation and at the end. The line readers here (:func:`read_events`,
:func:`read_metrics`, :func:`read_summary`) read each file as it was
written; :mod:`fedsim.results.reader` reads a whole run on top of them.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from netem.fidelitystats import Reservoir

__all__ = [
    "CHECKPOINT_FILE",
    "CHECKPOINT_FORMAT",
    "FORMAT_FILE",
    "METRIC_FIELDS",
    "OLD_CHECKPOINT_HELP",
    "RUN_FORMAT",
    "EventLog",
    "MetricsTable",
    "StalenessStats",
    "TransferStats",
    "boot_id",
    "read_events",
    "read_metrics",
    "read_summary",
    "write_json_atomic",
    "write_run_format",
    "writer_alive",
    "writer_record",
]

RUN_FORMAT = 2
"""The run directory's format version (docs/run-directory.md).

1: no version file (fedsim before the format was versioned); ``send``
records name the message kind in lower case and ``deliver``/``drop``
records by its class name (``task`` / ``Task``).
2: ``fedsim-run.json`` and the summary's ``format`` say 2; every ``kind`` is
lower case; ``send`` and ``drop`` records carry the message's ``sent_at``
(the key that joins a send to its delivery).
"""

FORMAT_FILE = "fedsim-run.json"
"""The file that marks a run directory and names its format."""

CHECKPOINT_FILE = "checkpoint.pt"
"""The run's last checkpoint (:mod:`fedsim.actors.checkpoint`), a :mod:`fedsim.wire.statefile`."""

CHECKPOINT_FORMAT = 3
"""The version of a checkpoint's contents (its ``format``): 3 is a state file; 1
(``torch.save``) and 2 (a pickle) were pickles, refused unread."""

OLD_CHECKPOINT_HELP = (
    "It was written by an earlier fedsim (checkpoint format 1 or 2): resume the run with "
    "the fedsim version that wrote it (fedsim-run.json names it) if you trust the file, "
    "or run the scenario again")
"""What to do with a pickled checkpoint (the refusal's last sentence)."""

METRIC_FIELDS = (
    "t", "real", "version", "round", "updates", "accuracy", "loss",
    "staleness_mean", "bytes_up", "bytes_down",
)


def write_json_atomic(path: Path, data: Any, *, durable: bool = False,
                      indent: int | None = 2) -> None:
    """Replace ``path`` with ``data`` as JSON, never leaving a torn file.

    The rename alone protects against a killed process; ``durable`` adds an
    fsync (milliseconds, so not on an event loop's hot path) against a crash
    of the machine. ``indent=None`` writes one line with the C encoder (the
    indenting one is pure Python: 0.2 s for a record of 10,000 clients).
    """
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w") as fh:
        json.dump(data, fh, indent=indent, sort_keys=False, default=_json_default)
        fh.write("\n")
        fh.flush()
        if durable:
            os.fsync(fh.fileno())
    os.replace(tmp, path)


def write_run_format(run_dir: Path, fedsim_version: str) -> None:
    """Mark ``run_dir`` as a run directory of format :data:`RUN_FORMAT`.

    Written before any record, so that even a run killed at once says what it is.
    """
    write_json_atomic(run_dir / FORMAT_FILE, {"format": RUN_FORMAT,
                                              "fedsim_version": fedsim_version})


def writer_alive(writer: dict[str, Any] | None, stale_after: float = 120.0) -> bool:
    """Whether the process that writes a run directory is still at it.

    On its own machine (same node name and boot id) the process is looked up
    by pid; elsewhere a summary not rewritten for ``stale_after`` seconds
    means its writer is gone.
    """
    if not writer:
        return False
    if writer.get("node") == socket.gethostname() and writer.get("boot_id") == boot_id():
        pid = int(writer.get("pid", -1))
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        try:  # a reused pid is not our writer
            with open(f"/proc/{pid}/stat") as fh:
                started = int(fh.read().rsplit(")", 1)[1].split()[19])
            return started == int(writer.get("started", started))
        except (OSError, ValueError, IndexError):
            return True
    return time.time() - float(writer.get("updated_at", 0.0)) < stale_after


def boot_id() -> str:
    """This machine's boot id: equal ids share one CLOCK_MONOTONIC (and one pid space)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def writer_record() -> dict[str, Any]:
    """Who writes this run directory: node, boot id, pid, process start, time of writing."""
    pid = os.getpid()
    started = None
    try:
        with open(f"/proc/{pid}/stat") as fh:
            started = int(fh.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        pass
    return {"node": socket.gethostname(), "boot_id": boot_id(), "pid": pid,
            "started": started, "updated_at": time.time()}


def read_summary(run_dir: Path) -> dict[str, Any] | None:
    """A run's summary.json as a reader should see it (None if there is none).

    A summary still saying ``running`` whose writer is gone (killed, crashed)
    reads as ``interrupted``, with ``interrupted_reason`` saying so.
    """
    try:
        with open(run_dir / "summary.json") as fh:
            summary: dict[str, Any] = json.load(fh)
    except (OSError, json.JSONDecodeError):
        return None
    if summary.get("status") == "running" and not writer_alive(summary.get("writer")):
        summary["status"] = "interrupted"
        summary["interrupted_reason"] = "its writer is gone (killed or crashed)"
    return summary


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return float(obj)
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")


#: One encoder for every record (``json.dumps`` with options builds one per call).
_LINE = json.JSONEncoder(separators=(",", ":"), default=_json_default)


class EventLog:
    """Append-only JSON-lines event log, written in whole lines.

    Each record has ``t`` (emulated seconds), ``real`` (real seconds since the
    run's epoch) and ``ev`` (the event type), then event fields. Records are
    kept until ``flush_every`` of them are pending (or :meth:`flush`) and then
    written with one ``write`` of whole lines on an ``O_APPEND`` descriptor:
    no buffer ever pushes half a line to the file. ``offset`` is the file's
    length after the last flush (a checkpoint records it; a resumed run
    truncates the log back to it).
    """

    def __init__(self, path: Path, flush_every: int = 512) -> None:
        self.path = path
        self._fd: int | None = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._lines: list[bytes] = []
        self.flush_every = flush_every
        self.count = 0
        self.offset = os.fstat(self._fd).st_size

    def write(self, record: dict[str, Any]) -> None:
        """Append one record."""
        self._lines.append(_LINE.encode(record).encode() + b"\n")
        self.count += 1
        if len(self._lines) >= self.flush_every:
            self.flush()

    def flush(self) -> None:
        """Write the pending records to the file (whole lines only)."""
        if not self._lines or self._fd is None:
            return
        data = memoryview(b"".join(self._lines))
        self._lines.clear()
        while data:
            n = os.write(self._fd, data)
            data = data[n:]
            self.offset += n

    def close(self) -> None:
        """Flush, sync and close."""
        if self._fd is not None:
            self.flush()
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = None


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

    @property
    def offset(self) -> int:
        """The file's length (whole rows: every row is flushed as it is written)."""
        return self._fh.tell()

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


class TransferStats:
    """Realised transfer time of every message that carries a model, per direction.

    A message's transfer time is its delivery time minus its send time, in
    emulated seconds: the link's propagation delay plus everything else the
    emulated TCP connection costs (serialisation at the link's rate, queueing,
    slow start after an idle period, loss recovery) and any lateness. On a
    link with only a configured delay, a 57 KB model takes several round
    trips of slow start: the quickstart's 50 ms link delivers it in about
    250 ms. The summary puts this next to the configured one-way delay.
    Quantiles come from a bounded sample (count and maximum stay exact).
    """

    #: Message kinds that carry a model (tasks, DGA's averages, updates); format 1
    #: run directories name them by class (``Task``), format 2 in lower case.
    KINDS = frozenset({"task", "average", "update"})
    DIRECTIONS = ("down", "up")

    def __init__(self, capacity: int = 1 << 15) -> None:
        self._capacity = capacity
        self._times = {d: Reservoir(capacity, seed=i) for i, d in enumerate(self.DIRECTIONS)}
        self._bytes = dict.fromkeys(self.DIRECTIONS, 0)

    def add(self, direction: str, seconds: float, nbytes: int) -> None:
        """One delivered message that took ``seconds`` (emulated) from send to delivery."""
        if direction in self._times and math.isfinite(seconds):
            self._times[direction].add(max(0.0, float(seconds)))
            self._bytes[direction] += int(nbytes)

    def record(self, event: dict[str, Any]) -> None:
        """Take a ``deliver`` event-log record into account (others are ignored)."""
        sent = event.get("sent_at")
        if (event.get("ev") == "deliver" and str(event.get("kind")).lower() in self.KINDS
                and isinstance(sent, int | float) and not isinstance(sent, bool)):
            self.add(str(event.get("dir")), float(event["t"]) - float(sent),
                     int(event.get("bytes") or 0))

    def summary(self, configured_ms: dict[str, float | None]) -> dict[str, Any]:
        """Per direction: ``messages``, ``p50_ms``, ``p95_ms``, ``max_ms``,
        ``mean_bytes`` and ``configured_delay_ms`` (the mean configured one-way
        delay over the clients, ``configured_ms``)."""
        def ms(x: float | None) -> float | None:
            return None if x is None else round(x, 6)

        out: dict[str, Any] = {}
        for d, r in self._times.items():
            n = r.count
            out[d] = {
                "messages": n,
                "p50_ms": ms(r.quantile(0.5) * 1e3) if n else None,
                "p95_ms": ms(r.quantile(0.95) * 1e3) if n else None,
                "max_ms": ms(r.max * 1e3) if n else None,
                "mean_bytes": round(self._bytes[d] / n) if n else None,
                "configured_delay_ms": ms(configured_ms.get(d)),
            }
        return out

    def state(self) -> dict[str, Any]:
        """Plain data for a checkpoint."""
        return {d: {"times": r.export(self._capacity), "bytes": self._bytes[d]}
                for d, r in self._times.items()}

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state`."""
        for d, s in state.items():
            if d in self._times:
                self._times[d].merge(s["times"])
                self._bytes[d] += int(s["bytes"])


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
