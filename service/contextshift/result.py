"""What a shift gives back: `ShiftResult`, its truncations, and where its decisions and messages
come from (the engine's plan, a strategy's adjustments, or lists made in Python after the
interceptors), each built only when read."""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Protocol

from contextshift import engine
from contextshift.cache_stable import PreviousPrompt
from contextshift.diagnostics import CompactionUsage, Diagnostic
from contextshift.engine import BlockDecision
from contextshift.reasons import Reason
from contextshift.strategies import DEFAULT_STRATEGY, Relevance, Summary


@dataclass(frozen=True, slots=True)
class Truncation:
    id: str
    tokens_before: int
    tokens_after: int
    how: str  # one of reasons.TRUNCATIONS (a str: a newer server's reply may carry another)


@dataclass(frozen=True, slots=True)
class ReasoningCount:
    """Reasoning a kept block carries: its tokens, whether the prompt's count includes them (the
    provider's rule keeps them in the prompt), and how they are known: "text" (its text as sent),
    "estimated" (an encrypted payload counted as text) or "reported" (`meta.reasoning_tokens`)."""

    id: str
    tokens: int
    counted: bool
    basis: str


@dataclass(frozen=True, slots=True)
class ImageCount:
    """An image a kept block carries: its place among the block's images (0 for the first), its
    tokens by the profile's image rule, the size it was priced at (0 by 0 when unknown) and how
    that size is known: "given" (the part's `width` and `height`), "header" (read from the header
    of the PNG, JPEG, GIF or WebP image sent inline, base64) or "unknown" (the rule's price for an
    image of unknown size). docs/semantics.md §2.2."""

    id: str
    index: int
    tokens: int
    width: int
    height: int
    basis: str


def kept_images(plan: engine.Plan, counts: engine.Counts) -> list[ImageCount]:
    """The images of the plan's kept blocks, in block order."""
    return [
        ImageCount(block_id, index, tokens, width, height, basis)
        for _, block_id, index, tokens, width, height, basis in plan.images(counts)
    ]


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
    # Which reasoning sent back the provider keeps, so the counts include ("all", "current_turn",
    # "tool_turns"; the profile's rule, or the model's in the registry), and the reasoning the kept
    # blocks carry, counted or not.
    reasoning_rule: str = field(default="all", kw_only=True)
    reasoning: list[ReasoningCount] = field(default_factory=list, kw_only=True)
    # The images the kept blocks carry, each with the size it was priced at and how it is known.
    images: list[ImageCount] = field(default_factory=list, kw_only=True)
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
    relabel: Mapping[int, Reason]
    summary: Summary | None

    @functools.cached_property
    def _ordered(self) -> list[tuple[BlockDecision, bool]]:
        summary = self.summary
        # Decisions hold plain strs, as the core's do (`.value`, not the enum member).
        inserted = (
            []
            if summary is None
            else [(BlockDecision(summary.id, summary.tokens, Reason.SUMMARY.value), True)]
        )
        out: list[tuple[BlockDecision, bool]] = []
        for i, (decision, kept) in enumerate(self.plan.ordered_decisions()):
            if summary is not None and summary.before == i:
                out += inserted
            reason = self.relabel.get(i)
            out.append(
                (BlockDecision(decision.id, decision.tokens, reason.value) if reason else decision, kept)
            )
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


@dataclass(frozen=True)
class Cuts:
    """The blocks the char cap cut (stages 1-2), by block index: each one's truncation, and its
    message as cut."""

    truncations: dict[int, Truncation]
    messages: dict[int, Mapping[str, Any]]

    @classmethod
    def of(cls, conversation: engine.Conversation, counts: engine.Counts) -> Cuts:
        cuts = conversation.cuts(counts)
        return cls(
            {
                i: Truncation(block_id, before, after, Reason.CHAR_CAP)
                for i, block_id, before, after, _ in cuts
            },
            {i: message for i, *_, message in cuts},
        )
