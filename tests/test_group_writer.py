"""The group writer (`audit.writer`): one thread stores, in one transaction, every record queued
while the previous transaction committed, and tells each call its own outcome only after the
commit; a call that gave up before its write stores nothing; a record that cannot be made, or a
store that cannot serve, fails its calls and never the thread. Over a real SQLite store, held
in its first write by the test so that the next records queue behind it."""

from __future__ import annotations

import asyncio
import multiprocessing
import queue
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import pytest
from test_store import generation

from contextshift.api.service.placement import Placement
from contextshift.audit.sqlite import SqliteStore
from contextshift.audit.store import (
    CoreGroups,
    GenerationIdInUse,
    ShiftRecord,
    StoreError,
    StoreUnavailable,
)
from contextshift.audit.writer import WRITER_THREAD, GroupWriter, WriteOutcome


class HeldStore(SqliteStore):
    """A SQLite store whose next `record_shifts` waits until released (its records are taken by
    then), and that says how many records each call stored, and whether each was committed (read
    from another connection) when its call was told."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.groups: list[int] = []
        self.entered = threading.Event()
        self.release = threading.Event()
        self.release.set()
        self.fail_with: StoreError | None = None

    def hold(self) -> None:
        self.entered.clear()
        self.release.clear()

    def record_shifts(self, records: list[ShiftRecord]) -> list[StoreError | None]:  # type: ignore[override]
        self.groups.append(len(records))
        self.entered.set()
        assert self.release.wait(10)
        if self.fail_with is not None:
            raise self.fail_with
        return super().record_shifts(records)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[HeldStore]:
    opened = HeldStore(tmp_path / "store.db")
    opened.migrate()
    yield opened
    opened.close()


class Calls:
    """What the writer told each call, and whether its audit could be read (from a connection of
    its own) when it was told."""

    def __init__(self, path: Path) -> None:
        self.reader = SqliteStore(path)
        self.told: dict[str, WriteOutcome] = {}
        self.readable: dict[str, bool] = {}
        self.all_told = threading.Event()
        self.expected = 0

    def done(self, chat_id: str) -> Callable[[WriteOutcome], None]:
        def told(outcome: WriteOutcome) -> None:
            self.readable[chat_id] = self.reader.audit("", chat_id) is not None
            self.told[chat_id] = outcome
            if len(self.told) == self.expected:
                self.all_told.set()

        return told


def record(chat_id: str, generation_id: str = "") -> ShiftRecord:
    return ShiftRecord("", generation(generation_id or f"g-{chat_id}", chat_id=chat_id), chat_id.encode())


def first_audit(chat_id: str) -> ShiftRecord:
    """A chat's first record, checked (the core writes it; an unchecked one is the Python path's)."""
    return replace(record(chat_id), made_on=None)


def held_first(store: HeldStore, tmp_path: Path, expected: int) -> tuple[GroupWriter, Calls]:
    """A writer storing chat "a"'s record, held in its transaction: what is written next queues."""
    writer = GroupWriter(store)
    calls = Calls(tmp_path / "store.db")
    calls.expected = expected
    store.hold()
    writer.write(lambda: record("a"), calls.done("a"))
    assert store.entered.wait(10)
    return writer, calls


def test_records_queued_during_a_commit_go_together_and_each_call_is_told_after_it(
    store: HeldStore, tmp_path: Path
) -> None:
    writer, calls = held_first(store, tmp_path, 9)
    for i in range(8):
        writer.write(lambda i=i: record(f"c{i}"), calls.done(f"c{i}"))
    store.release.set()
    assert calls.all_told.wait(10)
    assert store.groups == [1, 8]
    assert set(calls.told.values()) == {None}
    assert all(calls.readable.values())  # told only once committed
    writer.close()


