"""Group commit: one thread per process stores the shifts' records (their generations and audits).

A call hands its record to `GroupWriter.write` and waits for its `done`; the writer thread takes
every record queued, stores them all in one transaction (`Store.record_shifts`), and calls each
one's `done` after the commit, with its own outcome. The records of the calls that arrive while a
transaction commits queue up and go together in the next, so the busier the process, the more
records a commit carries: a transaction's fixed cost (SQLite's write lock and WAL append,
PostgreSQL's round trips and commit) is paid once per group, not once per call, and the calls
never queue for the write lock one by one.

A call's `done` comes only after the transaction that stored its record committed: a reply sent
from it is never lost to a crash of the process after it (SQLite's WAL, PostgreSQL's commit).

Where the store commits groups outside Python (`Store.core_groups`: SQLite and PostgreSQL), a record
written from the event loop is made there at once and handed to them instead: their own thread
commits it with whatever else queued, without the GIL, and the loop reads the outcomes when their
socket says so, and calls each `done` there. A record written from a thread, for a call that waits on
the event loop, is made on the thread and handed to that loop, which writes it so. The Python
thread then only writes what they decline (see `contextshift.audit.sqlite` and `.postgres`) and
what is written from other loops or with no loop to wait on.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeGuard

from contextshift.audit.store import DECLINED, AuditRead, CoreGroups, ShiftRecord, Store

log = logging.getLogger("contextshift.store")

# Records one transaction takes at most (the calls a process has in flight are bounded anyway).
MAX_GROUP = 256
# The writer thread's name (benchmarks/audit_cost.py reads its CPU by it), and the name of the
# core's thread that commits a store's groups (rust_ext/core/src/store_group.rs).
WRITER_THREAD = "contextshift-writer"
CORE_WRITER_THREAD = "cs-core-writer"
# None: the record is stored; else why not (a StoreError, or what making the record raised).
WriteOutcome = Exception | None


# What a call hands the writer: how to make its record, and whom to tell.
Queued = tuple[Callable[[], ShiftRecord | None], Callable[[WriteOutcome], None]]
_STOP = None
# A writer thread, and the id of the process that started it.
_Started = tuple[int, threading.Thread]
# How long `close` waits for the event loop to read the core's last outcomes.
CLOSE_WAIT_SECONDS = 10.0


@dataclass
class _Core:
    """A process's group commits outside Python (None: its store has none), read on `loop`, and
    the records they hold: by token, each with whom to tell."""

    pid: int
    groups: CoreGroups | None
    loop: asyncio.AbstractEventLoop | None
    waiting: dict[int, tuple[ShiftRecord, Callable[[WriteOutcome], None]]] = field(default_factory=dict)
    reading: dict[int, asyncio.Future[AuditRead | None]] = field(default_factory=dict)


class GroupWriter:
    """The process's writer of shift records (see the module's doc). Its thread starts with the
    first record a process hands it (a forked worker starts its own)."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._queue: queue.SimpleQueue[Queued | None] = queue.SimpleQueue()
        self._lock = threading.Lock()  # held to start or stop the thread
        # Replaced whole, so one read of it without the lock (on each write) is consistent.
        self._thread: _Started | None = None
        self._core: _Core | None = None  # used on its event loop only (and by `close`)
        # A forked child's inherited core commits: never used, never stopped (their thread is the
        # parent's), and kept so that nothing closes the parent's connection in the child.
        self._inherited: list[_Core] = []
        self._tokens = itertools.count()

    def write(
        self,
        make: Callable[[], ShiftRecord | None],
        done: Callable[[WriteOutcome], None],
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        """Stores the record `make()` gives, on the writer thread, in the next group; then calls
        `done` there with None (stored) or why not (a StoreError, or what `make` raised). When
        `make` returns None (its call gave up before the write) nothing is stored, and `done` is
        not called. From the event loop, over a store that commits groups outside Python, `make`
        runs at once and `done` later on the loop (see the module's doc); from a thread, with the
        event `loop` its call waits on, `make` runs at once and the record is handed to that loop,
        which writes it so."""
        core = self._core
        no_core = core is not None and core.pid == os.getpid() and core.groups is None
        if loop is not None and not no_core and running_loop() is None:
            self._write_on(loop, make, done)
            return
        core = self._core_here()
        if core is None or core.groups is None:
            self._put(make, done)
            return
        record = _made_now(make, done)
        if record is None:
            return
        token = next(self._tokens)
        core.waiting[token] = (record, done)
        if not core.groups.submit(token, record):
            del core.waiting[token]
            self._put(_made(record), done)

    def commits_outside_python(self) -> bool:
        """On the event loop: whether a record written from here goes to the store's commits
        outside Python, whose thread takes whatever has queued whenever it is free (so nothing is
        gained by holding a record back to hand it over with others)."""
        core = self._core_here()
        return core is not None and core.groups is not None

    def read_audit(self, tenant: str, chat_id: str) -> asyncio.Future[AuditRead | None] | None:
        """On the event loop: a chat's audit read by the store's commits outside Python, for a
        store whose reads would send the call to a thread (PostgreSQL); None when they do not read
        here. The future's None: not read (the store's own path must read it, and say why not); its
        exception: why the store cannot answer (StoreTimeout, StoreUnavailable)."""
        core = self._core_here()
        if core is None or core.groups is None or core.loop is None:
            return None
        token = next(self._tokens)
        read = core.reading[token] = core.loop.create_future()
        if not core.groups.submit_read(token, tenant, chat_id):
            del core.reading[token]
            return None
        return read

    def _write_on(
        self,
        loop: asyncio.AbstractEventLoop,
        make: Callable[[], ShiftRecord | None],
        done: Callable[[WriteOutcome], None],
    ) -> None:
        """`write` of a record made here (a thread), handed to `loop`: on a store that commits
        groups outside Python, that costs the loop a wake-up where the writer thread would trade
        the GIL with it at every statement (cold chats over PostgreSQL, whose shifts read the store
        on a thread: docs/benchmarks.md, "Audited path")."""
        record = _made_now(make, done)
        if record is None:
            return
        if loop.is_running():
            try:
                loop.call_soon_threadsafe(self.write, _made(record), done)
                return
            except RuntimeError:  # closed meanwhile (the server stopped)
                pass
        self._put(_made(record), done)

    def _put(self, make: Callable[[], ShiftRecord | None], done: Callable[[WriteOutcome], None]) -> None:
        """`write` on the writer thread."""
        if not _started_here(self._thread):
            self._start()
        self._queue.put((make, done))

    def _core_here(self) -> _Core | None:
        """This process's group commits outside Python, for a write from here: None on a thread,
        or on another event loop than the one they are read on (the first loop that asks)."""
        loop = running_loop()
        if loop is None:  # on a thread
            return None
        core = self._core
        if core is None or core.pid != os.getpid():
            if core is not None:
                self._inherited.append(core)
            groups = self._store.core_groups()
            core = self._core = _Core(os.getpid(), groups, loop if groups else None)
            if groups is not None:
                loop.add_reader(groups.fileno(), self._read_finished, core)
        return core if core.loop is loop else None

    def _read_finished(self, core: _Core) -> None:
        """On the event loop, when the core's socket is readable: each finished record's call is
        told, and a declined one goes to the writer thread; each read's call gets its audit."""
        if core.groups is None:
            return
        records, _ = core.groups.finished()
        for token, outcome in records:
            read = core.reading.pop(token, None)
            if read is not None:
                if read.done():  # its call gave up on it
                    continue
                if isinstance(outcome, Exception):  # no answer in time, or the store is down
                    read.set_exception(outcome)
                else:  # declined: None
                    read.set_result(outcome if isinstance(outcome, AuditRead) else None)
                continue
            record, done = core.waiting.pop(token)
            if outcome is DECLINED:
                self._put(_made(record), done)
            elif not isinstance(outcome, AuditRead):  # a record's outcome is never a read's
                _settle(done, outcome)

    def _start(self) -> None:
        with self._lock:
            if not _started_here(self._thread):
                thread = threading.Thread(target=self._run, name=WRITER_THREAD, daemon=True)
                thread.start()
                self._thread = (os.getpid(), thread)

    def close(self) -> None:
        """Stores what is queued, then stops the thread (the store may close after). Called off
        the event loop that reads the core's outcomes, it waits for the loop to read the last."""
        core = self._core
        if core is not None and core.pid == os.getpid() and core.groups is not None and core.loop is not None:
            core.groups.stop()
            self._stop_reading(core, core.loop)
        with self._lock:
            thread, self._thread = self._thread, None
        if _started_here(thread):
            self._queue.put(_STOP)
            thread[1].join()

    def _stop_reading(self, core: _Core, loop: asyncio.AbstractEventLoop) -> None:
        """The core's last outcomes read on `loop` and its socket no longer watched, from the loop
        itself or another thread (then waited for, unless the loop has stopped)."""

        def stop() -> None:
            self._read_finished(core)
            if core.groups is not None:
                loop.remove_reader(core.groups.fileno())
            stopped.set()

        stopped = threading.Event()
        if running_loop() is loop or not loop.is_running():
            stop()
        else:
            loop.call_soon_threadsafe(stop)
            stopped.wait(CLOSE_WAIT_SECONDS)

    def _run(self) -> None:
        stopping = False
        while not stopping:
            taken = [self._queue.get()]
            while len(taken) < MAX_GROUP:  # everything that queued while the last group committed
                try:
                    taken.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            stopping = _STOP in taken
            self._store_group([item for item in taken if item is not _STOP])

    def _store_group(self, items: list[Queued]) -> None:
        made: list[tuple[ShiftRecord, Queued]] = []
        for item in items:
            try:
                record = item[0]()
            except Exception as e:  # a bug in making it: that call fails, the others go on
                _settle(item[1], e)
                continue
            if record is not None:
                made.append((record, item))
        if not made:
            return
        outcomes: list[WriteOutcome]
        try:
            outcomes = list(self._store.record_shifts([record for record, _ in made]))
        except Exception as e:  # the store cannot serve: every call of the group is told why
            outcomes = [e] * len(made)
        for (_, item), outcome in zip(made, outcomes, strict=True):
            _settle(item[1], outcome)


def _started_here(started: _Started | None) -> TypeGuard[_Started]:
    """Whether `started` is this process's writer thread: a forked child inherits its parent's
    pair but not the thread, and starts its own."""
    return started is not None and started[0] == os.getpid()


def running_loop() -> asyncio.AbstractEventLoop | None:
    """The event loop running on this thread, or None (a worker thread, or no loop at all)."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _made_now(
    make: Callable[[], ShiftRecord | None], done: Callable[[WriteOutcome], None]
) -> ShiftRecord | None:
    """`make()`, here; None when its call gave up, or when making it raised (a bug: that call is
    told)."""
    try:
        return make()
    except Exception as e:
        _settle(done, e)
        return None


def _made(record: ShiftRecord) -> Callable[[], ShiftRecord]:
    """A record made already, as the writer thread takes it."""
    return lambda: record


def _settle(done: Callable[[WriteOutcome], None], outcome: WriteOutcome) -> None:
    try:
        done(outcome)
    except Exception:  # the writer thread must outlive any caller's callback
        log.exception("a shift's write could not be reported to its call")
