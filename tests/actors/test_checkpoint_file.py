"""checkpoint.pt on disk: written whole or not at all, off the loop; a pickle is refused unread."""

from __future__ import annotations

import logging
import pickle
import random
from concurrent import futures
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from fedsim.actors.checkpoint import Checkpointer, _write_atomically, load_checkpoint
from fedsim.results.writer import CHECKPOINT_FORMAT
from fedsim.wire import statefile


def _ckpt(fmt: int = CHECKPOINT_FORMAT) -> dict[str, object]:
    return {"format": fmt, "t": 1.5, "fedsim_version": "v", "scenario_hash": "h" * 64,
            "run": {"events_offset": 3, "metrics_offset": 2},
            "rng": {"torch": torch.get_rng_state(), "python": random.getstate()}}


class _Payload:
    """Unpickled, it makes ``marker``: what any code a pickle runs could do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        return (Path.touch, (self.marker,))


def test_a_checkpoint_is_replaced_whole_or_not_at_all(tmp_path: Path,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "checkpoint.pt"
    _write_atomically(path, b"first")
    assert path.read_bytes() == b"first"
    path.with_suffix(".pt.tmp").mkdir()   # the temporary file cannot be made
    with caplog.at_level(logging.ERROR), pytest.raises(IsADirectoryError):
        _write_atomically(path, b"second")
    assert path.read_bytes() == b"first"
    assert "could not write the checkpoint" in caplog.text


def test_a_checkpoint_loads_and_cuts_the_logs_back(tmp_path: Path) -> None:
    data = _ckpt()
    path = tmp_path / "checkpoint.pt"
    _write_atomically(path, statefile.encode(data, "checkpoint"))
    assert path.read_bytes().startswith(b"FEDSIMST")
    (tmp_path / "events.jsonl").write_bytes(b"abcdef")
    (tmp_path / "metrics.csv").write_bytes(b"xyz")
    got = load_checkpoint(tmp_path, "v", "h" * 64)
    assert got["format"] == CHECKPOINT_FORMAT == 3
    assert got["t"] == 1.5
    assert torch.equal(got["rng"]["torch"], data["rng"]["torch"])  # type: ignore[index]
    assert got["rng"]["python"] == data["rng"]["python"]  # type: ignore[index]
    random.setstate(got["rng"]["python"])   # in the form setstate takes
    assert (tmp_path / "events.jsonl").read_bytes() == b"abc"
    assert (tmp_path / "metrics.csv").read_bytes() == b"xy"


@pytest.mark.parametrize("writer", ["pickle", "torch.save"])
def test_a_pickled_checkpoint_is_refused_unread(tmp_path: Path, writer: str) -> None:
    """Formats 1 (torch.save) and 2 (pickle) could run code: never unpickled."""
    marker = tmp_path / "code-ran"
    data = {**_ckpt(2 if writer == "pickle" else 1), "strategy": _Payload(marker)}
    path = tmp_path / "checkpoint.pt"
    if writer == "pickle":
        path.write_bytes(pickle.dumps(data, protocol=pickle.HIGHEST_PROTOCOL))
    else:
        torch.save(data, path)
    (tmp_path / "events.jsonl").write_bytes(b"abcdef")
    with pytest.raises(ValueError, match="is a pickle") as err:
        load_checkpoint(tmp_path, "v", "h" * 64)
    assert str(path) in str(err.value)
    assert "earlier fedsim" in str(err.value)
    assert not marker.exists()
    assert (tmp_path / "events.jsonl").read_bytes() == b"abcdef"   # nothing was cut


def test_an_unknown_format_is_refused(tmp_path: Path) -> None:
    _write_atomically(tmp_path / "checkpoint.pt", statefile.encode(_ckpt(4), "checkpoint"))
    with pytest.raises(ValueError, match="unknown checkpoint format 4"):
        load_checkpoint(tmp_path, "v", "h" * 64)
    (tmp_path / "checkpoint.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="not a fedsim state file"):
        load_checkpoint(tmp_path, "v", "h" * 64)


def _snapshot(now: float) -> dict[str, Any]:
    """What the server hands its checkpointer, from stand-ins of its parts."""
    strategy = SimpleNamespace(version=3, state_dict=lambda: {"x": [1.0, 2.0]})
    state = SimpleNamespace(updates=7, rounds=2, event=lambda *a, **k: None,
                            checkpoint_state=lambda: {"events_offset": 0, "metrics_offset": 0})
    return Checkpointer.snapshot(now, "v", "h" * 64, strategy, state,  # type: ignore[arg-type]
                                 next_task_id=11, clamped=0)


def test_checkpoints_are_written_by_the_end_and_a_failed_write_ends_the_run(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    taker = Checkpointer(tmp_path, every=None, seconds=None, cadence="rounds",
                         real_clock=lambda: 0.0)
    taker.take(_snapshot(1.0))
    taker.take(_snapshot(2.0))
    taker.wait()
    got = load_checkpoint(tmp_path, "v", "h" * 64)
    assert (got["format"], got["t"], got["next_task_id"]) == (3, 2.0, 11)

    (tmp_path / "checkpoint.pt.tmp").mkdir()   # from now on every write fails
    taker.take(_snapshot(3.0))
    assert taker._written is not None
    futures.wait([taker._written])
    with pytest.raises(OSError, match="the checkpoint could not be written"):
        taker.take(_snapshot(4.0))
    with caplog.at_level(logging.ERROR):
        taker.wait()
    assert "the last checkpoint could not be written" in caplog.text
    assert load_checkpoint(tmp_path, "v", "h" * 64)["t"] == 2.0   # the last good one stays
