"""Reading a run directory: order, format versions, older runs, and what is not a run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fedsim.results.reader import NotARunError, RunFormatError, load_run, run_format, sort_events
from fedsim.results.writer import FORMAT_FILE, RUN_FORMAT, write_run_format


def _write_events(path: Path, records: list[dict[str, Any]], tail: str = "") -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + tail)


def _run_dir(tmp_path: Path, records: list[dict[str, Any]], *, fmt: int | None = RUN_FORMAT,
             summary: dict[str, Any] | None = None) -> Path:
    d = tmp_path / "run"
    d.mkdir()
    if fmt is not None:
        write_run_format(d, "test")
    _write_events(d / "events.jsonl", records)
    (d / "metrics.csv").write_text("t,real,version,round,updates,accuracy,loss,staleness_mean,"
                                   "bytes_up,bytes_down\n0,0,0,0,0,0.1,2.3,,0,0\n"
                                   "1.5,3,4,0,4,0.6,1.1,2,400,500\n")
    (d / "summary.json").write_text(json.dumps(summary or {"status": "completed",
                                                           "algorithm": "fedasync"}))
    return d


def test_events_come_sorted_by_t_with_ties_in_append_order(tmp_path: Path) -> None:
    # a host's batch arrives after the server's later records; an evaluation is
    # written when it finishes, stamped with the time of the model it evaluated
    records = [
        {"t": 0.0, "real": 0.0, "ev": "start"},
        {"t": 0.6, "real": 1.2, "ev": "aggregate", "clients": [3], "staleness": 0},
        {"t": 0.35, "real": 0.7, "ev": "send", "client": 3, "kind": "update", "n": 1},
        {"t": 0.35, "real": 0.7, "ev": "train_end", "client": 3, "n": 2},
        {"t": 0.25, "real": 0.5, "ev": "train_start", "client": 3},
        {"t": 0.35, "real": 0.7, "ev": "warning", "client": 3, "n": 3},
        {"t": 0.5, "real": 2.0, "ev": "evaluate", "accuracy": 0.3},
    ]
    run = load_run(_run_dir(tmp_path, records))
    assert [e["t"] for e in run.events] == [0.0, 0.25, 0.35, 0.35, 0.35, 0.5, 0.6]
    assert [e["n"] for e in run.events if e["t"] == 0.35] == [1, 2, 3]
    assert run.format == RUN_FORMAT
    assert run.algorithm == "fedasync"
    assert run.column("accuracy") == [0.1, 0.6]


def test_a_torn_last_line_and_records_without_time_are_left_out(tmp_path: Path) -> None:
    d = _run_dir(tmp_path, [])
    _write_events(d / "events.jsonl", [
        {"t": 1.0, "real": 0.0, "ev": "start"},
        {"real": 0.0, "ev": "start"},            # no t
        {"t": "soon", "real": 0.0, "ev": "end"},  # not a number
        {"t": 0.5, "real": 0.0},                  # no ev
    ], tail='{"t": 2.0, "ev": "aggre')
    run = load_run(d)
    assert [e["t"] for e in run.events] == [1.0]
    assert run.skipped == 3


def test_sort_events_is_stable_and_counts_what_it_drops() -> None:
    records: list[dict[str, Any]] = [{"t": 2, "ev": "a"}, {"t": 1, "ev": "b"},
                                     {"t": 2, "ev": "c"}, {"t": float("nan"), "ev": "d"}]
    kept, skipped = sort_events(records)
    assert [e["ev"] for e in kept] == ["b", "a", "c"]
    assert skipped == 1


def test_an_older_run_without_a_version_reads_as_format_1_with_kinds_normalised(
        tmp_path: Path) -> None:
    records = [
        {"t": 0.0, "real": 0.0, "ev": "send", "client": 1, "kind": "task", "dir": "down"},
        {"t": 0.25, "real": 0.5, "ev": "deliver", "client": 1, "kind": "Task", "dir": "down",
         "sent_at": 0.0},
        {"t": 0.6, "real": 1.2, "ev": "drop", "client": 1, "kind": "Update", "dir": "up"},
    ]
    d = _run_dir(tmp_path, records, fmt=None)
    assert not (d / FORMAT_FILE).exists()
    run = load_run(d)
    assert run.format == 1
    assert [e["kind"] for e in run.events] == ["task", "task", "update"]


def test_the_summary_says_the_format_when_the_version_file_is_missing(tmp_path: Path) -> None:
    d = _run_dir(tmp_path, [{"t": 0.0, "real": 0.0, "ev": "deliver", "kind": "Task"}],
                 fmt=None, summary={"format": 2, "status": "completed"})
    run = load_run(d)
    assert run.format == 2
    assert run.events[0]["kind"] == "Task"  # format 2 is taken as written


@pytest.mark.parametrize("make", [
    lambda d: None,                                          # an empty directory
    lambda d: (d / "notes.txt").write_text("not a run"),    # something else
])
def test_a_directory_that_is_not_a_run_says_so(tmp_path: Path, make: Any) -> None:
    make(tmp_path)
    with pytest.raises(NotARunError, match="is not a run directory") as info:
        load_run(tmp_path)
    assert info.value.path == tmp_path
    assert "summary.json" in str(info.value)


def test_a_file_or_a_missing_path_is_not_a_run(tmp_path: Path) -> None:
    f = tmp_path / "summary.json"
    f.write_text("{}")
    with pytest.raises(NotARunError, match="not a directory"):
        load_run(f)
    with pytest.raises(NotARunError, match="not a directory"):
        load_run(tmp_path / "missing")


def test_a_newer_format_is_refused_naming_both_versions(tmp_path: Path) -> None:
    d = _run_dir(tmp_path, [])
    (d / FORMAT_FILE).write_text(json.dumps({"format": RUN_FORMAT + 1,
                                             "fedsim_version": "9.9"}))
    with pytest.raises(RunFormatError) as info:
        load_run(d)
    msg = str(info.value)
    assert f"format {RUN_FORMAT + 1}" in msg
    assert "9.9" in msg
    assert f"formats 1 to {RUN_FORMAT}" in msg


@pytest.mark.parametrize(("content", "needle"), [
    ("{not json", "unreadable"),
    ('{"fedsim_version": "0.1"}', "unreadable"),
    ('{"format": "2"}', "must be an integer"),
    ('{"format": 0}', "does not exist"),
])
def test_a_damaged_version_file_is_a_format_error(tmp_path: Path, content: str,
                                                  needle: str) -> None:
    d = _run_dir(tmp_path, [])
    (d / FORMAT_FILE).write_text(content)
    with pytest.raises(RunFormatError, match=needle):
        run_format(d)


def test_events_false_reads_only_the_summary_and_metrics(tmp_path: Path) -> None:
    d = _run_dir(tmp_path, [{"t": 0.0, "real": 0.0, "ev": "start"}])
    run = load_run(d, events=False)
    assert run.events == []
    assert run.summary["status"] == "completed"
    assert len(run.metrics) == 2


def test_a_run_killed_before_its_first_record_is_still_a_run(tmp_path: Path) -> None:
    d = tmp_path / "run"
    d.mkdir()
    write_run_format(d, "test")
    run = load_run(d)
    assert (run.format, run.status, run.events, run.metrics) == (RUN_FORMAT, "unknown", [], [])
