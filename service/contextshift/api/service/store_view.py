"""The store as a shift reads it, for one tenant: model configurations and calibrations through the
process's caches, a chat's stored history and last prompt; and the view of a shift that needs
nothing stored."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol, TypeVar, cast

from contextshift import calibration, engine
from contextshift.api import metrics
from contextshift.api.service import audit_payload, model_configs
from contextshift.api.service.read_cache import CacheMiss, ReadCache
from contextshift.audit.store import (
    AuditKey,
    ModelConfig,
    Role,
    Store,
    StoredAudit,
    StoreUnavailable,
    WouldWait,
    audit_key,
)
from contextshift.cache_stable import PreviousPrompt
from contextshift.history import HistoryBlock

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

    def history(self, chat_id: str, profile: str) -> Sequence[HistoryBlock]: ...


class NoStore:
    """The view of a shift that needs nothing stored (names no model, role, chat or history): the
    process's in-memory calibration, which a shift without a model never reads."""

    read_seconds = 0.0

    def model_config(self, model: str, role: Role) -> ModelConfig | None:
        return None

    def history(self, chat_id: str, profile: str) -> Sequence[HistoryBlock]:
        return ()

    def factor(self, model: str | None) -> float:
        return calibration.DEFAULT.factor(model)


NO_STORE = NoStore()


# Chats whose last prompt a process keeps, and the largest prompt kept (blocks): a chat's next
# ShiftContext is then made without reading the store (its write checks the chat's audit is still
# the one it was made against), and a PreviewContext decodes no audit.
PROMPTS_KEPT = 1024
PROMPT_BLOCKS_KEPT = 2000


class LastPrompt(NamedTuple):
    """A chat's last prompt as its next ShiftContext is made against it: which audit it is of
    (None: the chat has none), what it kept and left out, and the blocks the chat stored for it."""

    audit: AuditKey | None
    prompt: PreviousPrompt
    blocks: engine.StoredBlocks


@dataclass(frozen=True)
class Caches:
    """A process's caches of store reads: model configurations and calibrations (for
    `store_cache_seconds`), and the chats' last prompts with the audit each is of (valid while the
    chat's audit is that one, so kept without a time limit)."""

    models: ReadCache
    prompts: ReadCache = field(default_factory=lambda: ReadCache(math.inf, PROMPTS_KEPT))


class PromptMiss(CacheMiss):
    """A chat's last prompt this process does not hold, and its store cannot read at once."""

    def __init__(self, chat_id: str) -> None:
        super().__init__(chat_id)
        self.chat_id = chat_id


class TenantStore:
    """The store as one tenant's shifts read it (a `StoreView`), timing the reads. Model
    configurations and calibrations go through the process's `Caches`; with `cached_only` (a shift
    on the event loop), a read the cache does not hold raises `CacheMiss` instead of touching the
    store, unless the store makes it without waiting (a chat's last audit from SQLite) or it was
    read ahead (`read_ahead`: PostgreSQL's, by the core)."""

    def __init__(
        self,
        store: Store,
        tenant: str,
        caches: Caches,
        *,
        cached_only: bool = False,
        read_ahead: dict[str, StoredAudit | None] | None = None,
    ) -> None:
        self.store = store
        self.tenant = tenant
        self.caches = caches
        self.cached_only = cached_only
        self.read_ahead = read_ahead or {}  # chats' audits, by chat id, read for this view
        self.read_seconds = 0.0

    def cached(self, read_ahead: dict[str, StoredAudit | None] | None = None) -> TenantStore:
        """This view for a shift on the event loop: the cache, the chats' audits `read_ahead`, and
        only the store's reads that cannot wait."""
        return TenantStore(self.store, self.tenant, self.caches, cached_only=True, read_ahead=read_ahead)

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
        if not model and role is Role.NONE:
            return None  # nothing named: nothing to read
        return self._cached(
            ("config", self.tenant, model, role),
            lambda: model_configs.lookup(self.store, self.tenant, model, role),
        )

    def history(self, chat_id: str, profile: str) -> Sequence[HistoryBlock]:
        return self._timed(lambda: self.store.history(self.tenant, chat_id, profile))

    def stored_prompt(self, chat_id: str) -> PreviousPrompt:
        """The chat's last prompt as its audit in the store records it now (a preview's)."""
        return self.prompt_of(chat_id, self._timed(lambda: self.store.audit(self.tenant, chat_id))).prompt

    def prompt_of(self, chat_id: str, stored: StoredAudit | None) -> LastPrompt:
        """The prompt the chat's audit `stored` records (from the process's memory when it holds
        that audit's); an empty one for none."""
        if stored is None:
            return LastPrompt(None, PreviousPrompt(), engine.StoredBlocks())
        key = audit_key(stored.generation)
        kept = self.caches.prompts.peek(("prompt", self.tenant, chat_id))
        if kept is not None and kept.audit == key:
            return cast(LastPrompt, kept)
        last = LastPrompt(key, audit_payload.previous_prompt(stored), audit_payload.stored_blocks(stored))
        self.keep_prompt(chat_id, last)
        return last

    def last_prompt(self, chat_id: str) -> LastPrompt:
        """The chat's last prompt and which audit it is of: as this process last wrote or read it
        (a ShiftContext is made against it, and its write checks that the chat's audit is still
        that one), else read from the store; counted by where it was found (warm, cold, new)."""
        kept = self.caches.prompts.peek(("prompt", self.tenant, chat_id))
        if kept is not None:
            metrics.record_chat_prompt("warm")
            return cast(LastPrompt, kept)
        if chat_id in self.read_ahead:
            stored = self.read_ahead[chat_id]
        elif self.cached_only:  # on the event loop: read only if the store need not wait
            try:
                stored = self._timed(lambda: self.store.audit_at_once(self.tenant, chat_id))
            except WouldWait:
                raise PromptMiss(chat_id) from None
        else:
            stored = self._timed(lambda: self.store.audit(self.tenant, chat_id))
        metrics.record_chat_prompt("cold" if stored else "new")
        return self.prompt_of(chat_id, stored)

    def keep_prompt(self, chat_id: str, last: LastPrompt) -> None:
        """Keeps a chat's last prompt."""
        prompt = last.prompt
        if max(len(prompt.kept) + len(prompt.excluded), len(last.blocks)) <= PROMPT_BLOCKS_KEPT:
            self.caches.prompts.put(("prompt", self.tenant, chat_id), last)
        else:
            self.forget_prompt(chat_id)

    def forget_prompt(self, chat_id: str) -> None:
        self.caches.prompts.drop(("prompt", self.tenant, chat_id))

    def factor(self, model: str | None) -> float:
        if not model:
            return 1.0

        def read() -> float:
            calibration = self.store.calibration(self.tenant, model)
            return calibration.factor if calibration else 1.0

        return self._cached(("factor", self.tenant, model), read)
