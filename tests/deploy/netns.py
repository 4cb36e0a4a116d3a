"""Three Linux network namespaces joined by a bridge: a server and two client hosts.

``Namespaces`` makes ``fs<tag>srv``, ``fs<tag>a`` and ``fs<tag>b`` (a fresh
tag each time); a bridge in the server's namespace joins a veth pair to each
host (10.77.N.1 the server, .2 host a, .3 host b). On exit, also after a
failure, every process started with ``popen`` is killed (its whole process
group) and the namespaces are deleted, taking their links with them.
``popen(ns, argv, monotonic=...)`` runs a command inside a namespace,
optionally in a new time namespace whose CLOCK_MONOTONIC is offset
(``unshare --time --monotonic``): another machine's clock.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from typing import Any

__all__ = ["Namespaces", "netns_unavailable"]


def netns_unavailable() -> str | None:
    """Why namespace tests cannot run here (None: they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "unshare"):
        if shutil.which(tool) is None:
            return f"`{tool}` not found (apt-get install iproute2 util-linux)"
    probe = f"fsprobe{uuid.uuid4().hex[:6]}"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if r.returncode != 0:
        return f"cannot create a network namespace: {r.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    # util-linux >= 2.36 and a kernel with CONFIG_TIME_NS; and the offset must
    # really move CLOCK_MONOTONIC inside
    r = subprocess.run(["unshare", "--time", "--fork", "--monotonic", "1000", sys.executable,
                        "-c", "import time; print(time.monotonic())"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        return f"no time namespaces (unshare --time --monotonic): {r.stderr.strip()}"
    if abs(float(r.stdout) - time.monotonic() - 1000) > 30:
        return "unshare --time --monotonic 1000 did not move CLOCK_MONOTONIC by 1000 s"
    return None


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


class Namespaces:
    """``srv``, ``a`` and ``b`` on one bridged /24 (use as a context manager)."""

    def __init__(self) -> None:
        tag = uuid.uuid4().hex[:6]
        self.net = 10 + int(tag[:2], 16) % 200
        self.names = {k: f"fs{tag}{k}" for k in ("srv", "a", "b")}
        self.addr = {"srv": f"10.77.{self.net}.1", "a": f"10.77.{self.net}.2",
                     "b": f"10.77.{self.net}.3"}
        self._made: list[str] = []
        self._started: list[subprocess.Popen[str]] = []

    def __enter__(self) -> Namespaces:
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _build(self) -> None:
        srv = self.names["srv"]
        for ns in self.names.values():
            _ip("netns", "add", ns)
            self._made.append(ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        _ip("-n", srv, "link", "add", "br0", "type", "bridge")
        _ip("-n", srv, "addr", "add", f"{self.addr['srv']}/24", "dev", "br0")
        _ip("-n", srv, "link", "set", "br0", "up")
        for k in ("a", "b"):
            ns, outer = self.names[k], f"v{k}{self.names[k][2:8]}"
            # both ends made inside their namespaces: nothing is left in the host's
            # own namespace if a step fails (deleting the namespaces deletes the pair)
            _ip("-n", srv, "link", "add", outer, "type", "veth", "peer", "name", "eth0",
                "netns", ns)
            _ip("-n", srv, "link", "set", outer, "master", "br0")
            _ip("-n", srv, "link", "set", outer, "up")
            _ip("-n", ns, "addr", "add", f"{self.addr[k]}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
        probe = ("import socket, sys\n"
                 "try:\n    socket.create_connection((sys.argv[1], 9), timeout=3)\n"
                 "except ConnectionRefusedError:\n    pass  # reached: nothing listens\n")
        for k in ("a", "b"):  # the server's address answers (a refusal) from each host
            subprocess.run(["ip", "netns", "exec", self.names[k], sys.executable, "-c", probe,
                            self.addr["srv"]], check=True, capture_output=True, timeout=10)

    def popen(self, where: str, argv: Sequence[str], *, monotonic: float | None = None,
              **kw: Any) -> subprocess.Popen[str]:
        """Start ``argv`` in namespace ``where`` (``"srv"``, ``"a"``, ``"b"``)."""
        cmd = ["ip", "netns", "exec", self.names[where]]
        if monotonic is not None:
            cmd += ["unshare", "--time", "--fork", "--monotonic", str(monotonic), "--"]
        kw.setdefault("stdout", subprocess.PIPE)
        kw.setdefault("stderr", subprocess.PIPE)
        p = subprocess.Popen([*cmd, *argv], text=True, start_new_session=True, **kw)
        self._started.append(p)
        return p

    def close(self) -> None:
        """Kill what runs inside, then delete the namespaces (and with them the links)."""
        # each popen() is its own process group: that catches a process that
        # had not yet entered its namespace when `ip netns pids` looked
        for p in self._started:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
        for p in self._started:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=10)
            for pipe in (p.stdin, p.stdout, p.stderr):
                if pipe is not None:
                    pipe.close()
        self._started.clear()
        for ns in reversed(self._made):
            # anything else still inside (started by hand with `ip netns exec`)
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True,
                                  text=True).stdout.split()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self._made.clear()
