"""What the store keeps and the one protocol both backends implement (SQLite, PostgreSQL).

Every call names its tenant, and every row belongs to one: a tenant reads and writes only its own
rows, whatever ids another tenant uses.

Calls block (sqlite3 and psycopg are synchronous): callers run them on a thread, never on an event
loop. Each call is one transaction; a read-modify-write holds the write lock (SQLite `BEGIN
IMMEDIATE`, PostgreSQL row locks) from its read to its commit. The one exception is
`record_shifts`, which stores many shifts in one transaction (group commit, see `audit.writer`).
A store opened with a bound ends every call past it (`StoreTimeout`; see `audit.bounds`).

Room: writes that add data (a shift's generation and audit, appended blocks) claim room for it
first, and are refused whole (`StoreFull`) when the store has none: past `max_store_bytes`, or, for
SQLite, with the disk under it down to its reserve. Writes that add nothing to speak of (reports,
deletions, model configurations, migrations) are never refused for room, so a full store can
still be finished with and made room in.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum, StrEnum
from typing import Protocol

from contextshift.calibration import Calibration
from contextshift.history import HistoryBlock


class Status(StrEnum):
    """A generation's status (GenerationStatus in the .proto)."""

    PENDING = "PENDING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


class Role(StrEnum):
    """A model configuration's role (ModelRole in the .proto)."""

    NONE = ""
    MAIN = "main"
    FAST = "fast"


# A write is let in when its data, less this, fits in the room left: so the room a deleted chat
# frees takes an audit of that chat's size, whatever rows and pages each backend counts around the
# data (SQLite keeps the first part of a long row in a table page that a deletion does not free),
# and a store at its limit passes it by less than this.
CLAIM_SLACK_BYTES = 4096


def redacted(url: str) -> str:
    """A store URL with its password, if any, masked (for logs and errors)."""
    return re.sub(r"(://[^/:@]*:)[^/@]*@", r"\1***@", url)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True)
class Generation:
    """One ShiftContext, as FinishGeneration needs it."""

    generation_id: str
    chat_id: str  # "" when the shift named no chat
    model: str  # "" when it named no model: the calibration key
    prompt_tokens: int  # the raw estimate, before calibration
    approximate: bool
    created_ms: int
    status: Status = Status.PENDING
    error_code: str | None = None  # normalized (provider_errors.ErrorCode), with FAILED
    reported_prompt_tokens: int | None = None  # taken once, by the first report that has it
    finished_ms: int | None = None


# A segment of a chat's stored blocks (the blocks one write added): its hash (16 bytes) and its
# data (opaque, as the caller made them: `engine.store_messages`).
StoredSegment = tuple[bytes, bytes]


@dataclass(frozen=True)
class StoredAudit:
    """A chat's last audit: the shift's record (opaque bytes, compressed by the caller) and the
    generation it belongs to, with its current status. When its messages are stored as the chat's
    blocks, `message_refs` names them (opaque, as the caller made them), and `segments` holds the
    chat's stored blocks when they were asked for (`Store.audit(..., with_blocks=True)`)."""

    payload: bytes
    generation: Generation
    message_refs: bytes | None = None
    segments: Sequence[StoredSegment] = ()


# A chat's audit as a shift saw it: (generation id, created ms) of the audit, or None for none.
AuditKey = tuple[str, int]


class Unchecked(Enum):
    """`ShiftRecord.made_on` when the chat's audit is not checked (the last write wins)."""

    UNCHECKED = "unchecked"


UNCHECKED = Unchecked.UNCHECKED


@dataclass(frozen=True)
class ShiftRecord:
    """A shift to store (`Store.record_shifts`): its generation and, with a chat, its audit (None
    without one). `made_on` is the chat's audit the shift was made against (its previous prompt
    came from it): the record is stored only if that is still the chat's audit when it commits,
    else `AuditChanged`."""

    tenant: str
    generation: Generation
    audit: bytes | None
    made_on: AuditKey | Unchecked | None = UNCHECKED
    # The blocks the audit records as sent (a summary block included) and as left out, stored
    # beside it for ListChats; None: not known (stored as such).
    kept: int | None = None
    excluded: int | None = None
    # The audit's messages stored as the chat's blocks (see `StoredAudit`): the references the
    # audit keeps, the segment of the blocks the chat has not stored yet, and the chat's segments
    # it no longer needs (by hash). A checked record's segments are relative to its `made_on`
    # audit; an unchecked record's new segment holds all its blocks, and the store finds the
    # segments it no longer needs itself.
    message_refs: bytes | None = None
    new_segments: Sequence[StoredSegment] = ()
    gone_segments: Sequence[bytes] = ()


