"""The one module that imports the Rust core. Everything else reaches Rust through here, so
the boundary (and its typed stub, `_core.pyi`) stays in one place."""

from __future__ import annotations

from contextshift._core import (
    BlockDecision,
    Conversation,
    Counts,
    Plan,
    ProfileDescription,
    clear_count_cache,
    configure_count_cache,
    count_cache_stats,
    count_items,
    describe_profile,
    encode_message_field,
    profiles,
    split_message_field,
)

__all__ = [
    "BlockDecision",
    "Conversation",
    "Counts",
    "Plan",
    "ProfileDescription",
    "clear_count_cache",
    "configure_count_cache",
    "count_cache_stats",
    "count_items",
    "describe_profile",
    "encode_message_field",
    "profiles",
    "split_message_field",
]
