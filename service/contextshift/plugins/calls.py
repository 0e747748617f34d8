"""Plugin calls under the host's guard: each on a plugin thread with its own time limit, and what
the host answers a plugin with that it does not apply."""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

# Idle plugin threads kept for the next calls, and the abandoned (timed-out) calls that may still
# be running before new calls are refused: what runaway plugins can hold is bounded.
STANDING_THREADS = 4
MAX_HUNG_CALLS = 32
# Ids listed in a diagnostic's detail at most.
_MAX_LISTED = 10

T = TypeVar("T")


class PluginsSaturated(Exception):
    """Too many earlier plugin calls are still running past their time limit: a new call is
    refused at once rather than adding one more thread."""


class _Call:
    """One plugin call: what to run and, once done, its value or error."""

    __slots__ = ("abandoned", "args", "done", "error", "finished", "fn", "value")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.fn, self.args = fn, args
        self.done = threading.Event()
        self.finished = False  # under the threads' lock
        self.abandoned = False  # under the threads' lock: its caller stopped waiting
        self.value: Any = None
        self.error: BaseException | None = None


class PluginThreads:
    """Daemon threads that run plugin calls, so each call keeps its own time limit.

    A call takes an idle thread, or starts one: calls never queue behind each other. A call past
    its limit cannot be stopped, so it is abandoned: its thread no longer counts as available
    (the next call starts a fresh one) and finishes on its own. Hung calls therefore never delay
    later ones; at most `max_hung` may be running at once, past that a call is refused at once
    with `PluginsSaturated` until some finish. Up to `standing` finished threads stay idle for
    the next calls; others exit."""

    def __init__(self, standing: int, max_hung: int, name: str = "contextshift-plugin") -> None:
        self._standing = standing
        self._max_hung = max_hung
        self._name = name
        self.reset()

    def reset(self) -> None:
        """Forget every thread (a forked child has none of its parent's)."""
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._calls: queue.SimpleQueue[_Call] = queue.SimpleQueue()
        self._idle = 0  # threads waiting for a call, each one reserved by one `run`
        self._hung = 0  # abandoned calls still running
        self._started = 0

    @property
    def hung(self) -> int:
        """Abandoned calls still running."""
        with self._lock:
            return self._hung

    def wait_hung_at_most(self, count: int, timeout: float) -> bool:
        """Waits until at most `count` abandoned calls still run; False after `timeout` seconds."""
        with self._changed:
            return self._changed.wait_for(lambda: self._hung <= count, timeout)

    def run(self, fn: Callable[..., T], args: tuple[Any, ...], timeout_ms: int) -> T:
        """`fn(*args)` on a plugin thread; `TimeoutError` after `timeout_ms`, `PluginsSaturated`
        (without running it) when too many abandoned calls still run."""
        call = _Call(fn, args)
        with self._lock:
            if self._hung >= self._max_hung:
                raise PluginsSaturated(
                    f"{self._hung} earlier plugin calls are still running past their time limit"
                )
            start = not self._idle
            if start:
                self._started += 1
                number = self._started
            else:
                self._idle -= 1
        if start:
            threading.Thread(target=self._work, name=f"{self._name}-{number}", daemon=True).start()
        self._calls.put(call)
        if not call.done.wait(timeout_ms / 1000):
            with self._lock:
                if not call.finished:  # else it finished just now: its answer counts
                    call.abandoned = True
                    self._hung += 1
                    raise TimeoutError(f"ran past {timeout_ms} ms")
        if call.error is not None:
            raise call.error
        return call.value  # type: ignore[no-any-return]

    def _work(self) -> None:
        while True:
            call = self._calls.get()
            try:
                call.value = call.fn(*call.args)
            except BaseException as error:  # the caller's to judge, in its own thread
                call.error = error
            with self._changed:
                call.finished = True
                if call.abandoned:
                    self._hung -= 1
                    self._changed.notify_all()
                stay = self._idle < self._standing
                if stay:
                    self._idle += 1
            call.done.set()
            if not stay:
                return


# Plugin calls run here, so a time limit can be kept.
threads = PluginThreads(STANDING_THREADS, MAX_HUNG_CALLS)
os.register_at_fork(after_in_child=threads.reset)


def call_with_timeout(fn: Callable[..., T], args: tuple[Any, ...], timeout_ms: int) -> T:
    """`fn(*args)` on a plugin thread; `TimeoutError` after `timeout_ms`, `PluginsSaturated` when
    too many earlier calls are still running past their limit."""
    return threads.run(fn, args, timeout_ms)


def listed(ids: Sequence[str]) -> str:
    shown = ", ".join(repr(i) for i in ids[:_MAX_LISTED])
    return shown + (f" and {len(ids) - _MAX_LISTED} more" if len(ids) > _MAX_LISTED else "")


class Rejected(Exception):
    """A plugin's answer the host does not apply: the event and why."""

    def __init__(self, event: str, detail: str) -> None:
        super().__init__(detail)
        self.event = event
        self.detail = detail
