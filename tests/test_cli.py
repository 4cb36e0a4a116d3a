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
    from fedsim.network import NetPlan
    from fedsim.scenario import load

    paths = sorted((ROOT / "scenarios").glob("*.toml"))
    assert len(paths) >= 10
    for path in paths:  # what `fedsim check` does, in this process
        NetPlan(load(path)).check()
    res = run_cli("check", str(paths[0]))  # and the command itself, once
    assert res.returncode == 0, res.stderr
