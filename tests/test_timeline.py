"""Per-client intervals from synthetic event lists (fedsim.results.timeline, pure functions)."""

from __future__ import annotations

from typing import Any

import pytest

from fedsim.results.timeline import build_timeline, merge, sample_clients, subtract


def ev(t: float, name: str, **fields: Any) -> dict[str, Any]:
    return {"t": t, "real": t, "ev": name, **fields}


def down(sent: float, t: float, cid: int = 0, kind: str = "task") -> list[dict[str, Any]]:
    """A message from the server: its send and its delivery."""
    return [ev(sent, "send", client=cid, kind=kind, dir="down", sent_at=sent),
            ev(t, "deliver", client=cid, kind=kind, dir="down", sent_at=sent)]


def up(sent: float, t: float, cid: int = 0, kind: str = "update") -> list[dict[str, Any]]:
    """A message to the server: its send and its delivery."""
    return [ev(sent, "send", client=cid, kind=kind, dir="up", sent_at=sent),
            ev(t, "deliver", client=cid, kind=kind, dir="up", sent_at=sent)]


def timeline(events: list[dict[str, Any]], **kw: Any) -> Any:
    return build_timeline(sorted(events, key=lambda e: e["t"]), **kw)


def test_merge_and_subtract() -> None:
    assert merge([(3, 4), (0, 1), (0.5, 2), (2, 2.5), (5, 5)]) == [(0, 2.5), (3, 4)]
    assert subtract([(0, 10)], [(1, 2), (4, 5), (9, 12)]) == [(0, 1), (2, 4), (5, 9)]
    assert subtract([(0, 1), (2, 3)], [(0.5, 2.5)]) == [(0, 0.5), (2.5, 3)]
    assert subtract([(0, 1)], [(-1, 2)]) == []
    assert subtract([(0, 1)], []) == [(0, 1)]


def test_an_asynchronous_task_download_training_upload_and_its_aggregation() -> None:
    events = [*down(0.0, 0.25), ev(0.25, "train_start", client=0, task_id=5),
              ev(0.35, "train_end", client=0, task_id=5), *up(0.35, 0.6),
              ev(0.6, "aggregate", clients=[0], staleness=3), ev(1.0, "end")]
    c = timeline(events).clients[0]
    assert c.download == [(0.0, 0.25)]
    assert c.training == [(0.25, 0.35)]
    assert c.upload == [(0.35, 0.6)]
    assert c.waiting == []      # applied on arrival: no wait
    assert c.aggregated == [(0.6, 3)]
    assert c.in_flight == []


def test_a_synchronous_round_waits_from_delivery_to_aggregation() -> None:
    events = [*down(0.0, 0.2, cid=0), *down(0.0, 0.2, cid=1),
              ev(0.2, "train_start", client=0, task_id=1), ev(0.3, "train_end", client=0,
                                                              task_id=1),
              ev(0.2, "train_start", client=1, task_id=2), ev(0.9, "train_end", client=1,
                                                              task_id=2),
              *up(0.3, 0.5, cid=0), *up(0.9, 1.1, cid=1),
              ev(1.1, "aggregate", clients=[0, 1], round=1),
              *down(1.1, 1.3, cid=0), *down(1.1, 1.3, cid=1), ev(1.5, "end")]
    tl = timeline(events)
    fast, slow = tl.clients[0], tl.clients[1]
    assert fast.waiting == [(0.5, 1.1)]  # the barrier: the slow client's update
    assert slow.waiting == []
    assert fast.aggregated == slow.aggregated == [(1.1, None)]
    assert fast.download == [(0.0, 0.2), (1.1, 1.3)]


def test_waiting_ends_at_the_next_task_when_that_comes_first() -> None:
    # FedBuff: the update sits in the buffer while its client already has new work
    events = [*up(0.0, 0.2), *down(0.2, 0.4), ev(0.4, "train_start", client=0, task_id=2),
              ev(0.7, "aggregate", clients=[4, 0], stalenesses=[1, 2]), ev(1.0, "end")]
    c = timeline(events).clients[0]
    assert c.waiting == []
    assert c.aggregated == [(0.7, 2)]
    assert c.training == [(0.4, 1.0)]  # still training when the log ends


def test_a_discard_ends_the_wait_and_is_marked() -> None:
    events = [*up(0.0, 0.2), ev(0.5, "discard", client=0, reason="too stale", staleness=9),
              ev(1.0, "end")]
    c = timeline(events).clients[0]
    assert c.waiting == [(0.2, 0.5)]
    assert c.discarded == [0.5]


