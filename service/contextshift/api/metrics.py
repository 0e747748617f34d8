"""Prometheus metrics of the server, correct across worker processes.

`contextshift serve` keeps prometheus_client's multiprocess files in a temporary directory of its
own (`use_directory`, before any worker starts; removed when the server exits), every worker
writes its samples there, and `/metrics` on any worker reads them all. When a worker exits its
live-only gauges are dropped (`worker_exited`).

Labels carry only names the server defines or registers (surface, RPC or route template, status,
strategy, diagnostic event, fallback cause, store operation, worker index), never message content,
chat ids or tenants.

The store's gauges (its size, its chats, the free disk under it) are read from the store when
`/metrics` is read, at most every `STORE_READ_SECONDS` per process: a store that nobody watches is
never asked.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from prometheus_client import (
    CONTENT_TYPE_PLAIN_0_0_4,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
    values,
)

from contextshift import profiles
from contextshift.audit import bounds
from contextshift.audit.store import (
    CoreGroups,
    CoreOutcome,
    ShiftRecord,
    Store,
    StoreError,
    StoreFull,
    StoreTimeout,
)
from contextshift.diagnostics import Diagnostic, is_fallback

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4  # what generate_latest writes

# Latency from a fraction of a millisecond (a small shift inline) to seconds (a first tokenizer load).
_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

REQUESTS = Counter(
    "contextshift_requests",
    "Calls answered, by surface (grpc, http), RPC or route, and status (gRPC code name or HTTP status).",
    ["surface", "method", "status"],
)
LATENCY = Histogram(
    "contextshift_request_duration_seconds",
    "Time from a call's start to its answer, by surface and RPC or route.",
    ["surface", "method"],
    buckets=_LATENCY_BUCKETS,
)
# A shift's own time, from a tenth of a millisecond (a short chat) up.
_SHIFT_BUCKETS = (0.0001, 0.00025, *_LATENCY_BUCKETS)
SHIFT_LATENCY = Histogram(
    "contextshift_shift_duration_seconds",
    "The shift's own time in a successful ShiftContext or PreviewContext call, by surface and RPC or "
    "route: reading the blocks, counting, the strategy (an LLM's answer included) and encoding the "
    "plan, without the store's reads. The rest of contextshift_request_duration_seconds is the "
    "serving around it: gRPC or HTTP, the hop to an engine thread, the audit's write.",
    ["surface", "method"],
    buckets=_SHIFT_BUCKETS,
)
BLOCKS = Counter("contextshift_blocks", "Blocks shifted or counted, by RPC.", ["method"])
TOKENS = Counter(
    "contextshift_tokens",
    "Tokens processed, by RPC: the prompt tokens of each shift, the total of each count.",
    ["method"],
)
SHIFTS = Counter("contextshift_shifts", "Successful shifts and previews, by strategy.", ["strategy"])
SHIFT_EVENTS = Counter(
    "contextshift_shift_events",
    "Diagnostics of shifts by event, e.g. LLM_FALLBACK, GROUP_EXTENDED (ContextPlan.diagnostics).",
    ["event"],
)
FALLBACKS = Counter(
    "contextshift_fallbacks",
    "Shifts and previews whose strategy failed and fell back to truncate, by strategy and cause (the "
    "diagnostic's event: LLM_FALLBACK, PLUGIN_ERROR, PLUGIN_TIMEOUT, PLUGINS_SATURATED, PLAN_REJECTED, "
    "PLAN_INVALID).",
    ["strategy", "cause"],
)
BUDGET_EXCEEDED = Counter(
    "contextshift_budget_exceeded",
    "Shifts refused with TOKEN_BUDGET_EXCEEDED (protected blocks alone over the budget), by RPC.",
    ["method"],
)
COUNT_CACHE_LOOKUPS = Counter(
    "contextshift_count_cache_lookups",
    "Lookups in the token count cache, by result (hit, miss); the hit ratio is hit / (hit + miss).",
    ["result"],
)
COUNT_CACHE_HIT_RATIO = Gauge(
    "contextshift_count_cache_hit_ratio",
    "Hit ratio of each live worker's token count cache since the worker started.",
    ["cache"],
    multiprocess_mode="liveall",
)
BLOCK_CACHE_HIT_RATIO = Gauge(
    "contextshift_block_cache_hit_ratio",
    "Hit ratio of each live worker's block cache (blocks read from JSON, found again by their text) "
    "since the worker started.",
    ["cache"],
    multiprocess_mode="liveall",
)
STORE_LATENCY = Histogram(
    "contextshift_store_operation_duration_seconds",
    "Time the audit store takes per operation (e.g. put_audit, get_audit, delete_chat), observed by "
    "the store through `observe_store`.",
    ["operation"],
    buckets=_LATENCY_BUCKETS,
)

STORE_GROUPS = Histogram(
    "contextshift_store_group_records",
    "Shifts stored per transaction by the group writer, by backend: the calls whose records queued "
    "while the previous transaction committed go together.",
    ["backend"],
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
)


# The store as /metrics reads it, by backend (sqlite, postgresql): the same values whichever worker
# read them, so the last read wins.
STORE_BYTES = Gauge(
    "contextshift_store_bytes",
    "The data the store holds, as max_store_bytes counts it (SQLite: its pages in use; PostgreSQL: "
    "its audits' and history blocks' bytes).",
    ["backend"],
    multiprocess_mode="livemostrecent",
)
STORE_MAX_BYTES = Gauge(
    "contextshift_store_max_bytes",
    "max_store_bytes: new audits and appended blocks are refused past it (absent: no limit).",
    ["backend"],
    multiprocess_mode="livemostrecent",
)
STORE_CHATS = Gauge(
    "contextshift_store_chats",
    "Chats with an audit or a stored history.",
    ["backend"],
    multiprocess_mode="livemostrecent",
)
STORE_DISK_FREE = Gauge(
    "contextshift_store_disk_free_bytes",
    "SQLite: free bytes on the filesystem that holds the store (new data is refused when it would "
    "leave less than store_reserve_bytes).",
    ["backend"],
    multiprocess_mode="livemostrecent",
)
STORE_UP = Gauge(
    "contextshift_store_up",
    "1 when /metrics last read the store, 0 when the store could not be read.",
    ["backend"],
    multiprocess_mode="livemostrecent",
)
STORE_READY = Gauge(
    "contextshift_store_ready",
    "1 while the store answers the readiness probe within store_timeout_ms, 0 while it does not "
    "(then /readyz answers 503 and gRPC health NOT_SERVING); the least of the live workers.",
    ["backend"],
    multiprocess_mode="livemin",
)
STORE_TIMEOUTS = Counter(
    "contextshift_store_timeouts",
    "Store calls ended past store_timeout_ms (or their call's deadline, when sooner), answered "
    "UNAVAILABLE, by operation (record_shifts: a group writer's whole transaction).",
    ["operation"],
)
STORE_REFUSALS = Counter(
    "contextshift_store_full",
    "Writes refused for want of room, by cause: max_store_bytes, store_reserve_bytes (SQLite: the "
    "free disk down to the reserve), disk (the database found its disk full).",
    ["cause"],
)
CHATS_DELETED = Counter(
    "contextshift_chats_deleted",
    "Chats deleted, by what deleted them: request (DeleteChat), retention (chat_retention_days).",
    ["by"],
)
RESHIFTS = Counter(
    "contextshift_reshifts",
    "ShiftContext calls of a chat made again because their write found the chat's audit changed "
    "since the prompt they were made against (another worker or replica shifted the chat), by backend "
    "and worker.",
    ["backend", "worker"],
)
# Where a chat's shift found the chat's last prompt, by worker (the index `contextshift serve` gave
# it): affinity at work shows as warm hits, and a worker taking chats over as cold reads.
CHAT_PROMPTS = Counter(
    "contextshift_chat_prompts",
    "ShiftContext calls of a chat by where their worker found the chat's last prompt: warm (in its "
    "memory: it served the chat last), cold (read from the store: another worker or replica served "
    "the chat last, or this one forgot it), new (the store has none: the chat's first shift).",
    ["worker", "source"],
)
# The gateway (api/gateway): its fitted calls by endpoint (chat_completions, responses, messages)
# and the configured upstream's name; count_tokens and models are in REQUESTS only.
GATEWAY_CALLS = Counter(
    "contextshift_gateway_calls",
    "Gateway calls answered, by endpoint, upstream and status: the provider's status relayed, or the "
    "gateway's own (400, 404, 413, 429, 502, 504, ...); 499 when the caller went away before the "
    "answer ended.",
    ["endpoint", "upstream", "status"],
)
GATEWAY_DURATION = Histogram(
    "contextshift_gateway_call_duration_seconds",
    "Time from a gateway call's start to its answer's end (a stream's last event), by endpoint and upstream.",
    ["endpoint", "upstream"],
    buckets=(*_LATENCY_BUCKETS, 30.0, 60.0, 120.0, 300.0),
)
GATEWAY_FIRST_BYTE = Histogram(
    "contextshift_gateway_upstream_first_byte_seconds",
    "Time from sending a request upstream to the upstream's answer headers, by endpoint and upstream.",
    ["endpoint", "upstream"],
    buckets=(*_LATENCY_BUCKETS, 30.0, 60.0, 120.0, 300.0),
)
GATEWAY_STREAMS = Gauge(
    "contextshift_gateway_streams_in_flight",
    "Upstream answers being relayed now, by endpoint; the sum over the live workers.",
    ["endpoint"],
    multiprocess_mode="livesum",
)
GATEWAY_SATURATED = Counter(
    "contextshift_gateway_saturated",
    "Gateway calls refused with 429 because upstream_max_concurrent upstream calls were in flight, by upstream.",
    ["upstream"],
)
STORE_READ_SECONDS = 10.0
# The bound of those reads (a count of every chat may take longer than a call's bound).
STORE_READ_BOUND_SECONDS = 30.0


@dataclass
class _WatchedStore:
    store: Store
    max_bytes: int | None
    read_at: float = -math.inf
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass
class _State:
    directory: str | None = None  # the multiprocess files, once `use_directory` was called
    # The process's count cache counters as last seen, so each call adds only what is new.
    cache_hits: int = 0
    cache_misses: int = 0
    block_lookups: int = 0  # the block cache's hits + misses as last seen
    store: _WatchedStore | None = None  # what the store's gauges read
    worker: str = "0"  # the serving process's index among the workers (`set_worker`)


_state = _State()


def set_worker(index: int) -> None:
    """The worker index this process's per-worker metrics are labelled with (a forked worker's)."""
    _state.worker = str(index)


def use_directory(path: str) -> None:
    """Every metric written from now on, in this process and the workers it forks, goes to the
    multiprocess files in `path` (an empty directory). Call before any sample is written."""
    # What prometheus_client chooses at import when PROMETHEUS_MULTIPROC_DIR is set; the server
    # makes its directory after the import, so it chooses here (its files are then made in the
    # directory the variable names).
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = path
    values.ValueClass = values.MultiProcessValue()  # type: ignore[no-untyped-call]
    _state.directory = path
    _child.cache_clear()  # children made before hold values of the other kind


def directory() -> str | None:
    """Where the workers' metrics meet (None when not serving through `contextshift serve`)."""
    return _state.directory


