"""Proto ↔ library: requests become `shift_context` / `count_tokens` calls, results become replies.

Everything here is plain CPU work, run on the engine threads (or, for small requests, on the event
loop: see `ContextShiftServicer._run`), except the shifts of strategies that wait (llm-compact on
its endpoint, plugin strategies), which run on the io threads.
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Generic, Protocol, TypeVar

import grpc
from google.protobuf import json_format, struct_pb2, timestamp_pb2
from google.protobuf.message import DecodeError

import contextshift
from contextshift import calibration, engine, profile_bench
from contextshift._proto.contextshift.v1 import block_pb2, context_service_pb2
from contextshift.api import history, provider_messages, rules
from contextshift.api.errors import RequestError, invalid, undecodable
from contextshift.api.rules import id_violations
from contextshift.audit.store import ModelConfig, Role, StoredBlock
from contextshift.budget import Budget, Window, resolve_window
from contextshift.cache_stable import PreviousPrompt
from contextshift.diagnostics import CompactionUsage
from contextshift.errors import FieldViolation, InvalidInput, InvalidOptions, InvalidTools
from contextshift.options import COMMON, OptionSpec
from contextshift.profiles import Resolution, resolve_request
from contextshift.shift import ShiftResult
from contextshift.strategies import DEFAULT_STRATEGY, StrategyInfo, list_strategies, strategy_named

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


ROLES = {
    context_service_pb2.MODEL_ROLE_UNSPECIFIED: Role.NONE,
    context_service_pb2.MODEL_ROLE_MAIN: Role.MAIN,
    context_service_pb2.MODEL_ROLE_FAST: Role.FAST,
}


class StoreView(calibration.CalibrationSource, Protocol):
    """What a shift reads from the store, for one tenant: model configurations, the chat's stored
    history, and calibrations (as its CalibrationSource). Blocking: shifts that read it run on a
    thread."""

    @property
    def read_seconds(self) -> float:
        """The time its reads of the store have taken so far (a shift's own time leaves it out)."""
        ...

    def model_config(self, model: str, role: Role) -> ModelConfig | None: ...

    def history(self, chat_id: str, profile: str) -> Sequence[StoredBlock]: ...

    def previous_prompt(self, chat_id: str) -> PreviousPrompt | None:
        """The chat's last prompt, from its last audit (cache-stable shifts)."""
        ...


class NoStore:
    """The view of a shift that needs nothing stored (names no model, role, chat or history): the
    process's in-memory calibration, which a shift without a model never reads."""

    read_seconds = 0.0

    def model_config(self, model: str, role: Role) -> ModelConfig | None:
        return None

    def history(self, chat_id: str, profile: str) -> Sequence[StoredBlock]:
        return ()

    def previous_prompt(self, chat_id: str) -> PreviousPrompt | None:
        return None

    def factor(self, model: str | None) -> float:
        return calibration.DEFAULT.factor(model)


NO_STORE = NoStore()


def role_of(value: context_service_pb2.ModelRole.ValueType, field: str) -> Role:
    if value not in ROLES:
        raise invalid(field, f"unknown value {value}")
    return ROLES[value]


def timestamp(ms: int) -> timestamp_pb2.Timestamp:
    """Unix milliseconds as a Timestamp."""
    stamp = timestamp_pb2.Timestamp()
    stamp.FromMilliseconds(ms)
    return stamp


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
    raise invalid(at, rules.ONEOF_REQUIRED[block_pb2.Part.DESCRIPTOR.full_name][1])


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


# Why a request may not set a library-only option.
_LIBRARY_ONLY = (
    "not accepted in a request: the server's settings choose its compaction endpoint (a URL from a "
    "request would let any caller make the server connect anywhere)"
)


def _options(struct: struct_pb2.Struct, strategy: StrategyInfo) -> dict[str, Any]:
    """The options as the library takes them: a Struct carries every number as a double, so an
    integer option's whole number becomes an int (anything else is left for validation to
    reject). Library-only options (an endpoint's URL, key, timeout) are refused."""
    options = json_format.MessageToDict(struct)
    refused = [
        (f"options.{spec.name}", _LIBRARY_ONLY)
        for spec in strategy.options
        if spec.library_only and spec.name in options
    ]
    if refused:
        raise InvalidOptions(refused)
    integers = {spec.name for spec in (*COMMON, *strategy.options) if spec.kind == "int"}
    for key in integers & options.keys():
        value = options[key]
        if isinstance(value, float) and value.is_integer():
            options[key] = int(value)
    return options


def _budget(
    request: ShiftRequest, resolution: Resolution, defaults: Budget, config: ModelConfig | None
) -> Window:
    """The request's window (`budget.resolve_window`): what it gives, then the model's stored
    configuration, the server's `defaults` (its settings, LLM_CONTEXT_SIZE / LLM_MAX_OUTPUT_TOKENS),
    the model registry, the built-in defaults."""
    given = Budget(
        *(
            getattr(request, name) if request.HasField(name) else None
            for name in ("context_limit", "response_reserve", "system_reserve")
        )
    )
    stored = (
        Budget(config.context_size, config.max_output_tokens, config.system_reserve) if config else Budget()
    )
    registry = Budget(resolution.context_window, resolution.max_output)
    return resolve_window(given, stored, defaults, registry)


@dataclass(frozen=True)
class Model:
    """The model a request means and how it counts: its stored configuration (by name, or by
    role), and the profile resolved from the request's profile, the configuration's, or the
    registry's."""

    config: ModelConfig | None
    resolution: Resolution


def resolve_model(
    profile: str, model: str, model_role: context_service_pb2.ModelRole.ValueType, store: StoreView
) -> Model:
    """`profile`, `model` and `model_role` of a request (empty: not given)."""
    role = role_of(model_role, "model_role")
    if model and role is not Role.NONE:
        raise invalid("model_role", "set either model or model_role, not both")
    violations = id_violations("model", model, required=False)
    if violations:
        raise InvalidInput(violations)
    config = store.model_config(model, role)
    if role is not Role.NONE and config is None:
        raise RequestError(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"model_role: no model configuration has role {role.value!r} (SetModelConfig or model_config_file)",
            reason="MODEL_ROLE_NOT_CONFIGURED",
            metadata={"role": role.value},
        )
    # The profile wins, a model alone picks its registry profile (and window, max output), an
    # unknown model counts with heuristic and says so; empty strings mean not given.
    named = model or (config.model if config else "")
    resolution = resolve_request(profile or (config.profile if config else "") or None, named or None)
    return Model(config, resolution)


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


def _decisions(result: ShiftResult) -> bytes:
    """The plan's kept and excluded blocks, encoded: by the core straight from the engine's plan
    (a Python object per block would be the bulk of a reply's building time), or from the
    decisions a strategy adjusted."""
    numbers = context_service_pb2.ContextPlan
    if isinstance(result.decisions, engine.Plan):
        return result.decisions.encode_decisions(numbers.KEPT_FIELD_NUMBER, numbers.EXCLUDED_FIELD_NUMBER)
    listed = context_service_pb2.ContextPlan(
        kept=[
            context_service_pb2.BlockDecision(id=d.id, tokens=d.tokens, reason=d.reason) for d in result.kept
        ],
        excluded=[
            context_service_pb2.BlockDecision(id=d.id, tokens=d.tokens, reason=d.reason)
            for d in result.excluded
        ],
    )
    return listed.SerializeToString()


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
    fields in any order): its small fields through protobuf, its messages and decisions by the
    core. An audit keeps the first two and lists the decisions in order instead."""

    fields: bytes
    messages: engine.Piece
    decisions: bytes

    def pieces(self) -> list[engine.Piece]:
        return [self.fields, self.messages, self.decisions]


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
    )
    return EncodedPlan(
        plan.SerializeToString(), _provider_messages(result, output_format), _decisions(result)
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
    shift's own time (`shift`, without its reads of the store)."""

    request: R
    result: ShiftResult
    blocks: int
    plan: EncodedPlan
    seconds: float


