"""A real single-node Slurm for the tests: munge, slurmctld and slurmd started by hand.

``SlurmCluster`` writes a slurm.conf for this machine (its state, spool and
logs in a temporary directory, ports of its own, the node declared with 8
CPUs so that a job of a server and a few client hosts fits on 2 cores),
starts munged (if no munge daemon answers), slurmctld and slurmd without
systemd, waits for the node to be idle, and stops what it started. The
Debian packages are ``slurm-wlm`` and ``munge``; ``.ci/run`` installs them.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

__all__ = ["SlurmCluster", "slurm_unavailable"]

DAEMONS = ("slurmctld", "slurmd", "munged", "sbatch", "sinfo")


def slurm_unavailable() -> str | None:
    """Why a Slurm cluster cannot be started here (None: it can)."""
    if os.geteuid() != 0:
        return "starting slurmctld and slurmd needs root"
    missing = [d for d in DAEMONS if shutil.which(d) is None
               and not Path("/usr/sbin", d).exists()]
    if missing:
        return (f"{', '.join(missing)} not found: apt-get install slurm-wlm munge "
                "(.ci/run does)")
    if not Path("/etc/munge/munge.key").exists():
        return "no /etc/munge/munge.key (the munge package makes it)"
    return None


def _which(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


class SlurmCluster:
    """One node, one partition ``debug``; ``env`` is what sbatch needs (SLURM_CONF)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.node = socket.gethostname().split(".")[0]
        base = 17000 + os.getpid() % 2000 * 2
        self.conf = root / "slurm.conf"
        for d in ("state", "spool", "log"):
            (root / d).mkdir(parents=True, exist_ok=True)
        self.conf.write_text(f"""\
ClusterName=fedsimtest
SlurmctldHost={self.node}
AuthType=auth/munge
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmUser=root
SlurmdUser=root
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
SlurmctldPort={base}
SlurmdPort={base + 1}
ReturnToService=2
MpiDefault=none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
SlurmdParameters=config_overrides
NodeName={self.node} CPUs=8 RealMemory=4000 State=UNKNOWN
PartitionName=debug Nodes={self.node} Default=YES MaxTime=INFINITE State=UP
""")
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self._started_munge = False

    def __enter__(self) -> SlurmCluster:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _munge_ok(self) -> bool:
        r = subprocess.run("munge -n | unmunge", shell=True, capture_output=True)
        return r.returncode == 0

    def _start(self) -> None:
        if not self._munge_ok():
            Path("/run/munge").mkdir(parents=True, exist_ok=True)
            shutil.chown("/run/munge", "munge", "munge")
            subprocess.run(["runuser", "-u", "munge", "--", _which("munged")], check=True,
                           capture_output=True)
            self._started_munge = True
            for _ in range(50):
                if self._munge_ok():
                    break
                time.sleep(0.1)
        for daemon in ("slurmctld", "slurmd"):
            subprocess.run([_which(daemon), "-f", str(self.conf)], check=True,
                           capture_output=True, env=self.env)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            r = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True,
                               env=self.env)
            if r.stdout.strip() == "idle":
                return
            time.sleep(0.5)
        logs = "".join(p.read_text()[-2000:] for p in (self.root / "log").glob("*.log"))
        raise RuntimeError(f"the Slurm node never became idle:\n{logs}")

    def stop(self) -> None:
        subprocess.run(["scancel", "--full", "-u", "root"], capture_output=True, env=self.env)
        for daemon in ("slurmd", "slurmctld"):
            pidfile = self.root / f"{daemon}.pid"
            try:
                pid = int(pidfile.read_text())
            except (OSError, ValueError):
                continue
            try:
                os.kill(pid, signal.SIGTERM)
                for _ in range(50):
                    os.kill(pid, 0)
                    time.sleep(0.1)
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self._started_munge:
            subprocess.run(["pkill", "-x", "munged"], capture_output=True)
            self._started_munge = False

    def sbatch_wait(self, script: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """Submit ``script`` and wait for the job to end (its exit code is sbatch's)."""
        return subprocess.run(["sbatch", "--wait", str(script)], capture_output=True, text=True,
                              env=self.env, timeout=timeout)
