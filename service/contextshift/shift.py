"""`shift_context`: the stages of docs/design.md §6 / docs/semantics.md §4, orchestrated over the
Rust core: parse, cut, pinned cap, count, the strategy, an independent recount, then the prompt
interceptors (contextshift.plugins) with a recount and a final shift after them."""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, Protocol

from contextshift import cache_stable, calibration, engine, plugins
from contextshift.budget import Budget, Window, resolve_budget, resolve_in_process
from contextshift.cache_stable import PreviousPrompt
from contextshift.diagnostics import CompactionUsage, Diagnostic
from contextshift.engine import BlockDecision
from contextshift.errors import InternalError, TokenBudgetExceeded
from contextshift.options import ShiftOptions
from contextshift.profiles import resolve_request
from contextshift.strategies import (
    DEFAULT_STRATEGY,
    Outcome,
    Relevance,
    StrategyContext,
    Summary,
    strategy_named,
)

# Kept reasons of blocks an interceptor may not drop.
PROTECTED_REASONS = frozenset({"PROTECTED_SYSTEM", "MANDATORY", "PINNED", "TOOL_GROUP", "SUMMARY"})


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


@dataclass(frozen=True, slots=True)
class Truncation:
    id: str
    tokens_before: int
    tokens_after: int
    how: str  # CHAR_CAP, TOOL_RESULT_CLEARED, TOOL_INPUT_CLEARED, PLUGIN_REPLACED


class DecisionSource(Protocol):
    """The kept and excluded blocks of a shift, in block order, with tokens and reason codes."""

    @property
    def kept_decisions(self) -> list[BlockDecision]: ...
    @property
    def excluded_decisions(self) -> list[BlockDecision]: ...
    def ordered_decisions(self) -> list[tuple[BlockDecision, bool]]:
        """Every block's decision in the prompt's order, with whether it was kept."""
        ...


class MessageSource(Protocol):
    """The kept messages of a shift, as dicts or as one JSON array text in UTF-8."""

    def as_list(self) -> list[Mapping[str, Any]]: ...
    def as_json(self) -> bytes: ...


