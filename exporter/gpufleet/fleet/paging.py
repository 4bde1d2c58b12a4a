"""Keyset pagination of the ledger's lists: a page, its cursor, and every page in turn.

A cursor holds the last row's sort key (base64 of its JSON), so a page costs the same
however deep it is, and a row written meanwhile never shifts the pages after it.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpufleet.fleet.errors import CursorError


@dataclass(frozen=True, slots=True)
class Page:
    rows: list[dict[str, Any]]
    next_cursor: str | None  # None on the last page


def page_of(rows: list[dict[str, Any]], limit: int, key: tuple[str, str]) -> Page:
    """The first ``limit`` of ``rows`` (read ``limit + 1``, so one more says a page
    follows), with the cursor after the last when one does."""
    more = len(rows) > limit
    rows = rows[:limit]
    last = rows[-1] if more and rows else None
    return Page(rows, encode_cursor([last[key[0]], last[key[1]]]) if last else None)


def every_row(fetch_page: Callable[[str | None], Page]) -> list[dict[str, Any]]:
    """The rows of every page, following the cursors from the first page to the last."""
    rows: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        page = fetch_page(cursor)
        rows += page.rows
        if page.next_cursor is None:
            return rows
        cursor = page.next_cursor


def encode_cursor(values: list[Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(values).encode()).decode().rstrip("=")


def decode_cursor(cursor: str, types: tuple[type | tuple[type, ...], ...]) -> list[Any]:
    try:
        values = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (ValueError, binascii.Error, UnicodeDecodeError):
        values = None
    if (
        not isinstance(values, list)
        or len(values) != len(types)
        or not all(
            isinstance(v, t) and not isinstance(v, bool) for v, t in zip(values, types, strict=True)
        )
    ):
        raise CursorError(
            f"cursor {cursor[:40]!r} is not one this ledger issued; pass the `cursor` of the "
            "previous page's Link header unchanged, or leave it out for the first page"
        )
    return values
