"""Load benchmark: the overhead task's emulated-time results on an idle and a loaded host.

The task is tools/bench_overhead.py's (FedAvg, 100 clients, 10 per round,
an MLP 60-200-10 on Synthetic(1,1), one local epoch of SGD, a zero-latency
network) with a target accuracy, run with ``fedsim run --dilation auto``
for each seed, once on the idle host and once with one busy-loop process
per core beside it (``stress-ng --cpu N`` when installed, else one Python
busy loop per core; the report says which). Idle and loaded runs
alternate, and each seed swaps which comes first, so drifting machine
noise hits both alike. Two device models:

* ``instant``: ``devices.step_time = 0`` (the issue's task). Every emulated
  duration of this scenario is zero: nothing but the emulator's own real
  work, divided by the dilation, moves its clock, so its time to target is
  that leak (bounded by the verdict: each delivery and each device result
  at most the allowed lateness late, at p99), not a property of the
  scenario.
* ``timed``: devices that take ``--step-time`` emulated seconds per local
  step (1 ms: about five times this host's 0.2 ms), and every task 10 local
  steps instead of an epoch (Synthetic(1,1)'s shard sizes are long-tailed:
  with an epoch, a 2-step task can wait behind a 1184-step one in its
  host's torch worker, which asks for a dilation of hundreds). Its time to
  target is compute the scenario models (10 ms a round), plus the leak.

Figures per run: time to target (emulated seconds; ``-`` when not
reached), final accuracy, the fidelity verdict (with its lateness p99 in
emulated ms and, when it fails, the suggested dilation), the dilation
auto chose, real seconds of the run, and how many cores other processes
on the machine used meanwhile (busy CPU time from ``/proc/stat`` less the
run's own and the load's). Then per device model the mean over seeds and
the loaded/idle ratios of time to target and final accuracy, against the
5 % the issue allows.

``--worker-sched`` sets ``FEDSIM_WORKER_SCHED`` (the torch workers'
scheduling policy: ``idle``, fedsim's default, or ``batch``) for the runs.
``--load-session`` says where the busy loops run: ``other`` (default: a
session of their own, as another terminal's or service's jobs; with the
kernel's autogroup scheduling fedsim and they share the cores as two
groups) or ``same`` (the benchmark's session, which fedsim's processes
share: one group, so the loops compete with fedsim's processes one by
one, and fedsim's torch workers, under ``SCHED_IDLE``, wait for them).

Run: ``python tools/bench_load.py`` (about 3 minutes on 2 cores; with
``--load-session same`` and the default workers, 20 minutes: the loaded
runs starve; ``--seeds``, ``--target``, ``--rounds``, ``--devices``,
``--step-time``, ``--load``, ``--load-session``, ``--worker-sched``,
``--json PATH``). Needs nothing but fedsim; as root, ``apt-get install -y
stress-ng`` provides stress-ng. The load is stopped (SIGTERM, then
SIGKILL) when a run ends, whatever happens. Figures measured with it, and
what they mean: docs/measurements.md#fidelity-under-load.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

from bench_overhead import SCENARIO  # noqa: E402  (tools/ is not a package)

# One busy loop per core from one process group (the fallback without stress-ng).
BUSY = r"""
import os, sys
for _ in range(int(sys.argv[1]) - 1):
    if os.fork() == 0:
        break
while True:
    pass
"""


def _loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def cores() -> int:
    return len(os.sched_getaffinity(0))


def _cpu_busy() -> float:
    """Seconds every core has spent busy since boot (/proc/stat, all CPUs)."""
    with open("/proc/stat") as fh:
        fields = [int(x) for x in fh.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _group_cpu(pgid: int) -> float:
    """CPU seconds of the live processes of process group ``pgid``."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                rest = fh.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(rest[2]) == pgid:
            total += int(rest[11]) + int(rest[12])
    return total / os.sysconf("SC_CLK_TCK")


