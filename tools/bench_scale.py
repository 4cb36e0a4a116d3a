"""Scale benchmark: FedAsync with thousands of client actors on one machine.

A cross-device population (issue 12, point 1): ``N`` clients on the
machine's client hosts (one per core), a tiny model (an MLP 60-16-10 on
Synthetic(1,1), at most 10 samples per client), 50 ms links each way,
FedAsync keeping 12 tasks in flight (5 local steps of 20 ms emulated each, a
2 s task timeout), and half the clients following an on/off availability
process (exponential on 60 s / off 240 s, starting stationary: 40 % of the
population away at any moment); every other client is idle but for the
tasks it is picked for. Each ``N`` runs through ``fedsim run`` exactly as a
user would (a fresh process tree launched from here), at a dilation of 2
unless told otherwise.

Figures per ``N``:

* **startup**: ``summary["startup_s"]``, real seconds from the server's
  launch to t = 0 (registration and set-up included);
* **first agg.**: real seconds from launching ``fedsim run`` to the first
  aggregation (the start event's wall time plus the first ``aggregate``
  event's real time);
* **PSS / RSS**: the peak over the run of the sum over every process of the
  tree, sampled every 100 ms from ``/proc/PID/smaps_rollup``
  (tools/proctree.py); **host RSS**: the largest client host's peak RSS;
* **verdict**, **lateness p50 / p99** (ms, every emulated delivery judged),
  **overruns** (compute runs that came back after their emulated deadline,
  of all runs), **updates** applied, **events** (the size of events.jsonl)
  and the dilation used.

Then the memory of an idle client actor, measured twice:

* **in one process**: a client host (the real :class:`ClientHost`, its
  actors started as at t = 0, no connection, no worker) holding every
  client of an ``N``-client scenario, against one holding ``N/10`` of an
  ``N/10``-client one (the largest ``N`` asked for): the difference in
  RSS (after ``gc.collect``) and, in other interpreters (tracing costs
  memory itself), in ``tracemalloc``'s traced bytes, divided by the
  difference in clients;
* **in the runs**: the largest host's peak RSS at ``N`` against ``N/10``
  (if both were run), divided by the difference in clients per host. It is
  what a host needs per client over a whole run (event buffers, timers and
  links of the clients that trained included), so it bounds the idle cost
  from above.

A host holds no training data (its torch worker does), so neither figure
counts it.

Run: ``python tools/bench_scale.py`` (N = 1000, 5000, 10000: about 3 minutes
on 2 cores; ``--n 10000 20000``, ``--dilation``, ``--time-budget``,
``--keep DIR`` to keep the run directories, ``--json PATH``).

Measured 2026-11-25 on the 2-core development machine, load average
0.4-1.0, at commit ``e1097df`` (docs/measurements.md, "Thousands of clients
on one machine", has the table and what was fixed):

* N = 1,000 / 5,000 / 10,000: every verdict passes at dilation 2 (lateness
  p99 1.47 / 1.49 / 1.60 ms against 2.5 ms allowed, no overrun), startup
  2.55 / 2.86 / 3.19 s, first aggregation 2.95 / 3.26 / 3.60 s, summed PSS
  0.55 / 0.63 / 0.71 GB; before the fixes (``90c068e``) all three failed
  (p99 3.3 / 178 / 535 ms);
* 20,000 / 30,000 / 50,000 pass too (startup 4.3 / 5.6 / 7.4 s); 100,000
  fails: the first 11 tasks overrun (6.3 %), their trainers waiting while
  the hosts start 50,000 actors each and the server writes their records;
* an idle client actor: 1.6 KB (RSS and tracemalloc alike; 11.7 KB before),
  2.0 KB per client of a host's peak RSS over a whole run (13.4 KB before).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from proctree import Sampler  # tools/proctree.py (this script's directory is on sys.path)

ROOT = Path(__file__).resolve().parent.parent

SCENARIO = """\
name = "scale-{n}"
seed = 1
[data]
dataset = "synthetic"
num_clients = {n}
max_samples_per_client = 10
[model]
name = "mlp"
hidden = [16]
[algorithm]
name = "fedasync"
alpha = 0.6
staleness = "poly"
concurrency = {concurrency}
task_timeout = 2.0
[client]
lr = 0.05
batch_size = 10
local_steps = 5
[run]
time_budget = {budget}
dilation = {dilation}
[eval]
every_updates = 100
[network.up]
delay = 0.05
[network.down]
delay = 0.05
[devices]
step_time = 0.02
[availability]
model = "onoff"
fraction = {away}
mean_on = 60.0
mean_off = 240.0
start = "stationary"
"""


def scenario(n: int, *, concurrency: int = 12, budget: float = 20.0, dilation: float = 2.0,
             away: float = 0.5) -> str:
    """The benchmark's scenario for ``n`` clients (TOML)."""
    return SCENARIO.format(n=n, concurrency=concurrency, budget=budget, dilation=dilation,
                           away=away)


