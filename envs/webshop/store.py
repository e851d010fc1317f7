"""The shop's per-rollout state: sessions and carts in SQLite, in the workspace's own file system.

Owns: the schema and every query. The database file forks with the workspace's files; the connection must not
(an SQLite connection carried across fork() is undefined behaviour), so ``reopen()`` runs in every clone, after
``flush()`` committed everything in the source before the file snapshot.
Must never: keep a transaction open across a request.
"""

from __future__ import annotations

import os
import sqlite3

SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (id TEXT PRIMARY KEY);
CREATE TABLE IF NOT EXISTS cart_items (session TEXT NOT NULL, sku TEXT NOT NULL, qty INTEGER NOT NULL,
                                       PRIMARY KEY (session, sku));
"""


class Store:
    def __init__(self, path: str):
        self.path = path
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        self.db = self._connect()
        self.db.executescript(SCHEMA)

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, isolation_level=None)  # autocommit: no transaction outlives a call

    def flush(self) -> None:
        """Before a fork: nothing pending (autocommit), but make sure the file is written out."""
        self.db.execute("PRAGMA wal_checkpoint") if self._wal() else None

    def _wal(self) -> bool:
        return self.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"

    def reopen(self) -> None:
        """In a clone: the inherited connection points at the source's file; open the clone's own copy."""
        self.db.close()
        self.db = self._connect()

    def new_session(self, session_id: str) -> None:
        self.db.execute("INSERT OR IGNORE INTO sessions VALUES (?)", (session_id,))

    def add_to_cart(self, session: str, sku: str, qty: int) -> None:
        self.db.execute("INSERT INTO cart_items VALUES (?, ?, ?) ON CONFLICT(session, sku) "
                        "DO UPDATE SET qty = qty + excluded.qty", (session, sku, qty))

    def cart(self, session: str) -> list[tuple[str, int]]:
        rows = self.db.execute("SELECT sku, qty FROM cart_items WHERE session = ? ORDER BY sku", (session,))
        return [(sku, qty) for sku, qty in rows]

    def close(self) -> None:
        self.db.close()
