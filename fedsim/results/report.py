"""A run's summary as the terminal shows it: the lines ``fedsim run`` and ``fedsim server`` print.

:func:`format_summary` turns a run's ``summary.json`` (a
:class:`~fedsim.results.values.Summary`, or the plain mapping) into lines:
the algorithm and status, accuracy, updates and time, staleness, the
realised transfer time per model message next to the configured delay, the
timing verdict and its reasons, lost hosts and lost work, corrected and
rejected messages, and the "where time went" block (per phase, p50 / p99 /
n of each part); most lines appear only when the run has their values.
The command line prints the lines as they are; this module prints nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedsim.results.values import Summary, Transfer
from fedsim.scenario.ids import format_ids

__all__ = ["format_duration", "format_summary", "format_value"]

#: the phases of the "where time went" block, in order; transfer comes from
#: summary["transfer"] (emulated) and has p95, not p99
_PHASE_LINES = (("encode", ""), ("decode", ""), ("queueing", ""),
                ("transfer", " (emulated; p50 / p95 / n)"), ("compute", " (budget: emulated)"),
                ("aggregation", ""), ("evaluation", ""))


def format_value(v: Any, spec: str = ".4f") -> str:
    """``v`` formatted by ``spec``; ``-`` for None (a value the run does not have)."""
    return "-" if v is None else format(v, spec)


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f} ms"


def format_duration(v: float | None) -> str:
    """A duration in seconds, in the unit that suits it (``21 us``, ``1.23 ms``, ``4.56 s``)."""
    if v is None:
        return "-"
    if v < 1e-3:
        return f"{v * 1e6:.0f} us"
    if v < 1.0:
        return f"{v * 1e3:.3g} ms"
    return f"{v:.3g} s" if v < 100 else f"{v:.0f} s"


def _transfers(s: Summary) -> list[tuple[str, Transfer]]:
    """Each direction the summary has a transfer entry for, down first."""
    return [(d, t) for d, t in (("down", s.transfer_down), ("up", s.transfer_up))
            if t is not None]


def _transfer_line(s: Summary) -> str | None:
    """Realised per-message transfer times next to the configured one-way delay."""
    parts, delays, sizes = [], [], []
    for d, x in _transfers(s):
        if x.messages:
            parts.append(f"{d} p50 {_ms(x.p50_ms)}, p95 {_ms(x.p95_ms)}")
            sizes.append(x.mean_bytes or 0)
        if x.configured_delay_ms is not None:
            delays.append((d, x.configured_delay_ms))
    if not parts:
        return None
    if len({round(v, 3) for _, v in delays}) == 1:
        conf = f"configured one-way delay {_ms(delays[0][1])}"
    else:
        conf = "configured one-way delay " + ", ".join(f"{d} {_ms(v)}" for d, v in delays)
    kb = max(sizes) / 1e3
    return f"  transfer         {'; '.join(parts)} per model message ({kb:.0f} KB; {conf})"


def _phase_lines(s: Summary) -> list[str]:
    """The "where time went" block: per phase, p50 / p99 / n of each of its parts.

    Phases overlap (a client computes while others' messages are in
    transit), so each is a distribution of its own, not a share of a total.
    A summary without ``phases`` (a run that predates them) has no block.
    """
    if not isinstance(s.get("phases"), Mapping):
        return []
    phases = s.phases
    lines = ["  where time went  p50 / p99 / n (real time unless marked emulated)"]
    for phase, note in _PHASE_LINES:
        if phase == "transfer":
            parts = [(d, format_duration(x.p50_ms and x.p50_ms / 1e3),
                      format_duration(x.p95_ms and x.p95_ms / 1e3), x.messages)
                     for d, x in _transfers(s)]
        else:
            parts = [(part.replace("_", " "), format_duration(x.p50), format_duration(x.p99),
                      x.n)
                     for part, x in phases.get(phase, {}).items()]
        if parts:
            lines.append(f"    {phase:<15}" + "; ".join(f"{part} {p50} / {p99} / {n}"
                                                      for part, p50, p99, n in parts) + note)
    return lines


def _lost_work_line(s: Summary) -> str | None:
    """The line on client runs that failed (None when none did)."""
    lost = s.lost_work
    if not lost:
        return None
    causes = ", ".join(f"{k} {v}" for k, v in sorted(lost.by_reason.items()))
    ids = (s.get("lost_work") or {}).get("clients") or []
    shown = format_ids(ids[:12]) + (" ..." if len(ids) > 12 else "")
    return (f"  lost work        {lost.runs} client run(s) failed ({causes}); "
            f"dropped: client(s) {shown}; see summary.json lost_work")


def _fidelity_lines(s: Summary) -> list[str]:
    """The timing verdict with its lateness and compute overruns, then its reasons."""
    fid = s.get("fidelity") or {}
    lat = fid.get("lateness_ms") or {}
    compute = fid.get("compute") or {}
    late = "" if lat.get("late") is None else (
        f", {lat['late']} of {lat.get('n')} over {format_value(lat.get('allowed_p99'), '.3g')}"
        f" ms ({lat.get('late_limit')} allowed)")
    overruns = "" if compute.get("overrun_limit") is None else (
        f" ({compute['overrun_limit']} allowed)")
    lines = [f"  fidelity         {s.fidelity}: "
             f"lateness p50 {format_value(lat.get('p50'), '.3f')} ms, "
             f"p99 {format_value(lat.get('p99'), '.3f')} ms{late}; "
             f"{compute.get('overruns', 0)} compute overruns{overruns}"]
    lines += [f"    fail: {reason}" for reason in fid.get("reasons", [])]
    if s.fidelity == "fail":
        # the number, not --dilation auto again: it is measured from this run's own
        # lateness, which auto (timed before the run) may just have under-estimated
        suggested = fid.get("suggested_dilation")
        if suggested is not None:  # None: no verdict was computed (the run never started)
            lines.append(f"    suggested dilation {suggested} (fedsim run --dilation "
                         f"{format_value(suggested, 'g')})")
    return lines


def _corrected_line(s: Summary) -> str:
    """The messages whose claimed send time the server corrected, by host."""
    fixed = s.get("send_time_corrections") or {}
    clocks = (s.get("fidelity") or {}).get("clocks") or {}
    hosts = {h: c["send_times_corrected"] for h, c in clocks.items()
             if isinstance(c, dict) and c.get("send_times_corrected")}
    return (f"  corrected        {s['send_times_clamped']} messages claimed a send time "
            f"the server's record does not allow ({fixed.get('out_of_window', 0)} out "
            f"of the window, {fixed.get('before_record', 0)} before their task's "
            "earliest delivery and compute; by host: "
            + (", ".join(f"{h} {n}" for h, n in sorted(hosts.items())) or "-")
            + "): corrected, not judged, and the verdict fails")


def _rejected_lines(s: Summary) -> list[str]:
    """The messages the server rejected, by reason, and those it counted without logging."""
    lines = []
    rejected = (s.get("rejected_messages") or {}).get("server") or {}
    if rejected:
        lines.append("  rejected         " + ", ".join(
            f"{k} {v}" for k, v in sorted(rejected.items())))
    unlogged = (s.get("rejected_messages") or {}).get("unlogged") or {}
    if unlogged:
        lines.append(f"    of which {sum(unlogged.values())} counted, not logged (over "
                     "deploy.max_logged_rejects per source): " + ", ".join(
                         f"{k} {v}" for k, v in sorted(unlogged.items(), key=lambda kv: -kv[1])))
    return lines


def format_summary(summary: Mapping[str, Any], run_dir: str | Path | None = None) -> list[str]:
    """A run's summary as the lines the terminal shows, the run directory's last if given.

    ``summary`` is a :class:`~fedsim.results.values.Summary` or the mapping
    of ``summary.json``; it must have the keys every summary has
    (``algorithm``, ``clients``, ``status``, ``updates``, the seconds); the
    others are shown when present (docs/run-directory.md lists them).
    """
    s = summary if isinstance(summary, Summary) else Summary(summary)
    st = s.staleness
    why = f" ({s.stop_reason})" if s.stop_reason else ""
    lines = [f"{s.algorithm} on {s.clients} clients: {s.status}{why}",
             f"  final accuracy   {format_value(s.final_accuracy)}  "
             f"(best {format_value(s.best_accuracy)})",
             f"  updates          {s.updates}{f' ({s.rounds} rounds)' if s.rounds else ''}"
             f" in {s.emulated_seconds:.1f} emulated s "
             f"({s.real_seconds:.1f} real s)"]
    if st.count:
        # quantiles as the staleness figure and fedsim compare give them (8.09, not 8)
        lines.append(f"  staleness        mean {st.mean:.2f}  p50 {format_value(st.p50, 'g')}  "
                     f"p99 {format_value(st.p99, 'g')}  max {st.max}  (as it really occurred)")
    transfer = _transfer_line(s)
    if transfer is not None:
        lines.append(transfer)
    if s.time_to_target_s is not None:
        lines.append(f"  time to target   {s.time_to_target_s:.2f} s "
                     f"(accuracy {s['target_accuracy']})")
    lines += _fidelity_lines(s)
    hosts = s.get("hosts") or {}
    if hosts.get("unreported"):
        lines.append(f"  hosts            {hosts['reported']} of {hosts['registered']} "
                     f"reported; lost: {', '.join(hosts['unreported'])} "
                     "(the verdict covers the others)")
    lost = _lost_work_line(s)
    if lost is not None:
        lines.append(lost)
    if s.get("clients_missing"):
        lines.append(f"  missing clients  {len(s['clients_missing'])} never registered")
    if s.get("send_times_clamped"):
        lines.append(_corrected_line(s))
    guard = s.get("guard")
    if isinstance(guard, dict):
        lines.append(f"  update guard     {guard.get('rejected', 0)} rejected, "
                     f"{guard.get('clipped', 0)} clipped")
    if s.get("late_arrivals"):
        lines.append(f"  late arrivals    {s['late_arrivals']} messages arrived after their "
                     "emulated delivery time (real transit longer than the emulated link, or "
                     "a forged send time; per host in fidelity.clocks): not judged")
    lines += _rejected_lines(s)
    lines += _phase_lines(s)
    if run_dir is not None:
        lines.append(f"  run directory    {run_dir}")
    return lines