def audit_key(generation: Generation) -> AuditKey:
    return (generation.generation_id, generation.created_ms)


@dataclass(frozen=True)
class ChatSummary:
    """A chat with an audit, as `Store.chats` lists it: its audit's generation (with its current
    status), and the counts stored with the audit (None: stored before the store kept them)."""

    generation: Generation
    kept: int | None
    excluded: int | None


# Where a page of `Store.chats` starts: after the chat (its audit's created ms, its id) that ended
# the page before.
ChatCursor = tuple[int, str]


@dataclass(frozen=True)
class GenerationReport:
    """What FinishGeneration reports."""

    generation_id: str
    status: Status
    chat_id: str = ""  # when set, the generation must belong to this chat
    error_code: str | None = None
    reported_prompt_tokens: int | None = None


@dataclass(frozen=True)
class Finished:
    """The outcome of a report: the generation after it, and the model's calibration."""

    generation: Generation
    calibration_recorded: bool
    calibration: Calibration | None


@dataclass(frozen=True)
class ModelConfig:
    """A model's stored configuration (ModelConfig in the .proto); None: not configured."""

    model: str
    role: Role = Role.NONE
    context_size: int | None = None
    max_output_tokens: int | None = None
    system_reserve: int | None = None
    profile: str = ""
    updated_ms: int = 0


@dataclass(frozen=True)
class Usage:
    """How much the store holds (the gauges of /metrics, `contextshift store check`)."""

    data_bytes: int  # what max_store_bytes counts (SQLite: pages in use; PostgreSQL: see postgres.py)
    chats: int  # chats with an audit or a stored history
    disk_free_bytes: int | None = None  # SQLite: free on the filesystem that holds it


# --- errors -------------------------------------------------------------------------------------


class StoreError(Exception):
    """Base of the store's errors."""


class WouldWait(Exception):
    """A read asked of the store at once (`Store.audit_at_once`) that would have to wait: every
    read of the store does (PostgreSQL: a round trip), or this one would (SQLite: the file busy).
    Not an error: the caller reads as usual, off the event loop."""


class StoreUnavailable(StoreError):
    """The store cannot be reached, or stayed locked past its timeout: nothing was written."""


class StoreDamaged(StoreError):
    """Stored data that cannot be read back (a segment an audit names is missing, or does not
    decompress to its blocks): `contextshift store check` reports where."""


class StoreTimeout(StoreUnavailable):
    """The store did not answer within the call's bound (`store_timeout_ms`, or the call's own
    deadline when sooner): the call was abandoned, and the connection it waited on thrown away.
    Nothing of it was committed, unless the bound passed while its commit was on its way: then it
    may have been, whole."""


class FullCause(StrEnum):
    """What a full store ran out of (a label of metrics, and the error's metadata)."""

    MAX_STORE_BYTES = "max_store_bytes"  # its data reached the setting
    DISK_RESERVE = "store_reserve_bytes"  # the free disk under it is down to the reserve (SQLite)
    DISK = "disk"  # the database itself found the disk full


class StoreFull(StoreError):
    """The store has no room for new data: its data reached `max_store_bytes`, or the disk under
    it is down to its reserve (or full). Nothing was written; reads, reports and deletions still
    work, and each deletion makes room."""

    def __init__(self, store: str, cause: FullCause, why: str) -> None:
        super().__init__(
            f"the store ({store}) is full: {why}. New audits and appended blocks are refused until "
            "there is room: delete chats (DeleteChat, or chat_retention_days), raise max_store_bytes "
            "or free disk space; previews, reads, FinishGeneration and DeleteChat still work"
        )
        self.cause = cause


class StoreConfigError(StoreError):
    """The store URL is malformed or names an unknown scheme, or the schema is newer than this
    contextshift."""


class NotFound(StoreError):
    pass


