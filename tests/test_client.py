"""The training client against a real agent over HTTP: timing, buffering, outages, exit."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpufleet.agent.app import Agent, AgentSettings
from gpufleet.client import (
    Reporter,
    attempt_from_environment,
    job_from_environment,
    rank_from_environment,
)
from gpufleet.lab.processes import free_port, wait_until
from gpufleet.reporter import identity
from gpufleet.reporter.events import StepEvent


def start_agent(
    serve_asgi: Callable[..., Any], port: int | None = None, token: str | None = None
) -> tuple[Agent, str]:
    agent = Agent(AgentSettings(node="node-c", gpu_source="none", ingest_token=token))
    agent.open()
    server = serve_asgi(agent.asgi(), port)
    return agent, server.url


def counter(agent: Agent, name: str, **labels: str) -> float:
    for family in agent.training.collect():
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return 0.0


def test_steps_timed_by_the_context_manager(serve_asgi: Callable[..., Any]) -> None:
    agent, url = start_agent(serve_asgi)
    reporter = Reporter(url, training_job="ctx-job", rank=3, pp_stage=1)
    try:
        for _ in range(5):
            time.sleep(0.02)  # the "data loader": the gap before each step
            with reporter.step(tokens=128) as step:
                time.sleep(0.03)
                with step.comm():
                    time.sleep(0.01)
        assert reporter.flush(5)
    finally:
        reporter.close()
    labels = {"training_job": "ctx-job", "pp_stage": "1"}
    assert counter(agent, "gpufleet_training_steps_total", **labels) == 5
    assert counter(agent, "gpufleet_training_tokens_total", **labels) == 640
    step_s = counter(agent, "gpufleet_training_step_seconds_total", **labels)
    data_s = counter(agent, "gpufleet_training_data_wait_seconds_total", **labels)
    comm_s = counter(agent, "gpufleet_training_collective_wait_seconds_total", **labels)
    compute_s = counter(agent, "gpufleet_training_compute_seconds_total", **labels)
    # the first step has no previous step, so four gaps of ~20 ms count as data wait
    assert 0.07 < data_s < 0.2
    assert 0.045 < comm_s < 0.15
    assert 0.14 < compute_s < 0.4
    assert step_s == pytest.approx(data_s + comm_s + compute_s, rel=1e-6)
    assert reporter.sent == 5 and reporter.dropped_total == 0


def test_explicit_records_and_checkpoint_split(serve_asgi: Callable[..., Any]) -> None:
    agent, url = start_agent(serve_asgi)
    reporter = Reporter(url, training_job="rec-job", rank=0)
    try:
        reporter.record_step(
            1.5, compute_s=1.0, data_wait_s=0.1, comm_wait_s=0.4, tokens=10, step=7
        )
        with reporter.checkpoint("save", bytes=1024) as checkpoint:
            time.sleep(0.05)  # queued for a storage slot
            checkpoint.serving()
            time.sleep(0.02)
        reporter.record_checkpoint("restore", queue_wait_s=3.0, service_s=1.0, bytes=99)
        assert reporter.flush(5)
    finally:
        reporter.close()
    save = {"training_job": "rec-job", "op": "save"}
    assert counter(agent, "gpufleet_training_step_number", training_job="rec-job") == 7
    assert counter(agent, "gpufleet_training_compute_seconds_total", training_job="rec-job") == 1.0
    assert 0.045 < counter(agent, "gpufleet_checkpoint_queue_wait_seconds_total", **save) < 0.2
    assert 0.015 < counter(agent, "gpufleet_checkpoint_service_seconds_total", **save) < 0.1
    assert counter(agent, "gpufleet_checkpoint_in_flight", **save) == 0
    restore = {"training_job": "rec-job", "op": "restore"}
    assert counter(agent, "gpufleet_checkpoint_queue_wait_seconds_total", **restore) == 3.0
    assert counter(agent, "gpufleet_checkpoint_operations_total", **restore, outcome="ok") == 1


def test_a_failed_step_is_not_recorded_and_the_error_reaches_the_caller(
    serve_asgi: Callable[..., Any],
) -> None:
    agent, url = start_agent(serve_asgi)
    reporter = Reporter(url, training_job="err-job", rank=0)
    try:
        with pytest.raises(RuntimeError, match="CUDA error"), reporter.step():
            raise RuntimeError("CUDA error: an illegal memory access")
        with pytest.raises(OSError), reporter.checkpoint("save"):
            raise OSError("disk full")
        assert reporter.flush(5)
    finally:
        reporter.close()
    assert counter(agent, "gpufleet_training_steps_total", training_job="err-job") == 0
    failed = counter(
        agent, "gpufleet_checkpoint_operations_total", training_job="err-job", outcome="failed"
    )
    assert failed == 1


def test_recording_never_waits_on_a_sender_stuck_in_a_request() -> None:
    """A sender stuck in a request (an agent that accepts and never answers) holds
    no lock the training loop needs: recording goes on while the request hangs."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []
    threading.Thread(target=lambda: accepted.append(listener.accept()[0]), daemon=True).start()
    reporter = Reporter(
        f"http://127.0.0.1:{listener.getsockname()[1]}",
        training_job="stuck",
        rank=0,
        batch_size=1,
        flush_interval=0.01,
        timeout=120,
    )
    try:
        reporter.record_step(0.5, step=0)
        wait_until(lambda: accepted, 30, what="the sender to connect")
        done = threading.Event()

        def record() -> None:
            for n in range(1, 151):
                reporter.record_step(0.5, step=n)
            done.set()

        threading.Thread(target=record, daemon=True).start()
        # Recording that waited for the stuck request would wait its 120 s timeout.
        assert done.wait(60), "recording waited for the sender's request"
        assert reporter.sent == 0
    finally:
        listener.close()
        for connection in accepted:
            connection.close()
        reporter.close()


