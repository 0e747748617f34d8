"""contextshift: fit an LLM prompt into a model's context window.

Library API (no network hop; the gRPC service runs the same engine):

    import contextshift
    result = contextshift.shift_context(blocks, budget=contextshift.Budget(128_000, 16_000))
    result.kept, result.excluded, result.messages
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from contextshift import engine
from contextshift.budget import Budget
from contextshift.engine import BlockDecision
from contextshift.errors import (
    ContextShiftError,
    FieldViolation,
    InternalError,
    InvalidBlocks,
    InvalidInput,
    InvalidOptions,
    TokenBudgetExceeded,
)
from contextshift.shift import ShiftResult, Truncation, shift_context

__all__ = [
    "BlockDecision",
    "Budget",
    "ContextShiftError",
    "FieldViolation",
    "InternalError",
    "InvalidBlocks",
    "InvalidInput",
    "InvalidOptions",
    "ShiftResult",
    "TokenBudgetExceeded",
    "Truncation",
    "count_tokens",
    "shift_context",
]


def count_tokens(texts_or_blocks: Sequence[str | Mapping[str, Any]], profile: str = "heuristic") -> list[int]:
    """Tokens of each item: a str counts as text, a block dict as a whole block (with overhead)."""
    return engine.count_items(texts_or_blocks, profile)