class StaleGeneration(StoreError):
    """The generation's chat has had a newer ShiftContext since."""

    def __init__(self, generation_id: str, chat_id: str, current: str | None) -> None:
        super().__init__(
            f"generation {generation_id!r} of chat {chat_id!r} was replaced by a newer generation"
            + (f" ({current!r})" if current else "")
            + "; nothing changed"
        )
        self.generation_id = generation_id
        self.current = current


class AlreadyFinished(StoreError):
    """The generation was reported with another status before."""

    def __init__(self, generation_id: str, status: Status) -> None:
        super().__init__(f"generation {generation_id!r} already finished as {status.value}; nothing changed")
        self.generation_id = generation_id
        self.status = status


class AuditChanged(StoreError):
    """The chat's audit is not the one a shift was made against any more: another shift wrote it
    since (in another process, or earlier in the same group). Nothing was written; `current` is
    the chat's audit now (None when it has none), for the shift to be made again against it."""

    def __init__(self, chat_id: str, current: StoredAudit | None) -> None:
        super().__init__(f"the audit of chat {chat_id!r} changed while a shift of it was made")
        self.current = current


class GenerationIdInUse(StoreError):
    """A generation id another chat of the tenant uses."""

    def __init__(self, generation_id: str) -> None:
        super().__init__(
            f"generation_id {generation_id!r} is already used by another chat; nothing was stored"
        )
        self.generation_id = generation_id


# --- the protocol -------------------------------------------------------------------------------

# AppendBlocks' check and conversion of new blocks, run inside the append's transaction with the
# chat's stored history: it returns each new block's JSON text and tokens, or raises.
PrepareBlocks = Callable[[Sequence[HistoryBlock]], Sequence[HistoryBlock]]


class Declined(Enum):
    """A record's outcome from `CoreGroups`: not written, the store's own path (`record_shifts`)
    must write it."""

    DECLINED = "declined"


DECLINED = Declined.DECLINED


@dataclass(frozen=True)
class AuditRead:
    """A read's outcome from `CoreGroups`: the chat's audit (None: it has none)."""

    audit: StoredAudit | None


# A job's outcome from `CoreGroups`: a record's None stored, else why not (a StoreError), or
# DECLINED (a read's too); a read's AuditRead.
CoreOutcome = Exception | Declined | AuditRead | None


class CoreGroups(Protocol):
    """A store's group commits outside Python (`Store.core_groups`): records handed over with a
    token (`submit`), each committed with whatever else queued, their outcomes read back on the
    event loop when the socket `fileno` is readable (`finished`)."""

    dialect: str

    def fileno(self) -> int: ...

    def submit(self, token: int, record: ShiftRecord) -> bool:
        """Queues `record` under `token`; False when these commits do not take it (the store's own
        path must write it)."""
        ...

    def submit_read(self, token: int, tenant: str, chat_id: str) -> bool:
        """Queues a read of a chat's audit under `token`; False when these do not read (the store
        reads at once, or they stopped)."""
        ...

    def finished(self) -> tuple[list[tuple[int, CoreOutcome]], list[tuple[int, float]]]:
        """The jobs finished since the last call, `(token, outcome)`, and each group's size and
        seconds."""
        ...

    def stop(self) -> None:
        """Writes what is queued, then stops (what it finished is still read)."""
        ...


