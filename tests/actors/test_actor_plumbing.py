"""Process plumbing of the actors, without processes.

* :class:`fedsim.actors.workers.WorkerHandle` matches replies to requests
  by id: here its PAIR socket is one end of an in-memory pair and its
  "process" a stand-in, so a scripted worker on the other end can answer
  out of order or with an id nobody asked for.
* :func:`fedsim.actors.process.run_loop` falls back from uvloop to asyncio
  only when uvloop cannot be imported: a coroutine is never run twice.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import types
from typing import Any

import numpy as np
import pytest

from fedsim.actors import process
from fedsim.actors.workers import WorkerHandle
from fedsim.testing.memory_network import MemoryConnection, MemoryNetwork
from fedsim.testing.virtual_time import run_virtual
from fedsim.wire.codec import decode, encode
from fedsim.wire.messages import Evaluate, Evaluated, Shutdown, WorkerReady
from fedsim.wire.tensors import Model, TensorSpec

pytestmark = pytest.mark.timeout(60)

SPEC = TensorSpec([("float32", (4,))])


class _PairContext:
    """Stands in for a ZmqContext: ``pair()`` gives the parent's end of an in-memory pair."""

    def __init__(self) -> None:
        self.net = MemoryNetwork()
        self.worker_end: MemoryConnection | None = None

    def pair(self, address: str, *, bind: bool) -> MemoryConnection:
        parent, self.worker_end = self.net.pair(address)
        return parent


class _Process:
    """Stands in for an asyncio subprocess: it exits when told to."""

    def __init__(self) -> None:
        self.returncode: int | None = None
        self._exited = asyncio.Event()

    async def wait(self) -> int | None:
        await self._exited.wait()
        return self.returncode

    def exit(self, code: int) -> None:
        self.returncode = code
        self._exited.set()

    def kill(self) -> None:
        self.exit(-9)


def _evaluated(request_id: int, version: int) -> list[Any]:
    return encode(Evaluated(request_id=request_id, version=version, loss=0.5,
                            accuracy=version / 10, seconds=0.0))


