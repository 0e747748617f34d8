"""Every store call bounded (`contextshift.audit.bounds`), in process: the watchdog, the caller's
deadline carried to the threads that run store calls, SQLite's statements interrupted and its
busy timeout within the bound, PostgreSQL's statements ended by shutting their connection's socket
(the connection never handed out again), the store found down only when its own bound passed, and
the TCP settings of every PostgreSQL connection. A network gone silent, with a real server and
Toxiproxy: tests/integration/test_store_silence.py."""

from __future__ import annotations

import socket
import sqlite3
import threading
import time
from pathlib import Path

import pytest
from postgres_cluster import Cluster

from contextshift.audit import bounds, open_store
from contextshift.audit.postgres import TCP_SETTINGS, PostgresStore
from contextshift.audit.sqlite import SqliteStore
from contextshift.audit.store import Generation, StoreTimeout, StoreUnavailable

# A statement that runs for seconds in either database.
SQLITE_SPIN = (
    "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 1000000000) "
    "SELECT COUNT(*) FROM c"
)
LATE = 0.5  # what the tests allow past a deadline: the watchdog's slack and a loaded machine


def generation(generation_id: str, chat_id: str) -> Generation:
    return Generation(generation_id, chat_id, "", 10, False, int(time.time() * 1000))


def timed(fn: object) -> tuple[float, BaseException | None]:
    start = time.monotonic()
    try:
        fn()  # type: ignore[operator]
    except BaseException as e:
        return time.monotonic() - start, e
    return time.monotonic() - start, None


def test_the_watchdog_fires_at_the_deadline_unless_cancelled() -> None:
    fired: list[float] = []
    start = time.monotonic()
    kept = bounds.watch(start + 0.2, lambda: fired.append(time.monotonic() - start))
    cancelled = bounds.watch(start + 0.1, lambda: fired.append(-1.0))
    assert cancelled.cancel()
    deadline = time.monotonic() + 5
    while not fired and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(fired) == 1 and 0.2 <= fired[0] < 0.2 + LATE
    assert kept.fired and not kept.cancel()  # too late to cancel: what it watched is broken


def test_a_caller_deadline_reaches_the_threads_of_a_context_executor() -> None:
    with bounds.ContextExecutor(2) as executor:
        with bounds.caller_deadline(time.monotonic() + 0.3):
            limit = executor.submit(bounds.deadline, 10.0).result()
            assert limit is not None and not limit.own and limit.remaining() < 0.3
            with bounds.own_bound(None):  # no bound of the store's: the caller's still applies
                assert executor.submit(bounds.deadline, 10.0).result() is not None
        limit = executor.submit(bounds.deadline, 10.0).result()
        assert limit is not None and limit.own and 9 < limit.remaining() <= 10
        assert executor.submit(bounds.deadline, None).result() is None
        assert executor.submit(bounds.with_bound, None, bounds.deadline, 10.0).result() is None


def test_shutting_a_socket_down_wakes_a_thread_blocked_reading_it() -> None:
    left, right = socket.socketpair()
    with left, right:
        breaker = bounds.SocketBreaker(left.fileno())
        woke: list[bytes] = []
        reader = threading.Thread(target=lambda: woke.append(left.recv(10)))
        reader.start()
        time.sleep(0.1)
        breaker()
        reader.join(5)
        breaker.close()
        assert woke == [b""]  # the end of the stream, at once


# --- SQLite ----------------------------------------------------------------------------------------


def test_sqlite_a_statement_past_the_bound_is_interrupted(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "store.db", store_timeout=0.3)
    store.migrate()
    try:
        took, error = timed(lambda: store._query(SQLITE_SPIN, ()))
        assert isinstance(error, StoreTimeout) and "store_timeout_ms (300 ms)" in str(error)
        assert 0.3 <= took < 0.3 + LATE
        # The connection serves the next call at once, and a write goes through whole.
        store.record_shift("", generation("g1", "c1"), b"audit")
        stored = store.audit("", "c1")
        assert stored is not None and stored.payload == b"audit"
    finally:
        store.close()