class Store(Protocol):
    """The audit store. See the module docstring for tenants, threads and transactions."""

    dialect: str  # the database: "sqlite" or "postgresql"

    @property
    def description(self) -> str:
        """The store's kind and location for logs (no password)."""
        ...

    def migrate(self) -> int:
        """Brings the schema to the latest version (safe to run from several processes at once);
        returns it. StoreConfigError when the schema is newer than this contextshift."""
        ...

    def close(self) -> None: ...

    def ping(self) -> None:
        """Returns once the store answers a trivial query; StoreUnavailable (StoreTimeout past the
        store's bound) when it does not. The readiness probe's question."""
        ...

    def schema_version(self) -> int:
        """The schema version the store is at (0: none yet), read without migrating."""
        ...

    def usage(self) -> Usage: ...

    def problems(self) -> list[str]:
        """Integrity problems found (empty when none): the database's own check where it has one,
        and the store's invariants (every audit's generation exists and is of its chat, with the
        audit's time, history positions run 0..n-1, counts belong to stored blocks)."""
        ...

    # Shifts.
    def calibration(self, tenant: str, model: str) -> Calibration | None: ...

    def history(self, tenant: str, chat_id: str, profile: str) -> list[HistoryBlock]:
        """The chat's stored blocks in order, with their tokens under `profile` where stored."""
        ...

    def record_shift(self, tenant: str, generation: Generation, audit: bytes | None) -> None:
        """Stores a generation (PENDING) and, with `audit`, makes it its chat's audit, replacing the
        last one, in one transaction. A generation id the chat used before starts over;
        GenerationIdInUse when another chat (or no chat) of the tenant uses it."""
        ...

    def record_shifts(self, records: Sequence[ShiftRecord]) -> list[StoreError | None]:
        """Stores each record as `record_shift` does, all in one transaction (group commit), each
        claiming its room in turn; per record, None when it is stored, else why not:
        GenerationIdInUse, StoreFull (only the records that do not fit), AuditChanged (see
        `ShiftRecord.made_on`). When the transaction fails whole (SQLite's SQLITE_FULL rolls back
        every record of it), each record is stored again alone. Raises StoreUnavailable when the
        store cannot serve (nothing stored)."""
        ...

    def core_groups(self) -> CoreGroups | None:
        """Group commits that run outside Python, for this process's group writer; None when the
        store has none (PostgreSQL) or cannot use them (see `contextshift.audit.sqlite`)."""
        ...

    def finish(self, tenant: str, report: GenerationReport, alpha: float) -> Finished:
        """Moves a generation to a terminal status and feeds its report into the model's
        calibration (exponential moving average with weight `alpha`), in one transaction. Raises
        NotFound, StaleGeneration or AlreadyFinished, and then changes nothing."""
        ...

    # Audits and chats.
    def audit(self, tenant: str, chat_id: str, *, with_blocks: bool = False) -> StoredAudit | None:
        """The chat's last audit; with its blocks (read with it, as of one moment) when asked."""
        ...

    def audit_at_once(self, tenant: str, chat_id: str) -> StoredAudit | None:
        """The chat's last audit (without its blocks), read only if that cannot wait: SQLite reads
        a few pages of a local file, and in WAL mode a reader never waits for a writer, so the
        event loop may read it (a cold chat's shift then stays on the loop, where a thread hop
        would cost more than the read). WouldWait when the read would wait: always for
        PostgreSQL; for SQLite, when the file is busy (a checkpoint truncating the WAL, a
        recovery) or the read fails (the caller's usual read then says why)."""
        ...

    def chats(self, tenant: str, limit: int, after: ChatCursor | None = None) -> list[ChatSummary]:
        """Up to `limit` of the tenant's chats with an audit, the most recently shifted first (by
        their audit's shift; ties by chat id, descending), from the one after `after` on: one
        indexed query, which reads no payload."""
        ...

    def delete_chat(self, tenant: str, chat_id: str, *, idle_before_ms: int | None = None) -> bool:
        """Deletes the chat's audit, generations, stored history and stored counts; False when
        there was nothing. With `idle_before_ms` (retention), only when the chat was neither
        shifted nor appended to since then, checked in the deletion's transaction."""
        ...

    def idle_chats(self, before_ms: int, limit: int) -> list[tuple[str, str]]:
        """Up to `limit` chats (tenant, chat id) neither shifted nor appended to since
        `before_ms`."""
        ...

    def append_blocks(self, tenant: str, chat_id: str, profile: str, prepare: PrepareBlocks) -> int:
        """Appends the blocks `prepare` returns (given the stored history) with their tokens under
        `profile`, in one transaction; returns the chat's block count after."""
        ...

    # Model configurations.
    def set_model_config(self, tenant: str, config: ModelConfig) -> ModelConfig:
        """Creates or replaces the configuration; a role it takes is taken from the configuration
        that held it. Returns it as stored."""
        ...

    def get_model_config(self, tenant: str, model: str = "", role: Role = Role.NONE) -> ModelConfig | None:
        """The configuration of `model`, or of the model holding `role`."""
        ...

    def model_configs(self, tenant: str) -> list[ModelConfig]: ...

    def delete_model_config(self, tenant: str, model: str) -> bool: ...

    # Housekeeping.
    def prune_generations(self, older_than_ms: int) -> int:
        """Deletes generations created before `older_than_ms` that are no chat's current audit;
        returns how many."""
        ...
