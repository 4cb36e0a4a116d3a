"""Wire benchmark: fedsim's codec and its transport against raw pyzmq, over tcp loopback.

For a 100 KB and a 10 MB float32 model, one message at a time over
``tcp://127.0.0.1``, between the ROUTER of ``ZmqContext.endpoint`` and the
DEALER of ``ZmqContext.connect`` (one libzmq socket pair, one TCP
connection, for every side: with sockets of their own, 10 MB figures swung
by up to 2x with the state of each connection):

* ``raw``: blocking pyzmq on those sockets (``zmq.Socket.shadow``), DEALER
  -> ROUTER, the frames of an ``Update`` encoded once beforehand,
  ``send_multipart(copy=False)`` -> ``recv_multipart(copy=False)``;
  ``raw down``: the same ROUTER -> DEALER;
* ``codec``: the same blocking calls with fedsim's codec: build an
  ``Update`` around ``Model.from_flat`` (field checks) -> ``codec.encode``
  -> send -> receive -> ``codec.decode`` with the expected ``TensorSpec``
  and the finiteness check (one pass over the model); and again without
  that check, to show what the pass over the freshly received model costs;
* ``transport``: fedsim's transport as the server and the hosts use it, on
  the event loop fedsim runs (uvloop; ``--loop asyncio`` for asyncio's):
  ``await conn.send`` -> ``await endpoint.recv()``, the very same frames as
  ``raw``; ``+ codec``: the whole path of an Update from a host to the
  server as the server takes it (build, encode, send, receive, decode; from
  1 MB the value pass handed to the server's value-check thread,
  ``fedsim.actors.uplinks``, which does it while the update crosses its
  uplink), and ``(on loop)`` the same with that pass in ``decode``;
  ``transport down``: ``endpoint.send`` -> ``conn.recv()`` against ``raw
  down`` (what a host receives).

Message after message, each side runs right after a raw message of its
direction, so that machine noise hits both alike. Each figure is the median
per-message time; each ratio the median over messages of the side's time
over that raw message's. Then it counts, for one Update of the 100 KB model
(4 float32 tensors), the full-size copies of the model made between the
sender's flat parameter vector and the receiver's: by ``encode`` (is frame
2 the sender's memory?), by ``decode`` (is the decoded buffer the received
frame's memory?) and to get a flat vector back (schema 1 sent one frame per
tensor, so a receiver that wants one vector had to concatenate them).

Run: ``python tools/bench_wire.py`` (about 10 s). Measured 2026-11-25 on the
shared 2-core machine (load average 2.9-3.4, three runs), ratios to raw:

=========  ============  ==============  ===============  ===================
model      transport up  transport down  + codec (up)     codec alone
=========  ============  ==============  ===============  ===================
100 KB     1.22          1.09-1.11       2.00-2.05        1.71-1.75
10 MB      1.03-1.07     1.01-1.09       1.25-1.30        1.22-1.26
=========  ============  ==============  ===============  ===================

Measured 2026-11-29 (quiet machine, load average 0.5): transport up 1.05,
down 0.98; + codec (the server's path) 1.59-1.74 at 100 KB (the value
pass on the loop: handing 100 KB over to a thread cost as much), 1.06 at
10 MB (the pass in the server's value-check thread; 1.19-1.32 with it on
the loop, before); the codec alone 1.61-1.64 and 1.20-1.30 (1.33 and 1.03
without the pass).

Measured 2026-11-29 afternoon (three runs, load average 0.6-0.7, raw 100 KB
250-254 us: a slower machine state than the morning's 207), with the value
check as ``np.isfinite(...).all()``: + codec 1.69-1.74 at 100 KB and
1.09-1.10 at 10 MB; the codec alone 1.54-1.58 (1.40-1.42 without the pass).
The pass off the loop from 64 KB (CHECK_OFF_LOOP_BYTES) measured 1.64 against
1.61-1.65 on it that morning: not kept.

Measured 2026-11-29 evening (load average 0.7-0.9, raw 100 KB 238-252 us,
two runs each of the code before and after, interleaved, ``--iters 2000``):
Model.from_flat checks its buffer once (4.5 -> 2.7 us, timeit) and
encode_body reads the fields in one call (4.5 -> 3.8 us): the codec alone
1.51-1.54 -> 1.49-1.51 (1.38-1.41 -> 1.36-1.38 without the pass); the
server's path 1.57-1.59 -> 1.55-1.56 with the pass on the loop, 1.55-1.57
-> 1.54-1.55 with it handed to the value-check thread (the new last table:
the hand-over costs the loop about what the pass over a cold 100 KB does),
and 1.63-1.66 for the very same code one pair of messages earlier in each
round (an order effect, not a cost); the transport alone 1.12-1.14.

Measured 2026-11-30 (load average 1.1, two runs, ``--iters 2000``): raw
pyzmq's zero-copy send of 100 KB costs a message to pyzmq's garbage-collector
thread, so its default mode (the frames copied into libzmq) is faster at that
size: 223-288 us against 256-336. Each upward side is now also timed against
that ``raw copy`` side and set against the faster mode (the table "Against
raw pyzmq's faster mode"). fedsim's sockets now copy frames below 256 KiB
(``fedsim.wire.transport.COPY_BELOW``): the transport alone 1.12-1.21 ->
0.96 against the zero-copy raw side and 1.15-1.17 against the copying one;
the server's path at 100 KB 1.41-1.52 against the zero-copy side and
1.59-1.73 against the faster raw mode: the issue's 1.5 is not met. At 10 MB
nothing changes (zero-copy is the faster mode there: 3.5-3.6 ms against
4.5-4.7). Where the rest goes: timed in place, an Update's build and
encode take 47.5 us and its decode without the value pass 53 us, against
11.5 and 15 us in a warm ``timeit`` loop: after each ~200 us wait for the
frames the Python work runs about 4x slower, while raw pyzmq has almost
none. ``--pin CPU`` (every thread, the loop's and libzmq's I/O thread, on
one CPU) made raw 100 KB 151 us and the server's path 316 us: 2.10x.

Measured 2026-11-30 afternoon (a freshly booted machine, load average 0.4-0.9,
three runs: one default, two ``--iters 2000``; raw 100 KB 134-147 us, its copy
mode 122-131 us), against raw pyzmq's faster mode: at 100 KB the server's path
1.66-1.68 with the value pass on the loop (as it was then below
CHECK_OFF_LOOP_BYTES, 1 MB) and 1.46-1.49 with the pass handed to the
value-check thread; at 10 MB 1.03-1.04. The hand-over that cost the loop as
much as the pass on 2026-11-29 saved 0.2 of raw's time here; the threshold
was left for the runs below.

Measured 2026-11-30, 16:10-16:33 (nine runs, ``--iters 2000``, load average
0.3-1.0; every run times both paths message after message, so each run is a
before and after): the pass on the loop 1.65-1.75, handed to the thread
1.45-1.52 (median 1.48; two of the nine above 1.50) against raw's faster
mode, the hand-over ahead in every run; so CHECK_OFF_LOOP_BYTES is now
64 KiB, and the server's path at 100 KB is the "(thread)" column. At 10 MB
0.98-1.04.

On ``zmq.asyncio`` sockets (fedsim before it read its sockets itself,
commit 4f7fdf4), the same runs: 1.64-1.66 up, 1.45-1.46 down, 2.41-2.43
with the codec at 100 KB; 1.11-1.16, 1.03-1.09 and 1.24-1.40 at 10 MB.
More in docs/measurements.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import zmq

from fedsim.actors.uplinks import CHECK_OFF_LOOP_BYTES, ValueChecks
from fedsim.wire.codec import decode, encode
from fedsim.wire.messages import Update
from fedsim.wire.tensors import Model, TensorSpec
from fedsim.wire.transport import Connection, Endpoint, ZmqConnection, ZmqContext, ZmqEndpoint


def _size(nbytes: int) -> str:
    """``65536`` -> ``64 KiB``, ``1048576`` -> ``1 MiB``."""
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} bytes"


def make_model(nbytes: int, ntensors: int) -> tuple[np.ndarray, TensorSpec]:
    """A flat float32 vector of about ``nbytes`` and a spec of ``ntensors`` tensors."""
    per = nbytes // 4 // ntensors
    rng = np.random.default_rng(0)
    flat = rng.standard_normal(per * ntensors).astype(np.float32)
    return flat, TensorSpec([("float32", (per,))] * ntensors)


def update(flat: np.ndarray, spec: TensorSpec, i: int) -> Update:
    return Update(client=1, task_id=i, base_version=0, round=0, num_samples=1, steps=1,
                  loss=0.5, model=Model.from_flat(flat, spec))


def blocking(end: ZmqEndpoint | ZmqConnection) -> zmq.Socket[Any]:
    """A blocking pyzmq socket on the same libzmq socket as fedsim's ``end``.

    ``end.sock`` is a ``zmq.asyncio.Socket`` (fedsim before its own reader)
    or the reader wrapping a blocking socket (``end.sock.sock``).
    """
    sock: Any = end.sock
    if not isinstance(sock, zmq.Socket):
        sock = sock.sock
    raw: zmq.Socket[Any] = zmq.Socket.shadow(sock.underlying)
    return raw


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


Side = Callable[[int], Awaitable[float]]


def sides(sockets: tuple[Any, Any], endpoint: Endpoint, conn: Connection,
          flat: np.ndarray, spec: TensorSpec, frames: list[bytes]) -> dict[str, Side]:
    """Every side, as a coroutine moving message ``i`` and returning its time in seconds."""
    router, dealer = sockets
    down = [b"c1", *frames]
    checker = ValueChecks()      # the server's: fedsim.actors.uplinks
    # the server's reader knows a message's size from its envelope (peek), before decode
    later = sum(len(f) for f in frames) >= CHECK_OFF_LOOP_BYTES

    def rearm() -> None:
        # A blocking recv returns without libzmq noting the queue empty, so the next
        # message would not signal ZMQ_FD, which fedsim's reader sleeps on: end the raw
        # side as every call of that reader ends, with an EVENTS read (not timed).
        router.get(zmq.EVENTS)
        dealer.get(zmq.EVENTS)

    async def raw(i: int, copy: bool = False) -> float:
        """Frames encoded beforehand, handed to libzmq without a copy (``copy``: copied,
        pyzmq's default mode)."""
        t0 = time.perf_counter()
        dealer.send_multipart(frames, copy=copy)
        got = router.recv_multipart(copy=False)
        dt = time.perf_counter() - t0
        rearm()
        assert len(got) == 1 + len(frames)
        return dt

    async def codec(i: int, check_finite: bool = True) -> float:
        t0 = time.perf_counter()
        dealer.send_multipart(encode(update(flat, spec, i), sent_at=0.0, seq=i), copy=False)
        got = router.recv_multipart(copy=False)
        msg, _ = decode(got[1:], spec=spec, max_bytes=1 << 30, check_finite=check_finite)
        dt = time.perf_counter() - t0
        rearm()
        assert isinstance(msg, Update)
        assert msg.task_id == i
        return dt

    async def unchecked(i: int) -> float:
        return await codec(i, check_finite=False)

    async def transport(i: int) -> float:
        t0 = time.perf_counter()
        await conn.send(frames)
        _, got = await endpoint.recv()
        dt = time.perf_counter() - t0
        assert len(got) == len(frames)
        return dt

    async def transport_codec(i: int) -> float:
        """The server's path: a large update is decoded without the value pass,
        which goes to a thread of its own (fedsim.actors.uplinks: done while the
        update crosses its uplink); the loop's time, then (untimed) the pass's end."""
        t0 = time.perf_counter()
        await conn.send(encode(update(flat, spec, i), sent_at=0.0, seq=i))
        _, got = await endpoint.recv()
        msg, _ = decode(got, spec=spec, max_bytes=1 << 30, check_finite=not later)
        assert isinstance(msg, Update)
        values = checker.submit(msg.model) if later else None
        dt = time.perf_counter() - t0
        if values is not None:
            values.result()
        assert msg.task_id == i
        return dt

    async def transport_codec_thread(i: int) -> float:
        """The same with the value pass handed to the value-check thread whatever
        the size (what the server's path would be with CHECK_OFF_LOOP_BYTES = 0)."""
        t0 = time.perf_counter()
        await conn.send(encode(update(flat, spec, i), sent_at=0.0, seq=i))
        _, got = await endpoint.recv()
        msg, _ = decode(got, spec=spec, max_bytes=1 << 30, check_finite=False)
        assert isinstance(msg, Update)
        values = checker.submit(msg.model)
        dt = time.perf_counter() - t0
        values.result()
        assert msg.task_id == i
        return dt

    async def transport_codec_inline(i: int) -> float:
        """The same with the value pass on the loop (decode's check_finite)."""
        t0 = time.perf_counter()
        await conn.send(encode(update(flat, spec, i), sent_at=0.0, seq=i))
        _, got = await endpoint.recv()
        msg, _ = decode(got, spec=spec, max_bytes=1 << 30)
        dt = time.perf_counter() - t0
        assert isinstance(msg, Update)
        assert msg.task_id == i
        return dt

    async def raw_copy(i: int) -> float:
        return await raw(i, copy=True)

    async def raw_down(i: int) -> float:
        t0 = time.perf_counter()
        router.send_multipart(down, copy=False)
        got = dealer.recv_multipart(copy=False)
        dt = time.perf_counter() - t0
        rearm()
        assert len(got) == len(frames)
        return dt

    async def transport_down(i: int) -> float:
        t0 = time.perf_counter()
        await endpoint.send(b"c1", frames)
        got = await conn.recv()
        dt = time.perf_counter() - t0
        assert len(got) == len(frames)
        return dt

    return {"raw": raw, "raw_copy": raw_copy, "codec": codec, "unchecked": unchecked,
            "transport": transport,
            "transport_codec": transport_codec, "transport_codec_inline": transport_codec_inline,
            "transport_codec_thread": transport_codec_thread,
            "raw_down": raw_down, "transport_down": transport_down}


#: Each side and the raw side of its direction it is timed against, just before it;
#: the upward ones also against raw pyzmq's other mode (``raw_copy``), so that each
#: is set against whichever raw mode is faster at its size.
PAIRS = (("transport", "raw"), ("transport_codec", "raw"), ("transport_codec_inline", "raw"),
         ("transport_codec_thread", "raw"),
         ("transport_down", "raw_down"), ("codec", "raw"), ("unchecked", "raw"),
         ("raw_copy", "raw"), ("transport", "raw_copy"), ("transport_codec_inline", "raw_copy"),
         ("transport_codec_thread", "raw_copy"))


async def run_sides(named: dict[str, Side], messages: int, warmup: int = 5,
                    ) -> tuple[dict[str, float], dict[str, float]]:
    """Each side's median time, and its median ratio to the raw message sent just before
    it (keyed by the side's name, and ``side/raw`` against a raw side other than its
    direction's first).

    Message after message, every pair in turn: a raw message, then the
    side's. A 10 MB side's time depends on whether libzmq's receive buffer
    lands on memory the previous message left mapped; timing each side right
    after a raw message keeps that alike for both.
    """
    times: dict[str, list[float]] = {name: [] for name in named}
    def key(name: str, raw: str) -> str:
        return name if raw in ("raw", "raw_down") or name == "raw_copy" else f"{name}/{raw}"
    ratios: dict[str, list[float]] = {key(name, raw): [] for name, raw in PAIRS}
    for i in range(warmup + messages):
        for name, raw in PAIRS:
            base = await named[raw](i)
            dt = await named[name](i)
            if i >= warmup:
                times[raw].append(base)
                times[name].append(dt)
                ratios[key(name, raw)].append(dt / base)
    return ({name: statistics.median(t) for name, t in times.items()},
            {name: statistics.median(r) for name, r in ratios.items()})


async def measure(args: argparse.Namespace) -> None:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    loop = type(asyncio.get_running_loop()).__module__.split(".")[0]
    print(f"{os.cpu_count()} CPUs, load average {load:.2f}; every side in turn, message after"
          f" message; medians; fedsim's transport on {loop}")
    if args.pin is not None:
        # before the context: its I/O thread inherits the affinity
        os.sched_setaffinity(0, {args.pin})
        print(f"every thread on CPU {args.pin} (the loop and libzmq's I/O thread)")
    fedsim_ctx = ZmqContext()
    endpoint = fedsim_ctx.endpoint("tcp://127.0.0.1:0")
    conn = fedsim_ctx.connect(endpoint.address, b"c1")
    # Raw pyzmq on the very same libzmq sockets, so on the same TCP connection: with
    # sockets of their own, the 10 MB figures of a run swung by up to 2x with the
    # state of each connection (the kernel tunes its buffers).
    sockets = blocking(endpoint), blocking(conn)
    rows = []
    try:
        for label, nbytes, ntensors in (("100 KB", 100_000, 4), ("10 MB", 10_000_000, 16)):
            flat, spec = make_model(nbytes, ntensors)
            frames = [bytes(f) for f in encode(update(flat, spec, 0))]
            messages = args.iters if nbytes < 1_000_000 else max(20, args.iters // 10)
            medians, ratios = await run_sides(
                sides(sockets, endpoint, conn, flat, spec, frames), messages)
            unit, k = ("us", 1e6) if nbytes < 1_000_000 else ("ms", 1e3)
            rows.append((label, ntensors, len(frames), unit, k, medians, ratios))
        print("\nThe codec: blocking pyzmq on both sides, DEALER -> ROUTER")
        print(f"{'model':>8} {'tensors':>7} {'frames':>6} {'fedsim':>10} {'raw':>10} {'ratio':>6}"
              f" {'no finite check':>16} {'ratio':>6}")
        for label, ntensors, nframes, unit, k, m, r in rows:
            print(f"{label:>8} {ntensors:>7} {nframes:>6} {m['codec'] * k:>7.1f} {unit} "
                  f"{m['raw'] * k:>7.1f} {unit} {r['codec']:>6.2f} "
                  f"{m['unchecked'] * k:>13.1f} {unit} {r['unchecked']:>6.2f}")
        print("\nfedsim's transport (ZmqContext.connect <-> ZmqContext.endpoint, on the event loop)"
              " against raw blocking pyzmq, the same frames")
        print(f"{'model':>8} {'raw up':>10} {'transport':>10} {'ratio':>6}"
              f" {'+ codec':>10} {'ratio':>6} {'(on loop)':>10} {'ratio':>6}"
              f" {'raw down':>10} {'transport':>10} {'ratio':>6}")
        for label, _, _, unit, k, m, r in rows:
            print(f"{label:>8} {m['raw'] * k:>7.1f} {unit} {m['transport'] * k:>7.1f} {unit}"
                  f" {r['transport']:>6.2f} {m['transport_codec'] * k:>7.1f} {unit}"
                  f" {r['transport_codec']:>6.2f} {m['transport_codec_inline'] * k:>7.1f} {unit}"
                  f" {r['transport_codec_inline']:>6.2f} {m['raw_down'] * k:>7.1f} {unit}"
                  f" {m['transport_down'] * k:>7.1f} {unit} {r['transport_down']:>6.2f}")
        print(f"(+ codec: the server's path: from {_size(CHECK_OFF_LOOP_BYTES)} the value pass"
              " in a thread while the "
              "update crosses its uplink;\n (on loop): that pass in decode, on the loop)")
        print("\nAgainst raw pyzmq's faster mode at each size (zero-copy send, or pyzmq's default"
              " copy):")
        print(f"{'model':>8} {'zero-copy':>10} {'copy':>10} {'transport':>9}"
              f" {'(on loop)':>9} {'(thread)':>8}")
        for label, _, _, unit, k, m, r in rows:
            vs = "/raw_copy" if m["raw_copy"] < m["raw"] else ""
            best = {side: r[side + vs] for side in
                    ("transport", "transport_codec_inline", "transport_codec_thread")}
            print(f"{label:>8} {m['raw'] * k:>7.1f} {unit} {m['raw_copy'] * k:>7.1f} {unit}"
                  f" {best['transport']:>9.2f} {best['transport_codec_inline']:>9.2f}"
                  f" {best['transport_codec_thread']:>8.2f}")
        print(f"(the server's path is (on loop) below {_size(CHECK_OFF_LOOP_BYTES)} and (thread)"
              " from it, as above)")
        print("\nThe value pass handed to the thread at every size (the loop's time):")
        for label, _, _, unit, k, m, r in rows:
            print(f"{label:>8} {m['transport_codec_thread'] * k:>7.1f} {unit}"
                  f" {r['transport_codec_thread']:>6.2f}")
        count_copies(sockets)
    finally:
        endpoint.close()
        conn.close()
        fedsim_ctx.close(linger_ms=0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iters", type=int, default=1000,
                    help="messages per side at 100 KB (a tenth at 10 MB, at least 20)")
    ap.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop",
                    help="the event loop under fedsim's transport (fedsim's default: uvloop)")
    ap.add_argument("--pin", type=int, default=None, metavar="CPU",
                    help="run every thread (the loop's and libzmq's I/O thread) on one CPU")
    args = ap.parse_args()
    if args.loop == "uvloop":
        try:
            import uvloop
        except ImportError:
            print("uvloop is not installed: asyncio's loop")
        else:
            uvloop.run(measure(args))
            return
    asyncio.run(measure(args))


if __name__ == "__main__":
    main()
