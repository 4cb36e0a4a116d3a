"""Each version's model crosses a link once (fedsim/wire/payloads.py): the sender's and the
receiver's records agree, a task left without a model gets its version's back, and the
links are charged for the task with its model, byte for byte."""

from __future__ import annotations

import numpy as np
import pytest

from fedsim.wire.codec import decode, encode, encode_body, model_cost, restamp
from fedsim.wire.errors import WireError
from fedsim.wire.messages import LocalWork, Task
from fedsim.wire.payloads import WINDOW, HeldVersions, SentVersions
from fedsim.wire.tensors import Model, TensorSpec

SPEC = TensorSpec([("float32", (3, 4)), ("float32", (4,))])


def _task(version: int, task_id: int, client: int = 0, value: float = 0.0) -> Task:
    model = Model.from_flat(np.full(16, value + version, dtype=np.float32), SPEC)
    return Task(client=client, task_id=task_id, version=version, round=0,
                work=LocalWork(steps=2), model=model)


def _over_the_wire(sent: SentVersions, held: HeldVersions, task: Task) -> tuple[Task, bool]:
    """``task`` as the receiver decodes it, and whether its model went with it."""
    inline = sent.needs(task.version)
    got, _ = decode(encode(task if inline else task.with_model(None)), spec=SPEC)
    assert isinstance(got, Task)
    return held.bind(got), inline


def test_a_version_crosses_once_and_every_task_gets_its_model() -> None:
    sent, held = SentVersions(), HeldVersions()
    inline = []
    for i, version in enumerate([0, 0, 0, 1, 1, 0, 2, 2, 1, 0]):
        task = _task(version, task_id=i + 1, client=i)
        got, went = _over_the_wire(sent, held, task)
        inline.append(went)
        assert got.model is not None
        assert np.array_equal(got.model.flat(), task.model.flat())  # type: ignore[union-attr]
        assert (got.task_id, got.client) == (task.task_id, task.client)
    # the model went with the first task of each version only; version 0 again after
    # two newer ones (WINDOW = 2) went with its model again (the receiver had it still)
    assert WINDOW == 2
    assert inline == [True, False, False, True, False, False, True, False, False, True]


def test_the_receiver_keeps_twice_the_senders_window() -> None:
    held = HeldVersions()
    for v in range(2 * WINDOW + 1):
        held.bind(_task(v, v + 1))
    assert not held.holds(0)
    assert all(held.holds(v) for v in range(1, 2 * WINDOW + 1))


def test_a_task_without_a_model_the_receiver_lacks_is_refused() -> None:
    held = HeldVersions()
    held.bind(_task(3, 1))
    with pytest.raises(WireError, match="none is held for version 4") as info:
        held.bind(_task(4, 2).with_model(None))
    assert info.value.reason == "unknown_payload"
    held.clear()
    with pytest.raises(WireError):
        held.bind(_task(3, 3).with_model(None))


def test_a_task_without_its_model_is_charged_as_with_it() -> None:
    task = _task(5, 7)
    assert task.model is not None
    full = encode_body(task).nbytes
    light = encode_body(task.with_model(None)).nbytes
    assert light < full - task.model.nbytes
    assert light + model_cost(task.model) == full


def test_restamp_forwards_frames_under_a_new_envelope_only() -> None:
    task = _task(5, 7)
    frames = encode(task, sent_at=1.0, seq=3)
    again = restamp(frames, sent_at=2.5, seq=9)
    assert [bytes(f) for f in again] == [bytes(f) for f in encode(task, sent_at=2.5, seq=9)]
    assert all(a is b for a, b in zip(again[1:], frames[1:], strict=True))  # not copied
    with pytest.raises(WireError):
        restamp([b"\\x94\\x04\\xa4Nope" + b"\\0" * 19, *frames[1:]], sent_at=0.0, seq=0)
    with pytest.raises(WireError):
        restamp([], sent_at=0.0, seq=0)


@pytest.mark.parametrize("window", [WINDOW, 2 * WINDOW])
def test_the_two_sides_agree_when_old_keys_come_back_out_of_order(window: int) -> None:
    """Clients behind links of different delays ask for rounds out of order: a slow
    client's round comes back after newer ones (DGA on wifi-floor: round 50 carried
    again after 51-58). Whatever the order, a key the sender leaves out is held by the
    receiver: a key carried again is the receiver's newest, as it is the sender's
    (it had kept its first place, and left the receiver while the sender counted on it)."""
    rng = np.random.default_rng(7)
    for _ in range(200):
        sent, held = SentVersions(window), HeldVersions(2 * window)
        top = 0
        for _ in range(60):
            top += int(rng.integers(0, 2))
            key = max(0, top - int(rng.integers(0, 3 * window)))  # mostly recent, some old
            if sent.needs(key):
                held.keep(key, Model.from_flat(np.zeros(16, np.float32), SPEC))
            else:
                assert held.holds(key), (key, list(sent._sent), list(held._models))


def test_dga_round_50_carried_again_after_newer_rounds_stays_held() -> None:
    """The case a results-table run met: one host, a fast client that advanced with
    rounds 51-58 while a slow one still needed 50."""
    sent, held = SentVersions(2 * WINDOW), HeldVersions(4 * WINDOW)
    zero = Model.from_flat(np.zeros(16, np.float32), SPEC)
    for r in [50, *range(51, 55), 50, *range(55, 59)]:
        if sent.needs(r):
            held.keep(r, zero)
    for r in list(sent._sent):
        assert held.holds(r)
