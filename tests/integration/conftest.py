"""Helpers for integration tests: small federations through real sockets."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]

SMALL = """
name = "small"
seed = 3
[data]
dataset = "synthetic"
num_clients = 8
[model]
name = "mlp"
hidden = [64]
[client]
lr = 0.05
batch_size = 32
local_steps = 10
[run]
time_budget = 6.0
[devices]
step_time = 0.004
[network.up]
delay = 0.02
[network.down]
delay = 0.02
[deploy]
hosts = 1
"""


def write_scenario(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "scenario.toml"
    path.write_text(SMALL + extra)
    return path


def fedsim(*args: str, **kw: Any) -> subprocess.Popen[str]:
    """Start ``fedsim`` as its own process group (so signals reach only it)."""
    return subprocess.Popen(
        [sys.executable, "-m", "fedsim.cli", *args],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True, **kw,
    )


def wait_for(path: Path, timeout: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            try:
                return json.loads(path.read_text())
            except json.JSONDecodeError:
                pass
        time.sleep(0.1)
    raise TimeoutError(f"{path} did not appear within {timeout} s")


def wait_for_events(run_dir: Path, ev: str, count: int = 1, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    path = run_dir / "events.jsonl"
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().count(f'"ev":"{ev}"') >= count:
            return
        time.sleep(0.1)
    raise TimeoutError(f"no {count} {ev!r} events within {timeout} s")


def leftover_processes(run_id: str) -> list[psutil.Process]:
    """Processes still running whose command line names this run."""
    out = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(run_id in part for part in (p.info["cmdline"] or [])):
                out.append(p)
        except psutil.Error:
            continue
    return out


def assert_no_orphans(run_id: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    left: list[psutil.Process] = []
    while time.monotonic() < deadline:
        left = leftover_processes(run_id)
        if not left:
            return
        time.sleep(0.2)
    for p in left:
        p.kill()
    pytest.fail(f"orphan processes left behind: {[p.pid for p in left]}")


def finish(proc: subprocess.Popen[str], timeout: float = 120.0) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"fedsim did not finish within {timeout} s\n{err[-3000:]}")
    return proc.returncode, out, err


#: The multi-host tests' scenario tail: FedAsync, 4 tasks in flight, an evaluation
#: every 25 updates (``write_scenario`` gives the rest).
DEPLOY_SCENARIO = """
[algorithm]
name = "fedasync"
concurrency = 4
[eval]
every_updates = 25
"""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
