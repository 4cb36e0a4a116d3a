"""Regenerate the claims table: each seed paper's claim, reproduced through real timing.

For every claim this runs its sweep (scenarios/repro/<id>.sweep.toml; one
real run per variant, grid point and seed, through ``fedsim sweep``),
computes fedsim's number with its 95 % confidence interval from the runs
whose fidelity verdict passed, sets it beside the number the paper
reports, and gives a verdict with the reason. It writes

- docs/claims.md: the table and, per claim, the setting, the figure, the
  numbers, the verdict and why, and the command that regenerates it;
- docs/claims/<id>.png: the figure;
- README.md: the table, between the ``claims-table`` markers;

stamped with the date and the commit measured. Nothing here is tuned to
agree: a claim fedsim does not reproduce is reported as such, with why.

    python tools/claims.py                   # every claim, its sweep after the last one's
    python tools/claims.py --only DG-1,FA-1  # some; the others keep their last result
    python tools/claims.py --no-run          # re-evaluate the sweeps already on disk
    python tools/claims.py --by-paper        # each paper's sweeps in one pool of runs
    python tools/claims.py --one-pool        # every sweep of every paper in one pool

Claim by claim. Each claim's sweep runs alone (fedsim.sweep.run_sweep: its
own scheduler finds how many of its runs may go at once) and its claim is
recorded as soon as it ends: 127 minutes for the table on 2026-11-30 (171 on
2026-11-29). Pools of several sweeps (fedsim.sweep.run_sweeps, packed by
each run's cores in the last regeneration, docs/claims/times.json) were
meant to fill the cores one sweep leaves idle, and failed every time they were measured: four
pools of every claim's sweeps, or all but AsyncFedED's, on 2026-11-29
(``--one-pool``; the last one: after 18 minutes,
with 7 runs at once, AF-1's first 300 s runs failed at dilation 1.5 beside
FedAsync's light ones, on course for 400 minutes), and a pool of
AsyncFedED's sweeps alone (``--by-paper``, its paper first: 8 runs at once
within 9 minutes, AF-1's and AF-1a's runs failed beside each other and went
to 2x and 4x their dilation). A run's mean cores do not say how many such
runs share 2 cores faithfully: AsyncFedED's 300 s runs pass two at once at
0.3-0.5 cores each, and fail three or more at once by lateness and compute
overruns. ``--by-paper`` orders the papers by their claims' last time,
longest first, and records each paper's claims as its pool ends.

Sweeps go to sweeps/claims/<sweep file's name>/ and resume: an interrupted
regeneration picks up where it stopped, and a claim that also reads another
claim's runs (AF-1a reads AF-1's at P = 0.9) does not run them again.

Where things live. This file keeps the claims (:data:`CLAIMS`: each one's
paper, statement, the paper's number, its sweep and its evaluator) and the
command line; the machinery is in tools/claimslib/: the verdict rule (how
a claim's checks become **reproduced**, **partly**, **not reproduced** or
**inconclusive**) in verdict.py, reading runs in runs.py, figures in
charts.py, the evaluators by paper (fedasync.py, deltasgd.py, dga.py,
asyncfeded.py, fedspeed.py) and the record and the docs in writer.py.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# fedsim from this checkout, and claimslib beside this file (also when it is loaded by path)
sys.path[:0] = [str(ROOT), str(ROOT / "tools")]

from claimslib.asyncfeded import eval_af1, eval_af1_authors, eval_af2  # noqa: E402
from claimslib.deltasgd import eval_ds1, eval_ds2  # noqa: E402
from claimslib.dga import eval_dg1, eval_dg2  # noqa: E402
from claimslib.fedasync import eval_fa1, eval_fa2  # noqa: E402
from claimslib.fedspeed import eval_fs1, eval_fs2  # noqa: E402
from claimslib.writer import (  # noqa: E402
    STATE,
    Claim,
    pending,
    run_claim,
    run_together,
    write_docs,
    write_readme,
)

#: The share of the cores the pool's runs may keep busy on average, packed by each
#: run's load measured in the last regeneration (docs/claims/times.json). The runs'
#: CPU work is fixed (about 134 core-minutes, estimated from the sweep files' measured
#: costs; the dilation spreads it, never shrinks it), so half of 2 cores (a sweep's
#: default) cannot fit
#: 150 minutes: on 2026-11-29 two AsyncFedED runs of 0.48 cores each filled it and
#: held the pool at 2 at once; at 0.75 three went at once (1.44 cores) and all
#: three failed their verdicts (lateness p99 3.3-3.8 ms against 2.5, 4 % compute
#: overruns). Runs that crowd each other go again and shrink the share.
POOL_HEADROOM = 0.6
#: The most the pool may multiply every run's dilation by to run more of them at
#: once (a sweep's own default, 4). Neither end fits 150 minutes, measured on
#: 2026-11-29: at 4, the pool went to 2x after AF-1a's runs at dilation 1.0
#: failed beside others, then to 4x after one of AF-1's 0.08-core runs failed by
#: 0.28 ms of p99 lateness with the machine at a load average of 0.45-0.83, and
#: every later run, whatever its sweep, took 2-4x its real time (61 of 317
#: points in 76 minutes); at 1 (`--max-scale 1`), FA-1's runs at their own
#: dilation 1.0 failed two at once (0.27 cores each), the pool fell to one run
#: at a time and stayed there at a load average of 0.2 (44 of FA-1's, FA-2's,
#: DS', DG's and FS' 275 points in 18 minutes, most of them FA-1's 8-27 s runs).
#: What both say: the multiple belongs to the sweep whose runs crowd each other,
#: not to every run of the pool, as it now does (fedsim.sweep.run_sweeps).
POOL_MAX_SCALE = 4.0

CLAIMS: list[Claim] = [
    Claim("FA-1", "FedAsync (Xie, Koyejo and Gupta, arXiv:1903.03934)",
          "An adaptive mixing weight (Poly, Hinge) is more stable than a constant one at high "
          "staleness, most of all with a large alpha",
          "Figs. 2-4 (figures only): at staleness up to 16, \"when alpha is too large, the "
          "convergence can be unstable, especially for FedAsync+Const\"; adaptive alpha "
          "\"always improves the performance\"",
          "fa1.sweep.toml", None, eval_fa1,
          ("Synthetic(1,1) with an MLP instead of CIFAR-10 with the paper's CNN: no "
           "dataset can be downloaded here, and the CNN's 4.5 M parameters x 17 tasks in "
           "flight exceed 2 cores. Clients of the paper's size (500 samples each), lr 0.1 "
           "and batch 50 as the paper.",
           "20 clients instead of 100: with 100 users of their own Synthetic(1,1) models a "
           "run with 5 tasks in flight needed about 800 updates to reach 0.7 (measured in "
           "process, seed 1), single-thread SGD about 5 emulated minutes, beyond the "
           "claims' time budget.",
           "The staleness is not drawn from Uniform{0..4} or {0..16}: it emerges from 5 or 17 "
           "tasks in flight (fedsim never samples it), which gives about 4 and 16.")),
    Claim("FA-2", "FedAsync (Xie, Koyejo and Gupta, arXiv:1903.03934)",
          "Per gradient applied, FedAsync converges between single-thread SGD and FedAvg, "
          "closer to FedAvg as staleness grows",
          "Sec. 5.4 (figures only): \"the convergence rate of FedAsync is between "
          "single-thread SGD and FedAvg\"; larger staleness brings it closer to FedAvg",
          "fa2.sweep.toml", None, eval_fa2,
          ("FA-1's task (Synthetic(1,1), 20 clients of 500 samples each, an MLP) "
           "instead of CIFAR-10 on 100 devices with a CNN, for the same reasons; FedAvg "
           "takes 10 % of the clients a round as the paper (2 of 20, the paper's 10 of "
           "100).",
           "Staleness from 2, 5 and 17 tasks in flight, not drawn.")),
    Claim("DS-1", "Delta-SGD (Kim et al., ICLR 2024)",
          "Delta-SGD needs no step-size tuning: with the others' step sizes tuned on one task, "
          "its largest gap to the best optimizer across tasks is the smallest",
          "Table 1: over 15 dataset and heterogeneity settings Delta-SGD's largest gap to the "
          "best is 2.3 points; SGD's 19.9, SGDM's 19.6, Adam's 19.6",
          "ds1.sweep.toml", None, eval_ds1,
          ("Synthetic(1,1) (100 clients of the paper's 500 samples each; the generator's "
           "own sizes are lognormal) and digits with an MLP and a CNN instead of MNIST to "
           "CIFAR-100 "
           "with ResNets: no dataset can be downloaded here.",
           "On digits (1,437 training samples) 20 clients of about 72 samples: 500 per "
           "client would leave 2 clients; 10 % of the clients a round and batch 64 as the "
           "paper.",
           "Three tasks, not fifteen; 100 rounds.")),
    Claim("DS-2", "Delta-SGD (Kim et al., ICLR 2024)",
          "Delta-SGD's delta barely matters, while each client's step size follows its own "
          "local smoothness",
          "Fig. 4 (appendix B.1, figure only): delta in {0.01, 0.1, 1} has \"very little "
          "impact on the final accuracy\"",
          "ds2.sweep.toml", None, eval_ds2,
          ("DS-1's task 1 (Synthetic(1,1), 100 clients of 500 samples each, an MLP) "
           "instead of the paper's image tasks; 100 rounds.",)),
    Claim("DG-1", "DGA (Zhu et al., NeurIPS 2021)",
          "Delayed averaging hides latency: the speedup over FedAvg approaches (K + D)/K",
          "Table 2, at 1 s latency over FedAvg K = 5: 3.16x (CIFAR-10), 2.55x (ImageNet), "
          "4.07x (Shakespeare); 5x ideal for K = 5, D = 20 (eq. 1); Fig. 4a: FedAvg's time "
          "grows linearly with latency, DGA's stays flat until latency exceeds D steps",
          "dg1.sweep.toml", None, eval_dg1,
          ("Digits over 8 clients with an MLP instead of CIFAR-10, ImageNet and "
           "Shakespeare: the claim is about time, and an emulated 40 ms step (tau_g) "
           "stands in for the paper's GPU step.",
           "20 rounds per run (the paper trains to convergence): the time per step is "
           "measured in steady state.",
           "Two seeds (in a three-seed run every seed's time per step agreed to 0.01 s: the "
           "timing is set by the grid) and FedAvg with K = 5 only, as the paper's Fig. 4a "
           "(earlier tables also drew K = 10 and 20, which no check read), to fit the "
           "claims' 2.5 hours.")),
    Claim("DG-2", "DGA (Zhu et al., NeurIPS 2021)",
          "DGA's correction term matters, and more so as the delay D grows",
          "Table 1 (CIFAR-10, K = 5), with minus without correction: 0.5 points at D = 5, "
          "2.4 at D = 10, 3.5 at D = 15, 4.5 at D = 20",
          "dg2.sweep.toml", "final_accuracy", eval_dg2,
          ("Digits with two classes per client over 8 clients and an MLP, 80 rounds, instead "
           "of CIFAR-10 with MobileNetV2 on 64 workers for 200 epochs.",
           "lr 0.1 (the paper's scaling rule, 0.0125 per worker, at 8 workers), momentum "
           "0.9, batch 64 as the paper, but constant: fedsim has no warm-up or cosine "
           "schedule.",
           "c_beta = 1 instead of the printed factor (1 - beta^D) / (1 - beta), which "
           "over-corrects with momentum (docs/algorithms.md, R-DG3).",
           "D = 5, 10, 20 (the paper: also 15).",
           "The paper does not define \"without correction\" (R-DG4): both readings run; "
           "the plain-SGD ablation keeps lr 0.1, so its effective step is 10x smaller than "
           "momentum's.")),
    Claim("AF-1", "AsyncFedED (Wang et al., arXiv:2205.13797)",
          "AsyncFedED's accuracy holds as clients are suspended more often, while FedAsync's "
          "degrades at large P",
          "Fig. 3 (figure only): AsyncFedED \"quite stable when P increases\", FedAsync+Const "
          "and +Hinge \"decline drastically\"; the authors' raw logs (Synthetic-1-1, 300 s): "
          "AsyncFedED 99.3 % max accuracy at P = 0, 98.2 % at P = 0.9; FedAsync+Const 98.4 % "
          "and 34.7 %",
          "af1.sweep.toml", None, eval_af1,
          ("Each local step takes 20 ms of emulated compute (log-normal across clients), "
           "so a pass takes about 4x the authors' logged pass times: at their times a 300 s "
           "run at P = 0 needs more than 2 cores (AF-1a runs P = 0.9 at their times).",
           "Client sizes capped at 3,000 samples: the generator's power law gives seed 3 "
           "one client of 42,074 (a 840x spread of run times, where the authors' logs "
           "show about 60x).",
           "P = 0 and 0.9 only (the paper: 0 to 0.9 in steps of 0.1), to fit the claims' "
           "time budget.")),
    Claim("AF-1a", "AsyncFedED (Wang et al., arXiv:2205.13797)",
          "AF-1 as the authors ran it, at P = 0.9: FedAsync+Const collapses while AsyncFedED "
          "holds",
          "the authors' raw logs (Synthetic-1-1, all 10 clients training, K = 10, 300 s, "
          "P = 0.9): AsyncFedED 98.2 % max accuracy, FedAsync+Const 34.7 %",
          "af1a.sweep.toml", None, eval_af1_authors,
          ("Client sizes capped at 3,000 samples (the spread of the logs' run times).",),
          also=("af1.sweep.toml",)),
    Claim("AF-2", "AsyncFedED (Wang et al., arXiv:2205.13797)",
          "Adaptive K converges faster and more smoothly than a constant K, giving fast "
          "clients more local work",
          "Fig. 4 (figure only): adaptive K (from 10) \"converges faster and smoother\" than "
          "K = 5, 10, 15, 20",
          "af2.sweep.toml", None, eval_af2,
          ("AF-1's device speeds (about 4x the authors' logged pass times) and client "
           "sizes (capped at 3,000 samples).",
           "A constant K of 10 passes only, adaptive K's starting point (the paper: K = 5, "
           "10, 15 and 20): each 300 s run at P = 0.1 keeps ten clients computing nearly all "
           "the time (0.4 cores for 450 real s at dilation 1.5), and more of them would not "
           "fit the claims' 2.5 hours on 2 cores.")),
    Claim("FS-1", "FedSpeed (Sun et al., ICLR 2023)",
          "FedSpeed's accuracy stays put as the local interval E grows with T x E fixed, "
          "while FedAvg-style methods lose accuracy",
          "Fig. 2 (CIFAR-10, E from 1 to 20, T x E = 2500): FedAdam loses about 13.7 points, "
          "FedCM 10.6, FedSpeed \"swing[s] within 3.8 %\"",
          "fs1.sweep.toml", None, eval_fs1,
          ("Digits (1,437 training samples) over 20 clients of about 72 samples with "
           "Dirichlet(0.6) and an MLP instead of CIFAR-10 over 100 clients of 500 with "
           "ResNet-18: no download here; 10 % of the clients a round as the paper.",
           "E = 1, 5, 20 with T x E = 100 (the paper: E up to 20 with T x E = 2500); FedCM "
           "is not implemented.",
           "A constant local lr (the paper decays it by 0.9995 a round for FedSpeed, 0.998 "
           "for the others); the round's clients are a fixed-size sample (the authors' "
           "code draws each client with probability 0.1).")),
    Claim("FS-2", "FedSpeed (Sun et al., ICLR 2023)",
          "Each of FedSpeed's modules helps: all three beat either single addition to the "
          "prox term, which beats the prox term alone",
          "Table 7 (CIFAR-10, 500 rounds): FedAvg 81.92 %, prox 82.24, prox + correction "
          "83.94, prox + perturbation 83.88, all three 85.70",
          "fs2.sweep.toml", None, eval_fs2,
          ("FS-1's task (digits, 20 clients of about 72 samples, an MLP), 100 rounds "
           "instead of 500, and FS-1's constant lr and fixed-size sample.",)),
]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", help="comma-separated claim ids (default: all)")
    ap.add_argument("--out", type=Path, default=ROOT / "sweeps" / "claims",
                    help="where the sweeps run (they resume)")
    ap.add_argument("--jobs", default="auto", help="runs at once: N or auto")
    ap.add_argument("--no-run", action="store_true", help="evaluate the sweeps on disk")
    how = ap.add_mutually_exclusive_group()
    how.add_argument("--one-by-one", action="store_true",
                     help="run each claim's sweep after the last (the default)")
    how.add_argument("--by-paper", action="store_true",
                     help="each paper's sweeps in one pool of runs, paper after paper, "
                          "the longest first")
    how.add_argument("--one-pool", action="store_true",
                     help="every claim's sweeps in a single pool of runs")
    ap.add_argument("--hints", type=Path, default=None, metavar="DIR",
                    help="an earlier regeneration's --out: its runs' real times order "
                         "the pool of runs, longest first (default: those the last "
                         "regeneration kept in docs/claims/times.json)")
    ap.add_argument("--headroom", type=float, default=POOL_HEADROOM,
                    help="the share of the cores the pool's runs may keep busy on average "
                         f"(default {POOL_HEADROOM}; a sweep's own default is 0.5)")
    ap.add_argument("--max-scale", type=float, default=POOL_MAX_SCALE,
                    help="the most the pool may multiply the runs' dilation by to run more at "
                         f"once (default {POOL_MAX_SCALE:g}; 1: never)")
    ap.add_argument("--pending-only", action="store_true",
                    help="run nothing: rewrite the docs from what is recorded")
    args = ap.parse_args(argv)
    args.together = args.by_paper or args.one_pool
    known = {c.id: c for c in CLAIMS}
    wanted = [s.strip() for s in args.only.split(",")] if args.only else list(known)
    unknown = [w for w in wanted if w not in known]
    if unknown:
        print(f"error: unknown claim {unknown[0]} (known: {', '.join(known)})", file=sys.stderr)
        return 2
    old = {r["id"]: r for r in json.loads(STATE.read_text())
           if r.get("verdict") != "pending"} if STATE.exists() else {}
    if args.pending_only:
        wanted = []
    def record() -> None:
        records = [old.get(c.id) or pending(c) for c in CLAIMS]
        STATE.parent.mkdir(parents=True, exist_ok=True)
        STATE.write_text(json.dumps(records, indent=2) + "\n")
        write_docs(records)
        write_readme(records)

    def evaluate(cid: str) -> None:
        print(f"{cid}: {known[cid].claim}", flush=True)
        rec = run_claim(known[cid], args.out, args.jobs, not args.no_run and not args.together)
        if args.no_run and cid in old:      # re-evaluated: when and at what it was measured
            for k in ("real_seconds", "measured", "commit"):
                rec[k] = old[cid][k]
            rec["resumed"] = old[cid].get("resumed", False)
            for k in ("table_seconds", "table_pools"):
                if old[cid].get(k):
                    rec[k] = old[cid][k]
        old[cid] = rec
        print(f"{cid}: {rec['number']} -> {rec['verdict']} ({rec['real_seconds'] / 60:.1f} min)",
              flush=True)
        record()    # an interrupted regeneration keeps every claim it finished

    pooled = args.together and not args.no_run
    # one pool (or none: claim by claim), or one per paper
    pools = ([wanted] if not pooled or args.one_pool
             else by_paper([c for c in CLAIMS if c.id in wanted], old))
    t0 = time.monotonic()
    table_seconds, resumed = 0.0, False
    done: list[str] = []
    for pool in pools:
        if pooled:
            what = "every sweep" if len(pools) == 1 else "its sweeps"
            print(f"{', '.join(pool)}: {what} in one pool", flush=True)
            took, again = run_together([known[c] for c in pool], args.out, args.jobs,
                                       args.hints, args.headroom, args.max_scale)
            resumed = resumed or again
            print(f"{', '.join(pool)}: their sweeps ran in {took / 60:.1f} min", flush=True)
        for cid in pool:
            evaluate(cid)
            done.append(cid)
    if pooled and done:       # each claim's runs' time; the whole table's beside it
        table_seconds = time.monotonic() - t0
        print(f"the table's sweeps ran in {table_seconds / 60:.1f} min", flush=True)
        for cid in done:
            old[cid]["table_seconds"], old[cid]["resumed"] = round(table_seconds, 1), resumed
            old[cid]["table_pools"] = "one" if len(pools) == 1 else "by paper"
    record()
    print("wrote docs/claims.md, docs/claims/, README.md")
    return 0


def by_paper(claims: Sequence[Claim], old: dict[str, dict[str, Any]]) -> list[list[str]]:
    """The ids of ``claims`` in one group per paper, in CLAIMS' order within each;
    the paper whose claims took longest in the last regeneration (their records'
    ``real_seconds``, in ``old``) first."""
    groups: dict[str, list[str]] = {}
    for c in claims:
        groups.setdefault(c.paper, []).append(c.id)

    def took(ids: list[str]) -> float:
        return sum(float((old.get(i) or {}).get("real_seconds") or 0.0) for i in ids)

    return sorted(groups.values(), key=took, reverse=True)


if __name__ == "__main__":
    raise SystemExit(main())
