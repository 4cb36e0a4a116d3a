"""Hostile frames for testing that no message can crash a federation.

:class:`Fuzzer` makes frames of every kind a broken or malicious peer could
send: random bytes, valid messages truncated or with bytes flipped, the
right schema with wrong types or values, NaN and Inf in a model, wrong
shapes, huge declared sizes, messages out of order for the sender's state,
replays of earlier frames, impossible send times. Each comes with what the
server must do with it: the ``reason`` it is rejected for (a
:class:`~fedsim.wire.errors.WireError` or refusal code), or ``None`` when the
frame is well-formed and allowed (its effect is limited to the sender's
own clients, e.g. a Ready from a client that was not away).

It is driven through a registered host's connection (an authenticated
insider, the strongest attacker CURVE lets in) by the actor tests on the
in-memory network and by the multi-process and multi-host tests.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
import numpy as np

from fedsim.actors import process
from fedsim.actors.host import ClientHost
from fedsim.actors.workers import WorkerHandle
from fedsim.deploy.run import client_keys
from fedsim.scenario import load, resolved, scenario_hash
from fedsim.scenario.ids import parse_ids
from fedsim.wire.codec import encode, frame_view
from fedsim.wire.messages import (
    SCHEMA_VERSION,
    Event,
    EventBatch,
    HostBye,
    HostHello,
    Ready,
    Update,
)
from fedsim.wire.tensors import Model, TensorSpec
from fedsim.wire.transport import ZmqContext, ipc_address

__all__ = ["Frame", "Fuzzer"]


@dataclass(frozen=True)
class Frame:
    """One hostile message: its frames, its category, and the server's expected answer.

    ``reject`` is the reason code it must be rejected with, ``"any"`` when
    it must be rejected for some reason (a random mutation), or ``None`` when
    it may be accepted.
    """

    frames: list[bytes | memoryview]
    category: str
    reject: str | None


class Fuzzer:
    """Hostile frames from host ``host`` (running ``clients``) for a model of ``spec``.

    ``seq`` is the host's own message counter (shared, so that the fuzz
    frames pass the replay check and reach the handlers behind it, unless
    they are meant to be replays); ``num_clients`` is the scenario's size.
    """

    CATEGORIES = ("random_bytes", "truncated", "bit_flip", "wrong_type", "wrong_value",
                  "non_finite", "wrong_shape", "huge_size", "out_of_order", "replay",
                  "send_time", "forged_event")

    def __init__(self, host: str, clients: list[int], spec: TensorSpec, num_clients: int,
                 seq: Iterator[int], seed: int = 0) -> None:
        self.host = host
        self.clients = clients
        self.spec = spec
        self.num_clients = num_clients
        self.seq = seq
        self.rng = np.random.default_rng(seed)
        self._sent: list[list[bytes | memoryview]] = []

    # -- helpers -----------------------------------------------------------------
    def _client(self) -> int:
        return int(self.rng.choice(self.clients))

    def _model(self, fill: float | None = None) -> Model:
        n = self.spec.nbytes // 4
        flat = (self.rng.standard_normal(n).astype(np.float32) * 0.01 if fill is None
                else np.full(n, fill, np.float32))
        return Model.from_flat(flat, self.spec)

    def _update(self, fill: float | None = None, **changes: Any) -> Update:
        fields: dict[str, Any] = {
            "client": self._client(), "task_id": int(self.rng.integers(10**6, 10**7)),
            "base_version": 0, "round": 0, "num_samples": 10, "steps": 1, "loss": None,
            "model": self._model(fill)}
        fields.update(changes)
        return Update(**fields)

    def _frames(self, msg: Any, sent_at: float = 0.0) -> list[bytes | memoryview]:
        frames = encode(msg, sent_at=sent_at, seq=next(self.seq))
        return [frame_view(f).tobytes() for f in frames]

    def _raw(self, kind: str, header: list[Any], *buffers: bytes) -> list[bytes | memoryview]:
        env = msgpack.packb([SCHEMA_VERSION, kind, 0.0, next(self.seq)])
        return [env, msgpack.packb(header), *buffers]

    # -- categories ----------------------------------------------------------------
    def random_bytes(self) -> Frame:
        n = int(self.rng.integers(1, 5))
        frames: list[bytes | memoryview] = [
            self.rng.bytes(int(self.rng.integers(0, 200))) for _ in range(n)]
        return Frame(frames, "random_bytes", "any")

    def truncated(self) -> Frame:
        frames = self._frames(self._update())
        i = int(self.rng.integers(0, len(frames)))
        cut = bytes(frames[i])[: max(0, len(frames[i]) - int(self.rng.integers(1, 9)))]
        frames = [*frames[:i], cut] if self.rng.random() < 0.5 else [*frames[:i], cut,
                                                                      *frames[i + 1:]]
        return Frame(frames, "truncated", "any")

    def bit_flip(self) -> Frame:
        frames = self._frames(self._update())
        i = int(self.rng.integers(0, 2))  # the envelope or the header
        b = bytearray(frames[i])
        # not the envelope's last 9 bytes (the sequence number): a flipped number
        # could collide with a later frame's, which would then count as a replay
        end = len(b) - 9 if i == 0 else len(b)
        for _ in range(int(self.rng.integers(1, 4))):
            b[int(self.rng.integers(0, end))] ^= 1 << int(self.rng.integers(0, 8))
        frames[i] = bytes(b)
        # a flip may leave a valid message (e.g. another float): then anything legal goes
        return Frame(frames, "bit_flip", None)

    def wrong_type(self) -> Frame:
        c = self._client()
        choices: list[tuple[str, list[Any]]] = [
            ("Update", [c, 1, 0, 0, 10, "lots", None, [["float32", [1]]]]),
            ("Update", ["c05", 1, 0, 0, 10, 1, None, [["float32", [1]]]]),
            ("Ready", [c, "yes"]),
            ("Ready", [True, False]),
            ("ClockProbe", ["1", 0.0]),
            ("HostBye", [self.host, "lots", 0, 0, {}, []]),
            ("EventBatch", [self.host, [[1.0, 1.0, "send"]]]),
            ("Leave", [c]),
        ]
        kind, header = choices[int(self.rng.integers(0, len(choices)))]
        return Frame(self._raw(kind, header), "wrong_type", "any")

    def wrong_value(self) -> Frame:
        c = self._client()
        choices: list[tuple[Any, str]] = [
            (lambda: self._update(client=-1), "bad_field"),
            (lambda: self._update(client=self.num_clients + 7), "unknown_client"),
            (lambda: self._update(num_samples=-5), "bad_field"),
            (lambda: self._update(steps=-1), "bad_field"),
            (lambda: Ready(client=10**9, reset=False), "unknown_client"),
        ]
        make, reason = choices[int(self.rng.integers(0, len(choices)))]
        try:
            msg = make()
        except ValueError:  # the schema refuses to even build it: send it raw
            header = [c, 1, 0, 0, -5, 1, None, self.spec.to_wire()]
            buffers = [b.tobytes() for b in self._model().buffers]
            return Frame(self._raw("Update", header, *buffers), "wrong_value", "bad_field")
        return Frame(self._frames(msg), "wrong_value", reason)

    def non_finite(self) -> Frame:
        fill = float(self.rng.choice([np.nan, np.inf, -np.inf]))
        return Frame(self._frames(self._update(fill=fill)), "non_finite", "non_finite")

    def wrong_shape(self) -> Frame:
        other = TensorSpec([("float32", (3, 3))])
        model = Model.from_flat(np.zeros(9, np.float32), other)
        msg = self._update()
        frames = self._raw("Update", [msg.client, msg.task_id, 0, 0, 10, 1, None,
                                      list(other.to_wire())], *(b.tobytes() for b in model.buffers))
        return Frame(frames, "wrong_shape", "shape_mismatch")

    def huge_size(self) -> Frame:
        huge = [["float32", [2**31, 2**31]]]
        frames = self._raw("Update", [self._client(), 1, 0, 0, 10, 1, None, huge], b"\0" * 16)
        return Frame(frames, "huge_size", "any")

    def out_of_order(self) -> Frame:
        choices: list[tuple[Any, str | None]] = [
            (HostHello(host=self.host, pid=1, clients=tuple(self.clients),
                       samples=tuple(1 for _ in self.clients), boot_id="x",
                       fedsim_version="?", scenario_hash="?"), "refused"),
            (HostBye(host=self.host, overruns=0, compute_deadlines=0, rejected=0,
                     fidelity={}), "out_of_order"),
            (Ready(client=self._client(), reset=False), None),     # not away: a no-op
            (self._update(), "unknown_task"),                       # of a task never sent
        ]
        msg, reason = choices[int(self.rng.integers(0, len(choices)))]
        return Frame(self._frames(msg), "out_of_order", reason)

    def replay(self) -> Frame:
        if not self._sent:
            return self.out_of_order()
        old = self._sent[int(self.rng.integers(0, len(self._sent)))]
        return Frame(old, "replay", "replay")

    def send_time(self) -> Frame:
        # an update that claims an impossible send time: clamped and counted against
        # the host (its verdict fails), then refused (it answers no task)
        t = float(self.rng.choice([-1e6, -50.0, 1e6, 1e12]))
        return Frame(self._frames(self._update(), sent_at=t), "send_time", "unknown_task")

    def forged_event(self) -> Frame:
        forged = Event.of(0.0, 0.0, "evaluate", accuracy=0.999)
        return Frame(self._frames(EventBatch(host=self.host, events=(forged,))),
                     "forged_event", "bad_event")

    # -- the stream ------------------------------------------------------------------
    def frames(self, n: int) -> Iterator[Frame]:
        """``n`` hostile frames, the categories in turn (shuffled within each turn)."""
        made = 0
        for _ in itertools.count():
            for name in self.rng.permutation(self.CATEGORIES):
                if made == n:
                    return
                frame: Frame = getattr(self, str(name))()
                # well-formed frames that got in (a flipped one may not decode)
                if frame.reject is None and frame.category in ("out_of_order", "send_time"):
                    self._sent.append(frame.frames)
                    self._sent = self._sent[-50:]
                made += 1
                yield frame



# -- a fuzzing client host: honest clients, hostile frames on the same connection -----------
async def _fuzzing_host(args: Any, sc: Any, data: dict[str, Any],
                        scenario_file: str) -> dict[str, Any]:
    ids = parse_ids(args.ids, sc.data.num_clients)
    keys = client_keys(args.connect, args.keys, args.name, args.insecure)
    zmq_ctx = ZmqContext(max_message_bytes=-1 if sc.deploy.max_message_mb is None
                         else int(sc.deploy.max_message_mb * 1e6))
    conn = zmq_ctx.connect(args.connect, None, keys)  # the server assigns its routing id
    sent: Counter[str] = Counter()
    window: dict[str, float] = {}
    trainer = WorkerHandle(zmq_ctx, ipc_address(f"fuzz-{os.getpid()}", "trainer"),
                           scenario_file, "trainer", ids)
    host = ClientHost(sc, args.name, ids, conn, trainer, fedsim_version=process.fedsim_version(),
                      scenario_hash=scenario_hash(data))

    async def attack() -> None:
        await host.started.wait()
        await asyncio.sleep(args.delay)
        fuzzer = Fuzzer(args.name, ids, _update_spec(host, sc), sc.data.num_clients,
                        host.seq, seed=args.seed)
        window["start"] = time.time()
        print(json.dumps({"fuzz": "start", "time": window["start"]}), flush=True)
        gap = 1.0 / args.rate
        for frame in fuzzer.frames(args.frames):
            await conn.send(frame.frames)
            sent[str(frame.reject)] += 1
            await asyncio.sleep(gap)
        window["end"] = time.time()
        print(json.dumps({"fuzz": "end", "time": window["end"]}), flush=True)

    attacker = asyncio.ensure_future(attack())
    try:
        code = await host.run()
    finally:
        attacker.cancel()
        await trainer.close()
        zmq_ctx.close(linger_ms=500)
    return {"exit": code, "sent": dict(sent), **window}


def _update_spec(host: Any, sc: Any) -> TensorSpec:
    spec: TensorSpec = host.model_spec.repeated(sc.algorithm.spec.update_copies)
    return spec


def main(argv: list[str] | None = None) -> int:
    """``python -m fedsim.testing.fuzz``: a client host whose connection carries hostile frames too.

    Its clients are honest (they train and upload like any host's); after
    ``--delay`` seconds of federation it sends ``--frames`` hostile frames at
    ``--rate`` per second on the same authenticated connection, then prints a
    JSON line with what it sent (counts by the reason each must be rejected
    for) and exits with the host's exit code.
    """
    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("scenario")
    ap.add_argument("--connect", required=True)
    ap.add_argument("--ids", required=True)
    ap.add_argument("--name", required=True)
    ap.add_argument("--keys", default=None)
    ap.add_argument("--insecure", action="store_true")
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--frames", type=int, default=3000)
    ap.add_argument("--rate", type=float, default=500.0)
    ap.add_argument("--delay", type=float, default=2.0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    sc = load(args.scenario, list(args.set))
    data = resolved(sc)
    with tempfile.TemporaryDirectory(prefix="fedsim-fuzz-") as tmp:
        scenario_file = str(Path(tmp) / "scenario.json")
        Path(scenario_file).write_text(json.dumps(data))
        result = asyncio.run(_fuzzing_host(args, sc, data, scenario_file))
    print(json.dumps({"fuzz": "done", **result}), flush=True)
    return int(result["exit"])


if __name__ == "__main__":
    import sys

    sys.exit(main())
