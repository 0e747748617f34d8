"""The store under pressure, on both backends where both apply: a store at its limit refuses new
data whole and still reports, reads and deletes (and a deletion makes room); what it holds, as
the gauges read it; idle chats for the retention, and deletions that spare a chat used meanwhile;
the schema's second migration over a store that had history before it; SQLite's own refusal past
the room a write claimed (a real SQLITE_FULL), its disk reserve and the WAL folded back when the
disk runs short; a PostgreSQL server stopped and started under a store that keeps its pool."""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from postgres_cluster import running_cluster
from test_store import BACKENDS, generation, group_transactions, store_url, threads

from contextshift.audit import migrations, open_store, sql
from contextshift.audit.sqlite import HEADROOM_PAGES, UNLIMITED_PAGES, SqliteStore
from contextshift.audit.store import (
    FullCause,
    Generation,
    GenerationReport,
    ShiftRecord,
    Status,
    Store,
    StoreFull,
    StoreUnavailable,
    now_ms,
)
from contextshift.calibration import ALPHA
from contextshift.history import HistoryBlock

AUDIT_BYTES = 20_000  # about one audit of a 48 KiB chat (17 KiB, LZ4)
DAY_MS = 86_400_000


def audit_bytes(n: int = AUDIT_BYTES) -> bytes:
    return os.urandom(n)  # incompressible, as an LZ4 frame is


@pytest.fixture(params=BACKENDS)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return store_url(request.param, tmp_path, request)


@pytest.fixture
def limited(url: str) -> Iterator[Callable[[int], Store]]:
    """Opens the store at `url` with a `max_store_bytes` of its current data plus the given bytes
    (the schema's own pages count in SQLite)."""
    opened: list[Store] = []

    def open_with_room(room: int) -> Store:
        unlimited = open_store(url)
        unlimited.migrate()
        base = unlimited.usage().data_bytes
        unlimited.close()
        store = open_store(url, max_bytes=base + room)
        opened.append(store)
        return store

    yield open_with_room
    for store in opened:
        assert store.problems() == []
        store.close()


def fill(store: Store, prefix: str = "c") -> int:
    """Audits new chats until the store refuses one; how many it took."""
    for n in range(10_000):
        try:
            store.record_shift("", generation(f"{prefix}{n}", chat_id=f"{prefix}{n}"), audit_bytes())
        except StoreFull as e:
            assert e.cause is FullCause.MAX_STORE_BYTES
            assert "is full" in str(e) and "max_store_bytes" in str(e) and store.description in str(e)
            assert "delete chats" in str(e)
            assert store.audit("", f"{prefix}{n}") is None  # nothing of the refused write
            return n
    raise AssertionError("the store never filled")


def test_a_full_store_refuses_new_data_whole_and_still_reads_reports_and_deletes(
    limited: Callable[[int], Store],
) -> None:
    store = limited(10 * AUDIT_BYTES)
    store.append_blocks("", "c0-history", "heuristic", lambda _: [HistoryBlock('{"n": 0}', 1)])
    audited = fill(store)
    assert 5 <= audited <= 10
    with pytest.raises(StoreFull):
        store.append_blocks(
            "", "c0-history", "heuristic", lambda _: [HistoryBlock('"' + "x" * AUDIT_BYTES + '"', 1)]
        )
    assert store.history("", "c0-history", "heuristic") == [HistoryBlock('{"n": 0}', 1)]
    # What a full store still does: reads, reports, configurations, and deletions.
    stored = store.audit("", "c0")
    assert stored is not None and len(stored.payload) == AUDIT_BYTES
    assert store.finish(
        "", GenerationReport("c0", Status.COMPLETED, reported_prompt_tokens=150), ALPHA
    ).calibration_recorded
    assert store.delete_chat("", "c1")
    # The deletion made room for one more audit of the same size, and no more.
    store.record_shift("", generation("after", chat_id="after"), audit_bytes())
    assert fill(store, "more") == 0


