"""An insider for tests/integration/test_insider.py: a host using its valid key maliciously.

``python tests/integration/insider_host.py SCENARIO --connect ADDR --ids IDS --name NAME
--keys DIR [--set K=V ...]`` runs client host NAME like ``fedsim clients`` (its
clients train and upload as any host's do), but it lies about every update
(its send time back-dated by ``--backdate`` emulated seconds, its base version
one ahead of its task's, its sample count 10^12), and, ``--delay`` real seconds
after the start, it attacks the server over its own registered connection:

1. hostile frames from :class:`fedsim.testing.fuzz.Fuzzer` whose reasons are known:
   a NaN model, a wrong shape, an impossible send time;
2. oversize frames: an envelope over 64 bytes, headers over their limit (an
   event batch's, an update's), a message whose frames together exceed
   ``deploy.max_message_mb`` (each frame under it, so the connection stays);
3. replays of its own earlier frames;
4. a flood of event batches as fast as it can send them, each of ``--records``
   made-up records of allowed kinds about its own clients (tagged
   ``task_id = MARK``) and one forged evaluation;
5. a flood of clock probes (numbered from ``FLOOD_SEQ``).

While it attacks it holds back its honest event records (sent after), so
that what the server did with each attack can be told from the counts. At
the end it prints one JSON line (``{"insider": ...}``) saying what it sent
and which probes were answered, and exits with the host's exit code.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import msgpack

from fedsim.actors import process
from fedsim.actors.host import ClientHost
from fedsim.actors.server_gate import message_limit
from fedsim.actors.workers import WorkerHandle
from fedsim.deploy.run import client_keys
from fedsim.scenario import load, resolved, scenario_hash
from fedsim.scenario.ids import parse_ids
from fedsim.testing.fuzz import Fuzzer, _update_spec
from fedsim.wire.codec import decode, encode, encode_body, stamp
from fedsim.wire.messages import SCHEMA_VERSION, ClockProbe, Event, EventBatch, Message, Update
from fedsim.wire.transport import ZmqContext, ipc_address

#: the task id every made-up record carries (no task has it)
MARK = 987_654_321
#: the flood's clock probes are numbered from here (the host's own from 1000)
FLOOD_SEQ = 10**6
#: each named hostile frame from the fuzzer, how many, and the reason it must get
FUZZ = (("non_finite", 5, "non_finite"), ("wrong_shape", 5, "shape_mismatch"),
        ("send_time", 5, "unknown_task"))


async def _insider(args: argparse.Namespace, sc: Any, data: dict[str, Any],
                   scenario_file: str) -> dict[str, Any]:
    ids = parse_ids(args.ids, sc.data.num_clients)
    keys = client_keys(args.connect, args.keys, args.name, False)
    zmq_ctx = ZmqContext(max_message_bytes=-1)
    conn = zmq_ctx.connect(args.connect, None, keys)  # the server assigns its routing id
    trainer = WorkerHandle(zmq_ctx, ipc_address(f"insider-{os.getpid()}", "trainer"),
                           scenario_file, "trainer", ids)
    host = ClientHost(sc, args.name, ids, conn, trainer, fedsim_version=process.fedsim_version(),
                      scenario_hash=scenario_hash(data))
    report: dict[str, Any] = {"sent": Counter(), "honest_records": 0, "lied_updates": 0,
                              "flood_answered": 0, "prober": {}, "prober_answered": []}
    attacking = asyncio.Event()

    # -- the lies on every update ------------------------------------------------------
    async def lying_forward(update: list[Any], client: int) -> None:
        msg, _ = decode(update, check_finite=False)
        assert isinstance(msg, Update)
        forged = replace(msg, base_version=msg.base_version + 1, num_samples=10**12)
        sent_at = host.clock.now() - args.backdate
        frames = stamp(encode_body(forged), sent_at=sent_at, seq=next(host.seq))
        await host.conn.send(frames)
        report["lied_updates"] += 1
        host.emit("send", client=msg.client, kind="update", dir="up",
                  bytes=sum(memoryview(f).nbytes for f in frames), sent_at=sent_at)

    host.forward = lying_forward  # type: ignore[method-assign]

    # -- what the host itself sends: its records held back while it attacks, counted --
    honest_flush = host.outbox.flush

    async def flush_unless_attacking() -> None:
        if not attacking.is_set():
            await honest_flush()

    host.outbox.flush = flush_unless_attacking  # type: ignore[method-assign]
    honest_control = host._control

    async def counted_control(msg: Message) -> None:
        if isinstance(msg, EventBatch):
            report["honest_records"] += len(msg.events)
        elif isinstance(msg, ClockProbe) and host.started.is_set():
            report["prober"][msg.seq] = time.time()
        await honest_control(msg)

    host._control = counted_control  # type: ignore[method-assign]
    sample = host.server_clock.sample

    def counted_sample(reply: Any) -> None:
        if reply.seq >= FLOOD_SEQ:
            report["flood_answered"] += 1
        else:
            report["prober_answered"].append(reply.seq)
        sample(reply)

    host.server_clock.sample = counted_sample  # type: ignore[method-assign]

    # -- the attack on its own connection --------------------------------------------
    async def send(frames: list[Any], what: str) -> None:
        await conn.send(frames)
        report["sent"][what] += 1

    def raw(kind: str, header: bytes, *buffers: bytes) -> list[Any]:
        env = msgpack.packb([SCHEMA_VERSION, kind, 0.0, next(host.seq)])
        return [env, header, *buffers]

    async def attack() -> None:
        await host.started.wait()
        await asyncio.sleep(args.delay)
        attacking.set()
        report["start"] = time.time()
        spec = _update_spec(host, sc)
        fuzzer = Fuzzer(args.name, ids, spec, sc.data.num_clients, host.seq, seed=7)
        for category, n, reason in FUZZ:
            for _ in range(n):
                frame = getattr(fuzzer, category)()
                assert frame.reject == reason, (category, frame.reject)
                await send(frame.frames, reason)
                await asyncio.sleep(0.02)
        # oversize frames, each refused before anything is unpacked
        limit = message_limit(sc, host.model_spec, max(sc.algorithm.spec.task_copies,
                                                       sc.algorithm.spec.update_copies))
        big_header = b"\x90" * 200_000
        replayable: list[list[Any]] = []
        for _ in range(args.oversize):
            await send([b"\x94" + b"\xc0" * 100, b"\x90"], "oversize_envelope")
            frames = raw("EventBatch", big_header)
            replayable.append(frames)
            await send(frames, "oversize_header")
            await send(raw("Update", big_header), "oversize_header")
            part = b"\0" * (limit // 2 + 1000)
            await send(raw("Update", b"\x90", part, part), "oversize")
            await asyncio.sleep(0.02)
        for frames in replayable:
            await send(frames, "replay")
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.5)
        # a flood of made-up records (and a forged evaluation in each batch), as fast as
        # the connection takes them
        real = host.clock.real() - host.clock.epoch
        per = max(1, args.records // len(ids))
        events = tuple(Event.of(host.clock.now(), real, "train_start", client=c, task_id=MARK)
                       for c in ids for _ in range(per))
        forged = Event.of(host.clock.now(), real, "evaluate", accuracy=0.999)
        body = encode_body(EventBatch(host=args.name, events=(*events, forged)))
        report["records_per_batch"] = len(events) + 1
        report["madeup_per_batch"] = len(events)
        for i in range(args.batches):
            await send(stamp(body, sent_at=0.0, seq=next(host.seq)), "record_batch")
            if i % 50 == 49:
                await asyncio.sleep(0.005)
        await asyncio.sleep(1.0)
        # a flood of clock probes
        report["flood_start"] = time.time()
        for i in range(args.probes):
            probe = ClockProbe(seq=FLOOD_SEQ + i, t_sent=host.real_clock())
            await send(encode(probe, seq=next(host.seq)), "probe")
            if i % 50 == 49:
                await asyncio.sleep(0.005)
        report["flood_end"] = time.time()
        await asyncio.sleep(1.5)  # the replies come in, the host's budget recovers
        report["end"] = time.time()
        attacking.clear()

    attacker = asyncio.ensure_future(attack())
    try:
        code = await host.run()
    finally:
        attacker.cancel()
        await trainer.close()
        zmq_ctx.close(linger_ms=500)
    # the host's own probes sent while it attacked, and those of them answered
    start, end = report.get("start", 0.0), report.get("end", 0.0) + 1.0
    window = {s for s, t in report.pop("prober").items() if start <= t <= end}
    report["prober_in_window"] = len(window)
    report["prober_unanswered"] = len(window - set(report.pop("prober_answered")))
    report["sent"] = dict(report["sent"])
    return {"exit": code, **report}


def main(argv: list[str] | None = None) -> int:
    """Run the insider host; print what it sent as one JSON line."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("scenario")
    ap.add_argument("--connect", required=True)
    ap.add_argument("--ids", required=True)
    ap.add_argument("--name", required=True)
    ap.add_argument("--keys", required=True)
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--backdate", type=float, default=0.3)
    ap.add_argument("--delay", type=float, default=2.0)
    ap.add_argument("--oversize", type=int, default=10)
    ap.add_argument("--records", type=int, default=200)
    ap.add_argument("--batches", type=int, default=800)
    ap.add_argument("--probes", type=int, default=3000)
    args = ap.parse_args(argv)
    sc = load(args.scenario, list(args.set))
    data = resolved(sc)
    with tempfile.TemporaryDirectory(prefix="fedsim-insider-") as tmp:
        scenario_file = str(Path(tmp) / "scenario.json")
        Path(scenario_file).write_text(json.dumps(data))
        result = process.run_loop(_insider(args, sc, data, scenario_file), sc.deploy.loop)
    print(json.dumps({"insider": result}), flush=True)
    return int(result["exit"])


if __name__ == "__main__":
    sys.exit(main())
