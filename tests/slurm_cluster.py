"""A real Slurm cluster for the tests: munged, slurmctld and one slurmd, on 127.0.0.1.

Debian's packages (``slurmctld``, ``slurmd``, ``slurm-client``, ``munge``), run as they
are: munged with its own key and socket, slurmctld and slurmd in the foreground with a
slurm.conf written here (own ports, state in a temporary directory, proctrack/linuxproc,
task/none, no cgroups, select/linear). The slurmd serves the node named after this host;
``gpu01``..``gpu03`` are defined with no slurmd of their own (see the configuration). Every
daemon is stopped by its PID. Under CI (``CI`` set) a missing package fails the test
instead of skipping it.

With ``gpus=N`` the host's node also has N GPUs as Slurm's GRES: ``gres.conf`` lists their
device files (links to ``/dev/null`` under the work directory, ``AutoDetect=off``: slurmd
only checks that they are devices) and the selection is ``select/cons_tres``, so jobs on
the host share it GPU by GPU. ``shards=K`` adds K ``gres/shard`` per GPU (jobs sharing a
GPU); ``mig_instances=M`` splits GPU 0 into M MIG instances, each a GRES of its own
(``MultipleFiles``: the GPU's device and two ``nvidia-cap`` files, as AutoDetect=nvml
lists an instance), typed ``1g.10gb``, the whole GPUs ``h100``. ``prolog`` / ``epilog``
become slurmd's ``Prolog=`` / ``Epilog=`` with ``PrologFlags=Alloc``: the prolog runs
when the job is allocated, not at its first step.
"""

from __future__ import annotations

import getpass
import json
import os
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deploy_tools import unavailable
from gpufleet.lab.processes import ManagedProcess, free_port, wait_until

PACKAGES = "apt-get install -y --no-install-recommends slurmctld slurmd slurm-client munge"
CLUSTER = "gftest"
IDLE_NODES = ("gpu01", "gpu02", "gpu03")


def require_slurm() -> None:
    """Skip (fail under CI) when Debian's Slurm and munge packages are not installed."""
    missing = [
        name
        for name in ("munged", "slurmctld", "slurmd", "scontrol", "sinfo", "squeue", "sbatch")
        if shutil.which(name) is None and not Path("/usr/sbin", name).exists()
    ]
    if missing:
        unavailable(f"{', '.join(missing)} not installed; install with: {PACKAGES}")


