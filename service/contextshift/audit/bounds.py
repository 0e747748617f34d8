"""How long a store call may take, and what ends one that takes longer.

A store call is bounded: by the store's own bound (the server's `store_timeout_ms`), or by the
deadline of the call that made it when that comes sooner (`caller_deadline`: the gRPC surface sets
it from the call's deadline, and `ContextExecutor` carries it to the threads that run store calls).
Past it the call raises `StoreTimeout` and what it was waiting on is broken rather than waited for:
PostgreSQL's connection has its socket shut down (`break_socket`: the thread blocked reading it
wakes with an error, and the connection is thrown away), SQLite's statement is interrupted. One
watchdog thread per process does the breaking (`watch`), so a call blocked on a network that went
silent (nothing answers, nothing is reset: TCP itself would wait for minutes) answers in time.

Some calls get a bound of their own (`own_bound`): a migration none (it may rewrite tables), the
housekeeping and the metrics' size reads a longer one than a call's.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import heapq
import itertools
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

from contextshift.audit.store import StoreTimeout

log = logging.getLogger("contextshift.store")

T = TypeVar("T")
P = ParamSpec("P")

# The caller's deadline (time.monotonic()) for the store calls made on its behalf; None: none.
_CALLER_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "contextshift_store_deadline", default=None
)
# A bound that replaces the store's own for the calls made in this context: (seconds,), or (None,)
# for no bound; None: the store's own.
_OWN_BOUND: contextvars.ContextVar[tuple[float | None] | None] = contextvars.ContextVar(
    "contextshift_store_bound", default=None
)
# How late the watchdog may break a call (its wake-ups are coalesced: a busy process registers a
# watch per store call, and most are cancelled long before they are due).
WATCHDOG_SLACK_SECONDS = 0.02


@contextmanager
def caller_deadline(at: float | None) -> Iterator[None]:
    """Store calls made in this context (and on the threads it submits work to through a
    `ContextExecutor`) end by `at` (time.monotonic()) at the latest; None: no deadline of the
    caller's."""
    token = _CALLER_DEADLINE.set(at)
    try:
        yield
    finally:
        _CALLER_DEADLINE.reset(token)


@contextmanager
def own_bound(seconds: float | None) -> Iterator[None]:
    """Store calls made in this context get `seconds` (None: no bound) instead of their store's own
    bound (a caller's deadline still applies)."""
    token = _OWN_BOUND.set((seconds,))
    try:
        yield
    finally:
        _OWN_BOUND.reset(token)


