"""One thread that owns a SQLite connection and commits what it is given, in groups.

Work submitted while a commit (and its fsync) is under way is committed
together in the next transaction, each piece inside its own savepoint: one
fsync for many writers, and a piece that raises is rolled back alone and gets
its exception, while the rest of its group commits. Each future resolves only
after COMMIT returned, so a result in hand is on disk.
"""

from __future__ import annotations

import logging
import queue
import sqlite3
import threading
from collections.abc import Callable
from concurrent.futures import Future
from contextlib import suppress
from typing import Any, TypeVar

from gpufleet.fleet.errors import LedgerUnavailableError

log = logging.getLogger(__name__)
T = TypeVar("T")
Work = Callable[[sqlite3.Connection], Any]
MAX_GROUP = 256  # pieces of work committed together at most: bounds one transaction's latency


class SerialWriter:
    def __init__(self, db: sqlite3.Connection, before_group: Callable[[], None], name: str) -> None:
        self._db = db
        self._before_group = before_group  # runs in the writer thread, between transactions
        self._queue: queue.SimpleQueue[tuple[Work, Future[Any]] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def closed(self) -> bool:
        return self._closed

    def submit(self, work: Callable[[sqlite3.Connection], T]) -> Future[T]:
        """Run ``work`` in the next transaction; the future resolves after COMMIT."""
        future: Future[T] = Future()
        with self._lock:  # nothing can be queued behind the stop marker
            if self._closed:
                future.set_exception(LedgerUnavailableError("the ledger is shutting down"))
            else:
                self._queue.put((work, future))
        return future

    def close(self) -> None:
        """Commit what is queued, then stop the thread."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._queue.put(None)
        self._thread.join()

    def _run(self) -> None:
        stopping = False
        while not stopping:
            group: list[tuple[Work, Future[Any]]] = []
            item = self._queue.get()
            while item is not None:
                group.append(item)
                if len(group) >= MAX_GROUP:
                    break
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
            stopping = item is None
            self._before_group()
            if group:
                self._commit(group)

    def _commit(self, group: list[tuple[Work, Future[Any]]]) -> None:
        db = self._db
        done: list[tuple[Future[Any], Any, BaseException | None]] = []
        try:
            db.execute("BEGIN IMMEDIATE")
            for work, future in group:
                if not future.set_running_or_notify_cancel():
                    continue  # its request went away before it ran: never stored, never acked
                db.execute("SAVEPOINT work")
                try:
                    result = work(db)
                except Exception as error:  # noqa: BLE001 - handed to the work's future
                    db.execute("ROLLBACK TO work")
                    db.execute("RELEASE work")
                    if isinstance(error, sqlite3.Error):  # the disk, not the request
                        error = LedgerUnavailableError(f"the database refused the write: {error}")
                    done.append((future, None, error))
                else:
                    db.execute("RELEASE work")
                    done.append((future, result, None))
            db.execute("COMMIT")
        except Exception as error:  # noqa: BLE001 - the thread must outlive any group
            if db.in_transaction:
                with suppress(sqlite3.Error):
                    db.execute("ROLLBACK")
            log.error("the ledger could not commit %d writes: %s", len(group), error)
            failure = LedgerUnavailableError(f"the database refused the write: {error}")
            for _, future in group:
                if future.running():
                    future.set_exception(failure)
            return
        for future, result, raised in done:
            if raised is None:
                future.set_result(result)
            else:
                future.set_exception(raised)
