"""The fedsim command line: scenario errors exit 2 and name the key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """The command as a user runs it: its own process."""
    return subprocess.run([sys.executable, "-m", "fedsim.cli", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def cli_inproc(*args: str) -> subprocess.CompletedProcess[str]:
    """The same command in this process (click's runner): the same code and exit
    codes without a second interpreter's start-up."""
    from click.testing import CliRunner

    from fedsim.cli import cli

    res = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return subprocess.CompletedProcess(list(args), res.exit_code, res.stdout, res.stderr)


@pytest.mark.parametrize(
    ("toml", "sets", "needles"),
    [
        ("[data]\nbogus = 1\n", [], ["data.bogus", "unknown key"]),
        ("[algorithm]\nname = \"fedasync\"\nalpha = 1.5\n", [],
         ["algorithm.alpha", "1.5", "less than or equal to 1"]),
        ("[data]\ndataset = \"imagenet\"\n", [], ["data.dataset", "imagenet", "'synthetic'"]),
        ("[client]\nlocal_steps = \"ten\"\n", [], ["client.local_steps", "ten", "integer"]),
        ("[algorithm]\nname = \"nope\"\n", [], ["algorithm.name", "nope", "fedasync"]),
        ("", ["algorithm.staleness=\"cubic\""], ["algorithm.staleness", "cubic", "'poly'"]),
        ("", ["run.time_budget=-1"], ["run.time_budget", "-1", "greater than 0"]),
        ("", ["nokey"], ["expected dotted.key=value"]),
        ("[algorithm]\nname = \"fedavg\"\nmu = 0.1\n", [], ["mu=0.1", "fedprox"]),
        ("this is = = not toml", [], ["not valid TOML"]),
        ("[algorithm]\nname = \"dga\"\n", ["client.optimizer=\"adam\""],
         ["client.optimizer", "'adam'", "'dga'", "sgd, sgdm"]),
        ("[algorithm]\nname = \"fedspeed\"\n[client]\noptimizer = \"deltasgd\"\n", [],
         ["client.optimizer", "'deltasgd'", "'fedspeed'", "adagrad"]),
    ],
)
def test_bad_scenarios_exit_2_naming_the_key(tmp_path: Path, toml: str, sets: list[str],
                                             needles: list[str]) -> None:
    path = tmp_path / "s.toml"
    path.write_text(toml)
    args = ["check", str(path)]
    for s in sets:
        args += ["--set", s]
    res = cli_inproc(*args)
    assert res.returncode == 2, res
    for needle in needles:
        assert needle in res.stderr, (needle, res.stderr)


def test_run_validates_before_starting(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text("[network.up]\ndelay = -0.1\n")
    res = run_cli("run", str(path), "--out", str(tmp_path / "r"))
    assert res.returncode == 2
    assert "network.up.delay" in res.stderr
    assert not (tmp_path / "r").exists()


def test_missing_file_exits_2(tmp_path: Path) -> None:
    res = cli_inproc("check", str(tmp_path / "nope.toml"))
    assert res.returncode == 2
    assert "no such scenario file" in res.stderr


def test_check_prints_resolved_defaults(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text("[algorithm]\nname = \"fedprox\"\nmu = 0.01\n")
    res = cli_inproc("check", str(path), "--set", "client.lr=0.1")
    assert res.returncode == 0, res.stderr
    assert "mu = 0.01" in res.stdout
    assert "lr = 0.1" in res.stdout
    assert "batch_size = 32" in res.stdout


def test_every_shipped_scenario_validates() -> None:
    from fedsim.scenario import load
    from fedsim.scenario.network import NetPlan

    paths = sorted((ROOT / "scenarios").glob("*.toml"))
    assert len(paths) >= 10
    for path in paths:  # what `fedsim check` does, in this process
        NetPlan(load(path)).check()
    res = run_cli("check", str(paths[0]))  # and the command itself, once
    assert res.returncode == 0, res.stderr


def _phase(n: int, p50: float, p99: float) -> dict[str, float | int]:
    return {"n": n, "mean": p50, "p50": p50, "p95": p99, "p99": p99, "max": p99}


PHASES_SUMMARY = {
    "status": "completed", "stop_reason": "time_budget", "algorithm": "fedasync",
    "clients": 20, "updates": 392, "emulated_seconds": 30.0, "real_seconds": 60.9,
    "final_accuracy": 0.87, "best_accuracy": 0.88,
    "transfer": {"down": {"messages": 400, "p50_ms": 250.2, "p95_ms": 252.0},
                 "up": {"messages": 392, "p50_ms": 249.8, "p95_ms": 253.4}},
    "fidelity": {"verdict": "pass", "lateness_ms": {"p50": 0.1, "p99": 1.3}},
    "phases": {
        "encode": {"server": _phase(400, 8e-6, 2.1e-5), "hosts": _phase(392, 7e-6, 1.9e-5)},
        "decode": {"server": _phase(392, 3.1e-5, 9e-5), "hosts": _phase(400, 3e-5, 8.8e-5)},
        "queueing": {"server": _phase(392, 2.5e-4, 3.2e-3),
                     "hosts": _phase(400, 1.2e-4, 1.1e-3)},
        "compute": {"real": _phase(400, 0.0091, 0.0153), "budget": _phase(400, 0.04, 0.04)},
        "aggregation": {"server": _phase(392, 4.1e-4, 1.2e-3)},
        "evaluation": {"worker": _phase(40, 0.0131, 0.0188),
                       "round_trip": _phase(40, 0.0152, 1.5)},
    },
}


def test_run_prints_where_time_went(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``fedsim run`` ends with a few lines: per phase, p50 / p99 / n of each part."""
    import fedsim.api
    from fedsim.results.values import RunResult

    result = RunResult.of(tmp_path, PHASES_SUMMARY)
    monkeypatch.setattr(fedsim.api, "run", lambda sc, **kw: result)
    res = cli_inproc("run", str(ROOT / "scenarios" / "quickstart.toml"), "--no-progress")
    assert res.returncode == 0, res
    block = res.stdout[res.stdout.index("  where time went"):].splitlines()[:8]
    assert block == [
        "  where time went  p50 / p99 / n (real time unless marked emulated)",
        "    encode         server 8 us / 21 us / 400; hosts 7 us / 19 us / 392",
        "    decode         server 31 us / 90 us / 392; hosts 30 us / 88 us / 400",
        "    queueing       server 250 us / 3.2 ms / 392; hosts 120 us / 1.1 ms / 400",
        "    transfer       down 250 ms / 252 ms / 400; up 250 ms / 253 ms / 392 "
        "(emulated; p50 / p95 / n)",
        "    compute        real 9.1 ms / 15.3 ms / 400; budget 40 ms / 40 ms / 400 "
        "(budget: emulated)",
        "    aggregation    server 410 us / 1.2 ms / 392",
        "    evaluation     worker 13.1 ms / 18.8 ms / 40; round trip 15.2 ms / 1.5 s / 40",
    ]
    summary = result.summary
    assert summary.phases["queueing"]["server"].p99 == 3.2e-3
    assert summary.phases["evaluation"]["round_trip"].n == 40
    assert result.phases == summary.phases


def test_a_summary_without_phases_prints_no_block(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import fedsim.api
    from fedsim.results.values import RunResult

    old = {k: v for k, v in PHASES_SUMMARY.items() if k != "phases"}
    monkeypatch.setattr(fedsim.api, "run", lambda sc, **kw: RunResult.of(tmp_path, old))
    res = cli_inproc("run", str(ROOT / "scenarios" / "quickstart.toml"), "--no-progress")
    assert res.returncode == 0, res
    assert "where time went" not in res.stdout
    assert "run directory" in res.stdout


def test_run_prints_corrected_send_times_and_the_guard(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import fedsim.api
    from fedsim.results.values import RunResult

    summary = {**PHASES_SUMMARY, "send_times_clamped": 37,
               "send_time_corrections": {"out_of_window": 1, "before_record": 36},
               "guard": {"rejected": 4, "clipped": 2},
               "fidelity": {"verdict": "fail", "lateness_ms": {"p50": 0.1, "p99": 1.3},
                            "reasons": ["send_times[host-1]: 37 outside 0 corrected"],
                            "clocks": {"host-0": {"send_times_corrected": 0},
                                       "host-1": {"send_times_corrected": 37}}}}
    monkeypatch.setattr(fedsim.api, "run", lambda sc, **kw: RunResult.of(tmp_path, summary))
    res = cli_inproc("run", str(ROOT / "scenarios" / "quickstart.toml"), "--no-progress")
    assert res.returncode == 0, res
    assert "    fail: send_times[host-1]: 37 outside 0 corrected" in res.stdout
    assert ("  corrected        37 messages claimed a send time the server's record does not "
            "allow (1 out of the window, 36 before their task's earliest delivery and "
            "compute; by host: host-1 37): corrected, not judged, and the verdict fails"
            in res.stdout)
    assert "  update guard     4 rejected, 2 clipped" in res.stdout
