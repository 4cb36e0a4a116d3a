"""Time-varying links: scheduled parameter changes and Mahimahi delivery traces.

Mahimahi's trace format and byte-level accounting (``ravinet/mahimahi``,
``mm-link``); docs/netem.md#time-varying-links.

* :class:`Schedule` -- a list of ``(t, {field: value})`` changes applied to a
  link's :class:`~netem.linkparams.LinkParams` at emulated time ``t`` (seconds).
  Changes accumulate: the parameters in force at ``t`` are the base with every
  change at or before ``t`` applied in order. A message uses the parameters in
  force when it is sent; a message already queued is not re-timed.
* :class:`DeliveryTrace` -- Mahimahi format: "each line gives a timestamp in
  milliseconds ... and represents an opportunity for one 1500-byte packet to
  be drained from the bottleneck queue"; repeated timestamps mean several
  packets in that millisecond; the trace wraps around with period equal to its
  last timestamp (a file containing ``1`` is 12 Mbit/s).
* :class:`TraceServer` -- the byte-level queue drain of ``mm-link``: each
  opportunity drains up to 1500 bytes of whatever is queued at that instant;
  "delivery opportunities are wasted if bytes are unavailable at the instant
  of an opportunity".

Bundled traces (``netem/traces/``, generated here, see
:func:`bundled_trace`): ``constant-12mbps.trace`` (one opportunity per ms) and
``bursty.trace`` (:func:`bursty_example`: 12.6 Mbit/s average over 2 s
cycles of 24 / 12 / 6 Mbit/s phases with a 200 ms outage).
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from netem import _check

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = [
    "DeliveryTrace",
    "Schedule",
    "TraceServer",
    "bundled_trace",
    "bursty_example",
    "trace_from_rates",
]

TRACE_DIR = Path(__file__).with_name("traces")
# parameters a Schedule changes: any dataclass (LinkParams in practice)
P = TypeVar("P", bound="DataclassInstance")


class Schedule:
    """Parameter changes at emulated times.

    Parameters
    ----------
    changes
        ``(t, overrides)`` pairs, ``t >= 0`` seconds, overrides a mapping of
        :class:`~netem.linkparams.LinkParams` field names to new values. Sorted by
        ``t`` (stable, so equal times apply in the given order).
    """

    __slots__ = ("changes",)

    def __init__(self, changes: Iterable[tuple[float, Mapping[str, Any]]]) -> None:
        items: list[tuple[float, dict[str, Any]]] = []
        for i, (t, ov) in enumerate(changes):
            _check.nonneg("Schedule", f"changes[{i}].t", t, " s")
            if not isinstance(ov, Mapping):
                _check.fail(
                    "Schedule", f"changes[{i}].overrides", ov, "must be a mapping"
                )
            items.append((float(t), dict(ov)))
        self.changes = tuple(sorted(items, key=lambda c: c[0]))

    @classmethod
    def periodic(
        cls, period: float, phases: Sequence[Mapping[str, Any]], until: float
    ) -> Schedule:
        """Cycle through ``phases``, one every ``period`` seconds, up to ``until``.

        E.g. Starlink's 15 s reconfiguration steps (arXiv:2310.09242):
        ``Schedule.periodic(15.0, [{"delay": .025}, {"delay": .035}], 3600)``.
        """
        _check.positive("Schedule.periodic", "period", period, " s")
        if not phases:
            _check.fail(
                "Schedule.periodic", "phases", phases, "needs at least one phase"
            )
        n = math.floor(until / period) + 1
        return cls((k * period, phases[k % len(phases)]) for k in range(n))

    def timeline(self, base: P) -> list[tuple[float, P]]:
        """``[(t, params)]`` starting at ``(-inf, base)``, cumulative.

        Every intermediate parameter set is built with
        :func:`dataclasses.replace`, so it is validated here, once.
        """
        out: list[tuple[float, P]] = [(-math.inf, base)]
        cur = base
        for t, ov in self.changes:
            try:
                cur = dataclasses.replace(cur, **ov)
            except TypeError as e:
                raise ValueError(f"Schedule change at t={t}: {e}") from None
            out.append((t, cur))
        return out


@dataclass(frozen=True, slots=True)
class DeliveryTrace:
    """A Mahimahi delivery-opportunity trace.

    Parameters
    ----------
    timestamps_ms
        Non-decreasing integer milliseconds; the last one (> 0) is the period.
    packet_bytes
        Bytes one opportunity drains (1500 in Mahimahi).
    offset
        Emulated time (s) at which trace time 0 falls.
    name
        Label for logs.
    """

    timestamps_ms: tuple[int, ...]
    packet_bytes: int = 1500
    offset: float = 0.0
    name: str = ""

    def __post_init__(self) -> None:
        ts = self.timestamps_ms
        o = "DeliveryTrace"
        if not ts:
            _check.fail(o, "timestamps_ms", ts, "needs at least one timestamp")
        prev = 0
        for i, v in enumerate(ts):
            if isinstance(v, bool) or not isinstance(v, int) or v < prev:
                _check.fail(
                    o,
                    f"timestamps_ms[{i}]",
                    v,
                    f"must be an int >= {prev} (non-decreasing)",
                )
            prev = v
        if ts[-1] <= 0:
            _check.fail(
                o, "timestamps_ms[-1]", ts[-1], "the period (last value) must be > 0 ms"
            )
        _check.integer(o, "packet_bytes", self.packet_bytes, 1)
        _check.finite(o, "offset", self.offset)

    @classmethod
    def from_file(cls, path: str | Path, **kw: Any) -> DeliveryTrace:
        """Read a Mahimahi trace file (one integer ms per line)."""
        vals: list[int] = []
        for lineno, line in enumerate(Path(path).read_text().splitlines(), 1):
            text = line.strip()
            if not text or text.startswith("#"):
                continue
            try:
                vals.append(int(text))
            except ValueError:
                raise ValueError(
                    f"{path}:{lineno}: {text!r} is not an integer ms"
                ) from None
        kw.setdefault("name", Path(path).stem)
        return cls(tuple(vals), **kw)

    def to_text(self) -> str:
        """Mahimahi file content."""
        return "".join(f"{v}\n" for v in self.timestamps_ms)

    @property
    def period(self) -> float:
        """Wrap-around period in seconds."""
        return self.timestamps_ms[-1] / 1000.0

    @property
    def mean_rate(self) -> float:
        """Average capacity in bits/s."""
        return len(self.timestamps_ms) * self.packet_bytes * 8 / self.period

    def opportunity_time(self, g: int) -> float:
        """Emulated time of global opportunity ``g`` (0 = first of cycle 0)."""
        m = len(self.timestamps_ms)
        c, i = divmod(g, m)
        return (
            self.offset + (c * self.timestamps_ms[-1] + self.timestamps_ms[i]) / 1000.0
        )

    def count_before(self, t: float) -> int:
        """Global index of the first opportunity at or after ``t``.

        Opportunity 0 is the first timestamp of the file (Mahimahi starts the
        trace at ``offset``; nothing is delivered before its first line).
        """
        # 1 ns tolerance so that an opportunity computed as a float time by
        # opportunity_time() is found again at exactly that time.
        x = (t - self.offset) * 1000.0 - 1e-6
        p = self.timestamps_ms[-1]
        c = math.floor(x / p)
        i = bisect.bisect_left(self.timestamps_ms, x - c * p)
        return max(c * len(self.timestamps_ms) + i, 0)  # the trace starts at offset

    def capacity(self, t0: float, t1: float) -> int:
        """Bytes the trace can drain at opportunities in ``[t0, t1)``."""
        if t1 <= t0:
            return 0
        return (self.count_before(t1) - self.count_before(t0)) * self.packet_bytes


class TraceServer:
    """Stateful byte-level drain of one link through a :class:`DeliveryTrace`."""

    __slots__ = ("_g", "_left", "trace")

    def __init__(self, trace: DeliveryTrace) -> None:
        self.trace = trace
        self._g: int | None = None  # last opportunity used (global index)
        self._left = 0  # bytes unused in it

    def serve(self, t_ready: float, nbytes: int) -> float:
        """Time the last of ``nbytes`` (all queued at ``t_ready``) drains."""
        tr, b = self.trace, self.trace.packet_bytes
        if self._g is not None and tr.opportunity_time(self._g) >= t_ready:
            # Queued behind earlier bytes: share the last opportunity used.
            left, g = self._left, self._g + 1
            if nbytes <= left:
                self._left = left - nbytes
                return tr.opportunity_time(self._g)
        else:
            left, g = 0, tr.count_before(t_ready)
        need = nbytes - left
        q = -(-need // b)
        self._g = g + q - 1
        self._left = q * b - need
        return tr.opportunity_time(self._g)

    def backlog(self, t: float, busy_until: float) -> int:
        """Bytes still queued at ``t`` if the queue drains exactly at ``busy_until``."""
        if busy_until < t or self._g is None:
            return 0
        n = self.trace.capacity(t, busy_until) + self.trace.packet_bytes
        return max(n - self._left, 0)


def trace_from_rates(
    rates_bps: Sequence[float], bin_ms: int, packet_bytes: int = 1500, name: str = ""
) -> DeliveryTrace:
    """Mahimahi trace for a piecewise-constant rate series.

    Bin ``k`` covers ms ``(k*bin_ms, (k+1)*bin_ms]``; its opportunities are
    spread evenly over its milliseconds, fractional packets carried over
    (error diffusion), so the long-run rate is exact. The period is
    ``len(rates_bps) * bin_ms`` (a final opportunity is placed at the period
    if needed so the wrap is right; it carries no extra capacity beyond
    rounding).
    """
    _check.integer("trace_from_rates", "bin_ms", bin_ms, 1)
    ts: list[int] = []
    carry = 0.0
    per_ms = [r * 1e-3 / (8 * packet_bytes) for r in rates_bps]
    for k, rate in enumerate(per_ms):
        _check.nonneg("trace_from_rates", f"rates_bps[{k}]", rates_bps[k], " bits/s")
        for ms in range(k * bin_ms + 1, (k + 1) * bin_ms + 1):
            carry += rate
            whole = int(carry)
            carry -= whole
            ts.extend([ms] * whole)
    period = len(rates_bps) * bin_ms
    if not ts or ts[-1] != period:
        ts.append(period)
    return DeliveryTrace(tuple(ts), packet_bytes, name=name)


def bursty_example() -> DeliveryTrace:
    """The bundled ``bursty.trace``: a 2 s cycle, 100 ms bins.

    Phases per cycle: 0.5 s at 24 Mbit/s, 0.2 s outage (0), 0.5 s at 12,
    0.4 s at 6, 0.4 s at 12 -> mean 12.6 Mbit/s. Deterministic, no RNG.
    """
    mbps = [24] * 5 + [0] * 2 + [12] * 5 + [6] * 4 + [12] * 4
    return trace_from_rates([m * 1e6 for m in mbps], 100, name="bursty")


def bundled_trace(name: str, **kw: Any) -> DeliveryTrace:
    """Load ``netem/traces/<name>.trace`` (``constant-12mbps`` or ``bursty``)."""
    path = TRACE_DIR / f"{name}.trace"
    if not path.exists():
        avail = sorted(p.stem for p in TRACE_DIR.glob("*.trace"))
        raise ValueError(f"bundled_trace.name = {name!r}: must be one of {avail}")
    return DeliveryTrace.from_file(path, **kw)
