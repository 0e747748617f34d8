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
- With a bound (`store_timeout`, the server's `store_timeout_ms`): the busy timeout is at most the
  bound, and a statement still running at the call's deadline is interrupted (`sqlite3_interrupt`,
  from the process's watchdog: see `audit.bounds`), rolled back, and the call raises StoreTimeout;
  the group writer's transaction goes whole. What no interrupt reaches: a read or write the
  filesystem itself does not return from (a hung network filesystem) holds its thread until it
  does; the readiness probe still reports the store not answering meanwhile.
- Room: a write that adds data (`Tx.claim`) is refused (`StoreFull`) unless it fits both under
  `max_store_bytes`, counted as the database's pages in use (`page_count - freelist_count`: the
  pages a deletion frees are reused before the file grows), and in the disk's free space above
  `reserve_bytes`, which stays free for what must work on a full store: deletions, reports, and
  the WAL and its checkpoints. Near the limit SQLite holds the line itself: the write runs with
  `max_page_count` set to that room (plus a few pages for the b-trees' own splits), so a write
  that needs more fails inside SQLite (SQLITE_FULL) and rolls back whole, as it does when the disk
  itself runs out. When the disk runs short, the WAL is folded back into the database before a
  write (`_disk_before_write`).
- Connections are opened lazily by the process that uses them: one per thread for reads, and one
  per process for writes, which the process's writers take in turn (SQLite lets one writer at a
  time in anyway; the one connection keeps its page cache, where connections taking turns would
  each re-read what the others changed). A process that forks never hands a connection to its
  children (a connection found to belong to another process is left alone and replaced).
- The group writer's commits from the event loop run outside Python (`core_groups`): the core's
  own thread and connection take the records the loop makes, commit whatever queued as one
  transaction, and tell the loop through a socket it watches, never taking the GIL. They write the
  common group only: every audit checked against its chat's, room plainly to spare (no
  `max_store_bytes`; the disk's free space above the reserve, beyond what the WAL holds, covers
  the group). Any other group, and one whose check fails, is declined whole, nothing of it
  written, and goes to the Python writer thread, which writes it here (`SqlStore.record_shifts`:
  record by record outcomes, exact room claims). That connection and this module's write
  connection take SQLite's write lock in turn, as two processes' do (the busy timeout).
