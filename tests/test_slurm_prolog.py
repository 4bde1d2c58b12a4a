"""The Slurm prolog and epilog that name each GPU's jobs (deploy/slurm/gpufleet-*.sh).

They write dcgm-exporter's HPC job mapping layout (``internal/pkg/transformation/hpc.go``):
a file per GPU named ``<gpu>`` or ``<gpu>.<GPU instance>``, one job id a line. First the
scripts alone, run as slurmd runs them (``/bin/sh``, an environment of Slurm's variables
only, no PATH): several jobs on one GPU, prologs and epilogs at once, a missing directory,
an epilog without its prolog, MIG names from a map. Then under a real slurmd with four
GPUs as GRES (``slurm_cluster``), configured with ``Prolog=`` / ``Epilog=`` as the scripts'
header says: the files name a job's GPUs while it runs and lose its line when it ends,
is cancelled or is an array's task; jobs sharing a GPU through ``gres/shard`` each have
their line; MIG instances (a GRES each, numbered flat) are named through the map. Last,
end to end: ``gpufleet agent`` (synthetic NVML) reads the directory slurmd's prolog
writes, its GPU series carry ``hpc_job`` and ``gpufleet_gpu_job_info`` names the job
while it runs, and a real Prometheus answers docs/bare-metal.md's join on it.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.lab.devstack import PrometheusServer, static_scrape_config
from gpufleet.lab.processes import ManagedProcess, free_port, http_get, wait_until
from slurm_cluster import SlurmCluster, require_slurm

REPO = Path(__file__).resolve().parents[1]
PROLOG = REPO / "deploy" / "slurm" / "gpufleet-prolog.sh"
EPILOG = REPO / "deploy" / "slurm" / "gpufleet-epilog.sh"
# dcgm-exporter's validGPUFile: the names its HPC mapper reads.
MAPPING_NAME = re.compile(r"^\d+(\.\d+)?$")


@dataclass(frozen=True)
class Node:
    """One node's settings file and mapping directory, and its prolog / epilog runs."""

    defaults: Path
    mapping_dir: Path
    gpu_map: Path | None = None

    @classmethod
    def at(cls, root: Path, gpu_map: Path | None = None) -> Node:
        node = cls(root / "default-gpufleet", root / "run" / "gpufleet" / "hpc-jobs", gpu_map)
        lines = [f"GPUFLEET_HPC_JOB_MAPPING_DIR={node.mapping_dir}"]
        lines += [f"GPUFLEET_SLURM_GPU_MAP={gpu_map}"] if gpu_map else []
        node.defaults.write_text("\n".join(lines) + "\n")
        return node

    def env(self, job: str, gpus: str | None) -> dict[str, str]:
        # What slurmd gives a prolog: Slurm's variables and nothing else (no PATH).
        env = {"GPUFLEET_DEFAULTS": str(self.defaults), "SLURM_JOB_ID": job,
               "SLURM_SCRIPT_CONTEXT": "prolog_slurmd"}  # fmt: skip
        return env | ({"SLURM_JOB_GPUS": gpus} if gpus is not None else {})

    def start(
        self, script: Path, job: str, gpus: str | None = None, cwd: Path | None = None
    ) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [str(script)], env=self.env(job, gpus), cwd=cwd, text=True, stderr=subprocess.PIPE
        )

    def run(self, script: Path, job: str, gpus: str | None = None, cwd: Path | None = None) -> str:
        process = self.start(script, job, gpus, cwd)
        _, stderr = process.communicate(timeout=60)
        assert process.returncode == 0, f"{script.name} exited {process.returncode}: {stderr}"
        return stderr

    def prolog(self, job: str, gpus: str | None) -> str:
        return self.run(PROLOG, job, gpus)

    def epilog(self, job: str, gpus: str | None = None) -> str:
        return self.run(EPILOG, job, gpus)

    def mapping(self) -> dict[str, list[str]]:
        return read_mapping(self.mapping_dir)


def read_mapping(directory: Path) -> dict[str, list[str]]:
    """What dcgm-exporter's HPC mapper reads: each mapping file's lines, blank ones too."""
    if not directory.is_dir():
        return {}
    return {
        path.name: path.read_text().split("\n")[:-1] if path.read_text() else []
        for path in sorted(directory.iterdir())
        if MAPPING_NAME.match(path.name) and path.is_file()
    }


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node.at(tmp_path)


# --- the scripts alone -----------------------------------------------------------------------


