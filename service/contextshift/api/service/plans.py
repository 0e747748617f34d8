"""A served shift (`Shifted`) and its result as the reply's ContextPlan, encoded in pieces: its small
fields through protobuf, its messages and decisions by the core (`engine.encode_pieces`)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from contextshift import engine, provider_messages
from contextshift._proto.contextshift.v1 import context_service_pb2
from contextshift.budget import Window
from contextshift.diagnostics import CompactionUsage
from contextshift.result import ShiftResult

# One of the two: what a shift was asked with is what it hands back.
R = TypeVar("R", context_service_pb2.ShiftContextRequest, context_service_pb2.PreviewContextRequest)


def _provider_messages(
    result: ShiftResult, output_format: context_service_pb2.OutputFormat.ValueType
) -> tuple[bytes, bytes]:
    """ContextPlan.messages as its fields but `messages_json`, encoded, and `messages_json`'s UTF-8
    text: for the input format the caller's own text of each kept block, never decoded into dicts
    nor into a str."""
    if output_format == context_service_pb2.OUTPUT_FORMAT_OPENAI_CHAT:
        head = context_service_pb2.ProviderMessages(format=output_format)
        text = json.dumps(provider_messages.to_openai_chat(result.messages), ensure_ascii=False).encode()
    elif output_format == context_service_pb2.OUTPUT_FORMAT_ANTHROPIC_MESSAGES:
        system, anthropic = provider_messages.to_anthropic_messages(result.messages)
        head = context_service_pb2.ProviderMessages(format=output_format, system=system)
        text = json.dumps(anthropic, ensure_ascii=False).encode()
    else:
        head = context_service_pb2.ProviderMessages(format=context_service_pb2.OUTPUT_FORMAT_INPUT)
        text = result.messages_json_bytes()
    return head.SerializeToString(), text


def _decisions(result: ShiftResult) -> bytes:
    """The plan's kept and excluded blocks, encoded: by the core straight from the engine's plan
    (a Python object per block would be the bulk of a reply's building time), or from the
    decisions a strategy adjusted."""
    numbers = context_service_pb2.ContextPlan
    if isinstance(result.decisions, engine.Plan):
        return result.decisions.encode_decisions(numbers.KEPT_FIELD_NUMBER, numbers.EXCLUDED_FIELD_NUMBER)
    listed = context_service_pb2.ContextPlan(
        kept=[_decision(d) for d in result.kept], excluded=[_decision(d) for d in result.excluded]
    )
    return listed.SerializeToString()


def _decision(d: engine.BlockDecision) -> context_service_pb2.BlockDecision:
    return context_service_pb2.BlockDecision(id=d.id, tokens=d.tokens, reason=d.reason)


def _summary(result: ShiftResult) -> context_service_pb2.SummaryInfo | None:
    summary = result.summary
    if summary is None:
        return None
    return context_service_pb2.SummaryInfo(
        id=summary.id,
        tokens=summary.tokens,
        text=summary.text,
        summarized_count=summary.summarized,
        facts_kept=summary.facts_kept,
        facts_total=summary.facts_total,
    )


@dataclass(frozen=True)
class EncodedPlan:
    """A ContextPlan encoded in pieces for `engine.encode_pieces` (an encoded message may carry its
    fields in any order): its small fields through protobuf, its messages (their fields, and the
    messages' JSON text apart) and decisions by the core. An audit keeps the fields and the
    messages' own fields, stores the messages' text as the chat's blocks, and lists the decisions in
    order instead."""

    fields: bytes
    messages_head: bytes
    messages_json: bytes
    decisions: bytes

    def messages(self, text: bytes | None) -> engine.Piece:
        """ContextPlan.messages, with `text` as its `messages_json` (None: without it)."""
        field = context_service_pb2.ProviderMessages.MESSAGES_JSON_FIELD_NUMBER
        pieces: list[engine.Piece] = (
            [self.messages_head] if text is None else [self.messages_head, (field, [text])]
        )
        return (context_service_pb2.ContextPlan.MESSAGES_FIELD_NUMBER, pieces)

    def pieces(self) -> list[engine.Piece]:
        return [self.fields, self.messages(self.messages_json), self.decisions]


def encode_plan(
    result: ShiftResult,
    budget: Window,
    warnings: Sequence[str],
    output_format: context_service_pb2.OutputFormat.ValueType,
) -> EncodedPlan:
    """The ContextPlan of a shift (see EncodedPlan)."""
    plan = context_service_pb2.ContextPlan(
        truncated=[
            context_service_pb2.Truncation(
                id=t.id, tokens_before=t.tokens_before, tokens_after=t.tokens_after, how=t.how
            )
            for t in result.truncated
        ],
        prompt_tokens=result.prompt_tokens,
        budget=result.budget,
        context_limit=budget.context_limit,
        response_reserve=budget.response_reserve,
        profile=result.profile,
        approximate=result.approximate,
        warnings=[*warnings, *result.warnings],
        compaction=context_service_pb2.CompactionNote(
            was_compacted=result.excluded_count > 0,
            original_count=result.block_count,
            compacted_count=result.kept_count,
            divider_text=result.summary.divider_text if result.summary else "",
        ),
        # Raw and calibrated counts.
        model=result.model or "",
        calibration_factor=result.calibration_factor,
        calibrated_prompt_tokens=(
            result.prompt_tokens
            if result.calibrated_prompt_tokens is None
            else result.calibrated_prompt_tokens
        ),
        diagnostics=[
            context_service_pb2.Diagnostic(source=d.source, event=d.event, detail=d.detail, tokens=d.tokens)
            for d in result.diagnostics
        ],
        strategy=result.strategy,
        summary=_summary(result),
        relevance=[
            context_service_pb2.RelevanceScore(id=r.id, score=r.score, source=r.source)
            for r in result.relevance
        ],
        compaction_usage=_compaction_usage(result.compaction_usage),
        tools_tokens=result.tools_tokens,
        reasoning_rule=result.reasoning_rule,
        reasoning=[
            context_service_pb2.ReasoningCount(id=r.id, tokens=r.tokens, counted=r.counted, basis=r.basis)
            for r in result.reasoning
        ],
        images=[
            context_service_pb2.ImageCount(
                id=i.id, index=i.index, tokens=i.tokens, width=i.width, height=i.height, basis=i.basis
            )
            for i in result.images
        ],
    )
    return EncodedPlan(
        plan.SerializeToString(), *_provider_messages(result, output_format), _decisions(result)
    )


def _compaction_usage(usage: CompactionUsage | None) -> context_service_pb2.CompactionUsage | None:
    if usage is None:
        return None
    return context_service_pb2.CompactionUsage(
        model=usage.model, prompt_tokens=usage.prompt_tokens, completion_tokens=usage.completion_tokens
    )


@dataclass(frozen=True)
class Shifted(Generic[R]):
    """A served shift: the request as read (without `blocks_json`), the library's result, the
    number of blocks it shifted (the stored history's too), the reply's ContextPlan, and the
    shift's own time (without its reads of the store)."""

    request: R
    result: ShiftResult
    blocks: int
    plan: EncodedPlan
    seconds: float