def _binary(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


@dataclass
class SlurmCluster:
    workdir: Path
    host: str = field(default_factory=lambda: socket.gethostname().split(".")[0])
    processes: list[ManagedProcess] = field(default_factory=list)
    run_dir: Path | None = None
    gpus: int = 0
    shards: int = 0
    mig_instances: int = 0
    prolog: Path | None = None
    epilog: Path | None = None

    @property
    def conf(self) -> Path:
        return self.workdir / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """The environment a Slurm client (and the watcher) runs in to reach this cluster."""
        clean = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "GPUFLEET"))}
        return {**clean, "SLURM_CONF": str(self.conf)}

    def _write_config(self, socket_path: Path) -> None:
        work = self.workdir
        for part in ("state", "spool", "log"):
            (work / part).mkdir(parents=True, exist_ok=True)
        ctld, slurmd = free_port(), free_port()
        lines = [
            f"ClusterName={CLUSTER}",
            f"SlurmctldHost={self.host}(127.0.0.1)",
            f"SlurmUser={getpass.getuser()}",
            f"SlurmdUser={getpass.getuser()}",
            f"SlurmctldPort={ctld}",
            f"SlurmdPort={slurmd}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={socket_path}",
            f"StateSaveLocation={work / 'state'}",
            f"SlurmdSpoolDir={work / 'spool'}",
            f"SlurmctldPidFile={work / 'slurmctld.pid'}",
            f"SlurmdPidFile={work / 'slurmd.pid'}",
            f"SlurmctldLogFile={work / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={work / 'log' / 'slurmd.log'}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            *self._gpu_config(),
            "SchedulerType=sched/builtin",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "MpiDefault=none",
            "MailProg=/bin/true",
            f"NodeName={self.host} NodeAddr=127.0.0.1 {self._host_resources()} State=UNKNOWN",
            # No slurmd of their own: slurmctld's pings reach this host's, so they read as
            # responding (IDLE) and take DRAIN / RESUME as real nodes do. Jobs run only on
            # the host (sbatch -w).
            "NodeName=gpu[01-03] NodeAddr=127.0.0.1 CPUs=1 State=UNKNOWN",
            "PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
        ]
        self.conf.write_text("\n".join(lines) + "\n")

    @property
    def gpu_devices(self) -> Path:
        """The directory of the host's fake GPU device files (``nvidia0``...)."""
        return self.workdir / "dev"

    def _gpu_config(self) -> list[str]:
        lines = [f"Prolog={self.prolog}"] if self.prolog else []
        lines += [f"Epilog={self.epilog}"] if self.epilog else []
        lines += ["PrologFlags=Alloc"] if self.prolog else []
        if not self.gpus:
            return [*lines, "SelectType=select/linear"]
        devices = self.gpu_devices
        devices.mkdir(parents=True, exist_ok=True)
        gres = self._gpu_lines(devices)
        gres += [f"Name=shard Count={self.shards} File={devices}/nvidia{gpu}"
                 for gpu in range(self.gpus) if self.shards]  # fmt: skip
        (self.workdir / "gres.conf").write_text(
            "AutoDetect=off\n" + "".join(f"NodeName={self.host} {line}\n" for line in gres)
        )
        types = "gpu,shard" if self.shards else "gpu"
        # One CPU per GRES whatever this machine has (config_overrides), so that jobs of one
        # GPU each can run side by side on the host.
        return [*lines, f"GresTypes={types}", "SelectType=select/cons_tres",
                "SelectTypeParameters=CR_Core", "SlurmdParameters=config_overrides"]  # fmt: skip

    def _gpu_lines(self, devices: Path) -> list[str]:
        # slurmd wants each file to be a character or block device, and mknod needs root:
        # links to /dev/null are devices to stat() and never opened here (task/none).
        def device(name: str) -> Path:
            path = devices / name
            if not path.is_symlink():
                path.symlink_to("/dev/null")
            return path

        whole = [device(f"nvidia{gpu}") for gpu in range(self.gpus)]
        if not self.mig_instances:
            return [f"Name=gpu File={devices}/nvidia[0-{self.gpus - 1}]"]
        instances = [
            f"Name=gpu Type=1g.10gb MultipleFiles={whole[0]},"
            f"{device(f'nvidia-cap{10 * gi + 1}')},{device(f'nvidia-cap{10 * gi + 2}')}"
            for gi in range(1, self.mig_instances + 1)
        ]
        return [*instances, *(f"Name=gpu Type=h100 File={path}" for path in whole[1:])]

    def _host_resources(self) -> str:
        if not self.gpus:
            return "CPUs=1"
        if self.mig_instances:
            gres = f"gpu:1g.10gb:{self.mig_instances},gpu:h100:{self.gpus - 1}"
            return f"CPUs={self.mig_instances + self.gpus - 1} Gres={gres}"
        shards = f",shard:{self.shards * self.gpus}" if self.shards else ""
        return f"CPUs={self.gpus * max(1, self.shards)} Gres=gpu:{self.gpus}{shards}"

    def start(self) -> SlurmCluster:
        # munged wants its socket's directory open to all and its key private; pytest's
        # temporary directories are neither, so the socket lives in a /tmp directory.
        self.run_dir = Path(tempfile.mkdtemp(prefix="gpufleet-munge-"))
        self.run_dir.chmod(0o755)
        keys = self.workdir / "munge"
        keys.mkdir(mode=0o700, parents=True)
        key = keys / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        socket_path = self.run_dir / "munge.sock"
        self._write_config(socket_path)
        log = self.workdir / "log"
        self._spawn(
            [_binary("munged"), "--foreground", f"--key-file={key}", f"--socket={socket_path}",
             f"--pid-file={self.run_dir / 'munged.pid'}", f"--seed-file={keys / 'seed'}",
             f"--log-file={log / 'munged.log'}", "--num-threads=2"],
            log / "munged.out",
        )  # fmt: skip
        wait_until(socket_path.exists, 20, interval=0.05, what="munged's socket")
        self._spawn([_binary("slurmctld"), "-D", "-i"], log / "slurmctld.out")
        wait_until(
            lambda: "is UP" in self.scontrol("ping", check=False),
            60,
            interval=0.2,
            what=f"slurmctld answering ping ({log / 'slurmctld.log'})",
        )
        self._spawn([_binary("slurmd"), "-D", "-N", self.host], log / "slurmd.out")
        wait_until(
            lambda: all(self.node(n)["state"].lower() == "idle" for n in (self.host, *IDLE_NODES)),
            60,
            interval=0.2,
            what=f"slurmd registering and every node idle ({log / 'slurmctld.log'})",
        )
        return self

    def _spawn(self, argv: list[str], log: Path) -> None:
        process = ManagedProcess(argv, log, self.env)
        process.start()
        self.processes.append(process)

    def stop(self) -> None:
        if self.processes:
            self._end_jobs()
        for process in reversed(self.processes):
            process.stop()
        if self.run_dir is not None:
            shutil.rmtree(self.run_dir, ignore_errors=True)

    def _end_jobs(self) -> None:
        """Cancel every job still queued or running and wait for slurmd to end them: a
        job's slurmstepd and batch script outlive a stopped slurmd otherwise."""
        try:
            listed = self.run("squeue", "--noheader", "--all", "--format=%i", check=False)
            jobs = [word for word in listed.split() if word.isdigit()]
            if not jobs:
                return
            self.run("scancel", *jobs, check=False)
            wait_until(
                lambda: not self.run("squeue", "--noheader", "--all", check=False).strip(),
                30,
                interval=0.2,
                what="the test cluster's jobs to end",
            )
        except Exception as error:  # noqa: BLE001 -- teardown: the daemons stop regardless
            print(f"slurm test cluster: jobs not ended before its daemons stopped: {error}")

    # -- the Slurm client commands ---------------------------------------------------------

    def run(self, *argv: str, check: bool = True) -> str:
        done = subprocess.run(
            list(argv), capture_output=True, text=True, env=self.env, timeout=60, check=False
        )
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(argv)}: {done.returncode} {done.stderr}")
        return done.stdout + done.stderr

    def scontrol(self, *argv: str, check: bool = True) -> str:
        return self.run("scontrol", *argv, check=check)

    def node(self, name: str) -> dict[str, Any]:
        nodes = json.loads(self.run("sinfo", "--json", "--all"))["nodes"]
        found: dict[str, Any] = next(node for node in nodes if node["name"] == name)
        return found

    def job(self, job_id: str) -> dict[str, Any]:
        jobs = json.loads(self.run("squeue", "--json", "--all"))["jobs"]
        found: dict[str, Any] = next(job for job in jobs if str(job["job_id"]) == job_id)
        return found

    def submit(self, *argv: str) -> str:
        out = self.run("sbatch", "--parsable", f"--chdir={self.workdir}", "-o", "/dev/null", *argv)
        return out.strip().split(";")[0]

    def drain(self, node: str, reason: str) -> None:
        self.scontrol("update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}")

    def resume(self, node: str) -> None:
        self.scontrol("update", f"NodeName={node}", "State=RESUME")