def worker_exited(pid: int) -> None:
    """Drops the live-only gauges of a worker that exited."""
    if _state.directory is not None:
        multiprocess.mark_process_dead(pid, _state.directory)  # type: ignore[no-untyped-call]


def watch_store(store: Store, *, max_bytes: int | None) -> None:
    """The store whose size, chats and disk `/metrics` reports (see the module's doc)."""
    _state.store = _WatchedStore(store, max_bytes)


def _read_store() -> None:
    """Refreshes the store's gauges unless this process read them in the last few seconds."""
    watched = _state.store
    if watched is None:
        return
    with watched.lock:
        if time.monotonic() - watched.read_at < STORE_READ_SECONDS:
            return
        watched.read_at = time.monotonic()
    backend = watched.store.dialect
    try:
        usage = bounds.with_bound(STORE_READ_BOUND_SECONDS, watched.store.usage)
    except StoreError:
        _child(STORE_UP, backend).set(0)
        return
    _child(STORE_UP, backend).set(1)
    _child(STORE_BYTES, backend).set(usage.data_bytes)
    _child(STORE_CHATS, backend).set(usage.chats)
    if watched.max_bytes is not None:
        _child(STORE_MAX_BYTES, backend).set(watched.max_bytes)
    if usage.disk_free_bytes is not None:
        _child(STORE_DISK_FREE, backend).set(usage.disk_free_bytes)


