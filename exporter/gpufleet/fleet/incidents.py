"""Pages as incidents: the critical node alerts Alertmanager sent, and the exclusions they led to.

An incident is one alert as Alertmanager identifies it, its ``fingerprint`` (a hash of its
labels) and its ``startsAt``: Alertmanager re-sends a firing alert every group_interval and
repeat_interval, and retries a delivery that failed, so the pair is the table's unique key
and every re-send lands on the same row (its ``notifications`` count grows). An alert that
fires again after it resolved has a new ``startsAt``: a new incident. The first resolved
notification sets ``resolved_at``; nothing clears it.

An incident *led to* the first exclusion of its node at or after its start, within the link
window (24 h by default); an exclusion that no incident led to is *unpaged*: the node failed
without a page before it (a silent failure, or a page that never reached the ledger). The
link is computed when read, from one SQL expression (``_LINK``), so a different window is a
query parameter, not a migration.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from gpufleet.fleet.paging import Page, decode_cursor, every_row, page_of
from gpufleet.fleet.store import LedgerStore
from gpufleet.schema import ledger as schema

DEFAULT_LINK_WINDOW_S = 86400.0
MAX_ALERTNAMES = 64  # alert names /metrics counts by; later ones are counted under OTHER
OTHER_ALERTNAME = "_other"

# The first exclusion of incident i's node at or after its start, within :window seconds.
_LINK = """(
    SELECT e.id FROM exclusions e
    WHERE e.node = i.node AND e.excluded_at >= i.started_at
        AND e.excluded_at <= i.started_at + :window
    ORDER BY e.excluded_at, e.id LIMIT 1
)"""


@dataclass(frozen=True, slots=True)
class Incident:
    """One page, as stored: what identifies it, where it fired, and when it resolved."""

    fingerprint: str
    started_at: float
    alertname: str
    node: str
    severity: str
    training_job: str | None = None
    summary: str = ""
    resolved_at: float | None = None


@dataclass(frozen=True, slots=True)
class Recorded:
    """What one notification changed: incidents new to the ledger, re-sends of known ones,
    and incidents it resolved."""

    new: int
    repeated: int
    resolved: int


class IncidentStore:
    """Incidents in the ledger's database: written on its writer thread, read on its readers."""

    def __init__(self, store: LedgerStore, clock: Callable[[], float] | None = None) -> None:
        self._store = store
        self._clock = clock or store.clock

    def submit(self, incidents: Sequence[Incident]) -> Future[Recorded]:
        """Store a notification's incidents in one transaction; re-sends change no count."""

        def work(db: sqlite3.Connection) -> Recorded:
            now = self._clock()
            new = repeated = resolved = 0
            for incident in incidents:
                key = (incident.fingerprint, incident.started_at)
                inserted = db.execute(
                    "INSERT INTO incidents (fingerprint, started_at, alertname, node, severity, "
                    "training_job, summary, resolved_at, received_at, last_received_at) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                    "ON CONFLICT (fingerprint, started_at) DO NOTHING",
                    (*key, incident.alertname, incident.node, incident.severity,
                     incident.training_job, incident.summary, incident.resolved_at, now, now),
                ).rowcount  # fmt: skip
                if inserted:
                    new += 1
                    resolved += incident.resolved_at is not None
                    self._count(db, incident.alertname)
                    continue
                repeated += 1
                db.execute(
                    "UPDATE incidents SET notifications = notifications + 1, "
                    "last_received_at = ? WHERE fingerprint = ? AND started_at = ?",
                    (now, *key),
                )
                if incident.resolved_at is not None:
                    resolved += db.execute(
                        "UPDATE incidents SET resolved_at = ? "
                        "WHERE fingerprint = ? AND started_at = ? AND resolved_at IS NULL",
                        (incident.resolved_at, *key),
                    ).rowcount
            return Recorded(new, repeated, resolved)

        return self._store.submit(work)

    def record(self, incidents: Sequence[Incident]) -> Recorded:
        """The blocking form of :meth:`submit`, for scripts and tests."""
        return self.submit(incidents).result()

    @staticmethod
    def _count(db: sqlite3.Connection, alertname: str) -> None:
        known = db.execute(
            "SELECT 1 FROM incident_counts WHERE alertname = ?", (alertname,)
        ).fetchone()
        if known is None:
            names: int = db.execute(
                "SELECT count(*) FROM incident_counts WHERE alertname != ?", (OTHER_ALERTNAME,)
            ).fetchone()[0]
            if names >= MAX_ALERTNAMES:
                alertname = OTHER_ALERTNAME
        db.execute(
            "INSERT INTO incident_counts (alertname, count) VALUES (?, 1) "
            "ON CONFLICT (alertname) DO UPDATE SET count = count + 1",
            (alertname,),
        )

    # -- reads --------------------------------------------------------------------------------

    def _rows(self, sql: str, parameters: dict[str, Any]) -> list[dict[str, Any]]:
        with self._store.reader() as db:
            return [dict(row) for row in db.execute(sql, parameters).fetchall()]

    def page(
        self,
        node: str | None = None,
        *,
        since: float | None = None,
        until: float | None = None,
        limit: int = 1000,
        cursor: str | None = None,
        window: float = DEFAULT_LINK_WINDOW_S,
    ) -> Page:
        """Incidents by start time, each with the exclusion it led to (``exclusion_id``,
        ``excluded_at``, ``exclusion_delay_s``; null when none followed within ``window``)."""
        clauses, parameters = _filters("i", "started_at", node, since, until)
        parameters["window"] = window
        if cursor is not None:
            clauses.append("(i.started_at, i.id) > (:after_time, :after_id)")
            parameters["after_time"], parameters["after_id"] = decode_cursor(
                cursor, ((int, float), int)
            )
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        rows = self._rows(
            "SELECT i.*, e.id AS exclusion_id, e.excluded_at AS excluded_at, "  # noqa: S608 - fixed clauses
            "e.reason AS exclusion_reason, e.source AS exclusion_source, "
            "e.excluded_at - i.started_at AS exclusion_delay_s "
            f"FROM incidents i LEFT JOIN exclusions e ON e.id = {_LINK} {where} "
            "ORDER BY i.started_at, i.id LIMIT :limit",
            {**parameters, "limit": limit + 1},
        )
        return page_of(rows, limit, ("started_at", "id"))

    def unpaged_exclusions_page(
        self,
        node: str | None = None,
        *,
        since: float | None = None,
        until: float | None = None,
        limit: int = 1000,
        cursor: str | None = None,
        window: float = DEFAULT_LINK_WINDOW_S,
    ) -> Page:
        """Exclusions no incident led to, by time: the nodes that failed without a page."""
        clauses, parameters = _filters("x", "excluded_at", node, since, until)
        parameters["window"] = window
        clauses.append(
            "NOT EXISTS (SELECT 1 FROM incidents i WHERE i.node = x.node "  # noqa: S608 - fixed
            "AND i.started_at BETWEEN x.excluded_at - :window AND x.excluded_at "
            f"AND {_LINK} = x.id)"
        )
        if cursor is not None:
            clauses.append("(x.excluded_at, x.id) > (:after_time, :after_id)")
            parameters["after_time"], parameters["after_id"] = decode_cursor(
                cursor, ((int, float), int)
            )
        rows = self._rows(
            f"SELECT x.* FROM exclusions x WHERE {' AND '.join(clauses)} "  # noqa: S608 - fixed clauses
            "ORDER BY x.excluded_at, x.id LIMIT :limit",
            {**parameters, "limit": limit + 1},
        )
        return page_of(rows, limit, ("excluded_at", "id"))

    def incidents(self, window: float = DEFAULT_LINK_WINDOW_S) -> list[dict[str, Any]]:
        """Every incident with its link (reports and scripts; the API pages)."""
        return every_row(lambda cursor: self.page(limit=10_000, cursor=cursor, window=window))

    def counts(self) -> list[tuple[str, int]]:
        """Incidents per alert name (at most ``MAX_ALERTNAMES`` and ``OTHER_ALERTNAME``)."""
        rows = self._rows("SELECT alertname, count FROM incident_counts ORDER BY alertname", {})
        return [(row["alertname"], row["count"]) for row in rows]


