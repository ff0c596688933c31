"""A private one-node Slurm cluster for the tests in this folder: munged, slurmctld and slurmd started as root from
Debian's packages, with every file they use (munge key and socket, slurm.conf, state, spool, logs) in one temporary
folder, and stopped again (only those three processes) when the module is done."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "scancel", "scontrol", "sinfo", "squeue")
#: The states of a job that has not finished; any other state is final.
ACTIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING", "STAGE_OUT"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def describe(processes: dict[int, str]) -> str:
    """One short line per process, for a failure message."""
    return "; ".join(f"{pid} {cmd[:160]}" for pid, cmd in processes.items())


def _tail(path: Path, lines: int = 40) -> str:
    text = path.read_text(errors="replace").splitlines() if path.exists() else ["(missing)"]
    return f"--- {path.name}\n" + "\n".join(text[-lines:])


@dataclass
class Slurm:
    """The running cluster: its folder, the environment its client commands need, and the daemons it started."""

    root: Path
    env: dict[str, str]
    daemons: dict[str, subprocess.Popen] = field(default_factory=dict)

    def run(self, *cmd: str, check: bool = True) -> subprocess.CompletedProcess:
        done = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=60)
        if check and done.returncode:
            raise AssertionError(f"{' '.join(cmd)} exited {done.returncode}: {done.stderr}\n{self.logs()}")
        return done

    def sbatch(self, *args: str) -> str:
        """Submit a batch job and return its id."""
        return self.run("sbatch", "--parsable", *args).stdout.strip().split(";")[0]

    def states(self, job: str) -> dict[str, str]:
        """JobState of ``job`` (an array job's or one task's id) per array task, or under its own id for a plain job."""
        lines = self.run("scontrol", "-o", "show", "job", job).stdout.splitlines()
        fields = [dict(re.findall(r"(\w+)=(\S*)", line)) for line in lines if line.strip()]
        return {f.get("ArrayTaskId", f["JobId"]): f["JobState"] for f in fields}

    def wait(self, job: str, timeout_s: float) -> dict[str, str]:
        """The final state of every task of ``job``, once none is pending or running any more."""
        deadline = time.monotonic() + timeout_s
        while True:
            states = self.states(job)
            if not ACTIVE.intersection(states.values()):
                return states
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job} still {states} after {timeout_s:.0f} s\n{self.logs()}")
            time.sleep(1)

    def strays(self) -> dict[int, str]:
        """Command lines, by pid, of the processes whose command line or environment names the cluster's folder,
        but for this one, the daemons and slurmctld's helper (slurmscriptd, its child): what the jobs started and
        have not ended."""
        daemons = {p.pid for p in self.daemons.values() if p.poll() is None}
        marker, found = str(self.root).encode(), {}
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit() or int(proc.name) in daemons | {os.getpid()}:
                continue
            try:
                if int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1]) in daemons:
                    continue
                cmdline = (proc / "cmdline").read_bytes()
                if marker in cmdline or marker in (proc / "environ").read_bytes():
                    found[int(proc.name)] = cmdline.replace(b"\0", b" ").decode(errors="replace")
            except OSError:  # it ended while being read
                continue
        return found

    def wait_for_no_strays(self, timeout_s: float = 30) -> None:
        """Until no process a job started is left (``strays``); fails naming them after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while strays := self.strays():
            assert time.monotonic() < deadline, f"processes naming {self.root} left running: {describe(strays)}"
            time.sleep(0.5)

    def logs(self) -> str:
        """The jobs' output and the end of each daemon's log, for a failure message."""
        jobs = sorted((self.root / "jobs").glob("*.log"))
        return "\n".join(_tail(path) for path in [*jobs, *(self.root / "log").glob("*.log")])


def _write_config(root: Path) -> Path:
    """slurm.conf for this host as ``slurmd -C`` sees it (its CPUs and memory), every path inside ``root``."""
    node = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, check=True).stdout.splitlines()[0]
    host = re.match(r"NodeName=(\S+)", node)[1]
    conf = root / "slurm.conf"
    conf.write_text(f"""\
ClusterName=specdec-test
SlurmctldHost={host}
SlurmUser=root
SlurmdUser=root
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge/socket
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MailProg=/bin/true
ReturnToService=2
KillWait=10
{node} State=UNKNOWN
PartitionName=main Nodes={host} Default=YES MaxTime=INFINITE State=UP
""")
    return conf


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL if it has not ended within 20 s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def _wait_for(what: str, ready: Callable[[], bool], slurm: Slurm, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        dead = [name for name, proc in slurm.daemons.items() if proc.poll() is not None]
        if dead or time.monotonic() > deadline:
            pytest.fail(f"the test cluster did not come up ({what}; ended: {dead or 'none'})\n{slurm.logs()}")
        time.sleep(0.5)


@pytest.fixture(scope="module")
def slurm() -> Iterator[Slurm]:
    """A one-node Slurm cluster of this machine, ready for jobs (its node idle)."""
    missing = [tool for tool in (*DAEMONS, *CLIENTS) if not shutil.which(tool)]
    if missing:
        pytest.fail(f"{', '.join(missing)} not found: `make test-cluster` installs them (Debian's slurm-wlm and munge)",
                    pytrace=False)
    if os.geteuid() != 0:
        pytest.fail("the test cluster's daemons run as root (slurmd starts each job as its user): run as root", pytrace=False)
    root = Path(tempfile.mkdtemp(prefix="specdec-slurm-"))
    root.chmod(0o755)  # munged insists that everyone may traverse to its socket
    for sub in ("munge", "state", "spool", "log", "jobs", "tmp"):
        (root / sub).mkdir(mode=0o755)
    key = root / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    slurm = Slurm(root, {**os.environ, "SLURM_CONF": str(_write_config(root))})
    commands = {"munged": ["munged", "--foreground", f"--socket={root}/munge/socket", f"--key-file={key}",
                           f"--pid-file={root}/munged.pid", f"--seed-file={root}/munged.seed",
                           f"--log-file={root}/log/munged.log"],
                "slurmctld": ["slurmctld", "-D"], "slurmd": ["slurmd", "-D"]}  # -D: in the foreground
    try:
        for daemon, command in commands.items():
            with open(root / "log" / f"{daemon}.out.log", "w") as out:
                slurm.daemons[daemon] = subprocess.Popen(command, env=slurm.env, stdout=out, stderr=subprocess.STDOUT)
            if daemon == "munged":
                _wait_for("munged's socket", (root / "munge" / "socket").exists, slurm)
        _wait_for("the node idle in sinfo",
                  lambda: slurm.run("sinfo", "-h", "-N", "-o", "%T", check=False).stdout.strip() == "idle", slurm)
        yield slurm
    finally:
        for proc in reversed(slurm.daemons.values()):
            _stop(proc)
        running = [f"{name} (pid {proc.pid})" for name, proc in slurm.daemons.items() if proc.poll() is None]
        assert not running, f"still running after SIGTERM and SIGKILL: {running}"
        slurm.wait_for_no_strays(timeout_s=5)
        shutil.rmtree(root)
