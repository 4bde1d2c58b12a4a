"""Real ``torchrun`` jobs of two "nodes" on this machine (``--nnodes 2``, a c10d rendezvous
on 127.0.0.1 hosted by node 0, gloo on CPU, two ranks per node), each node's ranks
reporting to its own ``gpufleet agent`` process (``--node node-a`` / ``node-b``), a real
Prometheus scraping both with ``alerts/layout.rules.yaml`` as shipped.

A 2x2 DeviceMesh with tp inside each node pages nothing; the same mesh with its
dimensions swapped, so that each tp group holds one rank of each node, pages
GpuFleetTensorParallelAcrossNodes within 2 minutes, naming the job and the group; a job
that names no mesh and sets GPUFLEET_TP_SIZE=4 pages the same. The workers pass nothing
to the client: it finds the layout itself after their first step."""

from __future__ import annotations

import functools
import importlib.util
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from gpufleet.lab.devstack import PrometheusServer, static_scrape_config
from gpufleet.lab.processes import ManagedProcess, agent_process, free_port, http_get, wait_until
from gpufleet.rules.config import RulesConfig, duration_seconds

pytest.importorskip("torch")

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[1]
NODES = ("node-a", "node-b")
TORCHRUN_TIMEOUT_S = 120  # two launchers and four ranks beside busy cores
PAGE_WITHIN_S = 120.0  # the budget, from the job's start to the page
ALERT = "GpuFleetTensorParallelAcrossNodes"

# argv: the mesh's dimension names in order ("dp,tp"), "none" for no mesh, "megatron:N" for
# Megatron-Core's parallel_state with tensor parallelism N, or "deepspeed:N" for DeepSpeed's
# pipeline grid with N model-parallel ranks per stage (no mesh); a file where
# rank 0 writes when training began (the process group made: what a page is timed from).
WORKER = textwrap.dedent(
    """
    import sys
    import time
    from pathlib import Path

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from gpufleet.client import Reporter

    dist.init_process_group("gloo")
    if dist.get_rank() == 0:
        Path(sys.argv[2]).write_text(repr(time.time()))
    reporter = Reporter()  # the agent from GPUFLEET_AGENT_URL, the job from torchrun
    names = sys.argv[1]
    mesh = None
    if names.startswith("megatron:"):
        from megatron.core import parallel_state

        parallel_state.initialize_model_parallel(tensor_model_parallel_size=int(names[9:]))
    elif names.startswith("deepspeed:"):
        import deepspeed
        from deepspeed.runtime.pipe.topology import (
            PipeModelDataParallelTopology,
            PipelineParallelGrid,
        )

        deepspeed.init_distributed(dist_backend="gloo")
        model = int(names[10:])
        topology = PipeModelDataParallelTopology(num_pp=1, num_mp=model, num_dp=4 // model)
        mesh = PipelineParallelGrid(topology=topology)  # what its PipelineEngine makes
    elif names != "none":
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=tuple(names.split(",")))
    for _ in range(3):
        with reporter.step(tokens=1):
            dist.all_reduce(torch.ones(1))
    assert reporter.flush(30)
    dist.barrier()
    reporter.close()
    dist.destroy_process_group()
    """
)


@dataclass
class Cluster:
    agents: dict[str, str]  # node -> agent URL
    prometheus: PrometheusServer
    workdir: Path

    def run_job(self, job: str, mesh: str, **env: str) -> float:
        """Both nodes' torchrun of one job, to the end; when it began training (epoch s)."""
        script = self.workdir / "worker.py"
        script.write_text(WORKER)
        rendezvous = f"127.0.0.1:{free_port()}"
        launchers = []
        began = self.workdir / f"{job}.began"
        for index, (node, url) in enumerate(self.agents.items()):
            environment = {
                name: value
                for name, value in os.environ.items()
                if not name.startswith(("GPUFLEET_", "SLURM_", "TORCHELASTIC_"))
                and name not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")
            }
            environment.update(
                GPUFLEET_AGENT_URL=url,
                OMP_NUM_THREADS="1",
                GLOO_SOCKET_IFNAME="lo",
                PYTHONUNBUFFERED="1",
                **env,
            )
            command = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes=2",
                "--nproc-per-node=2",
                f"--node-rank={index}",
                "--rdzv-backend=c10d",
                f"--rdzv-endpoint={rendezvous}",
                f"--rdzv-id={job}",
                # node 0 hosts the rendezvous store; the other only connects to it
                f"--rdzv-conf=is_host={int(index == 0)}",
                "--local-addr=127.0.0.1",
                "--max-restarts=0",
                "--monitor-interval=0.1",
                str(script),
                mesh,
                str(began),
            ]
            log = self.workdir / f"{job}-{node}.log"
            launchers.append(ManagedProcess(command, log, env=environment))
        for launcher in launchers:
            launcher.start()
        try:
            for launcher in launchers:
                assert launcher.process is not None
                try:
                    code = launcher.process.wait(TORCHRUN_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    pytest.fail(f"torchrun of {job} still running:\n{launcher.log_tail(60)}")
                assert code == 0, launcher.log_tail(60)
        finally:
            for launcher in launchers:
                launcher.stop()
        return float(began.read_text())

    def firing(self, job: str) -> list[dict[str, Any]]:
        return [
            alert
            for alert in self.prometheus.firing_alerts()
            if alert["labels"]["alertname"] == ALERT and alert["labels"]["training_job"] == job
        ]

    def wait_firing(self, job: str, began: float) -> dict[str, Any]:
        """The job's alert, once firing; it must have fired within PAGE_WITHIN_S of the
        job's start (pending since activeAt, firing ``for`` later)."""
        budget = max(1.0, began + PAGE_WITHIN_S - time.time())
        (alert,) = wait_until(lambda: self.firing(job), budget, 0.5, what=f"{ALERT} for {job}")
        whole, _, fraction = alert["activeAt"].rstrip("Z").partition(".")
        pending = datetime.fromisoformat(f"{whole}.{fraction[:6] or 0}+00:00").timestamp()
        fired = pending + duration_seconds(RulesConfig().tp_across_nodes_for) - began
        print(f"{ALERT} for {job}: fired {fired:.0f} s after training began")
        assert fired <= PAGE_WITHIN_S
        return alert

    def tp_groups(self, job: str) -> dict[str, float]:
        result = self.prometheus.query(
            f'group:gpufleet_training_parallel_nodes:count{{training_job="{job}",group="tp"}}'
        )
        return {row["metric"]["group_first_rank"]: float(row["value"][1]) for row in result}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, prometheus_major: str) -> Iterator[Cluster]:
    workdir = tmp_path_factory.mktemp("layout")
    agents: dict[str, str] = {}
    processes = []
    for node in NODES:
        port = free_port()
        node_dir = workdir / node
        node_dir.mkdir()
        processes.append(agent_process(node_dir, port, "none", "--node", node))
        agents[node] = f"http://127.0.0.1:{port}"
    prometheus = PrometheusServer(
        workdir / "prometheus",
        scrape_configs=[
            static_scrape_config(
                "gpufleet-agent", [url.removeprefix("http://") for url in agents.values()]
            )
        ],
        rule_files=[str(REPO / "alerts" / "layout.rules.yaml")],
    )
    try:
        for process in processes:
            process.start()
        for url in agents.values():
            wait_until(functools.partial(http_get, f"{url}/healthz"), 30, 0.1, what=url)
        prometheus.start()
        prometheus.wait_for_targets_up(2)
        yield Cluster(agents, prometheus, workdir)
    finally:
        prometheus.stop()
        for process in processes:
            process.stop()


