"""Schedulers: client transition table, synchronous rounds, asynchronous fill."""

from __future__ import annotations

import random

import pytest

from fedsim.algorithms import AsyncScheduler, RoundScheduler, SchedulerError
from fedsim.algorithms.scheduling import CLIENT_TRANSITIONS, ClientTable

# -- ClientTable ---------------------------------------------------------------

# The client lifecycle, written independently of the module's table.
SPEC = {
    "idle": {"dispatch": "training", "suspend": "suspended", "lose": "lost"},
    "training": {
        "result": "idle",
        "timeout": "idle",
        "ready": "idle",
        "suspend": "suspended",
        "lose": "lost",
    },
    "suspended": {"ready": "idle", "suspend": "suspended", "lose": "lost"},
    "lost": {"ready": "idle", "lose": "lost"},
}
EVENTS = ["dispatch", "result", "timeout", "ready", "suspend", "lose"]
PAIRS = [(s, e) for s in SPEC for e in EVENTS]


def test_transition_table_matches_spec():
    assert CLIENT_TRANSITIONS == SPEC


def _table_with(client: int, state: str) -> ClientTable:
    table = ClientTable()
    table.state[client] = state
    return table


@pytest.mark.parametrize(("state", "event"), [p for p in PAIRS if p[1] in SPEC[p[0]]])
def test_legal_transition(state, event):
    table = _table_with(3, state)
    assert table.fire(3, event) == SPEC[state][event]
    assert table.state[3] == SPEC[state][event]


@pytest.mark.parametrize(
    ("state", "event"), [p for p in PAIRS if p[1] not in SPEC[p[0]]]
)
def test_illegal_transition_names_event_client_and_state(state, event):
    table = _table_with(3, state)
    with pytest.raises(SchedulerError) as exc:
        table.fire(3, event)
    msg = str(exc.value)
    assert repr(event) in msg
    assert "client=3" in msg
    assert repr(state) in msg
    assert table.state[3] == state


def test_unknown_client_named():
    with pytest.raises(SchedulerError, match=r"'dispatch'.*unknown client 42"):
        ClientTable().fire(42, "dispatch")


@pytest.mark.parametrize(
    ("before", "after"),
    [
        (None, "idle"),
        ("lost", "idle"),
        ("suspended", "idle"),
        ("idle", "idle"),
        ("training", "training"),
    ],
)
def test_add_registers_or_reconnects(before, after):
    table = ClientTable()
    if before is not None:
        table.state[5] = before
    table.add(5)
    assert table.state[5] == after


def test_in_state_is_sorted():
    table = ClientTable()
    for c in (9, 2, 7, 4):
        table.add(c)
    table.fire(7, "dispatch")
    assert table.in_state("idle") == [2, 4, 9]
    assert table.in_state("training") == [7]


def test_in_state_index_agrees_with_a_scan_of_the_table():
    """The per-state lists (kept so an asynchronous fill does not scan every
    client) agree with the table after any sequence of legal events, direct
    writes and deletions included."""
    rng = random.Random(3)
    table = ClientTable()
    for _ in range(3000):
        c = rng.randrange(60)
        if c not in table.state or rng.random() < 0.1:
            table.add(c)
        elif rng.random() < 0.05:
            del table.state[c]
        else:
            legal = list(CLIENT_TRANSITIONS[table.state[c]])
            table.fire(c, rng.choice(legal))
        if rng.random() < 0.02:
            table.state[c] = "lost"
    for state in CLIENT_TRANSITIONS:
        scan = sorted(k for k, s in table.state.items() if s == state)
        assert table.in_state(state) == scan == list(table.view(state))
        assert table.count(state) == len(scan)
    with pytest.raises(TypeError):
        table.state.update({1: "idle"})
    with pytest.raises(TypeError):
        table.state.pop(next(iter(table.state)))


# -- RoundScheduler ------------------------------------------------------------


