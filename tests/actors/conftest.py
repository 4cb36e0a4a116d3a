"""Fixtures of the actor tests (helpers: ``actor_scenarios``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread() -> Iterator[None]:
    """Train on one thread, as a torch worker process does (``torch.set_num_threads(1)``).

    In-process training on every core's thread pool spins against the other
    tests and processes on a small machine: a 16-unit MLP step went from
    under a millisecond to tens of milliseconds on 2 busy cores.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
