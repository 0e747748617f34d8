"""Steps of migrations that rewrite stored data, which SQL alone cannot (see `migrations`). Each runs
in its migration's transaction, under the schema lock, after the migration's statements."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

# Rows rewritten per statement batch (a batch's payloads are held in memory at once).
BATCH = 200


class Rewrite(Protocol):
    """What a step uses of the migration's transaction (`sql.Tx`)."""

    def rows(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]: ...

    def run_many(self, sql: str, params: Sequence[Sequence[Any]]) -> None: ...


def messages_to_blocks(tx: Rewrite) -> None:
    """Migration 4: each audit's messages, stored whole in its payload until now, become the chat's
    stored blocks, one segment (`engine.store_messages`), and the payload keeps references to them.
    An audit whose messages cannot be rebuilt from their elements, that has none, or whose payload
    is not one this code wrote, stays as it is."""
    import lz4.frame
    from google.protobuf.message import DecodeError

    from contextshift import engine
    from contextshift._proto.contextshift.v1 import context_service_pb2 as pb

    after = ("", "")
    while True:
        rows = tx.rows(
            "SELECT tenant, chat_id, payload FROM audits WHERE message_refs IS NULL "
            "AND (tenant > ? OR (tenant = ? AND chat_id > ?)) ORDER BY tenant, chat_id LIMIT ?",
            (after[0], after[0], after[1], BATCH),
        )
        if not rows:
            return
        updates, segments = [], []
        for tenant, chat_id, payload in rows:
            try:
                audit = pb.ContextAudit.FromString(lz4.frame.decompress(bytes(payload)))
            except (RuntimeError, DecodeError):  # not an LZ4 frame of an audit
                continue
            messages = audit.plan.messages
            if audit.messages_omitted or not messages.messages_json:
                continue
            refs, new, _, _ = engine.store_messages(messages.messages_json.encode(), engine.StoredBlocks())
            if refs is None:
                continue
            messages.messages_json = ""
            updates.append((lz4.frame.compress(audit.SerializeToString()), refs, tenant, chat_id))
            segments += [(tenant, chat_id, segment_hash, data) for segment_hash, data in new]
        tx.run_many(
            "UPDATE audits SET payload = ?, message_refs = ? WHERE tenant = ? AND chat_id = ?", updates
        )
        tx.run_many(
            "INSERT INTO audit_segments (tenant, chat_id, segment_hash, data) VALUES (?, ?, ?, ?)", segments
        )
        after = (rows[-1][0], rows[-1][1])