@pytest.mark.parametrize(
    ("fraction", "total", "min_clients", "over", "pool", "asked", "needed"),
    [
        (1.0, 10, 1, 0.0, 10, 10, 10),
        (0.3, 10, 1, 0.0, 10, 3, 3),
        (0.25, 10, 1, 0.0, 10, 3, 3),  # m = ceil(2.5)
        (0.1, 10, 5, 0.0, 10, 5, 5),  # min_clients wins
        (0.2, 10, 0, 0.0, 10, 2, 2),  # min_clients is at least 1
        (0.01, 10, 0, 0.0, 10, 1, 1),
        (0.5, 10, 1, 0.5, 10, 8, 5),  # ask ceil(5 * 1.5) = 8, close on 5
        (0.5, 10, 1, 1.0, 10, 10, 5),
        (0.5, 10, 1, 0.5, 6, 6, 5),  # over-selection capped by availability
        (0.5, 10, 1, 0.0, 3, 3, 3),  # fewer available than m
        (0.1, 30, 1, 0.0, 30, 3, 3),
        (0.1, 100, 1, 0.2, 100, 12, 10),
    ],
)
def test_round_arithmetic(fraction, total, min_clients, over, pool, asked, needed):
    sched = RoundScheduler(
        fraction, min_clients=min_clients, over_selection=over, seed=1
    )
    plan = sched.open_round(0.0, range(pool), total)
    assert len(plan.selected) == asked
    assert plan.needed == needed
    assert len(set(plan.selected)) == asked
    assert list(plan.selected) == sorted(plan.selected)
    assert set(plan.selected) <= set(range(pool))


@pytest.mark.parametrize(
    ("fraction", "total", "over", "asked", "needed"),
    [(0.07, 100, 0.0, 7, 7), (0.55, 100, 0.0, 55, 55), (0.5, 100, 0.1, 55, 50)],
)
def test_round_arithmetic_exact_for_decimal_fractions(
    fraction, total, over, asked, needed
):
    sched = RoundScheduler(fraction, over_selection=over)
    plan = sched.open_round(0.0, range(total), total)
    assert (len(plan.selected), plan.needed) == (asked, needed)


def _open(sched: RoundScheduler, pool: int = 10, total: int = 10, now: float = 0.0):
    return sched.open_round(now, range(pool), total)


def test_round_closes_on_first_m_results_and_ignores_the_rest():
    sched = RoundScheduler(0.3, over_selection=1.0, seed=4)
    plan = _open(sched)
    assert plan.needed == 3
    assert len(plan.selected) == 6
    first, late = plan.selected[:3], plan.selected[3:]
    for c in first:
        assert not sched.complete()
        assert sched.on_result(plan.round, c)
    assert sched.complete()
    for c in late:
        assert not sched.on_result(plan.round, c)
    assert sched.close(1.0) == list(first)
    assert sched.state == "closed"
    # After closing, even a selected client's result is stale.
    assert not sched.on_result(plan.round, late[0])


def test_duplicate_foreign_and_wrong_round_results_ignored():
    sched = RoundScheduler(0.5, seed=0)
    plan = _open(sched)
    outsider = next(c for c in range(10) if c not in plan.selected)
    c = plan.selected[0]
    assert sched.on_result(plan.round, c)
    assert not sched.on_result(plan.round, c)
    assert not sched.on_result(plan.round, outsider)
    assert not sched.on_result(plan.round + 1, plan.selected[1])
    assert not sched.on_result(plan.round - 1, plan.selected[1])
    assert sched.close(0.0) == [c]


def test_result_before_any_round_ignored():
    assert not RoundScheduler().on_result(1, 0)


def test_deadline():
    sched = RoundScheduler(1.0, deadline=5.0)
    plan = _open(sched, pool=4, total=4, now=10.0)
    assert plan.deadline_at == 15.0
    assert not sched.deadline_passed(14.999)
    assert sched.deadline_passed(15.0)
    assert sched.deadline_passed(20.0)
    sched.on_result(plan.round, plan.selected[2])
    assert not sched.complete()
    assert sched.close(15.0) == [plan.selected[2]]
    assert not sched.deadline_passed(30.0)  # nothing open


def test_no_deadline_never_passes():
    sched = RoundScheduler(1.0)
    plan = _open(sched)
    assert plan.deadline_at is None
    assert not sched.deadline_passed(1e12)


def test_deadline_with_no_results_abandons_the_round():
    sched = RoundScheduler(1.0, deadline=1.0)
    _open(sched)
    assert sched.close(2.0) == []
    assert sched.state == "closed"
    plan = _open(sched, now=2.0)
    assert plan.round == 2


def test_on_dropped_completes_the_round():
    sched = RoundScheduler(0.3)
    plan = _open(sched)
    a, b, c = plan.selected
    sched.on_result(plan.round, a)
    sched.on_dropped(b)
    assert not sched.complete()
    sched.on_dropped(c)
    assert sched.complete()
    # A dropped client that delivers after all is not counted.
    assert not sched.on_result(plan.round, b)
    assert sched.close(3.0) == [a]


def test_on_dropped_ignores_counted_and_unselected_clients():
    sched = RoundScheduler(0.3)
    plan = _open(sched)
    a, b, _ = plan.selected
    outsider = next(x for x in range(10) if x not in plan.selected)
    sched.on_result(plan.round, a)
    sched.on_result(plan.round, b)
    sched.on_dropped(a)  # already counted: no double counting
    sched.on_dropped(outsider)
    assert not sched.complete()


