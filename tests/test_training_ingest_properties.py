"""Property: whatever JSON a client sends, the agent answers < 500, and a refusal
changes no metric."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.agent.app import Agent, AgentSettings
from gpufleet.agent.limits import IngestLimits

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=20,
)

STEP_KEYS = [
    "training_job",
    "rank",
    "pp_stage",
    "dp_rank",
    "step",
    "duration_s",
    "compute_s",
    "data_wait_s",
    "comm_wait_s",
    "tokens",
    "phase",
]
CKPT_KEYS = [
    "training_job",
    "rank",
    "op",
    "event",
    "id",
    "queue_wait_s",
    "service_s",
    "bytes",
    "ok",
]
plausible = (
    st.sampled_from(
        ["j1", "job-2", "", "bad job", "train", "eval", "save", "begin", "end", "x" * 200]
    )
    | st.integers(min_value=-5, max_value=5000)
    | st.floats(min_value=-10, max_value=5000)
    | st.booleans()
    | st.none()
)


def near_valid(keys: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    """Event-shaped objects: the right keys (mostly), values sometimes right."""
    return st.fixed_dictionaries({}, optional={key: plausible for key in keys})


valid_steps = st.fixed_dictionaries(
    {
        "training_job": st.sampled_from(["j1", "j2", "j3", "j4"]),
        "rank": st.integers(0, 60),
        "step": st.integers(0, 10**6),
        "duration_s": st.floats(0.01, 100),
    },
    optional={
        "pp_stage": st.integers(0, 3),
        "compute_s": st.floats(0, 0.009),
        "tokens": st.integers(0, 10**6),
        "phase": st.sampled_from(["train", "eval", "checkpoint"]),
    },
)


@st.composite
def mixed_step_batches(draw: st.DrawFn) -> str:
    """Valid events, sometimes with one field of one event spoiled: all or nothing."""
    events = draw(st.lists(valid_steps, min_size=1, max_size=6))
    if draw(st.booleans()):
        victim = draw(st.sampled_from(events))
        victim[draw(st.sampled_from(STEP_KEYS))] = draw(plausible)
    return json.dumps({"events": events})


bodies = st.one_of(
    mixed_step_batches(),
    json_values.map(json.dumps),
    st.builds(
        lambda e, d: json.dumps({"events": e, "dropped": d}),
        st.lists(near_valid(STEP_KEYS), max_size=5),
        plausible,
    ),
    st.builds(lambda e: json.dumps({"events": e}), st.lists(near_valid(CKPT_KEYS), max_size=5)),
    st.binary(max_size=64).map(lambda raw: raw.decode("latin-1")),
)


@pytest.fixture(scope="module")
def client() -> Iterator[tuple[TestClient, Agent]]:
    # Time stands still here: the aggregator finalises pending slowest-rank steps and
    # expires jobs as time passes, which would move a metric between the two snapshots
    # with no request accepted (and did, on a loaded machine).
    frozen = 1_780_000_000.0
    agent = Agent(
        AgentSettings(
            node="node-p",
            gpu_source="none",
            limits=IngestLimits(max_jobs=3, max_ranks_per_stage=50),
        ),
        clock=lambda: frozen,
    )
    agent.open()
    with TestClient(agent.asgi(), client=("127.0.0.1", 50000)) as test_client:
        yield test_client, agent


def training_state(test_client: TestClient) -> dict[Any, float]:
    text = test_client.get("/metrics").text
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith(("gpufleet_training", "gpufleet_checkpoint", "gpufleet_ingest_client"))
        and s.name != "gpufleet_training_last_step_timestamp_seconds"
    }


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(body=bodies, path=st.sampled_from(["/v1/steps", "/v1/checkpoints", "/v1/finished"]))
def test_any_body_gets_an_answer_below_500_and_refusals_change_nothing(
    client: tuple[TestClient, Agent], body: str, path: str
) -> None:
    test_client, _ = client
    before = training_state(test_client)
    response = test_client.post(path, content=body.encode("utf-8", errors="surrogatepass"))
    event(f"HTTP {response.status_code}")
    assert response.status_code < 500, (body, response.text)
    if response.status_code != 202:
        assert 400 <= response.status_code < 500
        assert response.json()["detail"], "a refusal says why"
        assert training_state(test_client) == before
