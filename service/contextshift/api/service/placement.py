"""Where a call's work runs: the one place that decides it.

Engine work and store calls block (the Rust core releases the GIL; sqlite3 and psycopg block), so
they run on the engine threads, and the event loop only moves bytes while the call's deadline is
watched. Two exceptions:

- A small request (at most `inline_request_bytes`) runs on the event loop, to completion, once
  this process has served its `(profile, model)` and holds in memory what it reads of the store
  (a model's configuration and calibration, a chat's last prompt), or the store can read it
  without waiting (a chat's last audit from SQLite, `Store.audit_at_once`) or its commits outside
  Python read it while the call waits on the loop (PostgreSQL's: `GroupWriter.read_audit`): its
  engine work costs less than the hop to a thread, where the engine thread and the loop would hand
  the GIL to each other at every release. A first use stays off the loop (it may load a vocabulary
  or a tokenizer.json), and so does any other read that may wait (`CacheMiss` sends the work to a
  thread).
- A shift whose strategy waits (llm-compact on its endpoint, a plugin strategy or interceptor up
  to its time limit) never runs on the loop, and runs on the I/O threads, not the engine threads.

A record to store (a shift's generation and audit) goes to the process's group writer
(`audit.writer`): from a thread at once (made there, and handed to the call's loop when the store
commits groups outside Python); from the loop at once to a store's commits outside Python (their
thread commits what queued while the loop goes on), else at the end of the loop's pass, with every
record the pass made, so the Python writer thread wakes once for them, not once for each. The
call's future is settled once the record's group is committed: on the loop, when the store commits
groups outside Python (SQLite, PostgreSQL: the loop reads their outcomes); else from the writer
thread, the futures settled since the loop last woke in one wake-up.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from contextshift import plugins
from contextshift.api.service.read_cache import CacheMiss
from contextshift.api.service.store_view import PromptMiss, TenantStore
from contextshift.audit.store import ShiftRecord
from contextshift.audit.writer import GroupWriter, Queued, WriteOutcome, running_loop
from contextshift.strategies import DEFAULT_STRATEGY, runs_inline

T = TypeVar("T")

# (profile, model) pairs a process remembers having served, so their small requests run inline;
# bounded because clients choose the strings.
MAX_SERVED_PROFILES = 1024


@dataclass(frozen=True)
class Work:
    """What decides where a call's work runs: the request's encoded size when it may run on the
    event loop (None: never), the `(profile, model)` it counts with, and whether its strategy
    waits."""

    inline_bytes: int | None = None
    profile: tuple[str, str] = ("", "")
    waits: bool = False


# Work that always runs on an engine thread (store calls, listings, benchmarks).
ON_THREAD = Work()


def shift_work(strategy: str, profile: str, model: str, size: int, *, reads_stored: bool = False) -> Work:
    """Where a shift runs: on the loop when small (see the module's doc), unless its strategy or a
    prompt interceptor waits, or it reads a chat's stored history (never cached)."""
    waits = not runs_inline(strategy or DEFAULT_STRATEGY)
    inline = not waits and not reads_stored and not plugins.interceptors()
    return Work(size if inline else None, (profile, model), waits)


class Placement:
    """The executors and the group writer a process's calls run on, and the choice among them
    (see the module's doc)."""

    def __init__(
        self,
        executor: ThreadPoolExecutor,
        io_executor: ThreadPoolExecutor | None,
        inline_request_bytes: int,
        writer: GroupWriter,
    ) -> None:
        self.executor = executor
        self._io_executor = io_executor or executor
        self._inline_request_bytes = inline_request_bytes
        self._writer = writer
        self._served: set[tuple[str, str]] = set()
        # Records handed over on an event loop during its current pass (see `write`).
        self._passing: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, list[Queued]] = (
            weakref.WeakKeyDictionary()
        )

    def _small(self, work: Work) -> bool:
        return work.inline_bytes is not None and work.inline_bytes <= self._inline_request_bytes

    def _inline(self, work: Work) -> bool:
        return self._small(work) and work.profile in self._served

    def _served_now(self, work: Work) -> None:
        """A small request's work ran off the loop: its profile is loaded now."""
        if self._small(work) and len(self._served) < MAX_SERVED_PROFILES:
            self._served.add(work.profile)

    def _executor_for(self, work: Work) -> ThreadPoolExecutor:
        return self._io_executor if work.waits else self.executor

    async def blocking(self, fn: Callable[[], T]) -> T:
        """`fn()` on an engine thread: a store call, or work that is never small."""
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn)

    async def run(self, fn: Callable[[TenantStore], T], view: TenantStore, work: Work) -> T:
        """`fn(view)`, on the event loop when `work` may run there (with the view of the process's
        memory only), else on a thread."""
        if self._inline(work):
            with contextlib.suppress(CacheMiss):  # a read this process does not hold: on a thread
                return fn(view.cached())
        loop = asyncio.get_running_loop()
        result = await loop.run_in_executor(self._executor_for(work), functools.partial(fn, view))
        self._served_now(work)
        return result

    async def run_settled(
        self, fn: Callable[[TenantStore, asyncio.Future[T]], None], view: TenantStore, work: Work
    ) -> T:
        """The result `fn(view, done)` settles `done` with, from wherever its work ends (the group
        writer's thread): `fn` runs as `run` would run it, and the call leaves the event loop once."""
        done: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        if self._inline(work):
            try:
                fn(view.cached(), done)
                return await done
            except PromptMiss as miss:  # raised before `done` was handed on
                ahead = await self._read_ahead(view, miss.chat_id)
                if ahead is not None:
                    with contextlib.suppress(CacheMiss):
                        fn(ahead, done)
                        return await done
            except CacheMiss:  # raised before `done` was handed on: on a thread
                pass

        def on_thread() -> None:
            try:
                fn(view, done)
            except BaseException as e:
                settle_soon(done, error=e)

        self._executor_for(work).submit(on_thread)
        result = await done
        self._served_now(work)
        return result

    async def _read_ahead(self, view: TenantStore, chat_id: str) -> TenantStore | None:
        """The view on the loop with the chat's audit read by the store's commits outside Python
        (PostgreSQL: the call stays on the loop, where a thread would trade the GIL with it at
        every statement); None when they do not read it (then the call goes to a thread, whose
        read says why). Raises what they say of a store that does not answer."""
        started = time.perf_counter()
        reading = self._writer.read_audit(view.tenant, chat_id)
        read = None if reading is None else await reading
        if read is None:
            return None
        ahead = view.cached({chat_id: read.audit})
        ahead.read_seconds = time.perf_counter() - started
        return ahead

    def write(
        self,
        make: Callable[[], ShiftRecord | None],
        written: Callable[[WriteOutcome], T],
        done: asyncio.Future[T],
    ) -> None:
        """Hands a record to the group writer, at once from a thread or to the store's commits
        outside Python, else from the loop with the pass's others when the pass ends: `make()`
        runs on the writer thread (None: its call gave up, nothing is stored and `done` is left
        alone), and `done` gets `written(outcome)` once the record's group is committed, or why
        not."""

        def stored(outcome: WriteOutcome) -> None:
            try:
                settle_soon(done, written(outcome))
            except BaseException as e:
                settle_soon(done, error=e)

        loop = running_loop()
        if loop is None:  # on a thread
            self._writer.write(make, stored, done.get_loop())
            return
        if self._writer.commits_outside_python():
            # Their thread commits while the loop runs the rest of its pass: the reply comes sooner
            # (docs/benchmarks.md, "What is left of SQLite's warm p50").
            self._writer.write(make, stored)
            return
        passing = self._passing.get(loop)
        if passing is None:  # the pass's first: handed over after the callbacks already due
            passing = self._passing[loop] = []
            loop.call_soon(self._hand_over, loop)
        passing.append((make, stored))

    def _hand_over(self, loop: asyncio.AbstractEventLoop) -> None:
        for make, stored in self._passing.pop(loop, ()):
            self._writer.write(make, stored)

    def submit(self, fn: Callable[[], object]) -> None:
        """`fn()` on an engine thread, unawaited (after a call ended); nothing once the server
        stopped."""
        with contextlib.suppress(RuntimeError):
            self.executor.submit(fn)


