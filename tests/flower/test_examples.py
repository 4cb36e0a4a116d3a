"""The Flower examples as docs/flower.md runs them: every scenario loads, and the
LAN and asynchronous apps run on fedsim through the real path (shortened)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

pytest.importorskip("flwr")
pytestmark = pytest.mark.flower

from fedsim import api  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "flower"


@pytest.mark.parametrize("name", ["lan.toml", "wifi.toml", "async.toml"])
def test_every_example_scenario_loads(name: str) -> None:
    sc = api.load(EXAMPLES / name)
    assert sc.algorithm.name == "flower"


def test_the_lan_example_runs_its_rounds(tmp_path: Path) -> None:
    sc = api.load(EXAMPLES / "lan.toml", {"algorithm.run_config": {"num-server-rounds": 2}})
    r = api.run(sc, out=tmp_path / "lan", plots=False)
    assert r.summary["stop_reason"] == "server_app_finished"
    assert r.summary["rounds"] == 2
    assert r.summary["updates"] == 20                    # 10 of 20 clients a round
    acc = r.summary.final_accuracy
    assert acc is not None
    assert math.isfinite(acc)


def test_the_async_example_shows_the_staleness_of_five_in_flight(tmp_path: Path) -> None:
    sc = api.load(EXAMPLES / "async.toml", {"algorithm.run_config": {"updates": 30}})
    r = api.run(sc, out=tmp_path / "async", plots=False)
    assert r.summary["stop_reason"] == "server_app_finished"
    assert r.summary["updates"] >= 30
    # five clients in flight, each reply mixed in as it comes: a reply finds models
    # that replies before it made meanwhile (0 would be a synchronous strategy)
    assert 1.0 <= r.summary["staleness"]["mean"] <= 8.0
