"""One run's figures and several runs' comparison, drawn from run directories made here."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from matplotlib.collections import PolyCollection
from run_fixtures import make_run

from fedsim.results import plots
from fedsim.results.compare import (
    comparison_rows,
    default_labels,
    format_table,
    plot_comparison,
    shared_target,
    write_csv,
)
from fedsim.results.plots import (
    accuracy_figure,
    plot_run,
    staleness_figure,
    staleness_values,
    timeline_figure,
)
from fedsim.results.reader import load_run
from fedsim.results.timeline import build_timeline, sample_clients


def test_accuracy_and_loss_share_emulated_time_and_mark_the_target(tmp_path: Path) -> None:
    run = load_run(make_run(tmp_path / "r", target=0.6))
    fig = accuracy_figure(run)
    acc, loss = fig.axes
    labels = [line.get_label() for line in acc.get_lines()]
    assert labels[0] == "test accuracy"
    assert "target 0.6" in labels
    hit = next(x for x in labels if x.startswith("target reached"))
    assert hit == f"target reached at {run.summary['time_to_target_s']:.2f} s"
    assert loss.get_ylabel() == "test loss"
    assert loss.get_xlabel() == "emulated time (s)"
    assert len(loss.get_lines()[0].get_xdata()) == len(run.metrics)
    # the old bug: the staleness bars were drawn on the accuracy figure
    assert len(acc.patches) == 0
    assert len(loss.patches) == 0


def test_another_target_replaces_the_scenarios(tmp_path: Path) -> None:
    run = load_run(make_run(tmp_path / "r", target=0.6))
    labels = [line.get_label() for line in accuracy_figure(run, target=0.8).axes[0].get_lines()]
    assert "target 0.8" in labels
    assert "target 0.6" not in labels


def test_staleness_counts_are_bars_on_a_log_axis_with_their_counts(tmp_path: Path) -> None:
    run = load_run(make_run(tmp_path / "r", clients=4))
    values, label, _ = staleness_values(run) or ([], "", "")
    fig = staleness_figure(run)
    assert fig is not None
    (ax,) = fig.axes
    assert ax.get_yscale() == "log"
    assert label.startswith("staleness")
    heights = sorted(p.get_height() for p in ax.patches)
    assert heights == sorted(values.count(v) for v in set(values))
    assert sorted(t.get_text() for t in ax.texts) == sorted(str(int(h)) for h in heights)


def test_rounds_have_no_staleness_plot_and_dga_plots_its_delays(tmp_path: Path) -> None:
    rounds = load_run(make_run(tmp_path / "r", rounds=True, algorithm="fedavg"))
    assert staleness_figure(rounds) is None
    assert [p.name for p in plot_run(rounds)] == ["accuracy.png", "timeline.png"]
    dga = make_run(tmp_path / "d", rounds=True, algorithm="dga")
    with open(dga / "events.jsonl", "a") as fh:
        for i, d in enumerate([3, 5, 5, 40]):
            fh.write(json.dumps({"t": 1.0 + i, "real": 0.0, "ev": "correction",
                                 "client": 0, "round": i, "delay": d}) + "\n")
    values, label, noun = staleness_values(load_run(dga)) or ([], "", "")
    assert sorted(values) == [3, 5, 5, 40]
    assert label.startswith("DGA delay D")
    assert noun == "corrections"


def test_the_timeline_draws_every_lane_and_samples_large_federations(tmp_path: Path) -> None:
    run = load_run(make_run(tmp_path / "r", clients=60))
    ids = sample_clients(range(60))
    tl = build_timeline(run.events, clients=ids, total_clients=60)
    fig = timeline_figure(tl, title="r")
    (ax, colourbar) = fig.axes
    assert ax.get_title() == "r: what each client did (40 of 60 clients)"
    assert [t.get_text() for t in ax.get_yticklabels()] == [str(c) for c in ids]
    bars = [len(c.get_paths()) for c in ax.collections if isinstance(c, PolyCollection)]
    expected = [sum(len(getattr(c, lane)) for c in tl.clients.values())
                for lane in ("download", "upload", "training")]
    assert bars[:3] == expected
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend[:5] == ["download (server to client)", "training", "upload (client to server)",
                          "waiting (barrier, or update not yet applied)",
                          "away (off or suspended)"]
    assert "update aggregated (colour: staleness)" in legend
    assert colourbar.get_ylabel() == "staleness of the aggregated update"


def test_a_part_of_the_timeline_keeps_the_whole_runs_colour_scale(tmp_path: Path) -> None:
    """Client c's updates have staleness c: clients 0-1, or the first 0.3 s (client 0's
    first update only), reach 1 and 0; the scale stays the run's 0 to 3."""
    run = load_run(make_run(tmp_path / "r", clients=4))

    def scale(clients=None, end=None):
        tl = build_timeline(run.events, clients=clients, total_clients=4, end=end)
        scatter = next(c for c in timeline_figure(tl, title="r").axes[0].collections
                       if not isinstance(c, PolyCollection))
        return scatter.norm.vmin, scatter.norm.vmax

    assert scale() == (0, 3)
    assert scale(clients=[0, 1]) == (0, 3)
    assert scale(end=0.3) == (0, 3)
    tl = build_timeline(run.events, clients=[0], start=0.0, end=0.3)
    assert [s for _, s in tl.clients[0].aggregated] == [0]
    assert tl.staleness_max == 3


