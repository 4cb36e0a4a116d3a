"""A real multi-host federation: three network namespaces, TCP, CURVE.

The server runs in one namespace, client hosts in two others, joined by a
bridge (tests/deploy/netns.py). Host b's CLOCK_MONOTONIC is 500 s ahead (a
time namespace) and its path to the server goes through a relay that adds
20 ms each way: the summary must report both, the clock offset as measured
and the path's delay as that host's uncertainty, and the verdict must fail
by that host's clock, not pass silently. A rogue without an allowed key, a
fuzzing insider and a host killed with SIGKILL run in the same setup.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedsim.metrics import read_events

from .netns import Namespaces, netns_unavailable

pytestmark = [pytest.mark.netns, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable

SCENARIO = """
name = "netns"
seed = 3
[data]
dataset = "synthetic"
num_clients = 12
[model]
name = "mlp"
hidden = [32]
[client]
lr = 0.05
batch_size = 32
local_steps = 5
[algorithm]
name = "fedasync"
concurrency = 4
[run]
time_budget = {budget}
[eval]
every_updates = 20
[devices]
step_time = 0.004
[network.up]
delay = 0.05
[network.down]
delay = 0.05
"""


@pytest.fixture
def nets() -> Iterator[Namespaces]:
    why = netns_unavailable()
    if why is not None:
        pytest.skip(why)
    with Namespaces() as n:
        yield n


def _setup(tmp_path: Path, budget: float) -> tuple[Path, Path]:
    scenario = tmp_path / "netns.toml"
    scenario.write_text(SCENARIO.format(budget=budget))
    keys = tmp_path / "keys"
    subprocess.run([PY, "-m", "fedsim.cli", "keys", str(keys), "--hosts", "2", "--scenario",
                    str(scenario)], cwd=ROOT, check=True, capture_output=True)
    return scenario, keys


def _fedsim(n: Namespaces, where: str, *args: str, monotonic: float | None = None
            ) -> subprocess.Popen[str]:
    return n.popen(where, [PY, "-m", "fedsim.cli", *args], monotonic=monotonic, cwd=ROOT)


def _finish(p: subprocess.Popen[str], timeout: float = 150) -> tuple[int, str, str]:
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        pytest.fail(f"did not finish within {timeout} s: {err[-3000:]}")
    return p.returncode, out, err


def test_three_namespaces_curve_a_skewed_clock_and_a_slow_path(
        nets: Namespaces, tmp_path: Path) -> None:
    scenario, keys = _setup(tmp_path, 8.0)
    srv = nets.addr["srv"]
    run_dir = tmp_path / "run"
    relay = nets.popen("srv", [PY, "-m", "fedsim.deploy.relay", "--listen", f"{srv}:5556",
                               "--to", f"{srv}:5555", "--delay-ms", "20"], cwd=ROOT)
    assert relay.stdout is not None
    assert relay.stdout.readline().strip() == "relay ready"
    server = _fedsim(nets, "srv", "server", str(scenario), "--bind", f"tcp://{srv}:5555",
                     "--keys", str(keys), "--out", str(run_dir), "--no-progress")
    host_a = _fedsim(nets, "a", "clients", str(scenario), "--connect", f"tcp://{srv}:5555",
                     "--ids", "0-5", "--name", "host-0", "--keys", str(keys))
    host_b = _fedsim(nets, "b", "clients", str(scenario), "--connect", f"tcp://{srv}:5556",
                     "--ids", "6-11", "--name", "host-1", "--keys", str(keys), monotonic=500)
    # a rogue in host a's namespace, with a key pair of its own, once the server listens
    deadline = time.monotonic() + 60
    while not (run_dir / "endpoints.json").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    rogue = nets.popen("a", [PY, "-c", (
        "import zmq, sys\n"
        "ctx = zmq.Context(); s = ctx.socket(zmq.DEALER)\n"
        "s.curve_serverkey = open(sys.argv[2]).read().split('public-key = \"')[1][:40].encode()\n"
        "s.curve_publickey, s.curve_secretkey = zmq.curve_keypair()\n"
        "s.connect(sys.argv[1]); s.send(b'hello')\n"
        "print('got' if s.poll(3000) else 'nothing'); s.close(0); ctx.term()\n"),
        f"tcp://{srv}:5555", str(keys / "server.key")], cwd=ROOT)
    try:
        code, out, err = _finish(server)
        assert code == 0, err[-3000:]
        assert _finish(host_a)[0] == 0
        assert _finish(host_b)[0] == 0
        assert _finish(rogue)[1].strip() == "nothing"
    finally:
        relay.kill()
        relay.communicate()
    s = json.loads((run_dir / "summary.json").read_text())
    assert s["status"] == "completed"
    assert s["clients_missing"] == []
    assert s["hosts"]["reported"] == 2
    clocks = s["fidelity"]["clocks"]
    # host b's clock is 500 s ahead: offset (server - host) -500 s, measured
    assert clocks["host-1"]["offset_s"] == pytest.approx(-500.0, abs=0.01)
    assert clocks["host-0"]["offset_s"] == pytest.approx(0.0, abs=0.01)
    # the relay's 20 ms each way is in host b's round trip and uncertainty
    assert clocks["host-1"]["rtt_ms"] >= 40.0
    assert clocks["host-1"]["uncertainty_ms"] >= 20.0
    assert clocks["host-0"]["rtt_ms"] < 20.0
    # and the verdict fails because of it, by name (at dilation 1, +-20 ms of
    # clock is far beyond the allowed lateness)
    assert s["fidelity"]["verdict"] == "fail"
    assert any(r.startswith("clock[host-1]") for r in s["fidelity"]["reasons"])
    assert not any(r.startswith("clock[host-0]") for r in s["fidelity"]["reasons"])
    # 20 ms of real transit under a 50 ms link is absorbed, not added
    assert clocks["host-1"]["late_arrivals"] == 0
    events = list(read_events(run_dir / "events.jsonl"))
    ups = [e for e in events if e["ev"] == "deliver" and e.get("dir") == "up"
           and e["client"] >= 6]
    assert ups
    assert all(abs(e["t"] - e["sent_at"] - 0.05) < 0.01 for e in ups)
    # the rogue got nothing and was counted
    assert s["rejected_messages"]["server"].get("unauthenticated", 0) >= 1
    assert "fidelity" in out


def test_a_killed_host_and_a_fuzzing_insider_across_namespaces(
        nets: Namespaces, tmp_path: Path) -> None:
    scenario, keys = _setup(tmp_path, 10.0)
    srv = nets.addr["srv"]
    run_dir = tmp_path / "run"
    server = _fedsim(nets, "srv", "server", str(scenario), "--bind", f"tcp://{srv}:5555",
                     "--keys", str(keys), "--out", str(run_dir), "--no-progress",
                     "--set", "deploy.host_timeout=5")
    # (every side loads the scenario with the same override: the hash must agree)
    host_a = _fedsim(nets, "a", "clients", str(scenario), "--connect", f"tcp://{srv}:5555",
                     "--ids", "0-5", "--name", "host-0", "--keys", str(keys),
                     "--set", "deploy.host_timeout=5")
    fuzzer = nets.popen("b", [PY, "-m", "fedsim.fuzz", str(scenario), "--connect",
                              f"tcp://{srv}:5555", "--ids", "6-11", "--name", "host-1",
                              "--keys", str(keys), "--frames", "1500", "--rate", "1000",
                              "--delay", "1", "--set", "deploy.host_timeout=5"], cwd=ROOT)
    # kill host a (SIGKILL: no goodbye, no process watcher across machines)
    deadline = time.monotonic() + 90
    path = run_dir / "events.jsonl"
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().count('"ev":"aggregate"') >= 20:
            break
        time.sleep(0.2)
    os.killpg(host_a.pid, signal.SIGKILL)
    host_a.communicate()
    code, out, err = _finish(server)
    assert code == 0, err[-3000:]
    fcode, fout, ferr = _finish(fuzzer)
    assert fcode == 0, ferr[-3000:]
    fuzzed = json.loads(fout.strip().splitlines()[-1])
    s = json.loads((run_dir / "summary.json").read_text())
    assert s["status"] == "completed"
    assert s["hosts"]["lost"] == ["host-0"]
    assert s["hosts"]["reported"] == 1
    assert "1 of 2 reported; lost: host-0" in out
    assert s["fidelity"]["hosts_unreported"] == ["host-0"]
    lost = [e for e in read_events(path) if e["ev"] == "host_lost"]
    assert len(lost) == 1
    assert "silent" in lost[0]["reason"]
    rejects = s["rejected_messages"]["server"]
    assert "internal_error" not in rejects
    must = sum(n for r, n in fuzzed["sent"].items() if r != "None")
    assert sum(rejects.values()) >= must
    # after host a was lost, host b's clients went on
    after = [e for e in read_events(path) if e["ev"] == "aggregate" and e["t"] > lost[0]["t"]]
    assert after
    assert {c for e in after for c in e["clients"]} <= set(range(6, 12))