class CountedWriter(GroupWriter):
    """A group writer that counts the records handed to it."""

    def __init__(self, store: SqliteStore) -> None:
        super().__init__(store)
        self.handed = 0

    def write(
        self,
        make: Callable[[], ShiftRecord | None],
        done: Callable[[WriteOutcome], None],
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self.handed += 1
        super().write(make, done, loop)


def three_written(
    placement: Placement, make: Callable[[str], ShiftRecord]
) -> list[asyncio.Future[tuple[int, WriteOutcome]]]:
    """The futures of three calls whose records (of chats c0, c1, c2) `placement` was handed on
    the running loop."""
    loop = asyncio.get_running_loop()
    done: list[asyncio.Future[tuple[int, WriteOutcome]]] = [loop.create_future() for _ in range(3)]
    for i, future in enumerate(done):
        placement.write(lambda i=i: make(f"c{i}"), lambda outcome, i=i: (i, outcome), future)
    return done


class PythonOnlyStore(HeldStore):
    """A store whose groups commit on the Python writer thread only."""

    def core_groups(self) -> CoreGroups | None:
        return None


def test_records_written_in_one_pass_reach_the_python_writer_together(tmp_path: Path) -> None:
    """`Placement.write` on the loop hands the pass's records over when the pass ends: the writer
    thread then wakes once for them."""
    store = PythonOnlyStore(tmp_path / "store.db")
    store.migrate()
    writer = CountedWriter(store)
    with ThreadPoolExecutor(1) as executor:
        placement = Placement(executor, None, 0, writer)

        async def scenario() -> None:
            done = three_written(placement, record)
            assert writer.handed == 0  # still in the pass that wrote them
            await asyncio.sleep(0)
            assert writer.handed == 3
            assert await asyncio.gather(*done) == [(0, None), (1, None), (2, None)]

        asyncio.run(scenario())
    writer.close()
    assert store.groups == [3]
    store.close()


def test_records_go_to_the_stores_commits_outside_python_at_once(store: HeldStore) -> None:
    """From the loop at once: the core's thread commits what queued while the loop goes on. From a
    thread at once too, and the record made there goes on to the call's loop, and by it to the
    core."""
    writer = CountedWriter(store)
    with ThreadPoolExecutor(1) as executor:
        placement = Placement(executor, None, 0, writer)

        async def scenario() -> None:
            done = three_written(placement, first_audit)
            assert writer.handed == 3  # in the pass that wrote them
            assert await asyncio.gather(*done) == [(0, None), (1, None), (2, None)]
            loop = asyncio.get_running_loop()
            from_thread: asyncio.Future[tuple[int, WriteOutcome]] = loop.create_future()

            def on_thread() -> None:
                placement.write(lambda: first_audit("t"), lambda outcome: (3, outcome), from_thread)
                assert writer.handed >= 4  # at once (and the loop may have taken it on already)

            await loop.run_in_executor(executor, on_thread)
            assert await from_thread == (3, None)
            assert writer.handed == 5  # made on the thread, handed to the loop, and by it to the core

        asyncio.run(scenario())
    writer.close()
    assert all(store.audit("", chat) is not None for chat in ("c0", "c1", "c2", "t"))
    assert store.groups == []  # none went through the Python writer thread


def test_one_records_failure_is_its_own(store: HeldStore, tmp_path: Path) -> None:
    store.record_shift("", generation("taken", chat_id="other"), b"x")
    store.groups.clear()
    writer, calls = held_first(store, tmp_path, 3)

    def broken() -> ShiftRecord:
        raise ValueError("cannot encode")

    writer.write(broken, calls.done("broken"))
    writer.write(lambda: None, calls.done("gave up"))
    writer.write(lambda: record("b", "taken"), calls.done("b"))
    store.release.set()
    assert calls.all_told.wait(10)
    assert calls.told["a"] is None
    assert isinstance(calls.told["broken"], ValueError)
    assert isinstance(calls.told["b"], GenerationIdInUse)
    assert "gave up" not in calls.told  # nothing stored, nobody told
    assert store.groups == [1, 1]  # the one that gave up and the broken one were never records
    writer.close()


def test_a_store_that_cannot_serve_fails_the_group_and_the_writer_goes_on(
    store: HeldStore, tmp_path: Path
) -> None:
    store.fail_with = StoreUnavailable("the store is down")
    writer, calls = held_first(store, tmp_path, 2)
    writer.write(lambda: record("b"), calls.done("b"))
    store.release.set()
    assert calls.all_told.wait(10)
    assert all(isinstance(outcome, StoreUnavailable) for outcome in calls.told.values())
    store.fail_with = None
    calls.expected, calls.all_told = 3, threading.Event()
    writer.write(lambda: record("c"), calls.done("c"))
    assert calls.all_told.wait(10) and calls.told["c"] is None
    writer.close()


def writer_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == WRITER_THREAD}


def test_close_stores_what_is_queued_then_stops(store: HeldStore, tmp_path: Path) -> None:
    others = writer_threads()  # earlier tests' writers, never closed
    writer, calls = held_first(store, tmp_path, 4)
    for chat_id in "bcd":
        writer.write(lambda chat_id=chat_id: record(chat_id), calls.done(chat_id))
    store.release.set()
    writer.close()  # returns once its thread stopped
    assert calls.all_told.is_set() and set(calls.told.values()) == {None}
    assert writer_threads() == others


def test_a_forked_process_starts_its_own_writer_thread(store: HeldStore, tmp_path: Path) -> None:
    """A child forked after its parent's writer started inherits the writer but not its thread:
    its first write starts its own (else its records would wait forever in the queue)."""
    writer = GroupWriter(store)
    calls = Calls(tmp_path / "store.db")
    calls.expected = 1
    writer.write(lambda: record("parent"), calls.done("parent"))
    assert calls.all_told.wait(10) and calls.told["parent"] is None

    def child() -> None:
        told: queue.SimpleQueue[WriteOutcome] = queue.SimpleQueue()
        writer.write(lambda: record("child"), told.put)
        sys.exit(0 if told.get(timeout=10) is None else 1)

    process = multiprocessing.get_context("fork").Process(target=child)
    process.start()
    process.join(30)
    assert process.exitcode == 0
    assert calls.reader.audit("", "child") is not None
    writer.close()
