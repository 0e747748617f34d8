"""Plugin strategies: `fn(view: ShiftView)` returning the ids of blocks to leave out, or a
`StrategyPlan`, or None, run under the host's guard (see `contextshift.plugins`)."""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from contextshift import engine, reasons
from contextshift.diagnostics import Diagnostic
from contextshift.errors import TokenBudgetExceeded
from contextshift.options import OptionSpec
from contextshift.plugins.calls import PluginsSaturated, Rejected, call_with_timeout, listed
from contextshift.reasons import Reason
from contextshift.strategies import registry
from contextshift.strategies.context import Outcome, Rewrite, StrategyContext, Summary, excluded_for
from contextshift.strategies.summarize import divider, summary_id, summary_message
from contextshift.summarizer.extractive import Turn, facts_newest_first

log = logging.getLogger("contextshift.plugins")


@dataclass(frozen=True)
class BlockView:
    """One block as a plugin sees it."""

    index: int
    id: str
    role: str
    kind: str
    tokens: int
    group: int  # tool-call group number; blocks of a group are kept or left out together
    protection: str  # "system", "mandatory", "pinned" or "" (the current input counts as pinned)
    protected: bool  # the block or a member of its group is protected: never left out
    calls: tuple[tuple[str, str], ...]  # (id, name) of the tool calls it issues
    result_ids: tuple[str, ...]  # ids of the calls it answers


class ShiftView:
    """A read-only view of a counted conversation and its budget, for a plugin strategy."""

    def __init__(self, ctx: StrategyContext) -> None:
        layout = ctx.layout
        tokens = ctx.counts.tokens
        self._ctx = ctx
        self.blocks: tuple[BlockView, ...] = tuple(
            BlockView(
                i,
                layout.ids[i],
                layout.roles[i],
                layout.kinds[i],
                tokens[i],
                layout.groups[i],
                layout.protection[i],
                layout.group_protected[i],
                tuple(layout.calls[i]),
                tuple(layout.result_ids[i]),
            )
            for i in range(len(tokens))
        )
        self.budget = ctx.budget
        self.target = ctx.target()
        self.profile = ctx.profile
        self.prompt_tokens = sum(tokens)  # every block, before anything is left out
        # The strategy's own options (given or default).
        self.options: Mapping[str, Any] = dict(ctx.options.strategy)

    def text(self, index: int) -> str:
        """Block `index`'s text (its text pieces joined by newlines)."""
        return self._ctx.conversation.texts([index])[0]

    def message(self, index: int) -> dict[str, Any]:
        """A copy of block `index` as it would be sent."""
        return copy.deepcopy(dict(self._ctx.message(index)))


@dataclass(frozen=True)
class StrategyPlan:
    """What a plugin strategy decides: block ids to leave out, replacement text by block id, and
    the text of one summary block (placed before the current input)."""

    exclude: Collection[str] = ()
    replace: Mapping[str, str] = field(default_factory=dict)
    summary: str | None = None


def _as_plan(returned: object) -> StrategyPlan:
    if returned is None:
        return StrategyPlan()
    if isinstance(returned, StrategyPlan):
        plan = returned
    elif isinstance(returned, Iterable) and not isinstance(returned, str | bytes | Mapping):
        plan = StrategyPlan(exclude=list(returned))
    else:
        raise Rejected("PLAN_INVALID", f"returned {type(returned).__name__}, not block ids or a StrategyPlan")
    texts = [*plan.replace.values(), *([] if plan.summary is None else [plan.summary])]
    if not all(isinstance(i, str) for i in [*plan.exclude, *plan.replace]) or not all(
        isinstance(t, str) for t in texts
    ):
        raise Rejected("PLAN_INVALID", "block ids and texts must be strings")
    return plan


