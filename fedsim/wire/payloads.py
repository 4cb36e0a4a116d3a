"""Each version's model crosses a link once: what a sender knows its receiver holds.

Every task of one version carries the same payload (the algorithm's model
of that version), and a client host serves many clients. So a sender puts
a version's model in the first task of that version it sends to a receiver
and leaves it out of the others (``Task.model`` None); the receiver keeps
the model and puts it back into each task as it decodes it. The server
does this towards each client host, a host towards its trainer. A round's
average (DGA's :class:`~fedsim.wire.messages.Average`, one per client) is
kept the same way, by round, in a record of its own, from the server to a
host and from the host to its trainer (an
:class:`~fedsim.wire.messages.Advance` carries the averages its trainer
does not hold yet and names the others in ``held``).

Both sides follow the same rule, in the order of one ordered connection,
so they agree without a word: the sender remembers the last
:data:`WINDOW` versions it sent a model for (:class:`SentVersions`), the
receiver keeps the models of the last ``2 * WINDOW`` versions it received
one for (:class:`HeldVersions`), both in the order of the sends (a version
sent again is the newest on both sides, whatever its number): twice as
many, so that the few tasks in flight when a connection starts again (both
sides then forget everything, each at its own moment) cannot leave the
receiver short of a model the sender believes it holds. A server's versions
only grow, but a host's clients ask for them at their own pace: behind a
slow link a client's round average comes after newer ones. A task that was received holds its own
model from then on, so a version leaving the window never takes the model
from a task still waiting in an inbox or on an emulated link. A connection
that starts again (a restarted server or host) starts both sides empty.

What an emulated link is charged does not change: a task without its
model costs its link ``meta.nbytes + model_cost(model)``
(:func:`fedsim.wire.codec.model_cost`), the bytes of the task with the
model in it.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from typing import TypeVar

from fedsim.wire.errors import WireError
from fedsim.wire.messages import Average, Task
from fedsim.wire.tensors import Model

M = TypeVar("M", Task, Average)

__all__ = ["WINDOW", "HeldVersions", "SentVersions"]

WINDOW = 2
"""Versions a sender counts on its receiver holding (the receiver keeps twice as many)."""


class SentVersions:
    """A sender's record of the versions whose model one receiver holds."""

    __slots__ = ("_sent",)

    def __init__(self, window: int = WINDOW) -> None:
        self._sent: deque[int] = deque(maxlen=window)

    def needs(self, version: int) -> bool:
        """Whether a task of ``version`` sent now must carry its model (then it is
        recorded as held: call this once per task, in the order of the sends)."""
        if version in self._sent:
            return False
        self._sent.append(version)
        return True

    def clear(self) -> None:
        """The receiver starts again with nothing held."""
        self._sent.clear()


class HeldVersions:
    """A receiver's models of the last versions it was sent (see the module's rule)."""

    __slots__ = ("_models", "window")

    def __init__(self, window: int = 2 * WINDOW) -> None:
        self.window = window
        self._models: OrderedDict[int, Model] = OrderedDict()

    def bind(self, msg: M) -> M:
        """``msg`` (a task, or an average) with its model: its own (then kept), or the
        one held for its version (an average's: its round).

        Raises
        ------
        WireError
            ``"unknown_payload"`` when it has no model and none is held for its
            key (the sender broke the rule; the message is refused).
        """
        key = msg.version if isinstance(msg, Task) else msg.round
        if msg.model is not None:
            self.keep(key, msg.model)
            return msg
        what = "version" if isinstance(msg, Task) else "round"
        return msg.with_model(self.model(key, f"{type(msg).__name__} of client {msg.client} "
                                              f"has no model and none is held for {what}"))

    def keep(self, key: int, model: Model) -> None:
        """Hold ``model`` as ``key``'s newest (the oldest key leaves past the window).

        A key sent again is the newest, as its sender counts it: keeping its
        first place let it leave here while the sender still counted on it
        (clients behind slow links ask for old rounds after newer ones)."""
        self._models[key] = model
        self._models.move_to_end(key)
        if len(self._models) > self.window:
            self._models.popitem(last=False)

    def model(self, key: int, what: str = "no model is held for") -> Model:
        """The model held for ``key``; ``WireError("unknown_payload")`` (``what`` and
        the key) when none is."""
        model = self._models.get(key)
        if model is None:
            raise WireError("unknown_payload", f"{what} {key}")
        return model

    def holds(self, version: int) -> bool:
        """Whether the model of ``version`` is held."""
        return version in self._models

    def clear(self) -> None:
        """Forget every model (the sender starts again)."""
        self._models.clear()