def test_a_pipelined_session_trains_until_the_end_except_at_barriers_and_away() -> None:
    events = [*down(0.0, 0.1), ev(0.1, "train_start", client=0, task_id=1),
              *up(0.3, 0.45),                          # a piece's upload, while training
              ev(0.5, "barrier_wait", client=0, round=2),
              ev(0.7, "barrier_resume", client=0, round=2),
              ev(1.0, "away", client=0, why="off"), ev(1.2, "back", client=0, why="on"),
              ev(2.0, "end")]
    c = timeline(events).clients[0]
    assert c.training == [(0.1, 0.5), (0.7, 1.0), (1.2, 2.0)]
    assert c.waiting == [(0.5, 0.7)]  # the barrier; the delivered piece waits while it trains
    assert c.away == [(1.0, 1.2)]
    assert c.upload == [(0.3, 0.45)]


def test_away_hides_training_and_waiting_and_an_open_absence_runs_to_the_end() -> None:
    events = [ev(0.0, "train_start", client=0, task_id=1),
              ev(0.2, "away", client=0, why="off"),
              ev(0.5, "train_end", client=0, task_id=1, reason="went away"),
              ev(0.6, "back", client=0), ev(0.8, "away", client=0, why="suspend"),
              ev(1.5, "end")]
    c = timeline(events).clients[0]
    assert c.away == [(0.2, 0.6), (0.8, 1.5)]
    assert c.training == [(0.0, 0.2)]


def test_messages_still_in_flight_at_the_end_run_to_the_end() -> None:
    events = [ev(0.0, "send", client=0, kind="task", dir="down", sent_at=0.0),  # lost earlier
              *down(0.5, 0.7),
              ev(0.9, "send", client=0, kind="update", dir="up", sent_at=0.9),
              ev(1.2, "send", client=0, kind="task", dir="down", sent_at=1.2),
              ev(1.5, "end")]
    c = timeline(events).clients[0]
    assert c.in_flight == [(0.9, 1.5), (1.2, 1.5)]
    assert c.download == [(0.5, 0.7), (1.2, 1.5)]  # the first send is not the tail: not drawn
    assert c.upload == [(0.9, 1.5)]


def test_messages_queued_on_a_link_overlap_one_bar_each() -> None:
    # a pipelined client uploads a piece while the previous one is still on its way
    events = [*up(0.1, 0.4), *up(0.3, 0.6), ev(1.0, "end")]
    assert timeline(events).clients[0].upload == [(0.1, 0.4), (0.3, 0.6)]


def test_lost_messages_are_marked_in_their_direction() -> None:
    events = [ev(0.3, "drop", client=0, kind="task", dir="down", sent_at=0.0,
                 reason="away (dropped)"),
              ev(0.4, "drop", client=0, kind="update", dir="up", reason="loss"),
              ev(1.0, "end")]
    c = timeline(events).clients[0]
    assert c.lost == [(0.3, "down"), (0.4, "up")]
    assert c.download == [(0.0, 0.3)]  # it travelled, then was lost on arrival


def test_a_window_clips_intervals_and_leaves_out_markers() -> None:
    events = [*down(0.0, 1.0), ev(1.0, "train_start", client=0, task_id=1),
              ev(3.0, "train_end", client=0, task_id=1), *up(3.0, 3.5),
              ev(3.5, "aggregate", clients=[0], staleness=0), ev(5.0, "end")]
    tl = timeline(events, start=2.0, end=3.2)
    c = tl.clients[0]
    assert (tl.start, tl.end) == (2.0, 3.2)
    assert c.download == []
    assert c.training == [(2.0, 3.0)]
    assert c.upload == [(3.0, 3.2)]
    assert c.aggregated == []


def test_only_the_chosen_clients_are_extracted_and_idle_ones_are_kept() -> None:
    events = [*down(0.0, 0.2, cid=0), *down(0.0, 0.3, cid=1),
              ev(0.5, "aggregate", clients=[0, 1], round=1), ev(1.0, "end")]
    tl = timeline(events, clients=[1, 7], total_clients=10)
    assert sorted(tl.clients) == [1, 7]
    assert tl.clients[1].download == [(0.0, 0.3)]
    assert tl.clients[1].aggregated == [(0.5, None)]
    assert tl.clients[7].download == []
    assert tl.clients[7].aggregated == []
    assert tl.total_clients == 10


def test_a_log_without_an_end_record_ends_at_its_last_record() -> None:
    events = [ev(0.0, "train_start", client=0, task_id=1), ev(2.5, "evaluate", accuracy=0.5)]
    tl = timeline(events)
    assert tl.end == 2.5
    assert tl.clients[0].training == [(0.0, 2.5)]


def test_sample_clients() -> None:
    assert sample_clients([5, 1, 3, 1]) == [1, 3, 5]
    picked = sample_clients(range(1000), k=40)
    assert len(picked) == 40
    assert picked == sorted(picked)
    assert picked == sample_clients(range(1000), k=40)  # the same every time
    # client hosts take clients round-robin: the sample spans them
    assert {c % 2 for c in picked} == {0, 1}
    assert len({c % 8 for c in picked}) == 8
    assert sample_clients(range(1000), k=40, seed=1) != picked


@pytest.mark.parametrize("n", [1, 40])
def test_sample_clients_keeps_a_small_federation_whole(n: int) -> None:
    assert sample_clients(range(n)) == list(range(n))
