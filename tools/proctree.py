"""Memory of a process tree, sampled from ``/proc``: shared by the benchmarks in tools/.

:class:`Sampler` is a thread that, every ``period`` seconds, walks the tree
below a root process and sums ``Pss`` (pages shared by several processes,
e.g. after a fork, counted once in total) and ``Rss`` (counted in every
process) from ``/proc/PID/smaps_rollup``, keeping the peaks; it also keeps
each process's own peak, by its command line, so a benchmark can tell the
server, the client hosts and the torch workers apart.
"""

from __future__ import annotations

import contextlib
import os
import threading

__all__ = ["Sampler", "memory", "tree"]


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

    With ``idle`` (the default) the sampling thread runs in the idle class
    (SCHED_IDLE), so it takes no CPU time from the processes it measures.

    ``per_process`` maps each pid seen to ``(command line, peak Pss, peak Rss)``.
    """

    def __init__(self, root: int, period: float = 0.05, idle: bool = True) -> None:
        super().__init__(daemon=True)
        self.root, self.period, self.idle = root, period, idle
        self.pss = self.rss = self.procs = 0
        self.per_process: dict[int, tuple[str, int, int]] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        # A sample of a 5-process tree costs about 6 ms of CPU (smaps_rollup
        # walks each process's page tables): 12 % of a core at the default
        # period, taken from whatever the kernel preempts, usually a worker
        # in the idle class. In the idle class itself, the sampler uses only
        # CPU time nobody measured wants.
        if self.idle and hasattr(os, "SCHED_IDLE"):
            with contextlib.suppress(OSError):
                os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
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
