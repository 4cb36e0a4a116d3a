"""`fedsim slurm` writes a job; a real Slurm (slurmctld, slurmd, munge) runs it to the end."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedsim.deploy.slurm import job_script

from .slurm_cluster import SlurmCluster, slurm_unavailable

ROOT = Path(__file__).resolve().parents[2]


def test_the_script_maps_tasks_to_client_id_ranges(tmp_path: Path) -> None:
    text = job_script(ROOT / "scenarios" / "quickstart.toml", hosts=3, num_clients=20,
                      run_dir=tmp_path / "job", port=6000, sets=("run.time_budget=5",),
                      time="00:10:00", partition="short")
    assert "#SBATCH --ntasks=4" in text
    assert "#SBATCH --time=00:10:00" in text
    assert "#SBATCH --partition=short" in text
    assert "0) ids=0-6;; 1) ids=7-13;; 2) ids=14-19;;" in text
    assert "--set run.time_budget=5" in text
    assert '--bind "tcp://0.0.0.0:$PORT"' in text
    assert "--connect tcp://$SERVER_NODE:6000" in text
    assert '--hosts 3 --clients 20' in text
    r = subprocess.run(["bash", "-n"], input=text, text=True, capture_output=True)
    assert r.returncode == 0, r.stderr  # valid bash


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    why = slurm_unavailable()
    if why is not None:
        pytest.skip(why)
    with SlurmCluster(tmp_path_factory.mktemp("slurm")) as c:
        yield c


@pytest.mark.slurm
@pytest.mark.timeout(400)
@pytest.mark.slow   # make test-repro: a long real run (make test stays under 10 min)
def test_a_federation_runs_as_one_slurm_job(cluster: SlurmCluster, tmp_path: Path) -> None:
    job_dir = tmp_path / "job"
    script = tmp_path / "job.sbatch"
    subprocess.run([sys.executable, "-m", "fedsim.cli", "slurm",
                    str(ROOT / "scenarios" / "quickstart.toml"), "--hosts", "2",
                    "--run-dir", str(job_dir), "--out", str(script), "--port", "5777",
                    "--set", "run.time_budget=4", "--set", "data.num_clients=8"],
                   cwd=ROOT, check=True, capture_output=True)
    r = cluster.sbatch_wait(script)
    out = "".join(p.read_text() for p in job_dir.glob("slurm-*.out"))
    assert r.returncode == 0, r.stderr + out
    summary = json.loads((job_dir / "run" / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert summary["clients_missing"] == []
    assert summary["hosts"]["registered"] == 2
    assert summary["hosts"]["reported"] == 2
    assert "fedasync on 8 clients: completed" in out
