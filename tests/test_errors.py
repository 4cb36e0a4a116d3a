"""What a new user stumbled on, fixed; and the typed errors the command line maps to exit codes.

Every command runs in this process through click's CliRunner.
"""

from __future__ import annotations

import ast
import json
import pickle
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

import fedsim.api
from fedsim import cli
from fedsim.errors import (
    DeployError,
    FedsimError,
    OverrideError,
    PluginError,
    ResumeError,
    RunFailed,
    RunInterrupted,
    ScenarioError,
)
from fedsim.results.values import RunResult
from fedsim.scenario import load, parse, resolved

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = str(ROOT / "scenarios" / "quickstart.toml")


def fedsim_cli(*args: str) -> Result:
    return CliRunner().invoke(cli.cli, list(args), catch_exceptions=False)


def test_a_bad_set_is_blamed_on_the_command_line_not_the_file() -> None:
    res = fedsim_cli("check", QUICKSTART, "--set", "run.time_budget=-1")
    assert res.exit_code == 2
    assert "invalid override from the command line" in res.stderr
    assert "run.time_budget: Input should be greater than 0 (got -1)" in res.stderr
    assert "(from --set run.time_budget=-1)" in res.stderr
    assert "quickstart.toml: invalid scenario" not in res.stderr


@pytest.mark.parametrize(("item", "line"), [
    ("netwrk.up.delay=0.1", "  netwrk: unknown key (did you mean 'network'?) "
     "(from --set netwrk.up.delay=0.1)"),
    ("network.upp.delay=0.1", "  network.upp: unknown key (did you mean 'up'?) "
     "(from --set network.upp.delay=0.1)"),
])
def test_a_typo_in_an_overrides_section_is_blamed_on_the_command_line(item: str,
                                                                       line: str) -> None:
    """The override made the unknown table: the file is not to blame."""
    res = fedsim_cli("check", QUICKSTART, "--set", item)
    assert res.exit_code == 2
    assert res.stderr.splitlines() == [
        f"error: invalid override from the command line (not in {QUICKSTART})", line]