def test_sqlite_a_write_waits_for_the_lock_no_longer_than_the_bound(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "store.db", busy_timeout_ms=60_000, store_timeout=0.3)
    store.migrate()
    holder = sqlite3.connect(tmp_path / "store.db", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        took, error = timed(lambda: store.record_shift("", generation("g1", "c1"), b"audit"))
        assert isinstance(error, StoreUnavailable) and took < 0.3 + LATE
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert store.audit("", "c1") is None  # nothing of it written
    store.close()


def test_sqlite_the_group_writers_transaction_goes_whole(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "store.db", store_timeout=0.3)
    store.migrate()
    try:
        # Interrupted inside the transaction, after a write.
        def work(tx: object) -> None:
            tx.run(  # type: ignore[attr-defined]
                "INSERT INTO generations (tenant, generation_id, chat_id, model, prompt_tokens, approximate, "
                "created_ms, status) VALUES ('', 'g1', 'c1', '', 1, 0, 0, 'PENDING')"
            )
            tx.rows(SQLITE_SPIN)  # type: ignore[attr-defined]

        _, error = timed(lambda: store._run(work, write=True))
        assert isinstance(error, StoreTimeout)
        assert store._query("SELECT COUNT(*) FROM generations", ()) == [(0,)]
    finally:
        store.close()


# --- PostgreSQL ------------------------------------------------------------------------------------


@pytest.fixture
def pg_url(postgres: Cluster) -> str:
    url = postgres.new_database()
    store = open_store(url)
    store.migrate()
    store.close()
    return url


def test_postgresql_every_connection_has_keepalives_and_a_tcp_user_timeout(pg_url: str) -> None:
    store = PostgresStore(pg_url, store_timeout=2.0)
    try:
        store.ping()
        pool = store._connections(None)
        with pool.connection() as connection:
            sock = socket.socket(fileno=connection.fileno())
            try:
                assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == int(
                    TCP_SETTINGS["keepalives_idle"]
                )
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == int(
                    TCP_SETTINGS["keepalives_count"]
                )
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == int(
                    TCP_SETTINGS["tcp_user_timeout"]
                )
            finally:
                sock.detach()
    finally:
        store.close()
    # What the URL sets is its own.
    given = PostgresStore(pg_url + "?tcp_user_timeout=1234&keepalives_idle=7")
    assert "tcp_user_timeout=1234" in given._conninfo and "keepalives_idle=7" in given._conninfo
    assert f"keepalives_count={TCP_SETTINGS['keepalives_count']}" in given._conninfo


def test_postgresql_a_call_past_the_bound_ends_and_its_connection_is_never_handed_out(pg_url: str) -> None:
    store = PostgresStore(pg_url, pool_size=2, store_timeout=0.4)
    try:
        store.record_shift("", generation("g1", "c1"), b"audit-1")
        took, error = timed(lambda: store._query("SELECT pg_sleep(30)", ()))
        assert isinstance(error, StoreTimeout) and "store_timeout_ms (400 ms)" in str(error)
        assert 0.4 <= took < 0.4 + LATE
        # Its own bound passed: the store is down until a new connection answers, which the next
        # call (or the readiness probe) tries within its bound; then every call is served, more
        # than the pool holds (none gets the broken connection).
        deadline = time.monotonic() + 5
        while True:
            try:
                store.ping()
                break
            except StoreUnavailable:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        for _ in range(6):
            stored = store.audit("", "c1")
            assert stored is not None and stored.payload == b"audit-1"
    finally:
        store.close()


def test_postgresql_a_callers_sooner_deadline_ends_the_call_without_taking_the_store_down(
    pg_url: str,
) -> None:
    store = PostgresStore(pg_url, pool_size=2, store_timeout=5.0)
    try:
        store.ping()
        with bounds.caller_deadline(time.monotonic() + 0.3):
            took, error = timed(lambda: store._query("SELECT pg_sleep(30)", ()))
        assert isinstance(error, StoreTimeout) and "the call's deadline" in str(error)
        assert took < 0.3 + LATE
        took, error = timed(store.ping)  # served at once: the store was never found down
        assert error is None and took < 0.5
    finally:
        store.close()


def test_postgresql_the_group_writers_transaction_past_the_bound_commits_nothing(pg_url: str) -> None:
    store = PostgresStore(pg_url, store_timeout=0.4)
    try:
        records = [generation(f"g{i}", f"c{i}") for i in range(5)]

        def work(tx: object) -> None:
            for g in records:
                tx.run(  # type: ignore[attr-defined]
                    "INSERT INTO generations (tenant, generation_id, chat_id, model, prompt_tokens, "
                    "approximate, created_ms, status) VALUES ('', ?, ?, '', 1, false, 0, 'PENDING')",
                    (g.generation_id, g.chat_id),
                )
            tx.rows("SELECT pg_sleep(3)")  # type: ignore[attr-defined]

        _, error = timed(lambda: store._run_group(work))
        assert isinstance(error, StoreTimeout)
    finally:
        store.close()
    check = open_store(pg_url)
    try:
        assert check.problems() == []
        assert all(check.audit("", g.chat_id) is None for g in records)
        assert check._query("SELECT COUNT(*) FROM generations", ()) == [(0,)]  # type: ignore[attr-defined]
    finally:
        check.close()


def test_postgresql_found_down_ends_the_calls_on_its_other_connections_at_once(pg_url: str) -> None:
    """A /metrics read or the housekeeping has a longer bound than a call: when a call finds the
    database not answering, theirs are broken then, not at their own deadlines."""
    store = PostgresStore(pg_url, pool_size=2, store_timeout=0.4)
    try:
        store.ping()
        outcome: list[tuple[float, BaseException | None]] = []
        long = threading.Thread(
            target=lambda: outcome.append(
                timed(lambda: bounds.with_bound(30.0, store._query, "SELECT pg_sleep(30)", ()))
            )
        )
        long.start()
        time.sleep(0.1)
        _, error = timed(lambda: store._query("SELECT pg_sleep(30)", ()))
        assert isinstance(error, StoreTimeout)
        long.join(5)
        ((took, error),) = outcome
        assert isinstance(error, StoreUnavailable) and not isinstance(error, StoreTimeout)
        assert str(error).startswith("the store is down: ") and took < 0.4 + LATE
    finally:
        store.close()
