"""`shift_context`: the stages of DESIGN.md §6 / docs/semantics.md §4, orchestrated over the
Rust core."""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Protocol

from contextshift import calibration, engine
from contextshift.budget import Budget, resolve_budget
from contextshift.diagnostics import Diagnostic
from contextshift.engine import BlockDecision
from contextshift.errors import InternalError, TokenBudgetExceeded
from contextshift.options import ShiftOptions
from contextshift.profiles import resolve_request
from contextshift.strategies import StrategyInput, strategy_named


@dataclass(frozen=True, slots=True)
class Truncation:
    id: str
    tokens_before: int
    tokens_after: int
    how: str


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

    def ordered_decisions(self) -> list[tuple[BlockDecision, bool]]:
        """Every block in input order (kept and excluded, as an audit records them), with whether
        it was kept."""
        return self.decisions.ordered_decisions()

    @functools.cached_property
    def messages(self) -> list[Mapping[str, Any]]:
        """The kept blocks as given, in order; a block the char cap cut is a copy with the cut
        text. Dict input gives the caller's own dicts; JSON input gives fresh ones."""
        return self.kept_messages.as_list()

    def messages_json(self) -> str:
        """`messages` as one JSON array text. For JSON input each kept block is its own text from
        the input, byte for byte (cut blocks re-serialized), with no decoding and re-encoding."""
        return self.kept_messages.as_json().decode()

    def messages_json_bytes(self) -> bytes:
        """`messages_json()` in UTF-8, as a wire protocol sends it (no `str` in between)."""
        return self.kept_messages.as_json()


@dataclass(frozen=True)
class KeptMessages:
    """The kept blocks of a shift, in order, from the input they came in."""

    blocks: Sequence[Mapping[str, Any]] | str | bytes
    conversation: engine.Conversation
    kept: list[int]
    cuts: dict[int, Mapping[str, Any]]

    def as_list(self) -> list[Mapping[str, Any]]:
        if isinstance(self.blocks, str | bytes):
            return list(self.conversation.json_messages(self.kept))
        if not self.cuts:  # the common case, without a lookup per block
            return list(map(self.blocks.__getitem__, self.kept))
        return [self.cuts.get(i, self.blocks[i]) for i in self.kept]

    def as_json(self) -> bytes:
        if isinstance(self.blocks, str | bytes):
            return self.conversation.messages_json(self.kept)
        return json.dumps(self.as_list(), ensure_ascii=False).encode()


def shift_context(
    blocks: Sequence[Mapping[str, Any]] | str | bytes,
    *,
    budget: int | Budget,
    profile: str | None = None,
    strategy: str = "truncate",
    options: Mapping[str, Any] | None = None,
    model: str | None = None,
    tools: Sequence[Mapping[str, Any]] | str | bytes | None = None,
) -> ShiftResult:
    """Fit `blocks` (oldest first) into `budget` tokens. `blocks` is a list of dicts, or the same
    as JSON text (parsed in Rust without the GIL; `messages` are then fresh dicts). `profile` and
    `model` pick the tokenizer as `profiles.resolve_request` does (neither: `heuristic`); the model
    also selects the calibration of an approximate profile. `tools` are the tool definitions the
    prompt goes out with (OpenAI Chat or Responses, Anthropic; dicts or JSON text): counted by the
    profile's tool rule and taken from the budget first. Raises `InvalidBlocks`, `InvalidTools`,
    `InvalidOptions`, or `TokenBudgetExceeded` when protected blocks (and tools) do not fit."""
    opts = ShiftOptions.from_mapping(options)
    resolved = resolve_budget(budget)
    run_strategy = strategy_named(strategy)
    resolution = resolve_request(profile, model)
    # An approximate profile plans in raw tokens against the budget the model's calibration
    # leaves for them, so the calibrated prompt fits the real budget.
    factor = calibration.DEFAULT.factor(resolution.model) if resolution.approximate else 1.0
    raw_budget = calibration.raw_budget(resolved.tokens, factor)
    # Tool definitions go out with any prompt: the blocks get what they leave.
    tools_tokens = 0 if tools is None else engine.count_tools(tools, resolution.profile, "tools")
    blocks_budget = max(0, raw_budget - tools_tokens)

    # 1-2. Parse and cut over-long blocks.
    if isinstance(blocks, str | bytes):
        conversation = engine.Conversation.from_json(blocks, opts.max_block_chars)
    else:
        conversation = engine.Conversation(blocks, opts.max_block_chars)
    counts = conversation.count(resolution.profile)
    # 3. Pinned cap.
    unpinned = conversation.pinned_cap(counts, opts.pinned_cap * blocks_budget)

    # 4-5. Orphans, the strategy, the leading-assistant repair.
    def over_budget(protected_tokens: int) -> TokenBudgetExceeded:
        """In the caller's units: calibrated tokens against the real budget, tools apart."""
        tools = calibration.calibrated(tools_tokens, factor)
        return TokenBudgetExceeded(calibration.calibrated(protected_tokens, factor), resolved.tokens, tools)

    try:
        plan = run_strategy(StrategyInput(conversation, counts, blocks_budget, unpinned, opts))
    except TokenBudgetExceeded as e:
        if factor == 1.0 and not tools_tokens:
            raise
        raise over_budget(e.protected_tokens) from e
    if tools_tokens > raw_budget:  # the plan (for a budget of 0) kept only what is protected
        raise over_budget(plan.total)
    # 6. Independent recount of what is sent.
    prompt_tokens = conversation.recount(resolution.profile, plan.kept)
    if prompt_tokens != plan.total or prompt_tokens > blocks_budget:
        raise InternalError(
            f"recount gave {prompt_tokens} tokens, the plan {plan.total}, budget {blocks_budget} for blocks"
        )

    cuts = conversation.cuts(resolution.profile)
    cut_messages: dict[int, Mapping[str, Any]] = {index: message for index, *_, message in cuts}
    return ShiftResult(
        truncated=[Truncation(block_id, before, after, "CHAR_CAP") for _, block_id, before, after, _ in cuts],
        prompt_tokens=prompt_tokens,
        budget=resolved.tokens,
        profile=resolution.profile,
        approximate=resolution.approximate,
        warnings=resolution.warnings
        + resolved.warnings
        + [f"unpinned {conversation.block_id(i)} by pinned_cap" for i in unpinned],
        model=resolution.model,
        calibration_factor=factor,
        calibrated_prompt_tokens=calibration.calibrated(prompt_tokens, factor),
        tools_tokens=tools_tokens,
        decisions=plan,
        kept_messages=KeptMessages(blocks, conversation, plan.kept, cut_messages),
    )
