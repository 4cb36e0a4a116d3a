"""What a key holder's floods cost the server, through the real actors on virtual time.

Records a host makes up about its own clients, clock probes from a
connection that never registered, and messages beyond a host's share of the
server's time: each is refused (counted by reason, logged up to
``deploy.max_logged_rejects`` per source) and the run goes on. The parts
(the budgets, the log cap, a host's registration over a new connection)
are tested alone below.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from actor_scenarios import build, of

from fedsim.actors.host_events import fitting as _fitting
from fedsim.actors.hosts import HostTable
from fedsim.actors.server_gate import (
    BASE,
    PER_CHANGE,
    PER_MESSAGE_DOWN,
    PER_MESSAGE_UP,
    Budget,
    Gate,
    RecordBudget,
    Rejections,
    hello_header_bytes,
    message_limit,
)
from fedsim.algorithms import get
from fedsim.testing.federation import ADDRESS, InMemoryRun, run_in_memory
from fedsim.wire.codec import MAX_HEADER_BYTES, decode, encode, encode_body, max_message_bytes
from fedsim.wire.messages import ClockProbe, Event, EventBatch, HostHello
from fedsim.wire.tensors import TensorSpec

pytestmark = pytest.mark.timeout(60)

FAULT_AT = 1.0


def _fedasync(**deploy: object) -> object:
    return build({"name": "fedasync", "concurrency": 4}, run={"time_budget": 3.0},
                 deploy=deploy)


def test_records_beyond_what_a_clients_traffic_allows_are_refused(tmp_path: Path) -> None:
    """The issue's 400,000 made-up records of allowed kinds, scaled down."""
    async def make_up(run: InMemoryRun) -> None:
        await asyncio.sleep(FAULT_AT)
        host = run.hosts[1]
        real = host.clock.real() - host.clock.epoch
        for _ in range(20):
            events = tuple(Event.of(1.0, real, "train_start", client=c, task_id=10**6)
                           for c in (1, 3, 5) for _ in range(100))
            await host._control(EventBatch(host="host-1", events=events))

    run = run_in_memory(_fedasync(), tmp_path / "run", hosts=2, during=make_up)
    s = run.summary
    assert s["status"] == "completed"
    refused = s["rejected_messages"]["server"]["bad_event"]
    written = [e for e in of(run.events(), "train_start") if e.get("task_id") == 10**6
               and e["client"] in (1, 3, 5)]
    assert refused + len(written) == 6000
    assert refused >= 5000, refused      # all were taken before
    details = {e["detail"] for e in of(run.events(), "reject") if e["reason"] == "bad_event"}
    assert all("beyond what the server's traffic with client" in d for d in details)
    assert len(details) <= 3
    assert len(of(run.events(), "reject")) == 10
    assert s["rejected_messages"]["unlogged"] == {"host-1": refused - 10}
    # the honest records of the same clients still got through
    assert of(run.events(), "train_end", client=1)


def test_probes_from_a_connection_that_never_registered_are_limited(tmp_path: Path) -> None:
    answered: list[int] = []

    async def probe(run: InMemoryRun) -> None:
        await asyncio.sleep(FAULT_AT)
        rogue = run.network.connect(ADDRESS, b"rogue")
        for i in range(1000):
            await rogue.send(encode(ClockProbe(seq=i, t_sent=0.0), seq=i))
        await asyncio.sleep(1.0)
        while True:
            try:
                await asyncio.wait_for(rogue.recv(), 0.01)
            except TimeoutError:
                break
            answered.append(1)

    run = run_in_memory(_fedasync(), tmp_path / "run", hosts=2, during=probe)
    s = run.summary
    assert s["status"] == "completed"
    # 10/s over 5 s: a burst of 50, and 10 more a second while the probes came
    assert 50 <= len(answered) <= 70, len(answered)
    assert s["rejected_messages"]["server"]["rate_limited"] == 1000 - len(answered)
    assert s["unregistered_messages"] >= len(answered) + 2 * 9  # the hosts' own, too
    assert s["rejected_messages"]["unlogged"] == {"rogue": 1000 - len(answered) - 10}


def test_a_host_over_its_share_of_the_servers_time_is_limited(tmp_path: Path) -> None:
    sc = _fedasync(max_host_cpu=0.01)  # 10 ms a second, 50 ms at once

    async def flood(run: InMemoryRun) -> None:
        await asyncio.sleep(FAULT_AT)
        host = run.hosts[1]
        real = host.clock.real() - host.clock.epoch
        events = tuple(Event.of(1.0, real, "warning", client=1, note="x" * 100)
                       for _ in range(400))
        for _ in range(100):  # ~2-3 ms of the server's time each
            await host._control(EventBatch(host="host-1", events=events))

    run = run_in_memory(sc, tmp_path / "run", hosts=2, during=flood)
    s = run.summary
    assert s["status"] == "completed"
    limited = [e["detail"] for e in of(run.events(), "reject") if e["reason"] == "rate_limited"]
    assert limited
    assert "host-1's messages took over 1 % of the server's time" in limited
    assert s["rejected_messages"]["server"]["rate_limited"] >= 50


# -- the parts ----------------------------------------------------------------------


def test_budget_spends_tokens_and_waits_out_a_debt() -> None:
    b = Budget(rate=10.0, burst=50.0, now=0.0)
    assert sum(b.take(0.0) for _ in range(100)) == 50
    assert sum(b.take(1.0) for _ in range(100)) == 10
    b.charge(1.0, 3.0)          # a cost known once paid: in debt
    assert not b.ready(1.2)
    assert b.ready(1.31)


