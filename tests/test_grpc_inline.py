"""Where the servicer runs the engine: a small request on the event loop once its process has
served its profile and the model reads it needs are in the process's cache (a chat's last prompt
too); a first use (which may load a vocabulary), a large request, a request whose model was not
read lately, a chat this process does not hold where the store cannot read it at once (PostgreSQL;
SQLite reads it on the loop) and a chat's stored history on the engine threads. In process, with an executor that counts what it is handed."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from postgres_cluster import Cluster

from contextshift._proto.contextshift.v1 import context_service_pb2 as pb
from contextshift.api.service.gate import begin_call_stats
from contextshift.api.service.servicer import ContextShiftService
from contextshift.audit.postgres import PostgresStore
from contextshift.audit.sql import Row, SqlStore
from contextshift.audit.sqlite import SqliteStore
from contextshift.audit.writer import GroupWriter
from contextshift.budget import Budget
from contextshift.errors import InvalidOptions

INLINE_BYTES = 4096


class CountingExecutor(ThreadPoolExecutor):
    def __init__(self) -> None:
        super().__init__(1)
        self.handed = 0

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        self.handed += 1
        return super().submit(fn, *args, **kwargs)


@pytest.fixture
def executor() -> Iterator[CountingExecutor]:
    with CountingExecutor() as counting:
        yield counting


@pytest.fixture
def store(sqlite_store: SqliteStore) -> SqliteStore:
    return sqlite_store


def blocks_json(chars: int) -> str:
    return json.dumps([{"role": "user", "content": "x" * chars}])


def test_small_requests_run_inline_once_their_profile_was_served(
    executor: CountingExecutor, store: SqliteStore
) -> None:
    servicer = ContextShiftService(
        executor, Budget(), store, inline_request_bytes=INLINE_BYTES, store_cache_seconds=60
    )

    async def handed(**fields: Any) -> int:
        """How many calls the executor was handed after one ShiftContext with these fields."""
        begin_call_stats()
        request = pb.ShiftContextRequest(**fields)
        await servicer.ShiftContext(request.SerializeToString())
        return executor.handed

    async def scenario() -> None:
        small = blocks_json(100)
        assert await handed(blocks_json=small) == 1  # first use of (heuristic, no model): a thread
        assert await handed(blocks_json=small) == 1  # then inline
        assert await handed(blocks_json=blocks_json(2 * INLINE_BYTES)) == 2  # large: always a thread
        # A model's configuration and calibration are read from the store on a thread, then from
        # the cache.
        assert await handed(blocks_json=small, model="gpt-4o") == 3
        assert await handed(blocks_json=small, model="gpt-4o") == 3
        # So is a profile, which may name a model: none configured is cached too.
        assert await handed(blocks_json=small, profile="heuristic") == 4
        assert await handed(blocks_json=small, profile="heuristic") == 4
        # A model not read lately: to a thread even when its profile was served.
        assert await handed(blocks_json=small, model="gpt-4o-2024-08-06") == 5
        # A chat this process does not hold: its last prompt is read from SQLite on the loop (the
        # read cannot wait); then this process holds it.
        assert await handed(blocks_json=small, chat_id="c") == 5
        assert await handed(blocks_json=small, chat_id="c") == 5
        # Its stored history is read on a thread, always.
        assert await handed(blocks_json=small, chat_id="c", use_stored_history=True) == 6
        assert await handed(blocks_json=small, chat_id="c", use_stored_history=True) == 7
        for expected in (8, 9):  # a profile that may not load goes to a thread every time
            with pytest.raises(InvalidOptions):
                await handed(blocks_json=small, profile="hf:/nonexistent/tokenizer.json")
            assert executor.handed == expected

    asyncio.run(scenario())


class RoundTripStore(SqliteStore):
    """A SQLite store that reads nothing at once, as PostgreSQL (whose reads are round trips)."""

    def _read_at_once(self, sql: str, params: Sequence[Any]) -> list[Row]:
        return SqlStore._read_at_once(self, sql, params)


def test_a_chat_not_held_is_read_on_a_thread_where_the_store_cannot_read_at_once(
    executor: CountingExecutor, tmp_path: Path
) -> None:
    store = RoundTripStore(tmp_path / "store.db")
    store.migrate()
    servicer = ContextShiftService(executor, Budget(), store, inline_request_bytes=INLINE_BYTES)

    async def scenario() -> None:
        for chat_id, expected in (("", 1), ("", 1), ("c", 2), ("c", 2), ("d", 3)):
            begin_call_stats()
            request = pb.ShiftContextRequest(blocks_json=blocks_json(100), chat_id=chat_id)
            await servicer.ShiftContext(request.SerializeToString())
            assert executor.handed == expected

    asyncio.run(scenario())
    store.close()


def test_a_chat_not_held_is_read_by_the_stores_core_and_shifted_on_the_loop_over_postgresql(
    executor: CountingExecutor, postgres: Cluster
) -> None:
    """PostgreSQL's reads are round trips: a chat this process does not hold is read by the core's
    connection while its call waits on the event loop, and shifted there; its write is checked
    against the audit so read (what another process stored)."""
    store = PostgresStore(postgres.new_database())
    store.migrate()

    async def calls(servicer: ContextShiftService, chat_ids: Sequence[str]) -> None:
        for chat_id in chat_ids:
            begin_call_stats()
            request = pb.ShiftContextRequest(blocks_json=blocks_json(100), chat_id=chat_id)
            await servicer.ShiftContext(request.SerializeToString())

    writers = [GroupWriter(store), GroupWriter(store)]
    with ThreadPoolExecutor(1) as elsewhere:
        other = ContextShiftService(
            elsewhere, Budget(), store, inline_request_bytes=INLINE_BYTES, writer=writers[0]
        )
        asyncio.run(calls(other, ["", "c", "c"]))  # another process's shifts of chat c
    shifted = store.audit("", "c")
    assert shifted is not None
    servicer = ContextShiftService(
        executor, Budget(), store, inline_request_bytes=INLINE_BYTES, writer=writers[1]
    )
    asyncio.run(calls(servicer, ["", "c", "d", "c"]))  # the first on a thread (a first use)
    assert executor.handed == 1
    stored = store.audit("", "c")
    assert stored is not None and stored.generation.created_ms > shifted.generation.created_ms
    assert store.audit("", "d") is not None
    for writer in writers:
        writer.close()
    store.close()


def test_inline_off_runs_everything_on_the_engine_threads(
    executor: CountingExecutor, store: SqliteStore
) -> None:
    servicer = ContextShiftService(executor, Budget(), store, inline_request_bytes=0)

    async def scenario() -> None:
        begin_call_stats()
        request = pb.ShiftContextRequest(blocks_json=blocks_json(10)).SerializeToString()
        for _ in range(3):
            await servicer.ShiftContext(request)
        assert executor.handed == 3

    asyncio.run(scenario())
