"""What every client did, when: intervals extracted from a run's event log.

Pure functions over event records (``fedsim.results.reader.load_run(...).events``,
sorted by ``t``); :func:`fedsim.results.plots.plot_timeline` draws the result. Per
client, in emulated seconds:

* **download**: a message from the server (a task, a round's average) from
  its send to its delivery (``deliver``/``drop`` with ``dir = "down"``:
  ``sent_at`` to ``t``);
* **upload**: a message to the server (an update, a ``ready``), likewise;
* **training**: ``train_start`` to the ``train_end`` (or ``train_error``) of
  the same task; a pipelined session (DGA) trains from its start until it
  ends, except while it waits at a barrier or is away;
* **waiting**: at a barrier (``barrier_wait`` to ``barrier_resume``: DGA's
  paper mode), or with nothing to do while its update waits at the server,
  from the update's delivery until it is aggregated or discarded or the
  client's next task is sent (a synchronous round's barrier; zero for an
  update applied on arrival);
* **away**: ``away`` to ``back`` (off, or suspended).

A client is in one of training, waiting, away or idle at a time (away
first, then a barrier, then training, then an update's wait); downloads and
uploads overlap them freely, and that overlap of communication with
computation is what the timeline shows. Messages sent and neither
delivered nor dropped when the log ends are drawn up to the end as in
flight (format 2: a send record carries the ``sent_at`` its delivery will).
Markers: every aggregation of a client's update (with its staleness, for an
asynchronous rule), every discarded update, every lost message, every local
run that failed (``train_error``, with its cause: lost client work).
"""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "MAX_CLIENTS",
    "ClientTimeline",
    "Interval",
    "Timeline",
    "build_timeline",
    "merge",
    "sample_clients",
    "subtract",
]

MAX_CLIENTS = 40
"""Clients a timeline shows by default; a larger federation is sampled (:func:`sample_clients`)."""

Interval = tuple[float, float]
"""``(start, end)`` in emulated seconds, ``start <= end``."""


def merge(intervals: Iterable[Interval]) -> list[Interval]:
    """The union of ``intervals`` as sorted, disjoint intervals (empty ones dropped)."""
    out: list[Interval] = []
    for a, b in sorted(iv for iv in intervals if iv[1] > iv[0]):
        if out and a <= out[-1][1]:
            if b > out[-1][1]:
                out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def subtract(intervals: Iterable[Interval], cut: Iterable[Interval]) -> list[Interval]:
    """``intervals`` minus ``cut``, as sorted, disjoint intervals."""
    cuts = merge(cut)
    out: list[Interval] = []
    for a, b in merge(intervals):
        for c, d in cuts:
            if d <= a:
                continue
            if c >= b:
                break
            if c > a:
                out.append((a, c))
            a = max(a, d)
            if a >= b:
                break
        if a < b:
            out.append((a, b))
    return out


def _clip(intervals: Iterable[Interval], lo: float, hi: float) -> list[Interval]:
    return [(max(a, lo), min(b, hi)) for a, b in intervals if b > lo and a < hi]


@dataclass(slots=True)
class ClientTimeline:
    """One client's intervals and markers (see the module's docstring for each).

    ``download`` and ``upload`` hold one interval per message, sorted by
    start; they may overlap (a link carries messages back to back, in
    order). The other lanes are sorted and disjoint. All are clipped to the
    timeline's window; ``in_flight`` are the messages still under way when
    the log ends.
    """

    client: int
    download: list[Interval] = field(default_factory=list)
    upload: list[Interval] = field(default_factory=list)
    training: list[Interval] = field(default_factory=list)
    waiting: list[Interval] = field(default_factory=list)
    away: list[Interval] = field(default_factory=list)
    in_flight: list[Interval] = field(default_factory=list)
    #: (time, staleness) of each aggregation of its update; None for a round's
    aggregated: list[tuple[float, int | None]] = field(default_factory=list)
    #: time of each discarded update
    discarded: list[float] = field(default_factory=list)
    #: (time, "down" | "up") of each lost message
    lost: list[tuple[float, str]] = field(default_factory=list)
    #: (time, cause) of each local run that failed (``train_error``; the client
    #: is dropped): lost client work, summarised in ``summary.json``'s ``lost_work``
    failed: list[tuple[float, str]] = field(default_factory=list)


