"""The agent's relay of job attempt events to a real fleet ledger (served on 127.0.0.1):
what it does when the ledger is down, refuses, or is too slow for the queue."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpufleet.agent.app import Agent, AgentSettings
from gpufleet.agent.ledger_forward import ForwardSettings, LedgerForwarder
from gpufleet.fleet.app import create_app
from gpufleet.fleet.ledger_client import LedgerClient
from gpufleet.fleet.models import AttemptEventIn
from gpufleet.fleet.store import LedgerStore
from gpufleet.lab.processes import free_port, http_get, http_json, wait_until
from gpufleet.reporter.events import attempt_key

T0 = 1_800_000_000.0


def event(stage: str, attempt: int = 1, job: str = "job-a", **fields: Any) -> AttemptEventIn:
    offsets = {"started": 0.0, "first_step": 5.0, "ended": 60.0}
    defaults: dict[str, Any] = {"started": {"trigger": "initial"}, "ended": {"outcome": "failed"}}
    values = {"at": T0 + 100 * attempt + offsets[stage], **defaults.get(stage, {}), **fields}
    return AttemptEventIn(
        training_job=job,
        attempt=attempt,
        event=stage,  # type: ignore[arg-type]
        source="torchrun",
        **values,
    )


LIFE = ("started", "first_step", "ended")


@pytest.fixture
def ledger_store(tmp_path: Path) -> Iterator[LedgerStore]:
    store = LedgerStore(tmp_path / "ledger.db")
    yield store
    store.close()


@pytest.fixture
def forwarders() -> Iterator[Callable[..., LedgerForwarder]]:
    started: list[LedgerForwarder] = []

    def make(url: str, **settings: Any) -> LedgerForwarder:
        options = {"backoff_min_s": 0.05, "backoff_max_s": 0.2, "timeout_s": 2.0, **settings}
        forwarder = LedgerForwarder(ForwardSettings(url, **options))
        forwarder.start()
        started.append(forwarder)
        return forwarder

    yield make
    for forwarder in started:
        forwarder.stop(drain_s=0)


def stored(store: LedgerStore, job: str = "job-a") -> list[dict[str, Any]]:
    return [dict(row) for row in store.attempts(job)]


def test_a_ledger_down_then_up_gets_every_event_once(
    ledger_store: LedgerStore,
    forwarders: Callable[..., LedgerForwarder],
    serve_asgi: Callable[..., Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    port = free_port()
    forwarder = forwarders(f"http://127.0.0.1:{port}")
    with caplog.at_level(logging.WARNING, logger="gpufleet.agent.ledger_forward"):
        forwarder.submit([event(stage) for stage in LIFE])
        forwarder.submit([event("ended", cause="sigterm")])  # another rank's end: same key
        wait_until(lambda: "not written, retrying" in caplog.text, 20, 0.02, what="a failed write")
    assert forwarder.counts.outcomes()["forwarded"] == 0
    assert forwarder.counts.queued == 3

    serve_asgi(create_app(ledger_store), port=port)  # the ledger comes up
    assert forwarder.wait_idle(30)
    outcomes = forwarder.counts.outcomes()
    assert outcomes["forwarded"] == 3
    assert outcomes["duplicate"] == 1  # the second ended, caught in this agent
    assert outcomes["failed"] == outcomes["dropped"] == outcomes["refused"] == 0
    (row,) = stored(ledger_store)
    assert (row["started_at"], row["first_step_at"], row["ended_at"]) == (
        T0 + 100,
        T0 + 105,
        T0 + 160,
    )
    assert (row["outcome"], row["cause"], row["source"]) == ("failed", None, "torchrun")


def test_the_same_event_from_two_agents_is_stored_once(
    ledger_store: LedgerStore,
    forwarders: Callable[..., LedgerForwarder],
    serve_asgi: Callable[..., Any],
) -> None:
    url = serve_asgi(create_app(ledger_store)).url
    first, second = forwarders(url), forwarders(url)
    first.submit([event("started"), event("ended", cause="ValueError")])
    assert first.wait_idle(30)
    # The same started (a replay: the ledger answers it again), and rank 1's end from
    # another node, told differently (a 409: the key was used for another body).
    second.submit([event("started"), event("ended", cause="sigterm", at=T0 + 161)])
    assert second.wait_idle(30)
    assert first.counts.outcomes()["forwarded"] == 2
    assert second.counts.outcomes()["forwarded"] == 1
    assert second.counts.outcomes()["duplicate"] == 1
    (row,) = stored(ledger_store)
    assert (row["ended_at"], row["cause"]) == (T0 + 160, "ValueError")
    client = LedgerClient(url, "")
    assert len(client.get_all("/v1/attempts", training_job="job-a")) == 1


def test_refusals_are_counted_by_reason(
    tmp_path: Path,
    ledger_store: LedgerStore,
    forwarders: Callable[..., LedgerForwarder],
    serve_asgi: Callable[..., Any],
) -> None:
    url = serve_asgi(create_app(ledger_store, token="s3cret-token")).url
    without_token = forwarders(url)
    without_token.submit([event("started")])
    assert without_token.wait_idle(30)
    assert without_token.counts.refusals() == {"unauthorized": 1}
    assert without_token.counts.outcomes()["refused"] == 1

    forwarder = forwarders(url, token="s3cret-token")
    # job-b's first step whose start never arrived
    forwarder.submit([event("first_step", job="job-b")])
    forwarder.submit([event("started", job=f"job-{n}") for n in range(4)])
    assert forwarder.wait_idle(30)
    assert forwarder.counts.refusals() == {"not_started": 1}
    outcomes = forwarder.counts.outcomes()
    assert (outcomes["forwarded"], outcomes["refused"]) == (4, 1)


def test_a_full_queue_drops_and_counts_and_a_dead_ledger_fails_in_time(
    forwarders: Callable[..., LedgerForwarder],
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    forwarder = forwarders(dead, queue_size=2, retry_for_s=1.0)
    forwarder.submit([event("started", attempt=n) for n in range(1, 6)])
    assert forwarder.counts.outcomes()["dropped"] == 3  # the queue held two; nothing popped
    assert forwarder.wait_idle(30)  # each tried for 1 s, then given up
    outcomes = forwarder.counts.outcomes()
    assert (outcomes["failed"], outcomes["forwarded"], outcomes["received"]) == (2, 0, 0)


def test_the_agent_relays_what_ranks_post_and_reports_it(
    ledger_store: LedgerStore,
    serve_asgi: Callable[..., Any],
    serve_agent: Callable[..., Any],
) -> None:
    ledger = serve_asgi(create_app(ledger_store)).url
    forward = ForwardSettings(ledger, backoff_min_s=0.05, backoff_max_s=0.2)
    agent = Agent(AgentSettings(node="node-a", gpu_source="none", port=free_port(), ledger=forward))
    agent.open()
    url = serve_agent(agent).url
    body = [event(stage).model_dump(exclude_none=True) for stage in LIFE]
    assert http_json(f"{url}/v1/attempts", {"events": body}) == {"accepted": 3}
    assert http_json(f"{url}/v1/attempts", {"events": body[2:]}) == {"accepted": 1}
    forwarder = agent.attempts.forwarder
    assert forwarder is not None and forwarder.wait_idle(30)
    (row,) = stored(ledger_store)
    assert row["outcome"] == "failed"
    text = http_get(f"{url}/metrics").decode()
    for outcome, count in (("received", 4), ("forwarded", 3), ("duplicate", 1), ("failed", 0)):
        assert f'gpufleet_agent_attempt_events_total{{outcome="{outcome}"}} {count}.0' in text
    assert "gpufleet_agent_attempt_queue 0.0" in text


def test_the_key_is_the_event_and_fits_the_ledger() -> None:
    assert attempt_key("torchrun", "run-7", 2, "ended") == "torchrun:run-7:2:ended"
    odd = attempt_key("slurm", "team/job@x+y=1", 1, "started")
    assert odd.startswith("slurm:h") and odd.endswith(":1:started")
    assert odd == attempt_key("slurm", "team/job@x+y=1", 1, "started")
    assert len(attempt_key("torchrun", "j" * 128, 1_000_000, "first_step")) <= 128
