"""The PostgreSQL store's group commits outside Python (`PostgresStore.core_groups`, the core's
`postgres_group`): the common group written as the store's own path writes it, everything that path
must decide declined to it, a database that does not answer within the bound failing the group and
the groups behind it at once, a restarted database found again. Over a real PostgreSQL, with the
core's real thread, connection and socket."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import replace

import psycopg
import pytest
from postgres_cluster import Cluster
from test_core_groups import committed, told, turns
from test_store import generation

from contextshift.audit.postgres import LOCK_ALL, PostgresStore, _core_conninfo, _numbered
from contextshift.audit.sql import chat_key
from contextshift.audit.store import (
    DECLINED,
    UNCHECKED,
    AuditChanged,
    CoreGroups,
    ShiftRecord,
    StoreTimeout,
    StoreUnavailable,
)
from contextshift.audit.writer import GroupWriter, WriteOutcome

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


def core_groups(store: PostgresStore) -> CoreGroups:
    groups = store.core_groups()
    assert groups is not None
    return groups


def tables(url: str) -> list[list[tuple[object, ...]]]:
    with psycopg.connect(url) as connection:
        return [
            connection.execute(f"SELECT * FROM {table} ORDER BY 1, 2").fetchall()
            for table in ("generations", "audits", "audit_segments")
        ]


def test_the_core_writes_a_group_as_the_stores_own_path_does(
    postgres: Cluster, pg_store: PostgresStore
) -> None:
    records = turns("a", 3) + turns("b", 2)
    chatless = ShiftRecord("t", generation("no-chat", chat_id=""), None)
    groups = core_groups(pg_store)
    assert committed(groups, records[:2]) == [None, None]
    assert committed(groups, [*records[2:], chatless]) == [None] * 4
    groups.stop()
    own_url = postgres.new_database()
    own = opened(own_url)
    assert own.record_shifts(records[:2]) == [None, None]
    assert own.record_shifts([*records[2:], chatless]) == [None] * 4
    own.close()
    assert tables(pg_store._url) == tables(own_url)


def test_the_core_declines_what_the_stores_own_path_must_decide(pg_store: PostgresStore) -> None:
    groups = core_groups(pg_store)
    first, second = turns("a", 2)
    assert committed(groups, [first]) == [None]
    # Made against no audit, while the chat has one.
    stale = replace(second, made_on=None)
    assert committed(groups, [stale]) == [DECLINED]
    # A generation id another chat uses.
    taken = replace(
        turns("c", 1)[0], generation=replace(second.generation, generation_id="a-g0", chat_id="c")
    )
    assert committed(groups, [taken]) == [DECLINED]
    assert pg_store.audit("t", "c") is None
    # A statement the database refuses (a generation without its model: NOT NULL): rolled back,
    # and the same connection writes the next group.
    refused = replace(turns("f", 1)[0], generation=replace(generation("f-g0", "f"), model=None))  # type: ignore[arg-type]
    assert committed(groups, [refused]) == [DECLINED]
    assert pg_store.audit("t", "f") is None
    assert committed(groups, [second]) == [None]
    # Not taken at all: an audit not checked against its chat's.
    assert not groups.submit(99, replace(second, made_on=UNCHECKED))
    # Written by the store's own path, which says why.
    (changed,) = pg_store.record_shifts([stale])
    assert isinstance(changed, AuditChanged)
    groups.stop()


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


def test_records_written_on_the_event_loop_are_committed_by_the_core(pg_store: PostgresStore) -> None:
    writer = GroupWriter(pg_store)
    outcomes: dict[str, WriteOutcome] = {}

    async def scenario() -> None:
        for record in turns("a", 1) + turns("b", 2):
            writer.write(lambda record=record: record, told(outcomes, record.generation.generation_id))
        while len(outcomes) < 3:
            await asyncio.sleep(0.01)
        assert writer._thread is None  # the Python writer thread never started
        stale = replace(turns("a", 2)[1], made_on=None)  # declined by the core: the thread says why
        writer.write(lambda: stale, told(outcomes, "stale"))
        while len(outcomes) < 4:
            await asyncio.sleep(0.01)

    asyncio.run(scenario())
    assert outcomes.pop("stale").__class__ is AuditChanged
    assert outcomes == {"a-g0": None, "b-g0": None, "b-g1": None}
    writer.close()


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