"""

from __future__ import annotations

import functools
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

from contextshift import engine
from contextshift.audit import bounds
from contextshift.audit.sql import (
    GROUP_STATEMENTS,
    Row,
    SqlCoreGroups,
    SqlStore,
    Tx,
)
from contextshift.audit.store import (
    CLAIM_SLACK_BYTES,
    DECLINED,
    CoreGroups,
    CoreOutcome,
    FullCause,
    StoreConfigError,
    StoreFull,
    StoreUnavailable,
    WouldWait,
)

T = TypeVar("T")

SYNCHRONOUS = ("normal", "full")
DEFAULT_BUSY_TIMEOUT_MS = 5000
# Pages a claimed write may add beyond the room for its data: the b-trees' own pages (a split
# leaf or index page in each table the write touches), so the write a deletion made room for fits.
HEADROOM_PAGES = 16
UNLIMITED_PAGES = 4294967294  # SQLite's largest max_page_count
# How close to its limit a write must come for SQLite's max_page_count to hold the line (further
# off, the claim's own check does, and no pragma is run).
HELD_BY_SQLITE_BYTES = 8 * 1024 * 1024
# How long folding the WAL back into the database waits for readers to move to the latest snapshot.
FOLD_BUSY_TIMEOUT_MS = 200


# The statements of the core's group commits, in `engine.SqliteGroupWriter`'s order.


def disk_free_bytes(folder: Path) -> int:
    """Bytes an unprivileged writer may still take on the filesystem holding `folder`."""
    found = os.statvfs(folder)
    return found.f_bavail * found.f_frsize


def _mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


@dataclass
class _Room:
    """What a write transaction has claimed, against what the disk had before it began."""

    free: int  # the disk's free bytes
    wal: int  # the WAL's size
    claimed: int = 0  # bytes claimed so far
    held_by: FullCause | None = None  # what limits it, once SQLite holds the line (max_page_count)


class _Tx:
    def __init__(self, connection: sqlite3.Connection, claim: Callable[[int], None] | None = None) -> None:
        self.connection = connection
        self._claim = claim

    def rows(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        return self.connection.execute(sql, params).fetchall()

    def locked(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        return self.rows(sql, params)  # a write transaction holds the database's write lock

    def run(self, sql: str, params: Sequence[Any] = ()) -> int:
        return self.connection.execute(sql, params).rowcount

    def run_many(self, sql: str, params: Sequence[Sequence[Any]]) -> None:
        self.connection.executemany(sql, params)

    def lock(self, key: str) -> None:
        pass  # a write transaction holds the database's write lock

    def lock_all(self, keys: Sequence[str]) -> None:
        pass

    def claim(self, nbytes: int) -> None:
        if self._claim is None:
            raise AssertionError("room is claimed by write transactions only")
        self._claim(nbytes)


class SqliteStore(SqlStore):
    dialect = "sqlite"
    blob_type = "BLOB"
    table_exists = "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = ?"

    def __init__(
        self,
        path: Path,
        *,
        synchronous: str = "normal",
        busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
        max_bytes: int | None = None,
        reserve_bytes: int = 0,
        disk_free: Callable[[Path], int] = disk_free_bytes,
        store_timeout: float | None = None,
    ) -> None:
        if synchronous not in SYNCHRONOUS:
            raise StoreConfigError(
                f"sqlite synchronous must be one of {', '.join(SYNCHRONOUS)}, got {synchronous!r}"
            )
        self.path = path
        self._synchronous = synchronous
        self._bound = store_timeout
        if store_timeout is not None:  # waiting for the write lock is bounded too
            busy_timeout_ms = min(busy_timeout_ms, max(1, round(store_timeout * 1e3)))
        self._busy_timeout_ms = busy_timeout_ms
        self._wal_path = Path(f"{path}-wal")
        # Made once: every write asks the disk under it for its free space (a Path made and turned
        # into a str per write cost as much as the statvfs itself).
        self._folder = path.parent
        self._page_bytes: int | None = None
        self._max_bytes = max_bytes
        self._reserve_bytes = reserve_bytes
        self._disk_free = disk_free
        self._local = threading.local()
        self._lock = threading.RLock()
        # Every connection opened, with the process that opened it (the only one that may close it).
        self._opened: list[tuple[int, sqlite3.Connection]] = []
        # This process's write connection and the lock its writers take turns with, by pid.
        self._writer: tuple[int, threading.Lock, sqlite3.Connection] | None = None

    @property
    def description(self) -> str:
        return f"sqlite {self.path} (synchronous={self._synchronous})"

    def _connection(self, *, at_once: bool = False) -> sqlite3.Connection:
        """This thread's connection for reads; `at_once`: its connection for reads that never
        wait (no busy timeout)."""
        kind = "at_once" if at_once else "connection"
        mine: tuple[int, sqlite3.Connection] | None = getattr(self._local, kind, None)
        if mine is not None and mine[0] == os.getpid():
            return mine[1]
        connection = self._open(0 if at_once else None)
        setattr(self._local, kind, (os.getpid(), connection))
        return connection

    def _write_connection(self) -> tuple[threading.Lock, sqlite3.Connection]:
        """This process's connection for writes, and the lock to hold while using it."""
        with self._lock:
            if self._writer is None or self._writer[0] != os.getpid():
                self._writer = (os.getpid(), threading.Lock(), self._open())
            return self._writer[1], self._writer[2]

    def _setup(self, busy_timeout_ms: int | None = None) -> list[str]:
        """What sets up every connection: one that waits up to `busy_timeout_ms` (the store's own
        unless given) for a busy file."""
        busy_timeout = self._busy_timeout_ms if busy_timeout_ms is None else busy_timeout_ms
        return [
            f"PRAGMA busy_timeout = {int(busy_timeout)}",
            "PRAGMA journal_mode = WAL",
            f"PRAGMA synchronous = {self._synchronous.upper()}",
            "PRAGMA foreign_keys = ON",
        ]

    def _open(self, busy_timeout_ms: int | None = None) -> sqlite3.Connection:
        """A new connection, set up by `_setup(busy_timeout_ms)`."""
        try:
            self._folder.mkdir(parents=True, exist_ok=True)
            # Autocommit: every transaction is begun explicitly. One thread at a time uses it;
            # `close` closes it from another, after every user stopped.
            connection = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            for statement in self._setup(busy_timeout_ms):
                connection.execute(statement)
        except (sqlite3.Error, OSError) as e:
            raise StoreUnavailable(f"cannot open the SQLite store {self.path}: {e}") from e
        with self._lock:
            self._opened.append((os.getpid(), connection))
        return connection

    def core_groups(self) -> CoreGroups | None:
        """Group commits outside Python for this process (see the module's doc); None with
        `max_store_bytes` (whose room only this module's claims count)."""
        if self._max_bytes is not None:
            return None
        room = (self._folder, self._wal_path, self._reserve_bytes, CLAIM_SLACK_BYTES)
        try:
            self._folder.mkdir(parents=True, exist_ok=True)
            writer = engine.SqliteGroupWriter(
                str(self.path), self._setup(), GROUP_STATEMENTS, room, self._bound
            )
        except (sqlite3.Error, OSError) as e:
            raise StoreUnavailable(f"cannot open the SQLite store {self.path}: {e}") from e
        return SqliteCoreGroups(self, writer)

    def _run(self, work: Callable[[Tx], T], *, write: bool) -> T:
        limit = bounds.deadline(self._bound)
        if not write:
            connection = self._connection()
            with self._errors(limit=limit), _interrupted(connection, limit):
                return self._transaction(_Tx(connection), work, "BEGIN")
        lock, connection = self._write_connection()
        room: _Room | None = None
        with (
            lock,
            self._errors(lambda: room.held_by if room else None, limit),
            _interrupted(connection, limit),
        ):
            room = _Room(*self._disk_before_write(connection))
            try:
                claim = functools.partial(self._claim, connection, room)
                return self._transaction(_Tx(connection, claim), work, "BEGIN IMMEDIATE")
            finally:
                if room.held_by:  # the next write on this connection claims its own room
                    connection.execute(f"PRAGMA max_page_count = {UNLIMITED_PAGES}")

    def _query(self, sql: str, params: Sequence[Any]) -> list[Row]:
        # Autocommit: the statement is its own read transaction (no BEGIN and COMMIT to run).
        limit = bounds.deadline(self._bound)
        connection = self._connection()
        with self._errors(limit=limit), _interrupted(connection, limit):
            return _Tx(connection).rows(sql, params)

    def _read_at_once(self, sql: str, params: Sequence[Any]) -> list[Row]:
        # Autocommit, like `_query`, without its deadline: with no busy timeout the read does not
        # wait for the file, and a failure is the caller's usual read's to report.
        try:
            return _Tx(self._connection(at_once=True)).rows(sql, params)
        except (sqlite3.Error, StoreUnavailable) as e:
            raise WouldWait(f"{self.description}: {e}") from e

    def ping(self) -> None:
        self._query("PRAGMA schema_version", ())  # reads the database's header: the file answers

    @staticmethod
    def _transaction(tx: _Tx, work: Callable[[Tx], T], begin: str) -> T:
        connection = tx.connection
        connection.execute(begin)
        try:
            result = work(tx)
            connection.execute("COMMIT")
        except BaseException:
            if connection.in_transaction:
                connection.execute("ROLLBACK")
            raise
        return result

    def _disk_before_write(self, connection: sqlite3.Connection) -> tuple[int, int]:
        """The disk's free bytes and the WAL's size before a write. When the free space above the
        reserve is down to less than the WAL takes, the WAL is first copied into the database and
        truncated, giving back to the disk all it took but the pages the database keeps. (Left
        alone, the WAL grows until the next automatic checkpoint, 1000 pages, and keeps its size
        after, eating the room a deletion made.)"""
        free, wal = self._disk_free(self._folder), _file_bytes(self._wal_path)
        if not wal or free - self._reserve_bytes >= wal:
            return free, wal
        connection.execute(f"PRAGMA busy_timeout = {FOLD_BUSY_TIMEOUT_MS}")
        try:
            connection.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        except sqlite3.OperationalError:
            pass  # readers held it back, or the disk has no room for it: the claim sees what is left
        finally:
            connection.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout_ms)}")
        return self._disk_free(self._folder), _file_bytes(self._wal_path)

    def _claim(self, connection: sqlite3.Connection, claims: _Room, nbytes: int) -> None:
        """Grants `nbytes` more of room to the write in progress on `connection` (on top of what it
        claimed before, before it wrote any of it), given what the disk had before it (see the
        module's doc), or raises StoreFull."""
        free, wal = claims.free, claims.wal
        needed = claims.claimed + nbytes - CLAIM_SLACK_BYTES
        if self._max_bytes is None and free - self._reserve_bytes - wal >= needed:
            claims.claimed += nbytes
            return  # room to spare, whatever the WAL holds: the disk itself is the limit
        page_size = self._page_size(connection)
        pages, free_pages = _pages(connection)
        used = (pages - free_pages) * page_size
        # Pages committed to the WAL but not yet copied into the file take disk at the checkpoint.
        unwritten = max(0, pages * page_size - _file_bytes(self.path))
        room, cause = free - self._reserve_bytes - unwritten + free_pages * page_size, FullCause.DISK_RESERVE
        if self._max_bytes is not None and self._max_bytes - used < room:
            room, cause = self._max_bytes - used, FullCause.MAX_STORE_BYTES
        if needed > room:
            if cause is FullCause.MAX_STORE_BYTES:
                why = f"its data takes {_mib(used)} of max_store_bytes {_mib(self._max_bytes or 0)}"
            else:
                why = (
                    f"the disk under it ({self._folder}) has {_mib(free)} free, and "
                    f"store_reserve_bytes keeps {_mib(self._reserve_bytes)} of it for deletions, "
                    "reports and the journal"
                )
            raise StoreFull(self.description, cause, f"{why}; this write needs {nbytes} bytes more")
        claims.claimed += nbytes
        if room - needed < HELD_BY_SQLITE_BYTES:
            # Near the limit, SQLite holds it: the file may grow by the room its free pages do not
            # cover, and the b-trees' splits.
            claims.held_by = cause
            growth = max(0, room - free_pages * page_size) // page_size + HEADROOM_PAGES
            connection.execute(f"PRAGMA max_page_count = {pages + growth}")

    def _page_size(self, connection: sqlite3.Connection) -> int:
        if self._page_bytes is None:  # fixed when the database was made
            self._page_bytes = int(connection.execute("PRAGMA page_size").fetchone()[0])
        return self._page_bytes

    def _data_bytes(self, tx: Tx) -> int:
        """The pages in use: what the file holds but the pages a deletion freed (reused first)."""
        connection = cast(_Tx, tx).connection
        pages, free_pages = _pages(connection)
        return (pages - free_pages) * self._page_size(connection)

    def _disk_free_bytes(self) -> int | None:
        with self._errors():
            return self._disk_free(self._folder)

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

    def _disk_said(self) -> str:
        try:
            return f"the disk under it ({self._folder}) has {_mib(self._disk_free(self._folder))} free"
        except OSError as e:
            return f"the disk under it ({self._folder}) cannot say its free space: {e}"

    @contextmanager
    def _errors(
        self,
        held_by: Callable[[], FullCause | None] = lambda: None,
        limit: bounds.Deadline | None = None,
    ) -> Iterator[None]:
        """SQLite's operational errors say the store cannot serve now, and the transaction was
        rolled back: a full database or disk (SQLITE_FULL: past the room a write claimed, or the
        disk itself full) is StoreFull; the others (locked past the busy timeout, I/O, a file that
        is not a database), and a filesystem that cannot say its free space, StoreUnavailable.
        Others (constraint violations, misuse) are bugs and pass through."""
        try:
            yield
        except OSError as e:  # the filesystem under it, asked how much room it has
            raise StoreUnavailable(f"SQLite store {self.path}: {e}") from e
        except sqlite3.DatabaseError as e:
            if not isinstance(e, sqlite3.OperationalError) and type(e) is not sqlite3.DatabaseError:
                raise
            if e.sqlite_errorcode == sqlite3.SQLITE_FULL:
                cause = held_by() or FullCause.DISK
                raise StoreFull(self.description, cause, f"SQLite: {e} ({self._disk_said()})") from e
            if e.sqlite_errorcode == sqlite3.SQLITE_INTERRUPT and limit is not None:
                raise limit.timed_out(self.description) from e
            raise StoreUnavailable(f"SQLite store {self.path}: {e}") from e


