"""Every shipped scenario runs, and every point of every reproduction sweep is valid.

Every sweep file is read by :mod:`fedsim.sweep` (what ``fedsim sweep`` runs)
and every one of its points must be a valid scenario. The smoke runs each
scenario (scenarios/*.toml and scenarios/repro/*.toml) as shipped, with its
own algorithm, model, data, network, devices and availability, for a few
emulated seconds through the real server and client-host actors in one
process (``fedsim.testing.federation``: an in-memory
network and a virtual clock, real torch training), and asserts that the
server aggregated client work and evaluated a finite accuracy. What it does
not check is timing fidelity, which needs real processes
(tests/repro/test_claims_fast.py runs those).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from fedsim.scenario import load
from fedsim.scenario.network import NetPlan
from fedsim.sweep import load_sweep
from fedsim.testing.federation import run_in_memory

ROOT = Path(__file__).resolve().parents[2]
REPRO = ROOT / "scenarios" / "repro"
SCENARIOS = sorted(p for p in [*(ROOT / "scenarios").glob("*.toml"), *REPRO.glob("*.toml")]
                   if not p.name.endswith(".sweep.toml"))
SWEEPS = sorted(REPRO.glob("*.sweep.toml"))
CLAIMS = ("fa1", "fa2", "ds1", "ds2", "dg1", "dg2", "af1", "af2", "fs1", "fs2")

#: Emulated seconds of each smoke run: enough for several aggregations of
#: every shipped scenario. af1 suspends 9 runs in 10 (P = 0.9), each run
#: K = 10 passes long, so its first update needs longer.
SMOKE_SECONDS = 2.0
LONGER = {"af1": 12.0}

pytestmark = pytest.mark.timeout(120)


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_every_claim_has_a_scenario_and_a_sweep() -> None:
    for claim in CLAIMS:
        assert (REPRO / f"{claim}.toml").is_file(), claim
        assert (REPRO / f"{claim}.sweep.toml").is_file(), claim
    # AF-1a (AF-1 at P = 0.9 at the authors' pass times) runs af1.toml with its own sweep
    assert {p.name for p in SWEEPS} == {f"{c}.sweep.toml" for c in (*CLAIMS, "af1a")}


@pytest.mark.parametrize("path", SWEEPS, ids=_rel)
def test_every_sweep_point_is_a_valid_scenario(path: Path) -> None:
    head = path.read_text().split("[sweep]")[0]
    assert head.startswith(f"# scenarios/repro/{path.name} — "), head[:80]
    words = " ".join(line.removeprefix("#").strip() for line in head.splitlines())
    assert "Cost (measured)" in words or "Cost (estimated" in words, (
        f"{path}: state the sweep's cost at the top (measured, or estimated until it is)")
    sweep = load_sweep(path)
    # 3 seeds, 5 where 3 left a claim undecided; 2 only where the header says why
    allowed = [[1, 2, 3], [1, 2, 3, 4, 5]] + ([[1, 2]] if "Two seeds" in words else [])
    assert sweep.seeds in allowed
    for v in sweep.variants:   # a variant's own seeds: an ablation on fewer, said why
        assert v.seeds is None or (v.seeds in allowed[:1] and "ablation runs on seeds"
                                   in words), (path, v.label)
    sweep.check()  # every point's scenario validates (raises naming the point and key)
    points = sweep.points()
    assert len({p.key for p in points}) == len(points)
    firsts = {(p.variant, p.grid): p for p in reversed(points)}  # one seed each: the links
    for point in firsts.values():
        NetPlan(load(sweep.scenario, point.set_args())).check()


@pytest.mark.parametrize("path", SCENARIOS, ids=_rel)
def test_shipped_scenario_runs_a_few_emulated_seconds(tmp_path: Path, path: Path) -> None:
    sc = load(path)
    NetPlan(sc).check()
    seconds = LONGER.get(sc.name, SMOKE_SECONDS)
    sc = load(path, [f"run.time_budget={seconds}"])
    run = run_in_memory(sc, tmp_path / "run", hosts=2)
    summary, events = run.summary, run.events()
    assert summary["status"] == "completed", summary
    applied = [e for e in events if e["ev"] == "aggregate"]
    assert applied, f"{_rel(path)}: no aggregation in {seconds} emulated s"
    assert summary["updates"] >= 1
    evals = [e for e in events if e["ev"] == "evaluate"]
    assert evals
    assert math.isfinite(summary["final_accuracy"]), summary
    assert 0.0 <= summary["final_accuracy"] <= 1.0
    assert math.isfinite(summary["final_loss"]), summary
