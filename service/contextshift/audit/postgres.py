"""The PostgreSQL store: one database shared by any number of replicas (and their workers).

psycopg 3 with a synchronous `psycopg_pool.ConnectionPool`, used from the threads that already run
the engine: a shift reads the store, shifts and writes its audit in one call on one engine thread,
so a synchronous pool costs no extra hop between the event loop and a thread, and both backends
share one synchronous store protocol (sqlite3 has no async API). The pool is opened lazily by the
process that uses it, never inherited across a fork, and holds at most `pool_size` connections (one
per engine thread); a pooled connection the server closed (a restart) is replaced before use.

Read-modify-write transactions lock the rows they read (`SELECT ... FOR UPDATE`: a report locks
its chat's audit row, so a newer shift of the chat waits for it); what appends to, deletes or
reports on one chat, and migrations, take transaction-scoped advisory locks first. A transaction
that loses a deadlock or a serialization conflict is retried.

A lost database: a connection found broken, or closed by the server, is followed by one direct
connection attempt; when that fails too, the store is down. Its pool is closed at once (its
connections are dead, and waiting on it for a new one would outlast any call's deadline), every
call fails at once with StoreUnavailable, and one call every `RETRY_SECONDS` tries to connect again,
opening a new pool when it can. So no call waits on a database that is not there, and the first
call after the database is back finds it.

Room (`max_store_bytes`): the bytes of the audits' payloads and the history blocks' JSON, kept in
`store_usage` by triggers on both tables (migration 2), in one row per backend process
(mod 64) so that concurrent writers do not queue on one counter. A write that adds data reads their
sum in its transaction and is refused past the limit; writers committing at the same moment may
each pass it, so the store can go past it by what they add. The tables on disk take more than this
(row headers, indexes, generations, space not yet vacuumed).
"""

from __future__ import annotations

import functools
import logging
import os
import select
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import psycopg
from psycopg import errors
from psycopg_pool import ConnectionPool, PoolTimeout

from contextshift.audit.sql import AUDIT_UPSERT, RECORD_GENERATION, Row, SqlStore, Tx, generation_params
from contextshift.audit.store import (
    CLAIM_SLACK_BYTES,
    FullCause,
    ShiftRecord,
    StoreFull,
    StoreUnavailable,
    redacted,
)

T = TypeVar("T")

log = logging.getLogger("contextshift.store")

CONNECT_TIMEOUT_SECONDS = 5
# While the database is down: how often one call tries to connect again (the others fail at once),
# and how long that try may take (libpq's least connect_timeout).
RETRY_SECONDS = 1.0
RETRY_CONNECT_TIMEOUT_SECONDS = 2
RETRIES = 3
# A shift's generation and its audit in one statement (one round trip, atomic on its own; the
# foreign key is checked at its end, when the generation row exists): no audit row when the
# generation id belongs to another chat.
RECORD_SHIFT = (
    f"WITH g AS ({RECORD_GENERATION} RETURNING generation_id) "
    f"INSERT INTO audits (tenant, chat_id, generation_id, payload) SELECT ?, ?, generation_id, ? FROM g {AUDIT_UPSERT}"
)


@functools.lru_cache(maxsize=256)
def _sql(statement: str) -> str:
    """`?` placeholders as psycopg's `%s` (no statement here contains either otherwise)."""
    return statement.replace("?", "%s")


def _closed_by_server(connection: psycopg.Connection[Row]) -> bool:
    """Whether the server closed this idle connection (a restart, a terminated backend), at no
    round trip for a live one: a closed one has the server's goodbye or end of file waiting to be
    read, a live idle one nothing. Something to read is then confirmed by a ping."""
    if connection.closed:
        return True
    readable = select.poll()
    readable.register(connection.fileno(), select.POLLIN)
    if not readable.poll(0):
        return False
    try:
        ConnectionPool.check_connection(connection)
    except psycopg.Error:
        return True
    return False


@dataclass
class _Outage:
    """The database found down: since when, why, and when a call may try it again."""

    pid: int  # the process that found it (a forked child finds its own)
    since: float
    error: str
    retry_at: float = 0.0
    trying: bool = False  # a call is trying to connect now

    def unavailable(self) -> StoreUnavailable:
        return StoreUnavailable(
            f"{self.error} (down for {time.monotonic() - self.since:.1f} s; "
            f"a call tries to connect again every {RETRY_SECONDS:g} s)"
        )


