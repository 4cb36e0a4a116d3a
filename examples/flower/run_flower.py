"""Run digits_app.py in Flower's own simulation (Ray, no network model) and record its curve.

    python examples/flower/run_flower.py [--out DIR]

Writes DIR/flower-simulation.csv (default: examples/flower/out): per
centralized evaluation, the seconds since the ServerApp started and the test
accuracy, the curve docs/flower.md sets beside fedsim's runs of the same app
(``fedsim run examples/flower/lan.toml`` and ``wifi.toml``). The app is not
changed: this harness only times the calls of its ``evaluate`` function.
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import digits_app  # noqa: E402
from flwr.simulation import run_simulation  # noqa: E402

from fedsim.scenario import load  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=HERE / "out")
    args = ap.parse_args()
    rows: list[tuple[float, float]] = []
    t0 = time.perf_counter()
    plain = digits_app.evaluate

    def timed(net, x, y):  # type: ignore[no-untyped-def]
        loss, acc = plain(net, x, y)
        if len(y) > 300:                  # the centralized evaluation on the test set
            rows.append((time.perf_counter() - t0, acc))
        return loss, acc

    digits_app.evaluate = timed
    nodes = load(digits_app.SCENARIO).data.num_clients
    run_simulation(server_app=digits_app.server_app, client_app=digits_app.client_app,
                   num_supernodes=nodes,
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}})
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "flower-simulation.csv"
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["seconds", "accuracy"])
        w.writerows((f"{t:.3f}", f"{a:.4f}") for t, a in rows)
    print(f"{len(rows)} evaluations, {rows[-1][0]:.1f} s, accuracy {rows[-1][1]:.3f}; {path}"
          if rows else f"no evaluation recorded; {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
