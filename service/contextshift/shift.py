"""`shift_context`: the stages of DESIGN.md §6 / docs/semantics.md §4, orchestrated over the
Rust core."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from contextshift import engine
from contextshift.budget import Budget, resolve_budget
from contextshift.engine import BlockDecision
from contextshift.errors import InternalError
from contextshift.options import ShiftOptions
from contextshift.profiles import resolve
from contextshift.strategies import StrategyInput, strategy_named


@dataclass(frozen=True, slots=True)
class Truncation:
    id: str
    tokens_before: int
    tokens_after: int
    how: str


@dataclass(frozen=True)
class ShiftResult:
    kept: list[BlockDecision]
    excluded: list[BlockDecision]
    truncated: list[Truncation]
    prompt_tokens: int
    budget: int
    profile: str
    approximate: bool
    warnings: list[str]
    # The kept blocks as given, in order; a block the char cap cut is a copy with the cut text.
    messages: list[Mapping[str, Any]]


def shift_context(
    blocks: Sequence[Mapping[str, Any]] | str | bytes,
    *,
    budget: int | Budget,
    profile: str = "heuristic",
    strategy: str = "truncate",
    options: Mapping[str, Any] | None = None,
) -> ShiftResult:
    """Fit `blocks` (oldest first) into `budget` tokens. `blocks` is a list of dicts, or the same
    as JSON text (parsed in Rust without the GIL; `messages` are then fresh dicts). Raises
    `InvalidBlocks`, `InvalidOptions`, or `TokenBudgetExceeded` when protected blocks alone do not
    fit."""
    opts = ShiftOptions.from_mapping(options)
    resolved = resolve_budget(budget)
    run_strategy = strategy_named(strategy)
    resolution = resolve(profile)

    # 1-2. Parse and cut over-long blocks.
    if isinstance(blocks, str | bytes):
        conversation = engine.Conversation.from_json(blocks, opts.max_block_chars)
    else:
        conversation = engine.Conversation(blocks, opts.max_block_chars)
    counts = conversation.count(resolution.profile)
    # 3. Pinned cap.
    unpinned = conversation.pinned_cap(counts, opts.pinned_cap * resolved.tokens)
    # 4-5. Orphans, the strategy, the leading-assistant repair.
    plan = run_strategy(StrategyInput(conversation, counts, resolved.tokens, unpinned, opts))
    # 6. Independent recount of what is sent.
    prompt_tokens = conversation.recount(resolution.profile, plan.kept)
    if prompt_tokens != plan.total or prompt_tokens > resolved.tokens:
        raise InternalError(
            f"recount gave {prompt_tokens} tokens, the plan {plan.total}, budget {resolved.tokens}"
        )

    cuts = conversation.cuts(resolution.profile)
    messages: list[Mapping[str, Any]]
    if isinstance(blocks, str | bytes):
        messages = list(conversation.json_messages(plan.kept))
    else:
        cut_messages: dict[int, Mapping[str, Any]] = {index: message for index, *_, message in cuts}
        messages = [cut_messages.get(i, blocks[i]) for i in plan.kept]
    return ShiftResult(
        kept=plan.kept_decisions,
        excluded=plan.excluded_decisions,
        truncated=[Truncation(block_id, before, after, "CHAR_CAP") for _, block_id, before, after, _ in cuts],
        prompt_tokens=prompt_tokens,
        budget=resolved.tokens,
        profile=resolution.profile,
        approximate=resolution.approximate,
        warnings=resolution.warnings
        + resolved.warnings
        + [f"unpinned {conversation.block_id(i)} by pinned_cap" for i in unpinned],
        messages=messages,
    )
