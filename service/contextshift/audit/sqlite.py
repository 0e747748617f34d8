"""The SQLite store: one database file, shared by every worker process of one machine.

- WAL journal: readers never wait for the writer, and a killed process loses at most its own
  uncommitted transaction (the file opens clean afterwards).
- Durability: `synchronous=NORMAL` by default, which in WAL mode never corrupts the database and
  survives any crash of the process; a power loss or an OS crash may lose the last transactions
  committed before it. `?synchronous=full` syncs the WAL on every commit instead (slower writes, and
  nothing committed is lost even then).
- `BEGIN IMMEDIATE` for every write transaction (they all read before they write): the write lock is
  taken at the start, so a read-modify-write never sees its input change underneath, and two writers
  never deadlock upgrading from read to write.
- `foreign_keys=ON` and the busy timeout (`?busy_timeout_ms=`, default 5000) on every connection.
- Connections are opened lazily by the process that uses them: one per thread for reads, and one
  per process for writes, which the process's writers take in turn (SQLite lets one writer at a
  time in anyway; the one connection keeps its page cache, where connections taking turns would
  each re-read what the others changed). A process that forks never hands a connection to its
  children (a connection found to belong to another process is left alone and replaced).
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from contextshift.audit.sql import Row, SqlStore, Tx
from contextshift.audit.store import StoreConfigError, StoreUnavailable

T = TypeVar("T")

SYNCHRONOUS = ("normal", "full")
DEFAULT_BUSY_TIMEOUT_MS = 5000


class _Tx:
    def __init__(self, connection: sqlite3.Connection) -> None:
        self._connection = connection

    def rows(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        return self._connection.execute(sql, params).fetchall()

    def locked(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        return self.rows(sql, params)  # a write transaction holds the database's write lock

    def run(self, sql: str, params: Sequence[Any] = ()) -> int:
        return self._connection.execute(sql, params).rowcount

    def run_many(self, sql: str, params: Sequence[Sequence[Any]]) -> None:
        self._connection.executemany(sql, params)

    def lock(self, key: str) -> None:
        pass  # a write transaction holds the database's write lock


class SqliteStore(SqlStore):
    blob_type = "BLOB"

    def __init__(
        self, path: Path, *, synchronous: str = "normal", busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS
    ) -> None:
        if synchronous not in SYNCHRONOUS:
            raise StoreConfigError(
                f"sqlite synchronous must be one of {', '.join(SYNCHRONOUS)}, got {synchronous!r}"
            )
        self.path = path
        self._synchronous = synchronous
        self._busy_timeout_ms = busy_timeout_ms
        self._local = threading.local()
        self._lock = threading.RLock()
        # Every connection opened, with the process that opened it (the only one that may close it).
        self._opened: list[tuple[int, sqlite3.Connection]] = []
        # This process's write connection and the lock its writers take turns with, by pid.
        self._writer: tuple[int, threading.Lock, sqlite3.Connection] | None = None

    @property
    def description(self) -> str:
        return f"sqlite {self.path} (synchronous={self._synchronous})"

    def _connection(self) -> sqlite3.Connection:
        """This thread's connection for reads."""
        mine: tuple[int, sqlite3.Connection] | None = getattr(self._local, "connection", None)
        if mine is not None and mine[0] == os.getpid():
            return mine[1]
        connection = self._open()
        self._local.connection = (os.getpid(), connection)
        return connection

    def _write_connection(self) -> tuple[threading.Lock, sqlite3.Connection]:
        """This process's connection for writes, and the lock to hold while using it."""
        with self._lock:
            if self._writer is None or self._writer[0] != os.getpid():
                self._writer = (os.getpid(), threading.Lock(), self._open())
            return self._writer[1], self._writer[2]

    def _open(self) -> sqlite3.Connection:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # Autocommit: every transaction is begun explicitly. One thread at a time uses it;
            # `close` closes it from another, after every user stopped.
            connection = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            connection.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout_ms)}")
            connection.execute("PRAGMA journal_mode = WAL")
            connection.execute(f"PRAGMA synchronous = {self._synchronous.upper()}")
            connection.execute("PRAGMA foreign_keys = ON")
        except (sqlite3.Error, OSError) as e:
            raise StoreUnavailable(f"cannot open the SQLite store {self.path}: {e}") from e
        with self._lock:
            self._opened.append((os.getpid(), connection))
        return connection

    def _run(self, work: Callable[[Tx], T], *, write: bool) -> T:
        if not write:
            return self._transaction(self._connection(), work, write=False)
        lock, connection = self._write_connection()
        with lock:
            return self._transaction(connection, work, write=True)

    def _query(self, sql: str, params: Sequence[Any]) -> list[Row]:
        # Autocommit: the statement is its own read transaction (no BEGIN and COMMIT to run).
        with _unavailable_on_error(self.path):
            return _Tx(self._connection()).rows(sql, params)

    def _transaction(self, connection: sqlite3.Connection, work: Callable[[Tx], T], *, write: bool) -> T:
        with _unavailable_on_error(self.path):
            connection.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            try:
                result = work(_Tx(connection))
                connection.execute("COMMIT")
            except BaseException:
                if connection.in_transaction:
                    connection.execute("ROLLBACK")
                raise
            return result

    def problems(self) -> list[str]:
        connection = self._connection()
        found = [row[0] for row in connection.execute("PRAGMA integrity_check").fetchall() if row[0] != "ok"]
        found += [
            f"foreign key violation in {row[0]}" for row in connection.execute("PRAGMA foreign_key_check")
        ]
        return found + super().problems()

    def close(self) -> None:
        with self._lock:
            opened, self._opened = self._opened, []
        self._writer = None
        for pid, connection in opened:
            if pid == os.getpid():  # a parent's, inherited through a fork, is the parent's to close
                connection.close()


@contextmanager
def _unavailable_on_error(path: Path) -> Iterator[None]:
    """SQLite's operational errors (locked past the busy timeout, disk full, I/O, a file that is
    not a database) say the store cannot serve now; the transaction was rolled back. Others
    (constraint violations, misuse) are bugs and pass through."""
    try:
        yield
    except sqlite3.DatabaseError as e:
        if not isinstance(e, sqlite3.OperationalError) and type(e) is not sqlite3.DatabaseError:
            raise
        raise StoreUnavailable(f"SQLite store {path}: {e}") from e