def test_a_typo_in_a_section_both_the_file_and_an_override_name_is_the_files(
        tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text("[netwrk]\nprofile = \"lan\"\n")
    res = fedsim_cli("check", str(path), "--set", "netwrk.up.delay=0.1")
    assert res.exit_code == 2
    assert res.stderr.splitlines() == [f"error: {path}: invalid scenario",
                                       "  netwrk: unknown key (did you mean 'network'?)"]


def test_a_typo_in_a_python_overrides_section_is_blamed_on_it() -> None:
    with pytest.raises(OverrideError) as info:
        fedsim.load(QUICKSTART, overrides={"netwrk.up.delay": 0.1})
    assert info.value.keys == ("netwrk.up.delay",)
    assert "netwrk: unknown key (did you mean 'network'?) (from overrides['netwrk.up.delay'])" \
        in str(info.value)
    sc = fedsim.load(QUICKSTART)
    with pytest.raises(OverrideError, match=r"from overrides\['netwrk.up.delay'\]"):
        fedsim.load(sc, overrides={"netwrk.up.delay": 0.1})    # a scenario derived from
    with pytest.raises(OverrideError, match=r"from overrides\['netwrk.up.delay'\]"):
        fedsim.load({"name": "m"}, overrides={"netwrk.up.delay": 0.1})   # ... and a mapping


def test_a_bad_dilation_names_what_is_allowed_in_words(tmp_path: Path) -> None:
    out = tmp_path / "run"
    res = fedsim_cli("run", QUICKSTART, "--dilation", "fast", "--out", str(out))
    assert res.exit_code == 2
    assert "run.dilation: 'fast' is not allowed: expected a number > 0 or 'auto'" in res.stderr
    assert "(from --dilation fast)" in res.stderr
    assert "constrained-float" not in res.stderr
    assert "literal[" not in res.stderr
    assert not out.exists()


def test_file_and_override_problems_are_told_apart(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text("[data]\nbogus = 1\n")
    res = fedsim_cli("check", str(path), "--set", "client.lr=0")
    assert res.exit_code == 2
    lines = res.stderr.splitlines()
    assert lines[0] == f"error: {path}: invalid scenario"
    assert "  data.bogus: unknown key (allowed keys: dataset, num_clients," in res.stderr
    assert any(line.startswith("  client.lr: Input should be greater than 0 (got 0)")
               and line.endswith("(from --set client.lr=0)") for line in lines)


@pytest.mark.parametrize(
    ("toml", "expected"),
    [
        ("[algorithm]\nname = \"fedasyn\"\n",
         "algorithm.name: unknown algorithm 'fedasyn' (allowed: 'asyncfeded', 'dga', 'fedadagrad'"),
        ("[algorithm]\nname = \"fedasyn\"\n", "; did you mean 'fedasync'?"),
        ("[data]\ndatset = \"digits\"\n", "data.datset: unknown key (did you mean 'dataset'?)"),
        ("[netwrok]\nprofile = \"lan\"\n", "netwrok: unknown key (did you mean 'network'?)"),
        ("[algorithm]\nname = \"fedasync\"\nalpah = 0.3\n",
         "algorithm.alpah: unknown key (did you mean 'alpha'?)"),
        ("[run]\nlr = 0.1\n", "run.lr: unknown key here; lr is a key of [client]"),
        ("[algorithm]\nname = \"fedasync\"\nstaleness = \"hindge\"\n",
         "algorithm.staleness: 'hindge' is not allowed (allowed: 'const', 'poly', 'hinge'); "
         "did you mean 'hinge'?"),
        ("[[network.groups]]\nprofile = \"4gg\"\nfraction = 0.5\n",
         "network.groups[0].profile: '4gg' is not allowed (allowed: '3g', '4g',"),
        ("[network.up]\nrate = \"fast\"\n",
         "network.up.rate: 'fast' is not allowed: expected a number > 0 or 'unlimited'"),
        ("[model]\nname = \"mlpp\"\n",
         "model.name: unknown model 'mlpp' (allowed: 'mlp', 'cnn', 'cnn_mnist', 'char_lstm', "
         "or a plug-in 'module:attribute'); did you mean 'mlp'?"),
        ("data = 3\n", "data: must be a table (got 3)"),
    ],
)
def test_errors_say_the_key_the_value_and_what_is_allowed(tmp_path: Path, toml: str,
                                                           expected: str) -> None:
    path = tmp_path / "s.toml"
    path.write_text(toml)
    res = fedsim_cli("check", str(path))
    assert res.exit_code == 2
    assert expected in res.stderr, res.stderr
    for internal in ("Input tag", "found using", "constrained-", "function-after", "literal["):
        assert internal not in res.stderr


MNIST_READS = ("dataset 'mnist' reads a directory holding the four MNIST IDX files, or their "
               "raw/ directory")


@pytest.mark.parametrize("command", ["check", "run"])
def test_a_dataset_without_a_partition_or_path_it_takes_is_refused_on_load(
        tmp_path: Path, command: str) -> None:
    """The run would fail on them (exit 3, a half-written run directory): refused
    on load instead, naming the key and what is allowed, and nothing is written."""
    path = tmp_path / "s.toml"
    path.write_text('[data]\ndataset = "mnist"\n')
    out = tmp_path / "run"
    res = fedsim_cli(command, str(path), *(["--out", str(out)] if command == "run" else []))
    assert res.exit_code == 2
    assert res.stderr.splitlines() == [
        f"error: {path}: invalid scenario",
        "  data.partition: not set, and the default 'natural' is not a partition of dataset "
        "'mnist' (allowed: iid, dirichlet, shards)",
        "  data.path: not set, but dataset 'mnist' reads its files from it (a directory "
        "holding the four MNIST IDX files, or their raw/ directory)",
    ]
    assert res.stdout == ""
    assert not out.exists()


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ('dataset = "mnist"\npath = "/nope"\n',
         "data.partition: not set, and the default 'natural' is not a partition of dataset "
         "'mnist' (allowed: iid, dirichlet, shards)"),
        ('dataset = "mnist"\npartition = "natural"\npath = "/nope"\n',
         "data.partition: 'natural' is not a partition of dataset 'mnist' "
         "(allowed: iid, dirichlet, shards)"),
        ('dataset = "mnist"\npartition = "iid"\npath = "/nope"\n',
         f"data.path: '/nope' does not exist ({MNIST_READS})"),
        ('dataset = "cifar10"\npartition = "iid"\npath = "/nope"\n',
         "data.path: '/nope' does not exist (dataset 'cifar10' reads a directory holding "
         "the CIFAR-10 python batches, or their cifar-10-batches-py directory)"),
        ('dataset = "synthetic"\npartition = "iid"\n',
         "data.partition: 'iid' is not a partition of dataset 'synthetic' (allowed: natural)"),
        ('dataset = "leaf"\npartition = "shards"\npath = "/nope"\n',
         "data.partition: 'shards' is not a partition of dataset 'leaf' (allowed: natural)"),
        ('dataset = "leaf"\npath = "/nope.json"\n',
         "data.path: '/nope.json' does not exist (dataset 'leaf' reads a LEAF .json file "
         "or a directory of them)"),
        ('dataset = "digits"\npartition = "iid"\npath = "/tmp"\n',
         "data.path: set to '/tmp', but dataset 'digits' reads no files "
         "(path is for leaf, mnist, cifar10)"),
    ],
)
def test_a_built_in_datasets_partition_and_path_are_checked_on_load(
        tmp_path: Path, data: str, expected: str) -> None:
    path = tmp_path / "s.toml"
    path.write_text(f"[data]\n{data}")
    res = fedsim_cli("check", str(path))
    assert res.exit_code == 2
    assert f"  {expected}" in res.stderr.splitlines(), res.stderr


