"""Proto ↔ library: requests become `shift_context` / `count_tokens` calls, results become replies.

Everything here is plain CPU work, run on the engine threads, never on the event loop.
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from google.protobuf import json_format, struct_pb2

import contextshift
from contextshift._proto.contextshift.v1 import block_pb2, context_service_pb2
from contextshift.api import provider_messages
from contextshift.api.errors import invalid
from contextshift.errors import FieldViolation, InvalidInput, InvalidOptions
from contextshift.options import ShiftOptions
from contextshift.profiles import Resolution, resolve
from contextshift.shift import ShiftResult

DEFAULT_CONTEXT_LIMIT = 128_000
DEFAULT_RESPONSE_RESERVE = 64_000
DEFAULT_PROFILE = "heuristic"
DEFAULT_STRATEGY = "truncate"

ShiftRequest = context_service_pb2.ShiftContextRequest | context_service_pb2.PreviewContextRequest

_ROLES = {
    block_pb2.ROLE_SYSTEM: "system",
    block_pb2.ROLE_USER: "user",
    block_pb2.ROLE_ASSISTANT: "assistant",
    block_pb2.ROLE_TOOL: "tool",
}
_KINDS = {
    block_pb2.BLOCK_KIND_SYSTEM: "system",
    block_pb2.BLOCK_KIND_CHARACTER: "character",
    block_pb2.BLOCK_KIND_PERSONA: "persona",
    block_pb2.BLOCK_KIND_LOREBOOK: "lorebook",
    block_pb2.BLOCK_KIND_MEMORY: "memory",
    block_pb2.BLOCK_KIND_SUMMARY: "summary",
    block_pb2.BLOCK_KIND_MESSAGE: "message",
}
# Integer options: a Struct carries every number as a double.
_INT_OPTIONS = {
    f.name for f in fields(ShiftOptions) if isinstance(f.default, int) and not isinstance(f.default, bool)
}


@dataclass(frozen=True)
class BudgetDefaults:
    """Where a request gives no window or reserve (DESIGN.md §5, after the request)."""

    context_size: int | None  # LLM_CONTEXT_SIZE
    max_output_tokens: int | None  # LLM_MAX_OUTPUT_TOKENS


def uuid7() -> str:
    """A UUIDv7 (RFC 9562): 48-bit Unix milliseconds, then random bits; sorts by creation time."""
    millis = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10))
    value = (millis & (2**48 - 1)) << 80 | 0x7 << 76 | (rand >> 68) << 64 | 0b10 << 62 | rand & (2**62 - 1)
    return str(uuid.UUID(int=value))


# --- typed blocks -----------------------------------------------------------------------------


def _part(part: block_pb2.Part, at: str) -> dict[str, Any]:
    which = part.WhichOneof("part")
    if which == "text":
        return {"type": "text", "text": part.text}
    if which == "image":
        image: dict[str, Any] = {"url": part.image.url}
        if part.image.detail:
            image["detail"] = part.image.detail
        out: dict[str, Any] = {"type": "image_url", "image_url": image}
        if part.image.width:
            out["width"] = part.image.width
        if part.image.height:
            out["height"] = part.image.height
        return out
    if which == "tool_result":
        return {
            "type": "tool_result",
            "tool_use_id": part.tool_result.tool_call_id,
            "content": part.tool_result.content,
        }
    raise invalid(at, "empty part: set text, image or tool_result")


def block_dict(block: block_pb2.Block, at: str) -> dict[str, Any]:
    """A typed block as the engine's block dict; `at` names it in errors (`blocks[3]`)."""
    out: dict[str, Any] = {}
    if block.id:
        out["id"] = block.id
    if block.role != block_pb2.ROLE_UNSPECIFIED:
        if block.role not in _ROLES:
            raise invalid(f"{at}.role", f"unknown role value {block.role}")
        out["role"] = _ROLES[block.role]
    if block.kind != block_pb2.BLOCK_KIND_UNSPECIFIED:
        if block.kind not in _KINDS:
            raise invalid(f"{at}.kind", f"unknown kind value {block.kind}")
        out["kind"] = _KINDS[block.kind]
    if block.parts:
        if block.content:
            raise invalid(f"{at}.content", "set either content or parts, not both")
        out["content"] = [_part(p, f"{at}.parts[{i}]") for i, p in enumerate(block.parts)]
    else:
        out["content"] = block.content
    if block.tool_calls:
        out["tool_calls"] = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in block.tool_calls]
    if block.tool_call_id:
        out["tool_call_id"] = block.tool_call_id
    for flag in ("pinned", "mandatory", "injected"):
        if getattr(block, flag):
            out[flag] = True
    if block.HasField("relevance"):
        out["relevance"] = block.relevance
    if block.HasField("meta"):
        out["meta"] = json_format.MessageToDict(block.meta)
    return out


