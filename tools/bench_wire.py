"""Wire benchmark: fedsim's codec (schema 2) vs raw pyzmq, over tcp loopback.

For a 100 KB and a 10 MB float32 model, each iteration moves one message from
a DEALER to a ROUTER over ``tcp://127.0.0.1`` (blocking pyzmq on both sides,
so that the difference is the codec's):

* fedsim: build an ``Update`` around ``Model.from_flat`` (field checks) ->
  ``codec.encode`` -> ``send_multipart(copy=False)`` ->
  ``recv_multipart(copy=False)`` -> ``codec.decode`` with the expected
  ``TensorSpec`` and the finiteness check (one pass over the model);
* raw: the very same frames, encoded once beforehand, through the same
  ``send_multipart(copy=False)`` -> ``recv_multipart(copy=False)``.

Rounds alternate fedsim, raw and fedsim without the finiteness check (to
show what that pass over the freshly received model costs) so that machine
noise hits all alike. The table gives the median per-message time of each
(the median over rounds of each round's median) and the ratios to raw.

Then it counts, for one Update of the 100 KB model (4 float32 tensors), the
full-size copies of the model made between the sender's flat parameter vector
and the receiver's: by ``encode`` (is frame 2 the sender's memory?), by
``decode`` (is the decoded buffer the received frame's memory?) and to get a
flat vector back (schema 1 sent one frame per tensor, so a receiver that
wants one vector had to concatenate them). Run: ``python tools/bench_wire.py``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import numpy as np
import zmq

from fedsim.codec import decode, encode
from fedsim.messages import Model, TensorSpec, Update


def make_model(nbytes: int, ntensors: int) -> tuple[np.ndarray, TensorSpec]:
    """A flat float32 vector of about ``nbytes`` and a spec of ``ntensors`` tensors."""
    per = nbytes // 4 // ntensors
    rng = np.random.default_rng(0)
    flat = rng.standard_normal(per * ntensors).astype(np.float32)
    return flat, TensorSpec([("float32", (per,))] * ntensors)


def update(flat: np.ndarray, spec: TensorSpec, i: int) -> Update:
    return Update(client=1, task_id=i, base_version=0, round=0, num_samples=1, steps=1,
                  loss=0.5, model=Model.from_flat(flat, spec))


def pair(ctx: zmq.Context[Any]) -> tuple[zmq.Socket[Any], zmq.Socket[Any]]:
    router = ctx.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.IDENTITY, b"c1")
    dealer.connect(f"tcp://127.0.0.1:{port}")
    for s in (router, dealer):
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.RCVTIMEO, 10_000)
    return router, dealer


def bench_fedsim(sockets: tuple[Any, Any], flat: np.ndarray, spec: TensorSpec,
                 iters: int, check_finite: bool = True, warmup: int = 5) -> list[float]:
    router, dealer = sockets
    times = []
    for i in range(iters + warmup):
        t0 = time.perf_counter()
        dealer.send_multipart(encode(update(flat, spec, i), sent_at=0.0, seq=i), copy=False)
        frames = router.recv_multipart(copy=False)
        msg, _ = decode(frames[1:], spec=spec, max_bytes=1 << 30, check_finite=check_finite)
        dt = time.perf_counter() - t0
        assert isinstance(msg, Update)
        assert msg.task_id == i
        if i >= warmup:
            times.append(dt)
    return times


def bench_raw(sockets: tuple[Any, Any], frames: list[bytes], iters: int,
              warmup: int = 5) -> list[float]:
    router, dealer = sockets
    times = []
    for i in range(iters + warmup):
        t0 = time.perf_counter()
        dealer.send_multipart(frames, copy=False)
        got = router.recv_multipart(copy=False)
        dt = time.perf_counter() - t0
        assert len(got) == 1 + len(frames)
        if i >= warmup:
            times.append(dt)
    return times


def address(buffer: Any) -> int:
    """Start address of a numpy array, bytes-like object or zmq.Frame."""
    if isinstance(buffer, zmq.Frame):
        buffer = buffer.buffer
    if not isinstance(buffer, np.ndarray):
        buffer = np.frombuffer(buffer, np.uint8)
    return int(buffer.__array_interface__["data"][0])


def count_copies(sockets: tuple[Any, Any]) -> None:
    flat, spec = make_model(100_000, 4)
    router, dealer = sockets
    frames = encode(update(flat, spec, 0))
    encode_copies = 0 if np.shares_memory(np.frombuffer(frames[2], np.uint8), flat) else 1
    assert encode_copies or address(frames[2]) == address(flat)
    dealer.send_multipart(frames, copy=False)
    received = router.recv_multipart(copy=False)[1:]
    msg, _ = decode(received, spec=spec)
    assert isinstance(msg, Update)
    got = msg.model.flat()  # the receiver's flat vector: no concatenation needed
    decode_copies = 0 if address(got) == address(received[2]) else 1
    assert np.shares_memory(got, np.frombuffer(received[2].buffer, np.uint8)) == (
        decode_copies == 0)
    np.testing.assert_array_equal(got, flat)
    total = encode_copies + decode_copies
    print(f"\nOne Update of a 100 KB float32 model ({len(spec)} tensors), sender's flat vector"
          " -> receiver's:")
    print(f"  schema 2: {len(frames)} frames ({len(frames) - 2} model buffer); full-size copies:"
          f" encode {encode_copies}, decode {decode_copies}, flatten 0 -> {total}")
    print(f"  schema 1: {1 + len(spec)} frames (one per tensor); full-size copies: encode 0,"
          f" decode 0, flatten 1 (np.concatenate of {len(spec)} frames) -> 1")
    print("  (the kernel and libzmq copies of tcp:// are the transport's, in both columns)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iters", type=int, default=200, help="messages per round (100 KB)")
    ap.add_argument("--rounds", type=int, default=3, help="alternate fedsim/raw this many times")
    args = ap.parse_args()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"{os.cpu_count()} CPUs, load average {load:.2f}; median of {args.rounds} interleaved"
          " rounds of per-message medians")
    print(f"{'model':>8} {'tensors':>7} {'frames':>6} {'fedsim':>10} {'raw':>10} {'ratio':>6}"
          f" {'no finite check':>16} {'ratio':>6}")
    ctx: zmq.Context[Any] = zmq.Context()
    sockets = pair(ctx)
    try:
        for label, nbytes, ntensors in (("100 KB", 100_000, 4), ("10 MB", 10_000_000, 16)):
            flat, spec = make_model(nbytes, ntensors)
            frames = [bytes(f) for f in encode(update(flat, spec, 0))]
            iters = args.iters if nbytes < 1_000_000 else max(20, args.iters // 4)
            fedsim_medians, raw_medians, unchecked_medians = [], [], []
            for _ in range(args.rounds):
                fedsim_medians.append(statistics.median(bench_fedsim(sockets, flat, spec, iters)))
                raw_medians.append(statistics.median(bench_raw(sockets, frames, iters)))
                unchecked_medians.append(statistics.median(
                    bench_fedsim(sockets, flat, spec, iters, check_finite=False)))
            f50, r50 = statistics.median(fedsim_medians), statistics.median(raw_medians)
            u50 = statistics.median(unchecked_medians)
            unit, k = ("us", 1e6) if nbytes < 1_000_000 else ("ms", 1e3)
            print(f"{label:>8} {ntensors:>7} {len(frames):>6} {f50 * k:>7.1f} {unit} "
                  f"{r50 * k:>7.1f} {unit} {f50 / r50:>6.2f} {u50 * k:>13.1f} {unit} "
                  f"{u50 / r50:>6.2f}")
        count_copies(sockets)
    finally:
        for s in sockets:
            s.close(0)
        ctx.term()


if __name__ == "__main__":
    main()
