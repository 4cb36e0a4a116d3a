"""The client hosts of one federation, as the server sees them.

A host registers with a :class:`~fedsim.wire.messages.HostHello` naming the
clients it runs and their sample counts; it is refused if its fedsim
version or resolved-scenario hash differs from the server's, if it
claims a client that does not exist or that another live host runs, or if
a count differs from the partition the scenario's seed determines (the
server's own record, when it is given one: the weight of a client's update
is its partition's size, never what a host says). With
an allow-list (CURVE), the host's name is the one its key was issued to
(the connection's authenticated ``user``) and it may claim only the client
ids listed for that key. A host that was lost may register again (a
restarted process): it takes its clients back; a live host whose connection
dropped registers again over its new one (:meth:`HostTable.reconnect`).
The table then answers "which host speaks for client ``c``" (the server
accepts a client's message only from that host), collects each host's
goodbye (its own measurements), and marks hosts lost when they exit.
Pure bookkeeping: no socket, no clock.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from fedsim.wire.messages import HostBye, HostHello
from fedsim.wire.payloads import SentVersions

__all__ = ["HostInfo", "HostTable", "RateLimit", "SeenSet"]

log = logging.getLogger(__name__)


class SeenSet:
    """The sequence numbers of a host's last ``size`` messages: a repeat is a replay.

    Exact repeats only: a number out of order or far ahead is taken (a host
    that numbers its messages oddly harms no one), so no message can lock a
    host's later, genuine ones out.
    """

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self._order: deque[int] = deque()
        self._set: set[int] = set()

    def add(self, seq: int) -> bool:
        """Record ``seq``; False if it was already among the recent ones."""
        if seq in self._set:
            return False
        self._order.append(seq)
        self._set.add(seq)
        if len(self._order) > self.size:
            self._set.discard(self._order.popleft())
        return True


class RateLimit:
    """A token bucket: ``rate`` messages per second on average, bursts of ``burst``."""

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate, self.burst = rate, burst
        self.tokens, self.t = burst, now

    def take(self, now: float) -> bool:
        """Whether one more message is within the limit (and count it)."""
        self.tokens = min(self.burst, self.tokens + (now - self.t) * self.rate)
        self.t = now
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True


@dataclass(slots=True)
class HostInfo:
    """One registered host."""

    name: str
    peer: bytes
    pid: int
    clients: tuple[int, ...]
    samples: dict[int, int]
    user: str | None = None
    boot_id: str = ""
    clock_offset: float = 0.0
    clock_uncertainty: float = 0.0
    last_seen: float = 0.0
    seen: SeenSet = field(default_factory=SeenSet, repr=False)
    #: messages that arrived after their emulated delivery time (not judged)
    late_arrivals: int = 0
    rate: RateLimit | None = field(default=None, repr=False)
    alive: bool = True
    bye: HostBye | None = None
    #: the versions whose model the host holds (each crosses to it once), and the
    #: rounds whose average it holds
    sent: SentVersions = field(default_factory=SentVersions, repr=False)
    sent_rounds: SentVersions = field(default_factory=SentVersions, repr=False)


class HostTable:
    """Registered hosts, which host owns which client, and their goodbyes."""

    def __init__(self, num_clients: int, fedsim_version: str, scenario_hash: str,
                 allowed: Mapping[str, tuple[int, ...]] | None = None,
                 partition: Sequence[int] | None = None) -> None:
        if partition is not None and len(partition) != num_clients:
            raise ValueError(f"Invalid partition: {len(partition)} sample counts for "
                             f"{num_clients} clients")
        self.num_clients = num_clients
        #: each client's training samples, as the scenario's seed partitions the data
        self.partition = None if partition is None else tuple(int(n) for n in partition)
        self.fedsim_version = fedsim_version
        self.scenario_hash = scenario_hash
        self.allowed = None if allowed is None else {k: frozenset(v) for k, v in allowed.items()}
        self.hosts: dict[str, HostInfo] = {}
        self._owner: dict[int, HostInfo] = {}
        self._by_peer: dict[bytes, HostInfo] = {}
        self.failures: list[dict[str, object]] = []

    def hello(self, peer: bytes, msg: HostHello, user: str | None = None) -> str | None:
        """Register a host; returns why it is refused, or None.

        ``user`` is the name the connection authenticated as (None without
        an allow-list).
        """
        if self.allowed is not None:
            if user is None or user not in self.allowed:
                return "this connection did not authenticate with an allowed key"
            if msg.host != user:
                return f"the key is {user}'s, but the host calls itself {msg.host!r}"
            foreign = [c for c in msg.clients if c not in self.allowed[user]]
            if foreign:
                return (f"clients {foreign[:5]} are not on the allow-list for {user} "
                        "(its key may speak only for its own ids)")
        if msg.fedsim_version != self.fedsim_version:
            return (f"fedsim version {msg.fedsim_version} differs from the server's "
                    f"{self.fedsim_version}")
        if msg.scenario_hash != self.scenario_hash:
            return (f"resolved scenario hash {msg.scenario_hash[:12]} differs from the "
                    f"server's {self.scenario_hash[:12]}: the server and every host must "
                    "load the same scenario with the same --set (fedsim check FILE --set ... "
                    "on each prints what it resolves to)")
        if len(msg.samples) != len(msg.clients):
            return f"{len(msg.clients)} clients but {len(msg.samples)} sample counts"
        old = self.hosts.get(msg.host)
        if (old is not None and old.alive) or (
                peer in self._by_peer and self._by_peer[peer].alive):
            return f"host {msg.host!r} is already registered"
        bad = [c for c in msg.clients if not 0 <= c < self.num_clients]
        if bad:
            return f"clients {bad[:5]} do not exist (the scenario has {self.num_clients})"
        taken = [c for c in msg.clients if c in self._owner and self._owner[c].alive]
        if taken:
            return f"clients {taken[:5]} already run on {self._owner[taken[0]].name}"
        if len(set(msg.clients)) != len(msg.clients):
            return "a client is listed twice"
        if any(n < 1 for n in msg.samples):
            return "a client has no training samples"
        if self.partition is not None:
            wrong = [(c, n) for c, n in zip(msg.clients, msg.samples, strict=True)
                     if n != self.partition[c]]
            if wrong:
                c, n = wrong[0]
                return (f"client {c} registered {n} training samples, but the scenario's "
                        f"partition gives it {self.partition[c]} ({len(wrong)} of "
                        f"{len(msg.clients)} counts differ; the data a host holds is "
                        "built from the scenario's seed)")
        info = HostInfo(name=msg.host, peer=peer, pid=msg.pid, clients=tuple(msg.clients),
                        samples=dict(zip(msg.clients, msg.samples, strict=True)), user=user,
                        boot_id=msg.boot_id, clock_offset=msg.clock_offset,
                        clock_uncertainty=msg.clock_uncertainty)
        if old is not None:  # a lost host back (restarted): its old entry goes
            self._by_peer.pop(old.peer, None)
        self.hosts[msg.host] = info
        self._by_peer[peer] = info
        for c in msg.clients:
            self._owner[c] = info
        return None

    def reconnect(self, peer: bytes, msg: HostHello, user: str | None) -> HostInfo | None:
        """A live host's registration again, over a new connection: the host, moved to it.

        Its connection dropped and came back, and the server's ROUTER gave the
        new one a new routing id: the same process (pid and boot id), the same
        key and clients, from another peer. None: not that (a hello to refuse
        or to register as usual).
        """
        old = self.hosts.get(msg.host)
        if (old is None or not old.alive or old.peer == peer or peer in self._by_peer
                or old.user != user or old.pid != msg.pid or old.boot_id != msg.boot_id
                or tuple(msg.clients) != old.clients or not self.is_current(msg)):
            return None
        self._by_peer.pop(old.peer, None)
        old.peer = peer
        self._by_peer[peer] = old
        old.sent.clear()  # what was in flight on the old connection may be lost
        old.sent_rounds.clear()
        return old

    def is_current(self, msg: HostHello) -> bool:
        """Whether ``msg`` comes from this server's fedsim version and scenario."""
        return (msg.fedsim_version == self.fedsim_version
                and msg.scenario_hash == self.scenario_hash)

    def repeat(self, peer: bytes, msg: HostHello, user: str | None) -> HostInfo | None:
        """A live host's registration again over the same connection, from the same
        process (its session started over: the server it first registered with was
        restarted, and the host registers its clients again). None: not that."""
        old = self.hosts.get(msg.host)
        if (old is None or not old.alive or old.peer != peer or old.user != user
                or old.pid != msg.pid or old.boot_id != msg.boot_id
                or tuple(msg.clients) != old.clients or not self.is_current(msg)):
            return None
        old.sent.clear()  # its session starts over
        old.sent_rounds.clear()
        return old

    def is_restart(self, old: HostInfo, msg: HostHello) -> bool:
        """Whether ``msg`` is ``old``'s process started again: a new pid, the
        same clients, and a hello this server would accept (a repeated or
        malformed hello from a live host is refused, and the host stays)."""
        return (msg.pid != old.pid and set(msg.clients) == set(old.clients)
                and len(msg.samples) == len(msg.clients)
                and msg.fedsim_version == self.fedsim_version
                and msg.scenario_hash == self.scenario_hash)

    def owner(self, client: int) -> bytes | None:
        """The peer allowed to speak for ``client`` (None: nobody)."""
        info = self._owner.get(client)
        return info.peer if info is not None and info.alive else None

    def by_peer(self, peer: bytes) -> HostInfo | None:
        """The registered host behind ``peer``."""
        return self._by_peer.get(peer)

    def owner_info(self, client: int) -> HostInfo | None:
        """The live host running ``client``."""
        info = self._owner.get(client)
        return info if info is not None and info.alive else None

    def silent(self, now: float, timeout: float) -> list[str]:
        """Live hosts not heard from for more than ``timeout`` seconds."""
        return [h.name for h in self.hosts.values()
                if h.alive and h.bye is None and now - h.last_seen > timeout]

    def registered(self) -> dict[int, int]:
        """Client id -> sample count over every live host, sorted by id."""
        out = {c: n for h in self.hosts.values() if h.alive for c, n in h.samples.items()}
        return dict(sorted(out.items()))

    def goodbye(self, peer: bytes, msg: HostBye) -> HostInfo | None:
        """Note a host's goodbye (its measurements); None if the peer is unknown."""
        info = self._by_peer.get(peer)
        if info is None or info.bye is not None:
            return None
        info.bye = msg
        return info

    def lose(self, name: str, why: str, t: float) -> list[int]:
        """Mark a live host dead; return its clients (empty if it was not live).

        A host that said goodbye and then ended is not lost: its process
        exiting is how the run ends for it (whatever its exit code, its
        measurements came with the goodbye).
        """
        info = self.hosts.get(name)
        if info is None or not info.alive:
            return []
        if info.bye is not None:
            info.alive = False
            log.debug("client host %s ended after its goodbye (%s)", name, why)
            return []
        info.alive = False
        self.failures.append({"host": name, "reason": why, "t": t})
        log.error("client host %s lost (%s); its %d clients are gone", name, why,
                  len(info.clients))
        return list(info.clients)

    @property
    def any_alive(self) -> bool:
        """Whether any registered host is still alive."""
        return any(h.alive for h in self.hosts.values())

    def waiting_for_bye(self) -> list[str]:
        """Live hosts that have not said goodbye yet."""
        return [h.name for h in self.hosts.values() if h.alive and h.bye is None]

    def byes(self) -> list[HostBye]:
        """Every goodbye received."""
        return [h.bye for h in self.hosts.values() if h.bye is not None]