class Load:
    """One busy-loop process per core, in a process group of its own."""

    def __init__(self, kind: str, session: str) -> None:
        self.kind = kind
        self.session = session
        self.proc: subprocess.Popen[bytes] | None = None

    def describe(self) -> str:
        tool = (f"stress-ng --cpu {cores()}" if self.kind == "stress-ng"
                else f"{cores()} Python busy loops")
        where = ("in a session of their own" if self.session == "other"
                 else "in fedsim's session")
        return f"{tool}, {where}"

    def start(self) -> None:
        if self.kind == "stress-ng":
            cmd = ["stress-ng", "--cpu", str(cores()), "--timeout", "3600", "-q"]
        else:
            cmd = [sys.executable, "-c", BUSY, str(cores())]
        group = ({"start_new_session": True} if self.session == "other"
                 else {"process_group": 0})
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, **group)
        time.sleep(1.0)  # every loop running before the run starts

    def cpu(self) -> float:
        return 0.0 if self.proc is None else _group_cpu(self.proc.pid)

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(wait)
                # stress-ng's workers may outlive its parent for a moment
                deadline = time.monotonic() + wait
                while _group_alive(proc.pid) and time.monotonic() < deadline:
                    time.sleep(0.05)
                if not _group_alive(proc.pid):
                    break
            except subprocess.TimeoutExpired:
                continue


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def run_one(work: Path, toml: Path, seed: int, target: float, sets: list[str],
            load: Load | None) -> dict[str, Any]:
    out = work / f"run-{seed}-{time.monotonic_ns()}"
    fedsim = str(Path(sys.executable).with_name("fedsim"))
    cmd = [fedsim, "run", str(toml), "--out", str(out), "--no-plots", "--dilation", "auto",
           "--set", f"seed={seed}", "--set", f"run.target_accuracy={target}"]
    for s in sets:
        cmd += ["--set", s]
    if load is not None:
        load.start()
    try:
        busy0, load0 = _cpu_busy(), (load.cpu() if load else 0.0)
        before = os.times()
        t0 = time.monotonic()
        proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              check=False)
        wall = time.monotonic() - t0
        after = os.times()
        busy, load_cpu = _cpu_busy() - busy0, (load.cpu() - load0 if load else 0.0)
    finally:
        if load is not None:
            load.stop()
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-3000:])
        raise SystemExit(f"fedsim run exited with {proc.returncode}")
    own = (after.children_user + after.children_system
           - before.children_user - before.children_system)
    s = json.loads((out / "summary.json").read_text())
    f = s["fidelity"]
    with (out / "metrics.csv").open() as fh:
        reached = [int(row["version"]) for row in csv.DictReader(fh)
                   if row["accuracy"] and float(row["accuracy"]) >= target]
    shutil.rmtree(out, ignore_errors=True)
    return {"seed": seed, "loaded": load is not None, "ttt": s["time_to_target_s"],
            "rounds_to_target": min(reached, default=None),
            "final_accuracy": s["final_accuracy"], "verdict": f["verdict"],
            "reasons": f["reasons"], "suggested": f["suggested_dilation"],
            "lateness_p99_ms": f["lateness_ms"]["p99"], "dilation": f["dilation"],
            "overruns": f["compute"]["overruns"], "compute_runs": f["compute"]["runs"],
            "real_s": s["real_seconds"], "wall_s": wall, "emulated_s": s["emulated_seconds"],
            "others_cores": max(0.0, busy - own - load_cpu) / wall}


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def report(name: str, runs: list[dict[str, Any]], target: float) -> dict[str, Any]:
    print(f"\n{name}: per seed (time to target {target} in emulated s)")
    print(f"  {'seed':>4s} {'host':7s}{'to target':>11s}{'rounds':>7s}{'final acc':>11s}  "
          f"{'verdict':36s}"
          f"{'dilation':>9s}{'real s':>8s}{'others':>8s}")
    for r in sorted(runs, key=lambda r: (r["seed"], r["loaded"])):
        verdict = f"{r['verdict']} (p99 {r['lateness_p99_ms']:.2f} ms"
        verdict += f", {r['overruns']} overruns)" if r["overruns"] else ")"
        if r["verdict"] != "pass":
            verdict += f" -> {r['suggested']:g}"
        print(f"  {r['seed']:>4d} {'loaded' if r['loaded'] else 'idle':7s}"
              f"{_fmt(r['ttt'], '.4g'):>11s}{_fmt(r['rounds_to_target'], 'd'):>7s}"
              f"{r['final_accuracy']:>11.4f}  {verdict:36s}"
              f"{r['dilation']:>9g}{r['real_s']:>8.2f}{r['others_cores']:>8.2f}")
    out: dict[str, Any] = {}
    for loaded in (False, True):
        rs = [r for r in runs if r["loaded"] == loaded]
        ttts = [r["ttt"] for r in rs]
        out["loaded" if loaded else "idle"] = {
            "ttt": statistics.mean(ttts) if None not in ttts else None,
            "final_accuracy": statistics.mean(r["final_accuracy"] for r in rs),
            "real_s": statistics.mean(r["real_s"] for r in rs),
            "passed": sum(r["verdict"] == "pass" for r in rs), "runs": len(rs)}
    idle, loaded = out["idle"], out["loaded"]
    for label, m in (("idle", idle), ("loaded", loaded)):
        print(f"  mean {label:7s}{_fmt(m['ttt'], '.4g'):>11s}{'':7s}{m['final_accuracy']:>11.4f}  "
              f"{m['passed']}/{m['runs']} passed{'':22s}{m['real_s']:>17.2f}")
    for key, label in (("ttt", "time to target"), ("final_accuracy", "final accuracy")):
        a, b = idle[key], loaded[key]
        if a and b is not None:
            ratio = b / a
            out[f"{key}_ratio"] = ratio
            ok = "within" if abs(ratio - 1) <= 0.05 else "outside"
            print(f"  loaded / idle {label:16s} {ratio:.3f}  ({ok} 5 %)")
        else:
            print(f"  loaded / idle {label:16s} -  (target not reached in every run)")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--target", type=float, default=0.6,
                    help="target accuracy (0.6: reached in 30-50 rounds for seeds 1-3)")
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--devices", default="instant,timed",
                    help="device models to run: instant, timed (comma-separated)")
    ap.add_argument("--step-time", type=float, default=0.001,
                    help="the timed devices' emulated seconds per local step")
    ap.add_argument("--load", choices=["auto", "stress-ng", "python"], default="auto",
                    help="the busy loops (auto: stress-ng when installed)")
    ap.add_argument("--load-session", choices=["other", "same"], default="other")
    ap.add_argument("--worker-sched", choices=["idle", "batch", "normal"], default=None,
                    help="FEDSIM_WORKER_SCHED for the runs' torch workers (default: fedsim's, "
                         "idle)")
    ap.add_argument("--json", default=None, help="write every run's figures here")
    args = ap.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    if args.worker_sched is not None:
        os.environ["FEDSIM_WORKER_SCHED"] = args.worker_sched
    workers = os.environ.get("FEDSIM_WORKER_SCHED", "idle")
    kind = args.load
    if kind == "auto":
        kind = "stress-ng" if shutil.which("stress-ng") else "python"
    load = Load(kind, args.load_session)
    work = Path(tempfile.mkdtemp(prefix="fedsim-bench-load-"))
    results: dict[str, Any] = {"load": load.describe(), "cores": cores(),
                               "worker_sched": workers, "variants": {}}
    try:
        text = SCENARIO.format(rounds=args.rounds)
        variants: dict[str, tuple[Path, list[str]]] = {}
        for name in args.devices.split(","):
            toml = work / f"{name}.toml"
            if name == "instant":
                toml.write_text(text)
                variants[name] = (toml, [])
            elif name == "timed":
                toml.write_text(text.replace("local_epochs = 1", "local_steps = 10"))
                variants[f"timed (10 steps of {args.step_time * 1e3:g} ms)"] = (
                    toml, [f"devices.step_time={args.step_time:g}"])
            else:
                raise SystemExit(f"unknown device model {name!r} (instant, timed)")
        print(f"load: {load.describe()}; {cores()} cores; torch workers: {workers}; "
              f"load average before: {_loadavg()}", flush=True)
        for name, (toml, sets) in variants.items():
            runs = []
            for i, seed in enumerate(seeds):
                for loaded in ((False, True) if i % 2 == 0 else (True, False)):
                    r = run_one(work, toml, seed, args.target, sets, load if loaded else None)
                    runs.append(r)
                    print(f"  {name} seed {seed} {'loaded' if loaded else 'idle  '}: "
                          f"to target {_fmt(r['ttt'], '.4g')} s, acc {r['final_accuracy']:.4f},"
                          f" {r['verdict']} at {r['dilation']:g}, {r['real_s']:.2f} real s",
                          flush=True)
            results["variants"][name] = {"runs": runs,
                                         "summary": report(name, runs, args.target)}
    finally:
        load.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nload: {load.describe()}; load average after: "
          f"{_loadavg()}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
