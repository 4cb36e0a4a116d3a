"""Latency scaling: FedAvg round time against what netem's link model predicts.

For one-way latencies of 1 ms, 100 ms and 1 s, each with netem's TCP model
(``loss_mode = "tcp"``, the default) and without it, the benchmark runs a
small FedAvg federation through ``fedsim run`` and prints the measured mean
emulated round time next to the prediction, and their ratio, so a user can
see that the model is what docs/netem.md says it is.

"Without the TCP model": a scenario has no switch for TCP alone (slow start
after idle is ``netem.tcp.TcpParams.slow_start_after_idle``, a library
setting). ``loss_mode = "message"`` (the switch docs/netem.md names) is a
message-level link with no TCP: with no loss configured, a message is
serialised whole at the rate and delivered one propagation delay later.

The federation: 4 clients of Synthetic(1,1), all sampled every round
(``fraction = 1``); the MLP 60-200-10 (14,210 float32 parameters, a 57 KB
message each way: 40 segments of 1448 bytes); 10 local steps at an
emulated ``devices.step_time`` of 25 ms, so the compute per round is
``C = 0.25 s``; every link 100 Mbit/s (``--rate``), a constant delay ``d``
(no jitter, no loss, unbounded queue); one client host; evaluation only at
the end. Every client and link is the same, so a round is one task down,
``C``, one update up.

Predictions, from the formulas docs/netem.md gives (computed here, not by
calling netem's link code):

* whole messages (``message``): a message of ``b`` bytes is ``n =
  ceil(b / mss)`` packets, serialised in ``s = (b + n x overhead) x 8 /
  rate``, delivered ``s + d`` after it is sent; a round is ``C + (s_down +
  d) + (s_up + d)``, i.e. about ``2d`` plus compute and serialisation;
* TCP (``tcp``): every message starts from the initial window of 10
  segments (slow start after idle: a direction is silent for longer than
  its RTO between two messages; the tool checks that it is, with the RTO
  of RFC 6298's estimator, ``SRTT + max(4 RTTVAR, 200 ms)``, at its largest,
  the second message). A round of TCP sends ``w = min(cwnd, remaining)``
  segments and lasts ``max(RTT + tau, w x tau)`` (``RTT = 2d``, ``tau = s /
  n``); cwnd doubles per round. The message is delivered ``d`` after its
  last segment leaves. The 57 KB model is 10 + 20 + 10 segments: two RTTs
  more than a whole message per direction when ``d`` dominates, so a round
  is about ``10d + C``.

Measured, per run: the mean gap between consecutive ``aggregate`` events
(rounds 2 to N: round 1 starts with the federation), in emulated seconds;
the median send-to-delivery time of the model messages each way
(``summary.transfer``: the link's time plus the delivery timer's
lateness); and ``link-pred``, the largest difference between the delivery
time the link itself scheduled (``scheduled - sent_at`` of every model
message, each with its own size, the first on each connection included)
and the formula. That compares the model with its documentation without
timing noise; a message that did not start from cwnd 10 would show here.

Each row prints its run's fidelity verdict. The measured round is a
little longer than predicted because every real overhead on a round's path
(the delivery timers' lateness, the host's queueing before the client
starts its compute, the compute timer, encoding, aggregation) passes into
emulated time divided by the dilation: a client's compute starts when its
actor takes the task and an update is stamped when it is sent. The
verdict judges only the timers' lateness and compute overruns, so on a
busy machine a row can pass and still be about 1 % further off than on a
quiet one; a failing row's timing is not the scenario's at all. Run the
tool at normal priority (under ``chrt -i 0`` fedsim's own event loops
wait for every other process). The dilations
(1 ms: 2, 100 ms: 1, 1 s: 0.2) keep the 1 s runs, mostly waiting, short,
and give the 1 ms runs (allowed lateness 1 ms) and the 100 ms runs (5 ms)
headroom on a shared machine.

Run: ``PYTHONPATH=. python tools/bench_latency.py`` (about a minute on 2 cores;
``--rounds``, ``--rate``, ``--dilation-scale``, ``--json PATH``, ``--keep
DIR``). Figures are in
docs/measurements.md#latency-scaling-round-time-against-the-link-model.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

LOCAL_STEPS = 10
STEP_TIME = 0.025  # emulated seconds per local step
COMPUTE = LOCAL_STEPS * STEP_TIME

# netem's defaults (docs/netem.md: "Rate, serialisation and queue", "Loss on TCP
# is delay"), written out here so that the prediction does not call netem.
MSS = 1448
OVERHEAD = 90
INIT_CWND = 10
RTO_MIN = 0.2

SCENARIO = f"""\
name = "latbench"
seed = 1
[data]
dataset = "synthetic"
num_clients = 4
[model]
name = "mlp"
hidden = [200]
[algorithm]
name = "fedavg"
fraction = 1.0
[client]
optimizer = "sgd"
lr = 0.05
batch_size = 32
local_steps = {LOCAL_STEPS}
[eval]
every_rounds = 1000
[devices]
step_time = {STEP_TIME}
[network.up]
mss = {MSS}
overhead = {OVERHEAD}
[network.down]
mss = {MSS}
overhead = {OVERHEAD}
[deploy]
hosts = 1
"""

LATENCIES = (0.001, 0.1, 1.0)
DILATIONS = {0.001: 2.0, 0.1: 1.0, 1.0: 0.2}
MODES = ("tcp", "message")


def serialization(nbytes: int, rate: float | None) -> float:
    """Seconds on the wire for a message: ``(b + ceil(b / mss) x overhead) x 8 / rate``."""
    if rate is None:
        return 0.0
    packets = max(1, math.ceil(nbytes / MSS))
    return (nbytes + packets * OVERHEAD) * 8.0 / rate


def whole_message(nbytes: int, d: float, rate: float | None) -> float:
    """Send-to-delivery time of a message without TCP: serialisation plus ``d``."""
    return serialization(nbytes, rate) + d


def tcp_from_initial_window(nbytes: int, d: float, rate: float | None) -> float:
    """Send-to-delivery time of a message that starts from cwnd 10 (no loss).

    Rounds of ``w = min(cwnd, remaining)`` segments lasting ``max(RTT + tau,
    w tau)``; cwnd doubles per round (no ssthresh yet, no window cap: the
    queue is unbounded); delivery is one propagation delay after the last
    segment leaves.
    """
    n = max(1, math.ceil(nbytes / MSS))
    tau = serialization(nbytes, rate) / n
    rtt = 2.0 * d
    t = finish = 0.0
    sent, cwnd = 0, INIT_CWND
    while sent < n:
        w = min(cwnd, n - sent)
        finish = t + w * tau
        t += max(rtt + tau, w * tau)
        sent += w
        cwnd *= 2
    return finish + d


def largest_rto(d: float) -> float:
    """The RTO before a direction's second message (its largest in this run).

    RFC 6298 with a constant RTT ``2d``: the handshake's sample gives SRTT =
    2d, RTTVAR = d; each message's sample leaves SRTT and multiplies RTTVAR
    by 3/4. Before the second message RTTVAR = 3d/4.
    """
    srtt, rttvar = 2.0 * d, 0.75 * d
    return srtt + max(4.0 * rttvar, RTO_MIN)


@dataclass(frozen=True)
class Prediction:
    down: float
    up: float
    round: float
    idle_ok: bool  # every message starts from cwnd 10 (TCP); True without TCP


def predict(mode: str, d: float, rate: float | None, b_down: int, b_up: int) -> Prediction:
    """The round time the model predicts for ``mode`` at one-way delay ``d``."""
    f = tcp_from_initial_window if mode == "tcp" else whole_message
    down, up = f(b_down, d, rate), f(b_up, d, rate)
    rnd = COMPUTE + down + up
    idle_ok = True
    if mode == "tcp":
        # A direction's last segment leaves `d` before its delivery; it next
        # sends one round later. Silent for longer than the RTO: cwnd restarts.
        idle_ok = min(rnd - down + d, rnd - up + d) > largest_rto(d)
    return Prediction(down, up, rnd, idle_ok)


def run_one(work: Path, mode: str, d: float, rate: float | None, rounds: int,
            dilation: float, keep: bool = False) -> dict[str, Any]:
    """One ``fedsim run``; the measured figures and the prediction."""
    out = work / f"run-{mode}-{d:g}"
    cmd = [sys.executable, "-m", "fedsim.cli", "run", str(work / "latbench.toml"),
           "--out", str(out), "--no-plots", "--dilation", f"{dilation:g}",
           "--set", f"run.max_rounds={rounds}"]
    for direction in ("up", "down"):
        cmd += ["--set", f"network.{direction}.delay={d!r}",
                "--set", f"network.{direction}.loss_mode={mode}",
                "--set", f"network.{direction}.rate="
                + ("unlimited" if rate is None else repr(rate))]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-3000:])
        raise SystemExit(f"fedsim run exited with {proc.returncode} ({mode}, d = {d:g})")
    summary = json.loads((out / "summary.json").read_text())
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()
              if line.strip()]
    closes = sorted(e["t"] for e in events if e["ev"] == "aggregate")
    gaps = [b - a for a, b in itertools.pairwise(closes)]
    delivered = [e for e in events if e["ev"] == "deliver" and e["kind"] in ("task", "update")]
    b_down = round(statistics.mean(e["bytes"] for e in delivered if e["dir"] == "down"))
    b_up = round(statistics.mean(e["bytes"] for e in delivered if e["dir"] == "up"))
    pred = predict(mode, d, rate, b_down, b_up)
    # What the link itself scheduled (no lateness): the model against the formula.
    one = tcp_from_initial_window if mode == "tcp" else whole_message
    sched_off = max(abs(e["scheduled"] - e["sent_at"] - one(e["bytes"], d, rate))
                    for e in delivered)
    fid = summary["fidelity"]
    if not keep:
        shutil.rmtree(out, ignore_errors=True)
    return {
        "mode": mode, "delay": d, "dilation": dilation, "rounds": summary["rounds"],
        "round_measured": statistics.mean(gaps) if gaps else math.nan,
        "round_min": min(gaps, default=math.nan), "round_max": max(gaps, default=math.nan),
        "round_predicted": pred.round,
        "down_measured": summary["transfer"]["down"]["p50_ms"] / 1e3,
        "up_measured": summary["transfer"]["up"]["p50_ms"] / 1e3,
        "down_predicted": pred.down, "up_predicted": pred.up,
        "link_vs_formula_max": sched_off,
        "bytes_down": b_down, "bytes_up": b_up, "restarts_every_message": pred.idle_ok,
        "verdict": fid["verdict"], "reasons": fid.get("reasons", []),
        "lateness_p99_ms": fid.get("lateness_ms", {}).get("p99"),
        "suggested_dilation": fid.get("suggested_dilation"),
    }


def _ms(x: float) -> str:
    return f"{x * 1e3:9.1f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=8, help="FedAvg rounds per run (default 8)")
    ap.add_argument("--rate", default="100e6",
                    help="every link's rate in bits/s, or 'unlimited' (default 100e6)")
    ap.add_argument("--dilation-scale", type=float, default=1.0,
                    help="multiply each latency's dilation (1 ms: 2, 100 ms: 1, 1 s: 0.2)")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    ap.add_argument("--keep", type=Path, help="keep the run directories in this directory")
    args = ap.parse_args(argv)
    if args.rounds < 3:
        ap.error("--rounds must be at least 3 (round 1 is not timed)")
    rate = None if args.rate == "unlimited" else float(args.rate)

    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
    work = args.keep or Path(tempfile.mkdtemp(prefix="fedsim-bench-latency-"))
    (work / "latbench.toml").write_text(SCENARIO)
    rows = []
    try:
        for d in LATENCIES:
            for mode in MODES:
                rows.append(run_one(work, mode, d, rate, args.rounds,
                                    DILATIONS[d] * args.dilation_scale, bool(args.keep)))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    rate_s = "unlimited" if rate is None else f"{rate / 1e6:g} Mbit/s"
    print(f"FedAvg, 4 clients, 57 KB model, compute {COMPUTE * 1e3:.0f} ms per round, "
          f"links {rate_s}, constant delay d; {args.rounds} rounds, rounds 2..N timed "
          "(emulated ms)")
    print(f"{'d':>7} {'link':>8} {'dil':>4} | {'msg pred':>9} {'down p50':>9} {'up p50':>9}"
          f" {'link-pred':>9} | {'round pred':>10} {'measured':>9} {'ratio':>6}"
          " | verdict (lateness p99)")
    for r in rows:
        note = "" if r["restarts_every_message"] else "  [idle < RTO: prediction n/a]"
        late = r["lateness_p99_ms"]
        print(f"{r['delay'] * 1e3:5g}ms {r['mode']:>8} {r['dilation']:4g} |"
              f" {_ms(r['down_predicted'])} {_ms(r['down_measured'])} {_ms(r['up_measured'])}"
              f" {r['link_vs_formula_max'] * 1e9:7.0f}ns |"
              f" {_ms(r['round_predicted']):>10} {_ms(r['round_measured'])}"
              f" {r['round_measured'] / r['round_predicted']:6.3f} |"
              f" {r['verdict']} ({late if late is None else f'{late:.2f} ms'})"
              + "".join(f"; {x}" for x in r["reasons"]) + note)
    failed = [r for r in rows if r["verdict"] != "pass"]
    if failed:
        print(f"{len(failed)} run(s) failed the fidelity verdict: their timing is not the "
              "scenario's (a busy machine delays the event loops' timers); rerun with a "
              "larger --dilation-scale (suggested dilations: "
              + ", ".join(f"{r['delay'] * 1e3:g} ms {r['mode']}: {r['suggested_dilation']}"
                          for r in failed) + ")")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