def test_dropping_everyone_over_selected_completes_with_fewer():
    sched = RoundScheduler(0.2, over_selection=1.0)
    plan = _open(sched)  # m = 2, asked 4
    sched.on_result(plan.round, plan.selected[0])
    for c in plan.selected[1:]:
        sched.on_dropped(c)
    assert sched.complete()
    assert sched.close(0.0) == [plan.selected[0]]


def test_open_while_collecting_names_event_round_and_state():
    sched = RoundScheduler()
    _open(sched)
    with pytest.raises(SchedulerError, match=r"'open'.*round 1.*'collecting'"):
        _open(sched)


def test_open_with_no_clients_and_close_without_round_raise():
    sched = RoundScheduler()
    with pytest.raises(SchedulerError, match="no client available"):
        sched.open_round(0.0, [], 10)
    assert sched.state == "closed"
    assert sched.round == 0
    with pytest.raises(SchedulerError, match="none is open"):
        sched.close(0.0)


def test_rounds_are_numbered():
    sched = RoundScheduler(0.5)
    for expected in (1, 2, 3):
        plan = _open(sched)
        assert plan.round == expected == sched.round
        sched.on_result(plan.round, plan.selected[0])
        sched.close(0.0)


def _plans(seed: int, rounds: int = 6) -> list[tuple[int, ...]]:
    sched = RoundScheduler(0.25, over_selection=0.5, seed=seed)
    out = []
    for r in range(rounds):
        available = [c for c in range(20) if (c + r) % 7 != 0]
        plan = sched.open_round(float(r), available, 20)
        out.append(plan.selected)
        for c in plan.selected[: plan.needed]:
            sched.on_result(plan.round, c)
        sched.close(float(r))
    return out