def test_worker_replies_are_matched_by_request_id(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    ctx = _PairContext()
    proc = _Process()
    spawned: list[tuple[Any, ...]] = []

    async def spawn(*args: Any, **kwargs: Any) -> _Process:
        spawned.append(args)
        return proc

    monkeypatch.setattr(asyncio, "create_subprocess_exec", spawn)
    model = Model.from_flat(np.zeros(4, np.float32), SPEC)

    async def worker() -> list[int]:
        """Answer the first two requests in reverse order, then a stray reply, then in order."""
        end = ctx.worker_end
        assert end is not None
        seen: list[int] = []
        await end.send(encode(WorkerReady(samples=(), spec=SPEC)))
        first = [decode(await end.recv(), check_finite=False)[0] for _ in range(2)]
        seen += [m.request_id for m in first]
        for m in reversed(first):
            await end.send(_evaluated(m.request_id, m.version))
        await end.send(_evaluated(999, 99))  # a reply to no request
        while True:
            msg, _ = decode(await end.recv(), check_finite=False)
            if isinstance(msg, Shutdown):
                proc.exit(0)
                return seen
            seen.append(msg.request_id)
            await end.send(_evaluated(msg.request_id, msg.version))

    async def main() -> tuple[list[Any], Any, list[int]]:
        handle = WorkerHandle(ctx, "mem://worker", "scenario.json", "evaluator")  # type: ignore[arg-type]
        serving = asyncio.create_task(worker())
        ready = await handle.start()
        assert isinstance(ready, WorkerReady)
        asks = [Evaluate(request_id=handle.next_id(), version=v, model=model) for v in (1, 2)]
        replies = await asyncio.gather(*(handle.request(m) for m in asks))
        assert handle.pending() == 0
        # the stray reply was dropped; the next request still gets its own answer
        third = await handle.request(Evaluate(request_id=handle.next_id(), version=3,
                                              model=model))
        await handle.close()
        return replies, third, await serving

    with caplog.at_level(logging.WARNING, logger="fedsim.actors.workers"):
        replies, third, seen = run_virtual(main())
    assert len(spawned) == 1
    assert seen == [1, 2, 3]
    assert [(r.request_id, r.version) for r in replies] == [(1, 1), (2, 2)]
    assert (third.request_id, third.version) == (3, 3)
    stray = [r for r in caplog.records if "reply to no request" in r.getMessage()]
    assert len(stray) == 1
    assert "Evaluated" in stray[0].getMessage()
    assert proc.returncode == 0


def test_a_request_id_already_pending_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = _PairContext()
    model = Model.from_flat(np.zeros(4, np.float32), SPEC)

    async def main() -> str:
        handle = WorkerHandle(ctx, "mem://worker", "scenario.json", "trainer")  # type: ignore[arg-type]
        first = asyncio.create_task(handle.request(Evaluate(request_id=7, version=0,
                                                            model=model)))
        await asyncio.sleep(0)
        try:
            await handle.request(Evaluate(request_id=7, version=1, model=model))
        except ValueError as exc:
            return str(exc)
        finally:
            first.cancel()
        return "accepted"

    assert "already pending" in run_virtual(main())


# -- uvloop fallback -------------------------------------------------------------------


def test_run_loop_without_uvloop_runs_the_coroutine_once_on_asyncio(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop -> ImportError
    runs: list[bool] = []

    async def work() -> str:
        runs.append(isinstance(asyncio.get_running_loop(), asyncio.BaseEventLoop))
        return "done"

    assert process.run_loop(work(), "uvloop") == "done"
    assert runs == [True]


def _fake_uvloop(monkeypatch: pytest.MonkeyPatch, *, fail_after: bool = False) -> list[int]:
    """Install a uvloop whose ``run`` runs the coroutine on asyncio (and may then fail)."""
    calls: list[int] = []
    module = types.ModuleType("uvloop")

    def run(coro: Any) -> Any:
        calls.append(1)
        result = asyncio.run(coro)
        if fail_after:
            raise RuntimeError("uvloop broke after the coroutine ran")
        return result

    module.run = run  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "uvloop", module)
    return calls


def test_an_import_error_inside_the_coroutine_is_not_a_missing_uvloop(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _fake_uvloop(monkeypatch)
    runs: list[int] = []

    async def work() -> None:
        runs.append(1)
        raise ImportError("a module the work needs is missing")

    with pytest.raises(ImportError, match="the work needs"):
        process.run_loop(work(), "uvloop")
    assert calls == [1]
    assert runs == [1]


def test_a_uvloop_failure_after_the_coroutine_ran_does_not_run_it_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _fake_uvloop(monkeypatch, fail_after=True)
    runs: list[int] = []

    async def work() -> int:
        runs.append(1)
        return 1

    with pytest.raises(RuntimeError, match="uvloop broke"):
        process.run_loop(work(), "uvloop")
    assert calls == [1]
    assert runs == [1]


def test_run_loop_on_the_real_uvloop_runs_the_coroutine_once() -> None:
    uvloop = pytest.importorskip("uvloop")
    runs: list[str] = []

    async def work() -> int:
        runs.append(type(asyncio.get_running_loop()).__module__)
        raise ImportError("inside the work")

    with pytest.raises(ImportError, match="inside the work"):
        process.run_loop(work(), "uvloop")
    assert len(runs) == 1
    assert runs[0].startswith(uvloop.__name__)


def _policies(env: dict[str, str]) -> list[str]:
    import os
    import subprocess

    code = (
        "import contextlib, os\n"
        "with contextlib.suppress(OSError):  # as a run starts: in the normal class\n"
        "    os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))\n"
        "from fedsim.actors import process\n"
        "name = {os.SCHED_OTHER: 'other', os.SCHED_IDLE: 'idle'}\n"
        "print(process.set_up_in_background(), name[os.sched_getscheduler(0)])\n"
        "import threading, time\n"
        "t = threading.Thread(target=time.sleep, args=(5,), daemon=True)  # a ZeroMQ I/O thread\n"
        "t.start()\n"
        "process.to_foreground()\n"
        "print(name[os.sched_getscheduler(0)], name[os.sched_getscheduler(t.native_id)])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, **env}, check=True, timeout=60)
    return out.stdout.split()


@pytest.mark.skipif(not hasattr(__import__("os"), "SCHED_IDLE"), reason="Linux only")
def test_a_sweeps_run_sets_up_in_the_idle_class_and_keeps_time_in_the_normal_one() -> None:
    """Under FEDSIM_SETUP_IDLE=1 (a sweep's runs) the set-up runs under SCHED_IDLE,
    so that neighbours' trainers are not starved, and the loops return to the normal
    class; without it (or where the process could not return) nothing changes."""
    if process.can_leave_idle():
        assert _policies({process.SETUP_IDLE_ENV: "1"}) == ["True", "idle", "other", "other"]
    else:
        assert _policies({process.SETUP_IDLE_ENV: "1"}) == ["False", "other", "other", "other"]
    assert _policies({process.SETUP_IDLE_ENV: "0"}) == ["False", "other", "other", "other"]