def test_a_data_path_is_relative_to_the_current_directory_as_the_loader_reads_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not to the scenario file's: the loader opens it from where the run starts."""
    (tmp_path / "scenarios").mkdir()
    path = tmp_path / "scenarios" / "s.toml"
    path.write_text('[data]\ndataset = "mnist"\npartition = "iid"\npath = "mnist"\n')
    (tmp_path / "scenarios" / "mnist").mkdir()  # next to the file: not where it is read
    monkeypatch.chdir(tmp_path)
    res = fedsim_cli("check", str(path))
    assert res.exit_code == 2
    assert (f"  data.path: 'mnist' ({tmp_path / 'mnist'}) does not exist ({MNIST_READS})"
            in res.stderr.splitlines()), res.stderr
    (tmp_path / "mnist").write_text("")
    res = fedsim_cli("check", str(path))
    assert res.exit_code == 2
    assert (f"  data.path: 'mnist' ({tmp_path / 'mnist'}) is not a directory ({MNIST_READS})"
            in res.stderr.splitlines()), res.stderr
    (tmp_path / "mnist").unlink()
    (tmp_path / "mnist").mkdir()  # the files in it are the loader's to find
    res = fedsim_cli("check", str(path))
    assert res.exit_code == 0, res.stderr
    assert 'path = "mnist"' in res.stdout