def read_shift_request(message: bytes, request_type: type[R]) -> tuple[R, bytes]:
    """An encoded ShiftContext or PreviewContext request, parsed, with its `blocks_json` taken out
    as UTF-8 bytes (empty when not set) for the core to parse: 40 KB of JSON never becomes a str."""
    try:
        rest, blocks_json = engine.split_message_field(message, request_type.BLOCKS_JSON_FIELD_NUMBER)
        return request_type.FromString(rest), blocks_json or b""
    except (ValueError, DecodeError) as e:
        raise undecodable(request_type.DESCRIPTOR.full_name, message) from e


def shift(request: R, blocks_json: bytes, defaults: Budget, store: StoreView = NO_STORE) -> Shifted[R]:
    """Run the shift a ShiftContext or PreviewContext request asks for (as `read_shift_request`
    gives it), with what `store` holds for it."""
    start, read_before = time.perf_counter(), store.read_seconds
    if request.blocks and blocks_json:  # `request` comes without its blocks_json (read_shift_request)
        raise invalid("blocks_json", "set either blocks or blocks_json, not both")
    if request.output_format not in _OUTPUT_FORMATS:
        raise invalid("output_format", f"unknown value {request.output_format}")
    violations = rules.violations(request)
    if violations:
        raise InvalidInput(violations)
    model = resolve_model(request.profile, request.model, request.model_role, store)
    resolution: Resolution = model.resolution
    budget = _budget(request, resolution, defaults, model.config)
    typed = [block_dict(b, f"blocks[{i}]") for i, b in enumerate(request.blocks)]
    blocks: list[dict[str, Any]] | bytes = typed if request.blocks else blocks_json or b"[]"
    stored = store.history(request.chat_id, resolution.profile) if request.use_stored_history else ()
    joined: history.Joined | None = None
    if stored:
        joined = history.join(stored, history.typed_texts(typed) if request.blocks else blocks_json or b"[]")
        blocks = joined.json
    strategy = strategy_named(request.strategy or DEFAULT_STRATEGY)
    try:
        result = contextshift.shift_context(
            blocks,
            budget=budget.as_budget(),
            profile=resolution.profile,
            strategy=strategy.name,
            options=_options(request.options, strategy) if request.HasField("options") else None,
            model=resolution.model,  # the calibration key of an approximate profile
            calibration_source=store,
            known_tokens=joined.known_tokens if joined else None,
            # A chat's shifts are cache-stable from its first (an empty previous prompt).
            previous=(store.previous_prompt(request.chat_id) or PreviousPrompt())
            if request.chat_id
            else None,
            tools=request.tools_json or None,
        )
    except InvalidTools as e:
        raise _renamed(e, lambda field: re.sub(r"^tools\b", "tools_json", field)) from e
    except InvalidInput as e:
        if joined and any(v.field == "blocks_json" for v in e.violations):
            history.request_texts(blocks_json)  # the request's own error, at its own offsets
        rename: Callable[[str], str] = typed_field if request.blocks else lambda field: field
        raise history.renamed(e, joined.stored if joined else 0, rename) from e
    warnings = [*resolution.warnings, *(joined.warnings if joined else ())]
    encoded = encode_plan(result, budget, warnings, request.output_format)
    seconds = time.perf_counter() - start - (store.read_seconds - read_before)
    return Shifted(request, result, result.block_count, encoded, seconds)


