"""What a Flower app's code can ask of the fedsim run it is in (read by :mod:`fedsim.flower`).

A trainer calls a ClientApp handler for one client at a time and says which
(:func:`serving`), with that client's data; the server process and each
trainer say which scenario the run is (:func:`set_scenario`), resolved with
its overrides. Flower is not needed here.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fedsim.scenario import Scenario

__all__ = ["current", "scenario", "serving", "set_scenario"]

_current: tuple[int, Any, Any] | None = None
_scenario: Scenario | None = None


def current() -> tuple[int, Any, Any] | None:
    """The client whose ClientApp handler runs now in this process: (id, x, y)."""
    return _current


@contextmanager
def serving(client: int, x: Any, y: Any) -> Iterator[None]:
    """While inside, :func:`current` is ``client`` with its data ``x``, ``y``."""
    global _current
    _current = (client, x, y)
    try:
        yield
    finally:
        _current = None


def set_scenario(sc: Scenario | None) -> None:
    """The run this process serves (its resolved :class:`~fedsim.scenario.Scenario`)."""
    global _scenario
    _scenario = sc


def scenario() -> Scenario | None:
    """The run's scenario, or None outside a fedsim run."""
    return _scenario
