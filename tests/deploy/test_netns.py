"""A real multi-host federation: three network namespaces, TCP, CURVE.

The server runs in one namespace, client hosts in two others, joined by a
bridge (tests/deploy/netns.py). Host b's CLOCK_MONOTONIC is 500 s ahead (a
time namespace) and its path to the server goes through a relay that adds
20 ms each way: the summary must report both, the clock offset as measured
and the path's delay as that host's uncertainty, and the verdict must fail
by that host's clock, not pass silently. Two rogues (a CURVE key pair not on
the allow-list, and no CURVE at all), a fuzzing insider and a host killed
with SIGKILL run in the same setup. The first test proves the harness itself
with plain pyzmq, before any fedsim code is involved.
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

from fedsim.results.writer import read_events

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


ROUTER = """
import json, sys, time, zmq
ctx = zmq.Context(); s = ctx.socket(zmq.ROUTER); s.bind(sys.argv[1])
print("bound", flush=True)
seen, byes = {}, 0
while byes < int(sys.argv[2]):
    peer, msg = s.recv_multipart()
    seen[peer.decode()] = seen.get(peer.decode(), 0) + 1
    if msg == b"bye":
        byes += 1
    s.send_multipart([peer, msg, repr(time.monotonic()).encode()])
print(json.dumps(seen)); s.close(0); ctx.term()
"""

DEALER = """
import json, sys, time, zmq
ctx = zmq.Context(); s = ctx.socket(zmq.DEALER)
s.identity = sys.argv[2].encode(); s.connect(sys.argv[1])
best = None
for i in range(20):
    t0 = time.monotonic(); s.send(b"%d" % i)
    assert s.poll(10000), "no reply"
    echo, theirs = s.recv_multipart(); t1 = time.monotonic()
    assert echo == b"%d" % i
    # NTP-style: the server's clock minus ours, at the exchange with the least round trip
    sample = (t1 - t0, float(theirs) - (t0 + t1) / 2)
    best = sample if best is None or sample[0] < best[0] else best
s.send(b"bye"); s.recv_multipart()
print(json.dumps({"monotonic": time.monotonic(), "rtt_ms": best[0] * 1e3,
                  "offset_s": best[1]}))
s.close(0); ctx.term()
"""


# a client from outside: with a CURVE key pair of its own (argv[2]: the server's
# public key file), or with no CURVE at all
ROGUE = """
import sys, zmq
ctx = zmq.Context(); s = ctx.socket(zmq.DEALER)
if len(sys.argv) > 2:
    s.curve_serverkey = open(sys.argv[2]).read().split('public-key = "')[1][:40].encode()
    s.curve_publickey, s.curve_secretkey = zmq.curve_keypair()
s.connect(sys.argv[1])
for kind in (b"register", b"hello", b"\\x00" * 100):
    s.send_multipart([kind, b"c0"])
