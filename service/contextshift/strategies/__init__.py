"""Strategies: how a shift chooses what to drop, rewrite or summarize once the prompt is over
budget. Each is a function of a `StrategyContext` returning an `Outcome` (see context.py);
the registry (registry.py) holds the built-ins below and the plugins' (contextshift.plugins).
"""

from __future__ import annotations

from contextshift.strategies import (
    clear_tool_results,
    llm_compact,
    manual,
    summarize,
    truncate,
    vector_recall,
)
from contextshift.strategies.context import Outcome, Relevance, Rewrite, StrategyContext, Summary
from contextshift.strategies.registry import StrategyInfo, add, list_strategies, runs_inline, strategy_named

DEFAULT_STRATEGY = "truncate"

for _module in (truncate, summarize, vector_recall, manual, clear_tool_results, llm_compact):
    add(_module.INFO)

__all__ = [
    "DEFAULT_STRATEGY",
    "Outcome",
    "Relevance",
    "Rewrite",
    "StrategyContext",
    "StrategyInfo",
    "Summary",
    "list_strategies",
    "runs_inline",
    "strategy_named",
]