_TYPED_PATHS = [
    (re.compile(r"\.content\[(\d+)\]\.tool_use_id"), r".parts[\1].tool_result.tool_call_id"),
    (re.compile(r"\.content\[(\d+)\]\.content"), r".parts[\1].tool_result.content"),
    (re.compile(r"\.content\[(\d+)\]\.(?:image_url\.)?(url|detail|width|height)"), r".parts[\1].image.\2"),
    (re.compile(r"\.content\[(\d+)\]"), r".parts[\1]"),
]


def typed_field(field: str, item_prefix: str = "") -> str:
    """A library path over blocks built by `block_dict` → the proto field path:
    `blocks[2].content[1].tool_use_id` → `blocks[2].parts[1].tool_result.tool_call_id`;
    with `item_prefix=".block"`, `items[0].role` → `items[0].block.role`."""
    head, sep, rest = field.partition("]")
    if not sep:
        return field
    if rest.startswith(".content[") or rest == ".content":
        for pattern, replacement in _TYPED_PATHS:
            rest, count = pattern.subn(replacement, rest, count=1)
            if count:
                break
    return f"{head}]{item_prefix}{rest}"


def _renamed(error: InvalidInput, rename: Callable[[str], str]) -> InvalidInput:
    return type(error)([FieldViolation(rename(v.field), v.description) for v in error.violations])


# --- requests ---------------------------------------------------------------------------------


def _options(struct: struct_pb2.Struct) -> dict[str, Any]:
    options = json_format.MessageToDict(struct)
    for key in _INT_OPTIONS & options.keys():
        value = options[key]
        if isinstance(value, float) and value.is_integer():
            options[key] = int(value)
    return options


def resolve_profile(profile: str, model: str) -> Resolution:
    """The request's profile; else the model's; an unknown model counts with `heuristic` and says
    so (an unknown *profile* is an error: the caller asked for it by name)."""
    if profile:
        return resolve(profile)
    if model:
        try:
            return resolve(model)
        except InvalidOptions:
            fallback = resolve(DEFAULT_PROFILE)
            warning = (
                f"model {model!r} is not in the model registry; counting with {DEFAULT_PROFILE} (approximate)"
            )
            return Resolution(fallback.profile, fallback.approximate, model, [*fallback.warnings, warning])
    return resolve(DEFAULT_PROFILE)


def _budget(request: ShiftRequest, resolution: Resolution, defaults: BudgetDefaults) -> contextshift.Budget:
    # The model registry (tokenizer profiles issue) may report the model's window; use it when present.
    registry_window: int | None = getattr(resolution, "context_window", None)
    if request.HasField("context_limit"):
        context_limit = request.context_limit
    else:
        context_limit = defaults.context_size or registry_window or DEFAULT_CONTEXT_LIMIT
    if request.HasField("response_reserve"):
        response_reserve = request.response_reserve
    elif defaults.max_output_tokens is not None:
        response_reserve = defaults.max_output_tokens
    else:
        response_reserve = DEFAULT_RESPONSE_RESERVE
    return contextshift.Budget(context_limit, response_reserve, request.system_reserve)