print("got" if s.poll(3000) else "nothing"); s.close(0); ctx.term()
"""


def test_the_harness_with_plain_zmq(nets: Namespaces) -> None:
    """Before fedsim: a ROUTER in the server's namespace, a DEALER in host a, and
    one in host b behind the relay (20 ms each way) with its CLOCK_MONOTONIC
    500 s ahead. Messages flow across namespaces, the relay's delay is in
    host b's round trip only, and host b's clock is 500 s off."""
    srv = nets.addr["srv"]
    router = nets.popen("srv", [PY, "-c", ROUTER, f"tcp://{srv}:6000", "2"], cwd=ROOT)
    relay = nets.popen("srv", [PY, "-m", "fedsim.deploy.relay", "--listen", f"{srv}:6001",
                               "--to", f"{srv}:6000", "--delay-ms", "20"], cwd=ROOT)
    try:
        assert router.stdout is not None
        assert relay.stdout is not None
        assert router.stdout.readline().strip() == "bound"
        assert relay.stdout.readline().strip() == "relay ready"
        t_here = time.monotonic()
        a = nets.popen("a", [PY, "-c", DEALER, f"tcp://{srv}:6000", "host-a"], cwd=ROOT)
        b = nets.popen("b", [PY, "-c", DEALER, f"tcp://{srv}:6001", "host-b"], cwd=ROOT,
                       monotonic=500)
        ra, rb = (_finish(p, 60) for p in (a, b))
        assert ra[0] == 0, ra[2][-2000:]
        assert rb[0] == 0, rb[2][-2000:]
        code, out, err = _finish(router, 30)
        assert code == 0, err[-2000:]
    finally:
        relay.kill()
        relay.communicate()
    seen = json.loads(out)
    assert seen == {"host-a": 21, "host-b": 21}  # 20 pings and a bye each
    ha, hb = json.loads(ra[1]), json.loads(rb[1])
    # host b's CLOCK_MONOTONIC really is 500 s ahead of everyone else's
    assert hb["monotonic"] - t_here == pytest.approx(500, abs=30)
    assert ha["monotonic"] - t_here == pytest.approx(0, abs=30)
    # and the exchanges measure it: server minus host, within the round trip
    assert hb["offset_s"] == pytest.approx(-500, abs=hb["rtt_ms"] / 1e3)
    assert ha["offset_s"] == pytest.approx(0, abs=ha["rtt_ms"] / 1e3)
    # the relay's 20 ms each way is in host b's round trip, not in host a's
    assert hb["rtt_ms"] >= 40 - 1
    assert ha["rtt_ms"] < 20


@pytest.mark.slow   # make test-repro: a long real run (make test stays under 10 min)
def test_three_namespaces_curve_a_skewed_clock_and_a_slow_path(
        nets: Namespaces, tmp_path: Path) -> None:
    scenario, keys = _setup(tmp_path, 6.0)
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
    rogue = nets.popen("a", [PY, "-c", ROGUE, f"tcp://{srv}:5555", str(keys / "server.key")],
                       cwd=ROOT)
    plain = nets.popen("b", [PY, "-c", ROGUE, f"tcp://{srv}:5555"], cwd=ROOT)
    try:
        code, out, err = _finish(server)
        assert code == 0, err[-3000:]
        assert _finish(host_a)[0] == 0
        assert _finish(host_b)[0] == 0
        assert _finish(rogue)[1].strip() == "nothing"
        assert _finish(plain)[1].strip() == "nothing"
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
    # 20 ms of real transit under a 50 ms link is absorbed, not added (a
    # loaded machine may stretch one transit past the link's 50 ms)
    events = list(read_events(run_dir / "events.jsonl"))
    ups = [e for e in events if e["ev"] == "deliver" and e.get("dir") == "up"
           and e["client"] >= 6]
    assert ups
    assert clocks["host-1"]["late_arrivals"] <= max(2, 0.02 * len(ups))
    # (were it added, every uplink would take 70 ms; a loaded machine makes a
    # few deliveries late, which the lateness figures count, so: the median,
    # and nine in ten below the 70 ms an added transit would give)
    took = sorted(e["t"] - e["sent_at"] for e in ups)
    assert took[len(took) // 2] == pytest.approx(0.05, abs=0.005)
    assert sum(x < 0.065 for x in took) >= 0.9 * len(took)
    # the rogues got nothing, and both attempts are counted and in the event log
    assert s["rejected_messages"]["server"].get("unauthenticated", 0) >= 1
    assert s["rejected_messages"]["server"].get("bad_handshake", 0) >= 1
    refused = [e["detail"] for e in events if e["ev"] == "reject"
               and e["reason"] == "unauthenticated"]
    assert any("is not on the allow-list" in d for d in refused), refused
    failed = [e["detail"] for e in events if e["ev"] == "reject"
              and e["reason"] == "bad_handshake"]
    assert any("handshake failed" in d for d in failed), failed
    assert "fidelity" in out


@pytest.mark.slow   # make test-repro: a long real run (make test stays under 10 min)
def test_a_killed_host_and_a_fuzzing_insider_across_namespaces(
        nets: Namespaces, tmp_path: Path) -> None:
    scenario, keys = _setup(tmp_path, 8.0)
    srv = nets.addr["srv"]
    run_dir = tmp_path / "run"
    server = _fedsim(nets, "srv", "server", str(scenario), "--bind", f"tcp://{srv}:5555",
                     "--keys", str(keys), "--out", str(run_dir), "--no-progress",
                     "--set", "deploy.host_timeout=5")
    # (every side loads the scenario with the same override: the hash must agree)
    host_a = _fedsim(nets, "a", "clients", str(scenario), "--connect", f"tcp://{srv}:5555",
                     "--ids", "0-5", "--name", "host-0", "--keys", str(keys),
                     "--set", "deploy.host_timeout=5")
    fuzzer = nets.popen("b", [PY, "-m", "fedsim.testing.fuzz", str(scenario), "--connect",
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
