"""The reproductions' fast subset: short real runs with margins that fail when the mechanism is off.

Each test runs shipped reproduction scenarios (scenarios/repro/) through
:func:`fedsim.launch.runner.run_scenario`: real client-host processes, ZeroMQ,
torch and netem timing, a few emulated seconds each. A margin is checked
only on runs whose fidelity verdict passed; a run that fails its verdict
(a loaded machine delays timers) is run again at the dilation its summary
suggests, twice at most, and must then pass.

* DG-1 (DGA, eq. 1): with a 500 ms one-way latency, DGA (K = 5, D = 20)
  reaches the same number of rounds at least twice as fast as FedAvg
  (K = 5); with D = 0 (DGA's FedAvg mode: a barrier at the end of each
  round) it does not. At 1 ms DGA is within 20 % of FedAvg.
* FA-1 (FedAsync): with 17 tasks in flight (staleness about 16) and
  alpha = 0.9, the Poly staleness function keeps the test loss low over the
  second half of the run; a constant weight does not.
* AF-1 (AsyncFedED): with 6 local runs in 10 suspended (P = 0.6, each
  suspended run wasted, as in the authors' logs), AsyncFedED's adaptive
  weight brings the test loss down within a 10 s budget; the same rule with
  its weight fixed at FedAsync's alpha = 0.1 (the weight FedAsync+Const
  gives every update) does not. Fixed at lambda / epsilon = 1 it mostly
  still does: under this suspension model updates arrive nearly fresh
  (staleness below 3 on average), so the margin rests on the weight being
  near 1 for fresh updates more than on its staleness discount.

Every run here uses its scenario's seed (1) and one client host per core. The margins' constants are
set from repeated runs (their values are noted beside each).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fedsim.launch.runner import run_scenario
from fedsim.scenario import load

ROOT = Path(__file__).resolve().parents[2]
REPRO = ROOT / "scenarios" / "repro"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

#: The largest suggested dilation a retry follows; beyond it a retry doubles the dilation.
MAX_DILATION = 20.0
#: FA-1's and AF-1's first dilation: at 1 their short runs failed the verdict on
#: a CI machine often enough that most started again at the suggested dilation,
#: which cost more than starting at 2.
FAST_DILATION = 2.0


@dataclass
class Run:
    """A finished run whose fidelity verdict passed."""

    summary: Mapping[str, Any]
    losses: list[float]
    dilation: float

    @property
    def seconds_per_round(self) -> float:
        return float(self.summary["emulated_seconds"]) / int(self.summary["rounds"])

    def second_half_loss(self) -> float:
        """Mean test loss over the second half of the evaluations."""
        half = self.losses[len(self.losses) // 2:]
        return sum(half) / len(half)

    def best_loss(self) -> float:
        """The lowest test loss any evaluation reached."""
        return min(self.losses)


def run(out: Path, scenario: str, sets: list[str], dilation: float) -> Run:
    """Run a repro scenario with overrides, at up to three dilations until its verdict passes.

    A failed verdict is retried at the dilation the summary suggests (at least
    twice the last one): on a loaded machine a single late timer or a starved
    torch worker in a short run fails it. A suggestion beyond
    :data:`MAX_DILATION` (a stall of the whole machine: a few deliveries a
    quarter second late make the realised delay's spread look unfixable) is
    retried at twice the dilation all the same: the stall is the machine's,
    not the run's.
    """
    sc = load(REPRO / scenario, sets)
    for attempt in (1, 2, 3):
        res = run_scenario(sc, out / f"attempt{attempt}", dilation=dilation, plots=False)
        summary = res.summary
        assert summary["status"] == "completed", summary
        fid = summary["fidelity"]
        print(f"[repro] {scenario} {' '.join(sets)}: dilation {dilation}, {fid['verdict']}, "
              f"{summary['emulated_seconds']:.1f} emulated s, {summary['real_seconds']:.1f} real s")
        if fid["verdict"] == "pass":
            return Run(summary, list(res.metrics["loss"]), dilation)
        suggested = float(fid.get("suggested_dilation") or 2 * dilation)
        if attempt == 3:
            break
        dilation = max(suggested, 2 * dilation) if suggested <= MAX_DILATION else 2 * dilation
    pytest.fail(f"{scenario} {sets}: fidelity verdict failed at dilation {dilation}: "
                f"{fid['reasons']}")


# -- DG-1 ---------------------------------------------------------------------------

#: Rounds every DG-1 run goes to ("to the same number of rounds").
DG1_ROUNDS = 10
FEDAVG_K5 = ['algorithm={name="fedavg", weighting="uniform"}', "client.local_steps=5"]
DGA = {"dga": [], "dga-D0": ["algorithm.delay=0"]}
#: name -> (one-way latency in s, the dilation to start at)
LATENCY = {"500ms": (0.5, 0.5), "1ms": (0.001, 5.0)}

_dg1: dict[tuple[str, str], Run] = {}


def dg1(tmp_path_factory: pytest.TempPathFactory, latency: str, method: str) -> Run:
    """One DG-1 run, made once per session."""
    key = (latency, method)
    if key not in _dg1:
        delay, dilation = LATENCY[latency]
        sets = FEDAVG_K5 if method == "fedavg" else DGA[method]
        out = tmp_path_factory.mktemp(f"dg1-{method}-{latency}")
        _dg1[key] = run(out, "dg1.toml", [*sets, f"network.up.delay={delay}",
                                          f"network.down.delay={delay}",
                                          f"run.max_rounds={DG1_ROUNDS}"], dilation)
    return _dg1[key]


@pytest.mark.parametrize("method", ["dga", "dga-D0"])
def test_dg1_dga_hides_a_500ms_latency_and_d0_does_not(
        tmp_path_factory: pytest.TempPathFactory, method: str) -> None:
    fedavg = dg1(tmp_path_factory, "500ms", "fedavg")
    dga = dg1(tmp_path_factory, "500ms", method)
    assert dga.summary["rounds"] == fedavg.summary["rounds"] == DG1_ROUNDS
    assert fedavg.seconds_per_round > 1.0  # K tau_g + a 1 s round trip really happened
    speedup = fedavg.seconds_per_round / dga.seconds_per_round
    print(f"[repro] DG-1 500 ms: FedAvg {fedavg.seconds_per_round:.3f} s/round, {method} "
          f"{dga.seconds_per_round:.3f} s/round, speedup {speedup:.2f}")
    # Measured: FedAvg 1.21 s per round (K tau_g + RTT = 0.2 + 1.0); DGA
    # ~0.4 s (the barrier at step D = 20 waits 0.2 s for a 1 s round trip);
    # D = 0 ~1.21 s. Speedup ~3x with D = 20, 1.0x with D = 0.
    if method == "dga":
        assert speedup >= 2.0, (fedavg.seconds_per_round, dga.seconds_per_round)
    else:
        assert speedup < 2.0, (fedavg.seconds_per_round, dga.seconds_per_round)
        assert speedup == pytest.approx(1.0, abs=0.15)


def test_dg1_dga_costs_nothing_at_1ms(tmp_path_factory: pytest.TempPathFactory) -> None:
    fedavg = dg1(tmp_path_factory, "1ms", "fedavg")
    dga = dg1(tmp_path_factory, "1ms", "dga")
    assert fedavg.seconds_per_round < 0.25  # K tau_g = 0.2 s and a 2 ms round trip
    ratio = dga.seconds_per_round / fedavg.seconds_per_round
    print(f"[repro] DG-1 1 ms: FedAvg {fedavg.seconds_per_round:.3f} s/round, DGA "
          f"{dga.seconds_per_round:.3f} s/round, ratio {ratio:.3f}")
    # Both are K tau_g = 0.2 s per round when the round trip is 2 ms.
    assert abs(ratio - 1.0) <= 0.2, (fedavg.seconds_per_round, dga.seconds_per_round)


# -- FA-1 ---------------------------------------------------------------------------

#: Second-half mean test loss FA-1's Poly run stays under (c = 17, alpha = 0.9).
FA1_LOSS = 1.6
FA1_SETS = ["algorithm.concurrency=17", "algorithm.alpha=0.9", "run.max_updates=150"]


@pytest.mark.parametrize(("staleness", "stable"), [("poly", True), ("const", False)])
def test_fa1_staleness_function_keeps_high_staleness_stable(
        tmp_path: Path, staleness: str, stable: bool) -> None:
    r = run(tmp_path, "fa1.toml", [*FA1_SETS, f'algorithm.staleness="{staleness}"'], FAST_DILATION)
    assert r.summary["staleness"]["mean"] > 12  # about c - 1 = 16 really occurred
    loss = r.second_half_loss()
    print(f"[repro] FA-1 {staleness}: second-half test loss {loss:.3f} (margin {FA1_LOSS}), "
          f"staleness mean {r.summary['staleness']['mean']:.1f}")
    assert math.isfinite(loss) or not stable
    assert (loss <= FA1_LOSS) is stable, loss


# -- AF-1 ---------------------------------------------------------------------------

#: Best test loss AF-1's AsyncFedED run reaches at P = 0.6 within the budget.
AF1_LOSS = 1.2
# af1.toml is the paper's setting (K = 10 passes, 300 s); the mechanism shows in 10 s
# with one pass per run, as the check was first written
AF1_SETS = ["availability.p=0.6", "run.time_budget=10", "algorithm.k_initial=1.0",
            "client.local_epochs=1", "eval.every_seconds=1.0"]


@pytest.mark.parametrize(("weight", "learns"), [("adaptive", True), ("fixed at 0.1", False)])
def test_af1_adaptive_weight_learns_under_heavy_suspension(
        tmp_path: Path, weight: str, learns: bool) -> None:
    sets = AF1_SETS + ([] if weight == "adaptive" else ["algorithm.fixed_eta_g=0.1"])
    r = run(tmp_path, "af1.toml", sets, FAST_DILATION)
    assert r.summary["updates"] >= 10
    print(f"[repro] AF-1 {weight}: best test loss {r.best_loss():.3f} (margin {AF1_LOSS}), "
          f"{r.summary['updates']} updates")
    assert (r.best_loss() <= AF1_LOSS) is learns, r.best_loss()
