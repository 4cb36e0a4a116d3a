"""The server's copies of its clients' links, and its check of the send times they claim.

Two parts of :class:`~fedsim.actors.server.Server`, each owning its state.

:class:`ClientLinks`: every client's uplink (the server delivers a client's
messages through it), a copy of every client's downlink (the same netem link
its host makes, fed the same messages at the same send times, so it
schedules each as the host's will: the server's record of when a task
reached its client), every client's availability, the clients whose
messages are admitted, and the bottlenecks shared by all clients. A link or
an availability is made on first use, keyed by its client: when it is made
does not change what it draws.

:class:`SendTimes`: the window a message's claimed send time must fall in,
and the corrections counted against the host that claimed one outside it.
"""

from __future__ import annotations

from collections.abc import Iterable

from fedsim.scenario.network import NetPlan
from netem.availability import Availability
from netem.fidelity import FidelityMonitor
from netem.link import Bottleneck, Link

__all__ = ["ClientLinks", "SendTimes"]


class ClientLinks:
    """The server's side of every client's links (see the module)."""

    def __init__(self, plan: NetPlan) -> None:
        self.plan = plan
        #: clients whose messages are admitted (registered), and their uplinks' kinds
        #: in the order of the clients (a set's order is random)
        self.admitted: set[int] = set()
        self.up_kinds: dict[str, None] = {}
        #: uplinks made so far (on a client's first message)
        self.links: dict[int, Link] = {}
        #: copies of the clients' downlinks (None: no longer known to match the host's)
        self.down_links: dict[int, Link | None] = {}
        self.availability: dict[int, Availability] = {}
        #: the server's downlink bottleneck (None: none), and its uplink one (made
        #: when the federation starts)
        self.egress = plan.bottleneck("down")
        self.shared_up: Bottleneck | None = None

    def start(self) -> None:
        """The federation starts: the uplinks' shared bottleneck begins."""
        self.shared_up = self.plan.bottleneck("up")

    def admit(self, cid: int) -> None:
        """Admit ``cid``'s messages; its uplink is made when the first one arrives."""
        self.admitted.add(cid)
        self.up_kinds.setdefault(self.plan.kind(cid, "up"))

    def uplink(self, cid: int) -> Link:
        """``cid``'s uplink, made on first use. 10,000 links made at the start took
        0.24 s, and most clients of a cross-device population never send."""
        link = self.links.get(cid)
        if link is None:
            link = self.links[cid] = self.plan.make_link(cid, "up", self.shared_up)
        return link

    def down_delivery(self, cid: int, now: float, nbytes: int) -> float | None:
        """When ``cid``'s downlink delivers a message of ``nbytes`` sent now.

        None when that is no longer known (the host's connection dropped, a
        send failed: what reached the host is not known, until the host
        registers again) or the link drops the message: then the record
        takes the least the link can take.
        """
        if cid in self.down_links:
            link = self.down_links[cid]
        else:
            link = self.down_links[cid] = self.plan.make_link(cid, "down")
        if link is None:
            return None
        d = link.schedule(now, nbytes)
        return None if d.dropped else d.t_deliver

    def unknown(self, clients: Iterable[int]) -> None:
        """What reaches these clients' hosts is no longer known (their connection
        dropped; their links were made afresh where the copies do not follow)."""
        for c in clients:
            self.down_links[c] = None

    def afresh(self, clients: Iterable[int]) -> None:
        """These clients' hosts make their downlinks afresh (a new process): so do
        the copies."""
        for c in clients:
            self.down_links.pop(c, None)

    def availability_of(self, cid: int) -> Availability:
        """``cid``'s availability, made on first use (its own stream, drawn lazily)."""
        av = self.availability.get(cid)
        if av is None:
            av = self.availability[cid] = self.plan.availability(cid)
        return av

    def availability_changes(self, cid: int, t0: float, t1: float) -> int:
        """How often ``cid``'s availability changes in ``(t0, t1]`` (emulated s)."""
        av, n, t = self.availability_of(cid), 0, t0
        while n < 100_000:
            t, _ = av.next_change(t)
            if t > t1:
                break
            n += 1
        return n

    def away_between(self, cid: int, t_send: float, t_now: float, policy: str) -> str | None:
        """Why the in-flight ``policy`` loses a message of an away client (None: it
        does not)."""
        if policy == "held":
            return None
        av = self.availability_of(cid)
        if not av.is_available(t_now):
            return f"away ({policy})"
        if policy == "reset" and av.next_change(t_send)[0] <= t_now:
            return "connection reset"
        return None


class SendTimes:
    """The window a claimed send time must fall in, and the corrections made.

    A host's emulated clock agrees with the server's up to its clock
    uncertainty, and a message cannot have been in transit longer than
    ``deploy.max_transit_ms``: a claim outside ``[now - max transit, now +
    uncertainty]`` is clamped into it, counted against its host (which fails
    the verdict by name) and the message is not judged for lateness. An
    update's claim is also bounded below by the server's record of its task
    (the server raises it and counts it here, as ``before_record``).
    """

    def __init__(self, monitor: FidelityMonitor, dilation: float, max_transit_ms: float) -> None:
        self.monitor = monitor
        self.dilation = dilation
        self.max_transit = max_transit_ms / 1e3
        #: messages whose claimed send time was corrected, and why
        self.clamped = 0
        self.corrections = {"out_of_window": 0, "before_record": 0}

    def bounded(self, host: str, uncertainty: float, claimed: float, now: float
                ) -> tuple[float, bool]:
        """``claimed``, clamped into the window (and whether it was)."""
        hi = now + uncertainty / self.dilation + 1e-6
        lo = now - self.max_transit / self.dilation
        if lo <= claimed <= hi:
            return claimed, False
        self.corrected(host, "out_of_window")
        return min(max(claimed, lo), hi), True

    def corrected(self, host: str, why: str) -> None:
        """Count one corrected send time against ``host`` (it fails the verdict by name)."""
        self.clamped += 1
        self.corrections[why] += 1
        self.monitor.record_clamped(host=host)