def with_bound(seconds: float | None, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """`fn(*args, **kwargs)` with its store calls bounded by `seconds` (see `own_bound`)."""
    with own_bound(seconds):
        return fn(*args, **kwargs)


@dataclass(frozen=True, slots=True)
class Deadline:
    """When a store call must be done by (time.monotonic()), and what set it."""

    at: float
    bound: float | None  # the store's bound that applied (None: none, the caller's deadline did)
    own: bool  # set by the store's own bound, not by a sooner deadline of the caller's

    def remaining(self) -> float:
        return self.at - time.monotonic()

    def timed_out(self, store: str, what: str = "did not answer") -> StoreTimeout:
        if self.own and self.bound is not None:
            why = f"within store_timeout_ms ({self.bound * 1e3:.0f} ms)"
        else:
            why = "within the call's deadline"
        return StoreTimeout(f"{store} {what} {why}")


def deadline(bound: float | None) -> Deadline | None:
    """The deadline of a store call starting now in this context, for a store whose own bound is
    `bound` seconds (None: none): the sooner of that bound (or the context's `own_bound`) and the
    caller's deadline; None when neither is set."""
    chosen = _OWN_BOUND.get()
    if chosen is not None:
        (bound,) = chosen
    caller = _CALLER_DEADLINE.get()
    if bound is None:
        return None if caller is None else Deadline(caller, None, False)
    at = time.monotonic() + bound
    if caller is not None and caller < at:
        return Deadline(caller, bound, False)
    return Deadline(at, bound, True)


class ContextExecutor(ThreadPoolExecutor):
    """A thread pool whose tasks run in a copy of the submitter's context (as asyncio.to_thread
    runs them): a caller's deadline (`caller_deadline`) reaches the store calls they make."""

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        call: Callable[[], T] = functools.partial(fn, *args, **kwargs)
        return super().submit(contextvars.copy_context().run, call)


# --- the watchdog -------------------------------------------------------------------------------


class Watch:
    """One call's watch (`watch`): `expire` runs once at its deadline unless `cancel` came first
    (or at once, when `fire` is called). Cancel before handing on what `expire` breaks, so it never
    breaks its next user's call."""

    __slots__ = ("_expire", "_lock", "at", "done", "fired", "why")

    def __init__(self, at: float, expire: Callable[[], None]) -> None:
        self.at = at
        self._expire = expire
        self._lock = threading.Lock()
        self.done = False  # fired or cancelled
        self.fired = False
        self.why: str | None = None  # why it fired before its deadline (`fire`)

    def cancel(self) -> bool:
        """Stops the watch; False when it fired already (what it watched is broken)."""
        with self._lock:
            self.done = True
            return not self.fired

    def fire(self, why: str) -> None:
        """Fires now, before the deadline, for `why` (unless cancelled or fired already)."""
        self._fire(why)

    def _fire(self, why: str | None = None) -> None:
        with self._lock:
            if self.done:
                return
            self.done = self.fired = True
            self.why = why
            try:
                self._expire()
            except Exception:  # the watchdog outlives any call's breakage
                log.exception("breaking a store call failed")


class _Watchdog:
    """The process's watchdog thread: runs each watch's `expire` at its deadline (at most
    `WATCHDOG_SLACK_SECONDS` late) unless cancelled. Started by the first watch of a process."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._ready = threading.Condition(threading.Lock())
        self._due: list[tuple[float, int, Watch]] = []
        self._order = itertools.count()
        self._pid: int | None = None

    def add(self, watch: Watch) -> None:
        with self._ready:
            if self._pid != os.getpid():
                self._pid = os.getpid()
                threading.Thread(target=self._run, name="contextshift-store-watchdog", daemon=True).start()
            heapq.heappush(self._due, (watch.at, next(self._order), watch))
            if self._due[0][2] is watch:  # sooner than what the thread waits for
                self._ready.notify()

    def _run(self) -> None:
        while True:
            due: list[Watch] = []
            with self._ready:
                while not due:
                    now = time.monotonic()
                    while self._due and (self._due[0][2].done or self._due[0][0] <= now):
                        _, _, watch = heapq.heappop(self._due)
                        if not watch.done:
                            due.append(watch)
                    if not due:
                        wait = max(self._due[0][0] - now, WATCHDOG_SLACK_SECONDS) if self._due else None
                        self._ready.wait(wait)
            for watch in due:
                watch._fire()


_WATCHDOG = _Watchdog()
os.register_at_fork(after_in_child=_WATCHDOG._reset)  # a child starts its own thread, its own list


def watch(at: float, expire: Callable[[], None]) -> Watch:
    """Runs `expire` (from the watchdog thread) at `at` (time.monotonic()), unless the returned
    watch is cancelled first."""
    found = Watch(at, expire)
    _WATCHDOG.add(found)
    return found


class SocketBreaker:
    """Shuts a connection's socket down when its watch fires: every thread blocked on it wakes
    (reads see the end of the stream, writes fail), whatever state the client library is in. Holds
    a duplicate of the socket's descriptor from the start, so what is shut down is that socket even
    if the library closed its own descriptor (and the number went to another file) meanwhile."""

    __slots__ = ("_fd",)

    def __init__(self, fd: int) -> None:
        self._fd: int | None = os.dup(fd)

    def __call__(self) -> None:
        if self._fd is not None:
            break_socket(self._fd)

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def break_socket(fd: int) -> None:
    """Shuts down (both ways) the socket behind the descriptor `fd`, leaving `fd` open."""
    with socket.socket(fileno=os.dup(fd)) as sock, contextlib.suppress(OSError):  # OSError: not connected
        sock.shutdown(socket.SHUT_RDWR)


def run_bounded(
    fn: Callable[[], T], limit: Deadline | None, store: str, what: str, late: Callable[[T], Any] | None = None
) -> T:
    """`fn()` on a thread of its own, waited for until `limit`: past it, `StoreTimeout` (`store`
    `what` within the bound), and the thread goes on alone; `late` then gets what `fn` returns, if
    it returns (to close a connection nobody will use). For what cannot be broken from outside
    (a connection being made: libpq's connect timeout is whole seconds, at least 2)."""
    if limit is None:
        return fn()
    done = threading.Event()
    outcome: list[Any] = []
    lock = threading.Lock()
    abandoned = False

    def run() -> None:
        try:
            result: Any = fn()
            ok = True
        except BaseException as e:
            result, ok = e, False
        with lock:
            outcome[:] = [ok, result]
            left = abandoned
        done.set()
        if left and ok and late is not None:
            try:
                late(result)
            except Exception:
                log.exception("cleaning up after an abandoned store call failed")

    threading.Thread(target=run, name="contextshift-store-bounded", daemon=True).start()
    if not done.wait(max(limit.remaining(), 0.0)):
        with lock:
            if not outcome:
                abandoned = True
        if abandoned:
            raise limit.timed_out(store, what)
    ok, result = outcome
    if not ok:
        raise result
    return result  # type: ignore[no-any-return]