def test_timeline_names_say_which_part_of_the_run() -> None:
    assert plots.timeline_name() == "timeline.png"
    assert plots.timeline_name((2.0, 6.0)) == "timeline-2-6.png"
    assert plots.timeline_name((0.5, None), [3, 0, 1, 2]) == "timeline-0.5-end-clients-0-3.png"
    many = plots.timeline_name(None, list(range(0, 200, 2)))
    assert many.startswith("timeline-clients-100-")
    assert len(many) < 60


def test_plot_run_writes_the_three_figures_and_skips_a_large_timeline(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = make_run(tmp_path / "r")
    written = plot_run(d)
    assert [p.name for p in written] == ["accuracy.png", "staleness.png", "timeline.png"]
    for p in written:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (d / "timeline.png").unlink()
    monkeypatch.setattr(plots, "TIMELINE_AUTO_MAX_BYTES", 1000)
    assert plots.timeline_is_large(d)
    assert [p.name for p in plot_run(d)] == ["accuracy.png", "staleness.png"]
    assert not (d / "timeline.png").exists()
    assert plot_run(d, timeline=True)[-1].name == "timeline.png"


def test_an_older_run_is_plotted(tmp_path: Path) -> None:
    d = make_run(tmp_path / "old", fmt=None)
    run = load_run(d)
    assert run.format == 1
    tl = build_timeline(run.events)
    assert all(c.upload and c.download for c in tl.clients.values())
    assert [p.name for p in plot_run(run)] == ["accuracy.png", "staleness.png", "timeline.png"]


# -- several runs -------------------------------------------------------------------------
def _two(tmp_path: Path) -> list:
    a = make_run(tmp_path / "a" / "run", speed=1.5, target=0.6)
    b = make_run(tmp_path / "b" / "run", speed=0.3, target=0.6, rounds=True,
                 algorithm="fedavg")
    return [load_run(a), load_run(b)]


def test_the_comparison_table(tmp_path: Path) -> None:
    runs = _two(tmp_path)
    labels = default_labels(runs)
    assert labels == ["a/run", "b/run"]  # equal names: the parent tells them apart
    target = shared_target(runs)
    assert target == 0.6
    rows = comparison_rows(runs, labels, target)
    fast, slow = rows
    assert fast.time_to_target == runs[0].summary["time_to_target_s"] == 1.0
    assert slow.time_to_target is None  # 0.9 * (1 - exp(-0.9)) < 0.6
    assert (fast.staleness_mean, slow.staleness_mean) == (1.5, None)
    assert slow.rounds > 0
    assert fast.rounds == 0
    assert fast.megabytes == pytest.approx((6 * 4000 + 6 * 4100) / 1e6)
    table = format_table(rows).splitlines()
    assert table[0].split()[:5] == ["run", "algorithm", "status", "final", "acc"]
    assert "time to 0.6 (s)" in table[0]
    assert "not reached" in table[2]
    assert "1.00" in table[1]
    path = write_csv(rows, tmp_path / "compare.csv")
    with open(path) as fh:
        back = list(csv.DictReader(fh))
    assert [r["run"] for r in back] == labels
    assert back[0]["time_to_target"] == "1.0"
    assert back[1]["time_to_target"] == ""


def test_the_overlay_figures(tmp_path: Path) -> None:
    runs = _two(tmp_path)
    out = tmp_path / "cmp"
    out.mkdir()
    paths = plot_comparison(runs, ["fast", "slow"], out, 0.6)
    assert [p.name for p in paths] == ["compare-time.png", "compare-progress.png",
                                       "compare-bytes.png"]
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in paths)


def test_no_shared_target_when_the_runs_disagree(tmp_path: Path) -> None:
    a = load_run(make_run(tmp_path / "a", target=0.6))
    b = load_run(make_run(tmp_path / "b", target=0.7))
    assert shared_target([a, b]) is None
    rows = comparison_rows([a, b], ["a", "b"], None)
    assert all(r.time_to_target is None and r.target is None for r in rows)
    assert "time to target" in format_table(rows)
