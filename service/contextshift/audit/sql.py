"""The store's logic in SQL both backends speak, over a transaction each backend provides.

A backend gives `_run(work, write)`: it runs `work(tx)` in one transaction (a write transaction
holds the write lock from its first statement: SQLite `BEGIN IMMEDIATE`; PostgreSQL locks the rows
`tx.locked` reads) and commits, or rolls back when `work` raises. Statements use `?` placeholders.
A write that adds data claims room for it first (`tx.claim`), which the backend grants or refuses
(`StoreFull`) from what it knows of its size and its disk; the claims of one transaction add up.
"""

from __future__ import annotations

import functools
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any, Protocol, TypeVar

from contextshift import calibration, engine
from contextshift.audit.migrations import LATEST, MIGRATIONS, SCHEMA_TABLE
from contextshift.audit.store import (
    DECLINED,
    UNCHECKED,
    AlreadyFinished,
    AuditChanged,
    AuditKey,
    AuditRead,
    ChatCursor,
    ChatSummary,
    CoreGroups,
    CoreOutcome,
    Finished,
    Generation,
    GenerationIdInUse,
    GenerationReport,
    ModelConfig,
    NotFound,
    PrepareBlocks,
    Role,
    ShiftRecord,
    StaleGeneration,
    Status,
    StoreConfigError,
    StoreDamaged,
    StoredAudit,
    StoredSegment,
    StoreError,
    StoreFull,
    StoreUnavailable,
    Unchecked,
    Usage,
    WouldWait,
    audit_key,
    now_ms,
)
from contextshift.calibration import Calibration
from contextshift.history import HistoryBlock

log = logging.getLogger("contextshift.store")
T = TypeVar("T")
Row = tuple[Any, ...]

