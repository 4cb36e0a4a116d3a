"""An insider with a valid key bends neither time, nor version, nor weight.

Host-1 is authenticated and its messages are well-formed, but it lies: it
back-dates every update's send time by 0.45 emulated seconds (inside
``deploy.max_transit_ms``, so the window the server observes does not
catch it), claims the base version after the one its task carried and a
sample count of 10^12. The server takes time, version and weight from its
own record (the task it sent, the partition the seed determines): the
lies buy nothing, and the verdict fails by the insider's name. Honest runs
of every kind of algorithm need no correction at all.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from actor_scenarios import build, of

from fedsim.actors import worker as worker_module
from fedsim.actors.host import EXIT_REFUSED, ClientHost
from fedsim.actors.setup import build_data
from fedsim.scenario import Scenario
from fedsim.testing.federation import InMemoryRun, run_in_memory
from fedsim.wire.codec import decode, encode_body, stamp
from fedsim.wire.messages import Update, WorkerReady
from fedsim.wire.tensors import Model

pytestmark = pytest.mark.timeout(120)

INSIDER = 1  # host-1: clients 1, 3, 5
BACKDATE = 0.45
DOWN, UP, STEP, STEPS = 0.25, 0.25, 0.004, 3


def _lying(run: InMemoryRun, backdate: float = BACKDATE) -> None:
    """Make host-1 back-date its updates and claim a newer base version and 10^12 samples."""
    host = run.hosts[INSIDER]

    async def forward(update: list[Any], client: int) -> None:
        msg, _ = decode(update, check_finite=False)
        assert isinstance(msg, Update)
        forged = replace(msg, base_version=msg.base_version + 1, num_samples=10**12)
        sent_at = host.clock.now() - backdate
        await host.conn.send(stamp(encode_body(forged), sent_at=sent_at, seq=next(host.seq)))

    host.forward = forward  # type: ignore[method-assign]


def _watch_results(run: InMemoryRun) -> list[Update]:
    """Every Update the server's algorithm is handed, in order."""
    assert run.server is not None
    strategy = run.server.strategy
    seen: list[Update] = []
    update = strategy.update

    def watched(upload: Update, now: float) -> Any:
        seen.append(upload)
        return update(upload, now)

    strategy.update = watched  # type: ignore[method-assign]
    return seen


def _insider_run(tmp_path: Path, algorithm: dict[str, Any], lie: bool = True,
                 budget: float = 6.0) -> tuple[InMemoryRun, list[Update]]:
    sc = build(algorithm, run={"time_budget": budget},
               network={"up": {"delay": UP}, "down": {"delay": DOWN}},
               devices={"step_time": STEP}, client={"local_steps": STEPS})
    watched: dict[str, list[Update]] = {}

    async def during(run: InMemoryRun) -> None:
        if lie:
            _lying(run)
        watched["results"] = _watch_results(run)

    run = run_in_memory(sc, tmp_path / ("lying" if lie else "honest"), hosts=2, during=during)
    return run, watched["results"]


def _partition(sc: Scenario) -> list[int]:
    return [c.num_samples for c in build_data(sc).clients]


