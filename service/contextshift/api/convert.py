"""Proto ↔ library: requests become `shift_context` / `count_tokens` calls, results become replies.

Everything here is plain CPU work, run on the engine threads (or, for small requests, on the event
loop: see `ContextShiftServicer._run`).
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any, Generic, TypeVar

import grpc
from google.protobuf import json_format, struct_pb2
from google.protobuf.message import DecodeError

import contextshift
from contextshift import engine, profile_bench
from contextshift._proto.contextshift.v1 import block_pb2, context_service_pb2
from contextshift.api import provider_messages
from contextshift.api.errors import RequestError, invalid
from contextshift.errors import FieldViolation, InternalError, InvalidInput, InvalidTools
from contextshift.options import ShiftOptions
from contextshift.profiles import Resolution, resolve_request
from contextshift.shift import ShiftResult

DEFAULT_CONTEXT_LIMIT = 128_000
DEFAULT_RESPONSE_RESERVE = 64_000
DEFAULT_STRATEGY = "truncate"

ShiftRequest = context_service_pb2.ShiftContextRequest | context_service_pb2.PreviewContextRequest
# One of the two: what a shift was asked with is what it hands back.
R = TypeVar("R", context_service_pb2.ShiftContextRequest, context_service_pb2.PreviewContextRequest)

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
_OUTPUT_FORMATS = frozenset(context_service_pb2.OutputFormat.values())  # values() builds a list per call
# Integer options: a Struct carries every number as a double.
_INT_OPTIONS = {
    f.name for f in fields(ShiftOptions) if isinstance(f.default, int) and not isinstance(f.default, bool)
}


@dataclass(frozen=True)
class BudgetDefaults:
    """Where a request gives no window or reserve (DESIGN.md §5): after the request (and the stored
    model configuration, not built yet), before the model registry and the built-in defaults."""

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


def _first(*values: int | None) -> int:
    return next(v for v in values if v is not None)


def _budget(request: ShiftRequest, resolution: Resolution, defaults: BudgetDefaults) -> contextshift.Budget:
    """DESIGN.md §5, first match wins: the request, (the stored model configuration: not built
    yet), LLM_CONTEXT_SIZE / LLM_MAX_OUTPUT_TOKENS, the model registry, 128000 / 64000."""
    context_limit = _first(
        request.context_limit if request.HasField("context_limit") else None,
        defaults.context_size,
        resolution.context_window,
        DEFAULT_CONTEXT_LIMIT,
    )
    response_reserve = _first(
        request.response_reserve if request.HasField("response_reserve") else None,
        defaults.max_output_tokens,
        resolution.max_output,
        DEFAULT_RESPONSE_RESERVE,
    )
    return contextshift.Budget(context_limit, response_reserve, request.system_reserve)


def _provider_messages(
    result: ShiftResult, output_format: context_service_pb2.OutputFormat.ValueType
) -> engine.Piece:
    """ContextPlan.messages."""
    plan_field = context_service_pb2.ContextPlan.MESSAGES_FIELD_NUMBER
    if output_format == context_service_pb2.OUTPUT_FORMAT_OPENAI_CHAT:
        messages = context_service_pb2.ProviderMessages(
            format=output_format,
            messages_json=json.dumps(provider_messages.to_openai_chat(result.messages), ensure_ascii=False),
        )
    elif output_format == context_service_pb2.OUTPUT_FORMAT_ANTHROPIC_MESSAGES:
        system, anthropic = provider_messages.to_anthropic_messages(result.messages)
        messages = context_service_pb2.ProviderMessages(
            format=output_format, system=system, messages_json=json.dumps(anthropic, ensure_ascii=False)
        )
    else:
        # The caller's own text of each kept block, never decoded into dicts nor into a str.
        head = context_service_pb2.ProviderMessages(format=context_service_pb2.OUTPUT_FORMAT_INPUT)
        text_field = context_service_pb2.ProviderMessages.MESSAGES_JSON_FIELD_NUMBER
        return (plan_field, [head.SerializeToString(), (text_field, [result.messages_json_bytes()])])
    return (plan_field, [messages.SerializeToString()])


def _engine_plan(result: ShiftResult) -> engine.Plan:
    """The core's plan behind a shift, whose decisions are encoded without a Python object per
    block (that would be the bulk of a reply's building time otherwise)."""
    plan = result.decisions
    if not isinstance(plan, engine.Plan):  # shift_context's results carry the engine's plan
        raise InternalError(f"a shift's decisions came as {type(plan).__name__}, not the engine's Plan")
    return plan


def encode_plan(
    result: ShiftResult,
    budget: contextshift.Budget,
    warnings: Sequence[str],
    output_format: context_service_pb2.OutputFormat.ValueType,
) -> list[engine.Piece]:
    """The ContextPlan of a shift, encoded in pieces for `engine.encode_pieces`: its small fields
    through protobuf, its decisions and messages by the core (an encoded message may carry its
    fields in any order)."""
    decided = _engine_plan(result)
    kept, excluded = len(decided.kept), len(decided.excluded)
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
            was_compacted=excluded > 0, original_count=kept + excluded, compacted_count=kept
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
        tools_tokens=result.tools_tokens,
    )
    numbers = context_service_pb2.ContextPlan
    decisions = decided.encode_decisions(numbers.KEPT_FIELD_NUMBER, numbers.EXCLUDED_FIELD_NUMBER)
    return [plan.SerializeToString(), _provider_messages(result, output_format), decisions]


