"""Types of the algorithm registry (see conftest.py) and shared draw helpers.

Each algorithm module adds its entries in a ``registry_<name>.py`` file next
to this one, exporting ``ENTRIES: list[AlgoInfo]``; conftest.py gathers them
all into ``ALGO_DB``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from pydantic import ValidationError

from fedsim.algorithms import FedAsync, FedAvg
from fedsim.wire.messages import Update

Draw = Callable[[torch.Generator, torch.Tensor, int], list[Update]]
Apply = Callable[
    [Any, torch.Tensor, int, list[Update]],
    tuple["torch.Tensor | None", dict[str, Any]],
]


@dataclass(frozen=True)
class AlgoInput:
    """One valid construction.

    ``fresh_is_sync``: with zero staleness and a unit step (``sync_kwargs``
    of the entry) the rule returns the single client's model exactly.
    """

    kwargs: dict[str, Any]
    desc: str
    fresh_is_sync: bool = True


@dataclass(frozen=True)
class ErrorInput:
    kwargs: dict[str, Any]
    error: type[Exception]
    match: str


@dataclass(frozen=True)
class AlgoInfo:
    """A registry entry.

    ``draw(gen, x, version)`` makes one step's client results from the
    generator; ``apply(rule, x, version, results)`` runs the rule and returns
    ``(new x or None, info)``. Config classes leave both ``None`` and only
    take part in the construction tests.
    """

    name: str
    factory: Callable[..., Any]
    inputs: list[AlgoInput]
    error_inputs: list[ErrorInput]
    draw: Draw | None = None
    apply: Apply | None = None
    sync_kwargs: dict[str, Any] = field(default_factory=dict)

    def run(
        self,
        rule: Any,
        x: torch.Tensor,
        version: int,
        gen: torch.Generator,
        steps: int,
    ) -> tuple[list[tuple[torch.Tensor | None, dict[str, Any]]], torch.Tensor, int]:
        """Drive ``rule`` for ``steps`` steps, as a server would."""
        if self.draw is None or self.apply is None:
            raise TypeError(f"{self.name} is a config entry, not a server rule")
        trace = []
        for _ in range(steps):
            results = self.draw(gen, x, version)
            new, info = self.apply(rule, x, version, results)
            trace.append((new, info))
            if new is not None:
                x, version = new, version + 1
        return trace, x, version


def _randint(gen: torch.Generator, low: int, high: int) -> int:
    """Uniform integer in [low, high] from ``gen``."""
    return int(torch.randint(low, high + 1, (), generator=gen))


def _perturbed(gen: torch.Generator, x: torch.Tensor) -> torch.Tensor:
    noise = torch.randn(x.shape, generator=gen, dtype=x.dtype)
    return x + 0.5 * noise


def _draw_async(
    gen: torch.Generator, x: torch.Tensor, version: int
) -> list[Update]:
    """One pushed model with staleness uniform in [0, min(version, 5)]."""
    d = _randint(gen, 0, min(version, 5))
    return [
        Update.of(
            client=_randint(gen, 0, 9),
            base_version=version - d,
            params=_perturbed(gen, x),
            num_samples=_randint(gen, 1, 50),
        )
    ]


def _apply_async(
    rule: FedAsync, x: torch.Tensor, version: int, results: list[Update]
):
    (result,) = results
    return rule.aggregate(x, version, result)


def _draw_round(
    gen: torch.Generator, x: torch.Tensor, version: int
) -> list[Update]:
    """One round: 1-5 distinct clients, each with 1-50 samples."""
    k = _randint(gen, 1, 5)
    clients = torch.randperm(10, generator=gen)[:k].tolist()
    return [
        Update.of(
            client=c,
            base_version=version,
            params=_perturbed(gen, x),
            num_samples=_randint(gen, 1, 50),
        )
        for c in clients
    ]


def _apply_round(
    rule: FedAvg, x: torch.Tensor, version: int, results: list[Update]
):
    return rule.aggregate(x, results)


def _err(
    kwargs: dict[str, Any], match: str, error: type[Exception] = ValueError
) -> ErrorInput:
    return ErrorInput(kwargs, error, match)




def _refused(kwargs: dict[str, Any], key: str) -> ErrorInput:
    """``kwargs`` refused by the rule's config: pydantic names ``key`` and its value
    (``key.<member>`` for a union such as ``"paper" | float``)."""
    shown = re.escape(repr(kwargs[key]))
    return ErrorInput(kwargs, ValidationError,
                      rf"\n{key}(\.[^\n]*)?\n  [^\n]*input_value={shown}[,\]]")


def _configured(rule: Callable[..., Any], config: Callable[..., Any],
                *rule_keys: str) -> Callable[..., Any]:
    """A factory of ``rule`` from keyword arguments: the config's keys build ``config``,
    ``rule_keys`` (what the config does not hold, SCAFFOLD's ``total_clients``) go
    to ``rule`` beside it."""

    def factory(**kwargs: Any) -> Any:
        extra = {k: kwargs.pop(k) for k in rule_keys if k in kwargs}
        return rule(config(**kwargs), **extra)

    factory.__name__ = rule.__name__
    return factory
