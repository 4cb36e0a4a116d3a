"""checkpoint.pt on disk: written whole or not at all, off the loop; both formats read back."""

from __future__ import annotations

import logging
import pickle
from pathlib import Path

import pytest
import torch

from fedsim.actors.checkpoint import _write_atomically, load_checkpoint


def _ckpt(fmt: int) -> dict[str, object]:
    return {"format": fmt, "t": 1.5, "fedsim_version": "v", "scenario_hash": "h" * 64,
            "run": {"events_offset": 3, "metrics_offset": 2},
            "rng": {"torch": torch.get_rng_state()}}


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


@pytest.mark.parametrize("fmt", [1, 2])
def test_both_formats_load_and_cut_the_logs_back(tmp_path: Path, fmt: int) -> None:
    """Format 2 is a pickle; format 1 (torch.save, before 2026-11-28) still resumes."""
    data = _ckpt(fmt)
    path = tmp_path / "checkpoint.pt"
    if fmt == 1:
        torch.save(data, path)
    else:
        path.write_bytes(pickle.dumps(data, protocol=pickle.HIGHEST_PROTOCOL))
    (tmp_path / "events.jsonl").write_bytes(b"abcdef")
    (tmp_path / "metrics.csv").write_bytes(b"xyz")
    got = load_checkpoint(tmp_path, "v", "h" * 64)
    assert got["format"] == fmt
    assert got["t"] == 1.5
    assert torch.equal(got["rng"]["torch"], data["rng"]["torch"])  # type: ignore[index]
    assert (tmp_path / "events.jsonl").read_bytes() == b"abc"
    assert (tmp_path / "metrics.csv").read_bytes() == b"xy"


def test_an_unknown_format_is_refused(tmp_path: Path) -> None:
    (tmp_path / "checkpoint.pt").write_bytes(pickle.dumps(_ckpt(3)))
    with pytest.raises(ValueError, match="unknown checkpoint format 3"):
        load_checkpoint(tmp_path, "v", "h" * 64)