def test_a_data_path_an_override_sets_is_blamed_on_it(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text('[data]\ndataset = "mnist"\npartition = "iid"\n'
                    f'path = "{tmp_path}"\n')
    assert fedsim_cli("check", str(path)).exit_code == 0
    res = fedsim_cli("check", str(path), "--set", 'data.path="/nope"')
    assert res.exit_code == 2
    assert res.stderr.splitlines() == [
        f"error: invalid override from the command line (not in {path})",
        f"  data.path: '/nope' does not exist ({MNIST_READS}) (from --set data.path=\"/nope\")",
    ]
    with pytest.raises(ScenarioError, match=r"data\.partition: 'natural' is not a partition"):
        fedsim.load({"data": {"dataset": "digits", "partition": "natural"}})


def test_a_set_value_that_is_not_toml_is_an_error_not_a_string() -> None:
    res = fedsim_cli("check", QUICKSTART, "--set", "model.hidden=[64,")
    assert res.exit_code == 2
    assert "--set model.hidden=[64,: '[64,' is not a valid TOML value" in res.stderr
    assert "write an array as [64, 32]" in res.stderr
    ok = fedsim_cli("check", QUICKSTART, "--set", "model.hidden=[64, 32]",
                    "--set", "algorithm.staleness=hinge", "--set", "network.profile=4g-slow")
    assert ok.exit_code == 0, ok.stderr
    assert "hidden = [64, 32]" in ok.stdout
    assert 'staleness = "hinge"' in ok.stdout  # a bare word is still a string
    assert 'profile = "4g-slow"' in ok.stdout


@pytest.mark.parametrize("command", ["run", "check", "server", "clients", "slurm"])
def test_every_set_option_has_help(command: str) -> None:
    res = fedsim_cli(command, "--help")
    assert res.exit_code == 0
    text = " ".join(res.stdout.split())
    assert "--set KEY=VALUE Override a scenario key, e.g. --set algorithm.alpha=0.3" in text


def test_check_says_which_local_steps_dga_uses() -> None:
    res = fedsim_cli("check", str(ROOT / "scenarios" / "dga-digits.toml"))
    assert res.exit_code == 0, res.stderr
    lines = res.stdout.splitlines()
    alg = lines.index("[algorithm]")
    client = lines.index("[client]")
    assert "local_steps = 5" in lines[alg:client]
    (mark,) = [line for line in lines[client:] if line.startswith("local_steps = ")]
    assert mark == ("local_steps = 10  # not used by dga: algorithm.local_steps = 5 local "
                    "steps per round (K); a DGA client steps without end until the run stops")
    assert "lstm_hidden = 256  # not used by model mlp" in lines


def test_check_leaves_the_local_steps_of_an_algorithm_that_reads_them_unmarked() -> None:
    res = fedsim_cli("check", QUICKSTART)
    assert res.exit_code == 0
    assert "local_steps = 20\n" in res.stdout


def test_overrides_from_python_are_blamed_on_the_overrides_argument() -> None:
    with pytest.raises(OverrideError) as info:
        fedsim.load(QUICKSTART, overrides={"run": {"time_budget": -5}, "client.lr": 0.1})
    err = info.value
    assert err.keys == ("run.time_budget",)
    assert err.origin == "the overrides= argument"
    assert str(err).startswith("invalid override from the overrides= argument (not in ")
    assert "(from overrides['run.time_budget'])" in str(err)
    with pytest.raises(OverrideError, match=r"overrides\['x'\]: .* is not a value a scenario"):
        fedsim.load(QUICKSTART, overrides={"x": object()})


def test_every_error_is_a_fedsim_error_and_the_config_ones_stay_value_errors() -> None:
    for cls in (ScenarioError, OverrideError, PluginError, ResumeError, DeployError):
        assert issubclass(cls, FedsimError)
        assert issubclass(cls, ValueError)
    for cls in (RunFailed, RunInterrupted):
        assert issubclass(cls, FedsimError)
        assert not issubclass(cls, ValueError)
    from fedsim.deploy.keys import KeysError
    from fedsim.scenario.network import NetworkError

    assert issubclass(NetworkError, ScenarioError)
    assert issubclass(KeysError, DeployError)


@pytest.mark.parametrize(
    ("error", "code"),
    [(ScenarioError("x"), 2), (OverrideError("x", keys=["a"], origin="o"), 2),
     (PluginError("x"), 2), (ResumeError("x"), 2), (DeployError("x"), 2),
     (RunFailed("x"), 3), (RunInterrupted("x"), 130), (FedsimError("x"), 3)],
)
def test_the_command_line_maps_each_error_to_its_exit_code(error: FedsimError,
                                                           code: int) -> None:
    with pytest.raises(SystemExit) as info:
        cli._exit(error)
    assert info.value.code == code


def _summary(status: str) -> dict[str, Any]:
    return {"status": status, "stop_reason": None, "algorithm": "fedasync", "clients": 20,
            "updates": 7, "emulated_seconds": 3.0, "real_seconds": 6.0,
            "final_accuracy": 0.5, "best_accuracy": 0.6,
            "staleness": {"mean": 1.0, "p50": 1.0, "p99": 2.0, "max": 3, "count": 7},
            "transfer": {"down": {"messages": 9, "p50_ms": 250.2, "p95_ms": 281.0,
                                  "mean_bytes": 56921, "configured_delay_ms": 50.0},
                         "up": {"messages": 7, "p50_ms": 249.8, "p95_ms": 300.4,
                                "mean_bytes": 56933, "configured_delay_ms": 50.0}},
            "fidelity": {"verdict": "pass", "lateness_ms": {"p50": 0.1, "p99": 0.5}}}


@pytest.mark.parametrize(("status", "raised", "code"), [
    ("completed", None, 0), ("failed: no update was applied", RunFailed, 3),
    ("interrupted", RunInterrupted, 130)])
def test_run_prints_the_summary_and_exits_with_the_runs_status(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, status: str,
        raised: type[RunFailed] | type[RunInterrupted] | None, code: int) -> None:
    result = RunResult.of(tmp_path, _summary(status))

    def fake_run(sc: Any, **kw: Any) -> RunResult:
        if raised is not None:
            raise raised("the run ended", result)
        return result

    monkeypatch.setattr(fedsim.api, "run", fake_run)
    res = fedsim_cli("run", QUICKSTART, "--no-progress")
    assert res.exit_code == code
    assert f"fedasync on 20 clients: {status}" in res.stdout
    assert ("  transfer         down p50 250 ms, p95 281 ms; up p50 250 ms, p95 300 ms per "
            "model message (57 KB; configured one-way delay 50 ms)") in res.stdout


def test_resume_errors_exit_2(tmp_path: Path) -> None:
    res = fedsim_cli("run", "--resume", str(tmp_path))
    assert res.exit_code == 2
    assert f"error: cannot resume: {tmp_path} is not a run directory" in res.stderr


@pytest.mark.parametrize("command", ["run", "server"])
def test_a_completed_run_is_not_resumed_and_its_results_stay(tmp_path: Path,
                                                             command: str) -> None:
    """Resuming a run whose stop rule fired would run its tail again over its results:
    refused (exit 2) before anything starts, the run directory untouched."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "scenario.json").write_text(json.dumps(resolved(load(QUICKSTART))))
    summary = json.dumps({"status": "completed", "stop_reason": "time_budget", "updates": 96})
    (run_dir / "summary.json").write_text(summary)
    extra = ["--bind", "tcp://127.0.0.1:0"] if command == "server" else ["--no-progress"]
    res = fedsim_cli(command, "--resume", str(run_dir), *extra)
    assert res.exit_code == 2
    assert (f"{run_dir}: the run completed (time_budget): nothing to "
            "resume, and resuming would overwrite its results") in res.stderr
    assert (run_dir / "summary.json").read_text() == summary
    assert sorted(p.name for p in run_dir.iterdir()) == ["scenario.json", "summary.json"]
    # an interrupted run (or one killed mid-way: "running") goes on to its checkpoint
    for status in ("interrupted", "running"):
        (run_dir / "summary.json").write_text(json.dumps({"status": status}))
        res = fedsim_cli(command, "--resume", str(run_dir), *extra)
        assert res.exit_code == 2
        assert "the run wrote no checkpoint (nothing to resume)" in res.stderr


class _Payload:
    """Unpickled, it makes ``marker``: what any code a pickle runs could do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        return (Path.touch, (self.marker,))


@pytest.mark.parametrize("command", ["run", "server"])
def test_a_pickled_checkpoint_is_refused_before_anything_starts(tmp_path: Path,
                                                                command: str) -> None:
    """`fedsim run --resume` and `fedsim server --resume` look at checkpoint.pt first: a
    missing one or an earlier fedsim's pickle ends the command at once (exit 2), before any
    host or worker starts, and the pickle is not unpickled."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "scenario.json").write_text(json.dumps(resolved(load(QUICKSTART))))
    extra = ["--bind", "tcp://127.0.0.1:0"] if command == "server" else ["--no-progress"]
    res = fedsim_cli(command, "--resume", str(run_dir), *extra)
    assert res.exit_code == 2
    assert "the run wrote no checkpoint (nothing to resume)" in res.stderr
    marker = tmp_path / "code-ran"
    (run_dir / "checkpoint.pt").write_bytes(pickle.dumps({"format": 2,
                                                          "run": _Payload(marker)}))
    res = fedsim_cli(command, "--resume", str(run_dir), *extra)
    assert res.exit_code == 2
    assert f"{run_dir / 'checkpoint.pt'} is a pickle" in res.stderr
    assert "resume the run with the fedsim version that wrote it" in res.stderr
    assert not marker.exists()


def test_nothing_in_the_library_calls_sys_exit() -> None:
    """Only the command line exits; so do the programs fedsim starts as their own
    processes (``python -m fedsim.actors.host`` ...): their ``main`` and
    ``__main__`` guard."""
    found = []
    for path in sorted((ROOT / "fedsim").rglob("*.py")):
        if path.name == "cli.py":
            continue
        tree = ast.parse(path.read_text())
        allowed = {id(n) for top in tree.body
                   if (isinstance(top, ast.If) and "__main__" in ast.unparse(top.test))
                   or (isinstance(top, ast.FunctionDef) and top.name == "main")
                   for n in ast.walk(top)}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and ast.unparse(node.func) == "sys.exit"
                    and id(node) not in allowed):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []


def test_a_scenario_read_back_needs_no_data_here() -> None:
    """A run's scenario.json, read by its hosts or on another machine (RunResult.scenario,
    fedsim compare), parses without the data path; a scenario given to run is refused."""
    raw = {"data": {"dataset": "mnist", "partition": "iid", "path": "/nope"}}
    assert parse(raw).data.path == "/nope"
    with pytest.raises(ScenarioError, match=r"data\.path: '/nope' does not exist"):
        parse(raw, written=True, runs_here=True)


def test_a_command_that_runs_nothing_here_does_not_look_for_the_data(tmp_path: Path) -> None:
    """``fedsim slurm`` on a login node, and ``fedsim keys --scenario``: the job's nodes
    read data.path, so it is not looked for here (``fedsim check`` does look)."""
    path = tmp_path / "s.toml"
    path.write_text('[data]\ndataset = "mnist"\npartition = "iid"\npath = "/nope"\n'
                    "num_clients = 4\n")
    assert fedsim_cli("check", str(path)).exit_code == 2
    res = fedsim_cli("slurm", str(path), "--hosts", "2", "--run-dir", str(tmp_path / "run"))
    assert res.exit_code == 0, res.stderr
    assert "#SBATCH" in res.stdout
    res = fedsim_cli("keys", str(tmp_path / "keys"), "--hosts", "2", "--scenario", str(path))
    assert res.exit_code == 0, res.stderr
    assert fedsim.api.load(path, runs_here=False).data.path == "/nope"
