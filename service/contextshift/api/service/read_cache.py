"""Recent store reads a shift needs often and that change rarely: model configurations and
calibration factors, per tenant, kept by each server process for `store_cache_seconds`.

A request naming a model would otherwise read the store on every call, and no store call runs on
the event loop: the hop to a thread costs more than a small shift's engine work. With the reads in
memory, such a shift runs on the event loop again. This process's own writes (SetModelConfig,
DeleteModelConfig, FinishGeneration's calibration) update the cache at once; another worker's or
replica's reach it within `store_cache_seconds`. While the store cannot be read, the values last
read serve on (a preview naming a model keeps working through a database outage). Thread-safe,
bounded.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")
# Entries kept at most (tenants times models: clients choose the strings).
MAX_ENTRIES = 4096


class CacheMiss(Exception):
    """A read the cache does not hold (fresh), asked of a view that may not touch the store."""


class ReadCache:
    def __init__(self, seconds: float, max_entries: int = MAX_ENTRIES) -> None:
        self._seconds = seconds
        self._max_entries = max_entries
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple[Any, ...], tuple[float, Any]] = OrderedDict()

    @property
    def enabled(self) -> bool:
        return self._seconds > 0

    def _fresh(self, key: tuple[Any, ...]) -> tuple[float, Any] | None:
        now = time.monotonic()
        with self._lock:
            entry = self._entries.get(key)
        return entry if entry is not None and entry[0] > now else None

    def peek(self, key: tuple[Any, ...]) -> Any | None:
        """The value under `key` if cached and fresh."""
        entry = self._fresh(key)
        return entry[1] if entry is not None else None

    def get(
        self,
        key: tuple[Any, ...],
        read: Callable[[], T] | None,
        *,
        stale_on: type[Exception] | None = None,
    ) -> T:
        """The value under `key` (None included): cached and fresh, else `read()` (then cached);
        with no `read`, `CacheMiss`. When `read` raises `stale_on` (the store is down), the value
        last read, however old, if there is one."""
        entry = self._fresh(key)
        if entry is not None:
            cached: T = entry[1]
            return cached
        if read is None:
            raise CacheMiss(key)
        try:
            value = read()
        except Exception as e:
            if stale_on is None or not isinstance(e, stale_on):
                raise
            with self._lock:
                kept = self._entries.get(key)
            if kept is None:
                raise
            stale: T = kept[1]
            return stale
        self.put(key, value)
        return value

    def put(self, key: tuple[Any, ...], value: Any) -> None:
        if not self.enabled:
            return
        with self._lock:
            self._entries.pop(key, None)
            self._entries[key] = (time.monotonic() + self._seconds, value)
            while len(self._entries) > self._max_entries:
                self._entries.popitem(last=False)

    def drop(self, key: tuple[Any, ...]) -> None:
        with self._lock:
            self._entries.pop(key, None)

    def forget(self, kind: str) -> None:
        """Drops every entry of `kind` (a model configuration changed: any tenant may fall back to
        the server-wide one, so all of them go)."""
        with self._lock:
            for key in [k for k in self._entries if k[0] == kind]:
                del self._entries[key]
