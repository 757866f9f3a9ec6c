"""A one-node SLURM cluster on this machine, on private paths, for tests: munged, slurmctld and
slurmd from Debian's ``munge``, ``slurmctld``, ``slurmd`` and ``slurm-client`` packages, with a
generated ``slurm.conf`` (this machine's CPUs, no cgroups, no accounting) and free ports. It runs
as root, in the foreground of each daemon, and is stopped (daemons killed, jobs with them) on
``stop()``.

``python tests/slurm_cluster.py`` starts one and prints the ``SLURM_CONF`` to export, for trying
the batch script by hand; Ctrl-C stops it.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "sinfo")


def why_not() -> str | None:
    """Why this machine cannot run the cluster, or None."""
    if os.geteuid() != 0:
        return "the SLURM test cluster runs its daemons as root; this is not root"
    missing = [
        d for d in DAEMONS if shutil.which(d) is None and not Path(f"/usr/sbin/{d}").exists()
    ]
    if missing:
        return (
            f"no {', '.join(missing)}: Debian's munge, slurmctld, slurmd and slurm-client "
            "packages are not installed (make system installs them as root)"
        )
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _exe(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


CONF = """\
ClusterName=pbtest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={dir}/munge.socket
CredType=cred/munge
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
ReturnToService=2
KillWait=30
MinJobAge=300
SlurmctldTimeout=30
SlurmdTimeout=30
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
"""


class Cluster:
    """Start with ``Cluster().start()``; ``env`` is what a client command needs."""

    def __init__(self, base: Path | None = None):
        self.dir = Path(base or tempfile.mkdtemp(prefix="pbslurm-"))
        self.procs: list[subprocess.Popen] = []
        self.host = socket.gethostname().split(".")[0]
        self.env = {**os.environ, "SLURM_CONF": str(self.dir / "slurm.conf")}

    def start(self, timeout_s: float = 60) -> Cluster:
        d = self.dir
        for sub in ("state", "spool"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        d.chmod(0o755)  # munged refuses a socket folder others can write to
        key = d / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        (d / "slurm.conf").write_text(
            CONF.format(
                host=self.host,
                dir=d,
                ctld_port=_free_port(),
                d_port=_free_port(),
                cpus=os.cpu_count() or 1,
            )
        )
        self._spawn(
            [
                _exe("munged"),
                "-F",
                "--force",
                f"--key-file={key}",
                f"--socket={d}/munge.socket",
                f"--pid-file={d}/munged.pid",
                f"--log-file={d}/munged.log",
                f"--seed-file={d}/munged.seed",
            ],
            "munged",
        )
        self._wait(lambda: (d / "munge.socket").exists(), timeout_s, "munged")
        self._spawn([_exe("slurmctld"), "-D", "-i", "-f", str(d / "slurm.conf")], "slurmctld")
        self._spawn([_exe("slurmd"), "-D", "-f", str(d / "slurm.conf"), "-N", self.host], "slurmd")
        self._wait(self._idle, timeout_s, "the node to be idle")
        return self

    def _spawn(self, cmd: list[str], name: str) -> None:
        log = open(self.dir / f"{name}.out", "w")  # noqa: SIM115  (closed with the process)
        self.procs.append(
            subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
            )
        )

    def _idle(self) -> bool:
        for p in self.procs:
            if p.poll() is not None:
                raise RuntimeError(f"{p.args[0]} exited with {p.returncode}: see {self.dir}")
        out = self.run(["sinfo", "-h", "-o", "%T"], check=False).stdout.strip()
        return out == "idle"

    def _wait(self, ready, timeout_s: float, what: str) -> None:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if ready():
                return
            time.sleep(0.3)
        raise RuntimeError(
            f"the SLURM test cluster: no {what} within {timeout_s:.0f} s ({self.dir})"
        )

    def run(
        self, cmd: list[str], check: bool = True, timeout: float = 60, **kw
    ) -> subprocess.CompletedProcess:
        proc = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            env={**self.env, **kw.pop("env", {})},
            timeout=timeout,
            **kw,
        )
        if check and proc.returncode:
            raise RuntimeError(f"{' '.join(map(str, cmd))}: {proc.stderr.strip()}")
        return proc

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in reversed(self.procs):
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        self.procs.clear()


if __name__ == "__main__":
    why = why_not()
    if why:
        raise SystemExit(why)
    c = Cluster().start()
    print(f"export SLURM_CONF={c.dir}/slurm.conf   # Ctrl-C stops the cluster", flush=True)
    try:
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        c.stop()
