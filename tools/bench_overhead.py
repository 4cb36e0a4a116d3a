"""Overhead benchmark: fedsim against a plain single-process loop and Flower, on one task.

The task (issue 12's): FedAvg, 100 clients, 10 sampled per round, an MLP
60-200-10 on Synthetic(1,1) (the shards fedsim builds for seed 1), one local
epoch of SGD (batch 32, lr 0.05) per client, the global model evaluated on
the test split after every round, a zero-latency network, one torch thread
in every process. Contestants, each a fresh process tree launched from
here, in turn for ``--reps`` repetitions so machine noise hits all alike:

* ``plain``: one Python process, a loop over rounds and clients (the
  data saved from fedsim's builder beforehand, loaded from an ``.npz``),
  stepping ``torch.optim.SGD`` as a training loop usually does;
* ``plain-lean``: the same loop doing the same update directly
  (``p.add_(p.grad, alpha=-lr)``), as fedsim's own SGD does: it pays
  neither ``torch.optim``'s 0.8 s first-use import of ``torch._dynamo``
  nor its per-step dispatch, so fedsim's ratios to it are what fedsim
  itself adds, apart from that choice of SGD;
* ``fedsim-1host``: ``fedsim run`` with one client host (one core trains;
  the "per core used" comparison), device step time 0, dilation 1;
* ``fedsim-1host-pin``: the same with ``deploy.pin_trainers``: the
  trainer alone on one CPU, the server, host loop and evaluator on the other;
* ``fedsim``: ``fedsim run`` as shipped (one client host per core);
* ``fedsim-spawn``: the same with ``deploy.workers = "spawn"`` (every torch
  worker a fresh process that imports torch and builds the data: how
  fedsim started before the zygote);
* ``flower``: Flower's simulation (Ray), ``--flower-python`` naming the
  Python of an environment that has ``flwr[simulation]`` and torch
  (``--install-flower DIR`` creates one; fedsim does not depend on Flower),
  of a Flower Message-API app (a ``ServerApp`` with Flower's ``FedAvg`` and a
  centralized evaluation, a ``ClientApp``) whose local epoch makes
  plain-lean's update (fedsim's own SGD's), so the app and fedsim's
  ``fedavg`` train alike;
* ``fedsim-flower``: the same app under fedsim (``[algorithm] name =
  "flower"``), on the overhead scenario's network and clients;
* ``flower-serial``: the same app in one process with no transport at all:
  a minimal ``Grid`` that calls each node's ``ClientApp`` in turn, its
  message's records crossing Flower's protobuf serialization there and
  back (what both Flower's transports and fedsim's bridge do to them). It
  is what Flower's own code costs a round, on any backend, beside the
  plain-lean loop, which trains alike without it: the floor under the
  Flower rows.

Figures per contestant (median over repetitions):

* **first round**: real seconds from launching the process to the end of
  round 1 (the first aggregation: fedsim's start event's wall time plus
  the first ``aggregate`` event's real time; the loop's and Flower's own
  clock at the end of their first round);
* **s/round**: the real time from the first aggregation to the last, per
  example trained in those rounds, times the examples of an average round
  (10 clients of mean size): each contestant samples its own clients, and
  Synthetic(1,1)'s shard sizes are power-law, so raw round times differ by
  the luck of the draw;
* **PSS / RSS**: the peak, over the run, of the sum over every process of
  the tree of ``Pss`` (pages shared by several processes, e.g. after a
  fork, counted once in total) and of ``Rss`` (counted in every process),
  sampled every 50 ms from ``/proc/PID/smaps_rollup``;
* **processes**: the most processes the tree had at once;
* **CPU s** and **CPU/round**: the CPU time of the whole process tree,
  from launch to exit (``getrusage(RUSAGE_CHILDREN)``: every process of
  the tree is waited for by its parent) and between the first and the
  last aggregation, per average round as s/round is (read from
  ``/proc/PID/stat`` every 50 ms, about 0.5 % of a core, and interpolated
  at the aggregations' wall times);
* **loops' CPU per update** (fedsim): the CPU time of the event loops
  (the main thread of the server and of each client host: every process
  but the torch workers, which name themselves ``fedsim-trainer``,
  ``fedsim-evaluator``, ``fedsim-zygote``) between the first and the last
  aggregation, per update those rounds applied;
* **bytes/host/version** (fedsim): the real bytes the server sent its
  hosts (``summary.json``'s ``wire_bytes_down``; a run from before it
  existed sent every task with its model, so its charged ``bytes_down``)
  per client host per model version (aggregation).

The two times are medians over ``--reps`` runs nobody samples; memory and
processes come from one more run of each contestant, sampled: a sample of
fedsim's 5-process tree costs about 6 ms of CPU (reading ``smaps_rollup``
walks each process's page tables), 12 % of a core at that period, which
the kernel took from whatever it preempted (measured: it made a one-host
run's trainer, in the idle class, lose its CPU).

Then the ratios the issue sets: fedsim's first round over the plain loop's
(at most 1), one client host's s/round over the plain loop's (at most 1.1;
with ``deploy.pin_trainers``, and without it beside),
Flower's s/round over fedsim's, and fedsim's summed PSS (at most 0.6 GB).
Run: ``python tools/bench_overhead.py`` (about two minutes without Flower;
``--rounds``, ``--reps``, ``--json PATH``). To measure another version of
fedsim with this script (a before and after), run it with ``PYTHONPATH``
naming that checkout: every process it launches imports fedsim from there.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from proctree import CpuWatch, Sampler  # tools/proctree.py (this script's directory is on sys.path)

ROOT = Path(__file__).resolve().parent.parent

SCENARIO = """\
name = "overhead"
seed = 1
[data]
dataset = "synthetic"
num_clients = 100
[model]
name = "mlp"
hidden = [200]
[algorithm]
name = "fedavg"
fraction = 0.1
[client]
optimizer = "sgd"
lr = 0.05
batch_size = 32
local_epochs = 1
[run]
dilation = 1.0
max_rounds = {rounds}
[devices]
step_time = 0.0
"""

# The plain loop and Flower's client share this model and local epoch.
COMMON = r'''
import time, sys, json, os
import numpy as np
import torch
torch.set_num_threads(1)
D = np.load(os.environ.get("BENCH_DATA") or sys.argv[1])
NC = int(D["num_clients"])
SHARDS = [(torch.as_tensor(D[f"x{c}"]), torch.as_tensor(D[f"y{c}"])) for c in range(NC)]
TEST = (torch.as_tensor(D["test_x"]), torch.as_tensor(D["test_y"]))

def model():
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(60, 200), torch.nn.ReLU(),
                               torch.nn.Linear(200, 10))

def get(m):
    return [p.detach().numpy().copy() for p in m.parameters()]

def put(m, ws):
    with torch.no_grad():
        for p, w in zip(m.parameters(), ws):
            p.copy_(torch.as_tensor(w))

# plain-lean's loop, and the Flower app in both of its contestants (BENCH_LEAN=1): the
# update fedsim's own SGD makes, so that the Flower app and fedsim's fedavg train alike
LEAN = os.environ.get("BENCH_LEAN") == "1" or (
    os.environ.get("BENCH_DATA") is None and len(sys.argv) > 3 and sys.argv[3] == "lean")

def local_epoch(m, c, gen):
    x, y = SHARDS[c]
    order = torch.randperm(len(y), generator=gen)
    if LEAN:  # the same update, stepped directly (as fedsim's SGD does), not by torch.optim
        ps = list(m.parameters())
        for i in range(0, len(y), 32):
            b = order[i:i + 32]
            for p in ps:
                p.grad = None
            torch.nn.functional.cross_entropy(m(x[b]), y[b]).backward()
            with torch.no_grad():
                for p in ps:
                    p.add_(p.grad, alpha=-0.05)
        return len(y)
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    for i in range(0, len(y), 32):
        b = order[i:i + 32]
        opt.zero_grad()
        torch.nn.functional.cross_entropy(m(x[b]), y[b]).backward()
        opt.step()
    return len(y)

def evaluate(m):
    with torch.no_grad():
        out = m(TEST[0])
        return float((out.argmax(1) == TEST[1]).float().mean())
'''

PLAIN = COMMON + r'''
rounds = int(sys.argv[2])
rng = np.random.default_rng(1)
gen = torch.Generator().manual_seed(1)
m = model()
w = get(m)
ends, samples, clients = [], [], []
for r in range(rounds):
    picked = rng.choice(NC, 10, replace=False)
    acc_w, total, spent = None, 0, 0.0
    for c in picked:
        t = time.perf_counter()                  # a client's part: what a trainer does
        put(m, w)
        n = local_epoch(m, int(c), gen)
        ws = get(m)
        spent += time.perf_counter() - t
        acc_w = [a * n for a in ws] if acc_w is None else [a + b * n for a, b in zip(acc_w, ws)]
        total += n
    w = [a / total for a in acc_w]
    put(m, w)
    evaluate(m)
    ends.append(time.time())
    samples.append(total)
    clients.append(spent)
print(json.dumps({"ends": ends, "samples": samples, "client_s": sum(clients[1:])}))
'''

# Flower's Message API (flwr >= 1.21): the same FedAvg as a ServerApp and a ClientApp.
# Flower's simulation runs it (FLOWER), and so does fedsim (``fedsim-flower``: the
# scenario FLOWER_SCENARIO names this module), the same app in both.
FLOWER_APP = COMMON + r'''
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "10"))
ends, samples = [], []
client_app = ClientApp()


@client_app.train()
def train(msg, context):
    cid = int(context.node_config["partition-id"])
    m = model()
    put(m, msg.content["arrays"].to_numpy_ndarrays())
    n = local_epoch(m, cid, torch.Generator().manual_seed(cid))
    return Message(RecordDict({"arrays": ArrayRecord(get(m)),
                               "metrics": MetricRecord({"num-examples": n})}), reply_to=msg)


class Counting(FedAvg):
    def aggregate_train(self, server_round, replies):
        replies = list(replies)
        samples.append(sum(int(r.content["metrics"]["num-examples"])
                           for r in replies if r.has_content()))
        return super().aggregate_train(server_round, replies)


server_app = ServerApp()


@server_app.main()
def main(grid, context):
    def central(rnd, arrays):
        m = model()
        put(m, arrays.to_numpy_ndarrays())
        acc = evaluate(m)
        if rnd > 0:
            ends.append(time.time())
        return MetricRecord({"accuracy": acc})

    Counting(fraction_train=0.1, fraction_evaluate=0.0, min_train_nodes=10,
             min_available_nodes=NC).start(grid=grid, initial_arrays=ArrayRecord(get(model())),
                                           num_rounds=ROUNDS, evaluate_fn=central)
'''

FLOWER = r'''
import json, os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ["BENCH_DATA"] = os.path.abspath(sys.argv[1])
os.environ["BENCH_ROUNDS"] = sys.argv[2]
os.environ["BENCH_LEAN"] = "1"
os.environ["PYTHONPATH"] = os.pathsep.join(
    [os.path.dirname(os.path.abspath(__file__)), *filter(None, [os.environ.get("PYTHONPATH")])])
import bench_flower_app as app
from flwr.simulation import run_simulation
run_simulation(server_app=app.server_app, client_app=app.client_app, num_supernodes=app.NC,
               backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                               "init_args": {"include_dashboard": False,
                                             "num_cpus": os.cpu_count(),
                                             "log_to_driver": False}})
print(json.dumps({"ends": app.ends, "samples": app.samples}))
'''

# The same app with no transport: every message's records serialized and parsed with
# Flower's own protobuf serde (as Flower's transports and fedsim's bridge do), each
# node's ClientApp called in turn in this process: Flower's own code per round.
FLOWER_SERIAL = r'''
import json, os, sys, time, uuid
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ["BENCH_DATA"] = os.path.abspath(sys.argv[1])
os.environ["BENCH_ROUNDS"] = sys.argv[2]
os.environ["BENCH_LEAN"] = "1"
import bench_flower_app as app
from flwr.app import Context, Message, Metadata, RecordDict
from flwr.app.message import make_message
from flwr.app.user_config import UserConfig
from flwr.common.serde import recorddict_from_proto, recorddict_to_proto
from flwr.proto.recorddict_pb2 import RecordDict as ProtoRecordDict
from flwr.serverapp import Grid
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity

def to_bytes(records):
    return recorddict_to_proto(records).SerializeToString()

def of_bytes(data):
    return recorddict_from_proto(ProtoRecordDict.FromString(data))

class SerialGrid(Grid):
    def __init__(self):
        self._run = Run.create_empty(1)
        self.states = {}
    def set_run(self, run):
        self._run = run
    @property
    def run(self):
        return self._run
    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)
    def get_node_ids(self):
        return list(range(1000, 1000 + app.NC))
    def push_messages(self, messages):
        raise NotImplementedError("FedAvg calls send_and_receive")
    def pull_messages(self, message_ids):
        raise NotImplementedError("FedAvg calls send_and_receive")
    def send_and_receive(self, messages, *, timeout=None):
        replies, serialized = [], {}
        t = time.perf_counter()
        for m in messages:
            md = m.metadata
            md.__dict__["_message_id"] = str(uuid.uuid4())
            data = serialized.get(id(m.content))
            if data is None:
                data = serialized[id(m.content)] = to_bytes(m.content)
            node = md.dst_node_id
            there = make_message(metadata=Metadata(
                run_id=1, message_id=md.message_id, src_node_id=1, dst_node_id=node,
                reply_to_message_id="", group_id=md.group_id, created_at=md.created_at,
                ttl=md.ttl, message_type=md.message_type), content=of_bytes(data))
            cid = node - 1000
            ctx = Context(run_id=1, node_id=node,
                          node_config=UserConfig({"partition-id": cid, "num-partitions": app.NC}),
                          state=self.states.get(cid) or RecordDict(), run_config=UserConfig())
            TaskIdentity.node_id = node          # as a node's own process has it
            reply = app.client_app(there, ctx)
            TaskIdentity.node_id = 1
            self.states[cid] = ctx.state
            back = Message(of_bytes(to_bytes(reply.content)), reply_to=m)
            replies.append(back)
        CLIENT[0] += time.perf_counter() - t   # the nodes' part (with the records' serde)
        return replies


CLIENT = [0.0]
MARKS = []


class Marks(list):
    """The app's round ends; the nodes' time so far at each."""
    def append(self, x):
        super().append(x)
        MARKS.append(CLIENT[0])


app.ends = Marks()

TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 1
app.server_app(grid=SerialGrid(), context=Context(run_id=1, node_id=1, node_config=UserConfig(),
                                                  state=RecordDict(), run_config=UserConfig()))
print(json.dumps({"ends": list(app.ends), "samples": app.samples,
                  "client_s": MARKS[-1] - MARKS[0]}))
'''

#: the same Flower app under fedsim: the overhead scenario with ``[algorithm]`` swapped;
#: its devices are instant (``step_time = 0``), so a reply is charged no compute, as
#: fedsim's fedavg's updates are (``"steps"`` with no step metric in the replies: 0 s;
#: ``"cpu"`` would charge the handler's CPU time, which real time always exceeds at
#: dilation 1: every reply an overrun)
FLOWER_SCENARIO = """\
[algorithm]
name = "flower"
server_app = "bench_flower_app:server_app"
client_app = "bench_flower_app:client_app"
compute = "steps"
"""


#: the names fedsim's torch worker processes give themselves (everything else of
#: fedsim's tree is an event loop: the server, the client hosts)
WORKERS = ("fedsim-trainer", "fedsim-evaluator", "fedsim-zygote")


class Launched:
    """One contestant's run: its start, output, memory sampler, CPU readings, CPU total."""

    def __init__(self, t0: float, out: str, sampler: Sampler | None, cpu: CpuWatch,
                 cpu_s: float) -> None:
        self.t0, self.out, self.sampler, self.cpu, self.cpu_s = t0, out, sampler, cpu, cpu_s


