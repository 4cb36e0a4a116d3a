"""The Kubernetes example: schema-valid manifests, commands fedsim's CLI accepts, a valid scenario.

No image can be built here; the manifests are validated offline against the
Kubernetes schemas (kubernetes-validate ships them), and every container's
command line is parsed by fedsim's real click CLI with the pod's environment
substituted, so the example cannot drift from the CLI.
"""

from __future__ import annotations

import shlex
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from fedsim.cli import cli
from fedsim.scenario import parse

kv = pytest.importorskip("kubernetes_validate")

HERE = Path(__file__).resolve().parents[2] / "examples" / "kubernetes"
K8S_VERSION = "1.30.0"


def _docs() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((HERE / "fedsim.yaml").read_text()) if d]


def test_every_manifest_is_valid_against_the_kubernetes_schemas() -> None:
    docs = _docs()
    assert {d["kind"] for d in docs} == {"ConfigMap", "PersistentVolumeClaim", "Service", "Job"}
    for d in docs:
        kv.validate(d, K8S_VERSION, strict=True)


def test_an_invalid_manifest_is_caught() -> None:  # the check above can fail
    bad = _docs()[3]
    bad["spec"]["template"]["spec"]["containers"][0]["ports"] = [{"containerPort": "zmq"}]
    with pytest.raises(kv.ValidationError):
        kv.validate(bad, K8S_VERSION, strict=True)


def _containers() -> list[tuple[str, dict[str, Any]]]:
    return [(d["metadata"]["name"], c) for d in _docs() if d["kind"] == "Job"
            for c in d["spec"]["template"]["spec"]["containers"]]


def _argv(job: str, c: dict[str, Any], index: int, ranges: str) -> list[str]:
    """The fedsim arguments the container runs, its environment substituted."""
    if c.get("command", ["fedsim"])[0] == "fedsim" or "command" not in c:
        return list(c["args"])
    script = c["args"][0]
    ids = ranges.split()[index]
    script = (script.replace("$JOB_COMPLETION_INDEX", str(index)).replace("$1", ids)
              .replace("set -- $RANGES; shift " + str(index) + ";", ""))
    words = shlex.split(script)
    return words[words.index("fedsim") + 1:]


@pytest.mark.parametrize("index", [0, 1])
def test_every_container_command_parses_with_fedsims_cli(index: int) -> None:
    ranges = next(d for d in _docs() if d["kind"] == "ConfigMap")["data"]["ranges"]
    for job, c in _containers():
        argv = _argv(job, c, index, ranges)
        name, rest = argv[0], argv[1:]
        sub = cli.commands.get(name)
        assert sub is not None, f"{job}: fedsim has no command {name!r}"
        ctx = cli.make_context("fedsim", [name])
        sub.make_context(name, list(rest), parent=ctx)  # raises on an unknown or bad option
        assert name in ("server", "clients")


def test_the_configmaps_scenario_is_valid_and_its_ranges_cover_its_clients() -> None:
    data = next(d for d in _docs() if d["kind"] == "ConfigMap")["data"]
    sc = parse(tomllib.loads(data["scenario.toml"]), "configmap")
    ids = [i for r in data["ranges"].split() for i in range(int(r.split("-")[0]),
                                                            int(r.split("-")[1]) + 1)]
    assert sorted(ids) == list(range(sc.data.num_clients))
    clients_job = next(d for d in _docs() if d["metadata"]["name"] == "fedsim-clients")
    assert clients_job["spec"]["completions"] == len(data["ranges"].split())
