"""The store as a shift reads it, for one tenant: model configurations and calibrations through the
process's caches, a chat's stored history and last prompt; and the view of a shift that needs
nothing stored."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, cast

from contextshift import calibration
from contextshift.api.service import audits, model_configs
from contextshift.api.service.read_cache import ReadCache
from contextshift.audit.store import ModelConfig, Role, Store, StoredBlock, StoreUnavailable
from contextshift.cache_stable import PreviousPrompt

T = TypeVar("T")


class StoreView(calibration.CalibrationSource, Protocol):
    """What a shift reads from the store, for one tenant: model configurations, the chat's stored
    history, and calibrations (as its CalibrationSource). Blocking: shifts that read it run on a
    thread."""

    @property
    def read_seconds(self) -> float:
        """The time its reads of the store have taken so far (a shift's own time leaves it out)."""
        ...

    def model_config(self, model: str, role: Role) -> ModelConfig | None: ...

    def history(self, chat_id: str, profile: str) -> Sequence[StoredBlock]: ...

    def previous_prompt(self, chat_id: str) -> PreviousPrompt | None:
        """The chat's last prompt, from its last audit (cache-stable shifts)."""
        ...


class NoStore:
    """The view of a shift that needs nothing stored (names no model, role, chat or history): the
    process's in-memory calibration, which a shift without a model never reads."""

    read_seconds = 0.0

    def model_config(self, model: str, role: Role) -> ModelConfig | None:
        return None

    def history(self, chat_id: str, profile: str) -> Sequence[StoredBlock]:
        return ()

    def previous_prompt(self, chat_id: str) -> PreviousPrompt | None:
        return None

    def factor(self, model: str | None) -> float:
        return calibration.DEFAULT.factor(model)


NO_STORE = NoStore()


# Chats whose last prompt a process keeps decoded, and the largest prompt kept (blocks): a chat's
# next shift would otherwise decode its last audit (0.3 ms at 200 blocks) to be cache-stable.
PROMPTS_KEPT = 512
PROMPT_BLOCKS_KEPT = 2000


@dataclass(frozen=True)
class Caches:
    """A process's caches of store reads: model configurations and calibrations (for
    `store_cache_seconds`), and the chats' last prompts (valid while the chat's audit is the same
    generation, so kept without a time limit)."""

    models: ReadCache
    prompts: ReadCache = field(default_factory=lambda: ReadCache(math.inf, PROMPTS_KEPT))


class TenantStore:
    """The store as one tenant's shifts read it (`convert.StoreView`), timing the reads. Model
    configurations and calibrations go through the process's `Caches`; with `cached_only`, a read
    the cache does not hold raises `CacheMiss` instead of touching the store (a shift on the event
    loop)."""

    def __init__(self, store: Store, tenant: str, caches: Caches, *, cached_only: bool = False) -> None:
        self.store = store
        self.tenant = tenant
        self.caches = caches
        self.cached_only = cached_only
        self.read_seconds = 0.0

    def cached(self) -> TenantStore:
        """This view for a shift on the event loop: the cache only, never the store."""
        return TenantStore(self.store, self.tenant, self.caches, cached_only=True)

    def _cached(self, key: tuple[Any, ...], read: Callable[[], T]) -> T:
        timed = None if self.cached_only else lambda: self._timed(read)
        return self.caches.models.get(key, timed, stale_on=StoreUnavailable)

    def _timed(self, read: Callable[[], T]) -> T:
        start = time.perf_counter()
        try:
            return read()
        finally:
            self.read_seconds += time.perf_counter() - start

    def model_config(self, model: str, role: Role) -> ModelConfig | None:
        return self._cached(
            ("config", self.tenant, model, role),
            lambda: model_configs.lookup(self.store, self.tenant, model, role),
        )

    def history(self, chat_id: str, profile: str) -> Sequence[StoredBlock]:
        return self._timed(lambda: self.store.history(self.tenant, chat_id, profile))

    def previous_prompt(self, chat_id: str) -> PreviousPrompt | None:
        stored = self._timed(lambda: self.store.audit(self.tenant, chat_id))
        if stored is None:
            return None
        generation = (stored.generation.generation_id, stored.generation.created_ms)
        kept = self.caches.prompts.peek(("prompt", self.tenant, chat_id))
        if kept is not None and kept[0] == generation:
            return cast(PreviousPrompt, kept[1])
        prompt = audits.previous_prompt(stored)
        self.keep_prompt(chat_id, generation, prompt)
        return prompt

    def keep_prompt(self, chat_id: str, generation: tuple[str, int], prompt: PreviousPrompt) -> None:
        """Keeps a chat's last prompt, the one its audit of `generation` (id, created) records."""
        if len(prompt.kept) + len(prompt.excluded) <= PROMPT_BLOCKS_KEPT:
            self.caches.prompts.put(("prompt", self.tenant, chat_id), (generation, prompt))

    def factor(self, model: str | None) -> float:
        if not model:
            return 1.0

        def read() -> float:
            calibration = self.store.calibration(self.tenant, model)
            return calibration.factor if calibration else 1.0

        return self._cached(("factor", self.tenant, model), read)
