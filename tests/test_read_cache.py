"""The server's cache of model reads: kept for `store_cache_seconds` (absent ones too), bounded,
dropped when a configuration changes, serving on while the store is down. (A chat's last prompt:
tests/test_warm_chats.py.)"""

from __future__ import annotations

import time

import pytest

from contextshift.api.service.read_cache import CacheMiss, ReadCache
from contextshift.audit.sqlite import SqliteStore
from contextshift.audit.store import StoreUnavailable


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