def _first_aggregation(events: Path) -> tuple[float | None, float | None]:
    """Wall time of t = 0 and real seconds from t = 0 to the first aggregation."""
    wall0 = first = None
    with events.open() as fh:
        for line in fh:
            if '"start"' in line and wall0 is None:
                e = json.loads(line)
                if e["ev"] == "start":
                    wall0 = e["wall"]
            elif '"aggregate"' in line:
                e = json.loads(line)
                if e["ev"] == "aggregate":
                    first = e["real"] if first is None else min(first, e["real"])
    return wall0, first


def run_fedsim(work: Path, n: int, args: argparse.Namespace) -> dict[str, Any]:
    """One ``fedsim run`` of the benchmark's scenario for ``n`` clients; its figures."""
    toml = work / f"scale-{n}.toml"
    toml.write_text(scenario(n, concurrency=args.concurrency, budget=args.time_budget,
                             dilation=args.dilation, away=args.away))
    out_dir = work / f"run-{n}"
    fedsim = str(Path(sys.executable).with_name("fedsim"))
    cmd = [fedsim, "run", str(toml), "--out", str(out_dir), "--no-plots"]
    if args.hosts:
        cmd += ["--set", f"deploy.hosts={args.hosts}"]
    load = os.getloadavg()[0]
    t0 = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sampler = Sampler(proc.pid, period=0.1)
    sampler.start()
    _, err = proc.communicate()
    sampler.stop.set()
    sampler.join()
    if proc.returncode != 0:
        sys.stderr.write(err[-3000:])
        raise SystemExit(f"fedsim run ({n} clients) exited with {proc.returncode}")
    summary = json.loads((out_dir / "summary.json").read_text())
    wall0, first = _first_aggregation(out_dir / "events.jsonl")
    fid = summary["fidelity"]
    hosts = [(pss, rss) for cmd_, pss, rss in sampler.per_process.values()
             if "fedsim.actors.host" in cmd_]
    nhosts = max(1, len(hosts))
    return {
        "n": n, "hosts": nhosts, "load": load,
        "startup_s": summary.get("startup_s"),
        "first_agg_s": None if wall0 is None or first is None else wall0 + first - t0,
        "pss_gb": sampler.pss / 1e9, "rss_gb": sampler.rss / 1e9,
        "host_rss_mb": max((r for _, r in hosts), default=0) / 1e6,
        "host_pss_mb": max((p for p, _ in hosts), default=0) / 1e6,
        "clients_per_host": n / nhosts,
        "verdict": fid["verdict"], "reasons": fid.get("reasons", []),
        "lateness_p50_ms": fid["lateness_ms"]["p50"],
        "lateness_p99_ms": fid["lateness_ms"]["p99"],
        "lateness_n": fid["lateness_ms"].get("n"),
        "overruns": fid.get("compute", {}).get("overruns"),
        "compute_runs": fid.get("compute", {}).get("runs"),
        "suggested_dilation": fid.get("suggested_dilation"),
        "dilation": fid.get("dilation", args.dilation),
        "updates": summary["updates"], "status": summary["status"],
        "events_mb": (out_dir / "events.jsonl").stat().st_size / 1e6,
        "real_s": summary.get("real_seconds"),
    }


# -- an idle client actor's memory, in one process ---------------------------------------

def _rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def actors_in_process(n: int, dilation: float, trace: bool) -> dict[str, float]:
    """Bytes of a client host holding every client of an ``n``-client scenario, its actors
    started as at t = 0: the RSS it grew by, or with ``trace`` the bytes ``tracemalloc``
    traced (which itself adds to the RSS: measured in another interpreter,
    ``--actors N [--trace]``)."""
    import asyncio
    import tracemalloc

    from fedsim.actors.host import ClientHost
    from fedsim.api import load
    from fedsim.wire.messages import Start
    from fedsim.wire.tensors import TensorSpec
    from netem.clock import monotonic

    work = Path(tempfile.mkdtemp(prefix="fedsim-bench-scale-"))
    try:
        (work / "s.toml").write_text(scenario(n, dilation=dilation))
        sc = load(work / "s.toml")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    clients = list(range(n))

    async def main() -> dict[str, float]:
        host = ClientHost(sc, "host-0", clients, conn=None, trainer=None,
                          fedsim_version="bench", scenario_hash="bench")
        start = Start(epoch=monotonic() + 0.01, dilation=dilation,
                      spec=TensorSpec([("float32", (16, 60))]), task_copies=1)
        gc.collect()
        rss0 = _rss()
        if trace:
            tracemalloc.start()
        host.build_clients(dict.fromkeys(clients, 10))
        host.begin(start)
        async with asyncio.TaskGroup() as tg:  # as ClientHost.run does from t = 0
            host._tg = tg
            await host.timers.sleep_until(0.0)
            for a in host.clients.values():
                a.start()
            gc.collect()
            grown = tracemalloc.get_traced_memory()[0] if trace else _rss() - rss0
            await host.stop_clients(wait=0.0)
        host.timers.close()
        return {"n": n, "bytes": grown}

    return asyncio.run(main())


