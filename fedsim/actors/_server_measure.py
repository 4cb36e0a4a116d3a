"""What the server actor reports of a run's faithfulness: netem's verdict and the totals.

:class:`RunMeasures` is a part of :class:`~fedsim.actors.server.Server`:
it keeps nothing of its own and is given, once, the parts it reads. It
merges the server's own records (its uplinks' deliveries and losses,
corrected send times, by host) with what every client host reported in its
goodbye (downlinks, compute, clock offsets) into the fidelity verdict and
the summary's totals.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

from fedsim.actors.client_links import ClientLinks, SendTimes
from fedsim.actors.hosts import HostTable
from fedsim.actors.server_gate import Gate, Rejections
from fedsim.scenario.network import NetPlan
from netem.fidelity import FidelityMonitor
from netem.lossprocess import LossStats

__all__ = ["RunMeasures"]

# the server actor's logger: its records keep their name wherever the code lives
log = logging.getLogger("fedsim.actors.server")


class RunMeasures:
    """The fidelity verdict and the run's totals, read from the server's parts."""

    def __init__(self, monitor: FidelityMonitor, plan: NetPlan, links: ClientLinks,
                 hosts: HostTable, send_times: SendTimes, rejections: Rejections,
                 gate: Gate) -> None:
        self.monitor = monitor
        self.plan = plan
        self.client_links = links
        self.hosts = hosts
        self.send_times = send_times
        self.rejections = rejections
        self.gate = gate

    def totals(self) -> dict[str, Any]:
        """The hosts' reported counts and the server's own, for the summary."""
        byes = self.hosts.byes()
        hosts = self.hosts.hosts.values()
        return {"overruns": sum(b.overruns for b in byes),
                "compute_deadlines": sum(b.compute_deadlines for b in byes),
                "rejected": sum(b.rejected for b in byes),
                "clamped": self.send_times.clamped,
                "corrections": dict(self.send_times.corrections),
                "late_arrivals": sum(h.late_arrivals for h in hosts),
                "unlogged": self.rejections.not_logged(),
                "unregistered_messages": self.gate.unregistered_taken,
                "hosts": {"registered": len(self.hosts.hosts), "reported": len(byes),
                          "lost": [h.name for h in hosts if not h.alive],
                          "unreported": [h.name for h in hosts if h.bye is None]}}

    def fidelity(self, began: bool) -> dict[str, Any]:
        """netem's verdict over the server's uplinks and every host's downlinks and compute
        (``began``: the federation started, with something to judge).

        Merged into a copy, so it can be called while the run goes on; hosts
        that never said goodbye (lost) are named, since the verdict then
        covers only the others.
        """
        if not began:
            return {"verdict": "fail", "reasons": ["the run never started"],
                    "lateness_ms": {"p50": None, "p99": None, "max": None},
                    "suggested_dilation": None}
        mon = copy.deepcopy(self.monitor)
        for kind in self.client_links.up_kinds:  # every registered client's, used or not
            mon.record_loss(kind, LossStats())
        for cid, link in self.client_links.links.items():
            mon.record_loss(self.plan.kind(cid, "up"), link.loss_stats)
        for bye in self.hosts.byes():
            try:
                mon.merge(bye.fidelity)
            except (KeyError, TypeError, ValueError) as exc:
                log.warning("host %s: unreadable fidelity data (%s)", bye.host, exc)
        for h in self.hosts.hosts.values():
            offsets = [h.clock_offset, *(h.bye.clock_offsets if h.bye is not None else ())]
            drift = max(abs(o - h.clock_offset) for o in offsets)
            mon.record_clock(h.name, h.clock_offset, h.clock_uncertainty + drift)
        report = mon.report()
        for h in self.hosts.hosts.values():  # the fastest probe's round trip at registration
            report["clocks"][h.name]["rtt_ms"] = 2e3 * h.clock_uncertainty
            report["clocks"][h.name]["late_arrivals"] = h.late_arrivals
            report["clocks"][h.name].setdefault("send_times_corrected", 0)
        report["hosts_reported"] = len(self.hosts.byes())
        report["hosts_registered"] = len(self.hosts.hosts)
        lost = [h.name for h in self.hosts.hosts.values() if h.bye is None]
        if lost:
            report["hosts_unreported"] = lost
        return report
