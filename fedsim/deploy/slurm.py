"""``fedsim slurm``: one Slurm job that runs a whole federation.

The job asks for ``hosts + 1`` tasks. Before any step it makes the CURVE
keys (``fedsim keys``) in the run directory, which must be on a filesystem
every node of the job sees (as a cluster's home or scratch is). Then two job
steps run side by side: the server on the job's first node (one task), and
the client hosts (one task each, on whatever nodes Slurm gives them), task
``r`` running client host ``r`` with its contiguous range of client ids and
connecting to the first node. The job's exit code is the server's.

The script is plain bash and sbatch directives: read it, change it, submit
it with ``sbatch``.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from fedsim.scenario.ids import split_ids

__all__ = ["job_script"]


def job_script(scenario: str | Path, *, hosts: int, num_clients: int, run_dir: str | Path,
               port: int = 5555, sets: tuple[str, ...] = (), time: str | None = None,
               partition: str | None = None, python: str | None = None,
               job_name: str | None = None) -> str:
    """The text of an sbatch script running ``scenario`` on ``hosts`` client hosts.

    ``run_dir`` receives the run (``RUN_DIR/run``), the keys
    (``RUN_DIR/keys``) and Slurm's output; paths are made absolute, since
    the job runs elsewhere. ``python`` is the interpreter with fedsim
    installed on the nodes (default: this one).
    """
    if hosts < 1:
        raise ValueError(f"hosts must be >= 1, got {hosts}")
    ranges = split_ids(num_clients, hosts)
    scenario = Path(scenario).resolve()
    run_dir = Path(run_dir).resolve()
    py = python or sys.executable
    q = shlex.quote
    overrides = " ".join(f"--set {q(s)}" for s in sets)
    name = job_name or f"fedsim-{scenario.stem}"
    keys = run_dir / "keys"
    cases = " ".join(f"{r}) ids={ids};;" for r, ids in enumerate(ranges))
    inner = (f"case $SLURM_PROCID in {cases} esac; exec {q(py)} -m fedsim.cli clients "
             f"{q(str(scenario))} {overrides} --connect tcp://$SERVER_NODE:{port} "
             f"--ids $ids --name host-$SLURM_PROCID --keys {q(str(keys))}")
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={name}",
        f"#SBATCH --ntasks={hosts + 1}",
        "#SBATCH --cpus-per-task=1",
        f"#SBATCH --output={run_dir}/slurm-%j.out",
    ]
    if time:
        lines.append(f"#SBATCH --time={time}")
    if partition:
        lines.append(f"#SBATCH --partition={partition}")
    lines += [
        "#",
        f"# Written by `fedsim slurm`: {hosts} client hosts and a server for {scenario.name}.",
        "# RUN_DIR must be on a filesystem shared by every node of the job.",
        "set -uo pipefail",
        f"PY={q(py)}",
        f"SCENARIO={q(str(scenario))}",
        f"RUN_DIR={q(str(run_dir))}",
        f"PORT={port}",
        f"OVERRIDES=({overrides})" if overrides else "OVERRIDES=()",
        'KEYS="$RUN_DIR/keys"',
        'export SERVER_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        'mkdir -p "$RUN_DIR"',
        '[ -f "$KEYS/allowed.toml" ] || "$PY" -m fedsim.cli keys "$KEYS" '
        f'--hosts {hosts} --clients {num_clients} >/dev/null || exit 2',
        "",
        "# the server: one task on the first node",
        'srun --exact --ntasks=1 --nodes=1 --nodelist="$SERVER_NODE" '
        '"$PY" -m fedsim.cli server "$SCENARIO" "${OVERRIDES[@]}" '
        '--bind "tcp://0.0.0.0:$PORT" --keys "$KEYS" --out "$RUN_DIR/run" --no-progress &',
        "SERVER=$!",
        "",
        "# the client hosts: task r runs host-r with the r-th range of client ids",
        f"srun --exact --ntasks={hosts} bash -c {q(inner)} &",
        "CLIENTS=$!",
        "",
        'wait "$SERVER"; CODE=$?',
        'wait "$CLIENTS" || echo "some client hosts ended with an error (see above)" >&2',
        'exit "$CODE"',
        "",
    ]
    return "\n".join(lines)
