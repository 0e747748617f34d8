"""contextshift: fit an LLM prompt into a model's context window.

Library API (no network hop; the gRPC service runs the same engine):

    import contextshift
    result = contextshift.shift_context(blocks, budget=contextshift.Budget(128_000, 16_000))
    result.kept, result.excluded, result.messages
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from contextshift.budget import Budget
from contextshift.diagnostics import CompactionUsage, Diagnostic
from contextshift.engine import BlockDecision
from contextshift.errors import (
    ContextShiftError,
    FieldViolation,
    InternalError,
    InvalidBlocks,
    InvalidInput,
    InvalidOptions,
    InvalidTools,
    TokenBudgetExceeded,
)
from contextshift.options import OptionSpec
from contextshift.plugins import (
    InterceptorContext,
    ShiftView,
    StrategyPlan,
    register_interceptor,
    register_strategy,
)
from contextshift.profiles import count_tokens
from contextshift.reasons import Reason
from contextshift.result import ImageCount, ReasoningCount, ShiftResult, Truncation
from contextshift.shift import shift_context
from contextshift.strategies import list_strategies

if TYPE_CHECKING:
    from contextshift.client import AsyncClient, Client

__all__ = [
    "AsyncClient",
    "BlockDecision",
    "Budget",
    "Client",
    "CompactionUsage",
    "ContextShiftError",
    "Diagnostic",
    "FieldViolation",
    "ImageCount",
    "InterceptorContext",
    "InternalError",
    "InvalidBlocks",
    "InvalidInput",
    "InvalidOptions",
    "InvalidTools",
    "OptionSpec",
    "Reason",
    "ReasoningCount",
    "ShiftResult",
    "ShiftView",
    "StrategyPlan",
    "TokenBudgetExceeded",
    "Truncation",
    "count_tokens",
    "list_strategies",
    "register_interceptor",
    "register_strategy",
    "shift_context",
]


def __getattr__(name: str) -> Any:
    # The clients load grpc; library-only callers (and the CLI's preview) do not pay for it.
    if name in {"Client", "AsyncClient"}:
        from contextshift import client

        return getattr(client, name)
    raise AttributeError(f"module 'contextshift' has no attribute {name!r}")