@dataclass(frozen=True)
class Shifted(Generic[R]):
    """A served shift: the request as read (without `blocks_json`), the library's result, the
    number of blocks it was given, and the reply's ContextPlan, encoded in pieces."""

    request: R
    result: ShiftResult
    blocks: int
    plan: list[engine.Piece]


def read_shift_request(message: bytes, request_type: type[R]) -> tuple[R, bytes]:
    """An encoded ShiftContext or PreviewContext request, parsed, with its `blocks_json` taken out
    as UTF-8 bytes (empty when not set) for the core to parse: 40 KB of JSON never becomes a str."""
    try:
        rest, blocks_json = engine.split_message_field(message, request_type.BLOCKS_JSON_FIELD_NUMBER)
        return request_type.FromString(rest), blocks_json or b""
    except (ValueError, DecodeError) as e:
        raise invalid("request", f"not an encoded {request_type.DESCRIPTOR.full_name}: {e}") from e


def shift(request: R, blocks_json: bytes, defaults: BudgetDefaults) -> Shifted[R]:
    """Run the shift a ShiftContext or PreviewContext request asks for (as `read_shift_request`
    gives it)."""
    if request.blocks and blocks_json:
        raise invalid("blocks_json", "set either blocks or blocks_json, not both")
    if request.output_format not in _OUTPUT_FORMATS:
        raise invalid("output_format", f"unknown value {request.output_format}")
    # The profile wins, a model alone picks its registry profile (and window, max output), an
    # unknown model counts with heuristic and says so; empty proto strings mean not given.
    resolution = resolve_request(request.profile or None, request.model or None)
    budget = _budget(request, resolution, defaults)
    blocks: list[dict[str, Any]] | bytes = (
        [block_dict(b, f"blocks[{i}]") for i, b in enumerate(request.blocks)]
        if request.blocks
        else blocks_json or b"[]"
    )
    try:
        result = contextshift.shift_context(
            blocks,
            budget=budget,
            profile=resolution.profile,
            strategy=request.strategy or DEFAULT_STRATEGY,
            options=_options(request.options) if request.HasField("options") else None,
            model=resolution.model,  # the calibration key of an approximate profile
            tools=request.tools_json or None,
        )
    except InvalidTools as e:
        raise _renamed(e, lambda field: re.sub(r"^tools\b", "tools_json", field)) from e
    except InvalidInput as e:
        if request.blocks:
            raise _renamed(e, typed_field) from e
        raise
    plan = _engine_plan(result)
    encoded = encode_plan(result, budget, resolution.warnings, request.output_format)
    return Shifted(request, result, len(plan.kept) + len(plan.excluded), encoded)


def count(request: context_service_pb2.CountTokensRequest) -> context_service_pb2.CountTokensResponse:
    # The profile wins, a model alone picks its registry profile (and window, max output), an
    # unknown model counts with heuristic and says so; empty proto strings mean not given.
    resolution = resolve_request(request.profile or None, request.model or None)
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
        counts = contextshift.count_tokens(items, resolution.profile, model=resolution.model)
    except InvalidInput as e:
        raise _renamed(e, lambda field: typed_field(field, ".block")) from e
    return context_service_pb2.CountTokensResponse(
        counts=counts,
        total=sum(counts),
        profile=resolution.profile,
        approximate=resolution.approximate,
        warnings=resolution.warnings,
    )


def benchmark_profiles(
    request: context_service_pb2.BenchmarkProfilesRequest,
) -> context_service_pb2.BenchmarkProfilesResponse:
    """Run BenchmarkProfiles: the corpus (or the sample one), bounded by `profile_bench`'s limits;
    an oversized corpus is RESOURCE_EXHAUSTED."""
    try:
        data = (
            profile_bench.corpus((f"documents[{i}]", d.encode()) for i, d in enumerate(request.documents))
            if request.documents
            else profile_bench.sample_corpus()
        )
    except profile_bench.CorpusTooLarge as e:
        raise RequestError(grpc.StatusCode.RESOURCE_EXHAUSTED, str(e)) from e
    report = profile_bench.run(data, list(request.profiles) or None)
    return context_service_pb2.BenchmarkProfilesResponse(
        documents=report.documents,
        messages=report.messages,
        bytes=report.bytes,
        throughput=[context_service_pb2.ProfileThroughput(**asdict(t)) for t in report.throughput],
        accuracy=[context_service_pb2.ProfileAccuracy(**asdict(a)) for a in report.accuracy],
        skipped=report.skipped,
    )
