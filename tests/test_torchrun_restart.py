"""A real ``torchrun --max-restarts 1``: a rank crashes, torchrun restarts every worker,
and the agent counts both attempts' steps under one training_job and shows attempt 1."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpufleet.agent.app import Agent, AgentSettings
from gpufleet.lab.processes import ManagedProcess, wait_until

pytest.importorskip("torch")

pytestmark = pytest.mark.integration

STEPS = 5  # per rank on the attempt that completes
CRASH_AT = 3  # rank 1 raises before this step on attempt 0; steps 0..2 were reported
# Idle, torchrun takes about 5 s here. The bound is for a process group that never forms:
# gloo waiting for a peer to connect heeds no timeout of the worker's.
TORCHRUN_TIMEOUT_S = 90
LOG_LINES = 80

# Each rank reports to the agent named on its command line; the job id and the attempt
# come from what torchrun sets (TORCHELASTIC_RUN_ID, TORCHELASTIC_RESTART_COUNT).
#
# The process group meets in the agent's store under a prefix per attempt, not through
# the plain init_process_group("gloo"). torchrun's c10d rendezvous hands its workers a
# TCPStore that the agent hosts (MASTER_ADDR/MASTER_PORT, TORCHELASTIC_USE_AGENT_STORE)
# and keeps for the whole run: after a restart it still holds the gloo addresses the
# crashed attempt's ranks published (default_pg/0//cpu//0/<rank>). A restarted rank that
# reads its peer's key before the peer rewrites it connects to a dead process (gloo
# connectFullMesh: connection refused) or, when both ranks read stale keys, both wait to
# be connected to and the group never forms (torchrun past its timeout). A prefix per
# attempt gives each attempt keys of its own; one node restarts all its ranks together,
# so they agree on TORCHELASTIC_RESTART_COUNT.
WORKER = textwrap.dedent(
    f"""
    import os
    import sys
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from gpufleet.client import Reporter

    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    assert os.environ["TORCHELASTIC_USE_AGENT_STORE"] == "True"
    timeout = timedelta(seconds=30)
    agent_store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timeout
    )
    dist.init_process_group(
        "gloo",
        store=dist.PrefixStore(f"attempt-{{attempt}}", agent_store),
        rank=int(os.environ["RANK"]),
        world_size=int(os.environ["WORLD_SIZE"]),
        timeout=timeout,
    )
    rank = dist.get_rank()
    reporter = Reporter(sys.argv[1])
    for step in range({STEPS}):
        if attempt == 0 and rank == 1 and step == {CRASH_AT}:
            raise RuntimeError("rank 1 fails on the first attempt")
        with reporter.step(tokens=4):
            dist.all_reduce(torch.ones(4))
        # Flushed before the barrier: rank 1 cannot crash before rank 0 has sent the
        # step, and torchrun stops rank 0 with SIGTERM, which runs no exit handler.
        assert reporter.flush(10)
        dist.barrier()
    reporter.close()
    dist.destroy_process_group()
    """
)


def value(agent: Agent, name: str, **labels: str) -> float | None:
    for family in agent.training.collect():
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return None


def test_a_job_torchrun_restarts_counts_both_attempts_under_one_training_job(
    serve_asgi: Callable[..., Any], tmp_path: Path
) -> None:
    agent = Agent(AgentSettings(node="node-r", gpu_source="none"))
    agent.open()
    url = serve_asgi(agent.asgi()).url
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("GPUFLEET_", "SLURM_", "TORCHELASTIC_"))
        # the workers meet in the agent's store, which this would take away
        and name != "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
    }
    env.update(
        OMP_NUM_THREADS="1",
        GLOO_SOCKET_IFNAME="lo",  # gloo on the loopback, whatever the host name resolves to
        PYTHONUNBUFFERED="1",
    )
    run_id = "restart-job-1"
    # An explicit c10d rendezvous, not --standalone: --standalone replaces --rdzv-id with a
    # random one, and the test needs the job id it chose. Port 0 with is_host: the agent
    # binds a port of the kernel's choosing, which no other process can take first.
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=1",
        "--nproc-per-node=2",
        "--max-restarts=1",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=127.0.0.1:0",
        "--rdzv-conf=is_host=1",
        "--local-addr=127.0.0.1",
        f"--rdzv-id={run_id}",
        str(script),
        url,
    ]
    torchrun = ManagedProcess(command, tmp_path / "torchrun.log", env=env)
    torchrun.start()
    assert torchrun.process is not None
    try:
        returncode = torchrun.process.wait(TORCHRUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(
            f"torchrun still running after {TORCHRUN_TIMEOUT_S} s:\n{torchrun.log_tail(LOG_LINES)}"
        )
    finally:
        torchrun.stop()
    assert returncode == 0, torchrun.log_tail(LOG_LINES)
    # attempt 0 did crash
    assert "rank 1 fails on the first attempt" in torchrun.log_path.read_text(errors="replace")

    labels = {"training_job": run_id, "node": "node-r", "pp_stage": "0"}
    expected = 2 * CRASH_AT + 2 * STEPS  # attempt 0's steps on both ranks, then attempt 1's
    wait_until(
        lambda: value(agent, "gpufleet_training_steps_total", **labels) == expected,
        timeout=10,
        interval=0.05,
        what=f"{expected} steps of {run_id}",
    )
    assert value(agent, "gpufleet_training_attempt", **labels) == 1
    assert value(agent, "gpufleet_training_step_number", **labels) == STEPS - 1
    jobs = {
        sample.labels["training_job"]
        for family in agent.training.collect()
        for sample in family.samples
        if "training_job" in sample.labels
    }
    assert jobs == {run_id}  # the restarted workers kept the job id
