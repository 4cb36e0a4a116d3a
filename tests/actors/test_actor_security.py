"""What a host may say, through the real actors: identities, records, timestamps, rates.

The server learns a connection's host name from its key (the in-memory
network's ``user``, as CURVE's ZAP handler gives libzmq's ``User-Id``) and
checks everything a registered host sends against it: the clients it may
speak for, the event-log records it may write, the send times it may
claim, how fast it may send. Each test scripts a misbehaving host from
``during(run)`` and checks that the run went on and the misbehaviour was
counted and logged.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from actor_scenarios import build, of

from fedsim.actors.host import EXIT_REFUSED
from fedsim.testing.federation import InMemoryRun, run_in_memory
from fedsim.wire.codec import encode
from fedsim.wire.messages import ClockProbe, Event, EventBatch, Ready, Update
from fedsim.wire.tensors import Model

pytestmark = pytest.mark.timeout(60)

FAULT_AT = 1.0
ALLOWED = {"host-0": (0, 2, 4), "host-1": (1, 3, 5)}


def _fedasync(**run: float) -> object:
    return build({"name": "fedasync", "concurrency": 4}, run={"time_budget": 3.0, **run})


def test_a_key_that_is_not_the_hosts_own_is_refused_and_the_run_goes_on(tmp_path: Path) -> None:
    # host-1's connection authenticated as host-0's key: a stolen or misused key
    run = run_in_memory(_fedasync(), tmp_path / "run", hosts=2, allowed=ALLOWED,
                        users={1: "host-0"})
    assert run.summary["status"] == "completed", run.summary["status"]
    assert run.host_codes == [0, EXIT_REFUSED]
    assert run.summary["rejected_messages"]["server"]["refused"] == 1
    (refusal,) = [e for e in of(run.events(), "reject") if e["reason"] == "refused"]
    assert "the key is host-0's" in refusal["detail"]
    assert run.summary["clients_missing"] == [1, 3, 5]
    applied = {c for e in of(run.events(), "aggregate") for c in e["clients"]}
    assert applied == {0, 2, 4}


def test_a_host_may_claim_only_the_ids_on_its_allow_list(tmp_path: Path) -> None:
    allowed = {"host-0": (0, 2, 4), "host-1": (1, 3)}  # client 5 is nobody's
    run = run_in_memory(_fedasync(), tmp_path / "run", hosts=2, allowed=allowed)
    assert run.host_codes == [0, EXIT_REFUSED]
    (refusal,) = [e for e in of(run.events(), "reject") if e["reason"] == "refused"]
    assert "clients [5] are not on the allow-list for host-1" in refusal["detail"]
    assert run.summary["status"] == "completed"


def test_an_unauthenticated_connection_is_refused(tmp_path: Path) -> None:
    run = run_in_memory(_fedasync(), tmp_path / "run", hosts=2, allowed=ALLOWED,
                        users={1: None})
    assert run.host_codes == [0, EXIT_REFUSED]
    (refusal,) = [e for e in of(run.events(), "reject") if e["reason"] == "refused"]
    assert "did not authenticate" in refusal["detail"]


def test_records_a_host_may_not_write_never_reach_the_event_log(tmp_path: Path) -> None:
    async def forge(run: InMemoryRun) -> None:
        await asyncio.sleep(FAULT_AT)
        host = run.hosts[1]
        real = host.clock.real() - host.clock.epoch
        forged = (
            Event.of(1.0, real, "evaluate", accuracy=0.999),        # the server's kind
            Event.of(1.0, real, "train_end", client=0),             # host-0's client
            Event.of(1.0, real, "train_end", client=1, host="host-0"),
            Event.of(1.0, real, "send", client=1, note="x" * 1000),  # oversize extra
            Event.of(1.0, real, "send", client=1, deep={"a": 1}),   # not a plain value
            Event.of(1.0, real, "back", client=3, held=0, why="forged but allowed"),
        )
        await host._control(EventBatch(host="host-1", events=forged))

    run = run_in_memory(_fedasync(), tmp_path / "run", hosts=2, allowed=ALLOWED, during=forge)
    assert run.summary["status"] == "completed"
    assert run.summary["rejected_messages"]["server"]["bad_event"] == 5
    events = run.events()
    assert not [e for e in of(events, "evaluate") if e.get("accuracy") == 0.999]
    assert not [e for e in events if "note" in e or "deep" in e]
    (allowed,) = [e for e in of(events, "back") if e.get("why") == "forged but allowed"]
    assert allowed["host"] == "host-1"  # stamped with the sender's authenticated name
    details = [e["detail"] for e in of(events, "reject") if e["reason"] == "bad_event"]
    assert any("may not report 'evaluate'" in d for d in details)
    assert any("client 0, which does not run on host-1" in d for d in details)


def _update(run: InMemoryRun, client: int, value: float) -> Update:
    assert run.server is not None
    spec = run.server.update_spec
    model = Model.from_flat(np.full(spec.nbytes // 4, value, np.float32), spec)
    return Update(client=client, task_id=10**6, base_version=0, round=0, num_samples=10,
                  steps=1, loss=None, model=model)


def test_a_forged_send_time_is_clamped_counted_and_fails_the_verdict_by_name(
        tmp_path: Path) -> None:
    async def replay_old_times(run: InMemoryRun) -> None:
        await asyncio.sleep(FAULT_AT)
        host = run.hosts[1]
        for i in range(200):  # "sent" long ago, or in the future
            t = -50.0 if i % 2 else 1e6
            msg = Ready(client=1, reset=False)  # (a client that was not away: a no-op)
            await host.conn.send(encode(msg, sent_at=t, seq=next(host.seq)))

    run = run_in_memory(_fedasync(), tmp_path / "run", hosts=2, during=replay_old_times)
    s = run.summary
    assert s["status"] == "completed"
    assert s["send_times_clamped"] == 200
    assert s["send_time_corrections"] == {"out_of_window": 200, "before_record": 0}
    assert s["fidelity"]["send_times_clamped"] == 200
    assert s["fidelity"]["clocks"]["host-1"]["send_times_corrected"] == 200
    assert s["fidelity"]["clocks"]["host-0"]["send_times_corrected"] == 0
    # the host whose messages needed correcting fails the verdict, by name; no other
    assert s["fidelity"]["verdict"] == "fail"
    assert s["fidelity"]["reasons"] == [
        "send_times[host-1]: 200 outside 0 corrected (claimed send times the receiver had "
        "to correct)"]
    warnings = [e for e in of(run.events(), "warning") if "clamped" in (e.get("reason") or "")]
    assert len(warnings) == 200


def test_an_update_of_a_task_the_server_never_sent_is_refused(tmp_path: Path) -> None:
    async def answer_no_task(run: InMemoryRun) -> None:
        await asyncio.sleep(FAULT_AT)
        host = run.hosts[1]
        for _ in range(5):
            await host.send(_update(run, 1, 0.0))   # task 10**6, never sent

    run = run_in_memory(_fedasync(), tmp_path / "run", hosts=2, during=answer_no_task)
    s = run.summary
    assert s["status"] == "completed"
    assert s["rejected_messages"]["server"] == {"unknown_task": 5}
    details = {e["detail"] for e in of(run.events(), "reject")}
    assert details == {"an update of task 1000000, which the server did not send to client 1 "
                       "(or long ago)"}
    assert s["fidelity"]["verdict"] == "pass", s["fidelity"]["reasons"]


def test_a_replayed_message_is_rejected(tmp_path: Path) -> None:
    async def replay(run: InMemoryRun) -> None:
        await asyncio.sleep(FAULT_AT)
        host = run.hosts[1]
        frames = encode(ClockProbe(seq=1, t_sent=0.0), seq=next(host.seq))
        await host.conn.send(frames)
        await host.conn.send(frames)  # the same sequence number again

    run = run_in_memory(_fedasync(), tmp_path / "run", hosts=2, during=replay)
    assert run.summary["status"] == "completed"
    assert run.summary["rejected_messages"]["server"] == {"replay": 1}


def test_a_host_over_its_message_rate_is_limited_and_the_run_goes_on(tmp_path: Path) -> None:
    sc = build({"name": "fedasync", "concurrency": 4}, run={"time_budget": 3.0},
               deploy={"max_host_rate": 100.0})

    async def flood(run: InMemoryRun) -> None:
        await asyncio.sleep(FAULT_AT)
        host = run.hosts[1]
        for i in range(2000):  # at one instant: 500 pass (the burst), the rest are limited
            await host._control(ClockProbe(seq=10**6 + i, t_sent=0.0))

    run = run_in_memory(sc, tmp_path / "run", hosts=2, during=flood)
    assert run.summary["status"] == "completed"
    limited = run.summary["rejected_messages"]["server"]["rate_limited"]
    # (the host's own traffic spends tokens too)
    assert 1400 <= limited <= 1550, limited
    after = [e for e in of(run.events(), "aggregate") if e["t"] > FAULT_AT + 0.2]
    assert len(after) >= 10


def test_a_silent_host_is_taken_for_lost(tmp_path: Path) -> None:
    sc = build({"name": "fedasync", "concurrency": 4}, run={"time_budget": 12.0},
               deploy={"host_timeout": 5.0})

    async def go_silent(run: InMemoryRun) -> None:
        await asyncio.sleep(FAULT_AT)
        run.kill_host(1, tell_server=False)  # no process watcher: only silence tells

    run = run_in_memory(sc, tmp_path / "run", hosts=2, during=go_silent)
    assert run.summary["status"] == "completed"
    (lost,) = of(run.events(), "host_lost")
    assert lost["host"] == "host-1"
    assert "silent" in lost["reason"]
    assert FAULT_AT + 5.0 <= lost["t"] <= FAULT_AT + 7.0
    assert run.summary["hosts"] == {"registered": 2, "reported": 1, "lost": ["host-1"],
                                    "unreported": ["host-1"]}


def test_a_restarted_host_takes_its_clients_back(tmp_path: Path) -> None:
    sc = build({"name": "fedasync", "concurrency": 4}, run={"time_budget": 4.0})

    async def crash_and_restart(run: InMemoryRun) -> None:
        await asyncio.sleep(FAULT_AT)
        run.kill_host(1)
        await asyncio.sleep(1.0)
        run.restart_host(1)

    run = run_in_memory(sc, tmp_path / "run", hosts=2, during=crash_and_restart)
    assert run.summary["status"] == "completed", run.summary["status"]
    events = run.events()
    (lost,) = of(events, "host_lost")
    (joined,) = of(events, "host_joined")
    assert joined["host"] == "host-1"
    assert joined["clients"] == 3
    assert joined["t"] > lost["t"]
    after = {c for e in of(events, "aggregate") if e["t"] > joined["t"] for c in e["clients"]}
    assert after & {1, 3, 5}, "the restarted host's clients never contributed again"
    assert run.host_codes == [0, 0]
    assert run.summary["fidelity"]["hosts_reported"] == 2


def test_one_client_over_its_message_rate_is_limited(tmp_path: Path) -> None:
    sc = build({"name": "fedasync", "concurrency": 4}, run={"time_budget": 3.0},
               deploy={"max_client_rate": 10.0})

    async def flood(run: InMemoryRun) -> None:
        await asyncio.sleep(FAULT_AT)
        host = run.hosts[1]
        for _ in range(200):  # client 1 at one instant: about 50 pass (the burst)
            await host.send(Ready(client=1, reset=False))

    run = run_in_memory(sc, tmp_path / "run", hosts=2, during=flood)
    assert run.summary["status"] == "completed"
    limited = run.summary["rejected_messages"]["server"]["rate_limited"]
    assert 140 <= limited <= 160, limited  # (its own updates spend tokens too)
    details = {e["detail"] for e in of(run.events(), "reject") if e["reason"] == "rate_limited"}
    assert details == {"client 1 sent over 10 messages/s"}


def test_an_oversize_control_message_is_refused(tmp_path: Path) -> None:
    sc = build({"name": "fedasync", "concurrency": 4}, run={"time_budget": 3.0},
               deploy={"max_control_mb": 0.01})

    async def big_batch(run: InMemoryRun) -> None:
        await asyncio.sleep(FAULT_AT)
        host = run.hosts[1]
        real = host.clock.real() - host.clock.epoch
        events = tuple(Event.of(1.0, real, "back", client=1, why="x" * 200) for _ in range(100))
        await host._control(EventBatch(host="host-1", events=events))

    run = run_in_memory(sc, tmp_path / "run", hosts=2, during=big_batch)
    assert run.summary["status"] == "completed"
    assert run.summary["rejected_messages"]["server"]["oversize"] >= 1