def test_agent_down_never_blocks_or_raises_then_delivers_and_reports_drops(
    serve_asgi: Callable[..., Any],
) -> None:
    port = free_port()
    reporter = Reporter(
        f"http://127.0.0.1:{port}",
        training_job="outage",
        rank=1,
        buffer_size=100,
        batch_size=50,
        flush_interval=0.05,
        timeout=0.5,
    )
    try:
        for n in range(150):
            reporter.record_step(0.5, step=n)
        assert not reporter.flush(0.3)
        assert reporter.dropped_total == 50  # the buffer holds 100
        agent, _ = start_agent(serve_asgi, port)
        wait_until(lambda: reporter.sent == 100, 40, what="delivery after the agent came back")
        assert counter(agent, "gpufleet_training_steps_total", training_job="outage") == 100
        assert counter(agent, "gpufleet_ingest_client_dropped_total") == 50
        assert reporter.dropped == 0  # reported, so no longer owed
    finally:
        reporter.close()


def test_rejected_events_are_dropped_and_counted_not_raised(serve_asgi: Callable[..., Any]) -> None:
    agent, url = start_agent(serve_asgi, token="right")
    reporter = Reporter(url, training_job="auth", rank=0, token="wrong")
    try:
        reporter.record_step(1.0)
        assert reporter.flush(5)
        assert reporter.rejected == 1 and reporter.sent == 0
        assert counter(agent, "gpufleet_ingest_rejected_total", reason="unauthorized") == 1
    finally:
        reporter.close()
    good = Reporter(url, training_job="auth", rank=0, token="right")
    good.record_step(1.0)
    assert good.flush(5)
    good.close()
    assert counter(agent, "gpufleet_training_steps_total", training_job="auth") == 1


