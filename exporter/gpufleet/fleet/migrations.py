"""The ledger's SQLite schema, as the migrations that build it: never edit one, add the next.

``PRAGMA user_version`` holds how many have run; ``LedgerStore`` runs the rest at
start, each in its own transaction.
"""

from __future__ import annotations

MIGRATIONS: tuple[str, ...] = (
    # 1: the first schema
    """
    CREATE TABLE idempotency (
        key TEXT PRIMARY KEY,
        request_hash TEXT NOT NULL,
        status INTEGER NOT NULL,
        response TEXT NOT NULL,
        created_at REAL NOT NULL
    );
    CREATE TABLE exclusions (
        id INTEGER PRIMARY KEY,
        node TEXT NOT NULL,
        reason TEXT NOT NULL,
        source TEXT NOT NULL CHECK (source IN ('auto', 'manual')),
        training_job TEXT,
        excluded_at REAL NOT NULL,
        released_at REAL,
        note TEXT NOT NULL DEFAULT '',
        idempotency_key TEXT NOT NULL
    );
    CREATE INDEX exclusions_node ON exclusions (node, excluded_at);
    CREATE INDEX exclusions_time ON exclusions (excluded_at);
    CREATE TABLE attempts (
        id INTEGER PRIMARY KEY,
        training_job TEXT NOT NULL,
        attempt INTEGER NOT NULL,
        trigger TEXT NOT NULL CHECK (trigger IN ('initial', 'auto', 'manual')),
        started_at REAL NOT NULL,
        first_step_at REAL,
        ended_at REAL,
        outcome TEXT CHECK (outcome IN ('success', 'failed', 'cancelled')),
        cause TEXT,
        UNIQUE (training_job, attempt)
    );
    """,
    # 2: releases keep their note, so the history says why a node came back
    """
    ALTER TABLE exclusions ADD COLUMN release_note TEXT NOT NULL DEFAULT '';
    """,
    # 3: what /metrics exports, kept up to date by each write (so a scrape reads O(series)
    # rows, not the history); the label values each writer has created, for the caps; and
    # an index to prune old idempotency keys by.
    """
    CREATE INDEX idempotency_created ON idempotency (created_at);
    CREATE INDEX exclusions_open ON exclusions (node) WHERE released_at IS NULL;
    CREATE TABLE exclusion_counts (
        node TEXT NOT NULL,
        reason TEXT NOT NULL,
        source TEXT NOT NULL,
        count INTEGER NOT NULL,
        PRIMARY KEY (node, reason, source)
    ) WITHOUT ROWID;
    INSERT INTO exclusion_counts (node, reason, source, count)
        SELECT node, reason, source, count(*) FROM exclusions GROUP BY node, reason, source;
    CREATE TABLE label_values (
        label TEXT NOT NULL,
        value TEXT NOT NULL,
        PRIMARY KEY (label, value)
    ) WITHOUT ROWID;
    INSERT OR IGNORE INTO label_values SELECT 'node', node FROM exclusions;
    INSERT OR IGNORE INTO label_values SELECT 'reason', reason FROM exclusions;
    INSERT OR IGNORE INTO label_values SELECT 'training_job', training_job FROM attempts;
    CREATE TABLE job_summaries (
        training_job TEXT PRIMARY KEY,
        summary TEXT NOT NULL,
        valid_until REAL
    ) WITHOUT ROWID;
    """,
    # 4: every event names the system that wrote it (models.SOURCES): exclusions lose the
    # auto/manual CHECK (SQLite changes a CHECK only by rebuilding the table), releases and
    # attempts gain the column; job summaries are recomputed (attempts gain a source label).
    """
    CREATE TABLE exclusions_v4 (
        id INTEGER PRIMARY KEY,
        node TEXT NOT NULL,
        reason TEXT NOT NULL,
        source TEXT NOT NULL,
        training_job TEXT,
        excluded_at REAL NOT NULL,
        released_at REAL,
        note TEXT NOT NULL DEFAULT '',
        idempotency_key TEXT NOT NULL,
        release_note TEXT NOT NULL DEFAULT '',
        release_source TEXT
    );
    INSERT INTO exclusions_v4 (id, node, reason, source, training_job, excluded_at,
        released_at, note, idempotency_key, release_note, release_source)
        SELECT id, node, reason, source, training_job, excluded_at, released_at, note,
            idempotency_key, release_note,
            CASE WHEN released_at IS NULL THEN NULL ELSE 'manual' END
        FROM exclusions;
    DROP TABLE exclusions;
    ALTER TABLE exclusions_v4 RENAME TO exclusions;
    CREATE INDEX exclusions_node ON exclusions (node, excluded_at);
    CREATE INDEX exclusions_time ON exclusions (excluded_at);
    CREATE INDEX exclusions_open ON exclusions (node) WHERE released_at IS NULL;
    ALTER TABLE attempts ADD COLUMN source TEXT NOT NULL DEFAULT 'manual';
    """,
    # 5: pages from Alertmanager (incidents.py): one row per alert, keyed by its fingerprint
    # and start however often it is re-sent, and the count per alert name /metrics exports.
    """
    CREATE TABLE incidents (
        id INTEGER PRIMARY KEY,
        fingerprint TEXT NOT NULL,
        started_at REAL NOT NULL,
        alertname TEXT NOT NULL,
        node TEXT NOT NULL,
        severity TEXT NOT NULL,
        training_job TEXT,
        summary TEXT NOT NULL DEFAULT '',
        resolved_at REAL,
        received_at REAL NOT NULL,
        last_received_at REAL NOT NULL,
        notifications INTEGER NOT NULL DEFAULT 1,
        UNIQUE (fingerprint, started_at)
    );
    CREATE INDEX incidents_node ON incidents (node, started_at);
    CREATE INDEX incidents_time ON incidents (started_at, id);
    CREATE TABLE incident_counts (
        alertname TEXT PRIMARY KEY,
        count INTEGER NOT NULL
    ) WITHOUT ROWID;
    """,
    # 6: every write is stored (no label caps); /metrics exports the series that changed
    # within the retention (counters.py): each row notes when it was last written
    # (recorded_at), each exported series when it last changed and when its exposition
    # epoch began (its counter's _created).
    """
    DROP TABLE label_values;
    ALTER TABLE exclusions ADD COLUMN recorded_at REAL;
    UPDATE exclusions SET recorded_at = excluded_at;
    ALTER TABLE attempts ADD COLUMN recorded_at REAL;
    UPDATE attempts SET recorded_at = max(started_at, coalesce(first_step_at, started_at),
        coalesce(ended_at, started_at));
    ALTER TABLE exclusion_counts ADD COLUMN created_at REAL NOT NULL DEFAULT 0;
    ALTER TABLE exclusion_counts ADD COLUMN changed_at REAL NOT NULL DEFAULT 0;
    UPDATE exclusion_counts SET
        created_at = (SELECT min(e.recorded_at) FROM exclusions e WHERE e.node =
            exclusion_counts.node AND e.reason = exclusion_counts.reason
            AND e.source = exclusion_counts.source),
        changed_at = (SELECT max(e.recorded_at) FROM exclusions e WHERE e.node =
            exclusion_counts.node AND e.reason = exclusion_counts.reason
            AND e.source = exclusion_counts.source);
    CREATE INDEX exclusion_counts_changed ON exclusion_counts (changed_at);
    ALTER TABLE job_summaries ADD COLUMN created_at REAL NOT NULL DEFAULT 0;
    ALTER TABLE job_summaries ADD COLUMN changed_at REAL NOT NULL DEFAULT 0;
    ALTER TABLE job_summaries ADD COLUMN running INTEGER NOT NULL DEFAULT 0;
    CREATE INDEX job_summaries_changed ON job_summaries (changed_at);
    """,
    # 7: an ended attempt says whether its launcher restarts the job no more (torchrun's
    # last allowed restart failed): its retry chain then closes as abandoned.
    """
    ALTER TABLE attempts ADD COLUMN restarts_exhausted INTEGER NOT NULL DEFAULT 0;
    """,
)
