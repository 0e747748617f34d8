"""A warm chat: the process keeps each chat's last prompt with the audit it is of, so the chat's next
ShiftContext is made on the event loop without reading the store, and its write checks in its
transaction that the chat's audit is still that one. When another process shifted the chat
meanwhile, the write changes nothing, and the shift is made again against the audit the store
holds: it gives what a process that never held the chat gives. In process: servicers over one
SQLite store stand in for the workers, with a store that counts its reads of audits and an
executor that counts what it is handed."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from prometheus_client import REGISTRY
from test_grpc_inline import CountingExecutor

from contextshift import engine
from contextshift._proto.contextshift.v1 import context_service_pb2 as pb
from contextshift.api import metrics
from contextshift.api.service import audit_payload
from contextshift.api.service.gate import begin_call_stats
from contextshift.api.service.servicer import ContextShiftService
from contextshift.api.service.store_view import PROMPT_BLOCKS_KEPT
from contextshift.audit.sqlite import SqliteStore
from contextshift.audit.store import (
    DECLINED,
    AuditChanged,
    CoreGroups,
    CoreOutcome,
    ShiftRecord,
    StoredAudit,
    StoreError,
    audit_key,
)
from contextshift.budget import Budget


class CountingStore(SqliteStore):
    """A SQLite store that counts its reads of chats' audits (on a thread, or at once on the event
    loop), and the records it writes."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.audit_reads = 0
        self.records: list[ShiftRecord] = []
        self.outcomes: list[StoreError | None] = []

    def audit(self, tenant: str, chat_id: str) -> StoredAudit | None:
        self.audit_reads += 1
        return super().audit(tenant, chat_id)

    def audit_at_once(self, tenant: str, chat_id: str) -> StoredAudit | None:
        self.audit_reads += 1
        return super().audit_at_once(tenant, chat_id)

    def record_shifts(self, records: list[ShiftRecord]) -> list[StoreError | None]:  # type: ignore[override]
        outcomes = super().record_shifts(records)
        self.records += records
        self.outcomes += outcomes
        return outcomes

    def core_groups(self) -> CoreGroups | None:
        groups = super().core_groups()
        return None if groups is None else CountedGroups(groups, self)


class CountedGroups:
    """A store's group commits outside Python, whose written records (not those declined, which
    its `record_shifts` writes) the store counts as its own."""

    def __init__(self, groups: CoreGroups, store: CountingStore) -> None:
        self._groups = groups
        self._store = store
        self._submitted: dict[int, ShiftRecord] = {}
        self.dialect = groups.dialect
        self.fileno = groups.fileno
        self.stop = groups.stop

    def submit(self, token: int, record: ShiftRecord) -> bool:
        self._submitted[token] = record
        return self._groups.submit(token, record)

    def finished(self) -> tuple[list[tuple[int, CoreOutcome]], list[tuple[int, float]]]:
        records, groups = self._groups.finished()
        for token, outcome in records:
            if outcome is not DECLINED:
                self._store.records.append(self._submitted[token])
                self._store.outcomes.append(outcome)  # type: ignore[arg-type]  # a StoreError
        return records, groups


@pytest.fixture
def store(tmp_path: Path) -> Iterator[CountingStore]:
    opened = CountingStore(tmp_path / "store.db")
    opened.migrate()
    yield opened
    assert opened.problems() == []
    opened.close()


@pytest.fixture
def executor() -> Iterator[CountingExecutor]:
    with CountingExecutor() as counting:
        yield counting


def servicer(executor: ThreadPoolExecutor, store: SqliteStore) -> ContextShiftService:
    """A worker of its own (its own caches and writer) over `store`."""
    return ContextShiftService(
        executor, Budget(), store, inline_request_bytes=1 << 20, store_cache_seconds=60
    )


def chat(turns: int, words: int = 80) -> str:
    blocks = [{"id": "sys", "role": "system", "content": "Be brief."}]
    for i in range(turns):
        role = "user" if i % 2 == 0 else "assistant"
        blocks.append({"id": f"m{i}", "role": role, "content": "word " * words})
    return json.dumps(blocks)


async def shifted(on: ContextShiftService, chat_id: str, turns: int, generation_id: str) -> list[str]:
    """The ids a ShiftContext keeps: a 600-token window, so a chat of 20 turns and more is cut (and
    the next shifts of the chat carry the cut while it still fits)."""
    begin_call_stats()
    request = pb.ShiftContextRequest(
        chat_id=chat_id,
        blocks_json=chat(turns),
        generation_id=generation_id,
        context_limit=600,
        response_reserve=0,
    )
    reply = pb.ShiftContextResponse.FromString(await on.ShiftContext(request.SerializeToString()))
    return [b.id for b in reply.plan.kept]


async def previewed(on: ContextShiftService, chat_id: str, turns: int) -> list[str]:
    """The ids a PreviewContext of the chat keeps (it reads the chat's audit from the store)."""
    begin_call_stats()
    request = pb.PreviewContextRequest(
        chat_id=chat_id, blocks_json=chat(turns), context_limit=600, response_reserve=0
    )
    reply = pb.PreviewContextResponse.FromString(await on.PreviewContext(request.SerializeToString()))
    return [b.id for b in reply.plan.kept]


