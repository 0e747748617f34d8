"""The server's caches of store reads: model reads kept for `store_cache_seconds` (absent ones too),
bounded, dropped when a configuration changes, serving on while the store is down; a chat's last prompt kept as its audit records it,
and read afresh once another process replaced that audit."""

from __future__ import annotations

import json
import time

import pytest

from contextshift._proto.contextshift.v1 import context_service_pb2 as pb
from contextshift.api.service import audits
from contextshift.api.service.read_cache import CacheMiss, ReadCache
from contextshift.api.service.servicer import ContextShiftService
from contextshift.api.service.store_view import Caches, TenantStore
from contextshift.audit.sqlite import SqliteStore
from contextshift.audit.store import StoreUnavailable
from contextshift.budget import Budget


@pytest.fixture
def store(sqlite_store: SqliteStore) -> SqliteStore:
    return sqlite_store


def test_reads_are_kept_for_their_time_absent_ones_too() -> None:
    cache = ReadCache(0.2)
    reads: list[str] = []

    def read() -> None:
        reads.append("read")

    assert cache.get(("config", "t", "m"), read) is None
    assert cache.get(("config", "t", "m"), read) is None
    assert reads == ["read"]
    time.sleep(0.25)
    with pytest.raises(CacheMiss):
        cache.get(("config", "t", "m"), None)


def test_while_the_store_is_down_the_last_read_serves_on() -> None:
    cache = ReadCache(0.05)
    assert cache.get(("config", "t", "m"), lambda: "stored") == "stored"
    time.sleep(0.1)

    def down() -> str:
        raise StoreUnavailable("the database is down")

    assert cache.get(("config", "t", "m"), down, stale_on=StoreUnavailable) == "stored"  # however old
    with pytest.raises(StoreUnavailable):
        cache.get(("config", "t", "m"), down)  # only for what the caller names
    with pytest.raises(StoreUnavailable):
        cache.get(("config", "t", "never-read"), down, stale_on=StoreUnavailable)
    assert cache.get(("config", "t", "m"), lambda: "changed", stale_on=StoreUnavailable) == "changed"


def test_the_cache_is_bounded_and_forgets_a_kind() -> None:
    cache = ReadCache(60, max_entries=2)
    for model in ("a", "b", "c"):
        cache.put(("factor", "t", model), 1.5)
    cache.put(("config", "t", "c"), None)
    assert cache.peek(("factor", "t", "a")) is None  # the oldest went
    cache.forget("config")
    with pytest.raises(CacheMiss):
        cache.get(("config", "t", "c"), None)
    assert cache.get(("factor", "t", "c"), None) == 1.5


def test_off_keeps_nothing() -> None:
    cache = ReadCache(0)
    cache.put(("factor", "t", "m"), 2.0)
    with pytest.raises(CacheMiss):
        cache.get(("factor", "t", "m"), None)


def chat(turns: int) -> bytes:
    blocks = [{"id": "sys", "role": "system", "content": "Be brief."}]
    for i in range(turns):
        blocks.append({"id": f"m{i}", "role": "user" if i % 2 == 0 else "assistant", "content": "word " * 80})
    return json.dumps(blocks).encode()


def test_a_chats_last_prompt_is_kept_as_its_audit_records_it(store: SqliteStore) -> None:
    servicer = ContextShiftService(None, Budget(), store)  # type: ignore[arg-type]
    caches = Caches(ReadCache(0))
    view = TenantStore(store, "", caches)
    request = pb.ShiftContextRequest(chat_id="c", context_limit=600, response_reserve=0)
    blocks = chat(20)
    servicer._shift_and_record(view, request, blocks, "g1", audits.AuditWrite())
    stored = store.audit("", "c")
    assert stored is not None
    kept = caches.prompts.peek(("prompt", "", "c"))
    assert kept == (("g1", stored.generation.created_ms), audits.previous_prompt(stored))
    assert kept[1].excluded  # the budget cut: a cut to carry
    assert view.previous_prompt("c") == kept[1]

    # Another process's shift replaces the audit: the kept prompt is stale and read afresh.
    other = TenantStore(store, "", Caches(ReadCache(0)))
    servicer._shift_and_record(other, request, chat(24), "g2", audits.AuditWrite())
    replaced = store.audit("", "c")
    assert replaced is not None
    fresh = view.previous_prompt("c")
    assert fresh == audits.previous_prompt(replaced) != kept[1]
    assert caches.prompts.peek(("prompt", "", "c")) == (("g2", replaced.generation.created_ms), fresh)
