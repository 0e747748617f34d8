"""Strategies: how a shift chooses what to drop once the prompt is over budget.

A strategy gets the parsed conversation, its counts, the budget, the pins the cap removed and the
options, and returns the core's `Plan`. Protected blocks and whole tool groups are enforced by the
core for every strategy. Later strategies (summarize, vector-recall, manual, llm-compact) and
plugin strategies register here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from contextshift.engine import Conversation, Counts, Plan
from contextshift.errors import InvalidOptions
from contextshift.options import ShiftOptions


@dataclass(frozen=True)
class StrategyInput:
    conversation: Conversation
    counts: Counts
    budget: int
    unpinned: list[int]
    options: ShiftOptions


Strategy = Callable[[StrategyInput], Plan]


def truncate(inp: StrategyInput) -> Plan:
    """Drop the oldest unprotected group until the prompt fits; stop as soon as it fits."""
    return inp.conversation.plan(
        inp.counts,
        inp.budget,
        inp.unpinned,
        inp.options.protect_current_input,
        inp.options.start_on_user,
    )


STRATEGIES: dict[str, Strategy] = {"truncate": truncate}


def strategy_named(name: str) -> Strategy:
    try:
        return STRATEGIES[name]
    except KeyError:
        raise InvalidOptions(
            [("strategy", f"unknown strategy {name!r} (known: {', '.join(sorted(STRATEGIES))})")]
        ) from None
