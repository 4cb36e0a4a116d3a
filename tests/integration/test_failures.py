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
    # 3 emulated s: about 150 updates at 4 in flight, each client picked many times
    code, out, err = finish(fedsim("run", str(path), "--out", str(run), "--dilation", "2",
                                   "--no-plots", "--set", "run.time_budget=3",
                                   env={**os.environ, "FEDSIM_FAIL_TRAIN": "0,5"}))
    assert code == 0, err[-2000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed"
    # the lost work is in the results, by client and cause, and in what the CLI prints
    assert summary["lost_work"]["by_client"] == {"0": {"error": 1}, "5": {"error": 1}}
    assert "lost work        2 client run(s) failed (error 2); dropped: client(s) 0,5" in out
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


def test_hosts_started_before_the_data_go_when_the_data_cannot_be_built(tmp_path: Path) -> None:
    """``fedsim run`` starts its client hosts first, while it builds the data: a
    dataset it cannot load ends the run with the reason, and no host outlives it."""
    import psutil

    path = write_scenario(tmp_path, "")
    # a directory without the MNIST files (a path that is not there is refused on load)
    (tmp_path / "no-mnist").mkdir()
    text = path.read_text().replace(
        'dataset = "synthetic"',
        f'dataset = "mnist"\npartition = "iid"\npath = "{tmp_path / "no-mnist"}"')
    path.write_text(text)
    proc = fedsim("run", str(path), "--out", str(tmp_path / "run"))
    code, _, err = finish(proc)
    assert code == 3, err
    assert f"not found under {tmp_path / 'no-mnist'}" in err, err
    hosts = [p for p in psutil.process_iter(["cmdline"])
             if "fedsim.actors.host" in " ".join(p.info["cmdline"] or [])
             and str(tmp_path) in " ".join(p.info["cmdline"] or [])]
    assert hosts == [], hosts
