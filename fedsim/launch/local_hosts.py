"""The client-host processes ``fedsim run`` starts on this machine.

They are started with :class:`subprocess.Popen`, not asyncio's subprocess
API, so that ``fedsim run`` can start them before its event loop exists:
as the first thing it does, while it imports torch and builds the data
(a host is torch-free, but its own interpreter and imports take about 0.4 s
of a core; started after the data, they were the last thing the
federation's start waited for). The server's loop then awaits their exits
through a pidfd.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys

from fedsim.actors import process
from fedsim.scenario.ids import format_id_list

__all__ = ["HostProcess", "start_hosts"]


class HostProcess:
    """A client-host process: its pid, exit code, an awaitable exit, and kill."""

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self.popen = popen
        self.pid = popen.pid

    @property
    def returncode(self) -> int | None:
        return self.popen.poll()

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.popen.kill()

    async def wait(self) -> int:
        """Its exit code, once it has exited (the loop is woken by the kernel)."""
        if self.popen.poll() is not None:
            return self.popen.wait()
        try:
            fd = os.pidfd_open(self.pid)
        except (AttributeError, OSError):   # no pidfd (an old kernel): a thread waits
            return await asyncio.to_thread(self.popen.wait)
        loop = asyncio.get_running_loop()
        exited: asyncio.Future[None] = loop.create_future()

        def readable() -> None:
            if not exited.done():
                exited.set_result(None)

        loop.add_reader(fd, readable)
        try:
            await exited
        finally:
            loop.remove_reader(fd)
            os.close(fd)
        return self.popen.wait()


def start_hosts(hosts: list[list[int]], *, connect: str, scenario_file: str, run_id: str,
                zygote: str | None, trainer_cpus: list[int] | None,
                env: dict[str, str] | None, background: bool = False,
                cpus: set[int] | None = None) -> dict[str, HostProcess]:
    """Start one client-host process per client list: ``host-0``, ``host-1``, ...

    With ``background`` (hosts started while this process still sets up)
    they set up in the idle class, where the process may come back from it
    (:func:`~fedsim.actors.process.set_up_in_background`): this process's
    imports and data, the longer way to the start, keep a core. With
    ``cpus`` a host keeps to those CPUs once its imports are done
    (``deploy.pin_trainers``: the CPUs that are not the trainers').
    """
    idle = background and process.can_leave_idle()
    if idle:
        env = {**(env if env is not None else os.environ), process.SETUP_IDLE_ENV: "1"}
    procs: dict[str, HostProcess] = {}
    for h, clients in enumerate(hosts):
        proc = procs[f"host-{h}"] = HostProcess(subprocess.Popen(
            [sys.executable, "-m", "fedsim.actors.host", "--connect", connect,
             "--host-id", str(h), "--clients", format_id_list(clients),
             "--scenario", scenario_file, "--run-id", run_id, "--parent", str(os.getpid()),
             *(("--zygote", zygote) if zygote is not None else ()),
             *(("--trainer-cpu", str(trainer_cpus[h])) if trainer_cpus else ()),
             *(("--cpus", ",".join(map(str, sorted(cpus)))) if cpus else ())],
            stdin=subprocess.DEVNULL, env=env))
        if idle:   # its interpreter's imports too; it leaves the class before its clock sync
            with contextlib.suppress(OSError):
                os.sched_setscheduler(proc.pid, os.SCHED_IDLE, os.sched_param(0))
    return procs
