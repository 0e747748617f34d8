"""The one module that imports the Rust core. Everything else reaches Rust through here, so
the boundary (and its typed stub, `_core.pyi`) stays in one place."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeAlias

from contextshift._core import (
    BlockDecision,
    Conversation,
    Counts,
    Layout,
    Plan,
    PostgresGroupWriter,
    ProfileDescription,
    SqliteGroupWriter,
    StoredBlocks,
    block_cache_stats,
    clear_count_cache,
    configure_block_cache,
    configure_count_cache,
    count_cache_stats,
    count_items,
    count_texts_uncached,
    count_tools,
    describe_profile,
    encode_pieces,
    profiles,
    read_previous_prompt,
    rebuild_messages,
    rewrite_block,
    split_message_field,
    store_messages,
)

# Part of an encoded message for `encode_pieces`: bytes as they are, or `(field_number, pieces)`
# for a length-delimited field made of them.
Piece: TypeAlias = "bytes | tuple[int, Sequence[Piece]]"
# A statement's parameter as the group writers bind it (a bool as an int, as sqlite3 does).
SqlParam: TypeAlias = int | str | bytes | None
# A record's audit for the group writers' `submit`: (tenant, chat id, the chat's lock key, the
# chat's audit it was made on (None: none), its own audit's key, the audit's parameters, the new
# segments (hash, data), the hashes of the segments it no longer needs).
GroupAudit: TypeAlias = tuple[
    str,
    str,
    str,
    "tuple[str, int] | None",
    tuple[str, int],
    Sequence[SqlParam],
    Sequence[tuple[bytes, bytes]],
    Sequence[bytes],
]

__all__ = [
    "BlockDecision",
    "Conversation",
    "Counts",
    "GroupAudit",
    "Layout",
    "Piece",
    "Plan",
    "PostgresGroupWriter",
    "ProfileDescription",
    "SqlParam",
    "SqliteGroupWriter",
    "StoredBlocks",
    "block_cache_stats",
    "clear_count_cache",
    "configure_block_cache",
    "configure_count_cache",
    "count_cache_stats",
    "count_items",
    "count_texts_uncached",
    "count_tools",
    "describe_profile",
    "encode_pieces",
    "profiles",
    "read_previous_prompt",
    "rebuild_messages",
    "rewrite_block",
    "split_message_field",
    "store_messages",
]


def wire_problem(message: bytes) -> str | None:
    """The first malformed top-level field of an encoded protobuf message, with its byte offset
    ("field runs past the end of the message at byte 4"), or None when every field is well framed.
    Field number 0 is never a field's, so the split walks the whole message."""
    try:
        split_message_field(message, 0)
    except ValueError as e:
        return str(e)
    return None