def _filters(
    alias: str, time_column: str, node: str | None, since: float | None, until: float | None
) -> tuple[list[str], dict[str, Any]]:
    """The WHERE clauses of a list (fixed text) and their named parameters."""
    clauses: list[str] = []
    parameters: dict[str, Any] = {"node": node, "since": since, "until": until}
    if node:
        clauses.append(f"{alias}.node = :node")
    if since is not None:
        clauses.append(f"{alias}.{time_column} >= :since")
    if until is not None:
        clauses.append(f"{alias}.{time_column} < :until")
    return clauses, parameters


class IncidentCollector(Collector):
    """``gpufleet_fleet_incidents_total`` by alert name, read from the ledger at each scrape,
    and the alerts the webhook ignored, by reason, counted in memory since the start."""

    def __init__(self, incidents: IncidentStore, ignored: Callable[[], dict[str, int]]) -> None:
        self._incidents = incidents
        self._ignored = ignored

    def collect(self) -> Iterator[Metric]:
        family = schema.INCIDENTS.counter()
        for alertname, count in self._incidents.counts():
            family.add_metric([alertname], count)
        yield family
        ignored = schema.WEBHOOK_ALERTS_IGNORED.counter()
        for reason, count in sorted(self._ignored().items()):
            ignored.add_metric([reason], count)
        yield ignored
