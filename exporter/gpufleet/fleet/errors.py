"""What the ledger's store refuses, each answered with its own HTTP status by the API."""

from __future__ import annotations


class LedgerConflictError(Exception):
    """The request contradicts what is stored (HTTP 409)."""


class LedgerUnavailableError(Exception):
    """Nothing was stored: the database refused the transaction, or the writer is closed
    (HTTP 503)."""


class CursorError(ValueError):
    """A pagination cursor this ledger did not issue (HTTP 400)."""
