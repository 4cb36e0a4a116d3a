"""`fedsim server --keys` and `fedsim clients` on loopback: what a key holder or a stranger
can no longer do to the wire, and what a host says about itself.

A squatter with an allowed key that connects first under another host's old
routing id locks nobody out (the server assigns routing ids); a host whose
key is not allowed learns it in seconds and exits 4 naming the cause, and
the server logs that refusal once; hosts print a line per phase; idle
connections, an oversize header and a probe flood from a connection that
never registered are closed, dropped or limited, and counted.
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import msgpack
import pytest
import zmq
import zmq.auth

from fedsim.wire.codec import encode
from fedsim.wire.messages import SCHEMA_VERSION, ClockProbe, HostHello
from fedsim.wire.transport import UNKNOWN_PEER

from .conftest import (
    DEPLOY_SCENARIO,
    fedsim,
    finish,
    free_port,
    wait_for,
    wait_for_events,
    write_scenario,
)

pytestmark = pytest.mark.timeout(240)




def _setup(tmp_path: Path, budget: float = 6.0, extra: str = "") -> tuple[Path, Path, str]:
    path = write_scenario(tmp_path, DEPLOY_SCENARIO + extra)
    text = path.read_text().replace("time_budget = 6.0", f"time_budget = {budget}")
    path.write_text(text.replace("num_clients = 8", "num_clients = 12"))
    keys = tmp_path / "keys"
    code, _, err = finish(fedsim("keys", str(keys), "--hosts", "2", "--scenario", str(path)))
    assert code == 0, err
    return path, keys, f"tcp://127.0.0.1:{free_port()}"


def _server(scenario: Path, keys: Path, address: str, run_dir: Path, *sets: str,
            dilation: str = "1"):
    proc = fedsim("server", str(scenario), "--bind", address, "--keys", str(keys), "--out",
                  str(run_dir), "--no-progress", "--dilation", dilation,
                  *[a for s in sets for a in ("--set", s)])
    wait_for(run_dir / "endpoints.json")  # bound: it writes this once it listens
    return proc


def _host(scenario: Path, keys: Path, address: str, i: int, ids: str, *sets: str):
    return fedsim("clients", str(scenario), "--connect", address, "--ids", ids,
                  "--name", f"host-{i}", "--keys", str(keys),
                  *[a for s in sets for a in ("--set", s)])


def _dealer(ctx: zmq.Context, keys: Path, name: str, address: str,
            identity: bytes | None = None) -> zmq.Socket:
    """A raw DEALER with host ``name``'s key pair (an insider's own socket)."""
    public, secret = zmq.auth.load_certificate(keys / f"{name}.key_secret")
    server, _ = zmq.auth.load_certificate(keys / "server.key")
    s = ctx.socket(zmq.DEALER)
    s.curve_publickey, s.curve_secretkey, s.curve_serverkey = public, secret, server
    if identity is not None:
        s.setsockopt(zmq.ROUTING_ID, identity)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(address)
    return s


@pytest.mark.slow   # make test-repro: a long real run (make test stays under 10 min)
def test_a_squatter_that_connects_first_locks_no_host_out(tmp_path: Path) -> None:
    scenario, keys, address = _setup(tmp_path)
    run_dir = tmp_path / "run"
    server = _server(scenario, keys, address, run_dir, "deploy.start_timeout=30")
    ctx = zmq.Context()
    try:
        # host-0's key, under the routing id host-1's process used to choose for itself
        squatter = _dealer(ctx, keys, "host-0", address, identity=b"host-1")
        squatter.send_multipart(encode(ClockProbe(seq=0, t_sent=0.0)))
        squatter.send_multipart(encode(HostHello(
            host="host-1", pid=1, clients=tuple(range(6, 12)), samples=(1,) * 6,
            boot_id="x", fedsim_version="x", scenario_hash="x"), seq=1))
        time.sleep(1.0)  # it holds its connection (and that routing id) first
        host0 = _host(scenario, keys, address, 0, "0-5", "deploy.start_timeout=30")
        host1 = _host(scenario, keys, address, 1, "6-11", "deploy.start_timeout=30")
        code, _, err = finish(server)
        assert code == 0, err[-3000:]
        assert finish(host0)[0] == 0
        assert finish(host1)[0] == 0
    finally:
        ctx.destroy(linger=0)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert summary["clients_missing"] == []
    assert summary["hosts"]["reported"] == 2
    assert summary["rejected_messages"]["server"]["routing_id"] == 2  # the squatter's two


@pytest.mark.slow   # make test-repro: a long real run (make test stays under 10 min)
def test_a_host_whose_key_is_refused_knows_in_seconds_and_the_server_says_so_once(
        tmp_path: Path) -> None:
    scenario, keys, address = _setup(tmp_path)
    other = tmp_path / "other-keys"  # key pairs of another federation
    code, _, err = finish(fedsim("keys", str(other), "--hosts", "2", "--scenario", str(scenario)))
    assert code == 0, err
    run_dir = tmp_path / "run"
    server = _server(scenario, keys, address, run_dir)
    # another federation's keys: its server.key is not this server's. The server closes
    # each handshake without a word (so would a proxy before a server not up yet): the
    # host warns at once, and gives up after deploy.start_timeout
    t0 = time.monotonic()
    code, _, err = finish(_host(scenario, other, address, 1, "6-11",
                                "deploy.start_timeout=8"), timeout=60)
    assert code == 4, err[-2000:]
    assert time.monotonic() - t0 < 30.0
    lines = err.strip().splitlines()
    assert ("host-1: 5 handshakes in a row were closed: the server's key (server.key) may "
            "not be this server's, or the server is not listening yet behind a proxy; "
            "trying on") in lines[0]
    assert "host-1: no answer from the server" in lines[-1], err
    # this server's key, but a host key it never allowed
    (other / "server.key").write_bytes((keys / "server.key").read_bytes())
    t0 = time.monotonic()
    code, _, err = finish(_host(scenario, other, address, 1, "6-11"), timeout=60)
    assert code == 4, err[-2000:]
    assert time.monotonic() - t0 < 20.0
    assert ("host-1: the server refused this host: the server refused this host's key (ZAP "
            "status 400: it is not on the server's allow-list)") in err
    assert len(err.strip().splitlines()) == 1, err   # that line alone
    host0 = _host(scenario, keys, address, 0, "0-5")
    host1 = _host(scenario, keys, address, 1, "6-11")
    code, _, server_err = finish(server)
    assert code == 0, server_err[-3000:]
    _, _, err0 = finish(host0)
    assert finish(host1)[0] == 0
    # the server: listening at INFO, the refusal once (key and address named)
    assert f"INFO fedsim.launch.runner: server listening at {address} (CURVE)" in server_err
    refusals = [line for line in server_err.splitlines() if "is not on the allow-list" in line]
    assert len(refusals) == 1, refusals
    assert "rejected a connection from 127.0.0.1: unauthenticated: CURVE key" in refusals[0]
    # the wrong server key: each attempt counted, logged up to 10 per source (libzmq
    # tries every 50 ms until the host gives up at deploy.start_timeout)
    summary = json.loads((run_dir / "summary.json").read_text())
    rejected = summary["rejected_messages"]
    attempts = rejected["server"]["bad_handshake"]
    assert attempts >= 5, rejected
    failed = [line for line in server_err.splitlines() if ": bad_handshake: " in line]
    shown = "\n".join([*failed, json.dumps(rejected)])  # a str: pytest shows it whole
    assert len(failed) == attempts - sum(rejected["unlogged"].values()), shown
    # they name the wrong key, most of them: a CI run under load (141 attempts) logged
    # one failure of another kind (its text was cut from the report; the attempt the
    # host drops when it gives up would be one), and a connection closed before the
    # server read its address, whose source is "an unknown address"
    wrong = [line for line in failed if "a peer with a wrong server key" in line]
    assert len(wrong) >= max(5, len(failed) // 2), shown
    sources = {line.split("rejected a connection from ")[1].split(": bad_handshake")[0]
               for line in failed}
    assert sources <= {"127.0.0.1", UNKNOWN_PEER}, sources
    assert set(rejected["server"]) == {"unauthenticated", "bad_handshake"}, rejected
    assert rejected["server"]["unauthenticated"] == 1
    # a host says what it does: one line per phase
    for phase in ("host-0: connected to the server", "host-0: registered clients 0-5",
                  "host-0: the federation started", "host-0: done (time_budget)"):
        assert sum(phase in line for line in err0.splitlines()) == 1, (phase, err0[-3000:])


@pytest.mark.slow   # make test-repro: a long real run (make test stays under 10 min)
def test_idle_connections_big_headers_and_probe_floods_are_bounded_and_counted(
        tmp_path: Path) -> None:
    scenario, keys, address = _setup(tmp_path, budget=8.0)
    run_dir = tmp_path / "run"
    # at dilation 2 over 200 ms links (allowed lateness 10 ms): a clean run over 100 ms
    # links (5 ms allowed) showed a p99 of 1.6-4.6 ms on two shared cores, too near its
    # bound for a check that must hold on a busy CI machine
    sets = ("deploy.handshake_timeout=1.0", "network.up.delay=0.2", "network.down.delay=0.2")
    server = _server(scenario, keys, address, run_dir, *sets, dilation="2")
    host0 = _host(scenario, keys, address, 0, "0-5", *sets)
    host1 = _host(scenario, keys, address, 1, "6-11", *sets)
    host, port = address.removeprefix("tcp://").rsplit(":", 1)
    ctx = zmq.Context()
    idle: list[socket.socket] = []
    try:
        wait_for_events(run_dir, "start")
        time.sleep(2.0)
        # 40 idle TCP connections: closed after deploy.handshake_timeout
        idle = [socket.create_connection((host, int(port))) for _ in range(40)]
        # an insider (host-1's key) on a second connection of its own, never registered:
        # a 30 MB header (over the derived max_message_mb: dropped unread), then probes
        big = _dealer(ctx, keys, "host-1", address)
        big.send_multipart([msgpack.packb([SCHEMA_VERSION, "EventBatch", 0.0, 0]),
                            b"\x90" * (30 << 20)])
        flood = _dealer(ctx, keys, "host-1", address)
        for i in range(2000):
            flood.send_multipart(encode(ClockProbe(seq=i, t_sent=0.0), seq=i))
        time.sleep(3.0)
        answered = 0
        while flood.poll(10):
            flood.recv_multipart()
            answered += 1
        code, _, err = finish(server)
        assert code == 0, err[-3000:]
        assert finish(host0)[0] == 0
        assert finish(host1)[0] == 0
    finally:
        for s in idle:
            s.close()
        ctx.destroy(linger=0)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed"
    rejected = summary["rejected_messages"]["server"]
    assert rejected["handshake_timeout"] == 40, rejected
    assert rejected["connection_dropped"] >= 1, rejected   # the 30 MB frame
    # 10/s for one key that has not registered, 50 at once: the rest limited
    # (the hosts' own clock probes and registrations came before they registered too)
    assert summary["unregistered_messages"] >= answered + 18, (answered, summary)
    assert 50 <= answered <= 120, answered
    assert rejected["rate_limited"] == 2000 - answered, rejected
    # logged within the cap per source (10 per reason), the rest counted and summarised
    assert summary["rejected_messages"]["unlogged"] == {"127.0.0.1": 30, "key host-1":
                                                         2000 - answered - 10}
    assert err.count("rejected a connection from 127.0.0.1: handshake_timeout") == 10
    assert "30 more rejections from 127.0.0.1 (handshake_timeout) were counted" in err
    # the floods cost the others little: before the limits the same floods put the p99
    # lateness at 281 ms (28x the allowance); bounded, it stays within 3x of the 10 ms
    # allowed (a clean run: 2-6 ms; 10.6 ms once on a loaded CI machine). Every check
    # that is not a timing one (clock, send times, loss) passes.
    fidelity = summary["fidelity"]
    assert fidelity["lateness_ms"]["p99"] <= 3 * fidelity["lateness_ms"]["allowed_p99"], fidelity
    timing = {"lateness", "delay_mean", "delay_std", "rate", "overruns"}
    assert all(c["ok"] for c in fidelity["checks"] if c["check"] not in timing), fidelity
