"""The insider test (issue 23, point 9): a valid key used maliciously against a real server.

`fedsim server --keys` on loopback at dilation 2 over 500 ms links (allowed
lateness 25 ms: the first deliveries of a clean run, while every trainer
warms up, reached 15 ms on two shared cores over 300 ms links), two
honest `fedsim clients` hosts (host-0, host-1) and an insider, host-2
(tests/integration/insider_host.py): its clients train honestly, but every
update it sends is back-dated 0.3 emulated s and claims its task's base
version + 1 and 10^12 samples, and during the run it sends, over its own
registered connection, hostile frames from the fuzzer, oversize envelopes,
headers and messages, replays, a flood of event batches of made-up records
and a flood of clock probes. The harness meanwhile uses host-2's key on
sockets of its own: a squatter that connects before every host under
host-0's name and routing id, a second connection that registers as host-0,
two 30 MB frames, a flood of clock probes from a connection that never
registers, and 40 TCP connections that never handshake.

Each federation runs twice with the same seed, clean and attacked. The
attacked run passes when the verdict fails for host-2 alone (its corrected
send times), the honest hosts' messages kept their emulated times, the
lies bought nothing (version, time, and FedAvg's accuracy within 0.03 of the
clean run's), the server's RSS (VmRSS from /proc, sampled every 0.2 s)
stayed within 10 % of the clean run's, and every attempt is counted in
`summary.json`: by reason exactly as sent, per source (logged up to
`deploy.max_logged_rejects`, the rest in `unlogged`).

It found that a bound of the least the downlink can take let a back-dated
update through whenever TCP's slow start after idle made the task's real
delivery a round trip later (the server now keeps a copy of each client's
downlink: tests/actors/test_actor_insider.py). About 2 minutes of real
federations: marked slow, run by `make test-repro` (in CI).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import pytest
import zmq
import zmq.auth

from fedsim.results.writer import read_events
from fedsim.wire.codec import decode, encode
from fedsim.wire.messages import (
    HOST_EVENT_KINDS,
    SCHEMA_VERSION,
    ClockProbe,
    HostHello,
    Refused,
)

from .conftest import ROOT, fedsim, finish, wait_for, wait_for_events

# about 2 minutes of real federations: with the longer real-run checks (make test-repro)
pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

INSIDER = "host-2"
HONEST = ("host-0", "host-1")
IDS = {"host-0": "0-3", "host-1": "4-7", "host-2": "8-11"}
DOWN = UP = 0.5
STEP, STEPS = 0.01, 10
MARK = 987_654_321       # insider_host.MARK: the made-up records' task id
IDLE = 40                # TCP connections that never handshake
BIG = 2                  # 30 MB frames, one connection each
PROBES_UNREGISTERED = 1000
OVERSIZE = 10            # insider_host --oversize
LOGGED = 10              # deploy.max_logged_rejects (its default)

SCENARIO = """
name = "insider"
seed = 3
[data]
dataset = "synthetic"
num_clients = 12
[model]
name = "mlp"
hidden = [64]
[client]
lr = 0.05
batch_size = 32
local_steps = {steps}
[run]
time_budget = 12.0
[devices]
step_time = {step}
[network.up]
delay = {up}
[network.down]
delay = {down}
[deploy]
handshake_timeout = 1.0
[algorithm]
{algorithm}
"""

ALGORITHMS = {
    "fedasync": 'name = "fedasync"\nconcurrency = 12\n[eval]\nevery_updates = 25',
    "fedavg": 'name = "fedavg"\nweighting = "samples"',
}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _dealer(ctx: zmq.Context, keys: Path, address: str, identity: bytes | None = None,
            reconnect: bool = True) -> zmq.Socket:
    """A DEALER with the insider's key pair (a socket of its own)."""
    public, secret = zmq.auth.load_certificate(keys / f"{INSIDER}.key_secret")
    server, _ = zmq.auth.load_certificate(keys / "server.key")
    s = ctx.socket(zmq.DEALER)
    s.curve_publickey, s.curve_secretkey, s.curve_serverkey = public, secret, server
    if identity is not None:
        s.setsockopt(zmq.ROUTING_ID, identity)
    if not reconnect:
        s.setsockopt(zmq.RECONNECT_IVL, -1)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(address)
    return s