class _Tx:
    def __init__(self, connection: psycopg.Connection[Row], claim: Callable[[_Tx, int], None]) -> None:
        self.connection = connection
        self._claim = claim
        self.used: int | None = None  # the store's data as the first claim read it
        self.claimed = 0  # bytes claimed since

    def rows(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        return self.connection.execute(_sql(sql), params).fetchall()

    def locked(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        return self.rows(sql + " FOR UPDATE", params)

    def run(self, sql: str, params: Sequence[Any] = ()) -> int:
        return self.connection.execute(_sql(sql), params).rowcount

    def run_many(self, sql: str, params: Sequence[Sequence[Any]]) -> None:
        if params:
            self.connection.cursor().executemany(_sql(sql), params)

    def lock(self, key: str) -> None:
        self.lock_all([key])

    def lock_all(self, keys: Sequence[str]) -> None:
        if keys:  # one statement: the function runs on the array's elements in order
            self.rows(
                "SELECT pg_advisory_xact_lock(hashtextextended(k, 0)) FROM unnest(?::text[]) AS k",
                (list(keys),),
            )

    def claim(self, nbytes: int) -> None:
        self._claim(self, nbytes)


Pool = ConnectionPool[psycopg.Connection[Row]]


class PostgresStore(SqlStore):
    dialect = "postgresql"
    blob_type = "BYTEA"
    table_exists = "SELECT COUNT(*) FROM pg_tables WHERE schemaname = current_schema() AND tablename = ?"

    def __init__(
        self, url: str, *, pool_size: int = 4, timeout: float = 10.0, max_bytes: int | None = None
    ) -> None:
        self._url = url
        self._pool_size = pool_size
        self._timeout = timeout
        self._max_bytes = max_bytes
        self._lock = threading.Lock()
        self._pool: tuple[int, Pool] | None = None
        self._outage: _Outage | None = None

    @property
    def description(self) -> str:
        return f"postgresql {redacted(self._url)}"

    def _connections(self) -> Pool:
        """This process's pool: opened on first use, and again, by one call at a time, after the
        database was found down (the others fail at once meanwhile)."""
        with self._lock:
            pid = os.getpid()
            if self._pool is not None and self._pool[0] == pid:
                return self._pool[1]
            outage = self._outage if self._outage is not None and self._outage.pid == pid else None
            if outage is None:  # the first use: other calls wait the few milliseconds it takes
                try:
                    pool = self._open(CONNECT_TIMEOUT_SECONDS)
                except StoreUnavailable as e:
                    self._outage = self._found_down(str(e))
                    raise
                self._pool = (pid, pool)
                return pool
            if outage.trying or time.monotonic() < outage.retry_at:
                raise outage.unavailable()
            outage.trying = True
        try:
            pool = self._open(RETRY_CONNECT_TIMEOUT_SECONDS)
        except StoreUnavailable as e:
            with self._lock:
                outage.error, outage.retry_at, outage.trying = str(e), time.monotonic() + RETRY_SECONDS, False
            raise outage.unavailable() from e
        with self._lock:
            self._pool, self._outage = (pid, pool), None
        log.warning(
            "the store is back",
            extra={
                "fields": {
                    "store": self.description,
                    "down_seconds": round(time.monotonic() - outage.since, 3),
                }
            },
        )
        return pool

    def _open(self, connect_timeout: int) -> Pool:
        try:
            # A direct connection first: its error says why (refused, authentication, no such
            # database), where a pool that cannot connect only times out.
            psycopg.connect(self._url, connect_timeout=connect_timeout).close()
            pool: Pool = ConnectionPool(
                self._url,
                min_size=1,
                max_size=self._pool_size,
                kwargs={"autocommit": True, "connect_timeout": connect_timeout},
                timeout=self._timeout,
                open=False,
                name="contextshift",
            )
            pool.open(wait=True, timeout=self._timeout)
        except (psycopg.Error, PoolTimeout) as e:
            raise StoreUnavailable(f"cannot connect to PostgreSQL at {redacted(self._url)}: {e}") from e
        return pool

    def _down(self, pool: Pool, error: str) -> None:
        """The database is down (a connection broke, and a new one cannot be made): its pool is
        closed, and calls fail at once until one of them connects again."""
        with self._lock:
            if self._pool is None or self._pool[1] is not pool:
                return  # another call found it first
            self._pool, self._outage = None, self._found_down(error)
        pool.close(timeout=0)  # its workers' connection attempts end on their own

    def _found_down(self, error: str) -> _Outage:
        log.warning("the store is down", extra={"fields": {"store": self.description, "error": error}})
        now = time.monotonic()
        return _Outage(os.getpid(), now, error, now + RETRY_SECONDS)

    def _reachable(self) -> str | None:
        """None when a new connection can be made now, else why not."""
        try:
            psycopg.connect(self._url, connect_timeout=RETRY_CONNECT_TIMEOUT_SECONDS).close()
        except psycopg.Error as e:
            return f"cannot connect to PostgreSQL at {redacted(self._url)}: {e}"
        return None

    def _run(self, work: Callable[[Tx], T], *, write: bool) -> T:
        return self._on_connection(work, transaction=True)

    def _query(self, sql: str, params: Sequence[Any]) -> list[Row]:
        return self._on_connection(lambda tx: tx.rows(sql, params), transaction=False)

    def _on_connection(self, work: Callable[[Tx], T], *, transaction: bool, pipeline: bool = False) -> T:
        """`work` on a pooled connection, in a transaction or (one statement) in autocommit, in
        pipeline mode if asked (statements go out as they come, and wait for their results only
        when one is read or the pipeline synced); retried when it loses a deadlock or a
        serialization conflict."""
        pool = self._connections()
        for attempt in range(RETRIES):
            try:
                with self._live_connection(pool) as connection:
                    tx = _Tx(connection, self._claim)
                    try:
                        if not transaction:
                            return work(tx)
                        with connection.pipeline() if pipeline else nullcontext(), connection.transaction():
                            return work(tx)
                    except psycopg.OperationalError:
                        if connection.broken:  # the database may be gone: see `_live_connection`
                            why = self._reachable()
                            if why is not None:
                                self._down(pool, why)
                        raise
            except (errors.DeadlockDetected, errors.SerializationFailure):
                if attempt == RETRIES - 1:
                    raise StoreUnavailable(
                        f"PostgreSQL store: conflicting transactions, {RETRIES} tries"
                    ) from None
            except errors.DiskFull as e:
                raise StoreFull(self.description, FullCause.DISK, f"PostgreSQL: {e}") from e
            except (psycopg.OperationalError, PoolTimeout) as e:
                raise StoreUnavailable(f"PostgreSQL store at {redacted(self._url)}: {e}") from e
        raise AssertionError("not reached")

    @contextmanager
    def _live_connection(self, pool: Pool) -> Iterator[psycopg.Connection[Row]]:
        """A pooled connection the server has not closed: after a database restart every pooled
        connection is dead, and each would fail one call. A dead one is closed (the pool replaces
        it) and the next taken, once a new connection proved the database is there (else it is
        down: StoreUnavailable at once). Not the pool's `check` callback: each failed check there
        sleeps a growing backoff (1 s, 2 s, 4 s...), so a pool of stale connections could time
        out."""
        reachable = False
        for left in reversed(range(self._pool_size + 1)):
            with pool.connection() as connection:
                if left and _closed_by_server(connection):
                    connection.close()
                    why = None if reachable else self._reachable()
                    if why is not None:
                        self._down(pool, why)
                        raise StoreUnavailable(why)
                    reachable = True
                    continue
                yield connection
                return

    def _claim(self, tx: _Tx, nbytes: int) -> None:
        if self._max_bytes is None:
            return
        if tx.used is None:  # read once: what this transaction writes is added up here
            tx.used = self._data_bytes(tx)
        used = tx.used + tx.claimed
        if used + nbytes - CLAIM_SLACK_BYTES > self._max_bytes:
            raise StoreFull(
                self.description,
                FullCause.MAX_STORE_BYTES,
                f"its audits and history take {used / 2**20:.1f} MiB of max_store_bytes "
                f"{self._max_bytes / 2**20:.1f} MiB; this write needs {nbytes} bytes more",
            )
        tx.claimed += nbytes

    def _data_bytes(self, tx: Tx) -> int:
        ((used,),) = tx.rows("SELECT COALESCE(SUM(bytes), 0) FROM store_usage")
        return int(used)

    def _run_group(self, work: Callable[[Tx], T]) -> T:
        # In pipeline mode: BEGIN, the locks and the read of the chats' audits go in one round
        # trip, every record's write in the next (`_write_shifts`), then COMMIT.
        return self._on_connection(work, transaction=True, pipeline=True)

    def _write_shifts(self, tx: Tx, records: Sequence[ShiftRecord]) -> list[bool]:
        connection = cast(_Tx, tx).connection
        written = [
            connection.execute(_sql(RECORD_GENERATION), generation_params(r.tenant, r.generation))
            if r.audit is None
            else connection.execute(
                _sql(RECORD_SHIFT),
                (*generation_params(r.tenant, r.generation), r.tenant, r.generation.chat_id, r.audit),
            )
            for r in records
        ]
        with connection.pipeline() as pipeline:  # the group's own (see `_run_group`)
            pipeline.sync()
        return [cursor.rowcount > 0 for cursor in written]

    def close(self) -> None:
        with self._lock:
            pool, self._pool, self._outage = self._pool, None, None
        if pool is not None and pool[0] == os.getpid():
            pool[1].close()
