"""A running server rejects malformed messages, logs why, and goes on."""

from __future__ import annotations

import json
import math
from pathlib import Path

import msgpack
import numpy as np
import pytest
import zmq

from fedsim import wire
from fedsim.metrics import read_events

from .conftest import fedsim, finish, wait_for, wait_for_events, write_scenario

pytestmark = pytest.mark.timeout(180)


def test_server_rejects_bad_frames_and_keeps_running(tmp_path: Path) -> None:
    path = write_scenario(tmp_path, """
[algorithm]
name = "fedasync"
concurrency = 4
[deploy]
transport = "tcp"
max_message_mb = 1.0
""".replace("[deploy]\n", "").replace('transport = "tcp"\nmax_message_mb = 1.0\n', ""))
    out = tmp_path / "run"
    proc = fedsim("run", str(path), "--out", str(out), "--no-progress",
                  "--set", "run.time_budget=5", "--set", 'deploy.transport="tcp"',
                  "--set", "deploy.max_message_mb=1.0")
    endpoints = wait_for(out / "endpoints.json")
    wait_for_events(out, "aggregate", count=3)
    ctx = zmq.Context()
    good_shapes = [(64, 60), (64,), (10, 64), (10,)]
    try:
        def rogue(identity: bytes, frames: list) -> None:
            s = ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.ROUTING_ID, identity)
            s.setsockopt(zmq.LINGER, 1000)
            s.connect(endpoints["data"])
            s.send_multipart(frames)
            s.close()

        def update(tensors: tuple, client: int = 1) -> list:
            return wire.encode(wire.Update(client=client, task_id=1, base_version=0, round=0,
                                           num_samples=10, tensors=tensors, stats={}))

        ok = tuple(np.zeros(s, np.float32) for s in good_shapes)
        bad_nan = tuple(np.full(s, np.nan, np.float32) for s in good_shapes)
        header = msgpack.packb({"v": 99, "kind": "heartbeat", "sent_at": 0.0, "seq": 0,
                                "body": {"sender": 1, "status": "ready", "info": {}},
                                "tensors": []})
        # Each rogue has its own routing id: libzmq ignores a second peer that
        # reuses a connected client's id (ROUTER_HANDOVER off), which is itself
        # a defence; identities the server does not know are rejected after
        # decoding, so each bad message below is counted under its own reason.
        rogue(b"r1", [b"\x00garbage"])                                   # malformed
        rogue(b"r2", [header])                                            # wrong version
        rogue(b"r3", update(bad_nan))                                     # non-finite
        rogue(b"r4", update(ok[:2]))                                      # wrong shapes
        rogue(b"r5", update(tuple(np.zeros(s, np.float64) for s in good_shapes)))  # dtype
        rogue(b"c999", update(ok, client=999))                            # unknown sender
        rogue(b"r6", update(ok))                                          # unknown sender
        big = tuple(np.zeros(s, np.float32) for s in [(400_000,)])
        rogue(b"r7", wire.encode(wire.Update(client=1, task_id=1, base_version=0, round=0,
                                             num_samples=1, tensors=big, stats={})))  # oversize
    finally:
        ctx.term()
    code, _, stderr = finish(proc)
    assert code == 0, stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    rejected = summary["rejected_messages"]["server"]
    assert sum(rejected.values()) >= 8, rejected
    for reason in ("bad_header", "wrong_version", "non_finite", "shape_mismatch",
                   "dtype_mismatch", "oversize"):
        assert rejected.get(reason, 0) >= 1, (reason, rejected)
    assert rejected.get("bad_field", 0) >= 2  # two unknown senders
    events = list(read_events(out / "events.jsonl"))
    rejects = [e for e in events if e["ev"] == "reject"]
    assert all(e["detail"] for e in rejects)
    # the run went on and learned after the garbage
    t_last_reject = max(e["t"] for e in rejects)
    assert any(e["ev"] == "aggregate" and e["t"] > t_last_reject for e in events)
    assert not math.isnan(summary["final_accuracy"])