@dataclass(frozen=True)
class ShiftResult:
    truncated: list[Truncation]
    prompt_tokens: int
    budget: int
    profile: str
    approximate: bool
    warnings: list[str]
    # The model the profile was resolved from or given with, if any (the calibration key).
    model: str | None = field(default=None, kw_only=True)
    # An approximate profile's counts times the model's calibration (contextshift.calibration):
    # the factor (1.0 when uncalibrated) and `prompt_tokens` calibrated, which is what fits
    # `budget`. Block tokens and `prompt_tokens` stay raw.
    calibration_factor: float = field(default=1.0, kw_only=True)
    calibrated_prompt_tokens: int | None = field(default=None, kw_only=True)
    # What the strategy host, plugins and interceptors did (fallbacks, rejections, ...).
    diagnostics: list[Diagnostic] = field(default_factory=list, kw_only=True)
    strategy: str = field(default=DEFAULT_STRATEGY, kw_only=True)
    # Blocks given (kept, excluded, the summary not counted).
    block_count: int = field(default=0, kw_only=True)
    # The inserted summary block, when the strategy made one (it is also in `kept`).
    summary: Summary | None = field(default=None, kw_only=True)
    # Blocks a relevance-aware strategy scored, with the score's source.
    relevance: list[Relevance] = field(default_factory=list, kw_only=True)
    # The tokens an LLM compaction spent (llm-compact), as its endpoint reported them.
    compaction_usage: CompactionUsage | None = field(default=None, kw_only=True)
    # Tokens of the tool definitions sent with the prompt (raw), taken from the budget before the
    # shift: `prompt_tokens + tools_tokens` is what fits `budget`.
    tools_tokens: int = field(default=0, kw_only=True)
    # Where `kept`/`excluded` and `messages` come from; built only when asked for (a server
    # encodes the engine's plan and sends JSON text, with no Python object per block).
    decisions: DecisionSource = field(kw_only=True, repr=False, compare=False)
    kept_messages: MessageSource = field(kw_only=True, repr=False, compare=False)

    def __eq__(self, other: object) -> bool:
        """Field by field, and the decisions, whatever their source."""
        if not isinstance(other, ShiftResult) or other.__class__ is not self.__class__:
            return NotImplemented
        same_fields = all(getattr(self, f.name) == getattr(other, f.name) for f in fields(self) if f.compare)
        return same_fields and (self.kept, self.excluded) == (other.kept, other.excluded)

    @functools.cached_property
    def kept(self) -> list[BlockDecision]:
        """The kept blocks, in order."""
        return self.decisions.kept_decisions

    @functools.cached_property
    def excluded(self) -> list[BlockDecision]:
        """The excluded blocks, in order."""
        return self.decisions.excluded_decisions

    @property
    def kept_count(self) -> int:
        """`len(kept)`, without building the decisions."""
        plan = self.decisions
        return len(plan.kept) if isinstance(plan, engine.Plan) else len(self.kept)

    @property
    def excluded_count(self) -> int:
        """`len(excluded)`, without building the decisions."""
        plan = self.decisions
        return len(plan.excluded) if isinstance(plan, engine.Plan) else len(self.excluded)

    def ordered_decisions(self) -> list[tuple[BlockDecision, bool]]:
        """Every block in input order (kept and excluded, as an audit records them; a summary at
        its place), with whether it was kept."""
        return self.decisions.ordered_decisions()

    def as_previous(self) -> PreviousPrompt:
        """This prompt as the `previous` of the chat's next shift (see contextshift.cache_stable)."""
        summary = self.summary.id if self.summary else None
        return PreviousPrompt(
            kept=[(d.id, d.tokens) for d in self.kept if d.id != summary],
            excluded=[(d.id, d.reason) for d in self.excluded],
        )

    @functools.cached_property
    def messages(self) -> list[Mapping[str, Any]]:
        """The kept blocks as given, in order; a block the char cap cut or a strategy rewrote is a
        copy with its new content, and a summary is a new system block. Dict input gives the
        caller's own dicts; JSON input gives fresh ones."""
        return self.kept_messages.as_list()

    def messages_json(self) -> str:
        """`messages` as one JSON array text. For JSON input each kept block is its own text from
        the input, byte for byte (cut or rewritten blocks re-serialized), with no decoding and
        re-encoding."""
        return self.kept_messages.as_json().decode()

    def messages_json_bytes(self) -> bytes:
        """`messages_json()` in UTF-8, as a wire protocol sends it (no `str` in between)."""
        return self.kept_messages.as_json()


@dataclass(frozen=True)
class AdjustedDecisions:
    """The engine's decisions with a strategy's relabelled reasons and its summary block."""

    plan: engine.Plan
    relabel: Mapping[int, str]
    summary: Summary | None

    @functools.cached_property
    def _ordered(self) -> list[tuple[BlockDecision, bool]]:
        summary = self.summary
        inserted = [] if summary is None else [(BlockDecision(summary.id, summary.tokens, "SUMMARY"), True)]
        out: list[tuple[BlockDecision, bool]] = []
        for i, (decision, kept) in enumerate(self.plan.ordered_decisions()):
            if summary is not None and summary.before == i:
                out += inserted
            reason = self.relabel.get(i)
            out.append((BlockDecision(decision.id, decision.tokens, reason) if reason else decision, kept))
        if summary is not None and summary.before is None:
            out += inserted
        return out

    @property
    def kept_decisions(self) -> list[BlockDecision]:
        return [d for d, kept in self._ordered if kept]

    @property
    def excluded_decisions(self) -> list[BlockDecision]:
        return [d for d, kept in self._ordered if not kept]

    def ordered_decisions(self) -> list[tuple[BlockDecision, bool]]:
        return list(self._ordered)


@dataclass(frozen=True)
class ListedDecisions:
    """Decisions made in Python (after interceptors): kept in prompt order, and every block."""

    kept_decisions: list[BlockDecision]
    ordered: list[tuple[BlockDecision, bool]]

    @property
    def excluded_decisions(self) -> list[BlockDecision]:
        return [d for d, kept in self.ordered if not kept]

    def ordered_decisions(self) -> list[tuple[BlockDecision, bool]]:
        return list(self.ordered)


