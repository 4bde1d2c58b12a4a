"""Property: no input makes the ledger answer 5xx, and a refused write stores nothing."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from gpufleet.fleet.app import create_app
from gpufleet.fleet.store import LedgerStore

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=16),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=5)
    ),
    max_leaves=16,
)
plausible = st.sampled_from(
    [
        "node-1",
        "n2",
        "",
        "bad name",
        "xid79",
        "auto",
        "manual",
        "started",
        "first_step",
        "ended",
        "failed",
        "success",
        "initial",
        1,
        2,
        0,
        -1,
        1.8e9,
        1.8e12,
        None,
        True,
    ]
)
fields = [
    "node",
    "reason",
    "source",
    "training_job",
    "at",
    "note",
    "attempt",
    "event",
    "trigger",
    "outcome",
    "cause",
]
event_like = st.fixed_dictionaries({}, optional={name: plausible for name in fields}).map(
    json.dumps
)
valid_like = st.one_of(
    st.fixed_dictionaries(
        {"node": st.sampled_from(["n1", "n2", "n3"]), "reason": st.sampled_from(["xid79", "ecc"])},
        optional={"source": st.sampled_from(["auto", "manual"]), "at": st.floats(1.7e9, 1.9e9)},
    ),
    st.fixed_dictionaries({"node": st.sampled_from(["n1", "n2", "n3"])}),
    st.fixed_dictionaries(
        {
            "training_job": st.just("j"),
            "attempt": st.integers(1, 3),
            "event": st.sampled_from(["started", "first_step", "ended"]),
        },
        optional={
            "trigger": st.sampled_from(["initial", "auto", "manual"]),
            "outcome": st.sampled_from(["success", "failed", "cancelled"]),
        },
    ),
).map(json.dumps)
bodies = st.one_of(
    json_values.map(json.dumps), event_like, valid_like, st.binary(max_size=40).map(repr)
)
keys = st.one_of(st.just("fixed-key-0001"), st.text(min_size=0, max_size=20), st.uuids().map(str))


@pytest.fixture(scope="module")
def ledger() -> Iterator[tuple[TestClient, LedgerStore]]:
    with tempfile.TemporaryDirectory() as folder:
        store = LedgerStore(Path(folder) / "fleet.db")
        with TestClient(create_app(store), client=("127.0.0.1", 50000)) as client:
            yield client, store
        store.close()


def stored(store: LedgerStore) -> tuple[int, int, int]:
    return (len(store.exclusions()), len(store.attempts()), len(store.idempotency_keys()))


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    path=st.sampled_from(["/v1/exclusions", "/v1/releases", "/v1/attempts"]),
    body=bodies,
    key=keys,
)
def test_no_input_causes_a_5xx_or_a_stored_row_when_refused(
    ledger: tuple[TestClient, LedgerStore], path: str, body: str, key: str
) -> None:
    client, store = ledger
    before = stored(store)
    try:
        response = client.post(path, content=body.encode(), headers={"Idempotency-Key": key})
    except UnicodeEncodeError:
        return  # not sendable as an HTTP header at all
    event(f"HTTP {response.status_code}")
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        assert response.json()["detail"]
        assert stored(store) == before
