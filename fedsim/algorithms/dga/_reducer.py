"""DGA's reducer (R1-R2): per-round partial sums, the mean once all report."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fedsim.algorithms._kernels import check_finite, check_shape
from fedsim.algorithms.dga._core import DGAProtocolError, _check_int, dga_final_average
from fedsim.lazy import lazy_module

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch")

# ---------------------------------------------------------------- reducer


@dataclass(slots=True)
class _Partial:
    total: torch.Tensor  # float64
    clients: list[int]
    expected: int
    dtype: torch.dtype


class DGAServer:
    """The reducer (R1-R2): per-round partial sums, the mean once all report.

    ``num_clients`` is ``N``, the reports that complete a round;
    ``add(..., expected=n)`` overrides it per round (e.g. a subset reduced
    by a deadline, or the clients left after one was lost:
    docs/algorithms.md#dga-clients-that-leave-or-pause), and must then agree
    for the whole round.
    """

    def __init__(self, num_clients: int | None = None) -> None:
        if num_clients is not None:
            _check_int("num_clients", num_clients, 1)
        self.num_clients = num_clients
        self._open: dict[int, _Partial] = {}
        self._closed: set[int] = set()

    def check(
        self, round_id: int, client: int, m: torch.Tensor, expected: int | None = None
    ) -> int:
        """Raise unless :meth:`add` would accept ``m``; return the round's N."""
        n = self.num_clients if expected is None else expected
        if n is None:
            raise ValueError("Invalid expected: None (set num_clients or pass expected)")
        _check_int("expected", n, 1)
        _check_int("round_id", round_id, 0)
        what = f"update from client {client} for round {round_id}"
        refused = f"can't handle event 'add' ({what})"
        part = self._open.get(round_id)
        if round_id in self._closed:
            raise DGAProtocolError(f"{refused} when round={round_id} and state='complete'")
        if part is not None and client in part.clients:
            raise DGAProtocolError(
                f"{refused} when round={round_id} and state='collecting': "
                f"client {client} already reported"
            )
        if part is not None:
            if n != part.expected:
                raise ValueError(
                    f"Invalid expected: {n} (round {round_id} expects {part.expected})"
                )
            check_shape(part.total, m, what)
        if not m.is_floating_point():
            raise ValueError(f"Invalid {what}: dtype {m.dtype} (must be floating point)")
        check_finite(m, what)
        return n

    def add(
        self, round_id: int, client: int, m: torch.Tensor, *, expected: int | None = None
    ) -> torch.Tensor | None:
        """Add one client's ``m`` (R1); return ``mbar`` once the round is complete (R2)."""
        n = self.check(round_id, client, m, expected)
        part = self._open.get(round_id)
        if part is None:
            zero = torch.zeros(m.shape, dtype=torch.float64)
            part = self._open[round_id] = _Partial(zero, [], n, m.dtype)
        part.total = part.total + m.detach().to(torch.float64)
        part.clients.append(client)
        if len(part.clients) < part.expected:
            return None
        del self._open[round_id]
        self._closed.add(round_id)
        return (part.total / part.expected).to(part.dtype)

    def expected(self, round_id: int) -> int | None:
        """The reports that complete the open round ``round_id`` (None if not open)."""
        part = self._open.get(round_id)
        return None if part is None else part.expected

    def forget(self, client: int) -> list[tuple[int, torch.Tensor]]:
        """``client`` is gone: open rounds it has not reported need one report less.

        Returns ``(round, mbar)`` of every round this completes, in round
        order; a round left with no report at all is dropped.
        """
        done: list[tuple[int, torch.Tensor]] = []
        for t in sorted(self._open):
            part = self._open[t]
            if client in part.clients:
                continue
            part.expected -= 1
            if part.expected <= 0 or len(part.clients) < part.expected:
                continue
            del self._open[t]
            self._closed.add(t)
            done.append((t, (part.total / len(part.clients)).to(part.dtype)))
        return done

    @staticmethod
    def final_average(models: Sequence[torch.Tensor]) -> torch.Tensor:
        """C18: the mean of the clients' final models."""
        return dga_final_average(models)

    def state_dict(self) -> dict[str, Any]:
        """Open partial sums (deep copies) and the ids of completed rounds."""
        open_ = {t: dataclasses.asdict(p) for t, p in self._open.items()}
        return {"open": open_, "closed": sorted(self._closed)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore state saved by :meth:`state_dict`."""
        self._open = {t: _Partial(**copy.deepcopy(p)) for t, p in state["open"].items()}
        self._closed = set(state["closed"])
