"""A run that stops after a checkpoint continues from it: the counters, the model, the logs."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from actor_scenarios import build, of

from fedsim.testing.federation import InMemoryRun, run_in_memory

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("algorithm", [
    {"name": "fedasync", "concurrency": 4},
    {"name": "fedavg", "fraction": 0.5},
    {"name": "scaffold", "fraction": 0.5},
])
def test_a_stopped_run_resumes_from_its_last_checkpoint(tmp_path: Path,
                                                       algorithm: dict[str, object]) -> None:
    sc = build(algorithm, run={"time_budget": 4.0, "checkpoint_every": 3,
                               "checkpoint_seconds": 0})
    run_dir = tmp_path / "run"

    async def crash(run: InMemoryRun) -> None:
        await asyncio.sleep(2.0)
        assert run.server is not None
        run.server.request_stop("interrupted")

    first = run_in_memory(sc, run_dir, hosts=2, during=crash)
    assert first.summary["status"] == "interrupted"
    checkpoints = of(first.events(), "checkpoint")
    assert checkpoints, "no checkpoint was written"
    last = checkpoints[-1]
    lost_after = [e for e in of(first.events(), "aggregate") if e["t"] > last["t"]]

    second = run_in_memory(sc, run_dir, hosts=2, resume=True)
    s = second.summary
    assert s["status"] == "completed", s["status"]
    assert s["emulated_seconds"] == pytest.approx(4.0, abs=0.1)
    (resumed,) = s["resumed"]
    assert resumed["t"] == pytest.approx(last["t"])
    assert resumed["updates"] == last["updates"]
    events = second.events()
    # the log was cut back to the checkpoint: what came after it is gone, once
    assert not [e for e in events if e["ev"] == "end" and e["status"] == "interrupted"]
    (resume_ev,) = of(events, "resume")
    before = [e for e in events if e is not resume_ev and e["t"] > last["t"]
              and events.index(e) < events.index(resume_ev)]
    assert before == [], before[:3]
    # what was applied after the checkpoint was lost and done again, not kept twice
    if lost_after:
        assert len(of(events, "aggregate", version=lost_after[0]["version"])) == 1
    # the model's version counts on across the resume, strictly
    versions = [e["version"] for e in of(events, "aggregate")]
    assert versions == sorted(versions)
    assert len(set(versions)) == len(versions)
    assert s["updates"] > last["updates"]
    if algorithm["name"] != "fedasync":  # round numbers go on, they do not start over
        rounds = [e["round"] for e in of(events, "aggregate")]
        assert rounds == sorted(rounds)
        assert len(set(rounds)) == len(rounds)
    assert of(events, "aggregate")[-1]["t"] > 3.0


@pytest.mark.parametrize("algorithm", [
    {"name": "fedasync", "concurrency": 4},
    {"name": "fedavg", "fraction": 0.5},
    {"name": "scaffold", "fraction": 0.5},
])
def test_a_resumed_server_takes_back_the_hosts_that_kept_running(
        tmp_path: Path, algorithm: dict[str, object]) -> None:
    """The server dies mid-run and is resumed from its checkpoint while its hosts run
    on: each host hears the new server's incarnation, registers its clients again (its
    worker, and the clients' algorithm state in it, kept), and the run completes."""
    sc = build(algorithm, run={"time_budget": 5.0, "checkpoint_every": 3,
                               "checkpoint_seconds": 0})
    run_dir = tmp_path / "run"
    seen: dict[str, object] = {}

    async def kill_and_resume(run: InMemoryRun) -> None:
        await asyncio.sleep(2.0)
        seen["hosts"], seen["workers"] = list(run.hosts), [h.trainer for h in run.hosts]
        await run.kill_server()
        seen["state"] = run.hosts[0].trainer.worker.client.state_dict()
        await asyncio.sleep(1.0)
        run.resume_server()

    run = run_in_memory(sc, run_dir, hosts=2, during=kill_and_resume)
    s = run.summary
    assert s["status"] == "completed", s["status"]
    assert s["emulated_seconds"] == pytest.approx(5.0, abs=0.1)
    assert run.hosts == seen["hosts"]   # the same hosts, never restarted
    assert [h.trainer for h in run.hosts] == seen["workers"]
    assert run.host_codes == [0, 0]
    assert s["clients_missing"] == []
    assert s["hosts"]["reported"] == 2, s["hosts"]
    events = run.events()
    (resume_ev,) = of(events, "resume")
    after = events[events.index(resume_ev):]
    (start,) = of(after, "start")
    assert start["clients"] == sc.data.num_clients   # every client registered again
    (resumed,) = s["resumed"]
    assert s["updates"] > resumed["updates"]
    assert of(after, "aggregate")[-1]["t"] > 4.0
    versions = [e["version"] for e in of(events, "aggregate")]
    assert versions == sorted(versions)
    assert len(set(versions)) == len(versions)
    if algorithm["name"] == "scaffold":   # the control variates learned live on
        assert seen["state"]["c"]   # type: ignore[index]


def test_clients_taken_back_by_a_resumed_server_do_not_replay_their_absences(
        tmp_path: Path) -> None:
    """A client's availability goes on from the resumed time: the on/off changes between
    0 and the checkpoint are not played again (each a record, each return a Ready)."""
    sc = build({"name": "fedasync", "concurrency": 4},
               run={"time_budget": 8.0, "checkpoint_every": 3, "checkpoint_seconds": 0},
               availability={"model": "onoff", "mean_on": 0.5, "mean_off": 0.3})

    async def kill_and_resume(run: InMemoryRun) -> None:
        await asyncio.sleep(5.0)
        await run.kill_server()
        await asyncio.sleep(1.0)
        run.resume_server()

    run = run_in_memory(sc, tmp_path / "run", hosts=2, during=kill_and_resume)
    assert run.summary["status"] == "completed", run.summary["status"]
    events = run.events()
    (resume_ev,) = of(events, "resume")
    t0 = resume_ev["t"]
    after = [e for e in events[events.index(resume_ev):] if e["ev"] in ("away", "back")]
    assert after, "no client came or went after the resume"
    assert min(e["t"] for e in after) >= t0 - 1e-6
    at_start = [e for e in after if e["t"] <= t0 + 1e-6]
    assert len(at_start) <= sc.data.num_clients   # at most each client off at t0, once
    assert not [e for e in at_start if e["ev"] == "back"]
