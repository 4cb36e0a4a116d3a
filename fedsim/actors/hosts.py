"""The client hosts of one federation, as the server sees them.

A host registers with a :class:`~fedsim.messages.HostHello` naming the
clients it runs and their sample counts; it is refused if its fedsim
version or resolved-scenario hash differs from the server's, or if it
claims a client that does not exist or that another host already runs.
The table then answers "which host speaks for client ``c``" (the server
accepts a client's message only from that host), collects each host's
goodbye (its own measurements), and marks hosts lost when they exit.
Pure bookkeeping: no socket, no clock.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from fedsim.messages import HostBye, HostHello

__all__ = ["HostInfo", "HostTable"]

log = logging.getLogger(__name__)


@dataclass(slots=True)
class HostInfo:
    """One registered host."""

    name: str
    peer: bytes
    pid: int
    clients: tuple[int, ...]
    samples: dict[int, int]
    alive: bool = True
    bye: HostBye | None = None


class HostTable:
    """Registered hosts, which host owns which client, and their goodbyes."""

    def __init__(self, num_clients: int, fedsim_version: str, scenario_hash: str) -> None:
        self.num_clients = num_clients
        self.fedsim_version = fedsim_version
        self.scenario_hash = scenario_hash
        self.hosts: dict[str, HostInfo] = {}
        self._owner: dict[int, HostInfo] = {}
        self._by_peer: dict[bytes, HostInfo] = {}
        self.failures: list[dict[str, object]] = []

    def hello(self, peer: bytes, msg: HostHello) -> str | None:
        """Register a host; returns why it is refused, or None."""
        if msg.fedsim_version != self.fedsim_version:
            return (f"fedsim version {msg.fedsim_version} differs from the server's "
                    f"{self.fedsim_version}")
        if msg.scenario_hash != self.scenario_hash:
            return (f"resolved scenario hash {msg.scenario_hash[:12]} differs from the "
                    f"server's {self.scenario_hash[:12]}")
        if len(msg.samples) != len(msg.clients):
            return f"{len(msg.clients)} clients but {len(msg.samples)} sample counts"
        if peer in self._by_peer or msg.host in self.hosts:
            return f"host {msg.host!r} is already registered"
        bad = [c for c in msg.clients if not 0 <= c < self.num_clients]
        if bad:
            return f"clients {bad[:5]} do not exist (the scenario has {self.num_clients})"
        taken = [c for c in msg.clients if c in self._owner]
        if taken:
            return f"clients {taken[:5]} already run on {self._owner[taken[0]].name}"
        if len(set(msg.clients)) != len(msg.clients):
            return "a client is listed twice"
        if any(n < 1 for n in msg.samples):
            return "a client has no training samples"
        info = HostInfo(name=msg.host, peer=peer, pid=msg.pid, clients=tuple(msg.clients),
                        samples=dict(zip(msg.clients, msg.samples, strict=True)))
        self.hosts[msg.host] = info
        self._by_peer[peer] = info
        for c in msg.clients:
            self._owner[c] = info
        return None

    def owner(self, client: int) -> bytes | None:
        """The peer allowed to speak for ``client`` (None: nobody)."""
        info = self._owner.get(client)
        return info.peer if info is not None and info.alive else None

    def by_peer(self, peer: bytes) -> HostInfo | None:
        """The registered host behind ``peer``."""
        return self._by_peer.get(peer)

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
        """Mark a live host dead; return its clients (empty if it was not live)."""
        info = self.hosts.get(name)
        if info is None or not info.alive:
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