class SqliteCoreGroups(SqlCoreGroups):
    """A SQLite store's group commits run by the core (see the module's doc)."""

    def __init__(self, store: SqliteStore, writer: engine.SqliteGroupWriter) -> None:
        super().__init__(store, writer)
        self._store: SqliteStore = store

    def _failure(self, error: Exception) -> CoreOutcome:
        bound = self._store._bound
        limit = None if bound is None else bounds.Deadline(0.0, bound, True)
        try:
            with self._store._errors(limit=limit):
                raise error
        except StoreFull:  # the disk ran out under it: the store's own path says which record failed
            return DECLINED
        except Exception as e:
            return e


@contextmanager
def _interrupted(connection: sqlite3.Connection, limit: bounds.Deadline | None) -> Iterator[None]:
    """Interrupts the statement `connection` runs at the call's deadline (the process's watchdog),
    until the block ends."""
    if limit is None:
        yield
        return
    watch = bounds.watch(limit.at, connection.interrupt)
    try:
        yield
    finally:
        watch.cancel()


def _pages(connection: sqlite3.Connection) -> tuple[int, int]:
    """Pages in the database, and pages on its free list."""
    ((pages,),) = connection.execute("PRAGMA page_count").fetchall()
    ((free_pages,),) = connection.execute("PRAGMA freelist_count").fetchall()
    return int(pages), int(free_pages)


def _file_bytes(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0