# A kept block by index, or a message put in its place (rewritten) or between (a summary).
Item = int | Mapping[str, Any]


@dataclass(frozen=True)
class KeptMessages:
    """The kept blocks of a shift, in order, from the input they came in."""

    blocks: Sequence[Mapping[str, Any]] | str | bytes
    conversation: engine.Conversation
    items: list[Item]
    cuts: dict[int, Mapping[str, Any]]

    # Every item is a block index (no rewrite, no summary): the common case, taken without a
    # Python step per block.
    plain: bool

    def as_list(self) -> list[Mapping[str, Any]]:
        if isinstance(self.blocks, str | bytes):
            indices = self.items if self.plain else [i for i in self.items if isinstance(i, int)]
            parsed = iter(self.conversation.json_messages(indices))  # type: ignore[arg-type]
            return [next(parsed) if isinstance(i, int) else i for i in self.items]
        if self.plain and not self.cuts:  # the common case, without a lookup per block
            return list(map(self.blocks.__getitem__, self.items))  # type: ignore[arg-type]
        return [self.cuts.get(i, self.blocks[i]) if isinstance(i, int) else i for i in self.items]

    def as_json(self) -> bytes:
        if isinstance(self.blocks, str | bytes):
            if self.plain:
                return self.conversation.messages_json(self.items)  # type: ignore[arg-type]
            return self.conversation.messages_json(
                [i if isinstance(i, int) else json.dumps(i, ensure_ascii=False).encode() for i in self.items]
            )
        return json.dumps(self.as_list(), ensure_ascii=False).encode()


@dataclass(frozen=True)
class ListedMessages:
    """Messages held as dicts (after interceptors)."""

    messages: list[Mapping[str, Any]]

    def as_list(self) -> list[Mapping[str, Any]]:
        return list(self.messages)

    def as_json(self) -> bytes:
        return json.dumps(self.messages, ensure_ascii=False).encode()


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


