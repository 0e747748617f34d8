"""Reasoning in a shift (docs/semantics.md §2.1, §4.2, §7): the reasoning of old turns left out
first when room is needed (`keep_reasoning_turns`, like Anthropic's `clear_thinking` context edit),
what the plan says about the reasoning it kept, and the blocks whose reasoning is over the char cap.

Reasoning is never edited: a rewrite only removes it whole (Anthropic `thinking` and
`redacted_thinking` parts, a message's `reasoning_content`), and only where the profile's provider
accepts it missing. A Responses reasoning item is never removed on its own: its output items name
it (it goes with them, as one group).
"""

from __future__ import annotations

from dataclasses import dataclass

from contextshift import engine
from contextshift.diagnostics import Diagnostic
from contextshift.reasons import Reason
from contextshift.result import ReasoningCount
from contextshift.strategies.context import Rewrite, StrategyContext

# How a block whose old reasoning was left out is listed in `truncated`, and the diagnostic's event.
CLEARED = Reason.REASONING_CLEARED


@dataclass(frozen=True)
class Cleared:
    """Old reasoning left out: the counts with the rewritten blocks' tokens, the rewrites, and a
    diagnostic saying what went."""

    counts: engine.Counts
    rewrites: dict[int, Rewrite]
    diagnostic: Diagnostic


def clear_old(ctx: StrategyContext) -> Cleared | None:
    """With `keep_reasoning_turns` N and a shift needed: the counted reasoning of the blocks before
    the last N tool-use turns is left out, oldest first, while the prompt is over the target; only
    what the provider accepts missing, of unprotected blocks that are not left out anyway. None
    when nothing is."""
    keep = ctx.options.keep_reasoning_turns
    counts = ctx.counts
    if not keep or not counts.reasoning_blocks or not ctx.needs_shift:
        return None
    layout = ctx.layout
    turns = layout.tool_use_turns
    if len(turns) < keep:
        return None
    kept_turns_start = turns[-keep]
    gone = set(ctx.whole_plan.excluded)
    candidates = [
        i
        for i in counts.reasoning_blocks
        if i < kept_turns_start
        and counts.reasoning_clearable[i]
        and counts.reasoning_counted[i]
        and counts.reasoning[i]
        and not layout.protection[i]
        and i not in gone
    ]
    total, target = ctx.whole_total, ctx.target()
    rewrites: dict[int, Rewrite] = {}
    for i in candidates:
        if total <= target:
            break
        message = engine.rewrite_block(ctx.message(i), None, clear_reasoning=True)
        after = ctx.rewritten_tokens({i: message})[i]
        rewrites[i] = Rewrite(message, counts.tokens[i], after, CLEARED)
        total -= counts.tokens[i] - after
    if not rewrites:
        return None
    gained = sum(r.tokens_before - r.tokens_after for r in rewrites.values())
    detail = f"left out the reasoning of {len(rewrites)} blocks before the last {keep} tool-use turns"
    return Cleared(
        counts.replaced({i: r.tokens_after for i, r in rewrites.items()}),
        rewrites,
        Diagnostic("host", CLEARED, detail, gained),
    )


def kept(plan: engine.Plan, counts: engine.Counts, cleared: dict[int, Rewrite]) -> list[ReasoningCount]:
    """The reasoning the plan's kept blocks carry (blocks whose reasoning was left out have none)."""
    if not counts.reasoning_blocks:
        return []  # most conversations: no call into the plan
    return [
        ReasoningCount(block_id, tokens, counted, basis)
        for i, block_id, tokens, counted, basis in plan.reasoning(counts)
        if i not in cleared
    ]


def over_cap_warnings(conversation: engine.Conversation, layout: engine.Layout) -> list[str]:
    """A warning for each block whose reasoning alone is over its char cap but is kept (it is
    protected, so it cannot be left out as REASONING_OVER_CAP); reasoning is never cut."""
    return [
        f"{layout.ids[i]}: its reasoning ({chars} characters) is over the character cap ({cap}) and is "
        "never cut; kept whole because it is protected"
        for i, chars, cap in conversation.over_cap
        if layout.group_protected[i]
    ]
