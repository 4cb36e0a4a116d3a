"""Memory and CPU of a process tree, sampled from ``/proc``: shared by the benchmarks in tools/.

:class:`Sampler` is a thread that, every ``period`` seconds, walks the tree
below a root process and sums ``Pss`` (pages shared by several processes,
e.g. after a fork, counted once in total) and ``Rss`` (counted in every
process) from ``/proc/PID/smaps_rollup``, keeping the peaks; it also keeps
each process's own peak, by its command line, so a benchmark can tell the
server, the client hosts and the torch workers apart.

:class:`CpuWatch` is a cheaper thread (``/proc/PID/stat`` only, about 20 us
a process) that keeps, for every process of the tree, the last CPU time
seen of the whole process and of its main thread (where fedsim's event
loops run), with its name (``comm``: fedsim's workers name themselves
``fedsim-trainer``, ``fedsim-evaluator``, ...). A process's last period
before it exits is not seen; the tree's exact total comes from
``resource.getrusage(RUSAGE_CHILDREN)`` around the run.
"""

from __future__ import annotations

import itertools
import os
import threading
import time

__all__ = ["CpuWatch", "Sampler", "memory", "tree"]


def tree(root: int) -> list[int]:
    """``root`` and every process below it."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def _rollup(pid: int) -> tuple[int, int]:
    """One process's Pss and Rss (bytes); zeros if it is gone."""
    pss = rss = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                if line.startswith("Pss:"):
                    pss = int(line.split()[1]) * 1024
                elif line.startswith("Rss:"):
                    rss = int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return pss, rss


def memory(pids: list[int]) -> tuple[int, int]:
    """Summed Pss and Rss (bytes) over ``pids``."""
    pss = rss = 0
    for pid in pids:
        p, r = _rollup(pid)
        pss, rss = pss + p, rss + r
    return pss, rss


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


class Sampler(threading.Thread):
    """Peak summed PSS and RSS of a process tree, every ``period`` seconds.

    ``per_process`` maps each pid seen to ``(command line, peak Pss, peak Rss)``.
    """

    def __init__(self, root: int, period: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.root, self.period = root, period
        self.pss = self.rss = self.procs = 0
        self.per_process: dict[int, tuple[str, int, int]] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            pids = tree(self.root)
            pss = rss = 0
            for pid in pids:
                p, r = _rollup(pid)
                pss, rss = pss + p, rss + r
                # read every time: a child sampled between fork and exec shows its parent's
                # (and an empty one once it has exited)
                cmd, pp, pr = self.per_process.get(pid) or ("", 0, 0)
                self.per_process[pid] = (_cmdline(pid) or cmd, max(pp, p), max(pr, r))
            self.pss, self.rss = max(self.pss, pss), max(self.rss, rss)
            self.procs = max(self.procs, len(pids))
            self.stop.wait(self.period)


_TICK = os.sysconf("SC_CLK_TCK")


def _cpu(path: str) -> float | None:
    """utime + stime (seconds) from a ``/proc/.../stat`` file; None if it is gone."""
    try:
        with open(path) as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICK
    except (OSError, ValueError, IndexError):
        return None


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as fh:
            return fh.read().strip()
    except OSError:
        return ""


class CpuWatch(threading.Thread):
    """CPU seconds of every process of a tree and of its main thread, every ``period``.

    ``names`` maps each pid seen to ``(name, command line)``; ``samples`` to
    its readings ``(time.time(), process CPU s, main thread CPU s)``;
    :meth:`between` interpolates them.
    """

    def __init__(self, root: int, period: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.root, self.period = root, period
        self.names: dict[int, tuple[str, str]] = {}
        self.samples: dict[int, list[tuple[float, float, float]]] = {}
        self.stop = threading.Event()

    def sample(self) -> None:
        for pid in tree(self.root):
            total = _cpu(f"/proc/{pid}/stat")
            main = _cpu(f"/proc/{pid}/task/{pid}/stat")
            if total is None or main is None:
                continue
            self.samples.setdefault(pid, []).append((time.time(), total, main))
            name, cmd = self.names.get(pid) or ("", "")
            # read every time: a child read between fork and exec shows its parent's
            self.names[pid] = (_comm(pid) or name, _cmdline(pid) or cmd)

    def at(self, pid: int, t: float) -> tuple[float, float]:
        """``pid``'s (process, main thread) CPU seconds at wall time ``t``, linearly
        between readings (0 before its first: it was not running yet; its last
        after its last)."""
        rows = self.samples.get(pid) or []
        if not rows or t <= rows[0][0]:
            return (0.0, 0.0)
        for (t0, a0, m0), (t1, a1, m1) in itertools.pairwise(rows):
            if t <= t1:
                f = (t - t0) / (t1 - t0) if t1 > t0 else 1.0
                return (a0 + f * (a1 - a0), m0 + f * (m1 - m0))
        return (rows[-1][1], rows[-1][2])

    def between(self, t0: float, t1: float) -> dict[int, tuple[float, float]]:
        """Each process's (process, main thread) CPU seconds from wall time ``t0`` to ``t1``."""
        out: dict[int, tuple[float, float]] = {}
        for pid in self.samples:
            a0, m0 = self.at(pid, t0)
            a1, m1 = self.at(pid, t1)
            out[pid] = (a1 - a0, m1 - m0)
        return out

    def run(self) -> None:
        while not self.stop.is_set():
            self.sample()
            self.stop.wait(self.period)