@dataclass(frozen=True)
class PluginStrategy:
    """A plugin strategy under the host's guard: called with a `StrategyContext`, it returns an
    `Outcome` like a built-in."""

    name: str
    fn: Callable[[ShiftView], object]

    def __call__(self, ctx: StrategyContext) -> Outcome:
        source = f"strategy:{self.name}"
        try:
            returned = call_with_timeout(self.fn, (ShiftView(ctx),), ctx.options.plugin_timeout_ms)
            return self._apply(ctx, _as_plan(returned), source)
        except TimeoutError:
            event, detail = (
                "PLUGIN_TIMEOUT",
                f"ran past plugin_timeout_ms ({ctx.options.plugin_timeout_ms} ms)",
            )
        except PluginsSaturated as saturated:
            log.warning(
                "plugin strategy not run", extra={"fields": {"strategy": self.name, "why": str(saturated)}}
            )
            event, detail = "PLUGINS_SATURATED", f"not run: {saturated}"
        except Rejected as rejected:
            event, detail = rejected.event, rejected.detail
        except TokenBudgetExceeded:
            raise  # protected blocks alone do not fit: no strategy can help
        except Exception as error:
            # The plugin's own message may quote conversation text: only its type goes out.
            log.warning(
                "plugin strategy failed",
                extra={"fields": {"strategy": self.name, "error": type(error).__name__}},
            )
            event, detail = "PLUGIN_ERROR", f"raised {type(error).__name__}"
        fallback = Diagnostic(source, event, f"{detail}; fell back to truncate")
        return Outcome(ctx.plan(), ctx.counts, diagnostics=[fallback])

    def _apply(self, ctx: StrategyContext, plan: StrategyPlan, source: str) -> Outcome:
        layout = ctx.layout
        index_of = {block_id: i for i, block_id in enumerate(layout.ids)}
        unknown = [i for i in [*plan.exclude, *plan.replace] if i not in index_of]
        if unknown:
            raise Rejected("PLAN_INVALID", f"no blocks with ids {listed(unknown)}")
        protected = [i for i in plan.exclude if layout.group_protected[index_of[i]]]
        protected += [i for i in plan.replace if layout.protection[index_of[i]]]
        if protected:
            raise Rejected(
                "PLAN_REJECTED", f"would leave out or rewrite protected blocks {listed(protected)}; restored"
            )

        diagnostics: list[Diagnostic] = []
        excluded = sorted({index_of[i] for i in plan.exclude})
        chosen_groups = {layout.groups[i] for i in excluded}
        added = [
            layout.ids[i] for i, g in enumerate(layout.groups) if g in chosen_groups and i not in excluded
        ]
        if added:
            detail = f"left out {listed(added)} too, to keep tool-call groups whole"
            diagnostics.append(Diagnostic(source, "GROUP_EXTENDED", detail))

        rewritten = {index_of[i]: text for i, text in plan.replace.items() if index_of[i] not in excluded}
        messages = {i: _rewrite(ctx, i, text) for i, text in rewritten.items()}
        after = ctx.rewritten_tokens(messages)
        counts = ctx.counts.replaced(after)
        forced = [(i, Reason.PLUGIN_EXCLUDED) for i in excluded]

        summary = None
        if plan.summary:
            message = summary_message(summary_id(layout.ids), plan.summary)
            [tokens] = ctx.block_tokens([message])
            try:
                if tokens > ctx.budget:
                    raise TokenBudgetExceeded(tokens, ctx.budget)
                core_plan = ctx.plan(
                    counts, budget=ctx.budget - tokens, target=ctx.target() - tokens, forced=forced
                )
                kept = set(core_plan.kept)
                before = ctx.current_input if ctx.current_input in kept else None
                turns = [Turn("", text) for text in ctx.conversation.texts(excluded)]
                facts = facts_newest_first(turns)
                kept_facts = ctx.facts_kept(core_plan, facts, plan.summary)
                summary = Summary(
                    message, tokens, before, len(excluded), kept_facts, len(facts), divider(len(excluded))
                )
            except TokenBudgetExceeded:
                detail = f"the summary ({tokens} tokens) does not fit beside the protected blocks; dropped"
                diagnostics.append(Diagnostic(source, "SUMMARY_DROPPED", detail, tokens))
        if summary is None:
            core_plan = ctx.plan(counts, forced=forced)

        shifted = excluded_for(core_plan, layout.groups, reasons.FINAL_SHIFT)
        if shifted:
            tokens_removed = sum(counts.tokens[i] for i in shifted)
            detail = f"the plan was over the budget: {len(shifted)} more blocks left out, oldest first"
            diagnostics.append(Diagnostic("host", "FINAL_SHIFT", detail, tokens_removed))
        kept = set(core_plan.kept)
        rewrites = {
            i: Rewrite(messages[i], ctx.counts.tokens[i], after[i], Reason.PLUGIN_REPLACED)
            for i in messages
            if i in kept
        }
        return Outcome(core_plan, counts, rewrites=rewrites, summary=summary, diagnostics=diagnostics)


def _rewrite(ctx: StrategyContext, index: int, text: str) -> Mapping[str, Any]:
    return engine.rewrite_block(ctx.message(index), text)


def register_strategy(
    name: str,
    fn: Callable[[ShiftView], object],
    *,
    description: str = "",
    options: Sequence[OptionSpec] = (),
) -> Callable[[], None]:
    """Registers plugin strategy `name` (see the module doc); returns the cleanup that removes it.
    `options` are the options it takes beyond the common ones."""
    if not name or not isinstance(name, str):
        raise ValueError("a strategy needs a non-empty name")
    info = registry.StrategyInfo(
        name, description or f"plugin strategy {name}", tuple(options), PluginStrategy(name, fn)
    )
    return registry.add(info)