def _recount(conversation: engine.Conversation, profile: str, outcome: Outcome) -> int:
    """Stage 6: the prompt's tokens counted afresh from what is sent, not from the plan's sums."""
    plain = (
        [i for i in outcome.plan.kept if i not in outcome.rewrites] if outcome.rewrites else outcome.plan.kept
    )
    new = [r.message for r in outcome.rewrites.values()]
    if outcome.summary is not None:
        new.append(outcome.summary.message)
    return conversation.recount(profile, plain) + (sum(engine.count_items(new, profile)) if new else 0)


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
    opts = ShiftOptions.from_mapping(options, info.options)
    if previous is not None and opts.cache_stable and "target_ratio" not in opts.given:
        # Room to grow after a cut, or the next turn cuts again (cache_stable.TARGET_RATIO).
        opts = replace(opts, target_ratio=cache_stable.TARGET_RATIO)
    resolution = resolve_request(profile, model)
    window: int | Window = budget  # type: ignore[assignment]  # anything else: resolve_budget says so
    if budget is None or isinstance(budget, Budget):
        registry = Budget(resolution.context_window, resolution.max_output)
        window = resolve_in_process(budget or Budget(), registry)
    resolved = resolve_budget(window)
    # An approximate profile plans in raw tokens against the budget the model's calibration
    # leaves for them, so the calibrated prompt fits the real budget.
    factor = calibration_source.factor(resolution.model) if resolution.approximate else 1.0
    raw_budget = calibration.raw_budget(resolved.tokens, factor)
    # Tool definitions go out with any prompt: the blocks get what they leave.
    tools_tokens = 0 if tools is None else engine.count_tools(tools, resolution.profile, "tools")
    blocks_budget = max(0, raw_budget - tools_tokens)

    # 1-2. Parse and cut over-long blocks.
    tool_result_cap = opts.tool_result_max_chars or None
    if isinstance(blocks, str | bytes):
        conversation = engine.Conversation.from_json(blocks, opts.max_block_chars, tool_result_cap)
    else:
        conversation = engine.Conversation(blocks, opts.max_block_chars, tool_result_cap)
    counts = conversation.count(resolution.profile, known_tokens)
    # 3. Pinned cap.
    unpinned = conversation.pinned_cap(counts, opts.pinned_cap * blocks_budget)

    # 4-5. Orphans, the strategy, the leading-assistant repair.
    def over_budget(protected_tokens: int) -> TokenBudgetExceeded:
        """In the caller's units: calibrated tokens against the real budget, tools apart."""
        tools = calibration.calibrated(tools_tokens, factor)
        return TokenBudgetExceeded(calibration.calibrated(protected_tokens, factor), resolved.tokens, tools)

    ctx = StrategyContext(strategy, blocks, conversation, counts, blocks_budget, unpinned, opts)
    kept_cut = None
    # A previous prompt that left nothing out has no cut to carry (and needs no layout).
    if previous is not None and previous.excluded and opts.cache_stable:
        kept_cut = cache_stable.carried(previous, ctx.layout, counts)
        ctx.carried = kept_cut.forced
    try:
        outcome = info.run(ctx)
    except TokenBudgetExceeded as e:
        if factor == 1.0 and not tools_tokens:
            raise
        raise over_budget(e.protected_tokens) from e
    if tools_tokens > raw_budget:  # the plan (for a budget of 0) kept only what is protected
        raise over_budget(outcome.plan.total)
    # 6. Independent recount of what is sent.
    prompt_tokens = _recount(conversation, resolution.profile, outcome)
    expected = outcome.plan.total + (outcome.summary.tokens if outcome.summary else 0)
    if prompt_tokens != expected or prompt_tokens > blocks_budget:
        raise InternalError(
            f"recount gave {prompt_tokens} tokens, the plan {expected}, budget {blocks_budget} for blocks"
        )

    cuts = conversation.cuts(resolution.profile)
    truncated = [
        (index, Truncation(block_id, before, after, "CHAR_CAP")) for index, block_id, before, after, _ in cuts
    ]
    ids = ctx.layout.ids if outcome.rewrites else []
    truncated += [
        (i, Truncation(ids[i], r.tokens_before, r.tokens_after, r.how)) for i, r in outcome.rewrites.items()
    ]
    truncated.sort(key=lambda entry: entry[0])
    adjusted = outcome.relabel or outcome.summary is not None
    result = ShiftResult(
        truncated=[t for _, t in truncated],
        prompt_tokens=prompt_tokens,
        budget=resolved.tokens,
        profile=resolution.profile,
        approximate=resolution.approximate,
        warnings=resolution.warnings
        + resolved.warnings
        + [f"unpinned {conversation.block_id(i)} by pinned_cap" for i in unpinned]
        + repair_warning(outcome.plan, conversation)
        + outcome.warnings,
        model=resolution.model,
        calibration_factor=factor,
        calibrated_prompt_tokens=calibration.calibrated(prompt_tokens, factor),
        diagnostics=([kept_cut.diagnostic] if kept_cut and kept_cut.diagnostic else []) + outcome.diagnostics,
        strategy=strategy,
        block_count=len(conversation),
        summary=outcome.summary,
        relevance=outcome.relevance,
        compaction_usage=outcome.compaction_usage,
        tools_tokens=tools_tokens,
        decisions=AdjustedDecisions(outcome.plan, outcome.relabel, outcome.summary)
        if adjusted
        else outcome.plan,
        kept_messages=KeptMessages(
            blocks,
            conversation,
            _items(outcome),
            {index: message for index, *_, message in cuts},
            plain=not outcome.rewrites and outcome.summary is None,
        ),
    )
    if plugins.interceptors():
        unpinned_ids = frozenset(conversation.block_id(i) for i in unpinned)
        return _intercepted(result, blocks_budget, opts, unpinned_ids)
    return result


