"""A one-node SLURM cluster for the tests: munged, slurmctld and slurmd, started as root.

No systemd, no cgroups and no accounting: ``ProctrackType=proctrack/linuxproc`` tracks a
job's processes by parentage, ``TaskPlugin=task/affinity`` binds tasks to CPUs as on a real
cluster. State, spool, logs and munge's own key live in one temporary folder; the daemons
run in the foreground as children of the test process, on free ports, so several test
sessions on one machine do not meet. The node is named ``localhost`` (address 127.0.0.1):
SLURM_JOB_NODELIST then resolves on any machine, whatever its host name.

Debian: ``apt-get install slurm-wlm munge`` (SLURM 22.05 in bookworm). Up in about a second.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Slurm", "slurm_missing", "start_slurm", "stop_slurm", "NODE", "ENDED"]

NODE = "localhost"
DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("srun", "sbatch", "scancel", "squeue", "sinfo", "scontrol")
# Daemons live in sbin, which a non-login PATH may lack.
_SBIN = ("/usr/sbin", "/sbin", "/usr/local/sbin")
# A job's states once it has ended (scontrol's JobState).
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
         "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE")
# SIGTERM to SIGKILL on scancel, a time limit or a requeue: SLURM's default, 30 s, which a
# stop's save and teardown on a loaded machine need (10 s was too short once); tests that
# depend on it read Slurm.kill_wait.
# A requeued job may start again cred_expire + 1 s after the requeue (SLURM's default 120 s),
# once the scheduler looks (every 5 s here, 30-60 s by default): 30 s keeps it short.
KILL_WAIT = 30


def _which(name: str) -> str | None:
    path = os.pathsep.join([os.environ.get("PATH", ""), *_SBIN])
    return shutil.which(name, path=path)


def slurm_missing() -> str | None:
    """Why a test SLURM cannot start here, or None when it can."""
    missing = [n for n in (*DAEMONS, *CLIENTS) if _which(n) is None]
    if missing:
        return (f"SLURM is not installed (no {', '.join(missing)}): "
                "apt-get install slurm-wlm munge")
    if os.geteuid() != 0:
        return "the test SLURM runs slurmd as root (it starts tasks as their user); run as root"
    return None


@dataclass(frozen=True)
class Slurm:
    """A running one-node cluster; ``env()`` is what its client commands need."""

    root: Path
    conf: Path
    cpus: int
    kill_wait: int
    daemons: tuple[subprocess.Popen[bytes], ...]

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """``base`` (default os.environ) with SLURM_CONF pointing at this cluster."""
        return {**(os.environ if base is None else base), "SLURM_CONF": str(self.conf)}

    def client(self, *argv: str, timeout: float = 30,
               base: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """Run a client command (srun, squeue, ...) against this cluster, in ``base``'s
        environment (default os.environ)."""
        return subprocess.run([_which(argv[0]) or argv[0], *argv[1:]], env=self.env(base),
                              capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job``'s fields (JobState, ExitCode, Restarts, ...); {} when the
        controller no longer knows the job (MinJobAge, 300 s by default, after its end)."""
        out = self.client("scontrol", "-o", "show", "job", job_id, timeout=10)
        if out.returncode != 0:
            return {}
        return dict(f.split("=", 1) for f in out.stdout.split() if "=" in f)

    def wait_job(self, job_id: str, timeout: float,
                 states: tuple[str, ...] = ENDED) -> dict[str, str]:
        """Poll until the job is in one of ``states``; its fields. TimeoutError, with the
        logs, otherwise (``sbatch --wait`` polls at growing intervals, up to 10 s apart)."""
        until = time.monotonic() + timeout
        while True:
            fields = self.job(job_id)
            if fields.get("JobState") in states:
                return fields
            if time.monotonic() > until:
                raise TimeoutError(f"job {job_id} is {fields.get('JobState')} after "
                                   f"{timeout:.0f}s, not {'/'.join(states)}:\n{self.logs()}")
            time.sleep(0.1)

    def logs(self, tail: int = 4000) -> str:
        """The end of every daemon's log, for a failing test's message."""
        parts = []
        for path in sorted((self.root / "log").glob("*.log")):
            parts.append(f"--- {path.name} ---\n{path.read_text(errors='replace')[-tail:]}")
        return "\n".join(parts)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cpus() -> int:
    # `nproc` obeys OMP_NUM_THREADS (the test session sets it to 1): ask the kernel.
    out = subprocess.run(["getconf", "_NPROCESSORS_ONLN"], capture_output=True, text=True)
    return int(out.stdout.strip()) if out.returncode == 0 else (os.cpu_count() or 1)


