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
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Callable
from typing import TypeGuard

from contextshift.audit.store import ShiftRecord, Store

log = logging.getLogger("contextshift.store")

# Records one transaction takes at most (the calls a process has in flight are bounded anyway).
MAX_GROUP = 256
# The writer thread's name (benchmarks/audit_cost.py reads its CPU by it).
WRITER_THREAD = "contextshift-writer"
# None: the record is stored; else why not (a StoreError, or what making the record raised).
WriteOutcome = Exception | None


# What a call hands the writer: how to make its record, and whom to tell.
Queued = tuple[Callable[[], ShiftRecord | None], Callable[[WriteOutcome], None]]
_STOP = None
# A writer thread, and the id of the process that started it.
_Started = tuple[int, threading.Thread]


class GroupWriter:
    """The process's writer of shift records (see the module's doc). Its thread starts with the
    first record a process hands it (a forked worker starts its own)."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._queue: queue.SimpleQueue[Queued | None] = queue.SimpleQueue()
        self._lock = threading.Lock()  # held to start or stop the thread
        # Replaced whole, so one read of it without the lock (on each write) is consistent.
        self._thread: _Started | None = None

    def write(self, make: Callable[[], ShiftRecord | None], done: Callable[[WriteOutcome], None]) -> None:
        """Stores the record `make()` gives, on the writer thread, in the next group; then calls
        `done` there with None (stored) or why not (a StoreError, or what `make` raised). When
        `make` returns None (its call gave up before the write) nothing is stored, and `done` is
        not called."""
        if not _started_here(self._thread):
            self._start()
        self._queue.put((make, done))

    def _start(self) -> None:
        with self._lock:
            if not _started_here(self._thread):
                thread = threading.Thread(target=self._run, name=WRITER_THREAD, daemon=True)
                thread.start()
                self._thread = (os.getpid(), thread)

    def close(self) -> None:
        """Stores what is queued, then stops the thread (the store may close after)."""
        with self._lock:
            thread, self._thread = self._thread, None
        if _started_here(thread):
            self._queue.put(_STOP)
            thread[1].join()

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
                _settle(item, e)
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
            _settle(item, outcome)


def _started_here(started: _Started | None) -> TypeGuard[_Started]:
    """Whether `started` is this process's writer thread: a forked child inherits its parent's
    pair but not the thread, and starts its own."""
    return started is not None and started[0] == os.getpid()


def _settle(item: Queued, outcome: WriteOutcome) -> None:
    try:
        item[1](outcome)
    except Exception:  # the writer thread must outlive any caller's callback
        log.exception("a shift's write could not be reported to its call")
