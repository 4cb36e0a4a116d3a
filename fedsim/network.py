"""The seam between a scenario's ``[network]`` section and netem's links.

Each client has two links, ``up`` (client -> server) and ``down``. They are
applied on the receiving side: a message carries its emulated send time, and
the receiver holds it until the link says it arrives, so the real transfer
over loopback is hidden inside the emulated delay.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from fedsim.scenario import LinkConfig, Scenario

__all__ = ["Delivery", "LinkModel", "make_link"]


@dataclass(frozen=True, slots=True)
class Delivery:
    """When (and whether) a message arrives."""

    t_deliver: float
    dropped: bool = False
    reason: str = ""


class LinkModel(Protocol):
    """One direction of one client's connection."""

    def schedule(self, t_send: float, nbytes: int) -> Delivery:  # pragma: no cover
        """Emulated delivery of ``nbytes`` sent at ``t_send``."""
        ...


class ConstantLink:
    """A constant one-way delay with FIFO delivery (a TCP stream never reorders)."""

    def __init__(self, cfg: LinkConfig) -> None:
        self.delay = cfg.delay
        self._last = 0.0

    def schedule(self, t_send: float, nbytes: int) -> Delivery:
        t = max(self._last, t_send + self.delay)
        self._last = t
        return Delivery(t)


def make_link(sc: Scenario, client: int, direction: str) -> LinkModel:
    """The link model of ``client`` in ``direction`` ("up" or "down")."""
    if direction not in ("up", "down"):
        raise ValueError(f"Invalid direction: {direction!r} (up or down)")
    cfg = sc.network.up if direction == "up" else sc.network.down
    return ConstantLink(cfg)
