"""Alertmanager's webhook on the ledger: payload checks, caps, one incident per alert however
often it is re-sent, and the link from a page to the exclusion of its node that followed."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.fleet.alertmanager import MAX_ALERTS, MAX_BODY_BYTES, IncidentPolicy
from gpufleet.fleet.app import create_app
from gpufleet.fleet.incidents import MAX_ALERTNAMES, OTHER_ALERTNAME
from gpufleet.fleet.store import LedgerStore

NOW = 1_800_000_000.0
HOUR = 3600.0
TOKEN = "incident-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def rfc3339(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat().replace("+00:00", "Z")


def alert(
    node: str | None = "node-a",
    alertname: str = "GpuFleetCriticalXid",
    *,
    severity: str = "critical",
    starts: float = NOW - 2 * HOUR,
    ends: float | None = None,
    fingerprint: str = "a1b2c3d4e5f60718",
    **labels: str,
) -> dict[str, Any]:
    every = {"alertname": alertname, "severity": severity, **labels}
    if node is not None:
        every["node"] = node
    return {
        "status": "resolved" if ends is not None else "firing",
        "labels": every,
        "annotations": {"summary": "A GPU reported a critical XID.", "description": "..."},
        "startsAt": rfc3339(starts),
        "endsAt": rfc3339(ends) if ends is not None else "0001-01-01T00:00:00Z",
        "generatorURL": "http://prometheus/graph",
        "fingerprint": fingerprint,
    }


def notification(*alerts: dict[str, Any]) -> dict[str, Any]:
    firing = any(a["status"] == "firing" for a in alerts)
    return {
        "version": "4",
        "groupKey": '{}:{node="node-a"}',
        "truncatedAlerts": 0,
        "status": "firing" if firing else "resolved",
        "receiver": "ledger",
        "groupLabels": {},
        "commonLabels": {},
        "commonAnnotations": {},
        "externalURL": "http://alertmanager:9093",
        "alerts": list(alerts),
    }


class Ledger:
    def __init__(self, path: Path, **options: Any) -> None:
        self.store = LedgerStore(path, clock=lambda: NOW)
        self.client = TestClient(
            create_app(self.store, TOKEN, clock=lambda: NOW, **options), client=("10.0.0.9", 1)
        )
        self._keys = 0

    def page(self, *alerts: dict[str, Any]) -> Any:
        return self.client.post("/v1/alertmanager", json=notification(*alerts), headers=AUTH)

    def exclude(self, node: str, at: float, reason: str = "xid79") -> Any:
        self._keys += 1
        headers = {"Idempotency-Key": f"exclusion-{self._keys:04d}", **AUTH}
        body = {"node": node, "reason": reason, "at": at, "source": "kubernetes"}
        answer = self.client.post("/v1/exclusions", json=body, headers=headers)
        assert answer.status_code == 201, answer.text
        return answer.json()

    def release(self, node: str, at: float) -> None:
        self._keys += 1
        headers = {"Idempotency-Key": f"release-{self._keys:04d}", **AUTH}
        answer = self.client.post("/v1/releases", json={"node": node, "at": at}, headers=headers)
        assert answer.status_code == 200, answer.text

    def incidents(self, **params: Any) -> list[dict[str, Any]]:
        answer = self.client.get("/v1/incidents", params=params, headers=AUTH)
        assert answer.status_code == 200, answer.text
        rows: list[dict[str, Any]] = answer.json()
        return rows

    def unpaged(self, **params: Any) -> list[dict[str, Any]]:
        answer = self.client.get("/v1/exclusions/unpaged", params=params, headers=AUTH)
        assert answer.status_code == 200, answer.text
        rows: list[dict[str, Any]] = answer.json()
        return rows

    def metric(self, name: str, **labels: str) -> float | None:
        text = self.client.get("/metrics").text
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and sample.labels == labels:
                    return float(sample.value)
        return None

    def close(self) -> None:
        self.client.close()
        self.store.close()


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[Ledger]:
    opened = Ledger(tmp_path / "fleet.db")
    yield opened
    opened.close()


# -- what is refused, and why -------------------------------------------------------------


def test_the_webhook_needs_the_write_token(ledger: Ledger) -> None:
    body = notification(alert())
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        answer = ledger.client.post("/v1/alertmanager", json=body, headers=headers)
        assert answer.status_code == 401
        assert "Authorization: Bearer" in answer.json()["detail"]
    assert ledger.incidents() == []
    assert ledger.metric("gpufleet_fleet_writes_rejected_total", reason="unauthorized") == 2


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"version": "3"}, "version"),
        ({"alerts": None}, "alerts"),
        ({"status": "pending"}, "status"),
    ],
)
def test_a_payload_that_is_not_alertmanagers_is_refused_naming_the_field(
    ledger: Ledger, change: dict[str, Any], field: str
) -> None:
    body = notification(alert()) | change
    answer = ledger.client.post("/v1/alertmanager", json=body, headers=AUTH)
    assert answer.status_code == 422
    assert [e["field"] for e in answer.json()["detail"]] == [field]
    assert "version 4" in answer.json()["expected"]
    assert ledger.incidents() == []


def test_an_alert_without_a_start_or_fingerprint_is_refused_naming_it(ledger: Ledger) -> None:
    broken = alert()
    del broken["startsAt"]
    broken["fingerprint"] = "not a fingerprint"
    answer = ledger.page(alert(fingerprint="0000000000000001"), broken)
    assert answer.status_code == 422
    fields = {e["field"] for e in answer.json()["detail"]}
    assert fields == {"alerts.1.startsAt", "alerts.1.fingerprint"}
    assert ledger.incidents() == []  # Alertmanager's own contract broken: nothing stored


def test_not_json_and_duplicate_keys_are_refused(ledger: Ledger) -> None:
    for raw in (b"{", b'{"version": "4", "version": "4"}', b""):
        answer = ledger.client.post("/v1/alertmanager", content=raw, headers=AUTH)
        assert answer.status_code == 422, raw
        assert answer.json()["detail"][0]["field"] == "body"


def test_a_body_over_the_cap_is_refused_before_it_is_read(ledger: Ledger) -> None:
    answer = ledger.client.post(
        "/v1/alertmanager", content=b"x" * (MAX_BODY_BYTES + 1), headers=AUTH
    )
    assert answer.status_code == 413
    assert "max_alerts" in answer.json()["detail"]


def test_more_alerts_than_the_cap_are_refused_with_the_setting_that_prevents_it(
    ledger: Ledger,
) -> None:
    alerts = [alert(fingerprint=f"{n:016x}") for n in range(MAX_ALERTS + 1)]
    answer = ledger.page(*alerts)
    assert answer.status_code == 413
    assert f"max_alerts: {MAX_ALERTS}" in answer.json()["detail"]
    assert ledger.metric("gpufleet_fleet_writes_rejected_total", reason="too_many_alerts") == 1
    assert ledger.page(*alerts[:MAX_ALERTS]).json()["new"] == MAX_ALERTS


def test_an_alert_the_ledger_cannot_store_as_sent_is_skipped_alone_and_named(
    ledger: Ledger,
) -> None:
    answer = ledger.page(
        alert("node-a", fingerprint="0000000000000001"),
        alert("x" * 300, fingerprint="0000000000000002"),
        alert("node-c", "A" * 200, fingerprint="0000000000000003"),
        alert("node-d", fingerprint="0000000000000004", training_job="bad job name"),
    )
    assert answer.status_code == 200
    result = answer.json()
    assert result["new"] == 1
    assert [(s["alert"], s["reason"]) for s in result["skipped"]] == [
        (1, "invalid"),
        (2, "invalid"),
        (3, "invalid"),
    ]
    assert "label node 'xxx" in result["skipped"][0]["message"]
    assert "label alertname" in result["skipped"][1]["message"]
    assert "label training_job 'bad job name'" in result["skipped"][2]["message"]
    assert [i["node"] for i in ledger.incidents()] == ["node-a"]
    assert ledger.metric("gpufleet_fleet_webhook_alerts_ignored_total", reason="invalid") == 3


def test_a_long_summary_is_kept_cut_and_other_annotations_are_not_stored(ledger: Ledger) -> None:
    long = alert()
    long["annotations"] = {"summary": "s" * 5000, "description": "d" * 50_000}
    assert ledger.page(long).status_code == 200
    [incident] = ledger.incidents()
    assert incident["summary"] == "s" * 500
    assert "description" not in incident


# -- which alerts are pages ------------------------------------------------------------------


def test_only_critical_alerts_of_a_node_become_incidents(ledger: Ledger) -> None:
    answer = ledger.page(
        alert(fingerprint="0000000000000001"),
        alert(severity="warning", fingerprint="0000000000000002"),
        alert(None, "GpuFleetRetryChainFailing", fingerprint="0000000000000003"),
        alert("node-b", "GpuFleetGpuLost", fingerprint="0000000000000004", training_job="llm-7b"),
    ).json()
    assert (answer["new"], answer["not_pages"]) == (2, 2)
    rows = {i["alertname"]: i for i in ledger.incidents()}
    assert set(rows) == {"GpuFleetCriticalXid", "GpuFleetGpuLost"}
    assert rows["GpuFleetGpuLost"]["training_job"] == "llm-7b"
    assert rows["GpuFleetCriticalXid"]["training_job"] is None
    assert rows["GpuFleetCriticalXid"]["started_at"] == NOW - 2 * HOUR
    assert ledger.metric("gpufleet_fleet_webhook_alerts_ignored_total", reason="not_a_page") == 2


def test_the_paging_severities_are_a_knob(tmp_path: Path) -> None:
    policy = IncidentPolicy(severities=frozenset({"critical", "warning"}))
    ledger = Ledger(tmp_path / "fleet.db", incident_policy=policy)
    try:
        answer = ledger.page(alert("node-a", "GpuFleetStragglerNode", severity="warning"))
        assert answer.json()["new"] == 1
    finally:
        ledger.close()


# -- one incident per alert ----------------------------------------------------------------


def test_a_re_sent_alert_stays_one_incident_and_its_resolution_is_kept(ledger: Ledger) -> None:
    for _ in range(3):  # group_interval, repeat_interval, a retried delivery
        assert ledger.page(alert()).status_code == 200
    resolved = ledger.page(alert(ends=NOW - HOUR)).json()
    assert (resolved["new"], resolved["repeated"], resolved["resolved"]) == (0, 1, 1)
    again = ledger.page(alert(ends=NOW - HOUR / 2)).json()  # a re-sent resolution
    assert again["resolved"] == 0
    ledger.page(alert())  # a late firing re-send does not reopen it
    [incident] = ledger.incidents()
    assert incident["notifications"] == 6
    assert incident["resolved_at"] == NOW - HOUR
    assert ledger.metric("gpufleet_fleet_incidents_total", alertname="GpuFleetCriticalXid") == 1


def test_an_alert_that_fires_again_after_it_resolved_is_a_second_incident(ledger: Ledger) -> None:
    ledger.page(alert(ends=NOW - HOUR))
    ledger.page(alert(starts=NOW - HOUR / 2))
    incidents = ledger.incidents()
    assert [i["started_at"] for i in incidents] == [NOW - 2 * HOUR, NOW - HOUR / 2]
    assert [i["resolved_at"] for i in incidents] == [NOW - HOUR, None]


def test_a_resolution_that_arrives_first_is_an_incident_already_resolved(ledger: Ledger) -> None:
    answer = ledger.page(alert(ends=NOW - HOUR)).json()
    assert (answer["new"], answer["resolved"]) == (1, 1)
    assert ledger.incidents()[0]["resolved_at"] == NOW - HOUR


def test_the_alert_name_counter_is_capped(ledger: Ledger) -> None:
    names = [f"GpuFleetPage{n:03d}" for n in range(MAX_ALERTNAMES + 5)]
    ledger.page(*[alert(alertname=name, fingerprint=f"{n:016x}") for n, name in enumerate(names)])
    text = ledger.client.get("/metrics").text
    series = [line for line in text.splitlines() if line.startswith("gpufleet_fleet_incidents_tot")]
    assert len(series) == MAX_ALERTNAMES + 1
    assert ledger.metric("gpufleet_fleet_incidents_total", alertname=OTHER_ALERTNAME) == 5
    assert len(ledger.incidents()) == MAX_ALERTNAMES + 5  # every one stored


# -- links from pages to exclusions ---------------------------------------------------------


def test_a_page_is_linked_to_the_exclusion_of_its_node_that_followed(ledger: Ledger) -> None:
    start = NOW - 10 * HOUR
    ledger.page(alert("node-a", starts=start))
    excluded = ledger.exclude("node-a", start + 600)
    ledger.exclude("node-b", start + 700)  # another node: no page before it
    [incident] = ledger.incidents()
    assert incident["exclusion_id"] == excluded["id"]
    assert incident["exclusion_delay_s"] == 600
    assert incident["exclusion_source"] == "kubernetes"
    assert [x["node"] for x in ledger.unpaged()] == ["node-b"]


def test_link_edges_the_window_and_the_first_exclusion_only(ledger: Ledger) -> None:
    start = NOW - 50 * HOUR
    ledger.exclude("node-a", start - 1)  # before the page: not its consequence
    ledger.release("node-a", start - 0.5)
    ledger.page(alert("node-a", starts=start, fingerprint="0000000000000001"))
    ledger.page(alert("node-a", "GpuFleetEccUncorrectable", starts=start + 60,
                      fingerprint="0000000000000002"))  # fmt: skip
    first = ledger.exclude("node-a", start + 24 * HOUR)  # the window's last second: linked
    ledger.release("node-a", start + 25 * HOUR)
    ledger.exclude("node-a", start + 26 * HOUR)  # a second exclusion: the pages led to the first
    incidents = ledger.incidents()
    assert [i["exclusion_id"] for i in incidents] == [first["id"], first["id"]]
    assert [i["exclusion_delay_s"] for i in incidents] == [24 * HOUR, 24 * HOUR - 60]
    unpaged = [x["excluded_at"] for x in ledger.unpaged()]
    assert unpaged == [start - 1, start + 26 * HOUR]
    # a shorter window, as a query parameter: the first exclusion is then too late
    assert [i["exclusion_id"] for i in ledger.incidents(window=HOUR)] == [None, None]
    assert len(ledger.unpaged(window=HOUR)) == 3


def test_a_page_just_past_the_window_is_not_linked(ledger: Ledger) -> None:
    start = NOW - 30 * HOUR
    ledger.page(alert("node-a", starts=start))
    ledger.exclude("node-a", start + 24 * HOUR + 1)
    assert ledger.incidents()[0]["exclusion_id"] is None
    assert len(ledger.unpaged()) == 1


def test_the_lists_page_and_filter(ledger: Ledger) -> None:
    for n in range(5):
        ledger.page(alert(f"node-{n}", starts=NOW - HOUR * (10 - n), fingerprint=f"{n:016x}"))
    first = ledger.client.get("/v1/incidents", params={"limit": 2}, headers=AUTH)
    assert len(first.json()) == 2
    link = first.headers["link"]
    assert link.endswith('rel="next"')
    second = ledger.client.get(link[1 : link.index(">")], headers=AUTH)
    assert [i["node"] for i in second.json()] == ["node-2", "node-3"]
    assert [i["node"] for i in ledger.incidents(node="node-4")] == ["node-4"]
    assert len(ledger.incidents(since=NOW - 7 * HOUR)) == 2
    bad = ledger.client.get("/v1/incidents", params={"cursor": "nope"}, headers=AUTH)
    assert bad.status_code == 400


def test_the_lists_need_a_reader_token_like_the_other_reads(ledger: Ledger) -> None:
    assert ledger.client.get("/v1/incidents").status_code == 401
    assert ledger.client.get("/v1/exclusions/unpaged").status_code == 401


# -- any order of re-sends and resolutions ----------------------------------------------------

ALERT_POOL = [  # (fingerprint suffix, start)
    ("a1", NOW - 5 * HOUR),
    ("a1", NOW - 3 * HOUR),  # the same alert firing again: another incident
    ("b2", NOW - 4 * HOUR),
]
EXAMPLES = itertools.count()


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(
        st.lists(
            st.tuples(st.sampled_from(range(len(ALERT_POOL))), st.sampled_from([None, 60.0, 90.0])),
            min_size=1,
            max_size=4,
        ),
        min_size=1,
        max_size=6,
    )
)
def test_any_order_of_re_sends_and_resolutions_keeps_one_incident_per_alert(
    ledger: Ledger, notes: list[list[tuple[int, float | None]]]
) -> None:
    # One ledger for every example: each example's alerts have fingerprints of their own.
    prefix = f"{next(EXAMPLES):014x}"
    pool = [(prefix + suffix, start) for suffix, start in ALERT_POOL]
    before = ledger.metric("gpufleet_fleet_incidents_total", alertname="GpuFleetCriticalXid") or 0
    first_end: dict[int, float] = {}
    for note in notes:
        alerts = []
        for index, after in note:
            fingerprint, start = pool[index]
            ends = None if after is None else start + after
            if ends is not None:
                first_end.setdefault(index, ends)
            alerts.append(alert(fingerprint=fingerprint, starts=start, ends=ends))
        assert ledger.page(*alerts).status_code == 200
    sent = {index for note in notes for index, _ in note}
    rows = {
        (i["fingerprint"], i["started_at"]): i
        for i in ledger.incidents()
        if i["fingerprint"].startswith(prefix)
    }
    assert set(rows) == {pool[index] for index in sent}
    for index in sent:
        assert rows[pool[index]]["resolved_at"] == first_end.get(index)
    counted = ledger.metric("gpufleet_fleet_incidents_total", alertname="GpuFleetCriticalXid")
    assert counted == before + len(rows)