def _intercepted(
    result: ShiftResult, budget: int, opts: ShiftOptions, unpinned_ids: frozenset[str]
) -> ShiftResult:
    """The result after the prompt interceptors: what they return is parsed, counted and shifted
    again (truncate) so it fits; blocks they drop are PLUGIN_EXCLUDED. An interceptor whose
    messages cannot be read, or whose protected messages alone exceed the budget, is skipped (the
    messages before it stay), so no interceptor can fail the shift."""
    kept = result.kept
    ids = [d.id for d in kept]
    context = plugins.InterceptorContext(
        tuple(ids), budget, result.prompt_tokens, result.profile, result.strategy
    )
    protected = {d.id for d in kept if d.reason in PROTECTED_REASONS}
    # The interceptors' latest accepted messages, parsed, counted and planned.
    accepted: tuple[engine.Conversation, engine.Plan] | None = None

    def replan(messages: list[Mapping[str, Any]], message_ids: list[str]) -> None:
        """Plans an interceptor's messages; raises (and so rejects them) when they cannot be
        read or their protected messages alone exceed the budget."""
        # Parsed with their block ids, so decisions keep naming the blocks the caller sent.
        named = [{**m, "id": block_id} for m, block_id in zip(messages, message_ids, strict=True)]
        conversation = engine.Conversation(named, opts.max_block_chars, opts.tool_result_max_chars or None)
        counts = conversation.count(result.profile)
        # Pins the pinned cap removed (`unpinned_ids`) stay removed: a re-plan reading the
        # messages' own pins would protect them again.
        unpinned = [k for k, block_id in enumerate(message_ids) if block_id in unpinned_ids]
        plan = conversation.plan(counts, budget, unpinned, opts.protect_current_input, opts.start_on_user)
        nonlocal accepted
        accepted = (conversation, plan)

    run = plugins.run_interceptors(
        result.messages, ids, protected, context, opts.plugin_timeout_ms, accept=replan
    )
    if not run.changed:
        return (
            replace(result, diagnostics=result.diagnostics + run.diagnostics) if run.diagnostics else result
        )

    # The last change accepted is what the interceptors left.
    if accepted is None:  # `changed` is set only for an accepted change
        raise InternalError("interceptors changed the messages, but no change was accepted")
    conversation, plan = accepted
    prompt_tokens = conversation.recount(result.profile, plan.kept)
    if prompt_tokens != plan.total or prompt_tokens > budget:
        raise InternalError(f"recount after interceptors gave {prompt_tokens}, the plan {plan.total}")

    diagnostics = result.diagnostics + run.diagnostics
    dropped_by_shift = plan.excluded_decisions
    if dropped_by_shift:
        detail = f"the intercepted prompt was over the budget: {len(dropped_by_shift)} blocks left out"
        diagnostics.append(Diagnostic("host", "FINAL_SHIFT", detail, sum(d.tokens for d in dropped_by_shift)))
    original = {d.id: d for d in kept}
    final = {
        d.id: (BlockDecision(d.id, d.tokens, original[d.id].reason) if d.id in original else d)
        for d in plan.kept_decisions
    }
    excluded_now = {d.id: d for d in dropped_by_shift}
    new_after: dict[str | None, list[str]] = {}
    previous: str | None = None
    for block_id in run.ids:
        if block_id not in original:
            new_after.setdefault(previous, []).append(block_id)
        else:
            previous = block_id

    def placed(block_id: str) -> tuple[BlockDecision, bool]:
        """A block's decision now: kept, left out by the final shift, or by an interceptor."""
        if block_id in final:
            return final[block_id], True
        if block_id in excluded_now:
            return excluded_now[block_id], False
        return BlockDecision(block_id, original[block_id].tokens, "PLUGIN_EXCLUDED"), False

    ordered = [placed(i) for i in new_after.get(None, [])]
    for decision, was_kept in result.ordered_decisions():
        if not was_kept:
            ordered.append((decision, False))
            continue
        ordered.append(placed(decision.id))
        ordered += [placed(i) for i in new_after.get(decision.id, [])]

    cuts = conversation.cuts(result.profile)
    cut = {index: message for index, *_, message in cuts}
    messages = [cut.get(i, run.messages[i]) for i in plan.kept]
    cut_truncations = [
        Truncation(block_id, before, after, "CHAR_CAP") for _, block_id, before, after, _ in cuts
    ]
    return replace(
        result,
        truncated=result.truncated + cut_truncations,
        prompt_tokens=prompt_tokens,
        calibrated_prompt_tokens=calibration.calibrated(prompt_tokens, result.calibration_factor),
        diagnostics=diagnostics,
        decisions=ListedDecisions([final[i] for i in (conversation.block_id(k) for k in plan.kept)], ordered),
        kept_messages=ListedMessages(messages),
    )