def test_the_prolog_names_a_job_on_its_gpus_and_the_epilog_takes_it_out(node: Node) -> None:
    assert not node.mapping_dir.parent.exists()
    node.prolog("101", "0,1")
    assert stat.S_IMODE(node.mapping_dir.stat().st_mode) == 0o755
    assert node.mapping() == {"0": ["101"], "1": ["101"]}
    for path in node.mapping_dir.glob("[0-9]*"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o644  # an agent not root reads them

    node.prolog("102", "1,3")  # a second job on GPU 1 (shards, MPS, OverSubscribe)
    node.prolog("102", "1,3")  # a prolog run twice writes its line once
    assert node.mapping() == {"0": ["101"], "1": ["101", "102"], "3": ["102"]}

    node.epilog("101")
    assert node.mapping() == {"1": ["102"], "3": ["102"]}  # a GPU with no job: no file
    node.epilog("102")
    assert node.mapping() == {}
    assert sorted(path.name for path in node.mapping_dir.iterdir()) == [".lock"]


def test_the_epilog_of_a_job_whose_prolog_never_ran_changes_nothing(node: Node) -> None:
    node.epilog("7")  # no mapping directory at all
    assert not node.mapping_dir.exists()
    node.prolog("8", None)  # a job without GPUs
    assert not node.mapping_dir.exists()

    node.prolog("9", "2")
    before = {path.name: path.stat().st_mtime_ns for path in node.mapping_dir.iterdir()}
    node.epilog("7")
    node.epilog("90")  # "9" is a line of its own, not a prefix
    assert node.mapping() == {"2": ["9"]}
    assert {path.name: path.stat().st_mtime_ns for path in node.mapping_dir.iterdir()} == before


def test_jobs_starting_and_ending_together_on_one_gpu_lose_no_line(node: Node) -> None:
    jobs = [str(job) for job in range(200, 216)]
    started = [node.start(PROLOG, job, "0,1") for job in jobs]
    assert [process.wait(60) for process in started] == [0] * len(jobs)
    assert {name: sorted(lines) for name, lines in node.mapping().items()} == {
        "0": jobs,
        "1": jobs,
    }

    ending = [node.start(EPILOG, job) for job in jobs[::2]]
    assert [process.wait(60) for process in ending] == [0] * len(ending)
    assert {name: sorted(lines) for name, lines in node.mapping().items()} == {
        "0": jobs[1::2],
        "1": jobs[1::2],
    }
    ending = [node.start(EPILOG, job) for job in jobs[1::2]]
    assert [process.wait(60) for process in ending] == [0] * len(ending)
    assert node.mapping() == {}


def test_a_gpu_map_names_mig_instances_and_unnamed_gpus_are_skipped(tmp_path: Path) -> None:
    # MIG under Slurm: each instance is a GRES of its own, numbered flat; the admin's map
    # gives each Slurm id dcgm-exporter's <gpu>.<GPU instance> name.
    gpu_map = tmp_path / "slurm-gpus"
    gpu_map.write_text("# Slurm id, mapping file\n0 0.1\n1 0.2\n2 1.0\n")
    node = Node.at(tmp_path, gpu_map)
    node.prolog("301", "0,2")
    node.prolog("302", "1,3")  # 3: not in the map, so named 3 as Slurm numbers it
    assert node.mapping() == {"0.1": ["301"], "0.2": ["302"], "1.0": ["301"], "3": ["302"]}

    before = node.mapping()
    node.prolog("303", "NoDevFiles")  # Slurm's value when gres.conf names no device files
    node.prolog("304", "../0")
    assert node.mapping() == before
    assert sorted(path.name for path in node.mapping_dir.iterdir()) == [
        ".lock", "0.1", "0.2", "1.0", "3"]  # fmt: skip
    assert not (node.mapping_dir.parent / "0").exists()

    node.epilog("301")
    node.epilog("302")
    assert node.mapping() == {}


def test_blank_lines_go_and_other_files_stay(node: Node) -> None:
    node.mapping_dir.mkdir(parents=True)
    (node.mapping_dir / "0").write_text("41\n\n42\n")  # dcgm-exporter would label hpc_job=""
    (node.mapping_dir / "README").write_text("41\n")
    (node.mapping_dir / "0.x").write_text("41\n")
    node.prolog("43", "0")
    assert node.mapping() == {"0": ["41", "42", "43"]}
    node.epilog("41")
    assert node.mapping() == {"0": ["42", "43"]}
    assert (node.mapping_dir / "README").read_text() == "41\n"
    assert (node.mapping_dir / "0.x").read_text() == "41\n"


def test_a_gpu_list_is_split_on_commas_and_never_globbed(node: Node, tmp_path: Path) -> None:
    cwd = tmp_path / "cwd"  # slurmd's working directory, holding a file named like a GPU
    cwd.mkdir()
    (cwd / "5").touch()
    node.run(PROLOG, "601", "*,?", cwd=cwd)
    assert node.mapping() == {}
    node.run(PROLOG, "601", "1,2", cwd=cwd)
    assert node.mapping() == {"1": ["601"], "2": ["601"]}


@pytest.mark.parametrize("job", ["", "12\n13", "12 13", "abc"])
def test_what_is_not_a_job_id_is_not_written(node: Node, job: str) -> None:
    node.prolog(job, "0")
    node.epilog(job)
    assert node.mapping() == {}


def test_a_directory_that_cannot_be_made_fails_nothing(tmp_path: Path) -> None:
    node = Node.at(tmp_path)
    node.mapping_dir.parent.mkdir(parents=True)
    node.mapping_dir.write_text("a file where the directory should be\n")
    node.prolog("501", "0")  # exit 0 asserted by run(): a failed prolog drains the node
    node.epilog("501")
    assert node.mapping_dir.read_text() == "a file where the directory should be\n"


# --- under a real slurmd ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def gpu_slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SlurmCluster, Node]]:
    require_slurm()
    work = tmp_path_factory.mktemp("slurm-gpus")
    node = Node.at(work)
    cluster = hooked_cluster(work, node, gpus=4, shards=4)
    try:
        cluster.start()
        yield cluster, node
    finally:
        cluster.stop()


def hooked_cluster(
    work: Path, node: Node, gpus: int, shards: int = 0, mig_instances: int = 0
) -> SlurmCluster:
    """A cluster whose slurm.conf runs the shipped scripts as Prolog= / Epilog=, told
    where this node's settings are (a real node reads /etc/default/gpufleet)."""
    hooks = {}
    for name, script in (("prolog", PROLOG), ("epilog", EPILOG)):
        hook = work / f"{name}.sh"
        hook.write_text(f"#!/bin/sh\nGPUFLEET_DEFAULTS={node.defaults} exec {script}\n")
        hook.chmod(0o755)
        hooks[name] = hook
    return SlurmCluster(work / "cluster", gpus=gpus, shards=shards, mig_instances=mig_instances,
                        prolog=hooks["prolog"], epilog=hooks["epilog"])  # fmt: skip


def gres_indices(cluster: SlurmCluster, job: str) -> list[str]:
    """The GPUs Slurm gave a job on the host: ``GRES=gpu:2(IDX:0-1)`` -> ["0", "1"]."""
    found = re.search(
        r"GRES=gpu(?::[^:(\s]+)*:\d+\(IDX:([\d,-]+)\)", cluster.scontrol("show", "job", "-d", job)
    )
    assert found, cluster.scontrol("show", "job", "-d", job)
    indices: list[str] = []
    for part in found.group(1).split(","):
        first, _, last = part.partition("-")
        indices += [str(i) for i in range(int(first), int(last or first) + 1)]
    return indices


def wait_for_mapping(node: Node, expected: dict[str, list[str]], what: str) -> None:
    def matches() -> bool:
        return {name: sorted(lines) for name, lines in node.mapping().items()} == expected

    try:
        wait_until(matches, 60, interval=0.1, what=what)
    except TimeoutError as error:
        raise AssertionError(f"{error}: {node.mapping()} != {expected}") from None


def held_job(cluster: SlurmCluster, release: Path, *argv: str) -> str:
    """A job on the host that runs until ``release`` exists, then ends with success."""
    wrap = f"while [ ! -e {release} ]; do sleep 0.2; done"
    return cluster.submit("-w", cluster.host, *argv, "--wrap", wrap)


def test_a_real_slurmd_names_each_jobs_gpus_while_it_runs(
    gpu_slurm: tuple[SlurmCluster, Node], tmp_path: Path
) -> None:
    cluster, node = gpu_slurm
    two = held_job(cluster, tmp_path / "release-two", "--gres=gpu:2")
    one = held_job(cluster, tmp_path / "release-one", "--gres=gpu:1")
    wait_until(
        lambda: all(cluster.job(job)["job_state"] == "RUNNING" for job in (two, one)),
        60,
        interval=0.2,
        what="both jobs running side by side",
    )
    expected = {gpu: [two] for gpu in gres_indices(cluster, two)}
    expected |= {gpu: [one] for gpu in gres_indices(cluster, one)}
    assert len(expected) == 3  # three GPUs, each with its own job
    wait_for_mapping(node, expected, "the prolog's mapping of both jobs")

    (tmp_path / "release-two").touch()  # ends with success
    wait_for_mapping(node, {gpu: [one] for gpu in gres_indices(cluster, one)}, "job two gone")
    cluster.run("scancel", one)
    wait_for_mapping(node, {}, "the cancelled job gone")
    assert "drain" not in str(cluster.node(cluster.host)["state_flags"]).lower()


def test_each_task_of_an_array_is_named_by_its_own_job_id(
    gpu_slurm: tuple[SlurmCluster, Node], tmp_path: Path
) -> None:
    cluster, node = gpu_slurm
    array = held_job(cluster, tmp_path / "release", "--gres=gpu:1", "--array=0-1")

    def running_tasks() -> list[str] | None:
        jobs = json.loads(cluster.run("squeue", "--json", "--all"))["jobs"]
        tasks = [job for job in jobs if str(job.get("array_job_id")) == array]
        running = [str(job["job_id"]) for job in tasks if job["job_state"] == "RUNNING"]
        return running if len(running) == 2 else None

    tasks = wait_until(running_tasks, 60, interval=0.2, what="both array tasks running")
    assert len(set(tasks)) == 2  # SLURM_JOB_ID: squeue's job_id, the client's training_job
    expected = {gpu: [task] for task in tasks for gpu in gres_indices(cluster, task)}
    wait_for_mapping(node, expected, "each array task on its GPU")
    (tmp_path / "release").touch()
    wait_for_mapping(node, {}, "the array's tasks gone")


def test_jobs_sharing_a_gpu_through_shards_each_have_their_line(
    gpu_slurm: tuple[SlurmCluster, Node], tmp_path: Path
) -> None:
    cluster, node = gpu_slurm
    # 3 jobs x 2 shards on GPUs of 4 shards each: some GPU holds shards of two jobs.
    jobs = [held_job(cluster, tmp_path / f"release-{n}", "--gres=shard:2") for n in range(3)]

    def all_mapped() -> dict[str, list[str]] | None:
        mapping = node.mapping()
        mapped = {job for lines in mapping.values() for job in lines}
        return mapping if mapped == set(jobs) else None

    mapping = wait_until(all_mapped, 60, interval=0.1, what="every sharing job mapped")
    shared = next(lines for lines in mapping.values() if len(lines) >= 2)
    ending, staying = shared[0], shared[1]
    (tmp_path / f"release-{jobs.index(ending)}").touch()

    def ending_gone() -> bool:
        lines = [job for lines in node.mapping().values() for job in lines]
        return ending not in lines and staying in lines

    wait_until(ending_gone, 60, interval=0.1, what=f"job {ending} out, {staying} still in")
    for n in range(3):
        (tmp_path / f"release-{n}").touch()
    wait_for_mapping(node, {}, "the sharing jobs gone")


@pytest.fixture(scope="module")
def mig_slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SlurmCluster, Node]]:
    require_slurm()
    work = tmp_path_factory.mktemp("slurm-mig")
    # GRES 0 and 1: GPU 0's MIG instances 1 and 2; GRES 2: GPU 1 whole. Slurm numbers
    # them flat, so the whole GPU needs its line too.
    gpu_map = work / "slurm-gpus"
    gpu_map.write_text("0 0.1\n1 0.2\n2 1\n")
    node = Node.at(work, gpu_map)
    cluster = hooked_cluster(work, node, gpus=2, mig_instances=2)
    try:
        cluster.start()
        yield cluster, node
    finally:
        cluster.stop()