def _hello_as_host0(seq: int) -> list[Any]:
    return encode(HostHello(host="host-0", pid=1, clients=(0, 1, 2, 3), samples=(1,) * 4,
                            boot_id="x", fedsim_version="x", scenario_hash="x"), seq=seq)


class _Sampler:
    """The server's VmRSS (from /proc/<pid>/status) and open descriptors, every 0.2 s."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.rss: list[tuple[float, int]] = []
        self.fds: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                status = Path(f"/proc/{self.pid}/status").read_text()
                fds = len(os.listdir(f"/proc/{self.pid}/fd"))
            except OSError:
                return
            rss = [int(line.split()[1]) for line in status.splitlines()
                   if line.startswith("VmRSS:")]
            if not rss:  # it has exited (a zombie has no memory)
                return
            kb = rss[0]
            now = time.time()
            self.rss.append((now, kb * 1024))
            self.fds.append((now, fds))
            self._stop.wait(0.2)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


@dataclass
class Run:
    summary: dict[str, Any]
    events: list[dict[str, Any]]
    rss: list[tuple[float, int]]
    fds: list[tuple[float, int]]
    seconds: float
    insider: dict[str, Any] = field(default_factory=dict)
    outside: dict[str, Any] = field(default_factory=dict)


def _outside_attacks(ctx: zmq.Context, keys: Path, address: str, run_dir: Path,
                     held: list[Any]) -> dict[str, Any]:
    """What the harness does with the insider's key on sockets of its own, once the run
    has started: idle connections, 30 MB frames, a second registration as host-0, a
    probe flood from a connection that never registers."""
    wait_for_events(run_dir, "start", timeout=120)
    time.sleep(2.0)
    host, port = address.removeprefix("tcp://").rsplit(":", 1)
    held.extend(socket.create_connection((host, int(port))) for _ in range(IDLE))
    for _ in range(BIG):
        big = _dealer(ctx, keys, address, reconnect=False)
        big.send_multipart([msgpack.packb([SCHEMA_VERSION, "EventBatch", 0.0, 0]),
                            b"\x90" * (30 << 20)])
        held.append(big)
    # host-2's key, registering as host-0 over a connection of its own
    foreign = _dealer(ctx, keys, address)
    held.append(foreign)
    foreign.send_multipart(_hello_as_host0(seq=0))
    assert foreign.poll(10_000), "no answer to a registration under another host's name"
    refusal = foreign.recv_multipart()
    # a probe flood from a connection that never registers
    flood = _dealer(ctx, keys, address)
    held.append(flood)
    for i in range(PROBES_UNREGISTERED):
        flood.send_multipart(encode(ClockProbe(seq=i, t_sent=0.0), seq=i))
    time.sleep(3.0)
    answered = 0
    while flood.poll(10):
        flood.recv_multipart()
        answered += 1
    return {"refusal": refusal, "answered": answered}


def _federation(tmp_path: Path, algorithm: str, attacked: bool) -> Run:
    name = "attacked" if attacked else "clean"
    scenario = tmp_path / f"{algorithm}.toml"
    scenario.write_text(SCENARIO.format(steps=STEPS, step=STEP, up=UP, down=DOWN,
                                        algorithm=ALGORITHMS[algorithm]))
    keys = tmp_path / "keys"
    if not keys.exists():
        code, _, err = finish(fedsim("keys", str(keys), "--hosts", "3", "--scenario",
                                     str(scenario)))
        assert code == 0, err
    address = f"tcp://127.0.0.1:{_port()}"
    run_dir = tmp_path / f"{algorithm}-{name}"
    t0 = time.monotonic()
    server = fedsim("server", str(scenario), "--bind", address, "--keys", str(keys), "--out",
                    str(run_dir), "--no-progress", "--dilation", "2")
    wait_for(run_dir / "endpoints.json")  # it listens
    sampler = _Sampler(server.pid)
    ctx = zmq.Context()
    held: list[Any] = []
    outside: dict[str, Any] = {}
    try:
        if attacked:
            # the squatter: host-2's key, under the routing id host-0 would once have
            # chosen, connected (and talking) before any host
            squatter = _dealer(ctx, keys, address, identity=b"host-0")
            held.append(squatter)
            squatter.send_multipart(encode(ClockProbe(seq=0, t_sent=0.0)))
            squatter.send_multipart(_hello_as_host0(seq=1))
            time.sleep(1.0)
        hosts = {h: fedsim("clients", str(scenario), "--connect", address, "--ids", IDS[h],
                           "--name", h, "--keys", str(keys)) for h in HONEST}
        if attacked:
            hosts[INSIDER] = subprocess.Popen(
                [sys.executable, str(ROOT / "tests" / "integration" / "insider_host.py"),
                 str(scenario), "--connect", address, "--ids", IDS[INSIDER], "--name",
                 INSIDER, "--keys", str(keys), "--oversize", str(OVERSIZE)],
                cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                start_new_session=True)
            outside = _outside_attacks(ctx, keys, address, run_dir, held)
        else:
            hosts[INSIDER] = fedsim("clients", str(scenario), "--connect", address, "--ids",
                                    IDS[INSIDER], "--name", INSIDER, "--keys", str(keys))
        code, _, err = finish(server, timeout=180)
        assert code == 0, err[-3000:]
        outs = {}
        for h, proc in hosts.items():
            code_h, out_h, err_h = finish(proc)
            assert code_h == 0, (h, err_h[-3000:])
            outs[h] = out_h
    finally:
        sampler.stop()
        for s in held:
            s.close()
        ctx.destroy(linger=0)
    insider = {}
    if attacked:
        insider = json.loads(outs[INSIDER].strip().splitlines()[-1])["insider"]
    return Run(summary=json.loads((run_dir / "summary.json").read_text()),
               events=list(read_events(run_dir / "events.jsonl")), rss=sampler.rss,
               fds=sampler.fds, seconds=time.monotonic() - t0, insider=insider,
               outside=outside)


def _of(events: list[dict[str, Any]], ev: str, **match: Any) -> list[dict[str, Any]]:
    return [e for e in events if e["ev"] == ev and all(e.get(k) == v for k, v in match.items())]


def _client_host(cid: int) -> str:
    return f"host-{cid // 4}"


def _expected_rejections(run: Run) -> tuple[dict[str, int], dict[str, int], int]:
    """What the attacks must have been rejected as: by reason, by source; and how many
    of the insider's record batches its share of the server's time turned away."""
    s, ins, out = run.summary, run.insider, run.outside
    sent = ins["sent"]
    rejected = s["rejected_messages"]["server"]
    # the unregistered flood: the key's budget (after the second registration's token)
    unregistered_limited = PROBES_UNREGISTERED - out["answered"]
    # over its share of the server's time, a registered host's control messages are
    # turned away: its probes (those the insider saw unanswered) and record batches
    probes_limited = sent["probe"] - ins["flood_answered"] + ins["prober_unanswered"]
    batches_limited = rejected.get("rate_limited", 0) - unregistered_limited - probes_limited
    per_batch, madeup = ins["records_per_batch"], ins["madeup_per_batch"]
    written = [e for e in run.events if e.get("host") == INSIDER and e["ev"] in HOST_EVENT_KINDS]
    madeup_written = sum(1 for e in written if e.get("task_id") == MARK)
    honest_written = len(written) - madeup_written
    assert madeup_written <= madeup * sent["record_batch"]
    records_refused = ((sent["record_batch"] - batches_limited) * per_batch - madeup_written
                       + ins["honest_records"] - honest_written)
    by_reason = {
        "handshake_timeout": IDLE,
        "connection_dropped": BIG,
        "routing_id": 2,                     # the squatter's probe and registration
        "refused": 1,                        # host-2's key registering as host-0
        "rate_limited": unregistered_limited + probes_limited + batches_limited,
        "non_finite": sent["non_finite"],
        "shape_mismatch": sent["shape_mismatch"],
        "unknown_task": sent["unknown_task"],
        "oversize_header": sent["oversize_envelope"] + sent["oversize_header"],
        "oversize": sent["oversize"],
        "replay": sent["replay"],
        "bad_event": records_refused,
    }
    outside_reasons = ("handshake_timeout", "connection_dropped")
    key_reasons = ("routing_id", "refused")
    by_source = {
        "127.0.0.1": sum(by_reason[r] for r in outside_reasons),
        f"key {INSIDER}": sum(by_reason[r] for r in key_reasons) + unregistered_limited,
        INSIDER: sum(n for r, n in by_reason.items() if r not in outside_reasons + key_reasons)
        - unregistered_limited,
    }
    return by_reason, by_source, batches_limited


@pytest.mark.parametrize("algorithm", ["fedavg", "fedasync"])
def test_an_insider_with_a_valid_key_bends_nothing_and_every_attempt_is_counted(
        tmp_path: Path, algorithm: str) -> None:
    clean = _federation(tmp_path, algorithm, attacked=False)
    run = _federation(tmp_path, algorithm, attacked=True)
    s, ins, out = run.summary, run.insider, run.outside
    print(f"\n{algorithm}: clean {clean.seconds:.0f} s, attacked {run.seconds:.0f} s; "
          f"accuracy {clean.summary['final_accuracy']} -> {s['final_accuracy']}; "
          f"max RSS {max(r for _, r in clean.rss) / 1e6:.1f} -> "
          f"{max(r for _, r in run.rss) / 1e6:.1f} MB; max fds "
          f"{max(n for _, n in clean.fds)} -> {max(n for _, n in run.fds)}; "
          f"lateness p99 {clean.summary['fidelity']['lateness_ms']['p99']:.2f} -> "
          f"{s['fidelity']['lateness_ms']['p99']:.2f} ms; insider {json.dumps(ins)}; "
          f"outside answered {out['answered']}; rejected {s['rejected_messages']}; "
          f"unregistered {s['unregistered_messages']}; corrections "
          f"{s['send_time_corrections']}")
    # the clean run is a fair reference
    assert clean.summary["status"] == "completed"
    assert clean.summary["fidelity"]["verdict"] == "pass", clean.summary["fidelity"]["reasons"]
    assert clean.summary["rejected_messages"]["server"] == {}
    assert clean.summary["send_times_clamped"] == 0
    # the attacked run completed with every host, the insider's attack inside it
    assert s["status"] == "completed", s["status"]
    assert s["clients_missing"] == []
    assert s["hosts"]["reported"] == 3, s["hosts"]
    assert "end" in ins, "the run ended before the insider's attack did"
    assert ins["sent"]["probe"] == 3000
    assert ins["sent"]["record_batch"] == 800
    assert ins["lied_updates"] >= 12, ins
    refusal, _ = decode(out["refusal"])
    assert isinstance(refusal, Refused), refusal
    assert "the key is host-2's, but the host calls itself 'host-0'" in refusal.reason

    # -- the verdict fails for the insider alone ------------------------------------
    fidelity = s["fidelity"]
    assert fidelity["verdict"] == "fail"
    assert fidelity["reasons"], fidelity
    assert all(r.startswith(f"send_times[{INSIDER}]:") for r in fidelity["reasons"]), \
        fidelity["reasons"]
    for h in HONEST:
        assert fidelity["clocks"][h]["send_times_corrected"] == 0, fidelity["clocks"][h]
    # every correction is the insider's, each with a warning: the fuzzer's impossible
    # send times clamped into the window, and nearly every lying update corrected, raised
    # to what its task allows (or clamped: those its own floods held up on its connection
    # for longer than deploy.max_transit_ms); any other claimed no more than the time its
    # client really waited beyond the least (seen over 300 ms links: the first round's,
    # slowed by the trainers' warm-up)
    corrections = s["send_time_corrections"]
    warned = [e for e in _of(run.events, "warning") if e.get("kind") == "update"]
    clamped = [(e["client"], e["sent_at"]) for e in warned
               if e["reason"] == "send time out of bounds: clamped"]
    raised = [(e["client"], e["sent_at"]) for e in warned
              if "earliest delivery and compute: raised to" in e["reason"]]
    assert {_client_host(c) for c, _ in clamped + raised} == {INSIDER}
    assert corrections["out_of_window"] == len(clamped), corrections
    # (a message is counted once: clamped, then raised too)
    assert corrections["before_record"] == len(set(raised) - set(clamped)), corrections
    lies_corrected = sum(corrections.values()) - ins["sent"]["unknown_task"]
    assert 0.8 * ins["lied_updates"] <= lies_corrected <= ins["lied_updates"], corrections
    assert s["send_times_clamped"] == sum(corrections.values())
    assert fidelity["clocks"][INSIDER]["send_times_corrected"] == s["send_times_clamped"]

    # -- the lies bought nothing: time, version, weight -------------------------------
    events = run.events
    tasks = {e["task_id"]: e for e in _of(events, "send", dir="down", kind="task")}
    ups = _of(events, "deliver", dir="up", kind="update")
    assert {_client_host(e["client"]) for e in ups} == {*HONEST, INSIDER}
    for e in ups:  # sent no earlier than its task allows, then its whole uplink
        task = tasks[e["task_id"]]
        assert e["sent_at"] >= task["sent_at"] + DOWN + STEPS * STEP - 1e-6, (e, task)
        assert e["t"] - e["sent_at"] >= UP - 1e-9, e
        assert e["version"] == task["version"], (e, task)
    applied = _of(events, "aggregate")
    sent_versions = {(e["client"], e["version"]) for e in tasks.values()}
    if algorithm == "fedasync":
        assert {(e["clients"][0], e["base_version"]) for e in applied} <= sent_versions
        count = {h: sum(1 for e in applied if _client_host(e["clients"][0]) == h)
                 for h in (*HONEST, INSIDER)}
        assert count[INSIDER] <= max(count[h] for h in HONEST) * 1.15 + 3, count
        stale = {h: [e["staleness"] for e in applied if _client_host(e["clients"][0]) == h]
                 for h in (*HONEST, INSIDER)}
        mean = {h: sum(v) / len(v) for h, v in stale.items()}
        assert mean[INSIDER] >= 0.8 * min(mean[h] for h in HONEST), mean
    else:
        # 10^12 samples claimed, the partition's weight given: FedAvg learns as in the
        # clean run with the same seed
        assert s["final_accuracy"] == pytest.approx(clean.summary["final_accuracy"], abs=0.03)
        assert s["rounds"] >= clean.summary["rounds"] - 2, (s["rounds"], clean.summary["rounds"])

    # -- what it cost the server -----------------------------------------------------------
    clean_rss = max(r for _, r in clean.rss)
    rss = max(r for _, r in run.rss)
    assert rss <= 1.10 * clean_rss, (clean_rss, rss)
    # the idle connections were closed: back to the clean run's descriptors (+ the
    # harness's squatter, second registration and flood sockets still connected)
    settled = [n for t, n in run.fds if t >= ins["end"]]
    assert settled, "the run ended before the descriptors could be sampled after the attack"
    assert max(settled) <= max(n for _, n in clean.fds) + 8, (settled, clean.fds[-5:])

    # -- every attempt counted -------------------------------------------------------------
    by_reason, by_source, batches_limited = _expected_rejections(run)
    assert 0 <= batches_limited <= ins["sent"]["record_batch"], batches_limited
    rejected = s["rejected_messages"]
    assert rejected["server"] == by_reason, (rejected["server"], by_reason)
    assert rejected["clients"] == 0   # the server sent the hosts nothing to reject
    logged = [e for e in events if e["ev"] == "reject"]
    for source, total in by_source.items():
        mine = [e for e in logged if e["sender"] == source]
        assert len(mine) + rejected["unlogged"].get(source, 0) == total, (source, total)
        for reason in {e["reason"] for e in mine}:
            assert sum(e["reason"] == reason for e in mine) <= LOGGED
    assert {e["sender"] for e in logged} == set(by_source)
    assert set(rejected["unlogged"]) <= set(by_source)
    # what came from connections that had not registered: the three hosts' clock probes
    # and registrations, the second registration, the unregistered flood's answered probes
    assert s["unregistered_messages"] == 3 * 9 + 1 + out["answered"], s["unregistered_messages"]
    # 10 a second and a burst of 50 (one spent by the second registration)
    assert 49 <= out["answered"] <= 49 + 10 * 8, out["answered"]
