"""A replica-local sqlite index whose changes commit with the store's snapshots (delayed messages'
``ScheduleIndex``, transactions' ``TransactionIndex``).

Changed on the apply thread inside one open transaction; ``commit(applied_index)`` makes everything
so far durable together with the applied index it reflects, so after a crash the index and the
store's snapshot agree and the store re-applies what came after; ``close`` rolls back what no
snapshot committed. Reads take the lock and may come from any thread.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Sequence


class SnapshotIndex:
    def __init__(self, path: str, schema: Sequence[str], tables: Sequence[str]):
        """``schema``: the CREATE statements of the index's own tables (``IF NOT EXISTS``);
        ``tables``: the tables ``reset`` empties."""
        self.path = path
        self._tables = tuple(tables)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA cache_size=-4096")  # 4 MiB of pages at most: the data lives on disk
        for statement in schema:
            self._db.execute(statement)
        self._db.execute("CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v INTEGER NOT NULL)")
        self._db.execute("BEGIN")

    def applied_index(self) -> int | None:
        """The applied index of the last commit (None: never committed)."""
        with self._lock:
            row = self._db.execute("SELECT v FROM meta WHERE k='applied_index'").fetchone()
        return int(row[0]) if row else None

    def reset(self) -> None:
        with self._lock:
            for table in (*self._tables, "meta"):
                self._db.execute(f"DELETE FROM {table}")  # names from the subclass, never from input

    def commit(self, applied_index: int) -> None:
        """Make the changes so far one transaction, stamped with the store's applied index."""
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO meta (k, v) VALUES ('applied_index', ?)", (applied_index,))
            self._db.execute("COMMIT")
            self._db.execute("BEGIN")

    def close(self) -> None:
        with self._lock:
            try:
                self._db.execute("ROLLBACK")  # what the last snapshot did not commit is re-applied
            except sqlite3.Error:
                pass
            self._db.close()
