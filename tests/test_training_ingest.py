"""The ingest API: aggregation, series hygiene (TTL, caps), validation, auth."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.agent.app import Agent, AgentSettings
from gpufleet.agent.limits import IngestLimits
from gpufleet.agent.training_state import SERIES_PER_RANK, series_per_stage


@dataclass
class Clock:
    now: float = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Node:
    client: TestClient
    agent: Agent
    clock: Clock

    def post_steps(self, events: list[dict[str, Any]], **extra: Any) -> Any:
        return self.client.post("/v1/steps", json={"events": events, **extra})

    def post_checkpoints(self, events: list[dict[str, Any]]) -> Any:
        return self.client.post("/v1/checkpoints", json={"events": events})

    def samples(self) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        text = self.client.get("/metrics").text
        return {
            (s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }

    def value(self, name: str, **labels: str) -> float | None:
        return self.samples().get((name, frozenset(labels.items())))

    def training_state(self) -> dict[Any, float]:
        """Everything the training counters say (not the ingest bookkeeping)."""
        return {
            key: value
            for key, value in self.samples().items()
            if key[0].startswith(("gpufleet_training", "gpufleet_checkpoint"))
        }


def make_node(
    limits: IngestLimits | None = None,
    token: str | None = None,
    client_host: str = "127.0.0.1",
    allow_unauthenticated: bool = False,
) -> Iterator[Node]:
    clock = Clock()
    agent = Agent(
        AgentSettings(
            node="node-a",
            gpu_source="none",
            ingest_token=token,
            allow_unauthenticated_ingest=allow_unauthenticated,
            limits=limits or IngestLimits(),
        ),
        clock=clock,
    )
    agent.open()
    # By default a loopback client: without a token, the agent accepts writes from loopback only.
    with TestClient(agent.asgi(), client=(client_host, 50000)) as client:
        yield Node(client, agent, clock)


@pytest.fixture
def node() -> Iterator[Node]:
    yield from make_node()


def step(rank: int, n: int, **fields: Any) -> dict[str, Any]:
    event = {
        "training_job": "llm-7b",
        "rank": rank,
        "pp_stage": 0,
        "step": n,
        "duration_s": 1.0,
        "compute_s": 0.7,
        "data_wait_s": 0.1,
        "comm_wait_s": 0.2,
        "tokens": 1000,
    }
    event.update(fields)
    return event


STAGE0 = {"training_job": "llm-7b", "node": "node-a", "pp_stage": "0"}


def test_steps_aggregate_per_job_node_and_stage(node: Node) -> None:
    events = [step(rank, n) for n in range(10) for rank in range(8)]
    events += [
        step(rank, n, pp_stage=1, duration_s=2.0, compute_s=1.5)
        for n in range(10)
        for rank in range(8, 12)
    ]
    assert node.post_steps(events).json() == {"accepted": 120}
    assert node.value("gpufleet_training_steps_total", **STAGE0) == 80
    assert node.value("gpufleet_training_step_seconds_total", **STAGE0) == pytest.approx(80.0)
    assert node.value("gpufleet_training_compute_seconds_total", **STAGE0) == pytest.approx(56.0)
    assert node.value("gpufleet_training_data_wait_seconds_total", **STAGE0) == pytest.approx(8.0)
    assert node.value("gpufleet_training_collective_wait_seconds_total", **STAGE0) == pytest.approx(
        16.0
    )
    assert node.value("gpufleet_training_tokens_total", **STAGE0) == 80_000
    assert node.value("gpufleet_training_ranks", **STAGE0) == 8
    assert node.value("gpufleet_training_step_number", **STAGE0) == 9
    assert node.value("gpufleet_training_last_step_timestamp_seconds", **STAGE0) == node.clock.now
    stage1 = {**STAGE0, "pp_stage": "1"}
    assert node.value("gpufleet_training_steps_total", **stage1) == 40
    assert node.value("gpufleet_training_compute_seconds_total", **stage1) == pytest.approx(60.0)
    bucket = dict(STAGE0, le="1.0")
    assert node.value("gpufleet_training_step_duration_seconds_bucket", **bucket) == 80
    assert (
        node.value("gpufleet_training_step_duration_seconds_bucket", **dict(STAGE0, le="0.5")) == 0
    )
    assert node.value("gpufleet_training_step_duration_seconds_count", **STAGE0) == 80
    names = {key[0] for key in node.samples()}
    assert not any("step=" in str(key) for key in node.samples()), "never a series per step"
    assert "gpufleet_ingest_accepted_events_total" in names


def test_missing_compute_is_what_is_left_of_the_step(node: Node) -> None:
    event = step(0, 0)
    del event["compute_s"]
    assert node.post_steps([event]).status_code == 202
    assert node.value("gpufleet_training_compute_seconds_total", **STAGE0) == pytest.approx(0.7)


def test_steps_count_as_split_only_where_the_rank_timed_compute_or_a_collective_wait(
    node: Node,
) -> None:
    # A rank that times neither has the rest of its step as compute: in a lock-step job the
    # same on every rank, so the rules must know its stage cannot be compared by compute.
    timed_compute = step(0, 0, comm_wait_s=0.0)
    timed_comm = step(1, 0)
    del timed_comm["compute_s"]
    step_only = step(2, 0, comm_wait_s=0.0)
    del step_only["compute_s"]
    data_only = step(3, 0, comm_wait_s=0.0, data_wait_s=0.3)
    del data_only["compute_s"]
    evaluation = step(4, 0, phase="eval")
    events = [timed_compute, timed_comm, step_only, data_only, evaluation]
    assert node.post_steps(events).status_code == 202
    assert node.value("gpufleet_training_split_steps_total", **STAGE0) == 2
    assert node.value("gpufleet_training_steps_total", **STAGE0) == 4
    # one series per stage, never per rank
    split = [key for key in node.samples() if key[0] == "gpufleet_training_split_steps_total"]
    assert split == [("gpufleet_training_split_steps_total", frozenset(STAGE0.items()))]

    only = [step(rank, n, comm_wait_s=0.0) for n in range(1, 4) for rank in range(2)]
    for event in only:
        del event["compute_s"]
    assert node.post_steps(only).status_code == 202
    assert node.value("gpufleet_training_split_steps_total", **STAGE0) == 2


def test_one_slow_gpu_is_visible_in_the_slowest_rank_counter(node: Node) -> None:
    # Rank 5 computes 20% longer; the node mean moves by 2.5%, the slowest-rank figure by 20%.
    events = [
        step(rank, n, compute_s=0.84 if rank == 5 else 0.7, comm_wait_s=0.0 if rank == 5 else 0.14)
        for n in range(20)
        for rank in range(8)
    ]
    node.post_steps(events)
    node.clock.now += 11  # while a stage's ranks are being discovered, steps complete by time
    node.agent.training.sweep()
    slowest = node.value("gpufleet_training_slowest_rank_compute_seconds_total", **STAGE0)
    counted = node.value("gpufleet_training_slowest_rank_steps_total", **STAGE0)
    mean = node.value("gpufleet_training_compute_seconds_total", **STAGE0) / 160  # type: ignore[operator]
    assert counted == 20
    assert slowest / counted == pytest.approx(0.84)  # type: ignore[operator]
    assert mean == pytest.approx(0.7175)
    per_rank = {
        dict(labels)["rank"]: value
        for (name, labels), value in node.samples().items()
        if name == "gpufleet_training_rank_compute_seconds_total"
    }
    assert per_rank["5"] == pytest.approx(20 * 0.84) and per_rank["0"] == pytest.approx(14.0)


def test_first_steps_wait_for_every_rank_then_steps_complete_when_all_report(node: Node) -> None:
    node.post_steps([step(0, 0)])  # rank 0 alone is not yet "all ranks"
    node.post_steps(
        [
            step(rank, 0, compute_s=0.8, comm_wait_s=0.1) if rank == 6 else step(rank, 0)
            for rank in range(1, 8)
        ]
    )
    assert node.value("gpufleet_training_slowest_rank_steps_total", **STAGE0) == 0
    node.clock.now += 11
    node.agent.training.sweep()
    assert node.value("gpufleet_training_slowest_rank_steps_total", **STAGE0) == 1
    assert node.value(
        "gpufleet_training_slowest_rank_compute_seconds_total", **STAGE0
    ) == pytest.approx(0.8)
    node.post_steps([step(rank, 1) for rank in range(8)])  # warmed up: complete at once
    assert node.value("gpufleet_training_slowest_rank_steps_total", **STAGE0) == 2


def test_a_step_missing_a_rank_is_counted_after_the_wait(node: Node) -> None:
    node.post_steps([step(rank, 0) for rank in range(8)])
    node.clock.now += 11
    node.agent.training.sweep()
    slow = step(3, 1, compute_s=0.9, comm_wait_s=0.0)
    assert (
        node.post_steps([slow if rank == 3 else step(rank, 1) for rank in range(7)]).status_code
        == 202
    )
    assert node.value("gpufleet_training_slowest_rank_steps_total", **STAGE0) == 1
    node.clock.now += 11
    node.agent.training.sweep()
    assert node.value("gpufleet_training_slowest_rank_steps_total", **STAGE0) == 2
    slowest = node.value("gpufleet_training_slowest_rank_compute_seconds_total", **STAGE0)
    assert slowest == pytest.approx(0.7 + 0.9)
    node.post_steps([step(7, 1, compute_s=5.0)])  # the late rank does not count the step twice
    assert node.value("gpufleet_training_slowest_rank_steps_total", **STAGE0) == 2


def test_eval_and_checkpoint_phases_stay_out_of_step_time(node: Node) -> None:
    eval_step = step(0, 1, phase="eval", duration_s=30.0, compute_s=None, comm_wait_s=0)
    checkpoint_step = step(0, 2, phase="checkpoint", duration_s=60.0, compute_s=None, comm_wait_s=0)
    assert node.post_steps([step(0, 0), eval_step, checkpoint_step]).status_code == 202
    assert node.value("gpufleet_training_steps_total", **STAGE0) == 1
    assert node.value("gpufleet_training_step_seconds_total", **STAGE0) == 1.0
    phase = {**STAGE0, "phase": "eval"}
    assert node.value("gpufleet_training_phase_seconds_total", **phase) == 30.0
    assert (
        node.value("gpufleet_training_phase_steps_total", **{**STAGE0, "phase": "checkpoint"}) == 1
    )
    assert node.value("gpufleet_training_step_number", **STAGE0) == 2  # progress is progress


def test_a_job_that_stops_reporting_is_dropped_after_the_ttl() -> None:
    for node in make_node(IngestLimits(job_ttl_s=900, max_jobs=1)):
        node.post_steps([step(0, 0)])
        node.post_checkpoints([_ckpt("begin", "a")])
        node.clock.now += 899
        node.agent.training.sweep()
        assert node.value("gpufleet_training_steps_total", **STAGE0) == 1
        node.clock.now += 2
        node.agent.training.sweep()
        assert node.training_state() == {}
        assert node.value("gpufleet_ingest_jobs_expired_total") == 1
        assert node.value("gpufleet_ingest_jobs") == 0
        # its cap slot is free again
        assert node.post_steps([step(0, 0, training_job="next-job")]).status_code == 202


@pytest.mark.parametrize(
    ("limits", "batch", "reason", "message"),
    [
        (
            IngestLimits(max_jobs=1),
            [step(0, 5), step(0, 5, training_job="another-job")],
            "job_cap",
            "already tracks 1 training jobs (cap 1",
        ),
        (
            IngestLimits(max_stages=1),
            [step(0, 5), step(1, 5, pp_stage=3)],
            "stage_cap",
            "new pair(s) [('llm-7b', 3)] refused",
        ),
        (
            IngestLimits(max_ranks_per_stage=1),
            [step(0, 5), step(9, 5)],
            "rank_cap",
            "new rank(s) [9] refused",
        ),
        (
            # one stage and one rank exist; one more rank would pass the series cap
            IngestLimits(max_series=series_per_stage() + SERIES_PER_RANK + 1),
            [step(0, 5), step(9, 5)],
            "series_cap",
            "the batch would add 2",
        ),
    ],
)
def test_over_a_cap_the_whole_batch_gets_429_and_changes_nothing(
    limits: IngestLimits, batch: list[dict[str, Any]], reason: str, message: str
) -> None:
    for node in make_node(limits):
        assert node.post_steps([step(0, 0)]).status_code == 202
        before = node.training_state()
        response = node.post_steps(batch)
        assert response.status_code == 429
        assert message in response.json()["detail"]
        assert response.json()["reason"] == reason
        assert node.training_state() == before
        assert node.value("gpufleet_ingest_rejected_total", reason=reason) == 2


@pytest.mark.parametrize(
    ("event", "field", "message"),
    [
        ({"duration_s": -1.0}, "events.0.duration_s", "greater than 0"),
        ({"duration_s": 0}, "events.0.duration_s", "greater than 0"),
        ({"duration_s": 7200.0}, "events.0.duration_s", "less than or equal to 3600"),
        ({"duration_s": "1.0s"}, "events.0.duration_s", "valid number"),
        ({"compute_s": -0.5}, "events.0.compute_s", "greater than or equal to 0"),
        ({"phase": "warmup"}, "events.0.phase", "'train', 'eval' or 'checkpoint'"),
        ({"rank": -3}, "events.0.rank", "greater than or equal to 0"),
        ({"training_job": "has spaces"}, "events.0.training_job", "pattern"),
        ({"training_job": ""}, "events.0.training_job", "at least 1 character"),
        ({"tokens": 1.5}, "events.0.tokens", "valid integer"),
        ({"stepp": 3}, "events.0.stepp", "Extra inputs are not permitted"),
        ({"compute_s": 0.9, "comm_wait_s": 0.5}, "events.0", "exceeds duration_s"),
    ],
)
def test_bad_events_get_422_naming_the_field(
    node: Node, event: dict[str, Any], field: str, message: str
) -> None:
    before = node.training_state()
    bad = step(0, 0)
    bad.update(event)
    response = node.post_steps([bad])
    assert response.status_code == 422
    details = response.json()["detail"]
    assert any(d["field"] == field and message in d["message"] for d in details), details
    assert node.training_state() == before
    assert node.value("gpufleet_ingest_rejected_total", reason="invalid") == 1


@pytest.mark.parametrize("literal", [b"NaN", b"Infinity", b"-Infinity", b"1e999"])
def test_non_finite_durations_are_rejected(node: Node, literal: bytes) -> None:
    body = (
        b'{"events": [{"training_job": "j", "rank": 0, "step": 0, "duration_s": ' + literal + b"}]}"
    )
    response = node.client.post("/v1/steps", content=body)
    assert response.status_code == 422
    assert response.json()["detail"][0]["field"] in ("events.0.duration_s", "body")
    assert node.training_state() == {}


def test_a_rejected_batch_changes_no_metric_even_if_most_events_are_good(node: Node) -> None:
    node.post_steps([step(0, 0)])
    before = node.training_state()
    good = [step(rank, 1) for rank in range(8)]
    response = node.post_steps([*good, step(0, 2, duration_s=-1)])
    assert response.status_code == 422
    assert node.training_state() == before
    assert node.value("gpufleet_ingest_rejected_total", reason="invalid") == 9


def test_malformed_bodies(node: Node) -> None:
    for body, field in (
        (b"{", "body"),
        (b"[]", "body"),
        (b"", "body"),
        (b'{"events": 3}', "events"),
    ):
        response = node.client.post("/v1/steps", content=body)
        assert response.status_code == 422, body
        assert response.json()["detail"][0]["field"] == field
    response = node.client.post("/v1/steps", json={})
    assert response.json()["detail"][0]["field"] == "events"


def test_oversize_bodies_and_batches_get_413() -> None:
    for node in make_node(IngestLimits(max_body_bytes=2000, max_batch_events=5)):
        big = node.client.post("/v1/steps", content=b'{"events": [' + b" " * 3000 + b"]}")
        assert big.status_code == 413
        assert "exceeds 2000 bytes" in big.json()["detail"]

        def chunks() -> Iterator[bytes]:  # no Content-Length: the stream itself is cut off
            yield b'{"events": ['
            for _ in range(10):
                yield b" " * 500

        streamed = node.client.post("/v1/steps", content=chunks())
        assert streamed.status_code == 413
        many = node.post_steps([step(rank, 0) for rank in range(6)])
        assert many.status_code == 413
        assert "holds 6 events; at most 5" in many.json()["detail"]
        assert node.training_state() == {}
        assert node.value("gpufleet_ingest_rejected_total", reason="batch_too_large") == 6
        assert node.value("gpufleet_ingest_rejected_total", reason="body_too_large") == 2


def test_a_token_protects_writes_but_not_metrics() -> None:
    for node in make_node(token="s3cret"):
        missing = node.post_steps([step(0, 0)])
        assert missing.status_code == 401
        assert missing.headers["www-authenticate"] == "Bearer"
        assert "Authorization: Bearer" in missing.json()["detail"]
        wrong = node.client.post(
            "/v1/steps", json={"events": [step(0, 0)]}, headers={"Authorization": "Bearer nope"}
        )
        assert wrong.status_code == 401
        assert node.training_state() == {}
        right = node.client.post(
            "/v1/steps", json={"events": [step(0, 0)]}, headers={"Authorization": "Bearer s3cret"}
        )
        assert right.status_code == 202
        assert node.client.get("/metrics").status_code == 200
        assert node.value("gpufleet_ingest_rejected_total", reason="unauthorized") == 2


def _ckpt(kind: str, ident: str, rank: int = 0, **fields: Any) -> dict[str, Any]:
    return {
        "training_job": "llm-7b",
        "rank": rank,
        "op": "save",
        "event": kind,
        "id": ident,
        **fields,
    }


SAVE = {"training_job": "llm-7b", "node": "node-a", "op": "save"}


def test_checkpoints_split_queue_wait_from_service_and_track_concurrency(node: Node) -> None:
    node.post_checkpoints([_ckpt("begin", "s100", rank) for rank in range(4)])
    assert node.value("gpufleet_checkpoint_in_flight", **SAVE) == 4
    node.post_checkpoints(
        [
            _ckpt("end", "s100", rank, queue_wait_s=9.0, service_s=1.0, bytes=10**9)
            for rank in range(3)
        ]
    )
    assert node.value("gpufleet_checkpoint_in_flight", **SAVE) == 1
    assert node.value("gpufleet_checkpoint_operations_total", **SAVE, outcome="ok") == 3
    assert node.value("gpufleet_checkpoint_queue_wait_seconds_total", **SAVE) == 27.0
    assert node.value("gpufleet_checkpoint_service_seconds_total", **SAVE) == 3.0
    assert node.value("gpufleet_checkpoint_bytes_total", **SAVE) == 3 * 10**9
    node.post_checkpoints([_ckpt("end", "s100", 3, service_s=2.0, ok=False)])
    assert node.value("gpufleet_checkpoint_operations_total", **SAVE, outcome="failed") == 1
    assert node.value("gpufleet_checkpoint_in_flight", **SAVE) == 0


def test_a_begin_without_end_is_abandoned_after_the_timeout(node: Node) -> None:
    node.post_checkpoints([_ckpt("begin", "lost")])
    for n in range(37):  # the job keeps training (and reporting) for six hours
        node.clock.now += 600
        node.post_steps([step(0, n)])
    node.agent.training.sweep()
    assert node.value("gpufleet_checkpoint_in_flight", **SAVE) == 0
    assert node.value("gpufleet_checkpoint_operations_total", **SAVE, outcome="abandoned") == 1


def test_checkpoint_validation(node: Node) -> None:
    begin_with_result = node.post_checkpoints([_ckpt("begin", "x", service_s=3.0)])
    assert begin_with_result.status_code == 422
    assert "carries no queue_wait_s" in begin_with_result.json()["detail"][0]["message"]
    bad_op = node.post_checkpoints([{**_ckpt("end", "x"), "op": "snapshot"}])
    assert bad_op.json()["detail"][0]["field"] == "events.0.op"


def test_a_stage_finishes_once_every_rank_it_saw_has_finished(node: Node) -> None:
    def finish(*ranks: int, job: str = "llm-7b") -> Any:
        events = [{"training_job": job, "rank": rank, "pp_stage": 0} for rank in ranks]
        return node.client.post("/v1/finished", json={"events": events})

    finished = "gpufleet_training_finished_timestamp_seconds"
    assert node.post_steps([step(rank, 0) for rank in range(2)]).status_code == 202
    assert node.value(finished, **STAGE0) == 0
    assert finish(0).json() == {"accepted": 1}
    assert node.value(finished, **STAGE0) == 0, "rank 1 still runs"
    node.clock.now += 5
    assert finish(1).status_code == 202
    assert node.value(finished, **STAGE0) == node.clock.now
    node.clock.now += 5
    assert node.post_steps([step(1, 1)]).status_code == 202
    assert node.value(finished, **STAGE0) == 0, "a rank that steps again runs again"

    before = node.training_state()
    assert finish(0, job="never-seen").status_code == 202
    assert finish(7).status_code == 202
    assert node.training_state() == before, "an unknown job or rank creates nothing"
    bad = node.client.post("/v1/finished", json={"events": [{"training_job": "x", "rank": -1}]})
    assert bad.status_code == 422 and bad.json()["detail"][0]["field"] == "events.0.rank"


def test_drops_reported_by_clients_are_counted(node: Node) -> None:
    node.post_steps([step(0, 0)], dropped=42)
    assert node.value("gpufleet_ingest_client_dropped_total") == 42


def test_memory_for_unfinished_steps_is_bounded(node: Node) -> None:
    # Rank 1 never reports: steps of rank 0 wait for it, but never more than 1,024 of them.
    node.post_steps([step(1, 0)])
    for first in range(0, 3000, 500):
        assert node.post_steps([step(0, n) for n in range(first, first + 500)]).status_code == 202
    stage = node.agent.training._jobs["llm-7b"].stages[0]
    assert len(stage.pending) <= 1024
    assert node.value("gpufleet_training_slowest_rank_steps_total", **STAGE0) >= 3000 - 1024


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("rank", True, "valid integer"),
        ("rank", "3", "valid integer"),
        ("step", 7.0, "valid integer"),
        ("tokens", "100", "valid integer"),
        ("duration_s", "2.5", "valid number"),
        ("pp_stage", 1.0, "valid integer"),
    ],
)
def test_wrong_types_are_refused_not_coerced(
    node: Node, field: str, value: Any, message: str
) -> None:
    response = node.post_steps([step(0, 0), {**step(1, 0), field: value}])
    assert response.status_code == 422
    details = response.json()["detail"]
    assert any(d["field"] == f"events.1.{field}" and message in d["message"] for d in details)
    assert response.json()["refused"] == [1]
    assert node.training_state() == {}


def test_whole_seconds_are_accepted_as_seconds(node: Node) -> None:
    assert node.post_steps([step(0, 0, duration_s=2, compute_s=1)]).status_code == 202


def test_the_attempt_gauge_shows_the_highest_attempt_once_a_rank_reports_one(node: Node) -> None:
    assert node.post_steps([step(0, 0), step(1, 0)]).status_code == 202
    assert node.value("gpufleet_training_attempt", **STAGE0) is None  # absent: unknown
    series = node.agent.training.series
    assert node.post_steps([step(0, 1, attempt=1), step(1, 1, attempt=0)]).status_code == 202
    assert node.value("gpufleet_training_attempt", **STAGE0) == 1
    assert node.agent.training.series == series + 1  # the gauge's one series, counted
    assert node.post_steps([step(0, 2, attempt=0), step(1, 2)]).status_code == 202
    assert node.value("gpufleet_training_attempt", **STAGE0) == 1  # the highest seen
    assert node.value("gpufleet_training_steps_total", **STAGE0) == 6  # one job, every attempt


def test_an_attempt_series_past_the_series_cap_is_refused() -> None:
    limits = IngestLimits(max_series=series_per_stage() + SERIES_PER_RANK)
    for node in make_node(limits):
        assert node.post_steps([step(0, 0)]).status_code == 202
        response = node.post_steps([step(0, 1, attempt=1)])
        assert response.status_code == 429, response.text
        assert "the batch would add 1" in response.json()["detail"]
        assert node.value("gpufleet_training_attempt", **STAGE0) is None


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (-1, "greater than or equal to 0"),
        (1_000_001, "less than or equal to 1000000"),
        (True, "valid integer"),
        ("1", "valid integer"),
        (1.0, "valid integer"),
    ],
)
def test_a_bad_attempt_gets_422_naming_the_field(node: Node, value: Any, message: str) -> None:
    response = node.post_steps([step(0, 0, attempt=0), step(1, 0, attempt=value)])
    assert response.status_code == 422
    details = response.json()["detail"]
    assert any(d["field"] == "events.1.attempt" and message in d["message"] for d in details), (
        details
    )
    assert response.json()["refused"] == [1]
    assert node.training_state() == {}


@pytest.mark.parametrize(
    "body",
    [
        b'{"events": [{"training_job": "j", "rank": 0, "rank": 5, "step": 0, "duration_s": 1}]}',
        b'{"events": [], "events": [{"training_job": "j", "rank": 0, "step": 0, "duration_s": 1}]}',
    ],
)
def test_duplicate_json_keys_are_refused(node: Node, body: bytes) -> None:
    response = node.client.post("/v1/steps", content=body)
    assert response.status_code == 422
    assert "appears twice" in response.json()["detail"][0]["message"]
    assert node.training_state() == {}


def test_a_422_names_every_refused_event_so_the_rest_can_be_resent(node: Node) -> None:
    events = [step(rank, 0) for rank in range(6)]
    events[1]["duration_s"] = -1.0
    events[4]["phase"] = "warmup"
    response = node.post_steps(events)
    assert response.status_code == 422
    assert response.json()["refused"] == [1, 4]
    rest = [event for index, event in enumerate(events) if index not in (1, 4)]
    assert node.post_steps(rest).status_code == 202
    assert node.value("gpufleet_training_steps_total", **STAGE0) == 4


def test_a_refused_body_counts_what_was_parsed_never_a_guess(node: Node) -> None:
    # Not JSON, yet full of "training_job": one refused request, not 50,000 events.
    garbage = b'{"events": [' + b'{"training_job": "x", ' * 50_000
    assert node.client.post("/v1/steps", content=garbage).status_code == 422
    assert node.value("gpufleet_ingest_rejected_total", reason="invalid") == 1
    # JSON with three events, one bad: three events refused.
    node.post_steps([step(0, 0), step(1, 0), step(2, 0, duration_s=-1)])
    assert node.value("gpufleet_ingest_rejected_total", reason="invalid") == 4


def test_deeply_nested_json_is_a_422_not_a_500(node: Node) -> None:
    response = node.client.post("/v1/steps", content=b"[" * 200_000 + b"]" * 200_000)
    assert response.status_code == 422
    assert "nested too deeply" in response.json()["detail"][0]["message"]


def test_overlapping_parts_within_the_step_are_valid(node: Node) -> None:
    # compute 0.7 s + exposed comm 0.3 s of a 1 s step (the overlapped comm is not in comm_wait_s)
    event = step(0, 0, compute_s=0.7, comm_wait_s=0.3, data_wait_s=0.0)
    assert node.post_steps([event]).status_code == 202


def test_without_a_token_writes_from_beyond_loopback_are_refused() -> None:
    for node in make_node(client_host="10.0.0.7"):
        refused = node.post_steps([step(0, 0)])
        assert refused.status_code == 403
        detail = refused.json()["detail"]
        assert "10.0.0.7" in detail and "--allow-unauthenticated-ingest" in detail
        assert "--ingest-token-file" in detail
        assert node.training_state() == {}
        assert node.value("gpufleet_ingest_rejected_total", reason="unauthenticated") == 1
        assert node.client.get("/metrics").status_code == 200  # scrapes need no token
    for loopback in ("::1", "127.0.0.2", "::ffff:127.0.0.1"):
        for node in make_node(client_host=loopback):
            assert node.post_steps([step(0, 0)]).status_code == 202, loopback
    for node in make_node(client_host="::ffff:10.0.0.7"):
        assert node.post_steps([step(0, 0)]).status_code == 403
    for node in make_node(client_host="10.0.0.7", allow_unauthenticated=True):
        assert node.post_steps([step(0, 0)]).status_code == 202
    for node in make_node(client_host="10.0.0.7", token="s3cret"):
        authorised = node.client.post(
            "/v1/steps", json={"events": [step(0, 0)]}, headers={"Authorization": "Bearer s3cret"}
        )
        assert authorised.status_code == 202


# What docs/agent.md states as the worst case at the default caps ("Bounds").
DOCUMENTED_MAX_TRAINING_SERIES = 5000
DOCUMENTED_MAX_SCRAPE_BYTES = 1_400_000


def test_an_attack_at_every_cap_stays_within_the_documented_series_and_bytes() -> None:
    for node in make_node():
        limits = node.agent.training.limits
        # The longest job names a client may send make the largest scrape.
        jobs = [f"{j:02d}" + "j" * 126 for j in range(limits.max_jobs + 4)]
        statuses: dict[int, int] = {}
        for job in jobs:
            for pp_stage in range(8):
                at_cap = [
                    step(rank, 0, training_job=job, pp_stage=pp_stage)
                    for rank in range(limits.max_ranks_per_stage)
                ]
                one_more = step(limits.max_ranks_per_stage, 0, training_job=job, pp_stage=pp_stage)
                for events in (at_cap[:8], at_cap, [one_more]):
                    status = node.post_steps(events).status_code
                    statuses[status] = statuses.get(status, 0) + 1
            for op in ("save", "restore"):
                node.post_checkpoints([{**_ckpt("begin", "c"), "training_job": job, "op": op}])
        assert statuses.get(429, 0) > 0 and statuses.get(202, 0) > 0
        text = node.client.get("/metrics").text
        training = [
            s
            for family in text_string_to_metric_families(text)
            if family.name.startswith(("gpufleet_training", "gpufleet_checkpoint"))
            for s in family.samples
        ]
        exported = node.agent.training.series
        assert len(training) == exported  # the series counter is exact
        assert exported <= limits.max_series <= DOCUMENTED_MAX_TRAINING_SERIES
        assert node.value("gpufleet_ingest_series") == exported
        assert len(text.encode()) <= DOCUMENTED_MAX_SCRAPE_BYTES
        for reason in ("rank_cap", "series_cap"):
            assert (node.value("gpufleet_ingest_rejected_total", reason=reason) or 0) > 0, reason
        print(f"series {exported}, scrape {len(text.encode())} bytes")