def _launch(cmd: list[str], sample: bool, env: dict[str, str] | None = None) -> Launched:
    """Run ``cmd``; its process tree's CPU every 50 ms and, with ``sample``, its memory."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
    cpu = CpuWatch(proc.pid)
    cpu.start()
    sampler = Sampler(proc.pid) if sample else None
    if sampler is not None:
        sampler.start()
    out, err = proc.communicate()
    for thread in (cpu, sampler):
        if thread is not None:
            thread.stop.set()
            thread.join()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.stderr.write(err[-3000:])
        raise SystemExit(f"{cmd[:3]} exited with {proc.returncode}")
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return Launched(t0, out, sampler, cpu, cpu_s)


def _figures(run: Launched, ends: list[float], samples: list[int],
             per_round: float) -> dict[str, float]:
    """Each contestant samples its own clients, whose sizes differ a lot
    (Synthetic(1,1)'s are power-law): rounds 2..N's time (and CPU time) is
    divided by the examples they trained and scaled to an average round
    (``per_round`` examples). Memory only from a sampled run."""
    scale = per_round / sum(samples[1:]) if len(ends) > 1 else float("nan")
    cpu = run.cpu.between(ends[0], ends[-1])
    fig = {"first_round_s": ends[0] - run.t0,
           "s_per_round": (ends[-1] - ends[0]) * scale,
           "cpu_s": run.cpu_s,
           "cpu_per_round": sum(total for total, _ in cpu.values()) * scale}
    if run.sampler is not None:
        fig.update(pss_gb=run.sampler.pss / 1e9, rss_gb=run.sampler.rss / 1e9,
                   processes=run.sampler.procs)
    return fig


def save_data(path: Path) -> list[int]:
    """The scenario's shards and test split, as fedsim builds them, in one .npz;
    the shards' sizes."""
    import numpy as np

    from fedsim.actors.setup import build_data  # lazy: imports torch
    from fedsim.api import load

    sc = load(path.parent / "overhead.toml")
    fed = build_data(sc)
    arrays: dict[str, Any] = {"num_clients": np.array(len(fed.clients)),
                              "test_x": fed.test_x, "test_y": fed.test_y}
    for c, shard in enumerate(fed.clients):
        arrays[f"x{c}"], arrays[f"y{c}"] = shard.x, shard.y
    np.savez(path, **arrays)
    return [len(shard.y) for shard in fed.clients]


def run_script(python: str, script: Path, data: Path, rounds: int,
               per_round: float, *extra: str, sample: bool = False) -> dict[str, float]:
    run = _launch([python, str(script), str(data), str(rounds), *extra], sample)
    got = json.loads(run.out.strip().splitlines()[-1])
    fig = _figures(run, got["ends"], got["samples"], per_round)
    if "client_s" in got and len(got["ends"]) > 1:   # the clients' share of rounds 2..N
        fig["client_share"] = got["client_s"] / (got["ends"][-1] - got["ends"][0])
    return fig


def run_fedsim(work: Path, hosts: int, sizes: list[int], per_round: float,
               spawn: bool = False, pin: bool = False, sample: bool = False,
               scenario: str = "overhead.toml", rounds: int = 0) -> dict[str, float]:
    """``fedsim run`` of the overhead scenario (or, with ``scenario``, of the Flower
    app's: its ``rounds`` and data reach the app through the environment)."""
    out_dir = work / f"run-{hosts}-{time.monotonic_ns()}"
    fedsim = str(Path(sys.executable).with_name("fedsim"))
    cmd = [fedsim, "run", str(work / scenario), "--out", str(out_dir), "--no-plots",
           "--dilation", "1"]
    if hosts:
        cmd += ["--set", f"deploy.hosts={hosts}"]
    if spawn:
        cmd += ["--set", "deploy.workers=spawn"]
    if pin:
        cmd += ["--set", "deploy.pin_trainers=true"]
    env = None
    if rounds:
        env = {**os.environ, "BENCH_DATA": str(work / "data.npz"), "BENCH_ROUNDS": str(rounds),
               "BENCH_LEAN": "1"}
    run = _launch(cmd, sample, env)
    events = [json.loads(line) for line in (out_dir / "events.jsonl").read_text().splitlines()]
    wall0 = next(e["wall"] for e in events if e["ev"] == "start")
    aggs = sorted((e for e in events if e["ev"] == "aggregate"), key=lambda e: e["real"])
    if rounds:    # a Flower app's: an event per train reply; a round ends with its last
        by_round: dict[int, dict[str, Any]] = {}
        for e in aggs:
            last = by_round.setdefault(e["round"], {**e, "clients": []})
            last["clients"] = [*last["clients"], *e["clients"]]
            last["real"] = e["real"]
        aggs = [by_round[r] for r in sorted(by_round)]
    ends = [wall0 + e["real"] for e in aggs]
    fig = _figures(run, ends, [sum(sizes[c] for c in e["clients"]) for e in aggs], per_round)
    summary = json.loads((out_dir / "summary.json").read_text())
    # the event loops' CPU (main threads of every process but the workers) per update
    loops = sum(main for pid, (_, main) in run.cpu.between(ends[0], ends[-1]).items()
                if run.cpu.names.get(pid, ("", ""))[0] not in WORKERS)
    updates = sum(len(e["clients"]) for e in aggs[1:])
    fig["loop_cpu_ms_per_update"] = loops / updates * 1e3 if updates else float("nan")
    n_hosts = summary["fidelity"]["hosts_registered"]
    sent = summary.get("wire_bytes_down", summary.get("bytes_down", float("nan")))
    fig["bytes_per_host_version"] = sent / (n_hosts * len(aggs)) if aggs else float("nan")
    fig["startup_s"] = summary.get("startup_s") or float("nan")
    fig["verdict"] = summary["fidelity"]["verdict"]
    shutil.rmtree(out_dir, ignore_errors=True)
    return fig


def install_flower(where: Path) -> str:
    """A virtual environment with flwr[simulation] and the pinned CPU torch."""
    python = where / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(where)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", "-c",
                    str(ROOT / "constraints.txt"), "torch", "flwr[simulation]"], check=True)
    return str(python)


