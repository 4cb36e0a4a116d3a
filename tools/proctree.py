"""Memory of a process tree, sampled from ``/proc``: shared by the benchmarks in tools/.

:class:`Sampler` is a thread that, every ``period`` seconds, walks the tree
below a root process and sums ``Pss`` (pages shared by several processes,
e.g. after a fork, counted once in total) and ``Rss`` (counted in every
process) from ``/proc/PID/smaps_rollup``, keeping the peaks; it also keeps
each process's own peak, by its command line, so a benchmark can tell the
server, the client hosts and the torch workers apart.
"""

from __future__ import annotations

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
