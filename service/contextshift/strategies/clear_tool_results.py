"""`clear-tool-results`: before any turn is dropped, the content of the oldest tool results is
replaced by a short placeholder (`[tool result cleared: N tokens]`); the call and the result stay,
so the provider still sees a valid pair (what Anthropic's context editing and LangChain's
ClearToolUsesEdit do). Then truncate if still over.

The latest `keep_tool_uses` results stay intact, results of `exclude_tools` are never cleared,
`clear_tool_inputs` also empties the calls' arguments, and `clear_at_least` clears only when that
many tokens are gained (else truncate straight away: a cached prefix is not broken for a small
gain). Protected blocks are never rewritten.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from contextshift import engine
from contextshift.diagnostics import Diagnostic
from contextshift.options import OptionSpec
from contextshift.reasons import Reason
from contextshift.strategies.context import Outcome, Rewrite, StrategyContext
from contextshift.strategies.registry import StrategyInfo


def placeholder(tokens: int) -> str:
    return f"[tool result cleared: {tokens} tokens]"


class _Clearing:
    """Blocks rewritten so far, their messages and tokens now."""

    def __init__(self, ctx: StrategyContext) -> None:
        self.ctx = ctx
        self.messages: dict[int, Mapping[str, Any]] = {}
        self.tokens: dict[int, int] = {}
        self.how: dict[int, Reason] = {}
        self.cleared_calls: dict[int, list[str]] = {}

    def current(self, i: int) -> int:
        return self.tokens.get(i, self.ctx.counts.tokens[i])

    def rewrite(self, i: int, text: str | None, calls: list[str], how: Reason) -> int:
        """Rewrites block `i` from its original message; returns the tokens gained."""
        message = engine.rewrite_block(self.ctx.message(i), text, calls)
        after = self.ctx.rewritten_tokens({i: message})[i]
        gained = self.current(i) - after
        self.messages[i], self.tokens[i], self.how[i] = message, after, how
        return gained


def clear_tool_results(ctx: StrategyContext) -> Outcome:
    plain = ctx.plan()
    layout = ctx.layout
    if all(layout.orphan[i] for i in plain.excluded):
        return Outcome(plain, ctx.counts)  # nothing of the conversation had to go

    keep = ctx.options.get("keep_tool_uses")
    excluded_tools = set(ctx.options.get("exclude_tools"))
    clear_inputs = ctx.options.get("clear_tool_inputs")
    at_least = ctx.options.get("clear_at_least")
    issuer = {call_id: i for i, calls in enumerate(layout.calls) for call_id, _ in calls}
    names = {call_id: name for calls in layout.calls for call_id, name in calls}
    results = [i for i, ids in enumerate(layout.result_ids) if ids and not layout.orphan[i]]
    if keep:
        results = results[:-keep]
    candidates = [
        i
        for i in results
        if not layout.protection[i] and not excluded_tools & {names.get(c, "") for c in layout.result_ids[i]}
    ]

    total = ctx.whole_total
    target = ctx.target()
    clearing = _Clearing(ctx)
    gained = 0
    for i in candidates:
        if total - gained <= target and gained >= at_least:
            break
        before = ctx.counts.tokens[i]
        gain = clearing.rewrite(i, placeholder(before), [], Reason.TOOL_RESULT_CLEARED)
        if gain <= 0:  # already as short as the placeholder
            del clearing.messages[i], clearing.tokens[i], clearing.how[i]
            continue
        gained += gain
        if clear_inputs:
            for call_id in layout.result_ids[i]:
                j = issuer.get(call_id)
                if j is None or layout.protection[j]:
                    continue
                calls = clearing.cleared_calls.setdefault(j, [])
                calls.append(call_id)
                gained += clearing.rewrite(j, None, calls, Reason.TOOL_INPUT_CLEARED)

    if not clearing.messages or gained < at_least:
        if candidates and gained < at_least:
            detail = (
                f"clearing would gain {gained} tokens, under clear_at_least {at_least}; truncating instead"
            )
            return Outcome(
                plain,
                ctx.counts,
                diagnostics=[Diagnostic(f"strategy:{ctx.name}", "CLEAR_SKIPPED", detail, gained)],
            )
        return Outcome(plain, ctx.counts)

    counts = ctx.counts.replaced(clearing.tokens)
    # Clearing may bring the prompt under the budget but not under the target: a needed shift
    # still goes down to the target (hysteresis), the core alone would stop at the budget.
    plan = ctx.plan(counts, needed=ctx.needs_shift)
    kept = set(plan.kept)
    rewrites = {
        i: Rewrite(clearing.messages[i], ctx.counts.tokens[i], clearing.tokens[i], clearing.how[i])
        for i in clearing.messages
        if i in kept
    }
    cleared = sum(r.how == Reason.TOOL_RESULT_CLEARED for r in rewrites.values())
    detail = f"cleared {cleared} tool results"
    if dropped := sum(how == Reason.TOOL_RESULT_CLEARED for how in clearing.how.values()) - cleared:
        detail += f"; {dropped} more were cleared, then left out by the shift"
    note = Diagnostic(f"strategy:{ctx.name}", "TOOL_RESULTS_CLEARED", detail, gained)
    return Outcome(plan, counts, rewrites=rewrites, diagnostics=[note])


INFO = StrategyInfo(
    "clear-tool-results",
    "replace the oldest tool results by a placeholder (call and result stay paired), then truncate",
    (
        OptionSpec("keep_tool_uses", "int", 3, "the latest tool results kept intact", minimum=0),
        OptionSpec("exclude_tools", "list[str]", [], "tools whose results are never cleared"),
        OptionSpec("clear_tool_inputs", "bool", False, "also empty the arguments of the cleared calls"),
        OptionSpec(
            "clear_at_least",
            "int",
            0,
            "clear only if this many tokens are gained, else truncate straight away",
            minimum=0,
        ),
    ),
    clear_tool_results,
    builtin=True,
    local=True,
)