def test_mig_instances_are_named_through_the_gpu_map(
    mig_slurm: tuple[SlurmCluster, Node], tmp_path: Path
) -> None:
    cluster, node = mig_slurm
    jobs = [held_job(cluster, tmp_path / "release", f"--gres=gpu:{kind}:1")
            for kind in ("1g.10gb", "1g.10gb", "h100")]  # fmt: skip
    wait_until(
        lambda: all(cluster.job(job)["job_state"] == "RUNNING" for job in jobs),
        60,
        interval=0.2,
        what="the MIG jobs running",
    )
    names = {"0": "0.1", "1": "0.2", "2": "1"}
    expected = {names[gpu]: [job] for job in jobs for gpu in gres_indices(cluster, job)}
    assert sorted(expected) == ["0.1", "0.2", "1"]
    wait_for_mapping(node, expected, "each job on its MIG instance or GPU")
    (tmp_path / "release").touch()
    wait_for_mapping(node, {}, "the MIG jobs gone")


# --- end to end: slurmd's prolog, the agent, Prometheus --------------------------------------

# docs/bare-metal.md's query: each Slurm job's GPU utilisation, joined on gpufleet_gpu_job_info.
README_JOIN = """avg by (hpc_job) (
  gpufleet_gpu_job_info
  * on (Hostname, gpu, GPU_I_ID) group_left max without (hpc_job) (DCGM_FI_DEV_GPU_UTIL)
)"""