def render() -> bytes:
    """The text exposition of every worker's metrics (or of this process's, without a directory),
    the store's gauges read first (on the caller's thread: it may wait for the store)."""
    _read_store()
    if _state.directory is None:
        return generate_latest(REGISTRY)
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=_state.directory)  # type: ignore[no-untyped-call]
    return generate_latest(registry)


def _added(now: int, before: int) -> int:
    return now - before if now >= before else now  # the cache was cleared and counts again from 0


M = TypeVar("M", Counter, Gauge, Histogram)
T = TypeVar("T")


@functools.lru_cache(maxsize=4096)  # label values are few: RPCs, routes, statuses, strategies, events
def _child(metric: M, *labels: str) -> M:
    """`metric.labels(*labels)`, looked up once: the lookup costs as much as the increment."""
    return metric.labels(*labels)


def record_call(
    surface: str,
    method: str,
    status: str,
    seconds: float,
    *,
    blocks: int | None,
    tokens: int | None,
    shift_seconds: float | None,
) -> None:
    """One call answered (`shift_seconds`: its shift's own time, for a shift or preview)."""
    _child(REQUESTS, surface, method, status).inc()
    _child(LATENCY, surface, method).observe(seconds)
    if shift_seconds is not None:
        _child(SHIFT_LATENCY, surface, method).observe(shift_seconds)
    if blocks is not None:
        _child(BLOCKS, method).inc(blocks)
    if tokens is not None:
        _child(TOKENS, method).inc(tokens)
    stats = profiles.cache_stats()
    if (stats.hits, stats.misses) != (_state.cache_hits, _state.cache_misses):
        _child(COUNT_CACHE_LOOKUPS, "hit").inc(_added(stats.hits, _state.cache_hits))
        _child(COUNT_CACHE_LOOKUPS, "miss").inc(_added(stats.misses, _state.cache_misses))
        _state.cache_hits, _state.cache_misses = stats.hits, stats.misses
        _child(COUNT_CACHE_HIT_RATIO, "count").set(stats.hit_ratio)
    block_cache = profiles.block_cache_stats()
    if block_cache.hits + block_cache.misses != _state.block_lookups:
        _state.block_lookups = block_cache.hits + block_cache.misses
        _child(BLOCK_CACHE_HIT_RATIO, "block").set(block_cache.hit_ratio)


