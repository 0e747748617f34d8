"""`summarize`: truncate, then a local extractive summary of what was left out becomes one system
block (`[Conversation summary] …`, kind `summary`) right before the current user input. History
is shifted further first so the summary, up to `summary_max_tokens`, always fits."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from contextshift import engine, reasons
from contextshift.diagnostics import Diagnostic
from contextshift.errors import TokenBudgetExceeded
from contextshift.options import OptionSpec
from contextshift.reasons import Reason
from contextshift.strategies.context import Outcome, StrategyContext, Summary, excluded_for
from contextshift.strategies.registry import StrategyInfo
from contextshift.summarizer import extractive

# A summary with less room than this would be a header and a few words: not worth its tokens.
MIN_SUMMARY_TOKENS = 32
SUMMARY_SHARE = 0.125
SUMMARY_FLOOR = 256
SUMMARY_CEILING = 4096
SUMMARY_MAX_TOKENS = OptionSpec(
    "summary_max_tokens",
    "int",
    0,
    f"the summary block's tokens at most (0: 1/{round(1 / SUMMARY_SHARE)} of the budget, {SUMMARY_FLOOR} to "
    f"{SUMMARY_CEILING}, at most half of what was left out)",
    minimum=MIN_SUMMARY_TOKENS,
    off=0,
)


def default_summary_size(budget: int, left_out: int) -> int:
    """A summary's tokens at most by default: SUMMARY_SHARE of the budget, between SUMMARY_FLOOR
    and SUMMARY_CEILING, at most half of the `left_out` tokens it stands for."""
    size = min(max(int(budget * SUMMARY_SHARE), SUMMARY_FLOOR), SUMMARY_CEILING)
    return max(MIN_SUMMARY_TOKENS, min(size, left_out // 2))


def summary_size(ctx: StrategyContext, left_out: int) -> int:
    """The summary's tokens at most: `summary_max_tokens`, else `default_summary_size`."""
    given: int = ctx.options.get("summary_max_tokens")
    return given or default_summary_size(ctx.budget, left_out)


def summary_id(ids: Iterable[str]) -> str:
    """`summary`, or `summary-<n>` when a block already has that id."""
    taken = set(ids)
    return next(c for c in ["summary", *(f"summary-{n}" for n in range(1, len(taken) + 2))] if c not in taken)


def summary_message(block_id: str, text: str) -> dict[str, Any]:
    # Kind `summary`: sent back in a later request, it is history, not a protected system prompt.
    return {"id": block_id, "role": "system", "kind": "summary", "content": text}


def summarized_blocks(ctx: StrategyContext, plan: engine.Plan) -> list[int]:
    """The blocks a plan left out for the budget, in order."""
    return excluded_for(plan, ctx.layout.groups, reasons.BUDGET_CUT)


def relabelled(plan: engine.Plan, summarized: list[int]) -> dict[int, Reason]:
    """Each summarized group's earliest block says SUMMARIZED (the others keep TOOL_GROUP)."""
    given = dict(zip(plan.excluded, (d.reason for d in plan.excluded_decisions), strict=True))
    return {i: Reason.SUMMARIZED for i in summarized if given[i] != Reason.TOOL_GROUP}


def summary_room(ctx: StrategyContext, block_id: str, limit: int) -> extractive.Room:
    """What a summary block with id `block_id` may take: `limit` tokens as this profile counts it."""

    def block_tokens(text: str) -> int:
        return ctx.block_tokens([summary_message(block_id, text)])[0]

    def text_tokens(texts: Sequence[str]) -> list[int]:
        return engine.count_items(texts, ctx.profile)

    return extractive.Room(limit, block_tokens, text_tokens)


def room_left(ctx: StrategyContext, plan: engine.Plan) -> int:
    """The tokens a summary may take beside `plan`: up to the target once a shift was needed,
    so the shift ends there (hysteresis), unless that leaves less than MIN_SUMMARY_TOKENS (a
    summary is worth the last tokens under the budget); else up to the budget."""
    to_target = ctx.target() - plan.total
    if ctx.needs_shift and to_target >= MIN_SUMMARY_TOKENS:
        return to_target
    return ctx.budget - plan.total


def reserve_plan(ctx: StrategyContext, reserve: int) -> tuple[engine.Plan, int] | None:
    """A plan leaving `reserve` tokens free (fewer when protected blocks need them, but at least
    MIN_SUMMARY_TOKENS), with the room it leaves (`room_left`); None when there is no such
    room."""
    reserve = min(reserve, ctx.budget)
    try:
        plan = ctx.plan(budget=ctx.budget - reserve, target=ctx.target() - reserve)
    except TokenBudgetExceeded as e:
        room = ctx.budget - e.protected_tokens
        if room < MIN_SUMMARY_TOKENS:
            return None
        plan = ctx.plan(budget=ctx.budget - room, target=ctx.budget - room)
    return plan, room_left(ctx, plan)


def divider(count: int) -> str:
    return f"Earlier context ({count} messages) was summarized."


def summarize(ctx: StrategyContext) -> Outcome:
    first = ctx.plan()
    left_out = summarized_blocks(ctx, first)
    if not left_out:
        return Outcome(first, ctx.counts)
    source = f"strategy:{ctx.name}"
    max_tokens = summary_size(ctx, sum(ctx.counts.tokens[i] for i in left_out))
    reserved = reserve_plan(ctx, max_tokens)
    if reserved is None:
        note = Diagnostic(source, "SUMMARY_SKIPPED", "no room for a summary beside the protected blocks")
        return Outcome(first, ctx.counts, diagnostics=[note])
    plan, room = reserved
    summarized = summarized_blocks(ctx, plan)
    layout = ctx.layout
    block_id = summary_id(layout.ids)
    limit = min(room, max_tokens)
    turns = [
        extractive.Turn(layout.roles[i], text)
        for i, text in zip(summarized, ctx.conversation.texts(summarized), strict=True)
    ]
    made = extractive.summarize(turns, summary_room(ctx, block_id, limit))
    if made is None:
        note = Diagnostic(source, "SUMMARY_SKIPPED", f"a summary does not fit in {limit} tokens")
        return Outcome(first, ctx.counts, diagnostics=[note])
    message = summary_message(block_id, made.text)
    kept = set(plan.kept)
    before = ctx.current_input if ctx.current_input in kept else None
    summary = Summary(
        message,
        ctx.block_tokens([message])[0],
        before,
        len(summarized),
        ctx.facts_kept(plan, made.facts, made.text),
        len(made.facts),
        divider(len(summarized)),
    )
    return Outcome(
        plan,
        ctx.counts,
        relabel=relabelled(plan, summarized),
        summary=summary,
        warnings=extractive.unread_warning(made.unread_chars),
    )


INFO = StrategyInfo(
    "summarize",
    "truncate, then a local extractive summary of what was left out (facts kept verbatim) "
    "goes right before the current input",
    (SUMMARY_MAX_TOKENS,),
    summarize,
    builtin=True,
    local=True,
)