@pytest.mark.parametrize("wide_clock", [False, True], ids=["measured-clock", "claimed-clock"])
def test_a_back_dated_update_takes_the_emulated_time_and_fails_the_verdict_by_name(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, wide_clock: bool) -> None:
    if wide_clock:
        # the insider also reports its clock as known to +-0.5 s only: that widens the
        # window the server accepts claims in, never the bound the task record sets
        sync = ClientHost.sync_clock

        async def wide(self: ClientHost, *args: Any, **kwargs: Any) -> None:
            await sync(self, *args, **kwargs)
            if self.name == f"host-{INSIDER}":
                self.server_clock.uncertainty = 0.5

        monkeypatch.setattr(ClientHost, "sync_clock", wide)
    run, results = _insider_run(tmp_path, {"name": "fedasync", "concurrency": 6})
    s = run.summary
    if wide_clock:
        assert s["fidelity"]["clocks"]["host-1"]["uncertainty_ms"] == 500.0
    assert s["status"] == "completed", s["status"]
    events = run.events()
    # the verdict fails, naming the insider and no one else
    assert s["fidelity"]["verdict"] == "fail"
    reasons = s["fidelity"]["reasons"]
    assert any(r.startswith("send_times[host-1]:") for r in reasons), reasons
    assert not any("host-0" in r for r in reasons), reasons
    assert any(r.startswith("clock[host-1]:") for r in reasons) == wide_clock, reasons
    # the base version is the version the task was sent with, never the claim
    sends = {e["task_id"]: e for e in of(events, "send", dir="down", kind="task")}
    sent_versions = {(e["client"], e["version"]) for e in sends.values()}
    applied = of(events, "aggregate")
    assert {(e["clients"][0], e["base_version"]) for e in applied} <= sent_versions
    assert {r.client % 2 for r in results} == {0, 1}
    assert all(r.base_version == sends[r.task_id]["version"] for r in results)
    # the server's record decides the send time: no update was "sent" before its
    # task could have arrived (the send time plus the downlink's delay) and been
    # computed (3 steps of 4 ms), and each then took its uplink's full delay
    ups = of(events, "deliver", dir="up", kind="update")
    insider_ups = [e for e in ups if e["client"] % 2 == INSIDER]
    assert len(insider_ups) >= 10
    for e in ups:
        task = sends[e["task_id"]]
        assert e["sent_at"] >= task["sent_at"] + DOWN + STEPS * STEP - 1e-6, (e, task)
        assert e["t"] - e["sent_at"] >= UP - 1e-9, e
    # every insider update needed correcting, and was counted against its host
    fixed = s["send_time_corrections"]
    raised = [e for e in of(events, "warning") if "raised to" in (e.get("reason") or "")]
    assert {e["client"] % 2 for e in raised} == {INSIDER}
    # (those still on their uplink when the run ended were corrected too)
    assert len(insider_ups) <= len(raised) <= len(insider_ups) + 3
    assert fixed == {"out_of_window": 0, "before_record": len(raised)}
    assert s["send_times_clamped"] == len(raised)
    clocks = s["fidelity"]["clocks"]
    assert clocks["host-1"]["send_times_corrected"] == len(raised)
    assert clocks["host-0"]["send_times_corrected"] == 0
    # so the insider's clients are no better off than the honest ones
    count = {k: sum(1 for e in applied if e["clients"][0] % 2 == k) for k in (0, 1)}
    assert count[INSIDER] <= count[1 - INSIDER] + 3, count
    stale = {k: [e["staleness"] for e in applied if e["clients"][0] % 2 == k] for k in (0, 1)}
    mean = {k: sum(v) / len(v) for k, v in stale.items()}
    assert mean[INSIDER] >= 0.8 * mean[1 - INSIDER], mean


def test_a_back_dating_hidden_in_the_downlinks_slow_start_is_caught(tmp_path: Path) -> None:
    """Found by tests/integration/test_insider.py: an 18 KB model (13 segments) over 300 ms
    links that go idle between a client's tasks. TCP's slow start after idle costs each
    task one round trip (0.6 s) more than the least the link can take, so a bound of
    the least let a claim 0.3 s early through. The server's copy of each client's
    downlink schedules the task as the host's link does: the claim is raised, and the
    honest host, on the same links, needs no correction."""
    sc = build({"name": "fedasync", "concurrency": 2}, run={"time_budget": 8.0},
               model={"hidden": [64]}, network={"up": {"delay": 0.3}, "down": {"delay": 0.3}},
               devices={"step_time": STEP}, client={"local_steps": STEPS})

    async def during(run: InMemoryRun) -> None:
        _lying(run, backdate=0.3)

    run = run_in_memory(sc, tmp_path / "run", hosts=2, during=during)
    s = run.summary
    assert s["status"] == "completed", s["status"]
    events = run.events()
    # the hosts' downlinks: slow start after idle, one round trip over the least
    delivered = {(e["client"], e["sent_at"]): e["scheduled"]
                 for e in of(events, "deliver", dir="down", kind="task")}
    slow = [t - sent for (_, sent), t in delivered.items() if t - sent > 0.3 + 0.5]
    assert len(slow) >= len(delivered) // 2, sorted(t - s for (_, s), t in delivered.items())
    # every update, the insider's raised, sent no earlier than its task's real delivery
    # at its client (the host's record) plus its compute
    sends = {e["task_id"]: e for e in of(events, "send", dir="down", kind="task")}
    ups = of(events, "deliver", dir="up", kind="update")
    assert len([e for e in ups if e["client"] % 2 == INSIDER]) >= 4
    for e in ups:
        task = sends[e["task_id"]]
        arrived = delivered[(e["client"], task["sent_at"])]
        assert e["sent_at"] >= arrived + STEPS * STEP - 1e-6, (e, arrived)
    raised = [e for e in of(events, "warning") if "raised to" in (e.get("reason") or "")]
    assert {e["client"] % 2 for e in raised} == {INSIDER}
    assert s["send_time_corrections"]["before_record"] == len(raised)
    assert s["fidelity"]["clocks"]["host-0"]["send_times_corrected"] == 0
    assert [r for r in s["fidelity"]["reasons"] if "host-0" in r] == []