def record_shift(strategy: str, diagnostics: list[Diagnostic]) -> None:
    """A successful shift or preview."""
    _child(SHIFTS, strategy).inc()
    for diagnostic in diagnostics:
        _child(SHIFT_EVENTS, diagnostic.event).inc()
        # The event code, not the detail: the detail has numbers (a status, a timeout) and names.
        if is_fallback(diagnostic):
            _child(FALLBACKS, strategy, diagnostic.event).inc()


def record_budget_exceeded(method: str) -> None:
    _child(BUDGET_EXCEEDED, method).inc()


def record_reshift(backend: str) -> None:
    _child(RESHIFTS, backend, _state.worker).inc()


def record_chat_prompt(source: str) -> None:
    """Where a chat's shift found its last prompt: `warm`, `cold` or `new` (see CHAT_PROMPTS)."""
    _child(CHAT_PROMPTS, _state.worker, source).inc()


def record_store_ready(backend: str, ready: bool) -> None:
    """The readiness probe's finding (`api.readiness`)."""
    _child(STORE_READY, backend).set(1 if ready else 0)


def record_gateway_call(endpoint: str, upstream: str, status: str, seconds: float) -> None:
    """A gateway call answered (its answer ended, or its caller went away)."""
    _child(GATEWAY_CALLS, endpoint, upstream, status).inc()
    _child(GATEWAY_DURATION, endpoint, upstream).observe(seconds)