@dataclass(slots=True)
class Timeline:
    """Every shown client's :class:`ClientTimeline` over ``[start, end]``.

    ``total_clients`` is how many clients the run had (``clients`` may be a
    sample of them). ``staleness_max`` is the largest staleness of any
    update aggregated in the whole log, of every client at any time (None:
    none had one): the top of the colour scale, so that a window or a
    sample of clients is coloured as the whole run is.
    """

    start: float
    end: float
    clients: dict[int, ClientTimeline]
    total_clients: int
    staleness_max: int | None = None


def sample_clients(ids: Iterable[int], k: int = MAX_CLIENTS, seed: int = 0) -> list[int]:
    """``ids`` sorted, or a seeded random sample of ``k`` of them (sorted) if there are more.

    Random rather than evenly spaced: client hosts take clients round-robin
    and network groups are drawn per client, so a stride could show one
    host or one group only. The same ids and seed give the same sample.
    """
    pool = sorted(set(ids))
    if len(pool) <= k:
        return pool
    return sorted(random.Random(seed).sample(pool, k))


def _end_of(events: Sequence[dict[str, Any]]) -> float:
    """When the federation stopped: the ``end`` record's time, else the last record's."""
    for e in reversed(events):
        if e["ev"] == "end":
            return float(e["t"])
    return float(events[-1]["t"]) if events else 0.0


def build_timeline(events: Sequence[dict[str, Any]], *, clients: Iterable[int] | None = None,
                   total_clients: int | None = None, start: float = 0.0,
                   end: float | None = None) -> Timeline:
    """Extract each client's intervals and markers from ``events`` (sorted by ``t``).

    Parameters
    ----------
    events
        Event records in time order (as :func:`fedsim.results.reader.load_run` gives them).
    clients
        The clients to extract (default: every client the log names).
    total_clients
        How many clients the run had (default: how many the log names).
    start, end
        The window, in emulated seconds (default: 0 to the ``end`` record,
        or to the last record of a run that never wrote one). Intervals are
        clipped to it; markers outside it are left out. Neither the window
        nor ``clients`` changes :attr:`Timeline.staleness_max`.
    """
    stop = _end_of(events) if end is None else end
    per_client: dict[int, list[dict[str, Any]]] = defaultdict(list)
    aggregated: dict[int, list[tuple[float, int | None]]] = defaultdict(list)
    seen: set[int] = set()
    wanted = None if clients is None else set(clients)
    smax: int | None = None
    for e in events:
        ev = e["ev"]
        if ev == "aggregate":
            ids = e.get("clients") or ()
            stale = e.get("stalenesses")
            if stale is None or len(stale) != len(ids):
                one = e.get("staleness")
                stale = [one] * len(ids)
            for cid, s in zip(ids, stale, strict=True):
                seen.add(cid)
                if s is not None and (smax is None or int(s) > smax):
                    smax = int(s)
                if wanted is None or cid in wanted:
                    aggregated[cid].append((float(e["t"]), None if s is None else int(s)))
                    per_client[cid].append(e)
            continue
        cid = e.get("client")
        if isinstance(cid, int):
            seen.add(cid)
            if wanted is None or cid in wanted:
                per_client[cid].append(e)
    ids = sorted(seen if wanted is None else wanted)
    out = {cid: _client(cid, per_client.get(cid, []), aggregated.get(cid, []), start, stop)
           for cid in ids}
    return Timeline(start=start, end=stop, clients=out,
                    total_clients=total_clients if total_clients is not None else len(seen),
                    staleness_max=smax)


