"""Alertmanager's webhook on the ledger: each critical page of a node becomes an incident.

Alertmanager POSTs its notification (webhook payload version 4) with the ledger's write
token as a bearer (``http_config.authorization.credentials_file``). It sends no
Idempotency-Key, and needs none: an incident is keyed by the alert's fingerprint and start
(``incidents.py``), so a re-sent or retried notification changes no count.

What is refused, with a 4xx naming it: a body over ``MAX_BODY_BYTES``, more than
``MAX_ALERTS`` alerts (Alertmanager's ``max_alerts`` keeps a group's notification under
it), and anything that is not a version 4 payload. Alertmanager does not retry a 4xx, so
an alert within a well-formed payload that the ledger cannot store as sent (a node name or
alert name it would have to cut) is skipped alone, named in the answer and counted, and the
rest are stored: what the ledger acknowledged is always what it keeps.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    TypeAdapter,
    ValidationError,
)

from gpufleet import web
from gpufleet.fleet.errors import LedgerUnavailableError
from gpufleet.fleet.incidents import DEFAULT_LINK_WINDOW_S, Incident, IncidentStore
from gpufleet.fleet.models import NodeName
from gpufleet.schema.labels import TrainingJob

MAX_BODY_BYTES = 1024 * 1024
MAX_ALERTS = 500  # per notification: set `max_alerts` in the webhook_config to at most this
MAX_SUMMARY_CHARS = 500  # a longer summary annotation is kept cut (it is text, not a key)
MAX_SKIPPED_SHOWN = 20
# Alertmanager sends the zero time as endsAt of an alert it has no end for.
_NO_TIME_BEFORE = 1e9


@dataclass(frozen=True, slots=True)
class IncidentPolicy:
    """Which alerts are pages worth an incident, and how long after one an exclusion of the
    same node still counts as its consequence."""

    severities: frozenset[str] = frozenset({"critical"})
    link_window_s: float = DEFAULT_LINK_WINDOW_S


class _Alertmanager(BaseModel):
    # Fields this receiver does not read are ignored: Alertmanager adds some over releases
    # (truncatedAlerts came in 0.22), and they must not make a page bounce.
    model_config = ConfigDict(extra="ignore", frozen=True)


class WebhookAlert(_Alertmanager):
    status: Literal["firing", "resolved"]
    labels: dict[str, str]
    annotations: dict[str, str] = Field(default_factory=dict)
    startsAt: AwareDatetime
    endsAt: AwareDatetime | None = None
    fingerprint: Annotated[str, Field(pattern=r"^[0-9A-Za-z]{1,64}$")]


class WebhookNotification(_Alertmanager):
    version: Literal["4"]
    status: Literal["firing", "resolved"]
    receiver: str
    alerts: list[WebhookAlert]
    groupKey: str = ""


# What is stored as sent or not at all: the node must be a name the ledger's exclusions
# accept (or the page could never be linked to one), the alert name and job as bounded.
_STORED = {
    "node": TypeAdapter(NodeName),
    "alertname": TypeAdapter(
        Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=r"^[^\x00-\x1f]+$")]
    ),
    "training_job": TypeAdapter(TrainingJob),
}


def _unstorable(node: str, alertname: str, job: str | None) -> str | None:
    """Why the ledger cannot store these labels as sent, or None."""
    for label, value in (("node", node), ("alertname", alertname), ("training_job", job)):
        if value is None:
            continue
        try:
            _STORED[label].validate_python(value)
        except ValidationError as error:
            shown = value if len(value) <= 80 else value[:77] + "..."
            message = error.errors(include_url=False)[0]["msg"]
            return f"label {label} {shown!r}: {message}"
    return None


def _seconds(moment: datetime | None) -> float | None:
    if moment is None:
        return None
    seconds = moment.timestamp()
    return seconds if seconds >= _NO_TIME_BEFORE else None


@dataclass(frozen=True, slots=True)
class Skipped:
    alert: int  # its index in the notification's alerts
    reason: str
    message: str


def incidents_of(
    notification: WebhookNotification, policy: IncidentPolicy
) -> tuple[list[Incident], list[Skipped], int]:
    """The notification's pages as incidents, the alerts skipped (and why), and how many
    alerts were not pages (another severity, or no node label)."""
    incidents: list[Incident] = []
    skipped: list[Skipped] = []
    not_pages = 0
    for index, alert in enumerate(notification.alerts):
        labels = alert.labels
        node = labels.get("node", "")
        if not node or labels.get("severity") not in policy.severities:
            not_pages += 1
            continue
        job = labels.get("training_job") or None
        problem = _unstorable(node, labels.get("alertname", ""), job)
        if problem is not None:
            skipped.append(Skipped(index, "invalid", problem))
            continue
        started_at = _seconds(alert.startsAt)
        if started_at is None:
            skipped.append(Skipped(index, "invalid", f"startsAt {alert.startsAt} is before 2001"))
            continue
        resolved_at = None
        if alert.status == "resolved":
            resolved_at = max(started_at, _seconds(alert.endsAt) or started_at)
        incidents.append(
            Incident(
                fingerprint=alert.fingerprint,
                started_at=started_at,
                alertname=labels["alertname"],
                node=node,
                severity=labels["severity"],
                training_job=job,
                summary=alert.annotations.get("summary", "")[:MAX_SUMMARY_CHARS],
                resolved_at=resolved_at,
            )
        )
    return incidents, skipped, not_pages


class IgnoredAlerts:
    """Alerts the webhook did not record, by reason; in memory (resets with the ledger)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()

    def add(self, reason: str, count: int) -> None:
        if count:
            with self._lock:
                self._counts[reason] += count

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