class _Wakeups:
    """Futures of one event loop settled from other threads, with one wake-up of the loop for all
    those settled since its last one: the calls of a group the writer stored wake it once."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._due: list[tuple[asyncio.Future[Any], Any, BaseException | None]] = []

    def settle(self, future: asyncio.Future[T], result: T | None, error: BaseException | None) -> None:
        with self._lock:
            self._due.append((future, result, error))
            if len(self._due) > 1:
                return  # the loop is woken already
        with contextlib.suppress(RuntimeError):  # the loop is closed: the server stopped
            self._loop.call_soon_threadsafe(self._run)

    def _run(self) -> None:
        with self._lock:
            due, self._due = self._due, []
        for future, result, error in due:
            _settle_now(future, result, error)


def _settle_now(future: asyncio.Future[T], result: T | None, error: BaseException | None) -> None:
    if future.done():  # its call gave up on it
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(cast(T, result))


_WAKEUPS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Wakeups] = weakref.WeakKeyDictionary()
_WAKEUPS_LOCK = threading.Lock()


def settle_soon(
    future: asyncio.Future[T], result: T | None = None, error: BaseException | None = None
) -> None:
    """Settles `future` from any thread, on its event loop (unless its call gave up on it): at
    once when called on that loop."""
    loop = future.get_loop()
    if running_loop() is loop:
        _settle_now(future, result, error)
        return
    with _WAKEUPS_LOCK:
        wakeups = _WAKEUPS.get(loop) or _WAKEUPS.setdefault(loop, _Wakeups(loop))
    wakeups.settle(future, result, error)
