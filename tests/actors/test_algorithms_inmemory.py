"""Every seed algorithm through the real actors, in one process on virtual time.

The same checks as the multi-process smoke tier (tests/integration), run
over the in-memory network (fedsim.testing.federation): the server and client
hosts are the real actors, training is real torch, only the sockets and the
wall clock are replaced.
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import pytest

from fedsim.scenario import apply_overrides, parse
from fedsim.testing.federation import run_in_memory

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from integration.conftest import SMALL
from integration.test_algorithms import CASES, check_run

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("case", sorted(CASES))
def test_algorithm_learns_in_memory(tmp_path: Path, case: str) -> None:
    # DGA trains every client without pause (a 4 ms step after a 4 ms step): at
    # 2.5 s its runs reach 0.59 (best; 119 aggregations) in 6.4-7.6 s of wall,
    # where 5.0 s cost 12-13 s
    sets = ["run.time_budget=2.5" if case.startswith("dga") else "run.time_budget=5.0"]
    if case == "asyncfeded":
        sets += ['devices.distribution="lognormal"', "devices.spread=0.002"]
    if case.startswith("deltasgd"):
        sets += ['client.optimizer="deltasgd"']
    raw = apply_overrides(tomllib.loads(SMALL + CASES[case]), sets)
    sc = parse(raw, case)
    run = run_in_memory(sc, tmp_path / "run", hosts=2, dilation=1.0)
    check_run(case, run.summary, run.events())