async def receive(
    request: Request,
    incidents: IncidentStore,
    writes: web.WriteGuard,
    policy: IncidentPolicy,
    ignored: IgnoredAlerts,
) -> Response:
    """Check, parse and store one notification; a :class:`web.Refusal` names what was wrong."""
    writes.check(request)
    raw = await web.read_body(
        request,
        MAX_BODY_BYTES,
        reason="too_large",
        advice=f"; set max_alerts (at most {MAX_ALERTS}) in Alertmanager's webhook_config",
    )
    document: Any = web.parse_json(raw)
    alerts = document.get("alerts") if isinstance(document, dict) else None
    if isinstance(alerts, list) and len(alerts) > MAX_ALERTS:
        raise web.Refusal(
            413,
            "too_many_alerts",
            f"the notification carries {len(alerts)} alerts, more than the {MAX_ALERTS} "
            f"this receiver takes at once; set max_alerts: {MAX_ALERTS} in Alertmanager's "
            "webhook_config (it then sends the first ones and counts the rest as truncated)",
        )
    try:
        notification = WebhookNotification.model_validate(document)
    except ValidationError as error:
        refusal = web.invalid(error)
        refusal.extra["expected"] = "an Alertmanager webhook notification (version 4)"
        raise refusal from None
    found, skipped, not_pages = incidents_of(notification, policy)
    try:
        recorded = await asyncio.wrap_future(incidents.submit(found))
    except LedgerUnavailableError as error:
        raise web.Refusal(
            503, "unavailable", f"nothing was stored ({error}); Alertmanager will retry"
        ) from None
    ignored.add("not_a_page", not_pages)
    ignored.add("invalid", len(skipped))
    return JSONResponse(
        {
            "incidents": len(found),
            "new": recorded.new,
            "repeated": recorded.repeated,
            "resolved": recorded.resolved,
            "not_pages": not_pages,
            "skipped": [
                {"alert": s.alert, "reason": s.reason, "message": s.message}
                for s in skipped[:MAX_SKIPPED_SHOWN]
            ],
        }
    )