LINKS = [  # (the downlink, FedAsync's concurrency of 6 clients)
    ({"delay": 0.3}, 2),                                          # slow start after idle
    ({"delay": 0.05, "jitter": 0.02, "correlation": 0.3, "rate": 2e6,
      "loss": {"p": 0.05}, "loss_mode": "tcp"}, 6),               # draws, queues, recovery
    ({"delay": 0.05, "jitter": 0.01, "rate": 1e6, "loss": {"p": 0.01},
      "loss_mode": "drop"}, 6),
]


@pytest.mark.parametrize(("down", "concurrency"), LINKS, ids=["slow-start", "tcp-loss", "drops"])
def test_the_servers_copy_of_a_downlink_delivers_as_the_hosts_link_does(
        tmp_path: Path, down: dict[str, Any], concurrency: int) -> None:
    sc = build({"name": "fedasync", "concurrency": concurrency}, run={"time_budget": 6.0},
               model={"hidden": [64]}, network={"up": {"delay": 0.05}, "down": down},
               devices={"step_time": STEP}, client={"local_steps": STEPS})
    run = run_in_memory(sc, tmp_path / "run", hosts=2)
    s = run.summary
    assert s["status"] == "completed", s["status"]
    assert s["send_times_clamped"] == 0
    assert run.server is not None
    # every task the server still holds a record of: its delivery is the host's
    delivered = {(e["client"], e["sent_at"]): e["scheduled"]
                 for e in of(run.events(), "deliver", dir="down", kind="task")}
    sends = {e["task_id"]: e for e in of(run.events(), "send", dir="down", kind="task")}
    records = [(c, r) for c, kept in run.server.tasks._tasks.items() for r in kept]
    assert len(records) >= 12
    matched = dropped = 0
    for c, r in records:
        key = (c, sends[r.task_id]["sent_at"])
        if key in delivered:
            assert r.delivered == delivered[key], (c, r)
            matched += 1
        elif r.delivered <= s["emulated_seconds"]:  # dropped by the link: the least then
            sent = sends[r.task_id]
            least = run.server.plan.least_transfer(c, "down", sent["bytes"], sent["sent_at"])
            assert r.delivered == sent["sent_at"] + least, (c, r)
            assert of(run.events(), "drop", client=c, sent_at=sent["sent_at"])
            dropped += 1
    assert matched >= len(records) // 2
    assert (dropped > 0) == (down.get("loss_mode") == "drop")


WEIGHTED = [
    {"name": "fedavg", "weighting": "samples"},
    {"name": "fedprox", "weighting": "samples", "mu": 0.01},
    {"name": "fedadam", "weighting": "samples"},
    {"name": "scaffold", "weighting": "samples"},
    {"name": "fedspeed", "weighting": "samples"},
    {"name": "fedasync", "concurrency": 4},
    {"name": "fedbuff", "concurrency": 4, "buffer_size": 2},
    {"name": "asyncfeded", "concurrency": 4},
]


@pytest.mark.parametrize("algorithm", WEIGHTED, ids=[a["name"] for a in WEIGHTED])
def test_a_claimed_sample_count_buys_no_weight(tmp_path: Path, algorithm: dict[str, Any]
                                               ) -> None:
    run, results = _insider_run(tmp_path, algorithm, budget=3.0)
    assert run.summary["status"] == "completed", run.summary["status"]
    assert run.server is not None
    partition = _partition(run.server.sc)
    assert {r.client % 2 for r in results} == {0, 1}
    # every algorithm weighs a client by its partition, whatever the update says
    assert [r.num_samples for r in results] == [partition[r.client] for r in results]


HONEST = [
    {"name": "fedasync", "concurrency": 4},
    {"name": "fedavg"},
    {"name": "fedbuff", "concurrency": 4, "buffer_size": 2},
    {"name": "asyncfeded", "concurrency": 4},
    {"name": "scaffold"},
    {"name": "fedspeed"},
    {"name": "dga", "local_steps": 4, "delay": 2},
    {"name": "dga", "local_steps": 4, "delay": 6, "mode": "auto", "chunk_steps": 3},
]


@pytest.mark.parametrize("algorithm", HONEST,
                         ids=[f"{a['name']}-{a.get('mode', '')}" for a in HONEST])
