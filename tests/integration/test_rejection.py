"""A running server rejects malformed and hostile messages, logs why, and goes on."""

from __future__ import annotations

import json
import math
from pathlib import Path

import msgpack
import numpy as np
import pytest
import zmq

from fedsim.results.writer import read_events
from fedsim.wire.codec import encode
from fedsim.wire.messages import SCHEMA_VERSION, Update
from fedsim.wire.tensors import Model, TensorSpec

from .conftest import fedsim, finish, wait_for, wait_for_events, write_scenario

pytestmark = pytest.mark.timeout(180)

SHAPES = [(64, 60), (64,), (10, 64), (10,)]


def _update(arrays: list[np.ndarray], client: int = 1) -> list:
    return encode(Update(client=client, task_id=1, base_version=0, round=0, num_samples=10,
                         steps=1, loss=None, model=Model.from_arrays(arrays)))


def test_server_rejects_bad_frames_and_keeps_running(tmp_path: Path) -> None:
    path = write_scenario(tmp_path, """
[algorithm]
name = "fedasync"
concurrency = 4
""")
    out = tmp_path / "run"
    proc = fedsim("run", str(path), "--out", str(out), "--no-progress", "--no-plots",
                  "--set", "run.time_budget=5", "--set", 'deploy.transport="tcp"',
                  "--set", "deploy.max_message_mb=1.0")
    endpoints = wait_for(out / "endpoints.json")
    wait_for_events(out, "aggregate", count=3)
    ctx = zmq.Context()
    try:
        def rogue(frames: list, identity: bytes | None = None) -> None:
            s = ctx.socket(zmq.DEALER)
            if identity is not None:
                s.setsockopt(zmq.ROUTING_ID, identity)
            s.setsockopt(zmq.LINGER, 1000)
            s.connect(endpoints["server"])
            s.send_multipart(frames)
            s.close()

        ok = [np.zeros(s, np.float32) for s in SHAPES]
        old = [msgpack.packb([1, "Update", 0.0, 0]), msgpack.packb([])]
        # each rogue's connection gets a routing id of the server's
        rogue([b"\x00garbage"])                                               # malformed
        rogue(old)                                                            # wrong version
        rogue(_update([np.full(s, np.nan, np.float32) for s in SHAPES]))      # non-finite
        rogue(_update(ok[:2]))                                                # wrong shapes
        rogue(_update([np.zeros(s, np.float64) for s in SHAPES]))             # dtype
        rogue(_update(ok, client=1))                    # a client another host runs
        rogue(_update(ok, client=999), b"host-0")       # a routing id of its own choosing
        # a header over 64 KiB
        rogue([msgpack.packb([SCHEMA_VERSION, "EventBatch", 0.0, 0]), b"\x90" * 100_000])
        big = [np.zeros(400_000, np.float32)]
        rogue(encode(Update(client=1, task_id=1, base_version=0, round=0,
                            num_samples=1, steps=1, loss=None,
                            model=Model.from_flat(big[0], TensorSpec(
                                [("float32", (400_000,))])))))  # over max_message_mb
    finally:
        ctx.term()
    code, _, stderr = finish(proc)
    assert code == 0, stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    rejected = summary["rejected_messages"]["server"]
    assert sum(rejected.values()) >= 8, rejected
    for reason in ("bad_envelope", "wrong_version", "non_finite", "shape_mismatch",
                   "dtype_mismatch", "connection_dropped", "routing_id", "oversize_header"):
        assert rejected.get(reason, 0) >= 1, (reason, rejected)
    assert rejected.get("unknown_client", 0) >= 1, rejected
    events = list(read_events(out / "events.jsonl"))
    rejects = [e for e in events if e["ev"] == "reject"]
    assert all(e["detail"] for e in rejects)
    # the run went on and learned after the garbage
    t_last_reject = max(e["t"] for e in rejects)
    assert any(e["ev"] == "aggregate" and e["t"] > t_last_reject for e in events)
    assert not math.isnan(summary["final_accuracy"])
