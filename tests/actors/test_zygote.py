"""The zygote forks torch workers that behave as spawned ones, and reports their ends.

Real processes: a zygote started as ``fedsim run`` starts it, workers forked
from it over real ZeroMQ PAIR sockets, compared with a worker started from
scratch on the same request.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedsim.actors.workers import WorkerDied, WorkerHandle
from fedsim.actors.zygote import Zygote, spawn
from fedsim.scenario import parse, resolved
from fedsim.wire.codec import decode, encode
from fedsim.wire.messages import Evaluate, Task, Trained, Update
from fedsim.wire.tensors import Model
from fedsim.wire.transport import ZmqContext, ipc_address

SCENARIO = {
    "name": "zygote", "seed": 3,
    "data": {"dataset": "synthetic", "num_clients": 6},
    "model": {"name": "mlp", "hidden": [16]},
    "algorithm": {"name": "fedavg"},
    "client": {"local_steps": 4, "lr": 0.05},
    "run": {"max_rounds": 1},
}


def _write(tmp: Path, raw: dict[str, object]) -> str:
    path = tmp / "scenario.json"
    path.write_text(json.dumps(resolved(parse(raw, "test"))))
    return str(path)


def _name() -> str:
    return f"fedsim-test-{os.getpid()}-{time.monotonic_ns()}"


@pytest.fixture
def zygote(tmp_path: Path):  # type: ignore[no-untyped-def]
    z = Zygote.start(_name(), _write(tmp_path, SCENARIO))
    yield z
    z.close()


def _train(rid: int, x0: np.ndarray, spec: object) -> list[Any]:
    task = Task(client=2, task_id=7, version=0, round=0, work=None,
                model=Model.from_flat(x0, spec))  # type: ignore[arg-type]
    return encode(task, sent_at=0.0, seq=rid)


async def _trained(handle: WorkerHandle, x0: np.ndarray | None = None
                   ) -> tuple[Trained, Update, object]:
    ready = await handle.start()
    if x0 is None:
        x0 = np.zeros(ready.spec.nbytes // 4, dtype=np.float32) + 0.01
    rid = handle.next_id()
    reply = await handle.train(_train(rid, x0, ready.spec))
    assert isinstance(reply, Trained)
    frames = handle.upload(rid)
    assert frames is not None
    upload, _ = decode(frames)
    assert isinstance(upload, Update)
    return reply, upload, ready


def test_a_forked_trainer_answers_as_a_spawned_one_and_its_exit_is_reported(
        zygote: Zygote, tmp_path: Path) -> None:
    async def main() -> None:
        shape = await zygote.describe()
        assert shape["input_shape"] == [60]
        assert shape["num_classes"] == 10
        assert shape["stats"]["num_clients"] == 6
        ctx = ZmqContext()
        run = f"zt{os.getpid()}"
        forked = WorkerHandle(ctx, ipc_address(run, "f"), "", "trainer", [0, 2], zygote=zygote.name)
        spawned = WorkerHandle(ctx, ipc_address(run, "s"), str(tmp_path / "scenario.json"),
                               "trainer", [0, 2])
        try:
            a, up_a, ready_a = await _trained(forked)
            b, up_b, ready_b = await _trained(spawned)
            assert ready_a.samples == ready_b.samples      # the same shards
            assert ready_a.spec.nbytes == ready_b.spec.nbytes
            assert forked.proc is not None
            assert forked.proc.pid != zygote.proc.pid
            assert a.steps == b.steps == 4
            assert a.loss == b.loss
            assert a.upload
            assert b.upload
            assert np.array_equal(up_a.model.flat(), up_b.model.flat())  # bit for bit
        finally:
            await forked.close()
            await spawned.close()
            ctx.close(linger_ms=0)
        assert forked.returncode == 0                  # a Shutdown ends it cleanly
        assert spawned.returncode == 0

    asyncio.run(main())


def test_a_killed_worker_is_reported_and_its_pending_requests_fail(zygote: Zygote) -> None:
    async def main() -> None:
        ctx = ZmqContext()
        h = WorkerHandle(ctx, ipc_address(f"zk{os.getpid()}", "e"), "", "evaluator",
                         zygote=zygote.name)
        try:
            ready = await h.start()
            assert h.proc is not None
            os.kill(h.proc.pid, signal.SIGKILL)
            x0 = np.zeros(ready.spec.nbytes // 4, dtype=np.float32)
            with pytest.raises(WorkerDied):
                await asyncio.wait_for(h.request(Evaluate(
                    request_id=h.next_id(), version=0, model=Model.from_flat(x0, ready.spec))),
                    30)
            assert h.returncode == -signal.SIGKILL
        finally:
            await h.close()
            ctx.close(linger_ms=0)

    asyncio.run(main())


def test_the_zygote_kills_the_worker_of_a_requester_that_went_away(zygote: Zygote) -> None:
    async def main() -> int:
        proc = await spawn(zygote.name, "evaluator", ipc_address(f"zg{os.getpid()}", "x"), [])
        proc._writer.close()         # the requester's end of the connection: as if it died
        return proc.pid

    pid = asyncio.run(main())
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"worker {pid} outlived its requester")


async def _gone(pid: int, within: float = 30.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        await asyncio.sleep(0.05)
    return False


def test_workers_die_with_the_zygote(zygote: Zygote) -> None:
    async def main() -> None:
        ctx = ZmqContext()
        h = WorkerHandle(ctx, ipc_address(f"zd{os.getpid()}", "e"), "", "evaluator",
                         zygote=zygote.name)
        try:
            await h.start()
            assert h.proc is not None
            zygote.proc.kill()
            code = await asyncio.wait_for(h.proc.wait(), 30)
            assert code == -signal.SIGKILL
            await asyncio.wait_for(h.died.wait(), 30)
            assert await _gone(h.proc.pid)             # not left running
        finally:
            await h.close()
            ctx.close(linger_ms=0)

    asyncio.run(main())


def test_data_the_zygote_cannot_build_is_the_users_error(tmp_path: Path) -> None:
    # a directory without the MNIST files: a path that is not there is refused on load
    (tmp_path / "missing").mkdir()
    raw = {**SCENARIO, "data": {"dataset": "mnist", "num_clients": 4, "partition": "iid",
                                "path": str(tmp_path / "missing")}}
    z = Zygote.start(_name(), _write(tmp_path, raw))
    try:
        with pytest.raises(FileNotFoundError, match="missing"):
            asyncio.run(z.describe())

        async def spawn_one() -> None:
            ctx = ZmqContext()
            h = WorkerHandle(ctx, ipc_address(f"zb{os.getpid()}", "t"), "", "trainer", [0],
                             zygote=z.name)
            try:
                with pytest.raises(WorkerDied, match="missing"):
                    await h.start()
            finally:
                await h.close()
                ctx.close(linger_ms=0)

        asyncio.run(spawn_one())
    finally:
        z.close()
    assert z.proc.returncode is not None


def test_a_zygote_that_exits_before_it_is_ready_is_reported_at_once() -> None:
    import subprocess
    import sys

    z = Zygote(_name(), subprocess.Popen([sys.executable, "-c", "raise SystemExit(4)"]))
    try:
        t0 = time.monotonic()
        with pytest.raises(RuntimeError, match="exited with 4"):
            asyncio.run(z.describe())
        assert time.monotonic() - t0 < 30     # not the minute-long connect wait
    finally:
        z.close()


def test_a_scenario_the_zygote_cannot_read_is_reported(tmp_path: Path) -> None:
    z = Zygote.start(_name(), str(tmp_path / "no-such-scenario.json"))
    try:
        with pytest.raises(FileNotFoundError, match="no-such-scenario"):
            asyncio.run(z.describe())
    finally:
        z.close()