def test_round_selection_is_seeded():
    assert _plans(3) == _plans(3)
    assert _plans(3) != _plans(4)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"fraction": 0.0}, r"Invalid fraction: 0\.0"),
        ({"fraction": 1.5}, r"Invalid fraction: 1\.5"),
        ({"fraction": float("nan")}, r"Invalid fraction: nan"),
        ({"over_selection": -0.1}, r"Invalid over_selection: -0\.1"),
        ({"deadline": 0.0}, r"Invalid deadline: 0\.0"),
        ({"deadline": -2.0}, r"Invalid deadline: -2\.0"),
        ({"deadline": float("nan")}, r"Invalid deadline: nan"),
        pytest.param(
            {"over_selection": float("nan")},
            r"Invalid over_selection: nan",
        ),
    ],
)
def test_round_scheduler_rejects_bad_config(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RoundScheduler(**kwargs)


# -- AsyncScheduler ------------------------------------------------------------


def _async(concurrency: int = 3, clients: int = 8, **kw) -> AsyncScheduler:
    sched = AsyncScheduler(concurrency, **kw)
    for c in range(clients):
        sched.add(c)
    return sched


def test_fill_up_to_concurrency():
    sched = _async(3)
    picked = sched.fill(0.0)
    assert len(picked) == 3 == len(set(picked))
    assert sorted(picked) == sched.training()
    assert sched.fill(0.5) == []
    done = picked[0]
    assert sched.on_result(done)
    refill = sched.fill(1.0)
    assert len(refill) == 1
    assert len(sched.training()) == 3


def test_fill_with_fewer_idle_than_slots():
    sched = _async(5, clients=2)
    assert sorted(sched.fill(0.0)) == [0, 1]
    assert sched.fill(0.0) == []


def test_fill_picks_only_idle_clients():
    sched = _async(8, clients=8)
    sched.remove(1, "suspend")
    sched.remove(2, "lose")
    picked = sched.fill(0.0)
    assert sorted(picked) == [0, 3, 4, 5, 6, 7]
    assert sched.fill(0.0) == []


def test_on_result_only_for_training_clients():
    sched = _async(1, clients=2)
    (c,) = sched.fill(0.0)
    other = 1 - c
    assert not sched.on_result(other)  # idle
    assert not sched.on_result(99)  # unknown
    assert sched.on_result(c)
    assert not sched.on_result(c)  # duplicate
    assert sched.training() == []


def test_task_timeout_frees_clients_and_next_expiry():
    sched = _async(2, clients=4, task_timeout=5.0)
    assert sched.next_expiry() is None
    a = sched.fill(0.0)
    assert len(a) == 2
    assert sched.next_expiry() == 5.0
    sched.on_result(a[0])
    b = sched.fill(2.0)
    assert sched.next_expiry() == 5.0
    assert sched.expire(4.999) == []
    assert sched.expire(5.0) == [a[1]]
    assert sched.clients.state[a[1]] == "idle"
    assert sched.next_expiry() == 7.0
    assert sched.expire(100.0) == b
    assert sched.next_expiry() is None
    assert sched.training() == []


def test_no_timeout_means_no_expiry():
    sched = _async(2)
    sched.fill(0.0)
    assert sched.expire(1e9) == []
    assert sched.next_expiry() is None


def test_remove_suspend_ready_cycle():
    sched = _async(2, clients=3, task_timeout=10.0)
    picked = sched.fill(0.0)
    victim = picked[0]
    sched.remove(victim, "suspend")
    assert sched.clients.state[victim] == "suspended"
    assert victim not in sched.training()
    # The freed slot goes to the only idle client, never the suspended one.
    (other,) = sched.fill(1.0)
    assert other not in picked
    # Its task no longer counts toward expiry.
    assert sched.expire(10.0) == [picked[1]]
    sched.add(victim)  # ready again
    assert sched.clients.state[victim] == "idle"
    assert sched.fill(11.0) in ([victim], [picked[1]])


def test_remove_lose_and_reconnect():
    sched = _async(1, clients=1)
    sched.fill(0.0)
    sched.remove(0, "lose")
    assert sched.clients.state[0] == "lost"
    assert sched.fill(1.0) == []
    sched.add(0)
    assert sched.fill(2.0) == [0]


def test_remove_unknown_client_is_a_no_op():
    sched = _async(1, clients=1)
    sched.remove(77)
    assert 77 not in sched.clients.state


def test_suspending_a_lost_client_is_illegal():
    sched = _async(1, clients=1)
    sched.remove(0, "lose")
    with pytest.raises(SchedulerError, match=r"'suspend'.*client=0.*'lost'"):
        sched.remove(0, "suspend")


def _simulate(seed: int, concurrency: int = 4, events: int = 400) -> list[tuple]:
    """A random event stream; checks the invariants after every event."""
    rng = random.Random(seed)
    sched = AsyncScheduler(concurrency, task_timeout=3.0, seed=seed)
    log: list[tuple] = []
    now = 0.0
    for c in range(10):
        sched.add(c)
    for _ in range(events):
        now += rng.random()
        kind = rng.choice(["result", "suspend", "lose", "ready", "expire", "fill"])
        client = rng.randrange(10)
        if kind == "result":
            log.append((kind, client, sched.on_result(client)))
        elif kind in ("suspend", "lose"):
            if not (kind == "suspend" and sched.clients.state[client] == "lost"):
                sched.remove(client, kind)
                log.append((kind, client))
        elif kind == "ready":
            sched.add(client)
            log.append((kind, client))
        elif kind == "expire":
            log.append((kind, tuple(sched.expire(now))))
        idle_before = set(sched.clients.in_state("idle"))
        picked = sched.fill(now)
        assert set(picked) <= idle_before
        log.append(("fill", tuple(picked)))
        training = sched.training()
        assert len(training) <= concurrency
        assert set(sched.started) == set(training)
        expiry = sched.next_expiry()
        assert (expiry is None) == (not training)
    return log


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_never_more_than_concurrency_and_deterministic(seed):
    assert _simulate(seed) == _simulate(seed)


def test_different_seeds_pick_differently():
    assert _simulate(0) != _simulate(1)


def test_async_fill_is_seeded():
    def picks(seed):
        sched = _async(3, clients=12, seed=seed)
        out = [tuple(sched.fill(0.0))]
        for step in range(10):
            sched.on_result(out[-1][0])
            out.append(tuple(sched.fill(float(step))))
        return out

    assert picks(5) == picks(5)
    assert picks(5) != picks(6)


def test_late_result_of_expired_task_does_not_free_the_new_task():
    sched = _async(1, clients=1, task_timeout=5.0)
    assert sched.fill(0.0) == [0]
    sched.bind(0, 1)  # task 1
    assert sched.expire(5.0) == [0]
    assert sched.fill(5.0) == [0]
    sched.bind(0, 2)  # task 2
    assert not sched.on_result(0, 1)  # task 1's result, arriving late
    assert sched.training() == [0], "task 2 is still in flight"
    assert sched.on_result(0, 2)
    assert sched.training() == []


@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        ((0,), {}, r"Invalid concurrency: 0"),
        ((-1,), {}, r"Invalid concurrency: -1"),
        ((2,), {"task_timeout": 0.0}, r"Invalid task_timeout: 0\.0"),
        ((2,), {"task_timeout": float("nan")}, r"Invalid task_timeout: nan"),
    ],
)
def test_async_scheduler_rejects_bad_config(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        AsyncScheduler(*args, **kwargs)
