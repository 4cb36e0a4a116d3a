"""Process plumbing shared by the client hosts and the torch workers."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import logging
import os
import resource
import signal
import sys
from collections.abc import Coroutine
from importlib import metadata
from typing import Any, NoReturn, TypeVar

from fedsim.errors import DeployError
from netem.libc import libc

T = TypeVar("T")
log = logging.getLogger(__name__)

__all__ = [
    "become_child",
    "configure_child_logging",
    "die_with_parent",
    "fedsim_version",
    "freeze_heap",
    "ignore_sigint",
    "process_age",
    "run_loop",
    "set_process_name",
    "set_up_in_background",
    "terminated",
    "thaw_heap",
    "to_foreground",
    "yield_cpu_to_loops",
]

_PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int | None = None) -> bool:
    """Ask the kernel to SIGTERM this process when its parent dies (Linux).

    A crashed or killed parent then leaves no orphan behind. Returns False
    when the parent is already gone (the caller, a process's main, ends).
    """
    c = libc()
    if c is not None:
        with contextlib.suppress(OSError, AttributeError):
            c.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    return parent_pid is None or os.getppid() == parent_pid


_PR_SET_NAME = 15


def set_process_name(name: str) -> None:
    """Name this process for ``top`` and ``ps -o comm`` (Linux; 15 bytes).

    A worker forked from the zygote keeps the command line of the process
    it was forked from (``fedsim run ...``); its name says what it is.
    """
    c = libc()
    if c is not None:
        with contextlib.suppress(OSError, AttributeError):
            c.prctl(_PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)


def terminated(*_: object) -> NoReturn:
    """The SIGTERM handler of fedsim's child processes: unwind (finally
    blocks run) to the process's own exit (a main, or a fork's ``os._exit``)."""
    raise SystemExit(0)


def become_child(parent_pid: int | None, name: str) -> bool:
    """What every process fedsim starts does first: die with ``parent_pid``,
    leave Ctrl-C to it, end cleanly on SIGTERM, and log under ``name``.
    False when the parent is already gone (the process's main then ends)."""
    if not die_with_parent(parent_pid):
        return False
    ignore_sigint()
    signal.signal(signal.SIGTERM, terminated)
    configure_child_logging(name)
    return True


def ignore_sigint() -> None:
    """Children leave Ctrl-C to the parent, which shuts them down in order."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def configure_child_logging(name: str) -> None:
    """Log warnings and errors of a child process to stderr with its name.

    Replaces any configuration already there: a worker forked from the
    zygote inherits the zygote's, and logs under its own name.
    """
    level = os.environ.get("FEDSIM_LOG", "WARNING").upper()
    logging.basicConfig(
        level=getattr(logging, level, logging.WARNING),
        format=f"%(asctime)s {name} %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr, force=True,
    )


def freeze_heap() -> None:
    """Keep every object alive now out of the cyclic garbage collector's passes.

    A full collection walks every object the process tracks, and stops the
    event loop while it does: measured here (``python tools/bench_scale.py``
    scenario, 1,000 clients, load average 1-4), 100-560 ms in the server
    (which imported torch) and 56-110 ms in a client host, each pause felt
    by every timer due during it as lateness, and by a trainer as compute
    overrun. What exists when a federation starts (modules, torch, the data,
    the client actors) lives to its end anyway: ``gc.freeze`` moves it to a
    generation no collection visits, so a collection during the run walks
    only what the run made, and pages shared with forked children stay
    shared (the collector no longer writes to them). Cyclic garbage that
    exists at the call stays until :func:`thaw_heap`.
    """
    gc.freeze()


def thaw_heap() -> None:
    """Hand the frozen objects back to the collector (a process that runs
    several federations, a notebook, leaks nothing)."""
    gc.unfreeze()


def yield_cpu_to_loops() -> str:
    """Run this (torch) process under SCHED_IDLE so event loops preempt it.

    Measured here with two busy processes beside an event loop's timer heap:
    lateness p99 was 4.2 ms at equal priority, 7.6 ms with the busy ones at
    nice 10, and 0.30 ms with them under SCHED_IDLE, which the kernel
    preempts as soon as a normal task wakes. ``FEDSIM_WORKER_SCHED`` picks
    ``idle`` (default), ``batch`` or ``normal``. Returns the policy applied.
    """
    choice = os.environ.get("FEDSIM_WORKER_SCHED", "idle")
    policies = {"idle": "SCHED_IDLE", "batch": "SCHED_BATCH"}
    name = policies.get(choice)
    if name is None or not hasattr(os, name):
        return "normal"
    try:
        os.sched_setscheduler(0, getattr(os, name), os.sched_param(0))
    except OSError:
        return "normal"
    return choice


#: Set (to "1") by ``fedsim sweep`` for its runs: see :func:`set_up_in_background`.
SETUP_IDLE_ENV = "FEDSIM_SETUP_IDLE"


def can_leave_idle() -> bool:
    """Whether this process could return from SCHED_IDLE to SCHED_OTHER at its nice
    value (root, or an RLIMIT_NICE that allows it: sched(7))."""
    if not hasattr(os, "SCHED_IDLE"):
        return False
    if os.geteuid() == 0:
        return True
    soft = resource.getrlimit(resource.RLIMIT_NICE)[0]
    return soft == resource.RLIM_INFINITY or 20 - soft <= os.getpriority(os.PRIO_PROCESS, 0)


def set_up_in_background() -> bool:
    """Under ``FEDSIM_SETUP_IDLE=1``, run this process (and what it starts) under
    SCHED_IDLE until :func:`to_foreground`; whether it did.

    A run's set-up (imports, data, processes) is CPU at normal priority, and
    a sweep starts a run beside runs already going: their trainers, under
    SCHED_IDLE, got no CPU while it lasted (measured in a sweep of FS-1 at
    dilation 4: every compute overrun of three runs fell in the 0.1-0.7 s
    before a neighbour's clock started, 5-56 emulated ms each, and failed
    their verdicts). A set-up in the idle class shares the CPU with those
    trainers instead. Only where the process may come back to normal
    priority (root, or RLIMIT_NICE): an event loop left in the idle class
    would be unfaithful.
    """
    if os.environ.get(SETUP_IDLE_ENV) != "1" or not can_leave_idle():
        return False
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except OSError:
        return False
    return True


def to_foreground() -> None:
    """Leave the idle class :func:`set_up_in_background` entered (a no-op otherwise):
    an event loop about to keep emulated time.

    Every thread of the process leaves it: a thread inherits its creator's
    class, and the ZeroMQ I/O thread, which carries each message, is made
    during the set-up.
    """
    if not hasattr(os, "SCHED_IDLE") or os.sched_getscheduler(0) != os.SCHED_IDLE:
        return
    if os.environ.get(SETUP_IDLE_ENV) != "1":
        return
    exc = _out_of_idle(os.getpid())
    if exc is not None:   # can_leave_idle said it could: say so loudly
        log.error("could not leave SCHED_IDLE after the set-up (%s): timing will suffer", exc)


def _out_of_idle(pid: int) -> OSError | None:
    """Move every thread of ``pid`` in the idle class back to SCHED_OTHER (a
    thread inherits its creator's class); the error that stopped it, if one did."""
    for tid in thread_ids(pid):
        try:
            if os.sched_getscheduler(tid) == os.SCHED_IDLE:
                os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
        except ProcessLookupError:   # a thread that just ended
            continue
        except OSError as exc:
            return exc
    return None


def cpu_placement(hosts: int) -> tuple[set[int], list[int]]:
    """``deploy.pin_trainers``: (the CPUs for everything but the trainers, one CPU
    per client host's trainer), from this process's usable CPUs.

    The trainers take the last ``hosts`` CPUs. Raises :class:`~fedsim.errors.DeployError`
    unless at least one CPU is left for the rest.
    """
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) <= hosts:
        raise DeployError(
            f"deploy.pin_trainers: {hosts} client host(s) need {hosts + 1} usable CPUs "
            f"(a trainer's each, one for the rest); this process may use {len(cpus)} "
            f"({', '.join(map(str, cpus))}): set deploy.hosts below {len(cpus)} or "
            "deploy.pin_trainers = false")
    return set(cpus[:len(cpus) - hosts]), cpus[len(cpus) - hosts:]


def thread_ids(pid: int) -> list[int]:
    """The ids of process ``pid``'s threads (Linux ``/proc``), its main thread's
    (``pid``) among them: a scheduling call on a pid changes only that thread."""
    return [int(t) for t in os.listdir(f"/proc/{pid}/task")]


def pin_process(pid: int, cpus: set[int]) -> None:
    """Restrict every thread of process ``pid`` (its ZeroMQ I/O thread too, which
    carries each of its messages) to ``cpus``; threads it starts later inherit it."""
    for tid in thread_ids(pid):
        with contextlib.suppress(ProcessLookupError):   # a thread that just ended
            os.sched_setaffinity(tid, cpus)


def own_cpus(pid: int, cpus: set[int]) -> None:
    """Give worker ``pid`` the ``cpus`` nothing else uses (``deploy.pin_trainers``):
    every thread confined to them and, where this process may (root, or
    RLIMIT_NICE), out of the idle class.

    The idle class is how a worker yields to the event loops beside it
    (:func:`yield_cpu_to_loops`); on a CPU of its own there are none, and
    it would only cost: the kernel places a waking task preferably on a CPU
    that runs nothing but idle-class work, which then preempts the trainer.
    """
    pin_process(pid, cpus)
    if not hasattr(os, "SCHED_IDLE"):
        return
    if not can_leave_idle():
        log.warning("deploy.pin_trainers: the trainer stays in the idle class (leaving it "
                    "needs root or an RLIMIT_NICE that allows it); the kernel may put "
                    "other work on its CPU first")
        return
    exc = _out_of_idle(pid)
    if exc is not None:   # a container's seccomp, say: pinned, but idle-class
        log.warning("deploy.pin_trainers: the trainer stays in the idle class (%s)", exc)


def process_age() -> float | None:
    """Real seconds since this process was started (Linux ``/proc``; 10 ms resolution).

    The interpreter's own start-up and imports count: this is what a user
    waits for from the command to the run.
    """
    try:
        with open("/proc/self/stat") as fh:
            ticks = int(fh.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime
        with open("/proc/uptime") as fh:
            uptime = float(fh.read().split()[0])
        return max(0.0, uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


def fedsim_version() -> str:
    """The installed fedsim version (hosts refuse to join a server with another)."""
    try:
        return metadata.version("fedsim")
    except metadata.PackageNotFoundError:
        return "0+unknown"


def run_loop(coro: Coroutine[Any, Any, T], kind: str) -> T:
    """Run ``coro`` to completion on a uvloop (``kind = "uvloop"``, when installed) or asyncio.

    Only the import is guarded: a coroutine is awaited once, whatever fails inside it.
    """
    if kind == "uvloop":
        try:
            import uvloop  # lazy: optional dependency; without it the run falls back to asyncio
        except ImportError:
            pass
        else:
            return uvloop.run(coro)
    return asyncio.run(coro)
