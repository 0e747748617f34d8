"""The stores' group commits outside Python (`Store.core_groups`, the core's `store_group`): the
common group written as the store's own path writes it, everything that path must decide declined
to it, SQLite's errors read as the store reads its own; and the group writer using them from the
event loop, with the Python thread writing what they decline. Over real SQLite files and a real
PostgreSQL (what is PostgreSQL's alone: test_core_groups_postgres.py), with the core's real thread
and socket."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import selectors
import sqlite3
import subprocess
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path

import pytest
from postgres_cluster import Cluster
from test_store import generation

from contextshift import _core
from contextshift.audit.postgres import PostgresStore
from contextshift.audit.sql import SqlStore
from contextshift.audit.sqlite import SqliteCoreGroups, SqliteStore
from contextshift.audit.store import (
    DECLINED,
    UNCHECKED,
    AuditChanged,
    CoreGroups,
    CoreOutcome,
    ShiftRecord,
    StoreTimeout,
    StoreUnavailable,
    audit_key,
)
from contextshift.audit.writer import GroupWriter, WriteOutcome


def fresh_store(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> SqlStore:
    """A migrated store of its own."""
    if backend == "sqlite":
        opened: SqlStore = SqliteStore(tmp_path / f"{backend}-{len(list(tmp_path.iterdir()))}.db")
    else:
        cluster: Cluster = request.getfixturevalue("postgres")
        opened = PostgresStore(cluster.new_database())
    opened.migrate()
    return opened


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SqlStore]:
    opened = fresh_store(request.param, tmp_path, request)
    yield opened
    opened.close()


def core_groups(store: SqlStore) -> CoreGroups:
    groups = store.core_groups()
    assert groups is not None
    return groups


def outcomes_of(groups: CoreGroups, n: int) -> dict[int, CoreOutcome]:
    """The outcomes of `n` records handed to the core, by token, read when its socket says so."""
    outcomes: dict[int, CoreOutcome] = {}
    with selectors.DefaultSelector() as selector:
        selector.register(groups.fileno(), selectors.EVENT_READ)
        while len(outcomes) < n:
            assert selector.select(10), "the core did not answer"
            outcomes.update(groups.finished()[0])
    return outcomes


def committed(groups: CoreGroups, records: Sequence[ShiftRecord]) -> list[CoreOutcome]:
    """Each record's outcome from the core, in order."""
    for token, record in enumerate(records):
        assert groups.submit(token, record)
    outcomes = outcomes_of(groups, len(records))
    return [outcomes[token] for token in range(len(records))]


def turns(chat_id: str, n: int) -> list[ShiftRecord]:
    """A chat's first `n` shifts, each checked against the one before, each adding a segment of
    blocks and dropping the one before it."""
    records: list[ShiftRecord] = []
    for i in range(n):
        g = generation(f"{chat_id}-g{i}", chat_id=chat_id)
        g = replace(g, created_ms=g.created_ms + i)
        made_on = audit_key(records[-1].generation) if records else None
        gone = [f"{chat_id}-s{i - 1}".encode()] if i else []
        records.append(
            ShiftRecord(
                "t",
                g,
                f"audit {chat_id} {i}".encode(),
                made_on,
                kept=i,
                excluded=1,
                message_refs=f"refs {i}".encode(),
                new_segments=[(f"{chat_id}-s{i}".encode(), b"blocks" * i)],
                gone_segments=gone,
            )
        )
    return records


def tables(store: SqlStore) -> list[list[tuple[object, ...]]]:
    return [
        [tuple(row) for row in store._query(f"SELECT * FROM {table} ORDER BY 1, 2", ())]
        for table in ("generations", "audits", "audit_segments")
    ]


