"""``fedsim plot`` and ``fedsim compare`` through click's runner."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from run_fixtures import make_run

from fedsim.cli import cli
from fedsim.results.writer import FORMAT_FILE


def invoke(*args: str) -> tuple[int, str, str]:
    res = CliRunner().invoke(cli, list(args))
    return res.exit_code, res.stdout, res.stderr


def test_plot_one_run_writes_its_figures_into_its_directory(tmp_path: Path) -> None:
    d = make_run(tmp_path / "r")
    code, out, _ = invoke("plot", str(d))
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == f"{d}: completed (time_budget)"
    assert lines[1:] == [str(d / n) for n in ("accuracy.png", "staleness.png", "timeline.png")]


def test_plot_a_window_of_chosen_clients(tmp_path: Path) -> None:
    d = make_run(tmp_path / "r", clients=6)
    code, out, _ = invoke("plot", str(d), "--clients", "1-2,5", "--window", "0.5:2")
    assert code == 0, out
    # only the part asked for, named after it, said where
    assert out.splitlines()[1:] == [str(d / "timeline-0.5-2-clients-1-2,5.png")]
    assert sorted(p.name for p in d.glob("*.png")) == ["timeline-0.5-2-clients-1-2,5.png"]


def test_a_window_never_overwrites_the_runs_own_timeline(tmp_path: Path) -> None:
    d = make_run(tmp_path / "r")
    assert invoke("plot", str(d))[0] == 0
    whole = (d / "timeline.png").read_bytes()
    code, out, _ = invoke("plot", str(d), "--window", "1:2")
    assert code == 0
    assert out.splitlines()[1:] == [str(d / "timeline-1-2.png")]
    code, out, _ = invoke("plot", str(d), "--window", "2:")
    assert out.splitlines()[1:] == [str(d / "timeline-2-end.png")]
    code, out, _ = invoke("plot", str(d), "--clients", "0-1")
    assert out.splitlines()[1:] == [str(d / "timeline-clients-0-1.png")]
    assert (d / "timeline.png").read_bytes() == whole
    for name in ("timeline-1-2.png", "timeline-2-end.png", "timeline-clients-0-1.png"):
        assert (d / name).read_bytes()[:4] == b"\x89PNG"
        assert (d / name).read_bytes() != whole


def test_plot_out_names_the_timelines_file_or_the_figures_directory(tmp_path: Path) -> None:
    d = make_run(tmp_path / "r")
    zoom = tmp_path / "figs" / "zoom.png"
    code, out, err = invoke("plot", str(d), "--window", "0.5:1.5", "--out", str(zoom))
    assert code == 0, err
    assert out.splitlines()[1:] == [str(zoom)]
    assert zoom.read_bytes()[:4] == b"\x89PNG"
    assert not list(d.glob("*.png"))
    code, out, _ = invoke("plot", str(d), "--timeline", "--out", str(tmp_path / "whole.png"))
    assert out.splitlines()[1:] == [str(tmp_path / "whole.png")]
    elsewhere = tmp_path / "elsewhere"
    code, out, _ = invoke("plot", str(d), "--out", str(elsewhere))
    assert code == 0
    assert out.splitlines()[1:] == [str(elsewhere / n) for n in ("accuracy.png",
                                                                  "staleness.png",
                                                                  "timeline.png")]
    code, out, _ = invoke("plot", str(d), "--window", "1:2", "--out", str(elsewhere))
    assert out.splitlines()[1:] == [str(elsewhere / "timeline-1-2.png")]
    assert not list(d.glob("*.png"))


@pytest.mark.parametrize(("make", "needle"), [
    (lambda d: d.mkdir(), "is not a run directory"),
    (lambda d: None, "not a directory"),
    (lambda d: (make_run(d), (d / FORMAT_FILE).write_text(json.dumps({"format": 99}))),
     "format 99"),
])
def test_plot_refuses_what_it_cannot_read_with_exit_2_and_one_line(
        tmp_path: Path, make: object, needle: str) -> None:
    d = tmp_path / "x"
    make(d)  # type: ignore[operator]
    code, out, err = invoke("plot", str(d))
    assert code == 2
    assert out == ""
    assert err.startswith("error: ")
    assert needle in err
    assert err.count("\n") == 1
    assert not (d / "accuracy.png").exists()


@pytest.mark.parametrize(("args", "needle"), [
    (["--window", "5:2"], "--window"),
    (["--window", "later"], "--window"),
    (["--clients", "0-99"], "goes past the scenario's 4 clients"),
    (["--label", "x"], "--label names each of several runs"),
    (["--out", "t.png"], "--out t.png names one figure: give --timeline, --window or"),
])
def test_plot_bad_options_exit_2_naming_them(tmp_path: Path, args: list[str],
                                             needle: str) -> None:
    d = make_run(tmp_path / "r")
    code, _, err = invoke("plot", str(d), *args)
    assert code == 2
    assert needle in err


def test_plot_several_runs_compares_them(tmp_path: Path) -> None:
    a = make_run(tmp_path / "runs" / "fast", speed=1.5)
    b = make_run(tmp_path / "runs" / "slow", speed=0.3, rounds=True, algorithm="fedavg")
    code, out, _ = invoke("plot", str(a), str(b), "--target", "0.5")
    assert code == 0, out
    lines = out.splitlines()
    assert lines[0].split()[:2] == ["run", "algorithm"]
    assert "time to 0.5 (s)" in lines[0]
    assert lines[1].split()[:3] == ["fast", "fedasync", "completed"]
    assert lines[2].split()[:3] == ["slow", "fedavg", "completed"]
    parent = tmp_path / "runs"  # the default: the first run's parent
    assert lines[3:] == [str(parent / n) for n in ("compare.csv", "compare-time.png",
                                                   "compare-progress.png", "compare-bytes.png")]
    assert not (a / "timeline.png").exists()  # one run's plots are not redrawn


def test_compare_with_labels_and_an_output_directory(tmp_path: Path) -> None:
    a = make_run(tmp_path / "a")
    b = make_run(tmp_path / "b")
    out_dir = tmp_path / "out" / "cmp"
    code, out, _ = invoke("compare", str(a), str(b), "--label", "FedAsync",
                          "--label", "Other", "--out", str(out_dir))
    assert code == 0, out
    assert [line.split()[0] for line in out.splitlines()[1:3]] == ["FedAsync", "Other"]
    assert (out_dir / "compare.csv").exists()
    assert (out_dir / "compare-bytes.png").exists()


def test_compare_errors(tmp_path: Path) -> None:
    a = make_run(tmp_path / "a")
    code, _, err = invoke("compare", str(a), str(a), "--label", "only-one")
    assert code == 2
    assert "1 labels for 2 runs" in err
    empty = tmp_path / "empty"
    empty.mkdir()
    code, _, err = invoke("compare", str(a), str(empty))
    assert code == 2
    assert "is not a run directory" in err
    code, _, err = invoke("plot", str(a), str(a), "--timeline")
    assert code == 2
    assert "give one RUN" in err
    code, _, err = invoke("plot", str(a), str(a), "--out", str(tmp_path / "c.png"))
    assert code == 2
    assert "several runs' figures go to a directory" in err


def test_compare_warns_when_the_runs_learn_different_tasks(tmp_path: Path) -> None:
    a = make_run(tmp_path / "a")
    b = make_run(tmp_path / "b", data={"dataset": "digits"}, model={"hidden": [64]})
    c = make_run(tmp_path / "c", clients=6, model={"name": "cnn", "hidden": [64]})
    code, out, err = invoke("compare", str(a), str(b), str(c))
    assert code == 0, err
    assert err.splitlines() == [
        "warning: these runs learn different tasks, so their accuracies do not compare:",
        "  data.dataset: synthetic (a, c), digits (b)",
        "  data.num_clients: 4 (a, b), 6 (c)",
        "  model.name: mlp (a, b), cnn (c)",
        "  model.hidden: [200] (a), [64] (b)"]   # c's cnn reads no hidden
    assert out.splitlines()[1].split()[0] == "a"   # the table is still printed
    # the same task (another algorithm, a key the model does not read) is no warning
    d = make_run(tmp_path / "d", algorithm="fedavg", rounds=True,
                 model={"lstm_hidden": 64, "hidden": [200]})
    code, _, err = invoke("compare", str(a), str(d))
    assert (code, err) == (0, "")
    # fedsim plot of several runs warns alike; two cnns differ in clients only (a cnn
    # reads no model.hidden)
    e = make_run(tmp_path / "e", model={"name": "cnn", "hidden": [32]})
    code, _, err = invoke("plot", str(c), str(e))
    assert err.splitlines() == [
        "warning: these runs learn different tasks, so their accuracies do not compare:",
        "  data.num_clients: 6 (c), 4 (e)"]


def test_compare_warns_about_a_run_whose_task_it_cannot_check(tmp_path: Path) -> None:
    a = make_run(tmp_path / "a")
    b = make_run(tmp_path / "b")
    (b / "scenario.json").unlink()
    code, _, err = invoke("compare", str(a), str(b))
    assert code == 0
    assert err == ("warning: b has no scenario.json: whether its task is the others' is not "
                   "checked\n")