def jobs_on_gpus(exposition: str) -> dict[str, set[str]]:
    """GPU -> the hpc_job values on its series ("" for a series without one), and
    ``info:<gpu>`` -> the jobs gpufleet_gpu_job_info names on it."""
    found: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if "gpu" not in sample.labels:
                continue
            if sample.name == "gpufleet_gpu_job_info":
                found.setdefault(f"info:{sample.labels['gpu']}", set()).add(
                    sample.labels["hpc_job"]
                )
            elif sample.name.startswith("DCGM_FI_"):
                found.setdefault(sample.labels["gpu"], set()).add(sample.labels.get("hpc_job", ""))
    return found


@pytest.mark.integration
def test_the_agent_labels_the_gpus_the_prolog_maps_and_prometheus_joins_them(
    gpu_slurm: tuple[SlurmCluster, Node],
    tmp_path: Path,
    prometheus_factory: Callable[..., PrometheusServer],
) -> None:
    cluster, node = gpu_slurm
    port = free_port()
    env = {key: value for key, value in os.environ.items() if not key.startswith("GPUFLEET_")}
    env.update(
        GPUFLEET_LISTEN=f"127.0.0.1:{port}",
        GPUFLEET_GPU_SOURCE="synthetic",
        GPUFLEET_GPU_INTERVAL="1",
        GPUFLEET_NODE=cluster.host,
        GPUFLEET_HPC_JOB_MAPPING_DIR=str(node.mapping_dir),  # as /etc/default/gpufleet sets it
        GPUFLEET_HPC_JOB_MAPPING_INTERVAL="0.2",
    )
    agent = ManagedProcess([sys.executable, "-m", "gpufleet", "agent"], tmp_path / "agent.log", env)
    agent.start()
    try:

        def exposition() -> str:
            return http_get(f"http://127.0.0.1:{port}/metrics").decode()

        wait_until(lambda: "DCGM_FI_DEV_GPU_UTIL" in exposition(), 60, what="the agent's GPUs")
        gpus = sorted(key for key in jobs_on_gpus(exposition()) if ":" not in key)
        assert set(jobs_on_gpus(exposition())) == set(gpus), "no job, no hpc_job"

        job = held_job(cluster, tmp_path / "release", "--gres=gpu:2")
        wait_until(lambda: cluster.job(job)["job_state"] == "RUNNING", 60, what="the job running")
        held = gres_indices(cluster, job)
        expected = {gpu: {job} if gpu in held else {""} for gpu in gpus}
        expected |= {f"info:{gpu}": {job} for gpu in held}
        try:
            wait_until(lambda: jobs_on_gpus(exposition()) == expected, 60, interval=0.2,
                       what="hpc_job on the job's GPUs")  # fmt: skip
        except TimeoutError as error:
            raise AssertionError(f"{error}: {jobs_on_gpus(exposition())}") from None

        prometheus = prometheus_factory(
            scrape_configs=[static_scrape_config("gpufleet-agent", [f"127.0.0.1:{port}"])]
        )
        prometheus.wait_for_targets_up(1)
        joined = wait_until(lambda: prometheus.query(README_JOIN), 60, what="the documented join")
        assert [series["metric"] for series in joined] == [{"hpc_job": job}]
        assert 0 <= float(joined[0]["value"][1]) <= 100

        (tmp_path / "release").touch()
        no_jobs = {gpu: {""} for gpu in gpus}
        try:
            wait_until(lambda: jobs_on_gpus(exposition()) == no_jobs, 60, interval=0.2,
                       what="hpc_job gone with the job")  # fmt: skip
        except TimeoutError as error:
            raise AssertionError(f"{error}: {jobs_on_gpus(exposition())}") from None
    finally:
        agent.stop()