def _config(root: Path, cpus: int, kill_wait: int) -> str:
    return f"""\
ClusterName=splitsynctest
SlurmctldHost={NODE}(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge/munge.socket,cred_expire=30
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
CommunicationParameters=NoInAddrAny
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=5,sched_interval=5
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
KillWait={kill_wait}
NodeName={NODE} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName=debug Nodes={NODE} Default=YES MaxTime=INFINITE State=UP
"""


def start_slurm(root: Path, timeout: float = 60.0, kill_wait: int = KILL_WAIT) -> Slurm:
    """Start munged, slurmctld and slurmd under ``root``; return once the node is idle."""
    root.chmod(0o755)
    for sub in ("munge", "state", "spool", "log"):
        (root / sub).mkdir(exist_ok=True)
    key = root / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))  # this cluster's own key; the system's is not touched
    key.chmod(0o600)
    cpus = _cpus()
    conf = root / "slurm.conf"
    conf.write_text(_config(root, cpus, kill_wait))
    commands = [
        # the origin munge stamps on credentials: loopback, whatever the host name resolves to
        [_which("munged"), "-F", "-f", "--origin=127.0.0.1", f"--key-file={key}",
         f"--socket={root}/munge/munge.socket", f"--pid-file={root}/munge/munged.pid",
         f"--seed-file={root}/munge/munged.seed", f"--log-file={root}/log/munged.log"],
        [_which("slurmctld"), "-D", "-f", str(conf)],
        [_which("slurmd"), "-D", "-f", str(conf), "-N", NODE],
    ]
    daemons: list[subprocess.Popen[bytes]] = []
    slurm = Slurm(root, conf, cpus, kill_wait, ())
    try:
        for argv in commands:
            name = Path(str(argv[0])).name
            with open(root / "log" / f"{name}.out.log", "ab") as out:
                daemons.append(subprocess.Popen([str(a) for a in argv], stdout=out,
                                                stderr=subprocess.STDOUT,
                                                stdin=subprocess.DEVNULL,
                                                env=slurm.env(), start_new_session=True))
            if name == "munged":
                _wait(lambda: (root / "munge" / "munge.socket").exists(), timeout, "munged",
                      root)
        slurm = Slurm(root, conf, cpus, kill_wait, tuple(daemons))
        _wait(lambda: _idle(slurm), timeout, "the node to be idle", root)
    except BaseException:
        _stop(daemons)
        raise
    return slurm


def _idle(slurm: Slurm) -> bool:
    for proc in slurm.daemons:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode}:\n{slurm.logs()}")
    out = slurm.client("sinfo", "-h", "-N", "-o", "%T", timeout=10)
    return out.returncode == 0 and out.stdout.strip() == "idle"


def _wait(ready: object, timeout: float, what: str, root: Path) -> None:
    until = time.monotonic() + timeout
    while not ready():  # type: ignore[operator]
        if time.monotonic() > until:
            logs = Slurm(root, root / "slurm.conf", 0, 0, ()).logs()
            raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what}:\n{logs}")
        time.sleep(0.1)


def stop_slurm(slurm: Slurm, timeout: float = 30.0) -> None:
    """Cancel every job, then stop the daemons (SIGTERM, SIGKILL after ``timeout``)."""
    try:
        slurm.client("scancel", "--quiet", "--full", "--partition=debug", timeout=10)
        until = time.monotonic() + timeout
        while slurm.client("squeue", "-h", "-o", "%i", timeout=10).stdout.strip():
            if time.monotonic() > until:
                break
            time.sleep(0.2)
    except (OSError, subprocess.SubprocessError):
        pass  # the daemons are stopped below whatever the clients say
    _stop(list(slurm.daemons), timeout)


def _stop(daemons: list[subprocess.Popen[bytes]], timeout: float = 30.0) -> None:
    for proc in reversed(daemons):  # slurmd, slurmctld, then munged that they talk to
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