def test_honest_hosts_need_no_correction(tmp_path: Path, algorithm: dict[str, Any]) -> None:
    # links at their floor (a constant delay) or near it (jitter), a rate, devices of
    # several speeds: an honest update meets the record's bound, often exactly
    sc = build(algorithm, run={"time_budget": 3.0},
               network={"up": {"delay": 0.03, "jitter": 0.01, "rate": 5e6},
                        "down": {"delay": 0.02, "rate": 2e6}},
               devices={"step_time": 0.004, "distribution": "uniform", "spread": 0.002})
    run = run_in_memory(sc, tmp_path / "run", hosts=2)
    s = run.summary
    assert s["status"] == "completed", s["status"]
    assert s["updates"] > 0
    assert s["send_times_clamped"] == 0, [
        e for e in of(run.events(), "warning") if "raised" in (e.get("reason") or "")][:3]
    assert s["send_time_corrections"] == {"out_of_window": 0, "before_record": 0}
    assert not [r for r in s["fidelity"]["reasons"] if r.startswith("send_times")]
    assert s["rejected_messages"]["server"] == {}


def test_a_host_registering_other_sample_counts_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    start = worker_module.InlineWorker.start

    async def inflated(self: Any) -> WorkerReady:
        ready = await start(self)
        if self.worker.clients[:1] == [INSIDER]:  # host-1's worker
            return WorkerReady(samples=tuple(10 * n for n in ready.samples), spec=ready.spec)
        return ready

    monkeypatch.setattr(worker_module.InlineWorker, "start", inflated)
    sc = build({"name": "fedavg", "weighting": "samples"}, run={"time_budget": 2.0})
    run = run_in_memory(sc, tmp_path / "run", hosts=2)
    assert run.host_codes == [0, EXIT_REFUSED]
    (refusal,) = [e for e in of(run.events(), "reject") if e["reason"] == "refused"]
    n = _partition(sc)[1]
    assert (f"client 1 registered {10 * n} training samples, but the scenario's partition "
            f"gives it {n} (3 of 3 counts differ") in refusal["detail"]
    assert run.summary["clients_missing"] == [1, 3, 5]
    assert run.summary["status"] == "completed"


def test_an_insiders_non_finite_update_is_refused_at_its_delivery(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Host-1 is registered and its updates well-formed, but one carries NaN: the
    server checks a large update's values off its event loop while the update
    crosses its uplink (here every update is large enough), and at its delivery
    refuses it (reject event, reason non_finite, sender host-1) instead of
    handing it to the algorithm; the run goes on."""
    from fedsim.actors import uplinks

    monkeypatch.setattr(uplinks, "CHECK_OFF_LOOP_BYTES", 0)
    sc = build({"name": "fedasync", "concurrency": 6}, run={"time_budget": 4.0},
               network={"up": {"delay": UP}, "down": {"delay": DOWN}},
               devices={"step_time": STEP}, client={"local_steps": STEPS})
    watched: dict[str, list[Update]] = {}
    poisoned: list[int] = []
    sent: list[float] = []

    async def during(run: InMemoryRun) -> None:
        host = run.hosts[INSIDER]
        forward = host.forward

        async def poison(update: list[Any], client: int) -> None:
            if poisoned:
                await forward(update, client)
                return
            msg, _ = decode(update, check_finite=False)
            assert isinstance(msg, Update)
            assert msg.model is not None
            flat = msg.model.flat().copy()
            flat[len(flat) // 2] = float("nan")
            bad = replace(msg, model=Model.from_flat(flat, msg.model.spec))
            poisoned.append(msg.task_id)
            sent.append(host.clock.now())
            await host.conn.send(stamp(encode_body(bad), sent_at=sent[0], seq=next(host.seq)))

        host.forward = poison  # type: ignore[method-assign]
        watched["results"] = _watch_results(run)

    run = run_in_memory(sc, tmp_path / "run", hosts=2, during=during)
    assert run.summary["status"] == "completed", run.summary["status"]
    assert len(poisoned) == 1
    (refused,) = [e for e in of(run.events(), "reject") if e["reason"] == "non_finite"]
    assert refused["sender"] == f"host-{INSIDER}"
    # refused at its delivery, once it crossed its uplink (the check ran meanwhile,
    # off the loop), not when it arrived
    assert refused["t"] >= sent[0] + UP - 0.01, (refused["t"], sent[0])
    assert run.summary["rejected_messages"]["server"] == {"non_finite": 1}
    assert all(u.task_id != poisoned[0] or u.client % 2 != INSIDER
               for u in watched["results"])
    assert len(watched["results"]) >= 10             # the run went on