def record_upstream_first_byte(endpoint: str, upstream: str, seconds: float) -> None:
    _child(GATEWAY_FIRST_BYTE, endpoint, upstream).observe(seconds)


def gateway_streams(endpoint: str, change: int) -> None:
    """An answer's relay began (+1) or ended (-1)."""
    _child(GATEWAY_STREAMS, endpoint).inc(change)


def record_gateway_saturated(upstream: str) -> None:
    _child(GATEWAY_SATURATED, upstream).inc()


def record_deleted_chats(by: str, count: int = 1) -> None:
    """Chats deleted, `by` a request (DeleteChat) or the retention."""
    _child(CHATS_DELETED, by).inc(count)


@contextlib.contextmanager
def observe_store(operation: str) -> Iterator[None]:
    """Times one audit store operation into contextshift_store_operation_duration_seconds:
    `with metrics.observe_store("get_audit"): ...`."""
    start = time.perf_counter()
    try:
        yield
    finally:
        _child(STORE_LATENCY, operation).observe(time.perf_counter() - start)


def _timed(name: str, operation: Callable[..., T]) -> Callable[..., T]:
    """`operation` timed under `name`, its refusals for want of room and its timeouts counted."""

    @functools.wraps(operation)
    def timed(*args: Any, **kwargs: Any) -> T:
        with observe_store(name):
            try:
                return operation(*args, **kwargs)
            except StoreFull as e:
                _child(STORE_REFUSALS, e.cause.value).inc()
                raise
            except StoreTimeout:
                _child(STORE_TIMEOUTS, name).inc()
                raise

    return timed


class _TimedStore:
    """A store whose every call is timed into contextshift_store_operation_duration_seconds, under
    the method's name (audit, record_shifts, finish, history, ...), whose refusals for want of
    room are counted into contextshift_store_full_total (raised, or among `record_shifts`'
    outcomes), and whose calls past their bound into contextshift_store_timeouts_total."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._record_shifts = _timed("record_shifts", store.record_shifts)

    def record_shifts(self, records: Sequence[ShiftRecord]) -> list[StoreError | None]:
        """Timed as every call; the group's size observed, and the refusals among its outcomes
        counted."""
        _child(STORE_GROUPS, self._store.dialect).observe(len(records))
        outcomes = self._record_shifts(records)
        for outcome in outcomes:
            if isinstance(outcome, StoreFull):
                _child(STORE_REFUSALS, outcome.cause.value).inc()
        return outcomes

    def core_groups(self) -> CoreGroups | None:
        """The store's group commits outside Python, each group's size and seconds observed as
        `record_shifts`' are, and their calls past the bound counted."""
        groups = self._store.core_groups()
        return None if groups is None else _TimedCoreGroups(groups)

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._store, name)
        if not callable(attribute):
            return attribute
        timed = _timed(name, attribute)
        setattr(self, name, timed)  # wrapped once: __getattr__ runs only for names not yet set
        return timed


class _TimedCoreGroups:
    """`CoreGroups` observed (see `_TimedStore.core_groups`)."""

    def __init__(self, groups: CoreGroups) -> None:
        self._groups = groups
        self.dialect = groups.dialect
        self.fileno = groups.fileno
        self.submit = groups.submit
        self.submit_read = groups.submit_read
        self.stop = groups.stop

    def finished(self) -> tuple[list[tuple[int, CoreOutcome]], list[tuple[int, float]]]:
        records, groups = self._groups.finished()
        for size, seconds in groups:
            _child(STORE_GROUPS, self.dialect).observe(size)
            _child(STORE_LATENCY, "record_shifts").observe(seconds)
        for _, outcome in records:
            if isinstance(outcome, StoreTimeout):
                _child(STORE_TIMEOUTS, "record_shifts").inc()
        return records, groups


def timed_store(store: Store) -> Store:
    """`store` with each operation timed (see `observe_store`)."""
    return cast(Store, _TimedStore(store))
