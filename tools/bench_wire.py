"""Wire benchmark: fedsim's codec and transport vs raw pyzmq, over tcp loopback.

For a 100 KB and a 10 MB model (float32 tensors), each iteration moves one
message from a DEALER to a ROUTER over ``tcp://127.0.0.1``:

* fedsim: ``wire.encode(Update)`` -> ``send_multipart(copy=False)`` on
  fedsim's zmq.asyncio transport -> ``recv_multipart(copy=False)`` ->
  ``wire.decode`` with full validation (shape/dtype spec, finiteness);
* raw: the same bytes as one frame, blocking pyzmq ``send(copy=False)`` ->
  ``recv(copy=False)``, no encoding at all.

It prints the median and p90 per-message time of each and the ratio
fedsim / raw (target: <= 1.2 at 10 MB). Run: ``python tools/bench_wire.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import numpy as np
import zmq

from fedsim import wire
from fedsim.transport import Transport


def model(nbytes: int, ntensors: int) -> tuple[np.ndarray, ...]:
    per = nbytes // 4 // ntensors
    rng = np.random.default_rng(0)
    return tuple(rng.standard_normal(per).astype(np.float32) for _ in range(ntensors))


async def bench_fedsim(tensors: tuple[np.ndarray, ...], iters: int) -> list[float]:
    t = Transport()
    router, addr = t.router("tcp://127.0.0.1:0")
    dealer = t.dealer(addr, b"c1")
    spec = wire.TensorSpec([(a.shape, a.dtype) for a in tensors])
    times = []
    try:
        for i in range(iters + 5):
            t0 = time.perf_counter()
            msg = wire.Update(client=1, task_id=i, base_version=0, round=0, num_samples=1,
                              tensors=tensors, stats={})
            await dealer.send_multipart(wire.encode(msg, sent_at=0.0, seq=i), copy=False)
            frames = await router.recv_multipart(copy=False)
            out, _ = wire.decode(frames[1:], spec=spec, max_bytes=1 << 30)
            dt = time.perf_counter() - t0
            assert isinstance(out, wire.Update)
            assert out.task_id == i
            if i >= 5:
                times.append(dt)
    finally:
        t.close(linger_ms=0)
    return times


def bench_raw(tensors: tuple[np.ndarray, ...], iters: int) -> list[float]:
    payload = np.concatenate(tensors).tobytes()
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(f"tcp://127.0.0.1:{port}")
    times = []
    try:
        for i in range(iters + 5):
            t0 = time.perf_counter()
            dealer.send(payload, copy=False)
            frames = router.recv_multipart(copy=False)
            dt = time.perf_counter() - t0
            assert len(frames[1]) == len(payload)
            if i >= 5:
                times.append(dt)
    finally:
        router.close(0)
        dealer.close(0)
        ctx.term()
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3, help="alternate fedsim/raw this many times")
    args = ap.parse_args()
    print(f"{'model':>8} {'tensors':>7} {'fedsim p50':>11} {'raw p50':>9} {'ratio p50':>9} "
          f"{'fedsim p90':>11} {'raw p90':>9}")
    for label, nbytes, ntensors in (("100 KB", 100_000, 4), ("10 MB", 10_000_000, 16)):
        tensors = model(nbytes, ntensors)
        iters = args.iters if nbytes < 1_000_000 else max(20, args.iters // 4)
        f_all: list[float] = []
        r_all: list[float] = []
        for _ in range(args.rounds):  # interleave so machine noise hits both alike
            f_all += asyncio.run(bench_fedsim(tensors, iters))
            r_all += bench_raw(tensors, iters)
        f50, r50 = statistics.median(f_all), statistics.median(r_all)
        f90 = float(np.percentile(f_all, 90))
        r90 = float(np.percentile(r_all, 90))
        unit, k = ("us", 1e6) if nbytes < 1_000_000 else ("ms", 1e3)
        print(f"{label:>8} {ntensors:>7} {f50 * k:>8.1f} {unit} {r50 * k:>6.1f} {unit} "
              f"{f50 / r50:>9.2f} {f90 * k:>8.1f} {unit} {r90 * k:>6.1f} {unit}")


if __name__ == "__main__":
    main()
