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
call fails at once with StoreUnavailable, and every `RETRY_SECONDS` a call (or the readiness probe)
starts a new connection attempt and waits for it within its bound, the pool opened anew when one
succeeds. So no call waits on a database that is not there, and the first call after the
database is back finds it.

A silent network (a partition, a dead NAT entry: nothing answers, nothing is reset): with a bound
(`store_timeout`, the server's `store_timeout_ms`), every call ends by it (or by its caller's
deadline, when sooner; see `audit.bounds`). Waiting for a pooled connection is bounded by it;
once the call has one, the process's watchdog shuts the connection's socket down at the deadline,
the blocked thread wakes with an error, and the connection is closed so the pool never hands it
out again; the call raises StoreTimeout (the group writer's whole transaction goes with it: never
committed, unless its COMMIT was already on its way). A connection broken by the store's own bound
means the database does not answer: the store is down as above, so the calls queued behind it fail
at once instead of each waiting out the bound. The connection attempts cannot be broken that way
(libpq's connect timeout is whole seconds, at least 2): they run on threads of their own, waited
for within the bound, several at a time on a network that swallows them, so one starts within
`RETRY_SECONDS` of its return. Every connection also has TCP keepalives and `tcp_user_timeout`
(`TCP_SETTINGS`, unless the URL sets them), so the kernel itself gives up on a dead peer in
seconds where nothing bounds the call (the command line's store commands).

The group writer's commits from the event loop run outside Python (`core_groups`): the core's own
thread and connection (tokio-postgres, `rust_ext/core/src/postgres_group.rs`) take the records the
loop makes and commit whatever queued as one transaction in three pipelined round trips (as
`_run_group` does), telling the loop through a socket it watches, never taking the GIL. They write
the common group only: every audit checked against its chat's, under the chats' advisory locks.
Whatever this module must decide is declined whole, nothing of it written, and goes to the Python
writer thread: a check that fails, an error of the database (retried or reported here record by
record), a connection that cannot be made or broke before its COMMIT (the outage handling above
says whether the database is down). Only no answer within the bound (StoreTimeout; the groups
behind it then fail at once until a new connection answers, one tried every 0.25 s) and a
connection broken with the COMMIT sent (StoreUnavailable: stored or not, nobody can say) fail a
group there. The core connects with the URL's parameters and libpq's environment (PGHOST, PGUSER,
PGPASSWORD...) and the TCP settings above, never over TLS: a URL it cannot read as libpq would (TLS
required, a client certificate, no host) and `max_store_bytes` keep every write here
(`_core_conninfo`).

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
import math
import os
import re
import select
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import psycopg
from psycopg import errors
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import ConnectionPool, PoolTimeout

from contextshift import engine
from contextshift.audit import bounds
from contextshift.audit.sql import (
    AUDIT,
    AUDIT_COLUMNS,
    AUDIT_UPSERT,
    GROUP_STATEMENTS,
    RECORD_GENERATION,
    Row,
    SqlCoreGroups,
    SqlStore,
    Tx,
    audit_params,
    generation_params,
    gone_segments,
)
from contextshift.audit.store import (
    CLAIM_SLACK_BYTES,
    CoreGroups,
    CoreOutcome,
    FullCause,
    ShiftRecord,
    StoreFull,
    StoreTimeout,
    StoreUnavailable,
    redacted,
)

T = TypeVar("T")

log = logging.getLogger("contextshift.store")

CONNECT_TIMEOUT_SECONDS = 5
# While the database is down: how often a connection attempt may start (the calls between fail at
# once), how long one may take (libpq's least connect_timeout), and how many may be under way at
# once (each waits out its connect timeout on a network that swallows it).
RETRY_SECONDS = 0.25
RETRY_CONNECT_TIMEOUT_SECONDS = 2
MAX_ATTEMPTS = 8
# libpq's TCP settings on every connection, pooled or direct, where the URL sets none: an idle
# connection to a peer that is gone is found dead after about keepalives_idle + keepalives_interval
# x keepalives_count seconds, one with data unacknowledged after tcp_user_timeout milliseconds
# (Linux), where TCP on its own retransmits for about 15 minutes.
TCP_SETTINGS = {
    "keepalives": "1",
    "keepalives_idle": "5",
    "keepalives_interval": "2",
    "keepalives_count": "3",
    "tcp_user_timeout": "10000",
}
RETRIES = 3
# The chats' advisory locks, one statement for them all (the function runs on the array's elements
# in order).
LOCK_ALL = "SELECT pg_advisory_xact_lock(hashtextextended(k, 0)) FROM unnest(?::text[]) AS k"
# The connection parameters the core's writer (tokio-postgres) reads, by libpq's name: its name for
# each, and the values it takes where it does not take every value libpq does. Any other parameter
# (a client certificate, TLS required) leaves the store's writes to its own path.
_CORE_PARAMETERS = {
    "host": "host",
    "hostaddr": "hostaddr",
    "port": "port",
    "user": "user",
    "password": "password",
    "dbname": "dbname",
    "options": "options",
    "application_name": "application_name",
    "connect_timeout": "connect_timeout",
    "keepalives": "keepalives",
    "keepalives_idle": "keepalives_idle",
    "keepalives_interval": "keepalives_interval",
    "keepalives_count": "keepalives_retries",
    "tcp_user_timeout": "tcp_user_timeout",  # libpq's milliseconds, tokio-postgres's seconds
    "sslmode": "sslmode",
    "target_session_attrs": "target_session_attrs",
}
_CORE_SSLMODES = {"disable", "allow", "prefer"}  # the core's connections are never TLS
# libpq's environment variables the core's writer reads as libpq would, where the URL is silent.
_CORE_ENVIRONMENT = {
    "host": "PGHOST",
    "port": "PGPORT",
    "user": "PGUSER",
    "password": "PGPASSWORD",
    "dbname": "PGDATABASE",
}
# A shift's generation and its audit in one statement (one round trip, atomic on its own; the
# foreign key is checked at its end, when the generation row exists): no audit row when the
# generation id belongs to another chat.
RECORD_SHIFT = (
    f"WITH g AS ({RECORD_GENERATION} RETURNING generation_id) "
    f"INSERT INTO audits (tenant, chat_id, generation_id, payload, {AUDIT_COLUMNS}) "
    f"SELECT ?, ?, generation_id, ?, ?, ?, ?, ? FROM g {AUDIT_UPSERT}"
)
# A record's segments, written and deleted in the same round trip as its audit, and only if its
# audit was (its generation id was not another chat's): so, in the statements that follow it.
_AUDIT_WRITTEN = "EXISTS (SELECT 1 FROM audits WHERE tenant = ? AND chat_id = ? AND generation_id = ?)"
_INSERT_SEGMENT = (
    "INSERT INTO audit_segments (tenant, chat_id, segment_hash, data) SELECT ?, ?, ?, ? "
    f"WHERE {_AUDIT_WRITTEN} ON CONFLICT DO NOTHING"
)
_DELETE_SEGMENTS = f"DELETE FROM audit_segments WHERE tenant = ? AND chat_id = ? AND segment_hash = ANY(?) AND {_AUDIT_WRITTEN}"


# Reads that join tables are never prepared. A prepared statement's plan is made once, for the
# tables as they were: made while a new store was nearly empty, the plan of a chat's audit joined
# to its generation read every generation, slower with each call (a tenth of the calls/s within a
# minute, until autovacuum's ANALYZE replaced it). Planned each time, a join follows the tables; a
# statement on one table goes by its key and keeps its plan (planning every statement cost a sixth
# of the calls/s once the plans were good).
_JOINS = re.compile(r"\bJOIN\b")


@functools.lru_cache(maxsize=256)
def _prepare(statement: str) -> bool | None:
    """psycopg's `prepare` for `statement`: never for a join (`_JOINS`), else its default."""
    return False if _JOINS.search(statement) else None


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
    """The database found down: since when, why, and when a connection attempt may start again."""

    pid: int  # the process that found it (a forked child finds its own)
    since: float
    error: str
    retry_at: float = 0.0
    attempts: int = 0  # connection attempts under way

    def unavailable(self) -> StoreUnavailable:
        return StoreUnavailable(
            f"{self.error} (down for {time.monotonic() - self.since:.1f} s; "
            f"a new connection is tried every {RETRY_SECONDS:g} s)"
        )


class _Attempt:
    """One try at opening the pool, on a thread of its own (`PostgresStore._attempt`)."""

    def __init__(self, pid: int, epoch: int) -> None:
        self.pid = pid
        self.epoch = epoch  # the store's `close` count when it started: a later close discards it
        self.done = threading.Event()
        self.error: StoreUnavailable | None = None


class _Watched:
    """The watch on a call's current connection (`PostgresStore._watched`), to tell afterwards
    whether its deadline broke it."""

    watch: bounds.Watch | None = None

    @property
    def fired(self) -> bool:
        return self.watch is not None and self.watch.fired


def _tcp_settings(url: str) -> dict[str, str]:
    """`TCP_SETTINGS` but those the URL sets itself."""
    given = conninfo_to_dict(url)
    return {key: value for key, value in TCP_SETTINGS.items() if key not in given}


def _numbered(statement: str) -> str:
    """`?` placeholders as PostgreSQL's own `$1`, `$2`... (no statement here contains `?` otherwise)."""
    pieces = statement.split("?")
    return pieces[0] + "".join(f"${at}{piece}" for at, piece in enumerate(pieces[1:], start=1))


def _core_conninfo(conninfo: str) -> str | None:
    """The store's connection parameters as the core's writer reads them (`_CORE_PARAMETERS`), with
    libpq's environment where they are silent; None when it cannot connect as libpq would (a
    parameter it does not know, TLS required, no host or user)."""
    given = conninfo_to_dict(conninfo)
    for name, variable in _CORE_ENVIRONMENT.items():
        if name not in given and variable in os.environ:
            given[name] = os.environ[variable]
    if any(name not in _CORE_PARAMETERS for name in given) or "host" not in given or "user" not in given:
        return None
    if given.get("sslmode", "prefer") not in _CORE_SSLMODES:
        return None
    if "tcp_user_timeout" in given:
        given["tcp_user_timeout"] = str(math.ceil(int(str(given["tcp_user_timeout"])) / 1000))
    return " ".join(f"{_CORE_PARAMETERS[name]}={_quoted(str(value))}" for name, value in given.items())


def _quoted(value: str) -> str:
    """A `key=value` connection string's value, quoted as libpq (and tokio-postgres) read it."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


class _Tx:
    def __init__(self, connection: psycopg.Connection[Row], claim: Callable[[_Tx, int], None]) -> None:
        self.connection = connection
        self._claim = claim
        self.used: int | None = None  # the store's data as the first claim read it
        self.claimed = 0  # bytes claimed since

    def rows(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        return self.connection.execute(_sql(sql), params, prepare=_prepare(sql)).fetchall()

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
        if keys:
            self.rows(LOCK_ALL, (list(keys),))

    def claim(self, nbytes: int) -> None:
        self._claim(self, nbytes)


Pool = ConnectionPool[psycopg.Connection[Row]]


class PostgresStore(SqlStore):
    dialect = "postgresql"
    blob_type = "BYTEA"
    table_exists = "SELECT COUNT(*) FROM pg_tables WHERE schemaname = current_schema() AND tablename = ?"

    def __init__(
        self,
        url: str,
        *,
        pool_size: int = 4,
        timeout: float = 10.0,
        max_bytes: int | None = None,
        store_timeout: float | None = None,
    ) -> None:
        self._url = url
        self._pool_size = pool_size
        self._timeout = timeout  # waiting for a pooled connection, without a bound
        self._max_bytes = max_bytes
        self._bound = store_timeout
        # The URL with the TCP settings it does not set itself (what every connection connects with).
        self._conninfo = make_conninfo(url, **_tcp_settings(url))
        self._lock = threading.Lock()
        self._pool: tuple[int, Pool] | None = None
        self._outage: _Outage | None = None
        self._opening: _Attempt | None = None  # the first attempt of a process, every call waits on
        self._in_use: dict[bounds.Watch, Pool] = {}  # the watches of the connections calls hold
        self._epoch = 0  # calls of `close`

    @property
    def description(self) -> str:
        return f"postgresql {redacted(self._url)}"

    def _connections(self, limit: bounds.Deadline | None) -> Pool:
        """This process's pool: opened on first use (every call waits for it within its bound),
        and again after the database was found down, by an attempt a call starts every
        `RETRY_SECONDS` and waits for within its bound (the others fail at once meanwhile)."""
        while True:
            with self._lock:
                pid = os.getpid()
                if self._pool is not None and self._pool[0] == pid:
                    return self._pool[1]
                outage = self._outage if self._outage is not None and self._outage.pid == pid else None
                if outage is None:
                    attempt = self._opening
                    if attempt is None or attempt.pid != pid:
                        attempt = self._opening = self._attempt(None, CONNECT_TIMEOUT_SECONDS)
                else:
                    now = time.monotonic()
                    if now < outage.retry_at or outage.attempts >= MAX_ATTEMPTS:
                        raise outage.unavailable()
                    outage.retry_at = now + RETRY_SECONDS
                    attempt = self._attempt(outage, RETRY_CONNECT_TIMEOUT_SECONDS)
            if not attempt.done.wait(None if limit is None else max(limit.remaining(), 0.0)):
                assert limit is not None
                error = limit.timed_out(self.description, "could not connect")
                if limit.own:
                    with self._lock:  # the first connection does not answer: down (see `_attempt`)
                        if self._pool is None and self._outage is None:
                            self._outage = self._found_down(str(error))
                raise error
            if attempt.error is not None:
                raise attempt.error

    def _attempt(self, outage: _Outage | None, connect_timeout: int) -> _Attempt:
        """Starts opening a pool on a thread of its own (called holding the lock): installed when
        it opens (the store is back), unless the store was closed or a pool opened meanwhile."""
        attempt = _Attempt(os.getpid(), self._epoch)
        if outage is not None:
            outage.attempts += 1

        def run() -> None:
            pool: Pool | None = None
            try:
                pool = self._open(connect_timeout)
            except StoreUnavailable as e:
                attempt.error = e
            back: _Outage | None = None
            with self._lock:
                if outage is not None:
                    outage.attempts -= 1
                if self._opening is attempt:
                    self._opening = None
                current = self._epoch == attempt.epoch and os.getpid() == attempt.pid
                if attempt.error is not None:
                    if current and self._pool is None and self._outage is None:
                        self._outage = self._found_down(str(attempt.error))
                    elif current and self._outage is not None:
                        self._outage.error = str(attempt.error)
                elif current and self._pool is None:
                    self._pool, back, self._outage = (attempt.pid, cast(Pool, pool)), self._outage, None
                    pool = None
            if pool is not None:  # not needed: closed meanwhile, or another attempt opened one
                pool.close()
            if back is not None:
                log.warning(
                    "the store is back",
                    extra={
                        "fields": {
                            "store": self.description,
                            "down_seconds": round(time.monotonic() - back.since, 3),
                        }
                    },
                )
            attempt.done.set()

        threading.Thread(target=run, name="contextshift-store-connect", daemon=True).start()
        return attempt

    def _open(self, connect_timeout: int) -> Pool:
        try:
            # A direct connection first: its error says why (refused, authentication, no such
            # database), where a pool that cannot connect only times out.
            psycopg.connect(self._conninfo, connect_timeout=connect_timeout).close()
            pool: Pool = ConnectionPool(
                self._conninfo,
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
        """The database is down (a connection broke, and a new one cannot be made; or it does not
        answer within the bound): its pool is closed, and calls fail at once until a connection
        attempt succeeds."""
        with self._lock:
            if self._pool is None or self._pool[1] is not pool:
                return  # another call found it first
            self._pool, self._outage = None, self._found_down(error)
            in_use = [watch for watch, of in self._in_use.items() if of is pool]
        # The calls on its other connections are broken now rather than at their own deadlines:
        # on a silent network they wait on it too (a /metrics read, the housekeeping, with longer
        # bounds than a call's), and on a lost database their connections are gone already.
        for watch in in_use:
            watch.fire(f"the store is down: {error}")
        # Closed on a thread of its own: its workers' connection attempts (a connect timeout, on a
        # silent network) end on their own, and are waited for there.
        threading.Thread(target=pool.close, name="contextshift-store-close", daemon=True).start()

    def _found_down(self, error: str) -> _Outage:
        log.warning("the store is down", extra={"fields": {"store": self.description, "error": error}})
        now = time.monotonic()
        return _Outage(os.getpid(), now, error, now + RETRY_SECONDS)

    def _reachable(self, limit: bounds.Deadline | None) -> str | None:
        """None when a new connection can be made now (within the call's bound), else why not."""

        def connect() -> psycopg.Connection[Row]:
            return psycopg.connect(self._conninfo, connect_timeout=RETRY_CONNECT_TIMEOUT_SECONDS)

        try:
            bounds.run_bounded(
                connect, limit, self.description, "could not connect", late=lambda c: c.close()
            ).close()
        except StoreTimeout as e:
            return str(e)
        except psycopg.Error as e:
            return f"cannot connect to PostgreSQL at {redacted(self._url)}: {e}"
        return None

    def ping(self) -> None:
        self._query("SELECT 1", ())

    def core_groups(self) -> CoreGroups | None:
        """Group commits outside Python for this process, over a connection of the core's own
        (`rust_ext/core/src/postgres_group.rs`); None with `max_store_bytes` (whose room only this
        module's claims count), or connection parameters the core cannot read (`_core_conninfo`)."""
        conninfo = _core_conninfo(self._conninfo)
        if self._max_bytes is not None or conninfo is None:
            return None
        statements = cast(tuple[str, str, str, str, str], tuple(map(_numbered, GROUP_STATEMENTS)))
        try:
            writer = engine.PostgresGroupWriter(
                conninfo, statements, _numbered(LOCK_ALL), _numbered(AUDIT), self._bound
            )
        except ValueError as e:
            log.warning(
                "the store's writes stay in Python",
                extra={"fields": {"store": self.description, "why": str(e)}},
            )
            return None
        return PostgresCoreGroups(self, writer)

    def _run(self, work: Callable[[Tx], T], *, write: bool) -> T:
        return self._on_connection(work, transaction=True)

    def _query(self, sql: str, params: Sequence[Any]) -> list[Row]:
        return self._on_connection(lambda tx: tx.rows(sql, params), transaction=False)

    def _on_connection(self, work: Callable[[Tx], T], *, transaction: bool, pipeline: bool = False) -> T:
        """`work` on a pooled connection, in a transaction or (one statement) in autocommit, in
        pipeline mode if asked (statements go out as they come, and wait for their results only
        when one is read or the pipeline synced); retried when it loses a deadlock or a
        serialization conflict; ended by the call's deadline (see the module's doc)."""
        limit = bounds.deadline(self._bound)
        pool = self._connections(limit)
        for attempt in range(RETRIES):
            watched = _Watched()
            try:
                with self._live_connection(pool, limit, watched) as connection:
                    tx = _Tx(connection, self._claim)
                    try:
                        if not transaction:
                            return work(tx)
                        with connection.pipeline() if pipeline else nullcontext(), connection.transaction():
                            return work(tx)
                    except psycopg.OperationalError:
                        if connection.broken and not watched.fired:  # the database may be gone
                            why = self._reachable(limit)
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
                if watched.watch is not None and watched.watch.why is not None:  # see `_down`
                    raise StoreUnavailable(watched.watch.why) from e
                if limit is not None and (watched.fired or isinstance(e, PoolTimeout)):
                    error = limit.timed_out(self.description)
                    if watched.fired and limit.own:  # no answer within the bound: down
                        self._down(pool, str(error))
                    raise error from e
                raise StoreUnavailable(f"PostgreSQL store at {redacted(self._url)}: {e}") from e
        raise AssertionError("not reached")

    @contextmanager
    def _live_connection(
        self, pool: Pool, limit: bounds.Deadline | None, watched: _Watched
    ) -> Iterator[psycopg.Connection[Row]]:
        """A pooled connection the server has not closed, watched until the call's deadline (see
        `_watched`): after a database restart every pooled connection is dead, and each would fail
        one call. A dead one is closed (the pool replaces it) and the next taken, once a new
        connection proved the database is there (else it is down: StoreUnavailable at once). Not
        the pool's `check` callback: each failed check there sleeps a growing backoff (1 s, 2 s,
        4 s...), so a pool of stale connections could time out."""
        reachable = False
        for left in reversed(range(self._pool_size + 1)):
            wait = None if limit is None else max(limit.remaining(), 0.0)
            with pool.connection(wait) as connection, self._watched(pool, connection, limit, watched):
                if left and _closed_by_server(connection):
                    connection.close()
                    why = None if reachable else self._reachable(limit)
                    if why is not None:
                        self._down(pool, why)
                        raise StoreUnavailable(why)
                    reachable = True
                    continue
                yield connection
                return

    @contextmanager
    def _watched(
        self,
        pool: Pool,
        connection: psycopg.Connection[Row],
        limit: bounds.Deadline | None,
        watched: _Watched,
    ) -> Iterator[None]:
        """Shuts the connection's socket down at the call's deadline (the process's watchdog), or
        when the store is found down meanwhile (`_down`), and closes a connection so broken before
        it goes back: the pool discards a closed one, where one whose socket was shut behind
        libpq's back would look healthy to it."""
        try:
            breaker = bounds.SocketBreaker(connection.fileno())
        except psycopg.Error:  # closed already: nothing to break (`_closed_by_server` discards it)
            yield
            return
        # Without a deadline, only `_down` fires it.
        watch = bounds.watch(limit.at, breaker) if limit is not None else bounds.Watch(math.inf, breaker)
        watched.watch = watch
        with self._lock:
            self._in_use[watch] = pool
        try:
            yield
        finally:
            with self._lock:
                del self._in_use[watch]
            if not watch.cancel():
                connection.close()
            breaker.close()

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
                (
                    *generation_params(r.tenant, r.generation),
                    r.tenant,
                    r.generation.chat_id,
                    r.audit,
                    *audit_params(r),
                ),
            )
            for r in records
        ]
        for r in records:
            key, written_as = (
                (r.tenant, r.generation.chat_id),
                (r.tenant, r.generation.chat_id, r.generation.generation_id),
            )
            for segment in r.new_segments:
                connection.execute(_sql(_INSERT_SEGMENT), (*key, *segment, *written_as))
            gone = gone_segments(tx, r) if r.audit is not None else ()
            if gone:
                connection.execute(_sql(_DELETE_SEGMENTS), (*key, list(gone), *written_as))
        with connection.pipeline() as pipeline:  # the group's own (see `_run_group`)
            pipeline.sync()
        return [cursor.rowcount > 0 for cursor in written]

    def close(self) -> None:
        with self._lock:
            pool, self._pool, self._outage, self._opening = self._pool, None, None, None
            self._epoch += 1  # a connection attempt under way discards what it opens
        if pool is not None and pool[0] == os.getpid():
            pool[1].close()


class PostgresCoreGroups(SqlCoreGroups):
    """A PostgreSQL store's group commits run by the core (`PostgresStore.core_groups`). What the
    core cannot say better than the store's own path, it declines: the store's path writes it
    (see `rust_ext/core/src/postgres_group.rs`)."""

    def __init__(self, store: PostgresStore, writer: engine.PostgresGroupWriter) -> None:
        super().__init__(store, writer)
        self._store: PostgresStore = store
        self._reader = writer

    def submit_read(self, token: int, tenant: str, chat_id: str) -> bool:
        return self._reader.submit_read(token, (tenant, chat_id))

    def _failure(self, error: Exception) -> CoreOutcome:
        if isinstance(error, TimeoutError):
            bound = self._store._bound
            return bounds.Deadline(0.0, bound, True).timed_out(self._store.description)
        if isinstance(error, ConnectionError):
            return StoreUnavailable(f"PostgreSQL store at {redacted(self._store._url)}: {error}")
        return error