def count(
    request: context_service_pb2.CountTokensRequest, store: StoreView = NO_STORE
) -> context_service_pb2.CountTokensResponse:
    resolution = resolve_model(
        request.profile, request.model, context_service_pb2.MODEL_ROLE_UNSPECIFIED, store
    ).resolution
    items: list[str | dict[str, Any]] = []
    for i, item in enumerate(request.items):
        which = item.WhichOneof("item")
        if which == "text":
            items.append(item.text)
        elif which == "block":
            items.append(block_dict(item.block, f"items[{i}].block"))
        else:
            raise invalid(
                f"items[{i}]", rules.ONEOF_REQUIRED[context_service_pb2.CountItem.DESCRIPTOR.full_name][1]
            )
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


def _option_message(spec: OptionSpec) -> context_service_pb2.StrategyOption:
    default = struct_pb2.Value()
    json_format.ParseDict(spec.default, default)
    return context_service_pb2.StrategyOption(
        name=spec.name, type=spec.kind, default_value=default, description=spec.description
    )


def strategies() -> context_service_pb2.ListStrategiesResponse:
    return context_service_pb2.ListStrategiesResponse(
        strategies=[
            context_service_pb2.Strategy(
                name=s.name,
                description=s.description,
                options=[_option_message(o) for o in s.options if not o.library_only],
                builtin=s.builtin,
            )
            for s in list_strategies()
        ],
        common_options=[_option_message(o) for o in COMMON],
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