def test_a_records_budget_grows_with_the_servers_own_traffic() -> None:
    changes = {7: 3}
    r = RecordBudget(lambda c, t0, t1: changes.get(c, 0) if t0 < 5.0 <= t1 else 0)
    spent = [r.take("h", 1, 0.0) for _ in range(BASE + 1)]
    assert spent[:BASE] == [None] * BASE
    assert spent[BASE] is not None
    assert "client 1" in spent[BASE]
    r.sent(1, "h")
    r.received(1)
    assert sum(r.take("h", 1, 0.0) is None for _ in range(100)) == (
        PER_MESSAGE_DOWN + PER_MESSAGE_UP)
    # a client's availability changes (which the server knows) grant theirs
    assert sum(r.take("h", 7, 1.0) is None for _ in range(100)) == BASE
    assert sum(r.take("h", 7, 6.0) is None for _ in range(100)) == 3 * PER_CHANGE
    # the host's own records: per message the server sent any of its clients
    assert sum(r.take("h", None, 0.0) is None for _ in range(100)) == BASE + PER_MESSAGE_DOWN


def test_rejections_are_all_counted_and_logged_up_to_a_cap_per_source(
        caplog: pytest.LogCaptureFixture) -> None:
    r = Rejections(cap=3)
    for i in range(10):
        r.add("10.0.0.9", "unauthenticated", f"try {i}", what="a connection")
    r.add("host-1", "replay", "seq 4")
    recorded: list[tuple[str, str, str]] = []
    counts = {"replay": 5}   # a resumed run's
    r.attach(counts, lambda *a: recorded.append(a))   # the first ones, recorded now
    r.add("10.0.0.9", "bad_handshake", "closed")      # another reason: its own cap
    assert counts == {"replay": 6, "unauthenticated": 10, "bad_handshake": 1}
    assert [d for _, _, d in recorded] == ["try 0", "try 1", "try 2", "seq 4", "closed"]
    assert r.not_logged() == {"10.0.0.9": 7}
    lines = r.summarise()
    assert lines == ["7 more rejections from 10.0.0.9 (unauthenticated) were counted but not "
                     "logged (deploy.max_logged_rejects)"]
    logged = [m for m in caplog.messages if "rejected" in m]
    assert len(logged) == 5
    assert "the last unauthenticated from 10.0.0.9 logged" in logged[2]


def test_a_live_host_registers_again_over_a_new_connection() -> None:
    t = HostTable(num_clients=4, fedsim_version="v", scenario_hash="s")
    hello = HostHello(host="host-0", pid=7, clients=(0, 1), samples=(5, 5), boot_id="b",
                      fedsim_version="v", scenario_hash="s")
    assert t.hello(b"old", hello, "host-0") is None
    assert t.reconnect(b"old", hello, "host-0") is None        # the same connection
    assert t.reconnect(b"new", hello, "host-1") is None        # another key
    other = HostHello(host="host-0", pid=8, clients=(0, 1), samples=(5, 5), boot_id="b",
                      fedsim_version="v", scenario_hash="s")
    assert t.reconnect(b"new", other, "host-0") is None        # another process
    moved = t.reconnect(b"new", hello, "host-0")
    assert moved is not None
    assert t.owner(0) == b"new"
    assert t.by_peer(b"old") is None


def test_a_batch_over_the_header_limit_is_sent_in_parts() -> None:
    events = tuple(Event.of(1.0, 1.0, "reject", reason="bad_field", detail="x" * 300)
                   for _ in range(500))
    parts = _fitting(EventBatch(host="h", events=events))
    assert len(parts) > 1
    assert sum(len(p.events) for p in parts) == 500
    for p in parts:
        decode(encode(p))   # each within the default header limit
        assert encode_body(p).nbytes < MAX_HEADER_BYTES


@pytest.mark.parametrize(("name", "copies"), [("fedavg", 1), ("scaffold", 2)])
def test_the_default_message_limit_is_the_largest_legitimate_message(
        name: str, copies: int) -> None:
    spec = TensorSpec([("float32", (512, 784)), ("float32", (512,)), ("float32", (10, 512))])
    alg = get(name)
    assert max(alg.task_copies, alg.update_copies) == copies
    sc = build({"name": name}, data={"num_clients": 20})
    limit = message_limit(sc, spec, copies)
    assert limit == max_message_bytes(spec, copies)   # the model's copies, not 512 MB
    assert limit < 1.01 * copies * spec.nbytes + 2 * MAX_HEADER_BYTES
    tiny = TensorSpec([("float32", (4,))])
    assert message_limit(sc, tiny, 1) == 64 + 1024 * 1024  # then a host's goodbye
    big = build({"name": name}, data={"num_clients": 100_000})
    assert message_limit(big, tiny, 1) == 64 + hello_header_bytes(100_000)
    fixed = build({"name": name}, deploy={"max_message_mb": 3.0})
    assert message_limit(fixed, spec, copies) == 3_000_000
    gate = Gate(sc, spec, {"host-0": (0, 1, 2)})
    assert gate.header_limit("HostHello", "host-0") == hello_header_bytes(3)
    assert gate.header_limit("Update", "host-0") > MAX_HEADER_BYTES  # it may hold the spec
