"""Readiness that tells whether the store answers: each serving process asks its store a trivial
question (`Store.ping`) every `up_interval` (a quarter of the bound, at most a second), within the store's
bound. While it gets no answer in time (a database that is down, or behind a network gone silent:
the ping ends at the bound like any store call), the process is not ready: gRPC health reports
NOT_SERVING for every service and "", /readyz answers 503, `contextshift_store_ready` is 0, and the
probe asks every `DOWN_INTERVAL_SECONDS` until an answer comes. Liveness (/healthz) is not touched:
the process is fine, and a restart would not bring the store back. The change is logged once each
way, coming back with how long it lasted.

So a balancer stops sending work within two bounds of the store going silent (the probe's
interval plus its bound), and sends it again within about `DOWN_INTERVAL_SECONDS` plus a round
trip of its return. A ping that does not return at all (SQLite on a filesystem that hangs: nothing
breaks such a read from outside) holds the probe's one thread, and the process stays not ready
until it returns.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor

from contextshift.api import metrics
from contextshift.audit.store import Store, StoreError

log = logging.getLogger("contextshift.api")

# How often a process that found its store not answering asks again.
DOWN_INTERVAL_SECONDS = 0.1
# How often a ready process asks at most (less with a shorter bound: within two bounds in all).
MAX_UP_INTERVAL_SECONDS = 1.0
# How long past the bound the probe waits for a ping before it counts as unanswered (the ping ends
# itself at the bound; this is for one that cannot be broken).
PING_SLACK_SECONDS = 0.25

# Told the reason the store is not ready (None: ready again).
OnChange = Callable[[str | None], Awaitable[None]]


class StoreReadiness:
    """The probe of one serving process (see the module's doc); `run` until cancelled."""

    def __init__(self, store: Store, bound_seconds: float, on_change: OnChange) -> None:
        self._store = store
        self._bound = bound_seconds
        self._on_change = on_change
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="contextshift-probe")
        self._pending: asyncio.Future[None] | None = None  # a ping not returned yet
        self.problem: str | None = None  # why the store is not ready; None: it is
        self._since = 0.0  # when it stopped being ready

    @property
    def up_interval(self) -> float:
        return min(self._bound / 4, MAX_UP_INTERVAL_SECONDS)

    async def run(self) -> None:
        metrics.record_store_ready(self._store.dialect, True)
        try:
            while True:
                started = time.monotonic()
                await self._probe()
                interval = self.up_interval if self.problem is None else DOWN_INTERVAL_SECONDS
                await asyncio.sleep(max(0.0, interval - (time.monotonic() - started)))
        finally:
            self._thread.shutdown(wait=False, cancel_futures=True)

    async def _probe(self) -> None:
        """One ping, waited for within the bound; the readiness it says."""
        if self._pending is None or self._pending.done():
            self._pending = asyncio.get_running_loop().run_in_executor(self._thread, self._store.ping)
            self._pending.add_done_callback(_retrieved)  # a ping given up on may end in an error
        try:
            await asyncio.wait_for(asyncio.shield(self._pending), self._bound + PING_SLACK_SECONDS)
        except StoreError as e:
            await self._set(str(e))
        except TimeoutError:
            await self._set(
                f"{self._store.description} did not answer within store_timeout_ms "
                f"({self._bound * 1e3:.0f} ms)"
            )
        else:
            await self._set(None)

    async def _set(self, problem: str | None) -> None:
        was, self.problem = self.problem, problem
        if (was is None) == (problem is None):
            return
        fields: dict[str, object] = {"store": self._store.description}
        if problem is not None:
            self._since = time.monotonic()
            fields |= {"error": problem, "store_timeout_ms": round(self._bound * 1e3)}
            log.warning("not ready: the store does not answer", extra={"fields": fields})
        else:
            fields["not_ready_seconds"] = round(time.monotonic() - self._since, 3)
            log.warning("ready: the store answers again", extra={"fields": fields})
        metrics.record_store_ready(self._store.dialect, problem is None)
        await self._on_change(problem)


def _retrieved(ping: asyncio.Future[None]) -> None:
    """Marks a ping's error as seen: the probe may have stopped waiting for it (asyncio would log
    every such error as never retrieved)."""
    if not ping.cancelled():
        ping.exception()