def test_a_warm_chat_is_shifted_on_the_event_loop_without_reading_the_store(
    executor: CountingExecutor, store: CountingStore
) -> None:
    worker = servicer(executor, store)

    async def scenario() -> None:
        await shifted(worker, "c", 20, "g1")  # a chat this process does not hold: read on a thread
        assert (store.audit_reads, executor.handed) == (1, 1)
        stored = store.audit("", "c")
        assert stored is not None and stored.generation.generation_id == "g1"
        kept = worker._caches.prompts.peek(("prompt", "", "c"))
        assert kept[:2] == (audit_key(stored.generation), audit_payload.previous_prompt(stored))
        # and the blocks the chat stored for it: those its audit references
        assert stored.message_refs is not None
        held = engine.StoredBlocks.from_refs(stored.message_refs)
        assert sorted(kept.blocks.segment_hashes()) == sorted(held.segment_hashes())
        assert len(kept.blocks) == len(held) > 0
        assert kept[1].excluded  # the budget cut: a cut to carry
        for n, turns in enumerate((21, 22, 23)):
            await shifted(worker, "c", turns, f"g{n + 2}")
        assert (store.audit_reads, executor.handed) == (2, 1)  # the one read above, by the test
        # Each write was checked against the audit the shift was made on, the one before it.
        assert [r.made_on for r in store.records] == [None] + [
            audit_key(r.generation) for r in store.records[:-1]
        ]
        assert store.outcomes == [None] * 4

    asyncio.run(scenario())


def reshifts_counted() -> float:
    return (
        REGISTRY.get_sample_value("contextshift_reshifts_total", {"backend": "sqlite", "worker": "0"}) or 0.0
    )


def test_a_chat_another_process_shifted_is_shifted_again_against_the_stored_audit(
    executor: CountingExecutor, store: CountingStore
) -> None:
    a, b = servicer(executor, store), servicer(executor, store)

    async def scenario() -> None:
        await shifted(a, "c", 20, "a1")
        await shifted(a, "c", 21, "a2")  # a holds the chat at a2
        await shifted(b, "c", 24, "b1")  # b shifts it: a's prompt is stale
        expected = await previewed(servicer(executor, store), "c", 25)  # from the audit stored
        # The same turns, shifted against the prompt a holds (another chat, shifted the same way):
        stale = servicer(executor, store)
        await shifted(stale, "d", 20, "d1")
        await shifted(stale, "d", 21, "d2")
        assert await previewed(stale, "d", 25) != expected  # the test tells the two apart
        store.records.clear()
        store.outcomes.clear()
        reshifts = reshifts_counted()
        assert await shifted(a, "c", 25, "a3") == expected
        assert reshifts_counted() == reshifts + 1  # counted for operators
        # Its first write found b's audit and changed nothing; the second, made on it, stored.
        first, second = store.outcomes
        assert isinstance(first, AuditChanged) and first.current is not None
        assert first.current.generation.generation_id == "b1"
        assert second is None and store.records[1].made_on == audit_key(first.current.generation)
        a3 = store.audit("", "c")
        assert a3 is not None and a3.generation.generation_id == "a3"
        kept = a._caches.prompts.peek(("prompt", "", "c"))
        assert kept is not None and kept[0] == audit_key(a3.generation)

    asyncio.run(scenario())


def test_a_prompt_too_large_to_keep_is_read_each_time(
    executor: CountingExecutor, store: CountingStore
) -> None:
    worker = servicer(executor, store)

    async def scenario() -> None:
        for n in range(3):
            await shifted(worker, "big", PROMPT_BLOCKS_KEPT + 10, f"g{n}")
        # the first on a thread (the profile's first use), then on the loop
        assert store.audit_reads == 3 and executor.handed == 1
        assert worker._caches.prompts.peek(("prompt", "", "big")) is None
        assert store.outcomes == [None] * 3

    asyncio.run(scenario())


def test_a_deleted_chat_is_forgotten(executor: CountingExecutor, store: CountingStore) -> None:
    worker = servicer(executor, store)

    async def scenario() -> None:
        await shifted(worker, "c", 20, "g1")
        begin_call_stats()
        await worker.DeleteChat(pb.DeleteChatRequest(chat_id="c"))
        assert worker._caches.prompts.peek(("prompt", "", "c")) is None
        await shifted(worker, "c", 20, "g2")  # read again: none, so made on none
        assert [r.made_on for r in store.records] == [None, None] and store.outcomes == [None, None]

    asyncio.run(scenario())


def prompts_counted(source: str) -> float:
    return (
        REGISTRY.get_sample_value("contextshift_chat_prompts_total", {"worker": "0", "source": source}) or 0.0
    )


@pytest.fixture
def counted() -> Iterator[Callable[[], dict[str, float]]]:
    """What the chat-prompt counter added since the fixture began, by source."""
    before = {source: prompts_counted(source) for source in ("warm", "cold", "new")}
    yield lambda: {source: prompts_counted(source) - before[source] for source in before}


def test_each_worker_counts_where_a_chats_last_prompt_was_found(
    executor: CountingExecutor, store: CountingStore, counted: Callable[[], dict[str, float]]
) -> None:
    """What an operator reads affinity from (contextshift_chat_prompts_total, by worker)."""
    a, b = servicer(executor, store), servicer(executor, store)

    async def scenario() -> None:
        await shifted(a, "c", 20, "a1")  # new: the store holds none
        await shifted(a, "c", 21, "a2")  # warm: a served it last
        await shifted(b, "c", 22, "b1")  # cold: b reads a's audit

    asyncio.run(scenario())
    assert counted() == {"warm": 1.0, "cold": 1.0, "new": 1.0}
    metrics.set_worker(1)
    try:
        asyncio.run(shifted(b, "c", 23, "b2"))  # labelled with the worker's index
    finally:
        metrics.set_worker(0)
    assert (
        REGISTRY.get_sample_value("contextshift_chat_prompts_total", {"worker": "1", "source": "warm"}) == 1.0
    )
