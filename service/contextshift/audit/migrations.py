"""The store's schema, as numbered migrations shared by SQLite and PostgreSQL.

Each migration is a list of statements in the SQL both databases speak; `{blob}` stands for the
binary type (BLOB, BYTEA) and `{now_ms}` for the time the migration runs; some rewrite stored data
too (`conversions`). A store applies the migrations it has not applied yet, in order, in one
transaction that also records them in `contextshift_schema` (DDL is transactional in both), under
a lock (SQLite's write lock, a PostgreSQL advisory lock), so processes starting together apply each
migration once. Never edit an applied migration: add the next one.

Times are Unix milliseconds; every key starts with the tenant.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from contextshift.audit import conversions


@dataclass(frozen=True)
class Migration:
    version: int
    description: str
    statements: tuple[str, ...]
    postgres: tuple[str, ...] = ()  # run by PostgreSQL only, after the statements
    # Rewrites stored data after the statements (`conversions`), in the same transaction.
    convert: Callable[[conversions.Rewrite], None] | None = None

    def for_dialect(self, dialect: str) -> tuple[str, ...]:
        return self.statements + (self.postgres if dialect == "postgresql" else ())


SCHEMA_TABLE = """CREATE TABLE IF NOT EXISTS contextshift_schema (
    version INTEGER PRIMARY KEY,
    description TEXT NOT NULL,
    applied_ms BIGINT NOT NULL
)"""

MIGRATIONS = (
    Migration(
        1,
        "generations, audits, calibrations, chat history and its counts, model configurations",
        (
            # One row per ShiftContext that can be finished: with a chat, or calibrated.
            """CREATE TABLE generations (
                tenant TEXT NOT NULL,
                generation_id TEXT NOT NULL,
                chat_id TEXT NOT NULL,
                model TEXT NOT NULL,
                prompt_tokens BIGINT NOT NULL,
                approximate BOOLEAN NOT NULL,
                status TEXT NOT NULL,
                error_code TEXT,
                reported_prompt_tokens BIGINT,
                created_ms BIGINT NOT NULL,
                finished_ms BIGINT,
                PRIMARY KEY (tenant, generation_id)
            )""",
            "CREATE INDEX generations_by_chat ON generations (tenant, chat_id)",
            "CREATE INDEX generations_by_age ON generations (created_ms)",
            # The last audit of each chat; its status is its generation's.
            """CREATE TABLE audits (
                tenant TEXT NOT NULL,
                chat_id TEXT NOT NULL,
                generation_id TEXT NOT NULL,
                payload {blob} NOT NULL,
                PRIMARY KEY (tenant, chat_id),
                FOREIGN KEY (tenant, generation_id) REFERENCES generations (tenant, generation_id)
                    ON DELETE CASCADE
            )""",
            "CREATE INDEX audits_by_generation ON audits (tenant, generation_id)",
            """CREATE TABLE calibrations (
                tenant TEXT NOT NULL,
                model TEXT NOT NULL,
                factor DOUBLE PRECISION NOT NULL,
                samples BIGINT NOT NULL,
                updated_ms BIGINT NOT NULL,
                PRIMARY KEY (tenant, model)
            )""",
            # A chat's stored history (AppendBlocks): each block's own JSON text, at 0..n-1.
            """CREATE TABLE chat_blocks (
                tenant TEXT NOT NULL,
                chat_id TEXT NOT NULL,
                position BIGINT NOT NULL,
                block_json TEXT NOT NULL,
                PRIMARY KEY (tenant, chat_id, position)
            )""",
            # Their tokens per profile.
            """CREATE TABLE chat_block_counts (
                tenant TEXT NOT NULL,
                chat_id TEXT NOT NULL,
                position BIGINT NOT NULL,
                profile TEXT NOT NULL,
                tokens BIGINT NOT NULL,
                PRIMARY KEY (tenant, chat_id, position, profile),
                FOREIGN KEY (tenant, chat_id, position) REFERENCES chat_blocks (tenant, chat_id, position)
                    ON DELETE CASCADE
            )""",
            # Role '' is none; at most one configuration of a tenant holds each role.
            """CREATE TABLE model_configs (
                tenant TEXT NOT NULL,
                model TEXT NOT NULL,
                role TEXT NOT NULL,
                context_size BIGINT,
                max_output_tokens BIGINT,
                system_reserve BIGINT,
                profile TEXT NOT NULL,
                updated_ms BIGINT NOT NULL,
                PRIMARY KEY (tenant, model)
            )""",
            "CREATE UNIQUE INDEX model_configs_by_role ON model_configs (tenant, role) WHERE role <> ''",
        ),
    ),
    Migration(
        2,
        "chat_histories: when each chat's stored history was last appended to (chat_retention_days)",
        (
            # One row per chat with a stored history. A chat's last shift is its audit's
            # generation's created_ms; its last append is here.
            """CREATE TABLE chat_histories (
                tenant TEXT NOT NULL,
                chat_id TEXT NOT NULL,
                appended_ms BIGINT NOT NULL,
                PRIMARY KEY (tenant, chat_id)
            )""",
            "CREATE INDEX chat_histories_by_age ON chat_histories (appended_ms)",
            # Histories stored before count as appended to when this migration ran.
            "INSERT INTO chat_histories (tenant, chat_id, appended_ms) "
            "SELECT DISTINCT tenant, chat_id, {now_ms} FROM chat_blocks",
        ),
        postgres=(
            # The bytes of audits and history blocks, kept up to date by triggers on the statements
            # that write and delete them (max_store_bytes; a SQLite store counts its pages in use
            # instead). Split in shards, one per backend process (mod 64), so writers on different
            # connections never wait for each other's counts. Row triggers where rows come one by
            # one (an audit, a block appended), a statement trigger where a deletion takes many.
            "CREATE TABLE store_usage (shard INTEGER PRIMARY KEY, bytes BIGINT NOT NULL)",
            "INSERT INTO store_usage (shard, bytes) SELECT shard, 0 FROM generate_series(0, 63) shard",
            """CREATE FUNCTION contextshift_count_bytes() RETURNS trigger LANGUAGE plpgsql AS $$
            DECLARE
                delta BIGINT := 0;
            BEGIN
                IF TG_LEVEL = 'STATEMENT' THEN  -- a deletion: its rows are in `removed`
                    IF TG_TABLE_NAME = 'audits' THEN
                        delta := -(SELECT COALESCE(SUM(octet_length(payload)), 0) FROM removed);
                    ELSE
                        delta := -(SELECT COALESCE(SUM(octet_length(block_json)), 0) FROM removed);
                    END IF;
                ELSIF TG_TABLE_NAME = 'audits' THEN
                    delta := octet_length(NEW.payload);
                    IF TG_OP = 'UPDATE' THEN
                        delta := delta - octet_length(OLD.payload);
                    END IF;
                ELSE
                    delta := octet_length(NEW.block_json);
                END IF;
                IF delta <> 0 THEN
                    UPDATE store_usage SET bytes = bytes + delta WHERE shard = pg_backend_pid() & 63;
                END IF;
                RETURN NULL;
            END
            $$""",
            "CREATE TRIGGER audits_written_bytes AFTER INSERT OR UPDATE OF payload ON audits "
            "FOR EACH ROW EXECUTE FUNCTION contextshift_count_bytes()",
            "CREATE TRIGGER chat_blocks_written_bytes AFTER INSERT ON chat_blocks "
            "FOR EACH ROW EXECUTE FUNCTION contextshift_count_bytes()",
            *(
                f"CREATE TRIGGER {table}_deleted_bytes AFTER DELETE ON {table} REFERENCING OLD TABLE AS removed "
                "FOR EACH STATEMENT EXECUTE FUNCTION contextshift_count_bytes()"
                for table in ("audits", "chat_blocks")
            ),
            "UPDATE store_usage SET bytes = "
            "(SELECT COALESCE(SUM(octet_length(payload)), 0) FROM audits) + "
            "(SELECT COALESCE(SUM(octet_length(block_json)), 0) FROM chat_blocks) WHERE shard = 0",
        ),
    ),
    Migration(
        3,
        "audits: when each was shifted and its kept and excluded counts, indexed for ListChats",
        (
            # When the audit's shift ran (its generation's created_ms, which a report never
            # changes), and its counts: NULL for the audits stored before, which are not known
            # without decoding their payloads (the store never does; a chat's next shift stores
            # them).
            "ALTER TABLE audits ADD COLUMN created_ms BIGINT NOT NULL DEFAULT 0",
            "ALTER TABLE audits ADD COLUMN kept_count BIGINT",
            "ALTER TABLE audits ADD COLUMN excluded_count BIGINT",
            "UPDATE audits SET created_ms = (SELECT g.created_ms FROM generations g "
            "WHERE g.tenant = audits.tenant AND g.generation_id = audits.generation_id)",
            # A tenant's chats, the most recently shifted first, a page at a time: the index holds
            # every column of the audit the listing reads, so it never reads the audit's row (in
            # SQLite, the new columns come after the payload, which may run over many pages).
            "CREATE INDEX audits_by_time ON audits "
            "(tenant, created_ms, chat_id, generation_id, kept_count, excluded_count)",
        ),
    ),
    Migration(
        4,
        "audit_segments: an audit's messages stored once per chat, the audit referencing them",
        (
            # The blocks of a chat's audit, each once: the blocks one write added form a segment,
            # compressed together and keyed by a hash (16 bytes) of its blocks' hashes
            # (`engine.store_messages`). A chat holds the segments its audit references, so a next
            # turn writes one segment of its new blocks and deletes those no longer needed.
            """CREATE TABLE audit_segments (
                tenant TEXT NOT NULL,
                chat_id TEXT NOT NULL,
                segment_hash {blob} NOT NULL,
                data {blob} NOT NULL,
                PRIMARY KEY (tenant, chat_id, segment_hash)
            )""",
            # The audit's references to them, in order (NULL: its messages are in its payload).
            "ALTER TABLE audits ADD COLUMN message_refs {blob}",
        ),
        postgres=(
            # store_usage counts the segments' bytes too (migration 2).
            """CREATE OR REPLACE FUNCTION contextshift_count_bytes() RETURNS trigger LANGUAGE plpgsql AS $$
            DECLARE
                delta BIGINT := 0;
            BEGIN
                IF TG_LEVEL = 'STATEMENT' THEN  -- a deletion: its rows are in `removed`
                    IF TG_TABLE_NAME = 'audits' THEN
                        delta := -(SELECT COALESCE(SUM(octet_length(payload)), 0) FROM removed);
                    ELSIF TG_TABLE_NAME = 'audit_segments' THEN
                        delta := -(SELECT COALESCE(SUM(octet_length(data)), 0) FROM removed);
                    ELSE
                        delta := -(SELECT COALESCE(SUM(octet_length(block_json)), 0) FROM removed);
                    END IF;
                ELSIF TG_TABLE_NAME = 'audits' THEN
                    delta := octet_length(NEW.payload);
                    IF TG_OP = 'UPDATE' THEN
                        delta := delta - octet_length(OLD.payload);
                    END IF;
                ELSIF TG_TABLE_NAME = 'audit_segments' THEN
                    delta := octet_length(NEW.data);
                ELSE
                    delta := octet_length(NEW.block_json);
                END IF;
                IF delta <> 0 THEN
                    UPDATE store_usage SET bytes = bytes + delta WHERE shard = pg_backend_pid() & 63;
                END IF;
                RETURN NULL;
            END
            $$""",
            "CREATE TRIGGER audit_segments_written_bytes AFTER INSERT ON audit_segments "
            "FOR EACH ROW EXECUTE FUNCTION contextshift_count_bytes()",
            "CREATE TRIGGER audit_segments_deleted_bytes AFTER DELETE ON audit_segments "
            "REFERENCING OLD TABLE AS removed FOR EACH STATEMENT EXECUTE FUNCTION contextshift_count_bytes()",
        ),
        convert=conversions.messages_to_blocks,
    ),
)

LATEST = MIGRATIONS[-1].version
