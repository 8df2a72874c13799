"""A real one-machine Slurm cluster for tests: slurmctld + slurmd on 127.0.0.1 (docs/stack.md).

    with slurm_cluster(tmp_path) as cluster:
        subprocess.run(["sbatch", "--wrap", "hostname"], env=cluster.env, check=True)

Debian's slurm-wlm 22.05 without systemd or cgroups: ``AuthType=auth/none`` and
``CredType=cred/none`` (a throwaway test cluster only: anyone on the machine may submit), state,
spool, logs and pid files under ``tmp_path``, the ``NodeName=`` line from ``slurmd -C``, ports
picked free so two clusters (two pytest-xdist workers) can run side by side, and one partition,
``debug``. ``cluster.env`` is ``os.environ`` plus ``SLURM_CONF``: every client call (sbatch,
squeue, scontrol) and every job needs it, as there is no /etc/slurm/slurm.conf. When the block
ends, jobs left are cancelled and their steps waited for, the daemons are stopped by PID
(SIGTERM, then SIGKILL), and any process still carrying this cluster's ``SLURM_CONF`` is killed.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from smolforge.processes import free_port

PARTITION = "debug"


def slurm_available() -> str | None:
    """None when slurmctld, slurmd and the client tools are installed; else what is missing."""
    missing = [t for t in ("slurmctld", "slurmd", "sbatch", "squeue", "sinfo", "scontrol") if shutil.which(t) is None]
    return f"Slurm is not installed (missing {', '.join(missing)}; make setup installs slurm-wlm)" if missing else None


@dataclass
class SlurmCluster:
    root: Path                                  # state, spool, logs, pid files
    conf: Path                                  # slurm.conf
    env: dict = field(default_factory=dict)     # os.environ + SLURM_CONF, for clients and jobs
    partition: str = PARTITION
    cpus: int = 1                               # CPUs of the one node
    processes: list = field(default_factory=list, repr=False)

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        """A Slurm client command against this cluster (``cluster.run("squeue", "-h")``)."""
        return subprocess.run(list(args), env=self.env, capture_output=True, text=True, check=check)

    def wait_idle(self, timeout: float = 60.0) -> None:
        """Until no job is left in the queue."""
        deadline = time.monotonic() + timeout
        while self.run("squeue", "-h", "-o", "%i").stdout.strip():
            if time.monotonic() > deadline:
                raise TimeoutError(f"jobs still queued after {timeout} s: {self.run('squeue').stdout}")
            time.sleep(0.2)


def _node_line(slurmd: str) -> tuple[str, int]:
    out = subprocess.run([slurmd, "-C"], capture_output=True, text=True, check=True).stdout
    line = next(l for l in out.splitlines() if l.startswith("NodeName="))
    cpus = int(next(part.split("=")[1] for part in line.split() if part.startswith("CPUs=")))
    return line, cpus


def write_conf(root: Path) -> tuple[Path, int]:
    node, cpus = _node_line(shutil.which("slurmd"))
    for sub in ("state", "spool", "log"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    host = node.split()[0].split("=", 1)[1]
    conf = root / "slurm.conf"
    conf.write_text("\n".join([
        "ClusterName=smolforge-test",
        f"SlurmctldHost={host}(127.0.0.1)",
        f"SlurmctldPort={free_port()}",
        f"SlurmdPort={free_port()}",
        "AuthType=auth/none",              # throwaway test cluster only (insecure)
        "CredType=cred/none",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"StateSaveLocation={root / 'state'}",
        f"SlurmdSpoolDir={root / 'spool'}",
        f"SlurmctldPidFile={root / 'slurmctld.pid'}",
        f"SlurmdPidFile={root / 'slurmd.pid'}",
        f"SlurmctldLogFile={root / 'log' / 'slurmctld.log'}",
        f"SlurmdLogFile={root / 'log' / 'slurmd.log'}",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "MailProg=/bin/true",
        "KillWait=5",
        # a requeued job may start again only cred_expire s later (default 120) and the main scheduler
        # runs every sched_interval s (default 60): a test of requeue-and-resume would wait ~3 min
        "AuthInfo=cred_expire=5",
        "SchedulerParameters=sched_interval=1",
        "ReturnToService=2",
        f"{node} NodeAddr=127.0.0.1 State=UNKNOWN",
        f"PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
    ]) + "\n")
    return conf, cpus


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@contextlib.contextmanager
def slurm_cluster(tmp_path: Path, timeout: float = 30.0):
    """Start slurmctld and slurmd under ``tmp_path``; yield a :class:`SlurmCluster`; stop both."""
    root = Path(tmp_path)
    conf, cpus = write_conf(root)
    env = {**os.environ, "SLURM_CONF": str(conf)}
    cluster = SlurmCluster(root=root, conf=conf, env=env, cpus=cpus)
    logs = root / "log"
    try:
        for daemon, args in (("slurmctld", ["-D", "-c", "-f", str(conf)]), ("slurmd", ["-D", "-f", str(conf)])):
            out = (logs / f"{daemon}.out").open("w")
            cluster.processes.append(subprocess.Popen([shutil.which(daemon), *args], env=env, stdout=out,
                                                      stderr=subprocess.STDOUT, start_new_session=True))
            out.close()
        deadline = time.monotonic() + timeout
        while True:
            for process in cluster.processes:
                if process.poll() is not None:
                    raise RuntimeError(f"{process.args[0]} exited with {process.returncode}; see {logs}")
            state = cluster.run("sinfo", "-h", "-o", "%T", check=False).stdout.split()
            if "idle" in state:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"Slurm node not idle after {timeout} s (state {state}); see {logs}")
            time.sleep(0.1)
        yield cluster
    finally:
        _drain(cluster)
        for process in reversed(cluster.processes):
            _stop(process)
        _kill_leftovers(conf)


def _drain(cluster: SlurmCluster, timeout: float = 20.0) -> None:
    """Cancel what is left and wait until its job steps have reported back: a slurmstepd whose
    slurmd is gone retries its job-complete RPC forever."""
    if not cluster.processes or any(p.poll() is not None for p in cluster.processes):
        return
    jobs = cluster.run("squeue", "-h", "-o", "%i", check=False).stdout.split()
    if jobs:
        cluster.run("scancel", *jobs, check=False)
    with contextlib.suppress(TimeoutError):
        cluster.wait_idle(timeout)
    deadline = time.monotonic() + timeout
    while _processes_of(cluster.conf, b"slurmstepd") and time.monotonic() < deadline:
        time.sleep(0.1)


def _processes_of(conf: Path, command: bytes = b"") -> list[int]:
    """PIDs (not this one) whose environment names ``conf`` and whose command line starts with
    ``command``: the daemons and their helpers, slurmstepd, the jobs."""
    marker = f"SLURM_CONF={conf}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if ((entry / "cmdline").read_bytes().startswith(command)
                    and marker in (entry / "environ").read_bytes().split(b"\0")):
                found.append(int(entry.name))
    return found


def _kill_leftovers(conf: Path) -> None:
    """SIGKILL, by PID, whatever of this cluster outlived its daemons."""
    for pid in _processes_of(conf):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
