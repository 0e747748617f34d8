"""`contextshift.Client` / `contextshift.AsyncClient`: the gRPC service with the library's types.

    with contextshift.Client("127.0.0.1:50051") as client:
        result = client.shift_context(blocks, budget=contextshift.Budget(128_000, 16_000))

Blocks go as JSON text (`blocks_json`, parsed by the server's engine), so any shape the library
accepts works. Results come back as `ShiftResult` (with the server's extras), and the service's
errors are raised as the library's, chosen by the ErrorInfo reason the server gives
(`contextshift.errors.ErrorReason`): `TokenBudgetExceeded`, `InvalidBlocks`, `InvalidOptions`,
`InvalidTools`, `InvalidInput`. Any other failure (a stale generation, a full store, unavailable,
a deadline, NOT_FOUND, ...) is a `ServiceError`: a `grpc.RpcError` with its `code()` and
`details()`, and the server's `reason` and `metadata` when it gave them.

Every RPC of the service has its method, on `Client` and on `AsyncClient` alike; the store's
(audits, history, model configurations) return the response's messages as the .proto defines them.

A call naming a chat sends its id as `x-chat-id` metadata too, which a balancer hashes on to keep
the chat on one server process (deploy/haproxy). A server with API keys needs `api_key=` (sent as
`authorization: Bearer <key>` on every call); one with TLS needs
`credentials=grpc.ssl_channel_credentials(...)` (with a client certificate for mutual TLS).

`finish_generation(generation_id, "completed", reported_prompt_tokens=...)` reports how the
generation ended and the provider's prompt tokens, which calibrate the model's approximate counts
(kept in the server's store: any worker or replica takes the report).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self, TypedDict, TypeVar, Unpack, cast

import grpc
from google.protobuf import json_format, struct_pb2
from google.protobuf.message import Message
from google.rpc import error_details_pb2
from grpc import aio
from grpc_status import rpc_status

from contextshift._proto.contextshift.v1 import context_service_pb2 as pb
from contextshift._proto.contextshift.v1 import context_service_pb2_grpc
from contextshift.api.service import chat_header
from contextshift.budget import Budget
from contextshift.calibration import Calibration
from contextshift.diagnostics import CompactionUsage, Diagnostic
from contextshift.engine import BlockDecision
from contextshift.errors import (
    ContextShiftError,
    ErrorReason,
    InvalidBlocks,
    InvalidInput,
    InvalidOptions,
    InvalidTools,
    TokenBudgetExceeded,
)
from contextshift.options import OptionSpec
from contextshift.profile_bench import Accuracy, Report, Throughput
from contextshift.profiles import ProfileInfo
from contextshift.result import ImageCount, ReasoningCount, ShiftResult, Truncation
from contextshift.strategies import Relevance, Summary

_STRING_FIELDS = {"profile", "strategy", "model", "provider", "chat_id", "generation_id"}
Blocks = Sequence[Mapping[str, Any]] | str | bytes
OUTPUT_FORMATS = {
    "input": pb.OUTPUT_FORMAT_INPUT,
    "openai_chat": pb.OUTPUT_FORMAT_OPENAI_CHAT,
    "anthropic_messages": pb.OUTPUT_FORMAT_ANTHROPIC_MESSAGES,
}
GENERATION_STATUSES = {
    "completed": pb.GENERATION_STATUS_COMPLETED,
    "failed": pb.GENERATION_STATUS_FAILED,
    "cancelled": pb.GENERATION_STATUS_CANCELLED,
}
_EXACTNESS = {
    pb.EXACTNESS_EXACT: "exact",
    pb.EXACTNESS_TEXT_EXACT: "text-exact",
    pb.EXACTNESS_APPROXIMATE: "approximate",
}


@dataclass(frozen=True)
class RemoteShiftResult(ShiftResult):
    """A `ShiftResult` from the service, with what only the service reports."""

    generation_id: str  # empty for a preview
    context_limit: int
    response_reserve: int
    system: str  # Anthropic's top-level system text (output_format="anthropic_messages")
    was_compacted: bool


@dataclass(frozen=True)
class FinishResult:
    """The answer to `finish_generation`."""

    # True when the reported prompt tokens fed the model's calibration (see the .proto for when not).
    calibration_recorded: bool
    # The model's calibration after the call, if it has one.
    calibration: Calibration | None
    # The generation's status after the call: "completed", "failed" or "cancelled".
    status: str = ""
    # With "failed": the normalized provider error stored, e.g. "RATE_LIMITED".
    provider_error_code: str | None = None


@dataclass(frozen=True)
class ListedDecisions:
    """The decisions of a reply."""

    kept_decisions: list[BlockDecision]
    excluded_decisions: list[BlockDecision]

    def ordered_decisions(self) -> list[tuple[BlockDecision, bool]]:
        # A reply lists kept and excluded blocks apart, without positions; the chat's audit
        # (GetContextAudit) has them in order.
        raise NotImplementedError("a service reply does not say where excluded blocks stood")


@dataclass(frozen=True)
class JsonMessages:
    """The provider messages of a reply, decoded only when asked for."""

    text: str

    def as_list(self) -> list[Mapping[str, Any]]:
        messages: list[Mapping[str, Any]] = json.loads(self.text)
        return messages

    def as_json(self) -> bytes:
        return self.text.encode()


class PreviewArgs(TypedDict, total=False):
    """Keyword arguments of `preview_context`; `budget=None` lets the server choose (model, defaults)."""

    budget: int | Budget | None
    profile: str
    strategy: str
    options: Mapping[str, Any] | None
    output_format: str  # "input", "openai_chat" or "anthropic_messages"
    model: str
    tools: Sequence[Mapping[str, Any]] | str | bytes | None  # sent as tools_json
    timeout: float | None


class ShiftArgs(PreviewArgs, total=False):
    """Keyword arguments of `shift_context`."""

    provider: str
    chat_id: str
    generation_id: str


def _request(blocks: Blocks, args: PreviewArgs | ShiftArgs) -> dict[str, Any]:
    """The fields of a ShiftContextRequest / PreviewContextRequest."""
    text = blocks.decode() if isinstance(blocks, bytes) else blocks
    fields = {key: value for key, value in args.items() if key in _STRING_FIELDS}
    request: dict[str, Any] = {
        "blocks_json": text if isinstance(text, str) else json.dumps(list(text), ensure_ascii=False),
        "output_format": OUTPUT_FORMATS[args.get("output_format", "input")],
        **fields,
    }
    budget = args.get("budget")
    if isinstance(budget, int):
        budget = Budget(budget, 0, 0)  # a window with no reserves resolves to exactly this budget
    if budget is not None:  # the figures left out resolve on the server
        figures = ("context_limit", "response_reserve", "system_reserve")
        request.update({name: getattr(budget, name) for name in figures if getattr(budget, name) is not None})
    options = args.get("options")
    if options is not None:
        struct = struct_pb2.Struct()
        struct.update(options)
        request["options"] = struct
    tools = args.get("tools")
    if tools is not None:
        tools = tools.decode() if isinstance(tools, bytes) else tools
        request["tools_json"] = (
            tools if isinstance(tools, str) else json.dumps(list(tools), ensure_ascii=False)
        )
    return request


def _count_request(texts: Sequence[str], profile: str, model: str) -> pb.CountTokensRequest:
    return pb.CountTokensRequest(items=[pb.CountItem(text=t) for t in texts], profile=profile, model=model)


def _result(plan: pb.ContextPlan, generation_id: str = "") -> RemoteShiftResult:
    return RemoteShiftResult(
        decisions=ListedDecisions(
            [BlockDecision(d.id, d.tokens, d.reason) for d in plan.kept],
            [BlockDecision(d.id, d.tokens, d.reason) for d in plan.excluded],
        ),
        truncated=[Truncation(t.id, t.tokens_before, t.tokens_after, t.how) for t in plan.truncated],
        prompt_tokens=plan.prompt_tokens,
        budget=plan.budget,
        profile=plan.profile,
        approximate=plan.approximate,
        warnings=list(plan.warnings),
        kept_messages=JsonMessages(plan.messages.messages_json or "[]"),
        generation_id=generation_id,
        context_limit=plan.context_limit,
        response_reserve=plan.response_reserve,
        system=plan.messages.system,
        was_compacted=plan.compaction.was_compacted,
        model=plan.model or None,
        calibration_factor=plan.calibration_factor,
        calibrated_prompt_tokens=plan.calibrated_prompt_tokens,
        diagnostics=[
            Diagnostic(d.source, d.event, d.detail, d.tokens if d.HasField("tokens") else None)
            for d in plan.diagnostics
        ],
        strategy=plan.strategy,
        block_count=plan.compaction.original_count,
        summary=_summary(plan) if plan.HasField("summary") else None,
        relevance=[Relevance(r.id, r.score, r.source) for r in plan.relevance],
        compaction_usage=_compaction_usage(plan) if plan.HasField("compaction_usage") else None,
        tools_tokens=plan.tools_tokens,
        reasoning_rule=plan.reasoning_rule,
        reasoning=[ReasoningCount(r.id, r.tokens, r.counted, r.basis) for r in plan.reasoning],
        images=[ImageCount(i.id, i.index, i.tokens, i.width, i.height, i.basis) for i in plan.images],
    )


def _compaction_usage(plan: pb.ContextPlan) -> CompactionUsage:
    u = plan.compaction_usage
    return CompactionUsage(
        u.model,
        u.prompt_tokens if u.HasField("prompt_tokens") else None,
        u.completion_tokens if u.HasField("completion_tokens") else None,
    )


def _summary(plan: pb.ContextPlan) -> Summary:
    s = plan.summary
    before = None  # a reply does not carry block positions; the summary's place is in messages
    message = {"id": s.id, "role": "system", "kind": "summary", "content": s.text}
    return Summary(
        message,
        s.tokens,
        before,
        s.summarized_count,
        s.facts_kept,
        s.facts_total,
        plan.compaction.divider_text,
    )


@dataclass(frozen=True)
class StrategyListing:
    """The strategies a server offers (`list_strategies`) and the options every one takes."""

    strategies: list[StrategyDescription]
    common_options: list[OptionSpec]


@dataclass(frozen=True)
class StrategyDescription:
    name: str
    description: str
    options: list[OptionSpec]
    builtin: bool


def _option(o: pb.StrategyOption) -> OptionSpec:
    return OptionSpec(o.name, o.type, json_format.MessageToDict(o.default_value), o.description)


def _strategies(response: pb.ListStrategiesResponse) -> StrategyListing:
    return StrategyListing(
        [
            StrategyDescription(s.name, s.description, [_option(o) for o in s.options], s.builtin)
            for s in response.strategies
        ],
        [_option(o) for o in response.common_options],
    )


def _profile_info(p: pb.TokenizerProfile) -> ProfileInfo:
    return ProfileInfo(
        p.name,
        p.approximate,
        exactness=_EXACTNESS.get(p.exactness, "approximate" if p.approximate else "exact"),
        source=p.source,
        licence=p.licence,
        vocab_size=p.vocab_size if p.HasField("vocab_size") else None,
        message_overhead=dict(p.message_overhead),
        name_overhead=p.name_overhead if p.HasField("name_overhead") else None,
        prompt_overhead=p.prompt_overhead,
        image_rule=p.image_rule,
        overhead_source=p.overhead_source,
        reasoning_rule=p.reasoning_rule,
        reasoning_source=p.reasoning_source,
    )


class FinishArgs(TypedDict, total=False):
    """Keyword arguments of `finish_generation`."""

    reported_prompt_tokens: int | None
    # With "failed": what the provider answered, as `{"http_status": 429, "type": ..., "code": ...,
    # "message": ...}` (any of them); the server stores only the normalized code.
    provider_error: Mapping[str, Any] | None
    error_code: str  # deprecated: use provider_error
    chat_id: str
    timeout: float | None


def _finish_request(generation_id: str, status: str, args: FinishArgs) -> pb.FinishGenerationRequest:
    if status not in GENERATION_STATUSES:
        raise InvalidOptions(
            [("status", f"unknown status {status!r} (one of {', '.join(GENERATION_STATUSES)})")]
        )
    error = args.get("provider_error")
    return pb.FinishGenerationRequest(
        chat_id=args.get("chat_id", ""),
        generation_id=generation_id,
        status=GENERATION_STATUSES[status],
        error_code=args.get("error_code", ""),
        reported_prompt_tokens=args.get("reported_prompt_tokens"),
        provider_error=pb.ProviderError(**error) if error is not None else None,
    )


_STATUS_NAMES = {value: name for name, value in GENERATION_STATUSES.items()}


def _finish_result(response: pb.FinishGenerationResponse) -> FinishResult:
    c = response.calibration
    code = pb.ProviderErrorCode.Name(response.provider_error_code).removeprefix("PROVIDER_ERROR_CODE_")
    return FinishResult(
        response.calibration_recorded,
        Calibration(c.model, c.factor, c.samples) if response.HasField("calibration") else None,
        _STATUS_NAMES.get(response.status, ""),
        None if code == "UNSPECIFIED" else code,
    )


def _report(response: pb.BenchmarkProfilesResponse) -> Report:
    def fields(message: Message) -> dict[str, Any]:
        return {f.name: getattr(message, f.name) for f in message.DESCRIPTOR.fields}

    return Report(
        response.documents,
        response.messages,
        response.bytes,
        [Throughput(**fields(t)) for t in response.throughput],
        [Accuracy(**fields(a)) for a in response.accuracy],
        dict(response.skipped),
    )


MODEL_ROLES = {"": pb.MODEL_ROLE_UNSPECIFIED, "main": pb.MODEL_ROLE_MAIN, "fast": pb.MODEL_ROLE_FAST}


def _role(role: str) -> pb.ModelRole.ValueType:
    if role not in MODEL_ROLES:
        raise InvalidOptions([("role", f"unknown role {role!r} (main or fast)")])
    return MODEL_ROLES[role]


class AppendArgs(TypedDict, total=False):
    """Keyword arguments of `append_blocks`: the profile to count with, or a model naming it."""

    profile: str
    model: str
    timeout: float | None


def _append_request(chat_id: str, blocks: Blocks, args: AppendArgs) -> pb.AppendBlocksRequest:
    text = _request(blocks, {})["blocks_json"]
    return pb.AppendBlocksRequest(
        chat_id=chat_id, blocks_json=text, profile=args.get("profile", ""), model=args.get("model", "")
    )


class ServiceError(ContextShiftError, grpc.RpcError):
    """An error the service answered with that no library error stands for: its status `code()`
    and `details()` (a `grpc.RpcError`, as grpc raises them), and the ErrorInfo `reason` (an
    `ErrorReason`'s value, or "" when the server gave none) and `metadata`."""

    def __init__(
        self, code: grpc.StatusCode, details: str, reason: str = "", metadata: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(f"{code.name}: {details}")
        self._code = code
        self._details = details
        self.reason = reason
        self.metadata = dict(metadata or {})

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


def _token_budget_exceeded(metadata: Mapping[str, str]) -> TokenBudgetExceeded:
    return TokenBudgetExceeded(
        int(metadata["protected_tokens"]), int(metadata["budget"]), int(metadata.get("tools_tokens", "0"))
    )


# The library's errors by the ErrorInfo reason the server answers them with.
_INVALID = {kind.code: kind for kind in (InvalidInput, InvalidBlocks, InvalidOptions, InvalidTools)}


def library_error(error: grpc.RpcError) -> Exception:
    """The exception a service error stands for: the library's, by the ErrorInfo reason (bad
    input, with the BadRequest's fields), else a `ServiceError`."""
    call = cast(grpc.Call, error)  # raised by a call: grpc's or grpc.aio's, both with code() and details()
    status = rpc_status.from_call(call)
    info = error_details_pb2.ErrorInfo()
    violations: list[tuple[str, str]] = []
    for detail in status.details if status else []:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            detail.Unpack(info)
        elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
            violations = [(v.field, v.description) for v in bad.field_violations]
    if info.reason == ErrorReason.TOKEN_BUDGET_EXCEEDED:
        return _token_budget_exceeded(info.metadata)
    if info.reason in _INVALID:
        return _INVALID[ErrorReason(info.reason)](violations)
    return ServiceError(call.code(), call.details() or "", info.reason, info.metadata)


Metadata = tuple[tuple[str, str], ...]


def _metadata(api_key: str | None) -> Metadata | None:
    return (("authorization", f"Bearer {api_key}"),) if api_key else None


def _call_metadata(metadata: Metadata | None, request: Message) -> Metadata | None:
    """A call's metadata: the key's, and `x-chat-id` when the request names a chat, for a balancer
    to keep the chat's calls on one server process (`chat_header`)."""
    chat_id = getattr(request, "chat_id", "")
    return (*(metadata or ()), (chat_header.HEADER, chat_header.value(chat_id))) if chat_id else metadata


Request = TypeVar("Request", bound=Message)
Reply = TypeVar("Reply", bound=Message)


class Client:
    """Blocking client. `target` is host:port; `credentials` makes the channel TLS; pass `channel`
    to use your own (options)."""

    def __init__(
        self,
        target: str = "127.0.0.1:50051",
        *,
        channel: grpc.Channel | None = None,
        api_key: str | None = None,
        credentials: grpc.ChannelCredentials | None = None,
    ) -> None:
        if channel is None:
            channel = (
                grpc.insecure_channel(target)
                if credentials is None
                else grpc.secure_channel(target, credentials)
            )
        self._channel = channel
        self._stub = context_service_pb2_grpc.ContextShiftServiceStub(self._channel)
        self._metadata = _metadata(api_key)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        self._channel.close()

    def _call(
        self, method: grpc.UnaryUnaryMultiCallable[Request, Reply], request: Request, timeout: float | None
    ) -> Reply:
        """The one way every method calls the service: the key, the chat, the deadline, the errors."""
        try:
            return method(request, metadata=_call_metadata(self._metadata, request), timeout=timeout)
        except grpc.RpcError as e:
            raise library_error(e) from e

    def shift_context(self, blocks: Blocks, **args: Unpack[ShiftArgs]) -> RemoteShiftResult:
        """As `contextshift.shift_context`, on the server; see `ShiftArgs`."""
        request = pb.ShiftContextRequest(**_request(blocks, args))
        response = self._call(self._stub.ShiftContext, request, args.get("timeout"))
        return _result(response.plan, response.generation_id)

    def preview_context(self, blocks: Blocks, **args: Unpack[PreviewArgs]) -> RemoteShiftResult:
        """As `shift_context`, writing nothing on the server."""
        request = pb.PreviewContextRequest(**_request(blocks, args))
        return _result(self._call(self._stub.PreviewContext, request, args.get("timeout")).plan)

    def count_tokens(
        self, texts: Sequence[str], profile: str = "", *, model: str = "", timeout: float | None = None
    ) -> list[int]:
        """Tokens of each text."""
        return list(self._call(self._stub.CountTokens, _count_request(texts, profile, model), timeout).counts)

    def list_profiles(self, *, timeout: float | None = None) -> list[ProfileInfo]:
        """Every profile the server counts with, as `contextshift.profiles.list_profiles()` gives."""
        response = self._call(self._stub.ListTokenizerProfiles, pb.ListTokenizerProfilesRequest(), timeout)
        return [_profile_info(p) for p in response.profiles]

    def list_strategies(self, *, timeout: float | None = None) -> StrategyListing:
        """The strategies the server offers, with their options."""
        return _strategies(self._call(self._stub.ListStrategies, pb.ListStrategiesRequest(), timeout))

    def finish_generation(
        self, generation_id: str, status: str = "completed", **args: Unpack[FinishArgs]
    ) -> FinishResult:
        """Reports how a generation ended ("completed", "failed" with `provider_error`,
        "cancelled") and the provider's prompt tokens, which calibrate the model's approximate
        counts; see `FinishArgs`."""
        request = _finish_request(generation_id, status, args)
        return _finish_result(self._call(self._stub.FinishGeneration, request, args.get("timeout")))

    def get_context_audit(self, chat_id: str, *, timeout: float | None = None) -> pb.ContextAudit:
        """The chat's last audit (`ServiceError` NOT_FOUND when it has none)."""
        return self._call(
            self._stub.GetContextAudit, pb.GetContextAuditRequest(chat_id=chat_id), timeout
        ).audit

    def list_chats(
        self, page_size: int = 0, page_token: str = "", *, timeout: float | None = None
    ) -> pb.ListChatsResponse:
        """A page of the tenant's chats with an audit, newest first (`page_size` 0: 50, at most
        1000); pass its `next_page_token` as `page_token` for the next page (empty: none)."""
        request = pb.ListChatsRequest(page_size=page_size, page_token=page_token)
        return self._call(self._stub.ListChats, request, timeout)

    def delete_chat(self, chat_id: str, *, timeout: float | None = None) -> bool:
        """Deletes the chat's audit, generations, history and counts; whether it had any."""
        return bool(self._call(self._stub.DeleteChat, pb.DeleteChatRequest(chat_id=chat_id), timeout).deleted)

    def append_blocks(
        self, chat_id: str, blocks: Blocks, **args: Unpack[AppendArgs]
    ) -> pb.AppendBlocksResponse:
        """Stores `blocks` at the end of the chat's history, counted (`use_stored_history`)."""
        return self._call(
            self._stub.AppendBlocks, _append_request(chat_id, blocks, args), args.get("timeout")
        )

    def set_model_config(self, config: pb.ModelConfig, *, timeout: float | None = None) -> pb.ModelConfig:
        """Creates or replaces a model's stored configuration; the configuration stored."""
        return self._call(self._stub.SetModelConfig, pb.SetModelConfigRequest(config=config), timeout).config

    def get_model_config(
        self, model: str = "", *, role: str = "", timeout: float | None = None
    ) -> pb.ModelConfig:
        """A model's stored configuration, or the one holding `role` ("main" or "fast")."""
        request = pb.GetModelConfigRequest(model=model, role=_role(role))
        return self._call(self._stub.GetModelConfig, request, timeout).config

    def list_model_configs(self, *, timeout: float | None = None) -> list[pb.ModelConfig]:
        """Every stored model configuration of the caller's tenant."""
        return list(self._call(self._stub.ListModelConfigs, pb.ListModelConfigsRequest(), timeout).configs)

    def delete_model_config(self, model: str, *, timeout: float | None = None) -> bool:
        """Deletes a model's stored configuration; whether there was one."""
        return bool(
            self._call(
                self._stub.DeleteModelConfig, pb.DeleteModelConfigRequest(model=model), timeout
            ).deleted
        )

    def benchmark_profiles(
        self, documents: Sequence[str] = (), profiles: Sequence[str] = (), *, timeout: float | None = None
    ) -> Report:
        """`contextshift bench-profiles` on the server, on these documents (none: its sample corpus)."""
        request = pb.BenchmarkProfilesRequest(documents=documents, profiles=profiles)
        return _report(self._call(self._stub.BenchmarkProfiles, request, timeout))


class AsyncClient:
    """The same calls for asyncio (grpc.aio)."""

    def __init__(
        self,
        target: str = "127.0.0.1:50051",
        *,
        channel: aio.Channel | None = None,
        api_key: str | None = None,
        credentials: grpc.ChannelCredentials | None = None,
    ) -> None:
        if channel is None:
            channel = (
                aio.insecure_channel(target)
                if credentials is None
                else aio.secure_channel(target, credentials)
            )
        self._channel = channel
        # The generated stub over an aio channel (typed as the .pyi's async stub).
        self._stub = context_service_pb2_grpc.ContextShiftServiceStub(self._channel)
        self._metadata = _metadata(api_key)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close()

    async def _call(
        self, method: aio.UnaryUnaryMultiCallable[Request, Reply], request: Request, timeout: float | None
    ) -> Reply:
        """The one way every method calls the service: the key, the chat, the deadline, the errors."""
        try:
            return await method(request, metadata=_call_metadata(self._metadata, request), timeout=timeout)
        except grpc.RpcError as e:
            raise library_error(e) from e

    async def shift_context(self, blocks: Blocks, **args: Unpack[ShiftArgs]) -> RemoteShiftResult:
        request = pb.ShiftContextRequest(**_request(blocks, args))
        response = await self._call(self._stub.ShiftContext, request, args.get("timeout"))
        return _result(response.plan, response.generation_id)

    async def preview_context(self, blocks: Blocks, **args: Unpack[PreviewArgs]) -> RemoteShiftResult:
        request = pb.PreviewContextRequest(**_request(blocks, args))
        return _result((await self._call(self._stub.PreviewContext, request, args.get("timeout"))).plan)

    async def count_tokens(
        self, texts: Sequence[str], profile: str = "", *, model: str = "", timeout: float | None = None
    ) -> list[int]:
        return list(
            (await self._call(self._stub.CountTokens, _count_request(texts, profile, model), timeout)).counts
        )

    async def list_profiles(self, *, timeout: float | None = None) -> list[ProfileInfo]:
        response = await self._call(
            self._stub.ListTokenizerProfiles, pb.ListTokenizerProfilesRequest(), timeout
        )
        return [_profile_info(p) for p in response.profiles]

    async def list_strategies(self, *, timeout: float | None = None) -> StrategyListing:
        return _strategies(await self._call(self._stub.ListStrategies, pb.ListStrategiesRequest(), timeout))

    async def finish_generation(
        self, generation_id: str, status: str = "completed", **args: Unpack[FinishArgs]
    ) -> FinishResult:
        request = _finish_request(generation_id, status, args)
        return _finish_result(await self._call(self._stub.FinishGeneration, request, args.get("timeout")))

    async def get_context_audit(self, chat_id: str, *, timeout: float | None = None) -> pb.ContextAudit:
        request = pb.GetContextAuditRequest(chat_id=chat_id)
        return (await self._call(self._stub.GetContextAudit, request, timeout)).audit

    async def list_chats(
        self, page_size: int = 0, page_token: str = "", *, timeout: float | None = None
    ) -> pb.ListChatsResponse:
        request = pb.ListChatsRequest(page_size=page_size, page_token=page_token)
        return await self._call(self._stub.ListChats, request, timeout)

    async def delete_chat(self, chat_id: str, *, timeout: float | None = None) -> bool:
        return bool(
            (await self._call(self._stub.DeleteChat, pb.DeleteChatRequest(chat_id=chat_id), timeout)).deleted
        )

    async def append_blocks(
        self, chat_id: str, blocks: Blocks, **args: Unpack[AppendArgs]
    ) -> pb.AppendBlocksResponse:
        request = _append_request(chat_id, blocks, args)
        return await self._call(self._stub.AppendBlocks, request, args.get("timeout"))

    async def set_model_config(
        self, config: pb.ModelConfig, *, timeout: float | None = None
    ) -> pb.ModelConfig:
        request = pb.SetModelConfigRequest(config=config)
        return (await self._call(self._stub.SetModelConfig, request, timeout)).config

    async def get_model_config(
        self, model: str = "", *, role: str = "", timeout: float | None = None
    ) -> pb.ModelConfig:
        request = pb.GetModelConfigRequest(model=model, role=_role(role))
        return (await self._call(self._stub.GetModelConfig, request, timeout)).config

    async def list_model_configs(self, *, timeout: float | None = None) -> list[pb.ModelConfig]:
        return list(
            (await self._call(self._stub.ListModelConfigs, pb.ListModelConfigsRequest(), timeout)).configs
        )

    async def delete_model_config(self, model: str, *, timeout: float | None = None) -> bool:
        request = pb.DeleteModelConfigRequest(model=model)
        return bool((await self._call(self._stub.DeleteModelConfig, request, timeout)).deleted)

    async def benchmark_profiles(
        self, documents: Sequence[str] = (), profiles: Sequence[str] = (), *, timeout: float | None = None
    ) -> Report:
        request = pb.BenchmarkProfilesRequest(documents=documents, profiles=profiles)
        return _report(await self._call(self._stub.BenchmarkProfiles, request, timeout))
