"""tools/claims.py: its evaluators on hand-made sweep results, and what it writes."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

from fedsim import sweep as sw

ROOT = Path(__file__).resolve().parents[1]


def _tool() -> Any:
    spec = importlib.util.spec_from_file_location("claims_tool", ROOT / "tools" / "claims.py")
    assert spec is not None
    assert spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["claims_tool"] = mod
    spec.loader.exec_module(mod)
    return mod


claims = _tool()
KEY = "network.up.delay+network.down.delay"


def _dg1_results(tmp_path: Path, dga_time: Any, fed_time: Any) -> tuple[sw.Sweep, list[Any]]:
    scen = tmp_path / "dg1.toml"
    scen.write_text("[devices]\nstep_time = 0.04\n")
    sweep = sw.Sweep(scenario=scen, seeds=[1, 2, 3], grid={KEY: [0.001, 0.1, 0.5, 5.0]},
                     variants=[sw.Variant("FedAvg K=5", {}), sw.Variant("DGA K=5 D=20", {})])
    out = []
    for p in sweep.points():
        d = dict(p.grid)[KEY]
        t = (fed_time if p.variant.startswith("FedAvg") else dga_time)(d) * (1 + 0.01 * p.seed)
        out.append(sw.PointResult(p, tmp_path / p.key, "completed", "pass", 1, 1.0, 0.5,
                                  {"emulated_seconds": t, "fidelity": {"verdict": "pass"}}))
    return sweep, out


def test_dg1_reproduced_when_fedavg_pays_the_round_trip_and_dga_hides_it(tmp_path: Path) -> None:
    # 30 rounds: FedAvg pays K tau + 2d per round; DGA pays K tau until 2d > D tau
    sweep, res = _dg1_results(tmp_path, dga_time=lambda d: 30 * max(0.2, (2 * d + 0.2) / 5),
                              fed_time=lambda d: 30 * (0.2 + 2 * d))
    f = claims.eval_dg1(sweep, res)
    assert f.verdict == "reproduced", f
    assert f.number.startswith("5.00x")        # (0.2 + 10) / ((10 + 0.2) / 5) = 5
    assert "500 ms" in f.number
    assert len(f.details) == 2 + 4


def test_dg1_not_reproduced_when_dga_waits_like_fedavg(tmp_path: Path) -> None:
    """The mechanism switched off (D = 0: DGA is FedAvg): the margin fails."""
    sweep, res = _dg1_results(tmp_path, dga_time=lambda d: 30 * (0.2 + 2 * d),
                              fed_time=lambda d: 30 * (0.2 + 2 * d))
    f = claims.eval_dg1(sweep, res)
    assert f.verdict != "reproduced"


def test_flagged_runs_do_not_count(tmp_path: Path) -> None:
    sweep, res = _dg1_results(tmp_path, dga_time=lambda d: 6.0, fed_time=lambda d: 6 + 60 * d)
    for r in res:
        if dict(r.point.grid)[KEY] == 5.0:
            r.verdict = "fail"
    f = claims.eval_dg1(sweep, res)
    assert f.verdict == "inconclusive"
    assert "no faithful runs" in f.number


def test_the_table_goes_between_the_readme_markers(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\nbefore\n{claims.BEGIN}\nold\n{claims.END}\nafter\n")
    monkeypatch.setattr(claims, "ROOT", tmp_path)
    rec = {"id": "DG-1", "claim": "c", "reported": "5x", "number": "4.9x", "verdict": "reproduced",
           "why": "w.", "figure": "docs/claims/dg-1.png", "measured": "2026-11-24",
           "commit": "abc123"}
    claims.write_readme([rec])
    text = readme.read_text()
    assert "old" not in text
    assert text.startswith("# x\nbefore\n")
    assert text.endswith("after\n")
    assert "| [DG-1](docs/claims.md#dg-1) c | 5x | 4.9x | **reproduced**: w. |" in text