_GENERATION_FIELDS = (
    "generation_id",
    "chat_id",
    "model",
    "prompt_tokens",
    "approximate",
    "created_ms",
    "status",
    "error_code",
    "reported_prompt_tokens",
    "finished_ms",
)
_GENERATION_COLUMNS = ", ".join(_GENERATION_FIELDS)
_HISTORY = (
    "SELECT b.block_json, c.tokens FROM chat_blocks b LEFT JOIN chat_block_counts c "
    "ON c.tenant = b.tenant AND c.chat_id = b.chat_id AND c.position = b.position AND c.profile = ? "
    "WHERE b.tenant = ? AND b.chat_id = ? ORDER BY b.position"
)
# A shift's generation. An id the chat used before (a retried call) starts over; another chat's is
# refused (no row inserted or updated).
RECORD_GENERATION = (
    f"INSERT INTO generations (tenant, {_GENERATION_COLUMNS}) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, NULL, NULL, NULL) "
    "ON CONFLICT (tenant, generation_id) DO UPDATE SET model = excluded.model, "
    "prompt_tokens = excluded.prompt_tokens, approximate = excluded.approximate, "
    "created_ms = excluded.created_ms, status = excluded.status, error_code = NULL, "
    "reported_prompt_tokens = NULL, finished_ms = NULL "
    "WHERE generations.chat_id = excluded.chat_id"
)
# An audit's columns beside its payload (`audit_params`): for ListChats (migration 3), when its
# shift ran (its generation's created_ms) and its kept and excluded counts; and its references to
# the chat's stored blocks (migration 4).
AUDIT_COLUMNS = "created_ms, kept_count, excluded_count, message_refs"
# A chat's audit replaces its last one.
AUDIT_UPSERT = (
    "ON CONFLICT (tenant, chat_id) DO UPDATE SET generation_id = excluded.generation_id, "
    "payload = excluded.payload, created_ms = excluded.created_ms, kept_count = excluded.kept_count, "
    "excluded_count = excluded.excluded_count, message_refs = excluded.message_refs"
)
# A chat's audit (tenant, chat id, generation id, payload, then `audit_params`).
INSERT_AUDIT = (
    f"INSERT INTO audits (tenant, chat_id, generation_id, payload, {AUDIT_COLUMNS}) "
    f"VALUES (?, ?, ?, ?, ?, ?, ?, ?) {AUDIT_UPSERT}"
)
_CALIBRATION = "SELECT factor, samples FROM calibrations WHERE tenant = ? AND model = ?"
# A chat's stored segments (migration 4): written with its audit, never twice; deleted once its
# audit no longer needs them (`_DELETE_SEGMENTS`' `{}` is one `?` per hash).
INSERT_SEGMENTS = (
    "INSERT INTO audit_segments (tenant, chat_id, segment_hash, data) VALUES (?, ?, ?, ?) "
    "ON CONFLICT DO NOTHING"
)
_DELETE_SEGMENTS = "DELETE FROM audit_segments WHERE tenant = ? AND chat_id = ? AND segment_hash IN ({})"
DELETE_SEGMENT = _DELETE_SEGMENTS.format("?")
_SEGMENTS = "SELECT segment_hash, data FROM audit_segments WHERE tenant = ? AND chat_id = ?"
_SEGMENT_HASHES = "SELECT segment_hash FROM audit_segments WHERE tenant = ? AND chat_id = ?"
# What a segment's row takes beyond its key and data (the row's header and cell pointer).
SEGMENT_ROW_BYTES = 32
# Parameters of one statement at most (SQLite's least limit is 999).
MAX_PARAMS = 900
AUDIT = (
    f"SELECT a.payload, a.message_refs, {', '.join(f'g.{c}' for c in _GENERATION_FIELDS)} "
    "FROM audits a JOIN generations g "
    "ON g.tenant = a.tenant AND g.generation_id = a.generation_id WHERE a.tenant = ? AND a.chat_id = ?"
)
# The chats' audits as they are: which generation each is, for `ShiftRecord.made_on`; `{}` is a
# list of `(?, ?)`, one per chat.
_CURRENT_AUDITS = (
    "SELECT a.tenant, a.chat_id, g.generation_id, g.created_ms FROM audits a JOIN generations g "
    "ON g.tenant = a.tenant AND g.generation_id = a.generation_id WHERE (a.tenant, a.chat_id) IN (VALUES {})"
)
# `_CURRENT_AUDITS` of one chat (tenant, chat id).
CURRENT_AUDIT = _CURRENT_AUDITS.format("(?, ?)")
# The statements the core's group writers run (`SqlCoreGroups`), in their order.
GROUP_STATEMENTS = (CURRENT_AUDIT, RECORD_GENERATION, INSERT_AUDIT, INSERT_SEGMENTS, DELETE_SEGMENT)
# A page of a tenant's chats, newest first (`Store.chats`): the audits through their index on
# (tenant, created_ms, chat_id, ...), which holds every audit column read, each joined to its
# generation by its primary key. `CHATS_AFTER` starts after a chat: its first condition bounds the
# index range, its second leaves out the chats of the same millisecond up to that one.
_CHATS_PAGE = (
    f"SELECT a.kept_count, a.excluded_count, {', '.join(f'g.{c}' for c in _GENERATION_FIELDS)} "
    "FROM audits a JOIN generations g ON g.tenant = a.tenant AND g.generation_id = a.generation_id "
    "WHERE a.tenant = ?{} ORDER BY a.created_ms DESC, a.chat_id DESC LIMIT ?"
)
CHATS_FIRST = _CHATS_PAGE.format("")
CHATS_AFTER = _CHATS_PAGE.format(" AND a.created_ms <= ? AND (a.created_ms < ? OR a.chat_id < ?)")
_CONFIG_COLUMNS = "model, role, context_size, max_output_tokens, system_reserve, profile, updated_ms"
# The room a shift's generation claims without an audit: one row.
GENERATION_BYTES = 128
# What a shift's audit claims beyond its rows' bytes: the pages its b-trees grow by when a row splits
# one (a page of SQLite's usual size).
SPLIT_BYTES = 4096
# Chats idle since a time: an old last shift and no newer append, or an old last append and no
# newer shift (each side found through its index on time).
_IDLE_CHATS = (
    "SELECT a.tenant, a.chat_id FROM generations g JOIN audits a "
    "ON a.tenant = g.tenant AND a.generation_id = g.generation_id WHERE g.created_ms < ? "
    "AND NOT EXISTS (SELECT 1 FROM chat_histories h WHERE h.tenant = a.tenant AND h.chat_id = a.chat_id "
    "AND h.appended_ms >= ?) "
    "UNION SELECT h.tenant, h.chat_id FROM chat_histories h WHERE h.appended_ms < ? "
    "AND NOT EXISTS (SELECT 1 FROM audits a JOIN generations g "
    "ON g.tenant = a.tenant AND g.generation_id = a.generation_id "
    "WHERE a.tenant = h.tenant AND a.chat_id = h.chat_id AND g.created_ms >= ?) "
    "LIMIT ?"
)
_CHATS = "SELECT COUNT(*) FROM (SELECT tenant, chat_id FROM audits UNION SELECT tenant, chat_id FROM chat_histories) c"