def actor_memory(n: int, dilation: float) -> dict[str, float]:
    """Bytes per idle client actor: a host of ``n`` clients against one of ``n // 10``."""
    out: dict[str, float] = {"n": n}
    for what, flags in (("rss_per_actor", []), ("traced_per_actor", ["--trace"])):
        got = []
        for k in (n // 10, n):
            proc = subprocess.run([sys.executable, __file__, "--actors", str(k),
                                   "--dilation", str(dilation), *flags],
                                  capture_output=True, text=True, check=True)
            got.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        small, big = got
        out[what] = (big["bytes"] - small["bytes"]) / (big["n"] - small["n"])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, nargs="+", default=[1000, 5000, 10000],
                    help="numbers of clients to run")
    ap.add_argument("--dilation", type=float, default=2.0)
    ap.add_argument("--time-budget", type=float, default=20.0, help="emulated seconds per run")
    ap.add_argument("--concurrency", type=int, default=12, help="FedAsync's tasks in flight")
    ap.add_argument("--away", type=float, default=0.5,
                    help="fraction of clients under the on/off availability process")
    ap.add_argument("--hosts", type=int, default=0, help="client hosts (0: one per core)")
    ap.add_argument("--no-memory", action="store_true",
                    help="skip the in-process measurement of an idle actor's memory")
    ap.add_argument("--keep", default=None, metavar="DIR", help="keep the run directories here")
    ap.add_argument("--json", default=None, help="write the figures here")
    ap.add_argument("--actors", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--trace", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.actors is not None:   # the in-process measurement, in a fresh interpreter
        print(json.dumps(actors_in_process(args.actors, args.dilation, args.trace)))
        return 0
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="fedsim-bench-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    try:
        for n in args.n:
            row = run_fedsim(work, n, args)
            rows.append(row)
            print(f"  N={n}: {row['verdict']} (load {row['load']:.1f})", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(f"\nFedAsync, {args.concurrency} in flight, MLP 60-16-10, <= 10 samples per client, "
          f"50 ms links, {args.away:.0%} of clients on/off; {args.time_budget:g} emulated s "
          f"per run ({os.cpu_count()} cores)\n")
    print(f"{'N':>6s}{'hosts':>6s}{'startup':>9s}{'1st agg':>9s}{'PSS GB':>8s}{'RSS GB':>8s}"
          f"{'host RSS':>10s}{'verdict':>8s}{'p50 ms':>8s}{'p99 ms':>8s}{'overruns':>10s}"
          f"{'updates':>8s}{'events':>8s}{'dil.':>5s}{'load':>6s}")
    for r in rows:
        print(f"{r['n']:>6d}{r['hosts']:>6d}{_f(r['startup_s'], 's'):>9s}"
              f"{_f(r['first_agg_s'], 's'):>9s}{r['pss_gb']:>8.2f}{r['rss_gb']:>8.2f}"
              f"{r['host_rss_mb']:>7.0f} MB{r['verdict']:>8s}{_f(r['lateness_p50_ms']):>8s}"
              f"{_f(r['lateness_p99_ms']):>8s}{r['overruns']:>5}/{r['compute_runs']:<4}"
              f"{r['updates']:>8d}{r['events_mb']:>6.1f}MB{r['dilation']:>5g}{r['load']:>6.1f}")
    for r in rows:
        if r["verdict"] != "pass":
            print(f"  N={r['n']} fails: {'; '.join(r['reasons'])} "
                  f"(suggested dilation {r['suggested_dilation']})")
    memory: dict[str, Any] = {}
    by_n = {r["n"]: r for r in rows}
    for r in rows:
        small = by_n.get(r["n"] // 10)
        if small is not None:
            d = r["clients_per_host"] - small["clients_per_host"]
            per = (r["host_rss_mb"] - small["host_rss_mb"]) * 1e6 / d
            memory[f"run {small['n']} -> {r['n']}"] = per
            print(f"memory per client, host peak RSS from N={small['n']} to N={r['n']}: "
                  f"{per / 1e3:.1f} KB")
    if not args.no_memory:
        m = actor_memory(max(args.n), args.dilation)
        memory["in_process"] = m
        print(f"memory per idle client actor, one host of {m['n'] // 10} vs {m['n']} actors: "
              f"RSS {m['rss_per_actor'] / 1e3:.1f} KB, traced {m['traced_per_actor'] / 1e3:.1f} KB"
              "  [< 50 KB]")
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": rows, "memory": memory}, indent=1))
    return 0


def _f(v: float | None, unit: str = "") -> str:
    return "-" if v is None else f"{v:.2f}{unit}" if v < 100 else f"{v:.0f}{unit}"


if __name__ == "__main__":
    sys.exit(main())
