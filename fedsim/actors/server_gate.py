"""The server's guard in front of its reader: sizes, budgets and the rejections' log.

What a peer can make the server spend is bounded before the server spends
it, and every refusal is counted:

* :func:`message_limit`: ``deploy.max_message_mb``, or by default the
  largest message the scenario's algorithm and model can send
  (:func:`fedsim.wire.codec.max_message_bytes` of the model's copies, a host's
  registration, a host's goodbye). The server's socket drops a larger frame
  unread; the codec refuses a larger message before parsing it.
* :class:`Gate`: each kind's header limit (checked on the raw frame), a
  budget of messages per second for every connection that has not
  registered (its key's, with CURVE), and a budget of the server's own
  time for every registered host (what decoding and handling its messages
  really took, measured): over it, its control messages wait (its clients'
  messages, each client rate-limited, go on).
* :class:`RecordBudget`: a host writes event-log records about its clients
  only as many as the server's own traffic with each client allows.
* :class:`Rejections`: every rejection counted by reason; the first
  ``deploy.max_logged_rejects`` per source and reason logged and written to
  ``events.jsonl``, the rest counted only, and summarised once at the end.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from fedsim.scenario import Scenario
from fedsim.wire.codec import (
    MAX_ENVELOPE_BYTES,
    MAX_HEADER_BYTES,
    header_bound,
    max_message_bytes,
)
from fedsim.wire.tensors import TensorSpec

__all__ = ["BYE_HEADER_BYTES", "Budget", "Gate", "RecordBudget", "Rejections",
           "hello_header_bytes", "message_limit"]

# the server actor's logger: its records keep their name wherever the code lives
log = logging.getLogger("fedsim.actors.server")

#: Header limit of a host's goodbye (its fidelity samples: two reservoirs of at
#: most 20,000 floats, 9 bytes each in msgpack, and its clock offsets).
BYE_HEADER_BYTES = 1024 * 1024

#: Bytes a host's registration may take per client it lists (an id and a sample
#: count, msgpack ints of at most 9 bytes each; 5 and 3 in practice).
HELLO_BYTES_PER_CLIENT = 18

#: Connections that have not registered whose budgets are kept (the oldest go).
MAX_SOURCES = 4096


def hello_header_bytes(clients: int) -> int:
    """Header limit of a registration listing ``clients`` clients."""
    return MAX_HEADER_BYTES + HELLO_BYTES_PER_CLIENT * clients


def message_limit(sc: Scenario, spec: TensorSpec, copies: int) -> int:
    """The largest message (bytes) the server and its hosts accept from each other.

    ``deploy.max_message_mb`` when the scenario sets it; by default the
    largest legitimate message: a task or update of ``copies`` copies of the
    model ``spec`` (envelope, header, spec and buffers), a registration
    listing every client, or a goodbye.
    """
    if sc.deploy.max_message_mb is not None:
        return int(sc.deploy.max_message_mb * 1e6)
    return max(max_message_bytes(spec, copies),
               MAX_ENVELOPE_BYTES + hello_header_bytes(sc.data.num_clients),
               MAX_ENVELOPE_BYTES + BYE_HEADER_BYTES)


class Budget:
    """A token bucket: ``rate`` per second on average, at most ``burst`` saved.

    :meth:`take` spends one token if there is one; :meth:`charge` spends any
    amount afterwards (a cost known only once paid) and may leave the bucket
    in debt, which :meth:`ready` then waits out.
    """

    __slots__ = ("burst", "rate", "t", "tokens")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate, self.burst = rate, burst
        self.tokens, self.t = burst, now

    def _refill(self, now: float) -> None:
        self.tokens = min(self.burst, self.tokens + max(0.0, now - self.t) * self.rate)
        self.t = max(self.t, now)

    def take(self, now: float) -> bool:
        """Whether one more unit is within the budget (and spend it)."""
        self._refill(now)
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True

    def ready(self, now: float) -> bool:
        """Whether the budget is not in debt."""
        self._refill(now)
        return self.tokens > 0.0

    def charge(self, now: float, cost: float) -> None:
        """Spend ``cost`` (it may go below zero)."""
        self._refill(now)
        self.tokens -= cost


class Gate:
    """Limits the server applies before it unpacks a message.

    Parameters
    ----------
    sc
        The scenario: ``deploy.max_unregistered_rate`` (messages per second
        from a source that has not registered, averaged over 5 s) and
        ``deploy.max_host_cpu`` (the share of the server's time one
        registered host's messages may take, averaged over 5 s).
    spec
        The model spec a client's messages carry (their header may hold it).
    allowed
        The allow-list (host name -> client ids): a key's registration may
        list only its ids, so its header limit follows from them.
    """

    def __init__(self, sc: Scenario, spec: TensorSpec,
                 allowed: Mapping[str, tuple[int, ...]] | None) -> None:
        d = sc.deploy
        self.unregistered_rate = d.max_unregistered_rate
        self.host_cpu = d.max_host_cpu
        self.header = header_bound(spec)
        self.hello = {name: hello_header_bytes(len(ids)) for name, ids in (allowed or {}).items()}
        self.hello_default = hello_header_bytes(sc.data.num_clients)
        self._sources: OrderedDict[str, Budget] = OrderedDict()
        #: messages taken from connections that had not registered (probes, hellos)
        self.unregistered_taken = 0
        self._hosts: dict[str, Budget] = {}

    def header_limit(self, kind: str, user: str | None) -> int:
        """The most bytes frame 1 of a ``kind`` message from ``user``'s key may hold."""
        if kind == "HostHello":
            return self.hello.get(user, self.hello_default) if user is not None \
                else self.hello_default
        if kind == "HostBye":
            return BYE_HEADER_BYTES
        return self.header

    def unregistered(self, source: str, now: float) -> bool:
        """Whether one more message from ``source`` (a key or a connection that has
        not registered) is within ``deploy.max_unregistered_rate``."""
        budget = self._sources.get(source)
        if budget is None:
            rate = self.unregistered_rate
            budget = self._sources[source] = Budget(rate, 5 * rate, now)
            if len(self._sources) > MAX_SOURCES:
                self._sources.popitem(last=False)
        else:
            self._sources.move_to_end(source)
        if not budget.take(now):
            return False
        self.unregistered_taken += 1
        return True

    def host_ready(self, host: str, now: float) -> bool:
        """Whether ``host`` has server time left (``deploy.max_host_cpu``)."""
        budget = self._hosts.get(host)
        if budget is None:
            rate = self.host_cpu
            budget = self._hosts[host] = Budget(rate, 5 * rate, now)
        return budget.ready(now)

    def charge(self, host: str, now: float, seconds: float) -> None:
        """``host``'s message took ``seconds`` of the server's time."""
        budget = self._hosts.get(host)
        if budget is not None:
            budget.charge(now, seconds)


#: Records a host may write per message the server sent a client (delivery or
#: drop, training start and end, a suspension's end, away and back, a
#: correction, a barrier's wait and resume, a warning: 9 at most today).
PER_MESSAGE_DOWN = 12
#: ... per message the server received from a client (the host's ``send``).
PER_MESSAGE_UP = 2
#: ... per change of a client's availability (``away`` or ``back``).
PER_CHANGE = 2
#: ... for each client and for the host itself before any traffic (a client
#: that starts away, a warning).
BASE = 8


@dataclass(slots=True)
class _Credit:
    left: int = BASE
    granted: int = BASE
    counted_to: float = 0.0  # availability changes counted up to this emulated time


@dataclass
class RecordBudget:
    """How many event-log records a host may still write about each client.

    Grants come from the server's own record of each client: the messages
    it sent the client and received from it, and the changes of its
    availability (the scenario's, which the server knows too). A host's
    records about itself (``client`` unset) are granted per message the
    server sent any of its clients. A record beyond its budget is refused
    (``bad_event``), however plausible it looks.
    """

    changes: Callable[[int, float, float], int]
    """``changes(client, t0, t1)``: availability changes in ``(t0, t1]``."""
    clients: dict[int, _Credit] = field(default_factory=dict)
    hosts: dict[str, _Credit] = field(default_factory=dict)

    def _credit(self, client: int) -> _Credit:
        c = self.clients.get(client)
        if c is None:
            c = self.clients[client] = _Credit()
        return c

    def _add(self, c: _Credit, n: int) -> None:
        c.left += n
        c.granted += n

    def sent(self, client: int, host: str) -> None:
        """The server sent ``client`` (on ``host``) a message."""
        self._add(self._credit(client), PER_MESSAGE_DOWN)
        h = self.hosts.get(host)
        if h is None:
            h = self.hosts[host] = _Credit()
        self._add(h, PER_MESSAGE_DOWN)

    def received(self, client: int) -> None:
        """The server received a message from ``client``."""
        self._add(self._credit(client), PER_MESSAGE_UP)

    def take(self, host: str, client: int | None, now: float) -> str | None:
        """Spend one record about ``client`` (None: the host); why not, if it may not."""
        if client is None:
            c = self.hosts.get(host)
            if c is None:
                c = self.hosts[host] = _Credit()
        else:
            c = self._credit(client)
            if c.left <= 0 and now > c.counted_to:
                self._add(c, PER_CHANGE * self.changes(client, c.counted_to, now))
                c.counted_to = now
        if c.left <= 0:
            who = f"client {client}" if client is not None else host
            return (f"a record beyond what the server's traffic with {who} allows "
                    f"({c.granted} records so far)")
        c.left -= 1
        return None


class Rejections:
    """Every rejection counted by reason; the first few per source and reason logged.

    ``counts`` is where the counts go (the run's record once it exists:
    :meth:`attach`). A rejection is logged at once, and handed to ``record``
    (the event log), only while its source has had fewer than ``cap`` of
    that reason; beyond, it is counted (``unlogged``, per source) and
    :meth:`summarise` logs one line per such source at the end.
    """

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.counts: dict[str, int] = {}
        self.unlogged: dict[str, int] = {}
        self._logged: dict[tuple[str, str], int] = {}
        self._pending: list[tuple[str, str, str]] = []
        self._record: Callable[[str, str, str], None] | None = None

    def attach(self, counts: dict[str, int], record: Callable[[str, str, str], None]) -> None:
        """From now on count into ``counts`` and record with ``record(source, reason, detail)``
        (the rejections logged before are recorded now)."""
        for reason, n in self.counts.items():
            counts[reason] = counts.get(reason, 0) + n
        self.counts = counts
        self._record = record
        pending, self._pending = self._pending, []
        for item in pending:
            record(*item)

    def add(self, source: str, reason: str, detail: str, what: str = "a message") -> None:
        """One rejection of ``what`` (a message, a connection) from ``source``."""
        self.counts[reason] = self.counts.get(reason, 0) + 1
        if source not in self.unlogged and len(self.unlogged) >= MAX_SOURCES:
            source = "other sources"
        key = (source, reason)
        n = self._logged.get(key, 0)
        if n >= self.cap:
            self.unlogged[source] = self.unlogged.get(source, 0) + 1
            return
        self._logged[key] = n + 1
        self.unlogged.setdefault(source, 0)
        detail = detail[:300]
        last = (f" (the last {reason} from {source} logged: the rest are counted, "
                "deploy.max_logged_rejects)" if n + 1 == self.cap else "")
        log.warning("rejected %s from %s: %s: %s%s", what, source, reason, detail, last)
        if self._record is None:
            self._pending.append((source, reason, detail))
        else:
            self._record(source, reason, detail)

    def not_logged(self) -> dict[str, int]:
        """Source -> rejections counted but not logged (for the summary)."""
        return {s: n for s, n in self.unlogged.items() if n}

    def summarise(self) -> list[str]:
        """One line per source with rejections not logged (logged now, once)."""
        lines = []
        for source, n in sorted(self.not_logged().items(), key=lambda kv: -kv[1]):
            reasons = sorted(r for (s, r), k in self._logged.items()
                             if s == source and k >= self.cap)
            lines.append(f"{n} more rejections from {source} ({', '.join(reasons)}) were "
                         "counted but not logged (deploy.max_logged_rejects)")
        for line in lines:
            log.warning("%s", line)
        return lines