class Tx(Protocol):
    """One open transaction."""

    def rows(self, sql: str, params: Sequence[Any] = ()) -> list[Row]: ...

    def locked(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        """`rows` of a SELECT, locking them until the transaction ends (PostgreSQL `FOR UPDATE`;
        a SQLite write transaction holds the whole database already)."""
        ...

    def run(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Executes a statement; the rows it changed."""
        ...

    def run_many(self, sql: str, params: Sequence[Sequence[Any]]) -> None: ...

    def lock(self, key: str) -> None:
        """Holds a lock on `key` until the transaction ends, so transactions about the same thing
        (a chat with no rows yet, the schema) queue (PostgreSQL advisory locks; a SQLite write
        transaction holds the whole database already)."""
        ...

    def lock_all(self, keys: Sequence[str]) -> None:
        """`lock` of each key, in the order given (the same order in every transaction: sorted)."""
        ...

    def claim(self, nbytes: int) -> None:
        """Room for `nbytes` more bytes of data in this write, on top of what it claimed before,
        or `StoreFull` (nothing of it is granted; the caller may write no more, or roll back)."""
        ...


def _generation(row: Row) -> Generation:
    return Generation(
        generation_id=row[0],
        chat_id=row[1],
        model=row[2],
        prompt_tokens=row[3],
        approximate=bool(row[4]),
        created_ms=row[5],
        status=Status(row[6]),
        error_code=row[7],
        reported_prompt_tokens=row[8],
        finished_ms=row[9],
    )


def _stored_audit(rows: list[Row], segments: Sequence[StoredSegment] = ()) -> StoredAudit | None:
    if not rows:
        return None
    payload, refs = rows[0][:2]
    return StoredAudit(
        bytes(payload), _generation(rows[0][2:]), None if refs is None else bytes(refs), segments
    )


def _config(row: Row) -> ModelConfig:
    return ModelConfig(row[0], Role(row[1]), row[2], row[3], row[4], row[5], row[6])


def _calibration(model: str, rows: list[Row]) -> Calibration | None:
    return Calibration(model, rows[0][0], rows[0][1]) if rows else None


def chat_key(tenant: str, chat_id: str) -> str:
    """The `Tx.lock` key of a chat, held by what appends to its history, deletes it or finishes its
    generations. Ids hold no control characters: the separator keeps (tenant, chat) pairs apart."""
    return f"chat\x1f{tenant}\x1f{chat_id}"


def _used_since(tx: Tx, tenant: str, chat_id: str, since_ms: int) -> bool:
    """Whether the chat was shifted or appended to since `since_ms`, in a transaction holding the
    chat's lock. Its audit row is locked first: a shift of the chat committing meanwhile is waited
    for and then seen (its generation read afterwards, by a statement of its own)."""
    key = (tenant, chat_id)
    current = tx.locked("SELECT generation_id FROM audits WHERE tenant = ? AND chat_id = ?", key)
    times = tx.rows("SELECT appended_ms FROM chat_histories WHERE tenant = ? AND chat_id = ?", key)
    if current:
        times += tx.rows(
            "SELECT created_ms FROM generations WHERE tenant = ? AND generation_id = ?",
            (tenant, current[0][0]),
        )
    return any(used_ms >= since_ms for (used_ms,) in times)


def audit_params(r: ShiftRecord) -> tuple[int, int | None, int | None, bytes | None]:
    """The values of `AUDIT_COLUMNS` for a record's audit."""
    return (r.generation.created_ms, r.kept, r.excluded, r.message_refs)


def audit_row(r: ShiftRecord) -> tuple[Any, ...]:
    """The parameters of `INSERT_AUDIT` for a record with an audit."""
    g = r.generation
    return (r.tenant, g.chat_id, g.generation_id, r.audit, *audit_params(r))


def claim_bytes(r: ShiftRecord) -> int:
    """The room a record claims (`Tx.claim`)."""
    return GENERATION_BYTES if r.audit is None else _audit_bytes(r)


def _audit_bytes(r: ShiftRecord) -> int:
    """What a record with an audit adds to the store: its payload; with its messages stored as the
    chat's blocks, their references, the new segment, and a page for the b-trees its rows split (an
    audit's rows go into three tables and four indexes, no longer one long row)."""
    audit = len(r.audit or b"")
    if r.message_refs is None:
        return audit
    return audit + len(r.message_refs) + _segments_bytes(r) + SPLIT_BYTES


def _segments_bytes(r: ShiftRecord) -> int:
    """What a record's new segment adds to the store: its row's data and key, and what a row takes
    beyond them."""
    key = len(r.tenant.encode()) + len(r.generation.chat_id.encode()) + SEGMENT_ROW_BYTES
    return sum(key + len(segment_hash) + len(data) for segment_hash, data in r.new_segments)


def chunks(items: Sequence[T], size: int = MAX_PARAMS) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def stored_hashes(tx: Tx, tenant: str, chat_id: str) -> list[bytes]:
    """The hashes of the segments a chat has stored."""
    return [bytes(h) for (h,) in tx.rows(_SEGMENT_HASHES, (tenant, chat_id))]


def gone_segments(tx: Tx, r: ShiftRecord) -> Sequence[bytes]:
    """The stored segments of a record's chat that its audit no longer needs: as the record says,
    or for an unchecked record (whose new segment holds every block it references), found here."""
    if r.made_on is not UNCHECKED:
        return r.gone_segments
    needed = {segment_hash for segment_hash, _ in r.new_segments}
    return [h for h in stored_hashes(tx, r.tenant, r.generation.chat_id) if h not in needed]


def generation_params(tenant: str, g: Generation) -> tuple[Any, ...]:
    """The parameters of `RECORD_GENERATION`."""
    return (
        tenant,
        g.generation_id,
        g.chat_id,
        g.model,
        g.prompt_tokens,
        g.approximate,
        g.created_ms,
        Status.PENDING.value,
    )


class SqlCoreGroups(ABC):
    """A store's group commits run by the core (`Store.core_groups`), for the group writer
    (`audit.writer`): a record goes in with a token, and its outcome comes back when the socket
    (`fileno`) is readable. Used by the process that made it."""

    def __init__(
        self, store: SqlStore, writer: engine.SqliteGroupWriter | engine.PostgresGroupWriter
    ) -> None:
        self._writer = writer
        self.dialect = store.dialect
        self._description = store.description

    def fileno(self) -> int:
        return self._writer.fileno()

    def submit(self, token: int, record: ShiftRecord) -> bool:
        """Queues `record`; False when the core does not write it (an audit not checked against its
        chat's, or of no chat; or it stopped): the store's own path must."""
        g = record.generation
        audit: engine.GroupAudit | None = None
        if record.audit is not None:
            if not g.chat_id or isinstance(record.made_on, Unchecked):
                return False
            audit = (
                record.tenant,
                g.chat_id,
                chat_key(record.tenant, g.chat_id),
                record.made_on,
                audit_key(g),
                audit_row(record),
                record.new_segments,
                record.gone_segments,
            )
        return self._writer.submit(token, (generation_params(record.tenant, g), audit, claim_bytes(record)))

    def submit_read(self, token: int, tenant: str, chat_id: str) -> bool:
        return False  # a store whose reads need not wait (PostgreSQL's overrides)

    def finished(self) -> tuple[list[tuple[int, CoreOutcome]], list[tuple[int, float]]]:
        """The jobs finished since the last call, by token: a record's None stored, `DECLINED`, or
        why not (as this store's own writes say it: StoreUnavailable, StoreTimeout); a read's
        `AuditRead`; and each group's size and how long it took. What the core says of its
        connection (refused, made again) goes to the log."""
        records, groups, notices = self._writer.finished()
        for notice in notices:
            log.warning(notice, extra={"fields": {"store": self._description}})
        return [(token, self._outcome(outcome)) for token, outcome in records], groups

    def _outcome(self, outcome: Exception | bool | tuple[Row | None] | None) -> CoreOutcome:
        if outcome is None:
            return None
        if isinstance(outcome, bool):  # False: declined
            return DECLINED
        if isinstance(outcome, tuple):  # a read's row (None: none)
            (row,) = outcome
            return AuditRead(_stored_audit([] if row is None else [row]))
        return self._failure(outcome)

    @abstractmethod
    def _failure(self, error: Exception) -> CoreOutcome:
        """The outcome of a group that failed with `error`, as the store's own writes would say it."""

    def stop(self) -> None:
        """Writes what is queued, then stops (what it finished is still read)."""
        self._writer.stop()


def _segment_problems(tx: Tx) -> list[str]:
    """Chats whose stored segments are not exactly those their audit references, or whose audit's
    messages do not rebuild from them."""
    from contextshift import engine

    found = []
    stored: dict[tuple[str, str], list[StoredSegment]] = {}
    for tenant, chat_id, segment_hash, data in tx.rows(
        "SELECT tenant, chat_id, segment_hash, data FROM audit_segments"
    ):
        stored.setdefault((tenant, chat_id), []).append((bytes(segment_hash), bytes(data)))
    for tenant, chat_id, refs in tx.rows("SELECT tenant, chat_id, message_refs FROM audits"):
        segments = stored.pop((tenant, chat_id), [])
        where = f"chat {chat_id!r} (tenant {tenant!r})"
        if refs is None:
            if segments:
                found.append(f"{where} has stored segments its audit does not reference")
            continue
        try:
            referenced = set(engine.StoredBlocks.from_refs(bytes(refs)).segment_hashes())
            engine.rebuild_messages(bytes(refs), segments)
        except StoreDamaged as e:
            found.append(f"audit of {where}: {e}")
            continue
        if referenced != {segment_hash for segment_hash, _ in segments}:
            found.append(f"{where} has stored segments its audit does not reference")
    found += [f"chat {c!r} (tenant {t!r}) has stored segments and no audit" for t, c in sorted(stored)]
    return found


class SqlStore(ABC):
    """Everything but connections and transactions; see `contextshift.audit.store.Store`."""

    # The database's name for its migrations (`Migration.for_dialect`), and its binary column type,
    # for their `{blob}`.
    dialect: str
    blob_type: str
    # A statement counting the tables of the given name in the store's schema (0 or 1).
    table_exists: str

    @property
    @abstractmethod
    def description(self) -> str:
        """The store's kind and location for logs (no password)."""

    @abstractmethod
    def _run(self, work: Callable[[Tx], T], *, write: bool) -> T: ...

    @abstractmethod
    def _data_bytes(self, tx: Tx) -> int:
        """The data the store holds, as `max_store_bytes` counts it."""

    def _disk_free_bytes(self) -> int | None:
        """Free bytes on the disk under the store, where the store can see it."""
        return None

    def _query(self, sql: str, params: Sequence[Any]) -> list[Row]:
        """One read statement. A backend may run it without BEGIN and COMMIT (one statement reads
        one snapshot): over a network, that is one round trip instead of three."""
        return self._run(lambda tx: tx.rows(sql, params), write=False)

    # --- schema -----------------------------------------------------------------------------

    def migrate(self) -> int:
        def work(tx: Tx) -> int:
            tx.lock("contextshift schema")
            tx.run(SCHEMA_TABLE)
            ((current,),) = tx.rows("SELECT COALESCE(MAX(version), 0) FROM contextshift_schema")
            if current > LATEST:
                raise StoreConfigError(
                    f"the store's schema is at version {current}, newer than this contextshift "
                    f"knows (up to {LATEST}): upgrade contextshift"
                )
            for migration in MIGRATIONS[current:]:
                for statement in migration.for_dialect(self.dialect):
                    tx.run(statement.format(blob=self.blob_type, now_ms=now_ms()))
                if migration.convert is not None:
                    migration.convert(tx)
                tx.run(
                    "INSERT INTO contextshift_schema (version, description, applied_ms) VALUES (?, ?, ?)",
                    (migration.version, migration.description, now_ms()),
                )
            return LATEST

        return self._run(work, write=True)

    def schema_version(self) -> int:
        def work(tx: Tx) -> int:
            ((tables,),) = tx.rows(self.table_exists, ("contextshift_schema",))
            if not tables:
                return 0
            ((version,),) = tx.rows("SELECT COALESCE(MAX(version), 0) FROM contextshift_schema")
            return int(version)

        return self._run(work, write=False)

    def usage(self) -> Usage:
        def work(tx: Tx) -> tuple[int, int]:
            ((chats,),) = tx.rows(_CHATS)
            return self._data_bytes(tx), int(chats)

        data_bytes, chats = self._run(work, write=False)
        return Usage(data_bytes, chats, self._disk_free_bytes())

    def problems(self) -> list[str]:
        def work(tx: Tx) -> list[str]:
            found: list[str] = []
            for tenant, chat_id in tx.rows(
                "SELECT a.tenant, a.chat_id FROM audits a LEFT JOIN generations g "
                "ON g.tenant = a.tenant AND g.generation_id = a.generation_id "
                "WHERE g.generation_id IS NULL OR g.chat_id <> a.chat_id"
            ):
                found.append(f"audit of chat {chat_id!r} (tenant {tenant!r}) has no generation of its chat")
            for tenant, chat_id in tx.rows(
                "SELECT a.tenant, a.chat_id FROM audits a JOIN generations g "
                "ON g.tenant = a.tenant AND g.generation_id = a.generation_id WHERE g.created_ms <> a.created_ms"
            ):
                found.append(
                    f"audit of chat {chat_id!r} (tenant {tenant!r}) is not listed at its shift's time"
                )
            for tenant, chat_id, count, top in tx.rows(
                "SELECT tenant, chat_id, COUNT(*), MAX(position) FROM chat_blocks GROUP BY tenant, chat_id"
            ):
                if top != count - 1:
                    found.append(f"history of chat {chat_id!r} (tenant {tenant!r}) has gaps")
            ((orphans,),) = tx.rows(
                "SELECT COUNT(*) FROM chat_block_counts c LEFT JOIN chat_blocks b ON b.tenant = c.tenant "
                "AND b.chat_id = c.chat_id AND b.position = c.position WHERE b.position IS NULL"
            )
            if orphans:
                found.append(f"{orphans} stored counts of no stored block")
            for tenant, chat_id in tx.rows(
                "SELECT DISTINCT b.tenant, b.chat_id FROM chat_blocks b LEFT JOIN chat_histories h "
                "ON h.tenant = b.tenant AND h.chat_id = b.chat_id WHERE h.chat_id IS NULL"
            ):
                found.append(f"history of chat {chat_id!r} (tenant {tenant!r}) has no append time")
            return found + _segment_problems(tx)

        return self._run(work, write=False)

    # --- shifts -----------------------------------------------------------------------------

    def calibration(self, tenant: str, model: str) -> Calibration | None:
        return _calibration(model, self._query(_CALIBRATION, (tenant, model)))

    def history(self, tenant: str, chat_id: str, profile: str) -> list[HistoryBlock]:
        rows = self._query(_HISTORY, (profile, tenant, chat_id))
        return [HistoryBlock(text, tokens) for text, tokens in rows]

    def core_groups(self) -> CoreGroups | None:
        return None  # the store's own writes only (SQLite overrides)

    def record_shift(self, tenant: str, generation: Generation, audit: bytes | None) -> None:
        (outcome,) = self.record_shifts([ShiftRecord(tenant, generation, audit)])
        if outcome is not None:
            raise outcome

    def _run_group(self, work: Callable[[Tx], T]) -> T:
        """`_run` of a group of records (`record_shifts`)."""
        return self._run(work, write=True)

    def record_shifts(self, records: Sequence[ShiftRecord]) -> list[StoreError | None]:
        try:
            return self._run_group(functools.partial(self._record_shifts, records))
        except StoreUnavailable:
            raise
        except StoreError as e:
            if len(records) == 1:
                return [e]
        except Exception:
            if len(records) == 1:
                raise
        # The transaction failed whole (SQLite's SQLITE_FULL past the room its writes claimed, or
        # a disk full, rolls back all of it): each record alone, so only one that cannot be
        # stored fails.
        return [self.record_shifts([record])[0] for record in records]

    def _record_shifts(self, records: Sequence[ShiftRecord], tx: Tx) -> list[StoreError | None]:
        audited = [r for r in records if r.generation.chat_id and r.audit is not None]
        chats = sorted({(r.tenant, r.generation.chat_id) for r in audited})
        # The chats' locks before their audits are read, in one order in every transaction (no
        # deadlock between groups): what another process writes to them waits until this commits.
        tx.lock_all([chat_key(*chat) for chat in chats])
        checked = sorted({(r.tenant, r.generation.chat_id) for r in audited if r.made_on is not UNCHECKED})
        current: dict[tuple[str, str], AuditKey | None] = dict.fromkeys(checked)
        if checked:
            sql = _CURRENT_AUDITS.format(", ".join(["(?, ?)"] * len(checked)))
            for tenant, chat_id, generation_id, created_ms in tx.rows(sql, [v for c in checked for v in c]):
                current[(tenant, chat_id)] = (generation_id, created_ms)
        earlier: dict[tuple[str, str], ShiftRecord] = {}  # the group's records, by chat
        outcomes: list[StoreError | None] = []
        writes: list[tuple[int, ShiftRecord]] = []
        for r in records:
            chat = (r.tenant, r.generation.chat_id)
            checks = chat in current and r.audit is not None and r.made_on is not UNCHECKED
            if checks and r.made_on != current[chat]:
                before = earlier.get(chat)
                now = (
                    StoredAudit(before.audit, before.generation, before.message_refs)
                    if before is not None and before.audit is not None
                    else _stored_audit(tx.rows(AUDIT, chat))
                )
                outcomes.append(AuditChanged(r.generation.chat_id, now))
                continue
            try:
                tx.claim(claim_bytes(r))
            except StoreFull as e:
                outcomes.append(e)
                continue
            if r.audit is not None and r.generation.chat_id:
                # Written below: a later record of the chat in this group was made against the
                # audit this one replaces. (Should this one's generation id turn out to be in use,
                # that record is retried once more, against the audit the store then has.)
                current[chat], earlier[chat] = audit_key(r.generation), r
            writes.append((len(outcomes), r))
            outcomes.append(None)
        for (at, r), stored in zip(writes, self._write_shifts(tx, [r for _, r in writes]), strict=True):
            if not stored:
                outcomes[at] = GenerationIdInUse(r.generation.generation_id)
        return outcomes

    def _write_shifts(self, tx: Tx, records: Sequence[ShiftRecord]) -> list[bool]:
        """Writes each record's generation and audit; False for a record whose generation id
        another chat uses (nothing of it written)."""
        stored = []
        for r in records:
            g = r.generation
            written = tx.run(RECORD_GENERATION, generation_params(r.tenant, g)) > 0
            if written and r.audit is not None:
                tx.run(INSERT_AUDIT, audit_row(r))
                key = (r.tenant, g.chat_id)
                tx.run_many(INSERT_SEGMENTS, [(*key, *segment) for segment in r.new_segments])
                for gone in chunks(gone_segments(tx, r)):
                    tx.run(_DELETE_SEGMENTS.format(", ".join("?" * len(gone))), (*key, *gone))
            stored.append(written)
        return stored

    def finish(self, tenant: str, report: GenerationReport, alpha: float) -> Finished:
        def work(tx: Tx) -> Finished:
            chat_id = report.chat_id
            if not chat_id:  # a generation's chat never changes: read it to know which chat to lock
                found = tx.rows(
                    "SELECT chat_id FROM generations WHERE tenant = ? AND generation_id = ?",
                    (tenant, report.generation_id),
                )
                chat_id = found[0][0] if found else ""
            if chat_id:
                # The chat's lock before any row, as delete_chat takes it: a delete queues behind
                # this finish instead of deadlocking with it over the audit and generation rows.
                tx.lock(chat_key(tenant, chat_id))
            rows = tx.locked(
                f"SELECT {_GENERATION_COLUMNS} FROM generations WHERE tenant = ? AND generation_id = ?",
                (tenant, report.generation_id),
            )
            if not rows or (report.chat_id and rows[0][1] != report.chat_id):
                raise NotFound(report.generation_id)
            g = after = _generation(rows[0])
            if g.chat_id:
                # Locked: a newer shift's audit upsert waits until this finish commits, so a
                # generation is never finished (nor calibrated) after a newer one replaced it.
                current = tx.locked(
                    "SELECT generation_id FROM audits WHERE tenant = ? AND chat_id = ?", (tenant, g.chat_id)
                )
                if not current or current[0][0] != g.generation_id:
                    raise StaleGeneration(g.generation_id, g.chat_id, current[0][0] if current else None)
            if g.status is Status.PENDING:
                after = replace(
                    after, status=report.status, error_code=report.error_code, finished_ms=now_ms()
                )
                tx.run(
                    "UPDATE generations SET status = ?, error_code = ?, finished_ms = ? "
                    "WHERE tenant = ? AND generation_id = ?",
                    (after.status.value, after.error_code, after.finished_ms, tenant, g.generation_id),
                )
            elif g.status is not report.status:
                raise AlreadyFinished(g.generation_id, g.status)
            recorded = None
            if report.reported_prompt_tokens is not None and g.reported_prompt_tokens is None:
                after = replace(after, reported_prompt_tokens=report.reported_prompt_tokens)
                tx.run(
                    "UPDATE generations SET reported_prompt_tokens = ? WHERE tenant = ? AND generation_id = ?",
                    (report.reported_prompt_tokens, tenant, g.generation_id),
                )
                if g.approximate:
                    recorded = self._calibrate(tx, tenant, g, report.reported_prompt_tokens, alpha)
            current_calibration = recorded
            if current_calibration is None and g.model:
                current_calibration = _calibration(g.model, tx.rows(_CALIBRATION, (tenant, g.model)))
            return Finished(after, recorded is not None, current_calibration)

        return self._run(work, write=True)

    def _calibrate(
        self, tx: Tx, tenant: str, g: Generation, reported: int, alpha: float
    ) -> Calibration | None:
        if calibration.update(None, g.model, g.prompt_tokens, reported, alpha) is None:
            return None  # no information in the report
        # Create the row first, so concurrent reports for the model lock the same row.
        tx.run(
            "INSERT INTO calibrations (tenant, model, factor, samples, updated_ms) VALUES (?, ?, 1.0, 0, ?) "
            "ON CONFLICT (tenant, model) DO NOTHING",
            (tenant, g.model, now_ms()),
        )
        ((factor, samples),) = tx.locked(_CALIBRATION, (tenant, g.model))
        previous = Calibration(g.model, factor, samples) if samples else None
        updated = calibration.update(previous, g.model, g.prompt_tokens, reported, alpha)
        assert updated is not None  # the report carried information (checked above)
        tx.run(
            "UPDATE calibrations SET factor = ?, samples = ?, updated_ms = ? WHERE tenant = ? AND model = ?",
            (updated.factor, updated.samples, now_ms(), tenant, g.model),
        )
        return updated

    # --- audits and chats -------------------------------------------------------------------

    def audit_at_once(self, tenant: str, chat_id: str) -> StoredAudit | None:
        return _stored_audit(self._read_at_once(AUDIT, (tenant, chat_id)))

    def _read_at_once(self, sql: str, params: Sequence[Any]) -> list[Row]:
        """The rows of a read that cannot wait (see `Store.audit_at_once`), else WouldWait: a
        store whose reads are round trips never reads at once."""
        raise WouldWait(f"{self.dialect}: every read is a round trip")

    def audit(self, tenant: str, chat_id: str, *, with_blocks: bool = False) -> StoredAudit | None:
        if not with_blocks:
            return _stored_audit(self._query(AUDIT, (tenant, chat_id)))

        def work(tx: Tx) -> StoredAudit | None:
            # Locked: its segments are read as of the same moment, a shift of the chat waiting.
            found = tx.locked(AUDIT, (tenant, chat_id))
            segments = tx.rows(_SEGMENTS, (tenant, chat_id)) if found and found[0][1] is not None else []
            return _stored_audit(found, [(bytes(h), bytes(d)) for h, d in segments])

        return self._run(work, write=False)

    def chats(self, tenant: str, limit: int, after: ChatCursor | None = None) -> list[ChatSummary]:
        if after is None:
            rows = self._query(CHATS_FIRST, (tenant, limit))
        else:
            created_ms, chat_id = after
            rows = self._query(CHATS_AFTER, (tenant, created_ms, created_ms, chat_id, limit))
        return [ChatSummary(_generation(row[2:]), row[0], row[1]) for row in rows]

    def delete_chat(self, tenant: str, chat_id: str, *, idle_before_ms: int | None = None) -> bool:
        def work(tx: Tx) -> bool:
            # An append in progress finishes first: deleted under it, its blocks would land past
            # positions that no longer exist (a history with a gap).
            tx.lock(chat_key(tenant, chat_id))
            key = (tenant, chat_id)
            if idle_before_ms is not None and _used_since(tx, tenant, chat_id, idle_before_ms):
                return False
            deleted = tx.run("DELETE FROM audits WHERE tenant = ? AND chat_id = ?", key)
            tx.run("DELETE FROM audit_segments WHERE tenant = ? AND chat_id = ?", key)
            deleted += tx.run("DELETE FROM generations WHERE tenant = ? AND chat_id = ?", key)
            deleted += tx.run("DELETE FROM chat_block_counts WHERE tenant = ? AND chat_id = ?", key)
            deleted += tx.run("DELETE FROM chat_blocks WHERE tenant = ? AND chat_id = ?", key)
            tx.run("DELETE FROM chat_histories WHERE tenant = ? AND chat_id = ?", key)
            return deleted > 0

        return self._run(work, write=True)

    def idle_chats(self, before_ms: int, limit: int) -> list[tuple[str, str]]:
        rows = self._query(_IDLE_CHATS, (before_ms, before_ms, before_ms, before_ms, limit))
        return [(tenant, chat_id) for tenant, chat_id in rows]

    def append_blocks(self, tenant: str, chat_id: str, profile: str, prepare: PrepareBlocks) -> int:
        def work(tx: Tx) -> int:
            tx.lock(chat_key(tenant, chat_id))
            stored = [
                HistoryBlock(text, tokens) for text, tokens in tx.rows(_HISTORY, (profile, tenant, chat_id))
            ]
            new = prepare(stored)
            tx.claim(sum(len(block.json.encode()) for block in new))
            start = len(stored)
            tx.run(
                "INSERT INTO chat_histories (tenant, chat_id, appended_ms) VALUES (?, ?, ?) "
                "ON CONFLICT (tenant, chat_id) DO UPDATE SET appended_ms = excluded.appended_ms",
                (tenant, chat_id, now_ms()),
            )
            tx.run_many(
                "INSERT INTO chat_blocks (tenant, chat_id, position, block_json) VALUES (?, ?, ?, ?)",
                [(tenant, chat_id, start + i, block.json) for i, block in enumerate(new)],
            )
            tx.run_many(
                "INSERT INTO chat_block_counts (tenant, chat_id, position, profile, tokens) "
                "VALUES (?, ?, ?, ?, ?)",
                [
                    (tenant, chat_id, start + i, profile, block.tokens)
                    for i, block in enumerate(new)
                    if block.tokens is not None
                ],
            )
            return start + len(new)

        return self._run(work, write=True)

    # --- model configurations ---------------------------------------------------------------

    def set_model_config(self, tenant: str, config: ModelConfig) -> ModelConfig:
        stored = replace(config, updated_ms=now_ms())

        def work(tx: Tx) -> ModelConfig:
            if stored.role is not Role.NONE:
                tx.run(
                    "UPDATE model_configs SET role = '' WHERE tenant = ? AND role = ? AND model <> ?",
                    (tenant, stored.role.value, stored.model),
                )
            tx.run(
                f"INSERT INTO model_configs (tenant, {_CONFIG_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (tenant, model) DO UPDATE SET role = excluded.role, "
                "context_size = excluded.context_size, max_output_tokens = excluded.max_output_tokens, "
                "system_reserve = excluded.system_reserve, profile = excluded.profile, "
                "updated_ms = excluded.updated_ms",
                (
                    tenant,
                    stored.model,
                    stored.role.value,
                    stored.context_size,
                    stored.max_output_tokens,
                    stored.system_reserve,
                    stored.profile,
                    stored.updated_ms,
                ),
            )
            return stored

        return self._run(work, write=True)

    def get_model_config(self, tenant: str, model: str = "", role: Role = Role.NONE) -> ModelConfig | None:
        if role is not Role.NONE:
            where, key = "role = ?", role.value
        else:
            where, key = "model = ?", model
        rows = self._query(
            f"SELECT {_CONFIG_COLUMNS} FROM model_configs WHERE tenant = ? AND {where}", (tenant, key)
        )
        return _config(rows[0]) if rows else None

    def model_configs(self, tenant: str) -> list[ModelConfig]:
        rows = self._query(
            f"SELECT {_CONFIG_COLUMNS} FROM model_configs WHERE tenant = ? ORDER BY model", (tenant,)
        )
        return [_config(row) for row in rows]

    def delete_model_config(self, tenant: str, model: str) -> bool:
        return (
            self._run(
                lambda tx: tx.run(
                    "DELETE FROM model_configs WHERE tenant = ? AND model = ?", (tenant, model)
                ),
                write=True,
            )
            > 0
        )

    # --- housekeeping -----------------------------------------------------------------------

    def prune_generations(self, older_than_ms: int) -> int:
        return self._run(
            lambda tx: tx.run(
                "DELETE FROM generations WHERE created_ms < ? AND NOT EXISTS (SELECT 1 FROM audits a "
                "WHERE a.tenant = generations.tenant AND a.generation_id = generations.generation_id)",
                (older_than_ms,),
            ),
            write=True,
        )