def test_buffered_events_are_flushed_at_exit(serve_asgi: Callable[..., Any]) -> None:
    agent, url = start_agent(serve_asgi)
    script = textwrap.dedent(
        f"""
        from gpufleet.client import Reporter
        reporter = Reporter({url!r}, training_job="exit-job", rank=2, flush_interval=60)
        for n in range(25):
            reporter.record_step(0.1, step=n)
        # no close(): the interpreter's exit must flush
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    assert counter(agent, "gpufleet_training_steps_total", training_job="exit-job") == 25
    # ...and then tell the agent the rank finished (after its steps: an unknown rank
    # would be ignored), so the job's end does not look like a hang
    finished = counter(
        agent, "gpufleet_training_finished_timestamp_seconds", training_job="exit-job"
    )
    assert time.time() - 60 < finished <= time.time()


def test_finish_marks_the_rank_done_until_it_steps_again(serve_asgi: Callable[..., Any]) -> None:
    agent, url = start_agent(serve_asgi)
    reporter = Reporter(url, training_job="fit-job", rank=0)
    try:
        reporter.record_step(0.1, step=0)
        assert reporter.finish(5)
        labels = {"training_job": "fit-job"}
        assert counter(agent, "gpufleet_training_finished_timestamp_seconds", **labels) > 0
        reporter.record_step(0.1, step=1)  # e.g. trainer.test() after trainer.fit()
        assert reporter.flush(5)
        assert counter(agent, "gpufleet_training_finished_timestamp_seconds", **labels) == 0
        assert reporter.sent == 2  # the finish marker is not an event
    finally:
        reporter.close()


def test_a_forked_child_reports_on_its_own(serve_asgi: Callable[..., Any]) -> None:
    agent, url = start_agent(serve_asgi)
    reporter = Reporter(url, training_job="fork-job", rank=0)
    reporter.record_step(1.0, step=0)
    assert reporter.flush(5)
    pid = os.fork()
    if pid == 0:  # child: a fresh sender thread, an empty buffer
        reporter.record_step(1.0, step=1)
        os._exit(0 if reporter.flush(5) else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    reporter.close()
    assert counter(agent, "gpufleet_training_steps_total", training_job="fork-job") == 2


def test_disabled_reporter_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFLEET_DISABLE", "1")
    reporter = Reporter("http://127.0.0.1:1")
    with reporter.step():
        pass
    reporter.record_step(1.0)
    assert reporter._thread is None and not reporter._buffer
    reporter.close()


def test_configuration_from_launcher_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    # every variable the client reads, so the machine running the test cannot leak in
    read = (*identity.JOB_VARIABLES, *identity.RANK_VARIABLES)
    for name in (*read, "GPUFLEET_AGENT_URL", "GPUFLEET_INGEST_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")  # torchrun's placeholder is skipped
    monkeypatch.setenv("SLURM_JOB_ID", "812345")
    monkeypatch.setenv("SLURM_PROCID", "17")
    assert job_from_environment() == "812345"
    assert rank_from_environment() == 17
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "a1b2 c3")
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("GPUFLEET_AGENT_URL", "http://10.1.2.3:9999")
    monkeypatch.setenv("GPUFLEET_INGEST_TOKEN", "tok")
    reporter = Reporter(enabled=False)
    assert reporter.training_job == "a1b2_c3"  # made acceptable as a label
    assert reporter.rank == 5
    assert (reporter._agent.host, reporter._agent.port) == ("10.1.2.3", 9999)
    assert reporter._agent.headers["Authorization"] == "Bearer tok"


def test_the_attempt_comes_from_the_launcher_and_an_argument_overrides_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in identity.ATTEMPT_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert attempt_from_environment() == 0
    assert Reporter(enabled=False).attempt == 0
    monkeypatch.setenv("SLURM_RESTART_COUNT", "3")
    assert attempt_from_environment() == 3
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")  # torchrun's, ahead of Slurm's
    reporter = Reporter(enabled=False, training_job="j", rank=2, pp_stage=1)
    assert reporter.attempt == 1
    payload = reporter._step_json(StepEvent(4, 1.0, None, 0.0, 0.0, 0, "train"))
    assert (payload["rank"], payload["pp_stage"], payload["attempt"]) == (2, 1, 1)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "x")  # not a count: the next one is read
    assert attempt_from_environment() == 3
    assert Reporter(enabled=False, attempt=7).attempt == 7


def test_every_sent_step_carries_the_attempt(serve_asgi: Callable[..., Any]) -> None:
    agent, url = start_agent(serve_asgi)
    reporter = Reporter(url, training_job="restarted", rank=0, attempt=2)
    try:
        for _ in range(3):
            reporter.record_step(0.5)
        assert reporter.flush(5)
    finally:
        reporter.close()
    labels = {"training_job": "restarted", "pp_stage": "0"}
    assert counter(agent, "gpufleet_training_steps_total", **labels) == 3
    assert counter(agent, "gpufleet_training_attempt", **labels) == 2


def test_flush_never_reports_done_while_a_taken_batch_is_unsent(
    serve_asgi: Callable[..., Any],
) -> None:
    _, url = start_agent(serve_asgi)
    seen: list[bool] = []

    class Observed(Reporter):
        def _take(self) -> list[tuple[object, ...]]:
            taken = super()._take()
            # The buffer is empty now and nothing is sent yet: flush() must not say done.
            seen.append(self.flush(timeout=0.0))
            return taken

    reporter = Observed(url, training_job="race", rank=0)
    try:
        reporter.record_step(1.0)
        assert reporter.flush(10)
    finally:
        reporter.close()
    assert seen and not any(seen)
    assert reporter.sent == 1


def test_overlapping_timings_are_clamped_so_the_step_is_kept(
    serve_asgi: Callable[..., Any],
) -> None:
    agent, url = start_agent(serve_asgi)
    reporter = Reporter(url, training_job="overlap", rank=0)
    try:
        # The all-reduce ran 0.5 s under a 0.9 s backward: only 0.05 s of it was exposed.
        reporter.record_step(1.0, compute_s=0.9, data_wait_s=0.05, comm_wait_s=0.5)
        assert reporter.flush(5)
    finally:
        reporter.close()
    labels = {"training_job": "overlap"}
    assert reporter.sent == 1 and reporter.rejected == 0
    assert counter(agent, "gpufleet_training_steps_total", **labels) == 1
    assert counter(agent, "gpufleet_training_compute_seconds_total", **labels) == 0.9
    comm = counter(agent, "gpufleet_training_collective_wait_seconds_total", **labels)
    assert comm == pytest.approx(0.05)


def test_an_event_that_cannot_be_sent_costs_none_of_its_neighbours(
    serve_asgi: Callable[..., Any],
) -> None:
    agent, url = start_agent(serve_asgi)
    reporter = Reporter(url, training_job="one-bad", rank=0)
    try:
        reporter.record_step(1.0)
        reporter.record_step(float("nan"))  # a broken timer
        reporter.record_step(1.0, tokens=-5)
        reporter.record_step(1.0)
        assert reporter.flush(5)
    finally:
        reporter.close()
    assert reporter.sent == 2 and reporter.invalid == 2
    assert counter(agent, "gpufleet_training_steps_total", training_job="one-bad") == 2
    # what the client dropped is visible on the agent, not only in the training log
    assert counter(agent, "gpufleet_ingest_client_dropped_total") == 2


def test_events_the_agent_refuses_are_dropped_alone_and_the_rest_resent(
    serve_asgi: Callable[..., Any],
) -> None:
    agent, url = start_agent(serve_asgi)

    class Skewed(Reporter):
        # An agent stricter than this client (version skew): step 2 is refused there.
        def _step_json(self, event: tuple[object, ...]) -> dict[str, object]:
            payload = super()._step_json(event)
            return {**payload, "rank": "0"} if payload["step"] == 2 else payload

    reporter = Skewed(url, training_job="skew", rank=0)
    try:
        for n in range(5):
            reporter.record_step(1.0, step=n)
        assert reporter.flush(5)
    finally:
        reporter.close()
    assert reporter.rejected == 1 and reporter.sent == 4
    assert counter(agent, "gpufleet_training_steps_total", training_job="skew") == 4
    assert counter(agent, "gpufleet_ingest_rejected_total", reason="invalid") == 5


def test_the_largest_batch_the_client_sends_fits_what_the_agent_accepts() -> None:
    from gpufleet.agent.limits import IngestLimits
    from gpufleet.reporter.events import CheckpointEvent
    from gpufleet.reporter.wire import MAX_ATTEMPT, MAX_BATCH_EVENTS, MAX_RANK, MAX_STEP_NUMBER

    limits = IngestLimits()
    reporter = Reporter(
        enabled=False,
        training_job="j" * 128,
        rank=MAX_RANK,
        pp_stage=1023,
        dp_rank=MAX_RANK,
        attempt=MAX_ATTEMPT,
        batch_size=10**6,
    )
    assert reporter._batch_size == MAX_BATCH_EVENTS  # clamped to what the agent takes
    # 22-character float reprs (17 digits and an exponent) are the longest JSON gives.
    d, a, b, c = 9.876543210987654e-05, 1.2345678901234567e-05, 2.345678901234568e-05, 3.456e-05
    step = reporter._step_json(
        StepEvent(MAX_STEP_NUMBER, d, b, a, c + 1.23456789012e-09, 10**9 - 1, "checkpoint")
    )
    checkpoint = reporter._checkpoint_json(
        CheckpointEvent("restore", "end", "i" * 128, a, b, 10**15 - 1, False)
    )
    for event in (step, checkpoint):
        body = json.dumps({"events": [event] * MAX_BATCH_EVENTS, "dropped": 2**40}).encode()
        assert len(body) <= limits.max_body_bytes, len(body)
        print(f"largest client batch: {len(body)} bytes")


def test_the_token_can_come_from_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUFLEET_INGEST_TOKEN", raising=False)
    secret = tmp_path / "token"
    secret.write_text("from-file\n")
    monkeypatch.setenv("GPUFLEET_INGEST_TOKEN_FILE", str(secret))
    assert Reporter(enabled=False)._agent.headers["Authorization"] == "Bearer from-file"


@pytest.mark.parametrize(
    ("identity", "message"),
    [
        ({"rank": -1}, "rank=-1"),
        ({"pp_stage": 4096}, "pp_stage=4096"),
        ({"dp_rank": -2}, "dp_rank"),
        ({"attempt": -1}, "attempt=-1"),
    ],
)
def test_an_identity_the_agent_would_refuse_disables_the_client_loudly(
    identity: dict[str, int], message: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("ERROR", logger="gpufleet.client"):
        reporter = Reporter("http://127.0.0.1:9", training_job="bad-id", **identity)
    assert not reporter.enabled
    assert message in caplog.text and "disabled" in caplog.text
    reporter.record_step(1.0)  # a no-op, never a raise