@pytest.fixture(scope="module")
def jobs(cluster: Cluster) -> dict[str, float]:
    """The three jobs, one after the other; when each began training."""
    return {
        # mesh (dp, tp): tp groups {0, 1} and {2, 3}, one per node; dp across the nodes
        "tp-inside": cluster.run_job("tp-inside", "dp,tp"),
        # mesh (tp, dp): tp groups {0, 2} and {1, 3}, each on both nodes
        "tp-straddling": cluster.run_job("tp-straddling", "tp,dp"),
        # no mesh: tp 4 from the environment, ranks 0-3 on two nodes
        "tp-explicit": cluster.run_job("tp-explicit", "none", GPUFLEET_TP_SIZE="4"),
        # Megatron-Core's own groups, tp 4 (where it is installed: not a dependency)
        **(
            {"tp-megatron": cluster.run_job("tp-megatron", "megatron:4")}
            if importlib.util.find_spec("megatron") is not None
            else {}
        ),
        # DeepSpeed's pipeline grid, 4 model-parallel ranks (where it is installed)
        **(
            {"tp-deepspeed": cluster.run_job("tp-deepspeed", "deepspeed:4")}
            if importlib.util.find_spec("deepspeed") is not None
            else {}
        ),
    }


def test_a_tp_group_straddling_two_nodes_pages_within_two_minutes(
    cluster: Cluster, jobs: dict[str, float]
) -> None:
    alert = cluster.wait_firing("tp-straddling", jobs["tp-straddling"])
    assert alert["labels"]["group"] == "tp"
    assert alert["labels"]["severity"] == "warning"
    assert "job tp-straddling span up to 2 nodes" in alert["annotations"]["description"]
    assert cluster.tp_groups("tp-straddling") == {"0": 2.0, "1": 2.0}


def test_tp_from_the_environment_pages_the_same(cluster: Cluster, jobs: dict[str, float]) -> None:
    alert = cluster.wait_firing("tp-explicit", jobs["tp-explicit"])
    assert alert["labels"]["group"] == "tp"
    assert cluster.tp_groups("tp-explicit") == {"0": 2.0}


def test_megatron_cores_groups_page_the_same(cluster: Cluster, jobs: dict[str, float]) -> None:
    if "tp-megatron" not in jobs:
        pytest.skip("megatron-core is not installed (it is no dependency of gpufleet)")
    alert = cluster.wait_firing("tp-megatron", jobs["tp-megatron"])
    assert alert["labels"]["group"] == "tp"
    assert cluster.tp_groups("tp-megatron") == {"0": 2.0}


def test_deepspeeds_pipeline_grid_pages_the_same(cluster: Cluster, jobs: dict[str, float]) -> None:
    if "tp-deepspeed" not in jobs:
        pytest.skip("deepspeed is not installed (the adapters extra brings it)")
    alert = cluster.wait_firing("tp-deepspeed", jobs["tp-deepspeed"])
    assert alert["labels"]["group"] == "tp"
    assert cluster.tp_groups("tp-deepspeed") == {"0": 2.0}


def test_tp_inside_each_node_pages_nothing(cluster: Cluster, jobs: dict[str, float]) -> None:
    # each tp group on one node; the dp groups span both and page nothing either
    assert cluster.tp_groups("tp-inside") == {"0": 1.0, "2": 1.0}
    dp = cluster.prometheus.query(
        'group:gpufleet_training_parallel_nodes:count{training_job="tp-inside",group="dp"}'
    )
    assert sorted(float(row["value"][1]) for row in dp) == [2.0, 2.0]
    # The straddling job ran after it and has paged: its layout had as long as that one's
    # to page, and was never even pending.
    cluster.wait_firing("tp-straddling", jobs["tp-straddling"])
    ever = cluster.prometheus.query('max_over_time(ALERTS{training_job="tp-inside"}[1h])')
    assert ever == []