def draw(med: dict[str, dict[str, float]], path: Path, rounds: int, reps: int) -> None:
    """Each contestant's real seconds per round and summed PSS, as two bar charts."""
    from fedsim.results.plots import new_figure, save  # lazy: matplotlib only with --figure

    names = list(med)[::-1]
    colour = ["#c0504d" if n.startswith("flower") else "#4f81bd" if n.startswith("fedsim")
              else "#7f7f7f" for n in names]
    fig = new_figure(9.0, 0.45 * len(names) + 1.6, dpi=100, layout="constrained")
    left, right = fig.subplots(1, 2, sharey=True)
    for ax, key, scale, label, fmt in (
            (left, "s_per_round", 1e3, "real ms per round", "{:.0f} ms"),
            (right, "pss_gb", 1.0, "summed PSS, GB", "{:.2f} GB")):
        values = [med[n][key] * scale for n in names]
        ax.barh(names, values, color=colour)
        for y, v in enumerate(values):
            ax.text(v, y, " " + fmt.format(v), va="center", fontsize=8)
        ax.set_xlabel(label)
        ax.grid(axis="x", alpha=0.3)
        ax.margins(x=0.25)
    fig.suptitle(f"FedAvg, 100 clients, 10 a round, MLP on Synthetic(1,1), {rounds} rounds: "
                 f"median of {reps} runs ({os.cpu_count()} cores)", fontsize=10)
    print(f"figure: {save(fig, path)}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--flower-python", default=None,
                    help="the Python of an environment with flwr[simulation] and torch")
    ap.add_argument("--install-flower", default=None, metavar="DIR",
                    help="create that environment in DIR (minutes; ~1.4 GB) and use it")
    ap.add_argument("--json", default=None, help="write the figures here")
    ap.add_argument("--figure", default=None, metavar="PNG",
                    help="draw each contestant's time per round and memory there")
    ap.add_argument("--keep", default=None, metavar="DIR",
                    help="write the scenarios, the data and the apps to DIR and keep them (to "
                         "run or profile a contestant alone: tools/profile_breakdown.py)")
    ap.add_argument("--only", default=None,
                    help="comma-separated contestants to run (default: all)")
    args = ap.parse_args(argv)
    if args.reps < 1 or args.rounds < 2:
        ap.error(f"--reps must be >= 1 (got {args.reps}) and --rounds >= 2 (got {args.rounds}): "
                 "the time per round is read between the first and the last aggregation")
    flower = args.flower_python
    if args.install_flower:
        flower = install_flower(Path(args.install_flower))
    if flower is None and importlib.util.find_spec("flwr") is not None:
        flower = sys.executable           # fedsim[flower]'s (the test extra's) Flower
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="fedsim-bench-overhead-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        (work / "overhead.toml").write_text(SCENARIO.format(rounds=args.rounds))
        sizes = save_data(work / "data.npz")
        per_round = 10 * statistics.mean(sizes)   # examples in an average round
        (work / "plain.py").write_text(PLAIN)
        (work / "flower.py").write_text(FLOWER)
        (work / "flower_serial.py").write_text(FLOWER_SERIAL)
        (work / "bench_flower_app.py").write_text(FLOWER_APP)
        base = SCENARIO.format(rounds=args.rounds)
        head, _, rest = base.partition("[algorithm]")
        (work / "overhead-flower.toml").write_text(
            head + FLOWER_SCENARIO + rest[rest.index("[client]"):])
        runs: dict[str, list[dict[str, float]]] = {}
        memory: dict[str, dict[str, float]] = {}
        # Pass 0 measures memory, the others time: a sample of a 5-process
        # tree costs about 6 ms of CPU (smaps_rollup walks every page table),
        # 12 % of a core every 50 ms, and it holds each process's mmap lock.
        for rep in range(args.reps + 1):
            order = ["plain", "plain-lean", "fedsim-1host", "fedsim-1host-pin", "fedsim",
                     "fedsim-spawn",
                     *(["flower", "fedsim-flower", "flower-serial"] if flower else [])]
            if args.only:
                order = [n for n in order if n in args.only.split(",")]
            for name in order if rep % 2 == 0 else order[::-1]:
                sample = rep == 0
                if name in ("plain", "plain-lean"):
                    fig = run_script(sys.executable, work / "plain.py", work / "data.npz",
                                     args.rounds, per_round,
                                     *(["lean"] if name == "plain-lean" else []), sample=sample)
                elif name == "flower":
                    assert flower is not None
                    fig = run_script(flower, work / "flower.py", work / "data.npz",
                                     args.rounds, per_round, sample=sample)
                elif name == "flower-serial":
                    assert flower is not None
                    fig = run_script(flower, work / "flower_serial.py", work / "data.npz",
                                     args.rounds, per_round, sample=sample)
                elif name == "fedsim-flower":
                    fig = run_fedsim(work, 0, sizes, per_round, sample=sample,
                                     scenario="overhead-flower.toml", rounds=args.rounds)
                else:
                    fig = run_fedsim(work, 1 if name.startswith("fedsim-1host") else 0,
                                     sizes, per_round, spawn=name == "fedsim-spawn",
                                     pin=name == "fedsim-1host-pin", sample=sample)
                if sample:
                    memory[name] = fig
                    print(f"  memory {name:16s} PSS {fig['pss_gb']:.2f} GB, RSS "
                          f"{fig['rss_gb']:.2f} GB, {fig['processes']} processes", flush=True)
                    continue
                runs.setdefault(name, []).append(fig)
                print(f"  rep {rep} {name:16s} first round {fig['first_round_s']:.2f} s, "
                      f"{fig['s_per_round'] * 1e3:.1f} ms/round", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    med = {name: {**{k: statistics.median(f[k] for f in figs)
                     for k in figs[0] if isinstance(figs[0][k], float | int)},
                  **{k: memory[name][k] for k in ("pss_gb", "rss_gb", "processes")}}
           for name, figs in sorted(runs.items(), key=lambda kv: list(memory).index(kv[0]))}
    print(f"\nFedAvg, 100 clients, 10 per round, MLP 60-200-10, Synthetic(1,1), "
          f"{args.rounds} rounds; times: median of {args.reps} runs, memory: one more run, "
          f"sampled ({os.cpu_count()} cores)\n")
    print(f"{'':17s}{'first round':>13s}{'s/round':>10s}{'CPU s':>8s}{'CPU/round':>11s}"
          f"{'PSS (GB)':>10s}{'RSS (GB)':>10s}{'processes':>11s}")
    for name, m in med.items():
        print(f"{name:17s}{m['first_round_s']:>11.2f} s{m['s_per_round']:>10.4f}"
              f"{m['cpu_s']:>8.2f}{m['cpu_per_round']:>11.4f}"
              f"{m['pss_gb']:>10.2f}{m['rss_gb']:>10.2f}{m['processes']:>11.0f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": runs, "memory": memory, "median": med},
                                              indent=1))
    if args.figure:
        draw(med, Path(args.figure), args.rounds, args.reps)
    if {"plain-lean", "fedsim", "fedsim-flower", "flower-serial"} <= med.keys():
        # the floor under the Flower rows: what Flower's own code costs a round
        pl, f = med["plain-lean"], med["fedsim"]
        fs, ff = med["flower-serial"], med["fedsim-flower"]
        own = fs["cpu_per_round"] - pl["cpu_per_round"]
        extra = ff["cpu_per_round"] - f["cpu_per_round"]
        print(f"\nFlower's own code a round (flower-serial less plain-lean, CPU): "
              f"{own * 1e3:.1f} ms, {own / f['cpu_per_round']:.2f} of fedsim's fedavg round "
              f"({f['cpu_per_round'] * 1e3:.1f} ms of CPU); the Flower app under fedsim adds "
              f"{extra * 1e3:.1f} ms of CPU a round to fedavg's, {(extra - own) * 1e3:+.1f} ms"
              f"\n  beyond Flower's own (s/round: flower-serial {fs['s_per_round']:.4f}, "
              f"plain-lean {pl['s_per_round']:.4f}, fedsim {f['s_per_round']:.4f}, "
              f"fedsim-flower {ff['s_per_round']:.4f})")
        if "client_share" in fs and "client_share" in pl:
            # between rounds the ServerApp's part (its strategy, its evaluation, the
            # records of ten replies and of the next model) waits for nothing else;
            # the nodes' part spreads over the trainers (one per core at best)
            server = (fs["s_per_round"] * (1 - fs["client_share"])
                      - pl["s_per_round"] * (1 - pl["client_share"]))
            nodes = fs["s_per_round"] * fs["client_share"] - pl["s_per_round"] * pl["client_share"]
            floor = f["s_per_round"] + server + max(0.0, nodes) / (os.cpu_count() or 1)
            print(f"  Flower's part a round beyond the lean loop's: {server * 1e3:.1f} ms between "
                  f"rounds (the ServerApp's), {nodes * 1e3:.1f} ms in the nodes; with fedavg's "
                  f"round and the nodes' part over {os.cpu_count()} cores: at least "
                  f"{floor * 1e3:.1f} ms, {floor / f['s_per_round']:.2f}x fedavg's")
    if not {"plain", "plain-lean", "fedsim", "fedsim-1host", "fedsim-1host-pin",
            "fedsim-spawn"} <= med.keys():
        return 0                  # --only: the ratios need every native contestant
    p, pl = med["plain"], med["plain-lean"]
    print(f"\nevery fedsim row against the loops (torch.optim loop | lean loop), "
          f"wall and CPU time:\n{'':17s}{'first round':>17s}{'s/round':>17s}{'CPU s':>17s}"
          f"{'CPU/round':>17s}{'loops ms/update':>17s}{'KB/host/version':>17s}")
    for name, m in med.items():
        if not name.startswith("fedsim"):
            continue
        cells = [f"{m[k] / p[k]:6.2f} | {m[k] / pl[k]:5.2f}"
                 for k in ("first_round_s", "s_per_round", "cpu_s", "cpu_per_round")]
        print(f"{name:17s}" + "".join(f"{c:>17s}" for c in cells)
              + f"{m['loop_cpu_ms_per_update']:>17.3f}{m['bytes_per_host_version'] / 1e3:>17.1f}")
    f1, f = med["fedsim-1host"], med["fedsim"]
    print("\nratios (the issue's targets in brackets):")
    print(f"  fedsim first round / plain loop's     {f['first_round_s'] / p['first_round_s']:.2f}"
          "  [<= 1]")
    fp = med["fedsim-1host-pin"]
    print(f"  fedsim-1host-pin s/round / plain loop's  {fp['s_per_round'] / p['s_per_round']:.2f}"
          "  [<= 1.1]  (one client host, its trainer on a CPU of its own)")
    print(f"  fedsim-1host s/round / plain loop's   {f1['s_per_round'] / p['s_per_round']:.2f}"
          "  (the kernel's placement: the trainer in the idle class, preempted by the loops)")
    print(f"  the same two against the lean loop     {f['first_round_s'] / pl['first_round_s']:.2f}"
          f", {f1['s_per_round'] / pl['s_per_round']:.2f}  (what fedsim adds beside its SGD)")
    print(f"  fedsim summed PSS                     {f['pss_gb']:.2f} GB  [<= 0.6]")
    sp = med["fedsim-spawn"]
    print(f"  start-up (launch to t = 0): forked workers {f['startup_s']:.2f} s, spawned "
          f"{sp['startup_s']:.2f} s; summed PSS {f['pss_gb']:.2f} / {sp['pss_gb']:.2f} GB")
    if "fedsim-flower" in med:
        ff = med["fedsim-flower"]
        print(f"  the Flower app under fedsim / fedsim's fedavg: first round "
              f"{ff['first_round_s'] / f['first_round_s']:.2f}, s/round "
              f"{ff['s_per_round'] / f['s_per_round']:.2f}  [s/round <= 1.2]")
    if "flower" in med:
        fl = med["flower"]
        print(f"  Flower s/round / fedsim's             {fl['s_per_round'] / f['s_per_round']:.2f}"
              "  [several]")
        print(f"  Flower first round / fedsim's         "
              f"{fl['first_round_s'] / f['first_round_s']:.2f}")
    for names in (("fedsim", "fedsim-1host", "fedsim-1host-pin"), ("fedsim-flower",)):
        verdicts = sorted({str(fig.get("verdict")) for n in names for fig in runs.get(n, [])})
        if verdicts:
            print(f"  {names[0]} fidelity verdicts at dilation 1: {', '.join(verdicts)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