def _client(cid: int, events: list[dict[str, Any]], aggregated: list[tuple[float, int | None]],
            start: float, end: float) -> ClientTimeline:
    """One client's timeline from its own records (in time order)."""
    transfers: dict[str, list[Interval]] = {"down": [], "up": []}
    sends: dict[str, list[float]] = {"down": [], "up": []}
    arrived: dict[str, Counter[float]] = {"down": Counter(), "up": Counter()}
    training: list[Interval] = []
    barrier: list[Interval] = []
    away: list[Interval] = []
    held: list[Interval] = []  # its update waits at the server
    tl = ClientTimeline(client=cid)
    train_open: float | None = None
    barrier_open: float | None = None
    away_open: float | None = None
    held_open: float | None = None
    for e in events:
        ev, t = e["ev"], float(e["t"])
        d = e.get("dir")
        if ev in ("deliver", "drop") and d in transfers:
            sent = e.get("sent_at")
            if isinstance(sent, int | float):
                transfers[d].append((min(float(sent), t), t))
                arrived[d][float(sent)] += 1
            if ev == "drop":
                tl.lost.append((t, d))
            elif d == "up" and e.get("kind") == "update" and held_open is None:
                held_open = t
        elif ev == "send" and d in sends:
            sent = e.get("sent_at")
            if isinstance(sent, int | float):
                sends[d].append(float(sent))
            if d == "down" and e.get("kind") == "task" and held_open is not None:
                held.append((held_open, t))
                held_open = None
        elif ev == "train_start":
            if train_open is not None:
                training.append((train_open, t))
            train_open = t
        elif ev in ("train_end", "train_error"):
            if train_open is not None:
                training.append((train_open, t))
                train_open = None
            if ev == "train_error":
                tl.failed.append((t, str(e.get("cause") or "error")))
        elif ev == "barrier_wait":
            barrier_open = t if barrier_open is None else barrier_open
        elif ev == "barrier_resume":
            if barrier_open is not None:
                barrier.append((barrier_open, t))
                barrier_open = None
        elif ev == "away":
            away_open = t if away_open is None else away_open
        elif ev == "back":
            if away_open is not None:
                away.append((away_open, t))
                away_open = None
        elif ev in ("aggregate", "discard"):
            if held_open is not None:
                held.append((held_open, t))
                held_open = None
            if ev == "discard":
                tl.discarded.append(t)
    for opened, lane in ((train_open, training), (barrier_open, barrier), (away_open, away),
                         (held_open, held)):
        if opened is not None:
            lane.append((opened, max(opened, end)))
    in_flight: dict[str, list[Interval]] = {}
    for d in ("down", "up"):
        in_flight[d] = [(s, max(s, end)) for s in _unanswered(sends[d], arrived[d])]
    away_m = merge(away)
    barrier_m = subtract(barrier, away_m)
    training_m = subtract(training, away_m + barrier_m)
    waiting = merge(barrier_m + subtract(held, training_m + away_m))
    tl.download = _clip(sorted(transfers["down"] + in_flight["down"]), start, end)
    tl.upload = _clip(sorted(transfers["up"] + in_flight["up"]), start, end)
    tl.in_flight = _clip(sorted(in_flight["down"] + in_flight["up"]), start, end)
    tl.training = _clip(training_m, start, end)
    tl.waiting = _clip(waiting, start, end)
    tl.away = _clip(away_m, start, end)
    tl.aggregated = [(t, s) for t, s in aggregated if start <= t <= end]
    tl.discarded = [t for t in tl.discarded if start <= t <= end]
    tl.lost = [(t, d) for t, d in tl.lost if start <= t <= end]
    tl.failed = [(t, c) for t, c in tl.failed if start <= t <= end]
    return tl


def _unanswered(sent: list[float], arrived: Counter[float]) -> list[float]:
    """The send times after the last send whose message arrived (or was dropped).

    Those are the messages still in flight when the log ends. A send before
    a delivered one that has no delivery of its own (a resumed run's, whose
    delivery fell after the checkpoint) is not counted: only the tail.
    """
    left = Counter(arrived)
    last = -1
    for i, s in enumerate(sent):
        if left[s] > 0:
            left[s] -= 1
            last = i
    return sent[last + 1:]
