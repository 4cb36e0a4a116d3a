"""The server loop's timers beside a Flower ServerApp: lateness with and without one.

A Flower app's ServerApp is blocking Python run in a process of its own
(docs/flower.md): its strategy's work (serializing each round's content,
aggregating the replies, Flower's bookkeeping) holds no GIL of the server's;
what the server process still does for it is to file its messages and hand
each reply's bytes to it over a socket. This runs the same federation,
FedAvg with every client every round over a wired LAN, as fedsim's own
``fedavg`` (the strategy on the loop, in microseconds) and as a Flower app
doing the same (Flower's ``FedAvg`` in the ServerApp's process), at two
model sizes, and prints each run's delivery lateness: how late netem
delivered messages against their emulated schedule (p50, p99, max over
every delivery of the run, ``summary.json``'s ``fidelity.lateness_ms``),
with the run's verdict; then each direction's realised delay against its
configured one: the uplink's deliveries are the server loop's timers, the
downlink's the client hosts'. The runs alternate, so machine noise hits
both alike.

* ``small``: the overhead benchmark's MLP (60-200-10, 57 KB);
* ``large``: the same MLP with 35,000 hidden units (2.5 M parameters, 10 MB
  a message): 10 MB of content into the ServerApp's process and 80 MB of
  replies out of the server's, every round.

Run: ``python tools/bench_flower_loop.py`` (about 3 minutes; ``--reps``,
``--rounds``, ``--sizes small,large``, ``--dilation``). Needs the Flower extra.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

SIZES = {"small": 200, "large": 35_000}

SCENARIO = """\
name = "flower-loop-{kind}-{size}"
seed = 1
[data]
dataset = "synthetic"
num_clients = {clients}
[model]
name = "mlp"
hidden = [{hidden}]
{algorithm}
[run]
time_budget = 600.0
dilation = {dilation}
[eval]
every_seconds = 1000.0
[network]
profile = "lan"
[devices]
step_time = 0.01
"""

NATIVE = """\
[algorithm]
name = "fedavg"
fraction = 1.0
[client]
optimizer = "sgd"
lr = 0.05
batch_size = 32
local_steps = 1
"""
NATIVE_ROUNDS = "max_rounds = {rounds}"

FLOWER = """\
[algorithm]
name = "flower"
server_app = "loop_app:server_app"
client_app = "loop_app:client_app"
compute = "steps"
[algorithm.run_config]
rounds = {rounds}
hidden = {hidden}
"""

APP = '''
"""FedAvg with every client every round: one SGD step of batch 32 per client."""
import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from fedsim.flower import partition


def net(hidden: int) -> torch.nn.Module:
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(60, hidden), torch.nn.ReLU(),
                               torch.nn.Linear(hidden, 10))


client_app = ClientApp()


@client_app.train()
def train(msg: Message, context: Context) -> Message:
    x, y = partition(context)
    m = net(int(context.run_config["hidden"]))
    m.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    torch.nn.functional.cross_entropy(m(x[:32]), y[:32]).backward()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(p.grad, alpha=-0.05)
    return Message(RecordDict({"arrays": ArrayRecord(m.state_dict()),
                               "metrics": MetricRecord({"num-examples": len(y),
                                                        "num-steps": 1})}), reply_to=msg)


server_app = ServerApp()


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    n = len(list(grid.get_node_ids()))
    FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=n,
           min_available_nodes=n).start(
        grid=grid, initial_arrays=ArrayRecord(net(int(context.run_config["hidden"])).state_dict()),
        num_rounds=int(context.run_config["rounds"]))
'''


def run_one(work: Path, kind: str, size: str, args: argparse.Namespace) -> dict[str, float]:
    hidden = SIZES[size]
    if kind == "fedsim":
        algorithm = NATIVE
        body = SCENARIO.format(kind=kind, size=size, clients=args.clients, hidden=hidden,
                               algorithm=algorithm, dilation=args.dilation)
        body = body.replace("time_budget = 600.0",
                            "time_budget = 600.0\n" + NATIVE_ROUNDS.format(rounds=args.rounds))
    else:
        algorithm = FLOWER.format(rounds=args.rounds, hidden=hidden)
        body = SCENARIO.format(kind=kind, size=size, clients=args.clients, hidden=hidden,
                               algorithm=algorithm, dilation=args.dilation)
    path = work / f"{kind}-{size}.toml"
    path.write_text(body)
    out = work / f"run-{kind}-{size}-{len(list(work.glob('run-*')))}"
    fedsim = str(Path(sys.executable).with_name("fedsim"))
    done = subprocess.run([fedsim, "run", str(path), "--out", str(out), "--no-plots",
                           "--no-progress"], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{kind} {size}: fedsim run failed:\n{done.stderr[-2000:]}")
    s = json.loads((out / "summary.json").read_text())
    lat = s["fidelity"]["lateness_ms"]
    out = {"p50": lat["p50"], "p99": lat["p99"], "max": lat["max"], "n": lat["n"],
           "allowed": lat["allowed_p99"], "pass": s["fidelity"]["verdict"] == "pass",
           "rounds": s["rounds"], "real_s": s["real_seconds"]}
    # each direction's realised delay against its configured one (ms): the uplink's
    # deliveries are the server loop's timers, the downlink's the client hosts'
    for kind, link in s["fidelity"]["links"].items():
        side = kind.rsplit("/", 1)[-1]
        out[f"{side}_excess"] = (link["delay_mean"] - link["configured_mean"]) * 1e3
        out[f"{side}_std"] = link["delay_std"] * 1e3
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--dilation", type=float, default=2.0)
    ap.add_argument("--sizes", default="small,large")
    args = ap.parse_args(argv)
    sizes = [s.strip() for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory(prefix="fedsim-flower-loop-") as tmp:
        work = Path(tmp)
        (work / "loop_app.py").write_text(APP)
        os.environ["PYTHONPATH"] = os.pathsep.join(
            [str(work), *filter(None, [os.environ.get("PYTHONPATH")])])
        got: dict[tuple[str, str], list[dict[str, float]]] = {}
        for rep in range(args.reps):
            for size in sizes:
                kinds = ["fedsim", "flower"] if rep % 2 == 0 else ["flower", "fedsim"]
                for kind in kinds:
                    r = run_one(work, kind, size, args)
                    got.setdefault((kind, size), []).append(r)
                    print(f"  rep {rep + 1} {size:5s} {kind:6s} lateness p50 {r['p50']:.3f} "
                          f"p99 {r['p99']:.3f} max {r['max']:.2f} ms over {r['n']:.0f} "
                          f"deliveries; {'pass' if r['pass'] else 'FAIL'} "
                          f"({r['rounds']:.0f} rounds, {r['real_s']:.1f} real s)", flush=True)
    print(f"\nlateness of netem's deliveries, ms (median over {args.reps} runs; "
          f"dilation {args.dilation}, {args.clients} clients, LAN):")
    print(f"{'':14s}{'p50':>9s}{'p99':>9s}{'max':>9s}{'allowed p99':>13s}  verdicts")
    for (kind, size), rs in sorted(got.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        med = {k: statistics.median(r[k] for r in rs) for k in ("p50", "p99", "max", "allowed")}
        passes = sum(bool(r["pass"]) for r in rs)
        print(f"{size + ' ' + kind:14s}{med['p50']:9.3f}{med['p99']:9.3f}{med['max']:9.2f}"
              f"{med['allowed']:13.2f}  {passes}/{len(rs)} pass")
    print("\nper direction, realised delay minus the configured mean, and its std (ms, "
          "median over runs;\nthe link's own std is 0.05): up = the server loop's timers, "
          "down = the client hosts'")
    print(f"{'':14s}{'up excess':>11s}{'up std':>9s}{'down excess':>13s}{'down std':>10s}")
    for (kind, size), rs in sorted(got.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        med = {k: statistics.median(r[k] for r in rs)
               for k in ("up_excess", "up_std", "down_excess", "down_std")}
        print(f"{size + ' ' + kind:14s}{med['up_excess']:11.3f}{med['up_std']:9.3f}"
              f"{med['down_excess']:13.3f}{med['down_std']:10.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
