"""Starting the fleet ledger: open its database, say who may write, serve its API."""

from __future__ import annotations

import logging
import sqlite3

from gpufleet.fleet.app import create_app
from gpufleet.fleet.exported import LedgerLimits
from gpufleet.fleet.store import LedgerStore
from gpufleet.web import serve

log = logging.getLogger("gpufleet.fleet")
LOOPBACK = ("127.0.0.1", "::1", "localhost")


class LedgerOpenError(RuntimeError):
    """The database file cannot be opened or migrated; the message says why."""


def open_ledger(db: str, limits: LedgerLimits) -> LedgerStore:
    try:
        return LedgerStore(db, limits=limits)
    except (OSError, sqlite3.Error) as error:
        raise LedgerOpenError(f"cannot open the database: {error}") from None


def serve_ledger(
    store: LedgerStore,
    host: str,
    port: int,
    *,
    token: str | None,
    read_token: str | None,
    allow_unauthenticated_writes: bool,
    log_level: str,
) -> None:
    """Serve the ledger's API until SIGINT/SIGTERM, then close the store."""
    if not token and allow_unauthenticated_writes:
        log.warning(
            "the ledger on %s:%d accepts writes from anyone who can reach it "
            "(--allow-unauthenticated-writes); set --token-file to require a bearer token",
            host,
            port,
        )
    elif not token and host not in LOOPBACK:
        log.warning(
            "the ledger has no write token: writes from beyond loopback get 403 "
            "(set --token-file, or --allow-unauthenticated-writes to accept them)"
        )
    app = create_app(
        store,
        token,
        read_token=read_token,
        allow_unauthenticated_writes=allow_unauthenticated_writes,
    )
    try:
        serve(app, host, port, log_level)
    finally:
        store.close()