def test_the_core_writes_a_group_as_the_stores_own_path_does(
    store: SqlStore, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    records = turns("a", 3) + turns("b", 2)
    chatless = ShiftRecord("t", generation("no-chat", chat_id=""), None)
    groups = core_groups(store)
    assert committed(groups, records[:2]) == [None, None]
    assert committed(groups, [*records[2:], chatless]) == [None] * 4
    groups.stop()
    own = fresh_store(store.dialect, tmp_path, request)
    assert own.record_shifts(records[:2]) == [None, None]
    assert own.record_shifts([*records[2:], chatless]) == [None] * 4
    assert tables(store) == tables(own)
    own.close()


def test_the_core_declines_what_the_stores_own_path_must_decide(store: SqlStore) -> None:
    """Declined with nothing written (a group whole: rust_ext/core/src/sqlite_group.rs's tests)."""
    groups = core_groups(store)
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
    assert store.audit("t", "c") is None
    stored = store.audit("t", "a")
    assert stored is not None and stored.generation.generation_id == "a-g0"
    # Not taken at all: an audit not checked against its chat's.
    assert not groups.submit(99, replace(second, made_on=UNCHECKED))
    # Written by the store's own path, which says why.
    (changed,) = store.record_shifts([stale])
    assert isinstance(changed, AuditChanged)
    groups.stop()
    assert not groups.submit(100, second)  # stopped: nothing queued


def test_the_core_declines_a_group_the_disk_has_no_plain_room_for(tmp_path: Path) -> None:
    reserved = SqliteStore(tmp_path / "store.db", reserve_bytes=1 << 62)
    reserved.migrate()
    assert committed(core_groups(reserved), turns("a", 1)) == [DECLINED]
    # The store's own path claims its room, and refuses it.
    (full,) = reserved.record_shifts(turns("a", 1))
    assert full is not None and "store_reserve_bytes" in str(full)
    # With max_store_bytes only the store's own claims count its room: no core commits.
    assert SqliteStore(tmp_path / "store.db", max_bytes=1 << 30).core_groups() is None
    reserved.close()


def test_a_store_locked_past_its_busy_timeout_is_unavailable_to_the_core_and_nothing_is_written(
    tmp_path: Path,
) -> None:
    store = SqliteStore(tmp_path / "store.db", busy_timeout_ms=100)
    store.migrate()
    holder = sqlite3.connect(tmp_path / "store.db", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        (outcome,) = committed(core_groups(store), turns("a", 1))
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert isinstance(outcome, StoreUnavailable) and "locked" in str(outcome)
    assert store.audit("t", "a") is None
    store.close()


def test_the_cores_sqlite_errors_are_read_as_the_stores_own(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "store.db", store_timeout=0.5)
    groups = core_groups(store)
    assert isinstance(groups, SqliteCoreGroups)
    interrupted = sqlite3.OperationalError("interrupted")
    interrupted.sqlite_errorcode = sqlite3.SQLITE_INTERRUPT  # type: ignore[attr-defined]
    timeout = groups._outcome(interrupted)
    assert isinstance(timeout, StoreTimeout) and "500 ms" in str(timeout)
    full = sqlite3.OperationalError("database or disk is full")
    full.sqlite_errorcode = sqlite3.SQLITE_FULL  # type: ignore[attr-defined]
    assert groups._outcome(full) is DECLINED  # the store's own path says which record
    groups.stop()
    store.close()


def test_the_process_holds_one_sqlite_library(sqlite_store: SqliteStore) -> None:
    """The core links the system's libsqlite3, the one the sqlite3 module loads: two copies would
    not see each other's POSIX locks on the store's file."""
    linked = subprocess.run(["ldd", _core.__file__], capture_output=True, text=True, check=True).stdout
    assert "libsqlite3.so.0 =>" in linked  # not `bundled`: a copy of its own would be linked in
    assert committed(core_groups(sqlite_store), turns("a", 1)) == [None]
    sqlite_store.audit("t", "a")  # the sqlite3 module's connection
    mapped = {
        line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines() if "sqlite" in line
    }
    libraries = {Path(path).resolve() for path in mapped if "libsqlite3" in path}
    assert len(libraries) == 1, mapped


# --- the group writer over them ------------------------------------------------------------------


def told(outcomes: dict[str, WriteOutcome], chat_id: str) -> Callable[[WriteOutcome], None]:
    return lambda outcome: outcomes.__setitem__(chat_id, outcome)


def test_records_written_on_the_event_loop_are_committed_by_the_core_and_told_there(
    store: SqlStore,
) -> None:
    writer = GroupWriter(store)
    outcomes: dict[str, WriteOutcome] = {}
    a, b = turns("a", 1), turns("b", 2)

    async def scenario() -> None:
        for record in [*a, *b]:
            writer.write(lambda record=record: record, told(outcomes, record.generation.generation_id))
        while len(outcomes) < 3:
            await asyncio.sleep(0.01)
        assert writer._thread is None  # the Python writer thread never started
        # Declined by the core (made against no audit, while the chat has one): the Python thread
        # writes it, and says why.
        stale = replace(turns("a", 2)[1], made_on=None)
        writer.write(lambda: stale, told(outcomes, "stale"))
        while len(outcomes) < 4:
            await asyncio.sleep(0.01)
        assert writer._thread is not None

    asyncio.run(scenario())
    assert outcomes.pop("stale").__class__ is AuditChanged
    assert outcomes == {"a-g0": None, "b-g0": None, "b-g1": None}
    stored = store.audit("t", "b")
    assert stored is not None and stored.generation.generation_id == "b-g1"
    writer.close()


def test_records_written_on_a_thread_for_a_call_on_the_loop_are_handed_to_the_loop_and_the_core(
    store: SqlStore,
) -> None:
    writer = GroupWriter(store)
    outcomes: dict[str, WriteOutcome] = {}
    told_on: list[int] = []

    async def scenario() -> None:
        loop = asyncio.get_running_loop()

        def done(outcome: WriteOutcome) -> None:
            told_on.append(threading.get_ident())
            outcomes["a"] = outcome

        made_on: list[int] = []

        def make() -> ShiftRecord:
            made_on.append(threading.get_ident())
            return turns("a", 1)[0]

        await loop.run_in_executor(None, lambda: writer.write(make, done, loop))
        while not outcomes:
            await asyncio.sleep(0.01)
        assert made_on != [threading.get_ident()]  # made on the thread, not on the loop
        assert told_on == [threading.get_ident()]  # told on the loop
        assert writer._thread is None  # committed by the core: the Python thread never started

    asyncio.run(scenario())
    assert outcomes == {"a": None}
    writer.close()


def test_records_written_off_the_event_loop_go_to_the_writer_thread(sqlite_store: SqliteStore) -> None:
    writer = GroupWriter(sqlite_store)
    outcomes: dict[str, WriteOutcome] = {}
    done = told(outcomes, "a")
    writer.write(lambda: turns("a", 1)[0], done)
    writer.close()
    assert outcomes == {"a": None}
    assert writer._core is None  # never asked for: no event loop wrote


def test_closing_from_another_thread_commits_what_is_queued_and_tells_each_call_on_its_loop(
    sqlite_store: SqliteStore,
) -> None:
    writer = GroupWriter(sqlite_store)
    outcomes: dict[str, WriteOutcome] = {}

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        for record in turns("a", 1) + turns("b", 1) + turns("c", 1):
            writer.write(lambda record=record: record, told(outcomes, record.generation.chat_id))
        await loop.run_in_executor(None, writer.close)
        assert outcomes == {"a": None, "b": None, "c": None}
        assert writer._thread is None  # all committed by the core: the Python thread never started

    asyncio.run(scenario())


def test_a_forked_process_commits_through_its_own_core_thread(sqlite_store: SqliteStore) -> None:
    """A child inherits the writer and its parent's core commits, but not their thread: it starts
    its own, and never joins or closes the parent's."""
    writer = GroupWriter(sqlite_store)
    outcomes: dict[str, WriteOutcome] = {}

    async def write(chat_id: str) -> None:
        (record,) = turns(chat_id, 1)
        writer.write(lambda: record, told(outcomes, chat_id))
        while chat_id not in outcomes:
            await asyncio.sleep(0.01)

    asyncio.run(write("parent"))
    context = multiprocessing.get_context("fork")
    answers = context.Queue()

    def child() -> None:
        asyncio.run(write("child"))
        inherited = [core.pid for core in writer._inherited]
        writer.close()
        answers.put((outcomes["child"], inherited))

    process = context.Process(target=child)
    process.start()
    assert answers.get(timeout=30) == (None, [os.getpid()])
    process.join(30)
    assert process.exitcode == 0
    asyncio.run(write("parent-again"))  # another loop: the Python writer thread writes it
    writer.close()
    assert outcomes == {"parent": None, "parent-again": None}
    for chat_id in ("parent", "child", "parent-again"):
        assert sqlite_store.audit("t", chat_id) is not None
