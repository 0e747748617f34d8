"""What is PostgreSQL's alone in its group commits outside Python (`PostgresStore.core_groups`, the
core's `postgres_group`; what both stores share: test_core_groups.py): an error of the database
declined to the store's own path, a database that does not answer within the bound failing the
group and the groups behind it at once, a restarted database found again, a refused connection told
to the log once, the connection's parameters read as libpq reads them. Over a real PostgreSQL,
with the core's real thread, connection and socket."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace

import psycopg
import pytest
from postgres_cluster import Cluster
from test_core_groups import committed, core_groups, outcomes_of, turns

from contextshift.audit import postgres as postgres_module
from contextshift.audit.postgres import LOCK_ALL, PostgresStore, _core_conninfo, _numbered
from contextshift.audit.sql import chat_key
from contextshift.audit.store import (
    DECLINED,
    AuditRead,
    StoreTimeout,
    StoreUnavailable,
)

RETRY = 0.25  # postgres_group::RETRY


@pytest.fixture
def pg_url(postgres: Cluster) -> str:
    return postgres.new_database()


def opened(url: str, **options: float) -> PostgresStore:
    store = PostgresStore(url, **options)  # type: ignore[arg-type]
    store.migrate()
    return store


@pytest.fixture
def pg_store(pg_url: str) -> Iterator[PostgresStore]:
    store = opened(pg_url)
    yield store
    store.close()


def test_an_error_of_the_database_declines_the_group_and_the_connection_writes_on(
    pg_store: PostgresStore,
) -> None:
    """The transaction rolled back (the store's own path then retries it, or says which record
    failed); the same connection writes the next group."""
    groups = core_groups(pg_store)
    first, second = turns("a", 2)
    refused = replace(first, generation=replace(first.generation, model=None))  # type: ignore[arg-type]
    assert committed(groups, [refused]) == [DECLINED]  # NOT NULL violated
    assert pg_store.audit("t", "a") is None
    assert committed(groups, [first, second]) == [None, None]
    groups.stop()


def test_the_core_reads_a_chats_audit_as_the_store_does(pg_store: PostgresStore) -> None:
    groups = core_groups(pg_store)
    assert committed(groups, turns("a", 2)) == [None, None]
    for token, chat_id in enumerate(["a", "none"]):
        assert groups.submit_read(token, "t", chat_id)
    read = outcomes_of(groups, 2)
    assert read == {0: AuditRead(pg_store.audit("t", "a")), 1: AuditRead(None)}
    groups.stop()
    assert not groups.submit_read(2, "t", "a")  # stopped


def test_a_database_that_does_not_answer_within_the_bound_fails_the_group_and_those_behind_it(
    pg_url: str,
) -> None:
    """A chat's lock held elsewhere: the group waits on it past the bound, nothing of it committed;
    the groups behind it fail at once (the database taken for down) until a new connection answers
    `RETRY` later."""
    store = opened(pg_url, store_timeout=0.4)
    groups = core_groups(store)
    holder = psycopg.connect(pg_url, autocommit=True)
    try:
        with holder.transaction():
            holder.execute(_numbered(LOCK_ALL).replace("$1", "%s"), ([chat_key("t", "a")],))
            started = time.monotonic()
            (outcome,) = committed(groups, turns("a", 1))
            took = time.monotonic() - started
            assert isinstance(outcome, StoreTimeout) and "400 ms" in str(outcome), outcome
            assert 0.4 <= took < 2.0
            (behind,) = committed(groups, turns("b", 1))
            assert isinstance(behind, StoreUnavailable) and "did not answer" in str(behind), behind
            assert groups.submit_read(7, "t", "a")  # so is a read
            (unread,) = outcomes_of(groups, 1).values()
            assert isinstance(unread, StoreUnavailable), unread
    finally:
        holder.close()
    assert store.audit("t", "a") is None and store.audit("t", "b") is None
    time.sleep(RETRY)
    assert committed(groups, turns("a", 1)) == [None]
    groups.stop()
    store.close()


def test_a_restarted_database_is_found_again(postgres: Cluster, pg_store: PostgresStore) -> None:
    groups = core_groups(pg_store)
    first, second, third = turns("a", 3)
    assert committed(groups, [first]) == [None]
    postgres.restart()
    # Its connection is gone: either seen before the group (a new one made) or on it (declined,
    # nothing committed: the store's own path writes it).
    (outcome,) = committed(groups, [second])
    if outcome is DECLINED:
        assert pg_store.record_shifts([second]) == [None]
    else:
        assert outcome is None
    time.sleep(RETRY)
    assert committed(groups, [third]) == [None]
    stored = pg_store.audit("t", "a")
    assert stored is not None and stored.generation.generation_id == "a-g2"
    groups.stop()


def test_a_refused_connection_is_logged_once_and_its_groups_go_to_the_store(
    postgres: Cluster,
    pg_store: PostgresStore,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A connection the store's own path makes but the core's is refused (as with a password only
    in ~/.pgpass, which the core does not read; here a role that does not exist yet): the core
    declines every group, says so once in the log, and says so again when it is let in."""
    role = f"core_{uuid.uuid4().hex[:8]}"
    made = postgres_module._core_conninfo
    monkeypatch.setattr(postgres_module, "_core_conninfo", lambda conninfo: f"{made(conninfo)} user={role}")
    groups = core_groups(pg_store)
    first, second, third = turns("a", 3)
    with caplog.at_level(logging.WARNING, logger="contextshift.store"):
        assert committed(groups, [first]) == [DECLINED]
        time.sleep(RETRY)
        assert committed(groups, [first]) == [DECLINED]  # tried again, refused again: not told again
        refused = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
        assert len(refused) == 1 and f'role "{role}" does not exist' in refused[0], refused
        assert pg_store.record_shifts([first]) == [None]  # the store's own path writes it
        with psycopg.connect(postgres.url(), autocommit=True) as admin:
            admin.execute(f'CREATE ROLE "{role}" LOGIN SUPERUSER')
        time.sleep(RETRY)
        assert committed(groups, [second, third]) == [None, None]
    assert any("is made" in r.getMessage() for r in caplog.records)
    stored = pg_store.audit("t", "a")
    assert stored is not None and stored.generation.generation_id == "a-g2"
    groups.stop()
    with psycopg.connect(postgres.url(), autocommit=True) as admin:
        admin.execute(f'DROP ROLE "{role}"')


def test_the_core_connects_as_libpq_would_or_not_at_all(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in ("PGHOST", "PGPORT", "PGUSER", "PGPASSWORD", "PGDATABASE"):
        monkeypatch.delenv(variable, raising=False)
    conninfo = _core_conninfo(r"host=db user=me password='it\'s' keepalives_count=3 tcp_user_timeout=10000")
    assert conninfo is not None
    expected = "host='db' user='me' password='it\\'s' keepalives_retries='3' tcp_user_timeout='10'"
    assert sorted(conninfo.split()) == sorted(expected.split())
    monkeypatch.setenv("PGPASSWORD", "secret")
    assert "password='secret'" in (_core_conninfo("postgresql://me@db/x") or "")
    # What tokio-postgres cannot do as libpq would: the store's own path writes everything.
    assert _core_conninfo("postgresql://me@db/x?sslmode=require") is None
    assert _core_conninfo("postgresql://me@db/x?sslrootcert=/ca.pem") is None
    assert _core_conninfo("dbname=x user=me") is None  # no host: libpq's socket directory
    assert PostgresStore("postgresql://me@db/x", max_bytes=1 << 30).core_groups() is None
