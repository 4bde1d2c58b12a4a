"""Real ``torchrun`` jobs record their own attempts: the ranks tell a real ``gpufleet agent``
(``--gpu-source none``), which writes to a real ``gpufleet fleet`` ledger (a token file on
both sides), which a real Prometheus scrapes with ``alerts/reliability.rules.yaml``.

A job whose rank crashes once recovers on torchrun's restart; a job whose rank crashes
every time runs out of restarts, and GpuFleetRetryChainFailing fires for it alone."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpufleet.fleet.ledger_client import LedgerClient
from gpufleet.lab.devstack import PrometheusServer, static_scrape_config
from gpufleet.lab.processes import ManagedProcess, agent_process, free_port, http_get, wait_until

pytest.importorskip("torch")

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[1]
STEPS = 3  # per rank on an attempt that completes
TORCHRUN_TIMEOUT_S = 120  # four attempts took 56 s beside a busy core
LOG_LINES = 80
TOKEN = "ledger-write-token-for-tests"

# As tests/test_torchrun_restart.py: the process group meets in torchrun's store under a
# prefix per attempt (its keys outlive a crashed attempt). argv: agent URL, "once" (rank 1
# crashes on the first attempt) or "always" (on every attempt), after its first step.
WORKER = textwrap.dedent(
    f"""
    import os
    import sys
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from gpufleet.client import Reporter

    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
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
    reporter = Reporter(sys.argv[1])  # nothing about attempts: the client tells them itself
    crashes = sys.argv[2] == "always" or attempt == 0
    for step in range({STEPS}):
        if crashes and rank == 1 and step == 1:
            raise RuntimeError(f"rank 1 fails on attempt {{attempt}}")
        with reporter.step(tokens=4):
            dist.all_reduce(torch.ones(4))
        # rank 0's first step is with its agent before rank 1 can crash
        assert reporter.flush(10)
        dist.barrier()
    reporter.close()
    dist.destroy_process_group()
    """
)


@dataclass
class Stack:
    ledger: LedgerClient
    ledger_port: int
    agent_url: str
    workdir: Path

    def attempts(self, job: str) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = self.ledger.get_all("/v1/attempts", training_job=job)
        return sorted(rows, key=lambda row: row["attempt"])

    def chains(self, job: str) -> dict[str, Any]:
        found: dict[str, Any] = self.ledger.get("/v1/chains", training_job=job)[job]
        return found

    def run_job(self, job: str, crashes: str, max_restarts: int) -> tuple[int, str]:
        script = self.workdir / "worker.py"
        script.write_text(WORKER)
        env = {
            name: value
            for name, value in os.environ.items()
            if not name.startswith(("GPUFLEET_", "SLURM_", "TORCHELASTIC_"))
            and name != "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
        }
        env.update(OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", PYTHONUNBUFFERED="1")
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes=1",
            "--nproc-per-node=2",
            f"--max-restarts={max_restarts}",
            "--monitor-interval=0.1",
            "--rdzv-backend=c10d",
            "--rdzv-endpoint=127.0.0.1:0",
            "--rdzv-conf=is_host=1",
            "--local-addr=127.0.0.1",
            f"--rdzv-id={job}",
            str(script),
            self.agent_url,
            crashes,
        ]
        torchrun = ManagedProcess(command, self.workdir / f"{job}.log", env=env)
        torchrun.start()
        assert torchrun.process is not None
        try:
            returncode = torchrun.process.wait(TORCHRUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            tail = torchrun.log_tail(LOG_LINES)
            pytest.fail(f"torchrun still running after {TORCHRUN_TIMEOUT_S} s:\n{tail}")
        finally:
            torchrun.stop()
        return returncode, torchrun.log_tail(LOG_LINES)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    workdir = tmp_path_factory.mktemp("attempts")
    token_file = workdir / "ledger-token"
    token_file.write_text(TOKEN + "\n")
    ledger_port, agent_port = free_port(), free_port()
    ledger = ManagedProcess(
        [
            sys.executable,
            "-m",
            "gpufleet",
            "fleet",
            "--listen",
            f"127.0.0.1:{ledger_port}",
            "--db",
            str(workdir / "ledger.db"),
            "--token-file",
            str(token_file),
            "--log-level",
            "warning",
        ],
        workdir / "ledger.log",
    )
    agent = agent_process(
        workdir,
        agent_port,
        "none",
        "--ledger-url",
        f"http://127.0.0.1:{ledger_port}",
        "--ledger-token-file",
        str(token_file),
    )
    ledger.start()
    agent.start()
    try:
        for url in (f"http://127.0.0.1:{ledger_port}", f"http://127.0.0.1:{agent_port}"):
            wait_until(functools.partial(http_get, f"{url}/healthz"), 30, 0.1, what=url)
        yield Stack(
            LedgerClient(f"http://127.0.0.1:{ledger_port}", TOKEN),
            ledger_port,
            f"http://127.0.0.1:{agent_port}",
            workdir,
        )
    finally:
        agent.stop()
        ledger.stop()


def agent_counts(stack: Stack) -> dict[str, float]:
    counts = {}
    for line in http_get(f"{stack.agent_url}/metrics").decode().splitlines():
        if line.startswith("gpufleet_agent_attempt_events_total{"):
            name, value = line.rsplit(" ", 1)
            counts[name.split('"')[1]] = float(value)
    return counts


def test_a_job_that_crashes_once_recovers_in_the_ledger(stack: Stack) -> None:
    job = "attempts-recovered"
    returncode, log = stack.run_job(job, "once", max_restarts=2)
    assert returncode == 0, log
    first, second = wait_until(
        lambda: (rows := stack.attempts(job)) and len(rows) == 2 and rows[1]["outcome"] and rows,
        20,
        0.1,
        what=f"both attempts of {job} ended",
    )
    assert (first["attempt"], first["trigger"], first["source"]) == (1, "initial", "torchrun")
    # rank 1's excepthook told it first; rank 0's end (sigterm, or gloo's error) came after
    assert (first["outcome"], first["cause"]) == ("failed", "RuntimeError")
    assert first["started_at"] <= first["first_step_at"] <= first["ended_at"]
    assert (second["attempt"], second["trigger"], second["source"]) == (2, "auto", "torchrun")
    assert second["outcome"] == "success"
    assert second["first_step_at"] is not None

    history = stack.chains(job)
    (chain,) = history["chains"]
    assert (chain["outcome"], chain["attempts"], chain["failed_attempts"]) == ("recovered", [2], 0)
    (recovery,) = history["recoveries"]
    assert (recovery["failed_attempt"], recovery["next_attempt"]) == (1, 2)
    assert recovery["trigger"] == "auto"
    assert recovery["downtime_s"] == pytest.approx(second["first_step_at"] - first["ended_at"])
    assert recovery["downtime_s"] > 0

    # both ranks ended attempt 1 (and rank 0 may have sent it twice: its excepthook, then
    # SIGTERM): one end stored, the rest counted as duplicates by the agent
    counts = agent_counts(stack)
    assert counts["duplicate"] >= 1
    assert counts["failed"] == counts["dropped"] == counts["refused"] == 0


def test_a_job_that_keeps_crashing_pages_for_its_failing_retries(
    stack: Stack, prometheus_factory: Callable[..., PrometheusServer]
) -> None:
    job = "attempts-failing"
    # GpuFleetRetryChainFailing: 3 failed automatic retries after the first failure
    returncode, log = stack.run_job(job, "always", max_restarts=3)
    assert returncode != 0, log
    rows = wait_until(
        lambda: (rows := stack.attempts(job)) and len(rows) == 4 and rows[3]["outcome"] and rows,
        20,
        0.1,
        what=f"four attempts of {job} ended",
    )
    assert [row["trigger"] for row in rows] == ["initial", "auto", "auto", "auto"]
    assert [(row["outcome"], row["cause"]) for row in rows] == [("failed", "RuntimeError")] * 4
    # the fourth attempt was torchrun's last (TORCHELASTIC_MAX_RESTARTS=3): it said so
    assert [bool(row["restarts_exhausted"]) for row in rows] == [False, False, False, True]
    (chain,) = stack.chains(job)["chains"]
    # torchrun gave up: the chain is abandoned, its three failed retries still page until
    # somebody starts the job again
    assert (chain["outcome"], chain["attempts"], chain["failed_attempts"]) == (
        "abandoned",
        [2, 3, 4],
        3,
    )
    assert chain["restarts_exhausted"] is True

    prometheus = prometheus_factory(
        scrape_configs=[static_scrape_config("gpufleet-fleet", [f"127.0.0.1:{stack.ledger_port}"])],
        rule_files=[str(REPO / "alerts" / "reliability.rules.yaml")],
    )
    firing = wait_until(
        lambda: [
            alert
            for alert in prometheus.firing_alerts()
            if alert["labels"]["alertname"] == "GpuFleetRetryChainFailing"
        ],
        60,
        0.5,
        what="GpuFleetRetryChainFailing",
    )
    assert {alert["labels"]["training_job"] for alert in firing} == {job}
    assert firing[0]["labels"]["severity"] == "critical"
