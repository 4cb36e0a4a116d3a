"""Clients whose training fails: the server drops them and the run goes on, or ends
as failed when none is left, instead of waiting on them until its time budget."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from .conftest import fedsim, finish, write_scenario

pytestmark = pytest.mark.timeout(180)


def _events(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]


def test_failing_clients_are_dropped_and_the_rest_train(tmp_path: Path) -> None:
    path = write_scenario(tmp_path, '[algorithm]\nname = "fedasync"\nconcurrency = 4\n')
    run = tmp_path / "run"
    code, _, err = finish(fedsim("run", str(path), "--out", str(run), "--dilation", "2",
                                 "--no-plots", env={**os.environ, "FEDSIM_FAIL_TRAIN": "0,5"}))
    assert code == 0, err[-2000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed"
    ev = _events(run)
    failed = {e["client"] for e in ev if e["ev"] == "client_failed"}
    assert failed == {0, 5}
    assert all("injected training failure" in e["reason"] for e in ev if e["ev"] == "client_failed")
    t_fail = max(e["t"] for e in ev if e["ev"] == "client_failed")
    late = [e for e in ev if e["ev"] == "train_start" and e["client"] in failed and e["t"] > t_fail]
    assert late == []  # no work is sent to a client that failed
    assert summary["updates"] > 20


def test_a_run_whose_every_client_fails_ends_failed_at_once(tmp_path: Path) -> None:
    path = write_scenario(tmp_path, '[algorithm]\nname = "fedavg"\n')
    run = tmp_path / "run"
    env = {**os.environ, "FEDSIM_FAIL_TRAIN": "all"}
    code, _, err = finish(fedsim("run", str(path), "--out", str(run), "--no-plots",
                                 "--set", "run.time_budget=600", env=env), timeout=120)
    assert code == 3, err[-2000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"].startswith("failed")
    assert "every client failed" in summary["status"]
    assert summary["emulated_seconds"] < 10  # not the 600 s budget
    assert "injected training failure" in err
