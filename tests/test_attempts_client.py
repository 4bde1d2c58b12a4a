"""A training process tells its attempt's life to its agent, which writes it to the ledger:
real processes (an uncaught exception, SIGTERM while blocked in C, a clean exit), a real
agent and a real ledger on 127.0.0.1."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpufleet.agent.app import Agent, AgentSettings
from gpufleet.agent.ledger_forward import ForwardSettings
from gpufleet.fleet.app import create_app
from gpufleet.fleet.store import LedgerStore
from gpufleet.lab.processes import ManagedProcess, free_port, wait_until
from gpufleet.reporter.attempts import LaunchedAttempt, launched_attempt

EXIT_TIMEOUT_S = 30

PREAMBLE = """
import sys
from gpufleet.client import Reporter

reporter = Reporter(sys.argv[1])
with reporter.step(tokens=1):
    pass
"""
SCRIPTS = {
    "raises": PREAMBLE + "raise ValueError('the training step failed')\n",
    "interrupted": PREAMBLE + "raise KeyboardInterrupt\n",
    "exits": PREAMBLE,  # a normal exit: the Reporter closes at exit
    # Blocked in C for good (a collective on a dead peer): a Python handler would never run.
    "blocks": PREAMBLE
    + textwrap.dedent(
        """
        import ctypes
        mutex = ctypes.create_string_buffer(64)  # PTHREAD_MUTEX_INITIALIZER: all zero
        pthread = ctypes.CDLL(None)
        pthread.pthread_mutex_lock(mutex)
        assert reporter.flush(10)
        print("blocked", flush=True)
        pthread.pthread_mutex_lock(mutex)  # a default mutex locked twice: waits forever
        """
    ),
}


class Stack:
    def __init__(self, store: LedgerStore, agent: Agent, url: str) -> None:
        self.store = store
        self.agent = agent
        self.url = url

    def attempts(self, job: str) -> list[dict[str, Any]]:
        return [dict(row) for row in self.store.attempts(job)]

    def settled(self) -> bool:
        forwarder = self.agent.attempts.forwarder
        return forwarder is not None and forwarder.wait_idle(0)


@pytest.fixture
def stack(
    tmp_path: Path, serve_asgi: Callable[..., Any], serve_agent: Callable[..., Any]
) -> Iterator[Stack]:
    store = LedgerStore(tmp_path / "ledger.db")
    ledger = serve_asgi(create_app(store)).url
    forward = ForwardSettings(ledger, backoff_min_s=0.05, backoff_max_s=0.2)
    agent = Agent(AgentSettings(node="node-a", gpu_source="none", port=free_port(), ledger=forward))
    agent.open()
    yield Stack(store, agent, serve_agent(agent).url)
    store.close()


def launch(tmp_path: Path, stack: Stack, script: str, job: str, **env: str) -> ManagedProcess:
    path = tmp_path / f"{job}.py"
    path.write_text(SCRIPTS[script])
    environment = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("GPUFLEET_", "SLURM_", "TORCHELASTIC_"))
    }
    launcher = {"TORCHELASTIC_RUN_ID": job, "TORCHELASTIC_RESTART_COUNT": "0", "RANK": "0"}
    environment.update({**launcher, "PYTHONUNBUFFERED": "1", **env})
    process = ManagedProcess([sys.executable, str(path), stack.url], tmp_path / f"{job}.log")
    process.env = environment
    process.start()
    return process


def finished(process: ManagedProcess) -> int:
    assert process.process is not None
    try:
        return process.process.wait(EXIT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.stop()
        pytest.fail(f"still running after {EXIT_TIMEOUT_S} s:\n{process.log_tail()}")


def ended(stack: Stack, job: str) -> dict[str, Any]:
    rows: list[dict[str, Any]] = wait_until(
        lambda: [row for row in stack.attempts(job) if row["ended_at"] is not None],
        20,
        0.05,
        what=f"the end of {job}",
    )
    (row,) = rows
    assert row["started_at"] <= row["first_step_at"] <= row["ended_at"]
    return row


@pytest.mark.parametrize(
    ("script", "outcome", "cause", "status"),
    [
        ("raises", "failed", "ValueError", 1),
        ("interrupted", "cancelled", "KeyboardInterrupt", -signal.SIGINT),
        ("exits", "success", None, 0),
    ],
)
def test_an_attempt_ends_as_the_process_did(
    tmp_path: Path, stack: Stack, script: str, outcome: str, cause: str | None, status: int
) -> None:
    job = f"job-{script}"
    process = launch(tmp_path, stack, script, job)
    assert finished(process) == status, process.log_tail()
    row = ended(stack, job)
    assert (row["attempt"], row["trigger"], row["source"]) == (1, "initial", "torchrun")
    assert (row["outcome"], row["cause"]) == (outcome, cause)
    if script == "raises":  # the traceback is still printed, before the end is sent
        assert "ValueError: the training step failed" in process.log_path.read_text()


def test_sigterm_while_blocked_in_c_ends_the_attempt_and_kills_as_before(
    tmp_path: Path, stack: Stack
) -> None:
    job = "job-blocked"
    process = launch(tmp_path, stack, "blocks", job, TORCHELASTIC_RESTART_COUNT="2")
    wait_until(
        lambda: "blocked" in process.log_path.read_text(), 20, 0.05, what="the worker to block"
    )
    assert process.pid is not None
    os.kill(process.pid, signal.SIGTERM)
    assert finished(process) == -signal.SIGTERM  # the exit status SIGTERM gave before
    row = ended(stack, job)
    assert (row["attempt"], row["trigger"]) == (3, "auto")
    assert (row["outcome"], row["cause"]) == ("failed", "sigterm")


def test_no_launcher_or_a_non_zero_rank_starts_nothing(tmp_path: Path, stack: Stack) -> None:
    plain = launch(tmp_path, stack, "exits", "job-plain", TORCHELASTIC_RUN_ID="")
    other_rank = launch(tmp_path, stack, "exits", "job-rank-1", RANK="1")
    opted_out = launch(tmp_path, stack, "exits", "job-off", GPUFLEET_ATTEMPTS="0")
    for process in (plain, other_rank, opted_out):
        assert finished(process) == 0, process.log_tail()
    assert stack.agent.attempts.counts.outcomes()["received"] == 0


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, None),
        (
            {"TORCHELASTIC_RUN_ID": "r", "TORCHELASTIC_RESTART_COUNT": "0"},
            ("torchrun", 1, "initial"),
        ),
        ({"TORCHELASTIC_RUN_ID": "r", "TORCHELASTIC_RESTART_COUNT": "2"}, ("torchrun", 3, "auto")),
        (
            {
                "TORCHELASTIC_RUN_ID": "r",
                "TORCHELASTIC_RESTART_COUNT": "1",
                "TORCHELASTIC_MAX_RESTARTS": "3",
                "SLURM_JOB_ID": "77",
                "SLURM_RESTART_COUNT": "2",
            },
            ("torchrun", 10, "auto"),  # requeued twice (4 attempts each), restarted once
        ),
        ({"SLURM_JOB_ID": "77"}, ("slurm", 1, "initial")),
        ({"SLURM_JOB_ID": "77", "SLURM_RESTART_COUNT": "1"}, ("slurm", 2, "auto")),
        ({"SLURM_JOB_ID": "77", "GPUFLEET_ATTEMPT_TRIGGER": "manual"}, ("slurm", 1, "manual")),
        (
            {
                "TORCHELASTIC_RUN_ID": "r",
                "TORCHELASTIC_RESTART_COUNT": "0",
                "GPUFLEET_ATTEMPT": "4",
            },
            ("torchrun", 4, "manual"),
        ),
        (
            {
                "TORCHELASTIC_RUN_ID": "r",
                "TORCHELASTIC_RESTART_COUNT": "1",
                "GPUFLEET_ATTEMPT": "4",
                "GPUFLEET_ATTEMPT_TRIGGER": "manual",
            },
            ("torchrun", 5, "auto"),
        ),
        (
            {
                "TORCHELASTIC_RUN_ID": "r",
                "TORCHELASTIC_RESTART_COUNT": "2",
                "TORCHELASTIC_MAX_RESTARTS": "2",
            },
            ("torchrun", 3, "auto", True),  # torchrun's last restart: no attempt follows
        ),
        ({"GPUFLEET_ATTEMPT": "2"}, ("manual", 2, "manual")),
        ({"SLURM_JOB_ID": "77", "GPUFLEET_ATTEMPTS": "off"}, None),
    ],
)
def test_the_launchers_environment_numbers_the_attempt(
    env: dict[str, str], expected: tuple[str, int, str] | tuple[str, int, str, bool] | None
) -> None:
    found = launched_attempt(env)
    assert found == (LaunchedAttempt(*expected) if expected else None)  # type: ignore[arg-type]