def _provider_messages(
    messages: Sequence[Mapping[str, Any]], output_format: context_service_pb2.OutputFormat.ValueType
) -> context_service_pb2.ProviderMessages:
    if output_format == context_service_pb2.OUTPUT_FORMAT_OPENAI_CHAT:
        return context_service_pb2.ProviderMessages(
            format=output_format,
            messages_json=json.dumps(provider_messages.to_openai_chat(messages), ensure_ascii=False),
        )
    if output_format == context_service_pb2.OUTPUT_FORMAT_ANTHROPIC_MESSAGES:
        system, anthropic = provider_messages.to_anthropic_messages(messages)
        return context_service_pb2.ProviderMessages(
            format=output_format, system=system, messages_json=json.dumps(anthropic, ensure_ascii=False)
        )
    return context_service_pb2.ProviderMessages(
        format=context_service_pb2.OUTPUT_FORMAT_INPUT,
        messages_json=json.dumps(list(messages), ensure_ascii=False),
    )


def _decisions(decisions: Sequence[contextshift.BlockDecision]) -> list[context_service_pb2.BlockDecision]:
    return [context_service_pb2.BlockDecision(id=d.id, tokens=d.tokens, reason=d.reason) for d in decisions]


def plan_message(
    result: ShiftResult,
    budget: contextshift.Budget,
    warnings: Sequence[str],
    output_format: context_service_pb2.OutputFormat.ValueType,
) -> context_service_pb2.ContextPlan:
    original = len(result.kept) + len(result.excluded)
    return context_service_pb2.ContextPlan(
        kept=_decisions(result.kept),
        excluded=_decisions(result.excluded),
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
        messages=_provider_messages(result.messages, output_format),
        compaction=context_service_pb2.CompactionNote(
            was_compacted=bool(result.excluded), original_count=original, compacted_count=len(result.kept)
        ),
    )


def shift(request: ShiftRequest, defaults: BudgetDefaults) -> context_service_pb2.ContextPlan:
    """Run the shift a ShiftContext or PreviewContext request asks for."""
    if request.blocks and request.blocks_json:
        raise invalid("blocks_json", "set either blocks or blocks_json, not both")
    if request.output_format not in context_service_pb2.OutputFormat.values():
        raise invalid("output_format", f"unknown value {request.output_format}")
    resolution = resolve_profile(request.profile, request.model)
    budget = _budget(request, resolution, defaults)
    blocks: list[dict[str, Any]] | str = (
        [block_dict(b, f"blocks[{i}]") for i, b in enumerate(request.blocks)]
        if request.blocks
        else request.blocks_json or "[]"
    )
    try:
        result = contextshift.shift_context(
            blocks,
            budget=budget,
            profile=resolution.profile,
            strategy=request.strategy or DEFAULT_STRATEGY,
            options=_options(request.options) if request.HasField("options") else None,
        )
    except InvalidInput as e:
        if request.blocks:
            raise _renamed(e, typed_field) from e
        raise
    return plan_message(result, budget, resolution.warnings, request.output_format)


def count(request: context_service_pb2.CountTokensRequest) -> context_service_pb2.CountTokensResponse:
    resolution = resolve_profile(request.profile, request.model)
    items: list[str | dict[str, Any]] = []
    for i, item in enumerate(request.items):
        which = item.WhichOneof("item")
        if which == "text":
            items.append(item.text)
        elif which == "block":
            items.append(block_dict(item.block, f"items[{i}].block"))
        else:
            raise invalid(f"items[{i}]", "empty item: set text or block")
    try:
        counts = contextshift.count_tokens(items, resolution.profile)
    except InvalidInput as e:
        raise _renamed(e, lambda field: typed_field(field, ".block")) from e
    return context_service_pb2.CountTokensResponse(
        counts=counts,
        total=sum(counts),
        profile=resolution.profile,
        approximate=resolution.approximate,
        warnings=resolution.warnings,
    )
