"""`shift_context`: the stages of docs/design.md §6 / docs/semantics.md §4, orchestrated over the
Rust core: parse, cut, pinned cap, count, the strategy, an independent recount, then the prompt
interceptors (contextshift.plugins) with a recount and a final shift after them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from contextshift import cache_stable, calibration, engine, reasoning
from contextshift.budget import Budget, ResolvedBudget, Window, resolve_budget, resolve_in_process
from contextshift.cache_stable import Carried, PreviousPrompt
from contextshift.errors import InternalError, TokenBudgetExceeded
from contextshift.options import ShiftOptions
from contextshift.plugins import interception
from contextshift.profiles import Resolution, resolve_request
from contextshift.result import (
    AdjustedDecisions,
    Cuts,
    Item,
    KeptMessages,
    ShiftResult,
    Truncation,
    kept_images,
)
from contextshift.strategies import DEFAULT_STRATEGY, Outcome, StrategyContext, StrategyInfo, strategy_named


def repair_warning(plan: engine.Plan, conversation: engine.Conversation) -> list[str]:
    """The warning of a repair (stage 5) that removed more than a quarter of what the cut kept."""
    removed, cut = plan.repair_removed, plan.cut_tokens
    if removed * 4 <= cut:
        return []
    if plan.anchor is None:
        how = "so the history starts on a user turn"
        return [f"start_on_user: removed {removed} of the {cut} tokens the cut kept {how}"]
    anchor = conversation.block_id(plan.anchor)
    return [
        f"start_on_user: kept {anchor} as the anchor (ANCHOR_USER_TURN) and removed {removed} of the "
        f"{cut} tokens the cut kept to pay for it"
    ]


def _items(outcome: Outcome) -> list[Item]:
    """The kept blocks in order, rewritten ones as their messages, the summary at its place."""
    summary = outcome.summary
    if summary is None and not outcome.rewrites:
        return list(outcome.plan.kept)
    items: list[Item] = []
    for i in outcome.plan.kept:
        if summary is not None and summary.before == i:
            items.append(summary.message)
        rewrite = outcome.rewrites.get(i)
        items.append(i if rewrite is None else rewrite.message)
    if summary is not None and summary.before is None:
        items.append(summary.message)
    return items


def _recount(conversation: engine.Conversation, outcome: Outcome, budget: int) -> int:
    """Stage 6: the prompt's tokens counted afresh from what is sent, not from the plan's sums (each
    block's reasoning by the rule its counts were made with), checked against the plan and the
    blocks' `budget`."""
    counts = outcome.counts
    plain = (
        [i for i in outcome.plan.kept if i not in outcome.rewrites] if outcome.rewrites else outcome.plan.kept
    )
    rewritten = [(i, r.message) for i, r in outcome.rewrites.items()]
    prompt_tokens = conversation.recount(counts, plain)
    if rewritten:
        prompt_tokens += sum(conversation.count_rewrites(counts, rewritten))
    if outcome.summary is not None:
        prompt_tokens += engine.count_items([outcome.summary.message], counts.profile)[0]
    expected = outcome.plan.total + (outcome.summary.tokens if outcome.summary else 0)
    if prompt_tokens != expected or prompt_tokens > budget:
        raise InternalError(
            f"recount gave {prompt_tokens} tokens, the plan {expected}, budget {budget} for blocks"
        )
    return prompt_tokens


def shift_context(
    blocks: Sequence[Mapping[str, Any]] | str | bytes,
    *,
    budget: int | Budget | None = None,
    profile: str | None = None,
    strategy: str = DEFAULT_STRATEGY,
    options: Mapping[str, Any] | None = None,
    model: str | None = None,
    calibration_source: calibration.CalibrationSource = calibration.DEFAULT,
    known_tokens: Sequence[int | None] | None = None,
    previous: PreviousPrompt | None = None,
    tools: Sequence[Mapping[str, Any]] | str | bytes | None = None,
) -> ShiftResult:
    """Fit `blocks` (oldest first) into `budget`: a number of tokens, used as is, or a `Budget`
    window whose figures left out (all of them for None) come from `LLM_CONTEXT_SIZE` /
    `LLM_MAX_OUTPUT_TOKENS`, the model registry, then 128000 / 64000, as on a server (a reserve
    not given takes at most a quarter of a context limit given). `blocks` is a list of dicts, or the same
    as JSON text (parsed in Rust without the GIL; `messages` are then fresh dicts). `profile` and
    `model` pick the tokenizer as `profiles.resolve_request` does (neither: `heuristic`); the model
    also selects the calibration of an approximate profile, read from `calibration_source` (the
    process's `calibration.DEFAULT` unless given). `strategy` names a registered strategy
    (contextshift.strategies.list_strategies()); `options` are the common options and the
    strategy's own. `known_tokens` gives block tokens already known for the profile, for the first
    blocks (None where unknown; e.g. stored with a chat's history): only the other blocks are
    counted, before the independent recount of what is kept. `previous` is the chat's last prompt
    (an empty `PreviousPrompt()` for its first): with the `cache_stable` option (on by default) the
    blocks it left out are left out again while its blocks are unchanged, and `target_ratio`
    defaults to 0.8 (contextshift.cache_stable). `tools` are the tool definitions the
    prompt goes out with (OpenAI Chat or Responses, Anthropic; dicts or JSON text): counted by the
    profile's tool rule and taken from the budget first. Raises `InvalidBlocks`, `InvalidTools`,
    `InvalidOptions`, or `TokenBudgetExceeded` when protected blocks (and tools) do not fit."""

    info = strategy_named(strategy)
    opts = _shift_options(info, options, previous)
    resolution = resolve_request(profile, model)
    room = _room(budget, resolution, calibration_source, tools)
    # 1-3. Parse, cut over-long blocks, count, the pinned cap.
    conversation = (
        engine.Conversation.from_json(blocks, opts.max_block_chars, opts.tool_result_max_chars or None)
        if isinstance(blocks, str | bytes)
        else engine.Conversation(
            blocks, opts.max_block_chars, opts.tool_result_max_chars or None, resolution.profile
        )
    )
    counts = conversation.count(resolution.profile, known_tokens, resolution.reasoning)
    unpinned = conversation.pinned_cap(counts, opts.pinned_cap * room.blocks)
    # 4-5. Orphans, old reasoning, the strategy (after the previous prompt's cut), the repair.
    ctx = StrategyContext(strategy, blocks, conversation, counts, room.blocks, unpinned, opts)
    carried = _carry(ctx, previous)
    cleared = reasoning.clear_old(ctx)
    if cleared is not None:
        ctx = replace(ctx, counts=cleared.counts, rewritten=cleared.rewrites, shift_needed=True)
    outcome = _run_strategy(info, ctx, room, cleared)
    # 6. The independent recount of what is sent.
    prompt_tokens = _recount(conversation, outcome, room.blocks)
    cuts = Cuts.of(conversation, counts)
    result = ShiftResult(
        truncated=_truncations(cuts, outcome, ctx),
        prompt_tokens=prompt_tokens,
        budget=room.resolved.tokens,
        profile=resolution.profile,
        approximate=resolution.approximate,
        warnings=resolution.warnings
        + room.resolved.warnings
        + [f"unpinned {conversation.block_id(i)} by pinned_cap" for i in unpinned]
        + (reasoning.over_cap_warnings(conversation, ctx.layout) if conversation.over_cap else [])
        + repair_warning(outcome.plan, conversation)
        + outcome.warnings,
        model=resolution.model,
        calibration_factor=room.factor,
        calibrated_prompt_tokens=calibration.calibrated(prompt_tokens, room.factor),
        diagnostics=([carried.diagnostic] if carried and carried.diagnostic else []) + outcome.diagnostics,
        strategy=strategy,
        block_count=len(conversation),
        summary=outcome.summary,
        relevance=outcome.relevance,
        compaction_usage=outcome.compaction_usage,
        tools_tokens=room.tools_tokens,
        reasoning_rule=counts.reasoning_rule,
        reasoning=reasoning.kept(outcome.plan, outcome.counts, cleared.rewrites if cleared else {}),
        images=kept_images(outcome.plan, outcome.counts),
        decisions=AdjustedDecisions(outcome.plan, outcome.relabel, outcome.summary)
        if outcome.relabel or outcome.summary is not None
        else outcome.plan,
        kept_messages=KeptMessages(
            blocks,
            conversation,
            _items(outcome),
            cuts.messages,
            plain=not outcome.rewrites and outcome.summary is None,
        ),
    )
    if interception.interceptors():
        unpinned_ids = frozenset(conversation.block_id(i) for i in unpinned)
        return interception.intercept(result, room.blocks, opts, unpinned_ids)
    return result


def _shift_options(
    info: StrategyInfo, options: Mapping[str, Any] | None, previous: PreviousPrompt | None
) -> ShiftOptions:
    """The common options and the strategy's own; a cache-stable shift's `target_ratio` defaults
    to `cache_stable.TARGET_RATIO`, room to grow after a cut (else the next turn cuts again)."""
    opts = ShiftOptions.from_mapping(options, info.options)
    if previous is not None and opts.cache_stable and "target_ratio" not in opts.given:
        opts = replace(opts, target_ratio=cache_stable.TARGET_RATIO)
    return opts


@dataclass(frozen=True)
class _BudgetFigures:
    """Stage 1's figures: the budget in the caller's tokens, the model's calibration factor, the
    raw tokens that budget leaves (an approximate profile plans in raw tokens against what the
    calibration leaves, so the calibrated prompt fits the real budget), and the tool definitions'
    tokens, which go out with any prompt."""

    resolved: ResolvedBudget
    factor: float
    raw: int
    tools_tokens: int

    @property
    def blocks(self) -> int:
        """The raw tokens the blocks get: what the tool definitions leave."""
        return max(0, self.raw - self.tools_tokens)

    def exceeded(self, protected_tokens: int) -> TokenBudgetExceeded:
        """TokenBudgetExceeded in the caller's units: calibrated tokens against the real budget,
        the tools apart."""
        return TokenBudgetExceeded(
            calibration.calibrated(protected_tokens, self.factor),
            self.resolved.tokens,
            calibration.calibrated(self.tools_tokens, self.factor),
        )


def _room(
    budget: int | Budget | None,
    resolution: Resolution,
    calibration_source: calibration.CalibrationSource,
    tools: Sequence[Mapping[str, Any]] | str | bytes | None,
) -> _BudgetFigures:
    """Stage 1: the budget (a window's figures left out resolved as on a server), the model's
    calibration, the tools' tokens."""
    window: int | Window = budget  # type: ignore[assignment]  # anything else: resolve_budget says so
    if budget is None or isinstance(budget, Budget):
        registry = Budget(resolution.context_window, resolution.max_output)
        window = resolve_in_process(budget or Budget(), registry)
    resolved = resolve_budget(window)
    factor = calibration_source.factor(resolution.model) if resolution.approximate else 1.0
    tools_tokens = 0 if tools is None else engine.count_tools(tools, resolution.profile, "tools")
    return _BudgetFigures(resolved, factor, calibration.raw_budget(resolved.tokens, factor), tools_tokens)


def _carry(ctx: StrategyContext, previous: PreviousPrompt | None) -> Carried | None:
    """The previous prompt's cut, carried into `ctx` while its blocks are unchanged (a previous
    prompt that left nothing out has no cut to carry, and needs no layout)."""
    if previous is None or not previous.excluded or not ctx.options.cache_stable:
        return None
    carried = cache_stable.carried(previous, ctx.layout, ctx.counts)
    ctx.carried = carried.forced
    return carried


def _run_strategy(
    info: StrategyInfo, ctx: StrategyContext, room: _BudgetFigures, cleared: reasoning.Cleared | None
) -> Outcome:
    """Stages 4-5 by the strategy, after the old reasoning `cleared` (its rewrites of kept blocks
    join the strategy's); TokenBudgetExceeded in the caller's units."""
    try:
        outcome = info.run(ctx)
    except TokenBudgetExceeded as e:
        if room.factor == 1.0 and not room.tools_tokens:
            raise
        raise room.exceeded(e.protected_tokens) from e
    if room.tools_tokens > room.raw:  # the plan (for a budget of 0) kept only what is protected
        raise room.exceeded(outcome.plan.total)
    if cleared is not None:
        kept = frozenset(outcome.plan.kept)
        outcome.rewrites = {**{i: r for i, r in cleared.rewrites.items() if i in kept}, **outcome.rewrites}
        outcome.diagnostics = [cleared.diagnostic, *outcome.diagnostics]
    return outcome


def _truncations(cuts: Cuts, outcome: Outcome, ctx: StrategyContext) -> list[Truncation]:
    """The char cap's cuts and the strategy's rewrites, in block order."""
    ids = ctx.layout.ids if outcome.rewrites else []
    rewrites = [
        (i, Truncation(ids[i], r.tokens_before, r.tokens_after, r.how)) for i, r in outcome.rewrites.items()
    ]
    # Sorted stably: a block both cut and rewritten lists its cut first.
    return [t for _, t in sorted([*cuts.truncations.items(), *rewrites], key=lambda entry: entry[0])]