def test_a_group_on_a_full_store_refuses_only_the_records_that_do_not_fit(
    limited: Callable[[int], Store],
) -> None:
    store = limited(2 * AUDIT_BYTES + AUDIT_BYTES // 2)
    sizes = [AUDIT_BYTES, AUDIT_BYTES, AUDIT_BYTES, AUDIT_BYTES // 4]
    records = [
        ShiftRecord("", generation(f"g{i}", chat_id=f"c{i}"), audit_bytes(size))
        for i, size in enumerate(sizes)
    ]
    outcomes = store.record_shifts(records)  # one transaction: the claims add up
    assert outcomes[0] is None and outcomes[1] is None and outcomes[3] is None
    refused = outcomes[2]
    assert isinstance(refused, StoreFull) and refused.cause is FullCause.MAX_STORE_BYTES
    assert [store.audit("", f"c{i}") is not None for i in range(4)] == [True, True, False, True]


def test_sqlite_a_group_sqlite_refuses_whole_is_stored_again_record_by_record(tmp_path: Path) -> None:
    """Records that claim what their data takes, while SQLite's pages for them take more (each
    audit's overflow pages and index entries): a group of them all passes its claims, then runs
    past the page limit SQLite holds near the store's limit (SQLITE_FULL, which rolls back the
    whole transaction). Then each record is stored alone: those that fit are, the rest refused."""
    path = tmp_path / "store.db"
    SqliteStore(path).migrate()
    payload = 4200  # one overflow page each, mostly empty
    count = 200
    store = SqliteStore(path, max_bytes=SqliteStore(path).usage().data_bytes + count * payload + 8192)
    tried = group_transactions(store)
    records = [
        ShiftRecord("", generation(f"g{i}", chat_id=f"c{i}"), audit_bytes(payload)) for i in range(count)
    ]
    outcomes = store.record_shifts(records)
    assert tried == [count] + [1] * count  # the group failed whole, then each alone
    stored = [i for i, outcome in enumerate(outcomes) if outcome is None]
    assert 0 < len(stored) < count
    for i, outcome in enumerate(outcomes):
        assert outcome is None or (
            isinstance(outcome, StoreFull) and outcome.cause is FullCause.MAX_STORE_BYTES
        )
        assert (store.audit("", f"c{i}") is not None) == (outcome is None)
    assert store.problems() == []
    store.close()


def test_usage_counts_the_data_and_the_chats(url: str) -> None:
    store = open_store(url)
    store.migrate()
    try:
        empty = store.usage()
        assert empty.chats == 0
        store.record_shift("", generation("g1", chat_id="a"), audit_bytes())
        store.append_blocks("", "b", "heuristic", lambda _: [HistoryBlock('"' + "y" * 998 + '"', 1)])
        store.append_blocks("", "a", "heuristic", lambda _: [HistoryBlock("{}", 1)])
        store.record_shift("", generation("g2", chat_id=""), None)  # no chat
        full = store.usage()
        assert full.chats == 2  # a (audit and history) and b (history)
        grown = full.data_bytes - empty.data_bytes
        if store.dialect == "postgresql":  # the bytes of payloads and blocks, exactly
            assert grown == AUDIT_BYTES + 1000 + 2
        else:  # the pages they take, the part of a row its table's leaf page holds left out
            assert AUDIT_BYTES - 4096 <= grown <= AUDIT_BYTES + 1000 + 16 * 4096
            assert full.disk_free_bytes is not None and full.disk_free_bytes > 0
        store.record_shift("", generation("g3", chat_id="a"), audit_bytes(AUDIT_BYTES // 2))  # replaced
        if store.dialect == "postgresql":
            assert store.usage().data_bytes - empty.data_bytes == AUDIT_BYTES // 2 + 1000 + 2
        assert store.delete_chat("", "a") and store.delete_chat("", "b")
        after = store.usage()
        assert (after.chats, after.data_bytes) == (0, empty.data_bytes)  # SQLite: freed pages not counted
        assert store.problems() == []
    finally:
        store.close()


def shifted(chat_id: str, created_ms: int, generation_id: str = "") -> Generation:
    return Generation(generation_id or f"g-{chat_id}-{created_ms}", chat_id, "m", 100, True, created_ms)


def test_idle_chats_are_those_neither_shifted_nor_appended_to_since(url: str) -> None:
    store = open_store(url)
    store.migrate()
    try:
        now, old = now_ms(), now_ms() - 10 * DAY_MS
        store.record_shift("", shifted("old", old), b"audit")
        store.record_shift("", shifted("recent", now), b"audit")
        store.record_shift("", shifted("old-then-appended", old), b"audit")
        store.append_blocks("", "old-then-appended", "heuristic", lambda _: [HistoryBlock("{}", 1)])
        store.append_blocks("", "history-only", "heuristic", lambda _: [HistoryBlock("{}", 1)])
        store.record_shift("other", shifted("old", old), b"audit")  # another tenant's
        cutoff = now - DAY_MS
        assert sorted(store.idle_chats(cutoff, 100)) == [("", "old"), ("other", "old")]
        assert len(store.idle_chats(now_ms() + 1000, 100)) == 5  # everything is idle since the future
        assert len(store.idle_chats(now_ms() + 1000, 2)) == 2
        # A chat shifted after it was found idle is not deleted for it; an idle one is, whole.
        store.record_shift("other", shifted("old", now_ms()), b"audit again")
        assert not store.delete_chat("other", "old", idle_before_ms=cutoff)
        assert store.audit("other", "old") is not None
        assert not store.delete_chat("", "history-only", idle_before_ms=cutoff)
        assert store.delete_chat("", "old", idle_before_ms=cutoff)
        assert store.audit("", "old") is None and store.idle_chats(cutoff, 100) == []
        assert store.problems() == []
    finally:
        store.close()


def test_the_second_migration_keeps_the_histories_stored_before_it(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = migrations.MIGRATIONS[:1]
    monkeypatch.setattr(sql, "MIGRATIONS", first)
    monkeypatch.setattr(sql, "LATEST", 1)
    store = open_store(url)
    try:
        assert store.migrate() == 1 and store.schema_version() == 1
        store._run(  # type: ignore[attr-defined]  # history as the first schema stored it
            lambda tx: tx.run_many(
                "INSERT INTO chat_blocks (tenant, chat_id, position, block_json) VALUES (?, ?, ?, ?)",
                [("", "before", 0, '"' + "z" * 98 + '"'), ("", "before", 1, "{}")],
            ),
            write=True,
        )
        before = shifted("before", now_ms() - 30 * DAY_MS)

        def shift_as_the_first_schema_stored_it(tx: Any) -> None:
            tx.run(sql.RECORD_GENERATION, sql.generation_params("", before))
            tx.run(
                "INSERT INTO audits (tenant, chat_id, generation_id, payload) VALUES (?, ?, ?, ?)",
                ("", before.chat_id, before.generation_id, audit_bytes(500)),
            )

        store._run(shift_as_the_first_schema_stored_it, write=True)  # type: ignore[attr-defined]
        monkeypatch.undo()
        migrated_at = now_ms()
        assert store.migrate() == migrations.LATEST and store.schema_version() == migrations.LATEST
        assert store.problems() == []  # every stored history has its append time
        # Stored before: counted as appended to at the migration, so not idle since before it.
        assert store.idle_chats(migrated_at - DAY_MS, 10) == []
        assert store.usage().chats == 1
        if store.dialect == "postgresql":  # the counts start from what was there
            assert store.usage().data_bytes == 500 + 100 + 2
    finally:
        store.close()


# --- SQLite: the room, held by SQLite itself ---------------------------------------------------


def test_sqlite_a_write_past_the_room_it_claimed_fails_inside_sqlite(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    SqliteStore(path).migrate()
    store = SqliteStore(path, max_bytes=SqliteStore(path).usage().data_bytes + 50_000)

    def claims_little_writes_much(tx: Any) -> None:
        tx.claim(100)
        tx.run(
            "INSERT INTO chat_blocks (tenant, chat_id, position, block_json) VALUES ('', 'c', 0, ?)",
            ("x" * (50_000 + (HEADROOM_PAGES + 2) * 4096),),
        )

    with pytest.raises(StoreFull) as caught:
        store._run(claims_little_writes_much, write=True)
    assert caught.value.cause is FullCause.MAX_STORE_BYTES
    assert "SQLite: database or disk is full" in str(caught.value)  # SQLITE_FULL, from SQLite
    assert isinstance(caught.value.__cause__, sqlite3.OperationalError)
    assert store.history("", "c", "heuristic") == []  # rolled back whole
    # The limit lasts for the claiming write only: a deletion or a report is never held to it.
    _, connection = store._write_connection()
    assert connection.execute("PRAGMA max_page_count").fetchone()[0] == UNLIMITED_PAGES
    store.record_shift("", generation("g1"), audit_bytes(10_000))  # within the room: fine
    assert store.problems() == []
    store.close()


class Disk:
    """Free disk space as a test sets it, for a store's reserve (the real thing is mounted by hand:
    tests/full_disk_by_hand.py)."""

    def __init__(self, free: int) -> None:
        self.free = free

    def __call__(self, folder: Path) -> int:
        return self.free


def test_sqlite_keeps_its_disk_reserve_for_deletions_and_reports(tmp_path: Path) -> None:
    disk = Disk(10 * 2**20)
    store = SqliteStore(tmp_path / "store.db", reserve_bytes=2**20, disk_free=disk)
    store.migrate()
    store.record_shift("", generation("g1", chat_id="c1"), audit_bytes())
    disk.free = 2**20 + AUDIT_BYTES // 2  # less above the reserve than an audit
    with pytest.raises(StoreFull) as caught:
        store.record_shift("", generation("g2", chat_id="c2"), audit_bytes())
    assert caught.value.cause is FullCause.DISK_RESERVE and "store_reserve_bytes" in str(caught.value)
    store.record_shift("", generation("solo", chat_id=""), None)  # one small row still fits
    assert (
        store.finish("", GenerationReport("g1", Status.COMPLETED), ALPHA).generation.status
        is Status.COMPLETED
    )
    assert store.delete_chat("", "c1")  # frees the audit's pages: room for the next, on no more disk
    store.record_shift("", generation("g2", chat_id="c2"), audit_bytes())
    assert store.usage().disk_free_bytes == disk.free
    assert store.problems() == []
    store.close()


def test_sqlite_folds_its_wal_back_when_the_disk_runs_short(tmp_path: Path) -> None:
    disk = Disk(10**12)
    store = SqliteStore(tmp_path / "store.db", reserve_bytes=2**20, disk_free=disk)
    store.migrate()
    for n in range(20):
        store.record_shift("", generation(f"g{n}", chat_id=f"c{n}"), audit_bytes())
    wal = tmp_path / "store.db-wal"
    assert wal.stat().st_size > 20 * AUDIT_BYTES  # the WAL holds them (no checkpoint yet)
    store.record_shift("", generation("g20", chat_id="c20"), audit_bytes())
    assert wal.stat().st_size > 20 * AUDIT_BYTES  # plenty of disk: left alone
    disk.free = 2**20 + wal.stat().st_size // 2  # less above the reserve than the WAL takes
    store.finish("", GenerationReport("g0", Status.COMPLETED), ALPHA)
    assert wal.stat().st_size < 4 * 4096  # folded into the database first: only the report's pages
    assert store.audit("", "c19") is not None and store.problems() == []
    store.close()


# --- PostgreSQL: a lost database -----------------------------------------------------------------


@pytest.mark.postgres
def test_postgresql_stopped_fails_calls_at_once_and_they_find_it_again_when_it_is_back() -> None:
    # A cluster of its own: stopping the session's would cut off the other tests' stores.
    with running_cluster() as cluster:
        store = open_store(cluster.new_database(), pool_size=4)
        try:
            store.migrate()
            store.record_shift("", generation("g1"), b"audit-1")
            cluster.stop()
            outcomes: list[tuple[float, BaseException | None]] = []

            def call(n: int) -> None:
                for _ in range(5):
                    start = time.monotonic()
                    try:
                        store.record_shift("", generation(f"down-{n}-{_}", chat_id=f"d{n}"), b"x")
                        outcomes.append((time.monotonic() - start, None))
                    except StoreUnavailable as e:
                        outcomes.append((time.monotonic() - start, e))

            threads(4, call)
            assert len(outcomes) == 20 and all(isinstance(e, StoreUnavailable) for _, e in outcomes)
            # At once: a refused connection, at most one try to connect (libpq's least timeout).
            assert max(seconds for seconds, _ in outcomes) < 3.0, sorted(s for s, _ in outcomes)
            assert "cannot connect to PostgreSQL" in str(outcomes[-1][1])
            cluster.start()
            deadline = time.monotonic() + 30
            while True:  # the next try finds it again; the same store object, no restart
                try:
                    stored = store.audit("", "c1")
                    break
                except StoreUnavailable:
                    assert time.monotonic() < deadline, "the store never found the database again"
                    time.sleep(0.1)
            assert stored is not None and stored.payload == b"audit-1"
            store.record_shift("", generation("g2"), b"audit-2")
            assert [store.audit("", f"d{n}") for n in range(4)] == [None] * 4  # nothing of the failed
            assert store.problems() == []
        finally:
            store.close()
