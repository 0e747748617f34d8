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
"""

from __future__ import annotations

import functools
import os
import select
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import psycopg
from psycopg import errors
from psycopg_pool import ConnectionPool, PoolTimeout

from contextshift.audit import redacted
from contextshift.audit.sql import AUDIT_UPSERT, RECORD_GENERATION, Row, SqlStore, Tx, generation_params
from contextshift.audit.store import Generation, GenerationIdInUse, StoreUnavailable

T = TypeVar("T")

CONNECT_TIMEOUT_SECONDS = 5
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


class _Tx:
    def __init__(self, connection: psycopg.Connection[Row]) -> None:
        self._connection = connection

    def rows(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        return self._connection.execute(_sql(sql), params).fetchall()

    def locked(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        return self.rows(sql + " FOR UPDATE", params)

    def run(self, sql: str, params: Sequence[Any] = ()) -> int:
        return self._connection.execute(_sql(sql), params).rowcount

    def run_many(self, sql: str, params: Sequence[Sequence[Any]]) -> None:
        if params:
            self._connection.cursor().executemany(_sql(sql), params)

    def lock(self, key: str) -> None:
        self.rows("SELECT pg_advisory_xact_lock(hashtextextended(?, 0))", (key,))


class PostgresStore(SqlStore):
    blob_type = "BYTEA"

    def __init__(self, url: str, *, pool_size: int = 4, timeout: float = 10.0) -> None:
        self._url = url
        self._pool_size = pool_size
        self._timeout = timeout
        self._lock = threading.Lock()
        self._pool: tuple[int, ConnectionPool[psycopg.Connection[Row]]] | None = None

    @property
    def description(self) -> str:
        return f"postgresql {redacted(self._url)}"

    def _connections(self) -> ConnectionPool[psycopg.Connection[Row]]:
        with self._lock:
            if self._pool is not None and self._pool[0] == os.getpid():
                return self._pool[1]
            try:
                # A direct connection first: its error says why (refused, authentication, no such
                # database), where a pool that cannot connect only times out.
                psycopg.connect(self._url, connect_timeout=CONNECT_TIMEOUT_SECONDS).close()
                pool = ConnectionPool(
                    self._url,
                    min_size=1,
                    max_size=self._pool_size,
                    kwargs={"autocommit": True, "connect_timeout": CONNECT_TIMEOUT_SECONDS},
                    timeout=self._timeout,
                    open=False,
                    name="contextshift",
                )
                pool.open(wait=True, timeout=self._timeout)
            except (psycopg.Error, PoolTimeout) as e:
                raise StoreUnavailable(f"cannot connect to PostgreSQL at {redacted(self._url)}: {e}") from e
            self._pool = (os.getpid(), pool)
            return pool

    def _run(self, work: Callable[[Tx], T], *, write: bool) -> T:
        return self._on_connection(work, transaction=True)

    def _query(self, sql: str, params: Sequence[Any]) -> list[Row]:
        return self._on_connection(lambda tx: tx.rows(sql, params), transaction=False)

    def _on_connection(self, work: Callable[[Tx], T], *, transaction: bool) -> T:
        """`work` on a pooled connection, in a transaction or (one statement) in autocommit;
        retried when it loses a deadlock or a serialization conflict."""
        pool = self._connections()
        for attempt in range(RETRIES):
            try:
                with self._live_connection(pool) as connection:
                    if not transaction:
                        return work(_Tx(connection))
                    with connection.transaction():
                        return work(_Tx(connection))
            except (errors.DeadlockDetected, errors.SerializationFailure):
                if attempt == RETRIES - 1:
                    raise StoreUnavailable(
                        f"PostgreSQL store: conflicting transactions, {RETRIES} tries"
                    ) from None
            except (psycopg.OperationalError, PoolTimeout) as e:
                raise StoreUnavailable(f"PostgreSQL store at {redacted(self._url)}: {e}") from e
        raise AssertionError("not reached")

    @contextmanager
    def _live_connection(
        self, pool: ConnectionPool[psycopg.Connection[Row]]
    ) -> Iterator[psycopg.Connection[Row]]:
        """A pooled connection the server has not closed: after a database restart every pooled
        connection is dead, and each would fail one call. A dead one is closed (the pool replaces
        it) and the next taken. Not the pool's `check` callback: each failed check there sleeps a
        growing backoff (1 s, 2 s, 4 s...), so a pool of stale connections could time out."""
        for left in reversed(range(self._pool_size + 1)):
            with pool.connection() as connection:
                if left and _closed_by_server(connection):
                    connection.close()
                    continue
                yield connection
                return

    def record_shift(self, tenant: str, generation: Generation, audit: bytes | None) -> None:
        if audit is None:
            super().record_shift(tenant, generation, audit)
            return
        params = (*generation_params(tenant, generation), tenant, generation.chat_id, audit)
        if not self._on_connection(lambda tx: tx.run(RECORD_SHIFT, params), transaction=False):
            raise GenerationIdInUse(generation.generation_id)

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None and pool[0] == os.getpid():
            pool[1].close()
