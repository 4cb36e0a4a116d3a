"""Small run directories written by tests, without running a federation.

:func:`make_run` writes what ``fedsim run`` leaves behind (the version file,
``events.jsonl`` in a writer's append order, ``metrics.csv``,
``summary.json``, ``scenario.json``) for a few clients that download a task,
train, upload and are aggregated, asynchronously (with staleness) or in
rounds (with a barrier).
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

from fedsim.results.writer import METRIC_FIELDS, write_run_format


def make_run(path: Path, *, algorithm: str = "fedasync", clients: int = 4,
             duration: float = 3.0, rounds: bool = False, target: float | None = 0.6,
             speed: float = 1.0, accuracy_cap: float = 0.9, fmt: int | None = 2,
             status: str = "completed", data: dict[str, Any] | None = None,
             model: dict[str, Any] | None = None) -> Path:
    """Write a run directory at ``path``; return it.

    ``speed`` scales how fast accuracy rises with emulated time; with
    ``fmt`` None no version file is written and deliveries name the message
    by its class (format 1). ``data`` and ``model`` replace keys of the
    scenario's tables (Synthetic(1,1) over ``clients`` clients, an MLP).
    """
    path.mkdir(parents=True, exist_ok=True)
    if fmt is not None:
        write_run_format(path, "test")
    events: list[dict[str, Any]] = [{"t": 0.0, "real": 0.0, "ev": "start", "clients": clients}]
    host_batch: list[dict[str, Any]] = []
    version, updates, n_rounds = 0, 0, 0
    stale: list[int] = []
    t = 0.0
    step = 0.4
    while t + step <= duration:
        arrivals = []
        for c in range(clients):
            sent = round(t + 0.01 * c, 6)
            got, done = round(sent + 0.1, 6), round(sent + 0.1 + 0.05 * (c + 1), 6)
            arrive = round(done + 0.1, 6)
            events.append({"t": sent, "real": sent, "ev": "send", "client": c, "kind": "task",
                           "dir": "down", "bytes": 1000, "sent_at": sent})
            host_batch += [
                {"t": got, "real": got, "ev": "deliver", "client": c,
                 "kind": "task" if fmt else "Task", "dir": "down", "sent_at": sent,
                 "host": "host-0"},
                {"t": got, "real": got, "ev": "train_start", "client": c, "task_id": c,
                 "host": "host-0"},
                {"t": done, "real": done, "ev": "train_end", "client": c, "task_id": c,
                 "host": "host-0"},
                {"t": done, "real": done, "ev": "send", "client": c, "kind": "update",
                 "dir": "up", "sent_at": done, "host": "host-0"}]
            arrivals.append((arrive, c))
        for arrive, c in sorted(arrivals):
            events.append({"t": arrive, "real": arrive, "ev": "deliver", "client": c,
                           "kind": "update" if fmt else "Update", "dir": "up", "sent_at":
                           arrive - 0.1})
            if not rounds:
                version += 1
                updates += 1
                stale.append(c)
                events.append({"t": arrive, "real": arrive, "ev": "aggregate",
                               "version": version, "clients": [c], "staleness": c})
        if rounds:
            version += 1
            n_rounds += 1
            updates += clients
            last = max(a for a, _ in arrivals)
            events.append({"t": last, "real": last, "ev": "aggregate", "version": version,
                           "round": n_rounds, "clients": list(range(clients))})
        t = round(max(a for a, _ in arrivals), 6)
        events += host_batch  # a host's batch reaches the log after the server's records
        host_batch = []
    events.append({"t": duration, "real": duration, "ev": "end", "status": "time_budget"})
    with open(path / "events.jsonl", "w") as fh:
        for e in events:
            fh.write(json.dumps(e) + "\n")
    rows = []
    for i in range(7):
        te = duration * i / 6
        acc = accuracy_cap * (1 - math.exp(-speed * te))
        rows.append({"t": te, "real": te * 2, "version": i, "round": i if rounds else 0,
                     "updates": i * clients, "accuracy": round(acc, 4),
                     "loss": round(2.3 * math.exp(-speed * te) + 0.2, 4),
                     "staleness_mean": "", "bytes_up": i * 4000, "bytes_down": i * 4100})
    with open(path / "metrics.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=METRIC_FIELDS)
        w.writeheader()
        w.writerows(rows)
    accs = [r["accuracy"] for r in rows]
    hit = next((r["t"] for r in rows if target is not None and r["accuracy"] >= target), None)
    summary = {
        "format": fmt, "status": status, "stop_reason": "time_budget", "algorithm": algorithm,
        "clients": clients, "updates": updates, "rounds": n_rounds,
        "emulated_seconds": duration, "final_accuracy": accs[-1], "best_accuracy": max(accs),
        "target_accuracy": target, "time_to_target_s": hit,
        "bytes_up": rows[-1]["bytes_up"], "bytes_down": rows[-1]["bytes_down"],
        "staleness": ({"mean": sum(stale) / len(stale), "p50": 1.0, "p99": clients - 1.0,
                       "max": clients - 1, "count": len(stale)} if stale else
                      {"mean": None, "p50": None, "p99": None, "max": None, "count": 0}),
        "fidelity": {"verdict": "pass"},
    }
    if fmt is None:
        del summary["format"]
    (path / "summary.json").write_text(json.dumps(summary))
    scenario = {"name": path.name, "algorithm": {"name": algorithm},
                "data": {"dataset": "synthetic", "num_clients": clients, "partition": "natural",
                         "synthetic_alpha": 1.0, "synthetic_beta": 1.0,
                         "dirichlet_alpha": 0.5, **(data or {})},
                "model": {"name": "mlp", "hidden": [200], "lstm_hidden": 256, **(model or {})}}
    (path / "scenario.json").write_text(json.dumps(scenario))
    return path
