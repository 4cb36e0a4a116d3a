"""Fixtures of the reproduction tests (helpers: ``sweeps``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread() -> Iterator[None]:
    """Train in-process on one thread, as a torch worker process does.

    The smoke runs train in this process (``fedsim.testing.federation``); torch's
    thread pool would spin against the client hosts of the real runs.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
