"""The store's listing of chats (`Store.chats`, behind ListChats) on both backends: newest first,
pages that neither skip nor repeat a chat (also among chats shifted in the same millisecond), the
counts stored with each audit, tenants; a store at the previous schema version migrated in place
and listed; and the query plan of a page on each backend: one query through the audits' index,
which never reads a payload."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import psycopg
import pytest
from postgres_cluster import Cluster
from test_store import BACKENDS, store_url

from contextshift.audit import open_store, sql
from contextshift.audit.migrations import LATEST, MIGRATIONS
from contextshift.audit.sql import CHATS_AFTER, CHATS_FIRST, SqlStore
from contextshift.audit.sqlite import SqliteStore
from contextshift.audit.store import (
    UNCHECKED,
    ChatCursor,
    ChatSummary,
    Generation,
    GenerationReport,
    ShiftRecord,
    Status,
    Store,
)
from contextshift.calibration import ALPHA


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """A migrated store of each backend; its invariants hold after the test."""
    opened = open_store(store_url(request.param, tmp_path, request))
    opened.migrate()
    yield opened
    assert opened.problems() == []
    opened.close()


def shift(
    store: Store, chat: str, at_ms: int, *, tenant: str = "", kept: int = 3, excluded: int = 1, gid: str = ""
) -> Generation:
    """A shift of `chat` at `at_ms`, with its audit and counts, stored as the group writer does."""
    g = Generation(gid or f"{tenant}-{chat}-{at_ms}", chat, "gpt-4o", 100 + at_ms % 1000, False, at_ms)
    assert store.record_shifts([ShiftRecord(tenant, g, b"audit", UNCHECKED, kept, excluded)]) == [None]
    return g


def ids(chats: list[ChatSummary]) -> list[str]:
    return [c.generation.chat_id for c in chats]


def every_page(store: Store, tenant: str, size: int) -> list[list[str]]:
    """The tenant's whole listing, page by page, each page starting after the last one's end."""
    pages: list[list[str]] = []
    after: ChatCursor | None = None
    while True:
        page = store.chats(tenant, size, after)
        if not page:
            return pages
        pages.append(ids(page))
        last = page[-1].generation
        after = (last.created_ms, last.chat_id)


def test_newest_first_with_the_generation_and_counts(store: Store) -> None:
    shift(store, "c1", 1_000, kept=5, excluded=2)
    g2 = shift(store, "c2", 3_000, kept=7, excluded=0)
    shift(store, "c3", 2_000)
    shift(store, "c1", 4_000, kept=6, excluded=3, gid="c1-again")  # a next turn: c1 first again
    listed = store.chats("", 10)
    assert ids(listed) == ["c1", "c2", "c3"]
    first = listed[0]
    assert (first.generation.generation_id, first.generation.created_ms) == ("c1-again", 4_000)
    assert (first.kept, first.excluded, first.generation.status) == (6, 3, Status.PENDING)
    assert (listed[1].generation, listed[1].kept, listed[1].excluded) == (g2, 7, 0)


def test_a_report_changes_the_status_listed_not_the_order(store: Store) -> None:
    shift(store, "old", 1_000, gid="g-old")
    shift(store, "new", 2_000)
    report = GenerationReport("g-old", Status.FAILED, error_code="RATE_LIMITED", reported_prompt_tokens=90)
    store.finish("", report, ALPHA)
    listed = store.chats("", 10)
    assert ids(listed) == ["new", "old"]
    g = listed[1].generation
    assert (g.status, g.error_code, g.reported_prompt_tokens) == (Status.FAILED, "RATE_LIMITED", 90)
    assert g.finished_ms is not None and g.finished_ms >= g.created_ms


def test_pages_neither_skip_nor_repeat_a_chat_even_within_one_millisecond(store: Store) -> None:
    # Eleven chats, seven of them shifted in the same millisecond: a page may end among those.
    for n in range(4):
        shift(store, f"early-{n}", 1_000 + n)
    for n in range(7):
        shift(store, f"same-{n}", 5_000)
    expected = [f"same-{n}" for n in reversed(range(7))] + [f"early-{n}" for n in reversed(range(4))]
    assert ids(store.chats("", 100)) == expected
    for size in (1, 2, 3, 4, 5, 11, 12):
        pages = every_page(store, "", size)
        assert [chat for page in pages for chat in page] == expected, size
        assert all(len(page) == size for page in pages[:-1])


def test_each_tenant_lists_only_its_own_chats(store: Store) -> None:
    shift(store, "shared", 1_000, tenant="acme", gid="acme-shared")
    shift(store, "shared", 2_000, tenant="globex", gid="globex-shared")
    shift(store, "acme-only", 3_000, tenant="acme")
    shift(store, "globex-only", 500, tenant="globex")
    acme = store.chats("acme", 10)
    assert ids(acme) == ["acme-only", "shared"] and acme[1].generation.generation_id == "acme-shared"
    globex = store.chats("globex", 10)
    assert ids(globex) == ["shared", "globex-only"] and globex[0].generation.generation_id == "globex-shared"
    assert store.chats("", 10) == []
    # A cursor from another tenant's listing only says where this tenant's own listing starts.
    assert ids(store.chats("acme", 10, (2_000, "shared"))) == ["shared"]


def test_a_deleted_chat_and_a_shift_without_a_chat_are_not_listed(store: Store) -> None:
    shift(store, "kept", 1_000)
    shift(store, "gone", 2_000)
    store.record_shift("", Generation("no-chat", "", "gpt-4o", 10, True, 3_000), None)
    assert store.delete_chat("", "gone")
    assert ids(store.chats("", 10)) == ["kept"]


# --- a store at the previous schema version, migrated in place ----------------------------------


def _at_version_2(url: str, monkeypatch: pytest.MonkeyPatch) -> Store:
    """A new store migrated to schema version 2, as the contextshift before ListChats left it."""
    previous = open_store(url)
    with monkeypatch.context() as patched:
        patched.setattr(sql, "MIGRATIONS", MIGRATIONS[:2])
        patched.setattr(sql, "LATEST", 2)
        assert previous.migrate() == 2
    assert previous.schema_version() == 2
    return previous


def _v2_shift(previous: Store, tenant: str, chat: str, generation: str, at_ms: int) -> None:
    """A shift's rows as version 2 stored them: its generation, then its audit (no counts)."""

    def write(tx: sql.Tx) -> None:
        tx.run(
            "INSERT INTO generations (tenant, generation_id, chat_id, model, prompt_tokens, approximate, "
            "created_ms, status) VALUES (?, ?, ?, 'claude-sonnet-4-5', 321, ?, ?, 'PENDING')",
            (tenant, generation, chat, False, at_ms),
        )
        tx.run(
            "INSERT INTO audits (tenant, chat_id, generation_id, payload) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (tenant, chat_id) DO UPDATE SET generation_id = excluded.generation_id, "
            "payload = excluded.payload",
            (tenant, chat, generation, f"audit of {generation}".encode()),
        )

    cast(SqlStore, previous)._run(write, write=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_store_at_the_previous_version_migrates_in_place_and_lists_its_chats(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = store_url(backend, tmp_path, request)
    previous = _at_version_2(url, monkeypatch)
    _v2_shift(previous, "", "first", "g1", 1_000)
    _v2_shift(previous, "", "second", "g2", 2_000)
    _v2_shift(previous, "", "first", "g3", 3_000)  # the chat's next turn replaced its audit
    _v2_shift(previous, "other", "first", "g1", 9_000)  # another tenant, the same ids
    previous.finish("", GenerationReport("g2", Status.COMPLETED, reported_prompt_tokens=300), ALPHA)
    previous.close()

    store = open_store(url)
    try:
        assert store.schema_version() == 2
        assert store.migrate() == LATEST and store.schema_version() == LATEST
        assert store.problems() == []
        listed = store.chats("", 10)
        assert ids(listed) == ["first", "second"]
        assert [c.generation.generation_id for c in listed] == ["g3", "g2"]
        # The counts of audits stored before are not known; their payloads are as they were.
        assert [(c.kept, c.excluded) for c in listed] == [(None, None), (None, None)]
        second = listed[1].generation
        assert (second.status, second.reported_prompt_tokens, second.prompt_tokens) == (
            Status.COMPLETED,
            300,
            321,
        )
        stored = store.audit("", "first")
        assert stored is not None and stored.payload == b"audit of g3"
        assert ids(store.chats("other", 10)) == ["first"]
        # The chat's next shift stores its counts, and lists it first.
        shift(store, "second", 4_000, kept=4, excluded=2)
        listed = store.chats("", 10)
        assert ids(listed) == ["second", "first"] and (listed[0].kept, listed[0].excluded) == (4, 2)
        assert store.problems() == []
    finally:
        store.close()


# --- the query plan -------------------------------------------------------------------------------


def _fill(store: Store, tenants: int, chats: int) -> None:
    """`chats` chats for each of `tenants` tenants, stored a tenant's group at a time."""
    for t in range(tenants):
        records = [
            ShiftRecord(
                f"tenant-{t}",
                Generation(f"g-{t}-{n}", f"chat-{n:05d}", "gpt-4o", 100, False, 1_000_000 + n),
                b"x" * 2_000,  # over a SQLite page's share of a row: the rest on overflow pages
                UNCHECKED,
                3,
                1,
            )
            for n in range(chats)
        ]
        assert store.record_shifts(records) == [None] * chats


PAGES = [(CHATS_FIRST, ("tenant-1", 51)), (CHATS_AFTER, ("tenant-1", 1_000_500, 1_000_500, "chat-00500", 51))]


def test_sqlite_a_page_reads_the_audits_index_alone(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "store.db")
    store.migrate()
    _fill(store, 3, 1_000)
    for query, params in PAGES:
        plan = [row[3] for row in store._query("EXPLAIN QUERY PLAN " + query, params)]
        assert plan[0].startswith("SEARCH a USING COVERING INDEX audits_by_time (tenant=?"), plan
        assert plan[1].startswith("SEARCH g USING INDEX sqlite_autoindex_generations_1"), plan
        assert len(plan) == 2 and not any("TEMP B-TREE" in step or "SCAN" in step for step in plan), plan
    store.close()


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def test_postgresql_a_page_reads_the_audits_index_alone(postgres: Cluster) -> None:
    url = postgres.new_database()
    store = open_store(url)
    store.migrate()
    _fill(store, 3, 1_000)
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute("VACUUM ANALYZE")  # statistics, and the visibility map for index-only scans
        for query, params in PAGES:
            text = query.replace("?", "%s")
            ((explained,),) = connection.execute(f"EXPLAIN (FORMAT JSON) {text}", params).fetchall()
            nodes = list(_nodes(explained[0]["Plan"]))
            scans = {(n["Node Type"], n.get("Relation Name"), n.get("Index Name")) for n in nodes}
            assert ("Index Only Scan", "audits", "audits_by_time") in scans, json.dumps(explained)
            assert any(s[:2] == ("Index Scan", "generations") and s[2] == "generations_pkey" for s in scans)
            assert not any(n["Node Type"] in {"Sort", "Seq Scan", "Hash Join"} for n in nodes), scans
            top = next(n for n in nodes if n.get("Index Name") == "audits_by_time")
            assert top["Scan Direction"] == "Backward"
    store.close()
