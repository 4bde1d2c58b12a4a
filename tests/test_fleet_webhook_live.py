"""A real Alertmanager pages the ledger through its webhook: a critical XID on node A,
re-sent by Alertmanager's short repeat interval, is one incident, linked to the exclusion
of node A that followed; node B's exclusion, with no page before it, is listed as unpaged;
the resolved notification sets the incident's end.

The alerts are posted to Alertmanager's own API (/api/v2/alerts), as Prometheus posts them;
Alertmanager sends the ledger's write token from a credentials file, as deployed.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpufleet.fleet.app import create_app
from gpufleet.fleet.store import LedgerStore
from gpufleet.lab.devstack import AlertmanagerServer
from gpufleet.lab.processes import http_get, http_json, wait_until

# Alertmanager 0.25 (beside Prometheus 2) and 0.33 (beside 3) both page the ledger.
pytestmark = [pytest.mark.integration, pytest.mark.prometheus("2", "3")]

TOKEN = "live-webhook-token"
XID = {"alertname": "GpuFleetCriticalXid", "severity": "critical", "node": "node-a", "xid": "79"}
SLOW = {"alertname": "GpuFleetHwSlowdown", "severity": "warning", "node": "node-a"}


def rfc3339(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="milliseconds")


def ledger_config(ledger_url: str, token_file: Path, path: Path) -> Path:
    """Alertmanager routing every alert to the ledger, re-sending every 2 s."""
    config = {
        "route": {
            "receiver": "ledger",
            "group_by": ["alertname", "node"],
            "group_wait": "1s",
            "group_interval": "1s",
            "repeat_interval": "2s",
        },
        "receivers": [
            {
                "name": "ledger",
                "webhook_configs": [
                    {
                        "url": f"{ledger_url}/v1/alertmanager",
                        "send_resolved": True,
                        "max_alerts": 500,
                        "http_config": {"authorization": {"credentials_file": str(token_file)}},
                    }
                ],
            }
        ],
    }
    path.write_text(yaml.safe_dump(config))
    return path


def webhook_deliveries(manager: AlertmanagerServer) -> float:
    """Notifications Alertmanager sent through its webhook integration (its own count)."""
    text = http_get(f"{manager.url}/metrics").decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("alertmanager_notifications_total{") and 'integration="webhook"' in line
    )


class LedgerApi:
    def __init__(self, url: str) -> None:
        self.url = url

    def request(self, method: str, path: str, body: Any = None, **headers: str) -> Any:
        request = urllib.request.Request(
            f"{self.url}{path}",
            data=None if body is None else json.dumps(body).encode(),
            headers={
                "Authorization": f"Bearer {TOKEN}",
                "Content-Type": "application/json",
                **headers,
            },
            method=method,
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    def exclude(self, node: str, key: str) -> dict[str, Any]:
        body = {"node": node, "reason": "xid79", "source": "kubernetes"}
        stored: dict[str, Any] = self.request(
            "POST", "/v1/exclusions", body, **{"Idempotency-Key": key}
        )
        return stored


def test_a_real_alertmanager_page_is_one_incident_linked_to_the_exclusion_that_followed(
    tmp_path: Path,
    serve_asgi: Callable[..., Any],
    alertmanager_factory: Callable[..., AlertmanagerServer],
) -> None:
    store = LedgerStore(tmp_path / "fleet.db")
    ledger = LedgerApi(serve_asgi(create_app(store, TOKEN)).url)
    token_file = tmp_path / "ledger-token"
    token_file.write_text(TOKEN + "\n")
    manager = alertmanager_factory(
        config_file=ledger_config(ledger.url, token_file, tmp_path / "alertmanager.yml")
    )
    started = time.time() - 5
    ends = started + 3600
    fired = [
        {"labels": XID, "annotations": {"summary": "A GPU reported XID 79."},
         "startsAt": rfc3339(started), "endsAt": rfc3339(ends)},
        {"labels": SLOW, "startsAt": rfc3339(started), "endsAt": rfc3339(ends)},
    ]  # fmt: skip
    http_json(f"{manager.url}/api/v2/alerts", fired)

    def re_sent() -> list[dict[str, Any]] | None:
        incidents: list[dict[str, Any]] = ledger.request("GET", "/v1/incidents")
        sent = webhook_deliveries(manager)
        # the XID's group twice at least, besides the warning's group
        if incidents and incidents[0]["notifications"] >= 2 and sent >= 3:
            return incidents
        return None

    [incident] = wait_until(re_sent, 90, interval=0.25, what="Alertmanager to re-send the page")
    assert incident["alertname"] == "GpuFleetCriticalXid"
    assert incident["node"] == "node-a"
    assert incident["started_at"] == pytest.approx(started, abs=0.001)
    assert incident["resolved_at"] is None
    assert incident["exclusion_id"] is None  # nothing excluded yet

    excluded_a = ledger.exclude("node-a", "live-test:exclude:node-a")
    excluded_b = ledger.exclude("node-b", "live-test:exclude:node-b")

    # Resolved as Prometheus resolves an alert: the same alert, now with its end.
    resolved_at = time.time() - 1
    http_json(f"{manager.url}/api/v2/alerts",
              [fired[0] | {"endsAt": rfc3339(resolved_at)}])  # fmt: skip

    def resolved() -> list[dict[str, Any]] | None:
        incidents: list[dict[str, Any]] = ledger.request("GET", "/v1/incidents")
        return incidents if incidents[0]["resolved_at"] is not None else None

    [incident] = wait_until(resolved, 90, interval=0.25, what="the resolved notification")
    assert incident["resolved_at"] == pytest.approx(resolved_at, abs=0.001)
    assert incident["exclusion_id"] == excluded_a["id"]
    delay = excluded_a["excluded_at"] - incident["started_at"]
    assert incident["exclusion_delay_s"] == pytest.approx(delay)
    assert 0 < delay < 120
    unpaged = ledger.request("GET", "/v1/exclusions/unpaged")
    assert [(x["id"], x["node"]) for x in unpaged] == [(excluded_b["id"], "node-b")]

    metrics = http_get(f"{ledger.url}/metrics").decode()
    assert 'gpufleet_fleet_incidents_total{alertname="GpuFleetCriticalXid"} 1.0' in metrics
    ignored = [
        line
        for line in metrics.splitlines()
        if line.startswith('gpufleet_fleet_webhook_alerts_ignored_total{reason="not_a_page"}')
    ]
    assert ignored and float(ignored[0].rsplit(" ", 1)[1]) >= 1  # the warning's group
    print(f"webhook deliveries: {webhook_deliveries(manager):.0f}, "
          f"notifications of the incident: {incident['notifications']}")  # fmt: skip
    store.close()
