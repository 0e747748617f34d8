"""`contextshift.Client` / `contextshift.AsyncClient`: the gRPC service with the library's types.

    with contextshift.Client("127.0.0.1:50051") as client:
        result = client.shift_context(blocks, budget=contextshift.Budget(128_000, 16_000))

Blocks go as JSON text (`blocks_json`, parsed by the server's engine), so any shape the library
accepts works. Results come back as `ShiftResult` (with the server's extras), and the service's
errors are raised as the library's: `TokenBudgetExceeded`, `InvalidBlocks`, `InvalidOptions`.
Other failures (unavailable, deadline, an unknown generation's NOT_FOUND, ...) stay `grpc.RpcError`.

`finish_generation(generation_id, "completed", reported_prompt_tokens=...)` reports the provider's
prompt tokens, which calibrates the model's approximate counts on the server process that served
the ShiftContext (use the same client).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self, TypedDict, Unpack

import grpc
from google.protobuf import struct_pb2
from google.rpc import error_details_pb2
from grpc import aio
from grpc_status import rpc_status

from contextshift._proto.contextshift.v1 import context_service_pb2 as pb
from contextshift._proto.contextshift.v1 import context_service_pb2_grpc
from contextshift.budget import Budget
from contextshift.calibration import Calibration
from contextshift.diagnostics import Diagnostic
from contextshift.engine import BlockDecision
from contextshift.errors import InvalidBlocks, InvalidInput, InvalidOptions, InvalidTools, TokenBudgetExceeded
from contextshift.profiles import ProfileInfo
from contextshift.shift import ShiftResult, Truncation

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
    # The model's calibration on the server process after the call, if it has one.
    calibration: Calibration | None


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
        budget = Budget(budget)  # a window with no reserves resolves to exactly this budget
    if budget is not None:
        request.update(
            context_limit=budget.context_limit,
            response_reserve=budget.response_reserve,
            system_reserve=budget.system_reserve,
        )
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
        tools_tokens=plan.tools_tokens,
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
    )


def _finish_request(
    generation_id: str, status: str, reported_prompt_tokens: int | None, error_code: str, chat_id: str
) -> pb.FinishGenerationRequest:
    if status not in GENERATION_STATUSES:
        raise InvalidOptions(
            [("status", f"unknown status {status!r} (one of {', '.join(GENERATION_STATUSES)})")]
        )
    return pb.FinishGenerationRequest(
        chat_id=chat_id,
        generation_id=generation_id,
        status=GENERATION_STATUSES[status],
        error_code=error_code,
        reported_prompt_tokens=reported_prompt_tokens,
    )


def _finish_result(response: pb.FinishGenerationResponse) -> FinishResult:
    c = response.calibration
    return FinishResult(
        response.calibration_recorded,
        Calibration(c.model, c.factor, c.samples) if response.HasField("calibration") else None,
    )


def library_error(error: grpc.RpcError) -> Exception:
    """The library exception a service error stands for, or the error itself."""
    status = rpc_status.from_call(error)  # type: ignore[arg-type]  # an RpcError from a call is a Call
    for detail in status.details if status else []:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            if info.reason == TokenBudgetExceeded.code:
                return TokenBudgetExceeded(
                    int(info.metadata["protected_tokens"]),
                    int(info.metadata["budget"]),
                    int(info.metadata.get("tools_tokens", "0")),
                )
        if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
            violations = [(v.field, v.description) for v in bad.field_violations]
            kind: type[InvalidInput] = InvalidOptions
            if all(field.startswith(("blocks", "items")) for field, _ in violations):
                kind = InvalidBlocks
            elif all(field.startswith("tools_json") for field, _ in violations):
                kind = InvalidTools
            return kind(violations)
    return error


class Client:
    """Blocking client. `target` is host:port; pass `channel` to use your own (TLS, options)."""

    def __init__(self, target: str = "127.0.0.1:50051", *, channel: grpc.Channel | None = None) -> None:
        self._channel = channel or grpc.insecure_channel(target)
        self._stub = context_service_pb2_grpc.ContextShiftServiceStub(self._channel)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        self._channel.close()

    def shift_context(self, blocks: Blocks, **args: Unpack[ShiftArgs]) -> RemoteShiftResult:
        """As `contextshift.shift_context`, on the server; see `ShiftArgs`."""
        try:
            response = self._stub.ShiftContext(
                pb.ShiftContextRequest(**_request(blocks, args)), timeout=args.get("timeout")
            )
        except grpc.RpcError as e:
            raise library_error(e) from e
        return _result(response.plan, response.generation_id)

    def preview_context(self, blocks: Blocks, **args: Unpack[PreviewArgs]) -> RemoteShiftResult:
        """As `shift_context`, writing nothing on the server."""
        try:
            response = self._stub.PreviewContext(
                pb.PreviewContextRequest(**_request(blocks, args)), timeout=args.get("timeout")
            )
        except grpc.RpcError as e:
            raise library_error(e) from e
        return _result(response.plan)

    def count_tokens(
        self, texts: Sequence[str], profile: str = "", *, model: str = "", timeout: float | None = None
    ) -> list[int]:
        """Tokens of each text."""
        try:
            return list(self._stub.CountTokens(_count_request(texts, profile, model), timeout=timeout).counts)
        except grpc.RpcError as e:
            raise library_error(e) from e

    def list_profiles(self, *, timeout: float | None = None) -> list[ProfileInfo]:
        """Every profile the server counts with, as `contextshift.profiles.list_profiles()` gives."""
        response = self._stub.ListTokenizerProfiles(pb.ListTokenizerProfilesRequest(), timeout=timeout)
        return [_profile_info(p) for p in response.profiles]

    def finish_generation(
        self,
        generation_id: str,
        status: str = "completed",
        *,
        reported_prompt_tokens: int | None = None,
        error_code: str = "",
        chat_id: str = "",
        timeout: float | None = None,
    ) -> FinishResult:
        """Reports how a generation ended ("completed", "failed" with `error_code`, "cancelled") and
        the provider's prompt tokens, which calibrate the model's approximate counts."""
        request = _finish_request(generation_id, status, reported_prompt_tokens, error_code, chat_id)
        try:
            return _finish_result(self._stub.FinishGeneration(request, timeout=timeout))
        except grpc.RpcError as e:
            raise library_error(e) from e


class AsyncClient:
    """The same calls for asyncio (grpc.aio)."""

    def __init__(self, target: str = "127.0.0.1:50051", *, channel: aio.Channel | None = None) -> None:
        self._channel = channel or aio.insecure_channel(target)
        self._stub = context_service_pb2_grpc.ContextShiftServiceAsyncStub(self._channel)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close()

    async def shift_context(self, blocks: Blocks, **args: Unpack[ShiftArgs]) -> RemoteShiftResult:
        try:
            response = await self._stub.ShiftContext(
                pb.ShiftContextRequest(**_request(blocks, args)), timeout=args.get("timeout")
            )
        except grpc.RpcError as e:
            raise library_error(e) from e
        return _result(response.plan, response.generation_id)

    async def preview_context(self, blocks: Blocks, **args: Unpack[PreviewArgs]) -> RemoteShiftResult:
        try:
            response = await self._stub.PreviewContext(
                pb.PreviewContextRequest(**_request(blocks, args)), timeout=args.get("timeout")
            )
        except grpc.RpcError as e:
            raise library_error(e) from e
        return _result(response.plan)

    async def count_tokens(
        self, texts: Sequence[str], profile: str = "", *, model: str = "", timeout: float | None = None
    ) -> list[int]:
        try:
            response = await self._stub.CountTokens(_count_request(texts, profile, model), timeout=timeout)
        except grpc.RpcError as e:
            raise library_error(e) from e
        return list(response.counts)

    async def list_profiles(self, *, timeout: float | None = None) -> list[ProfileInfo]:
        response = await self._stub.ListTokenizerProfiles(pb.ListTokenizerProfilesRequest(), timeout=timeout)
        return [_profile_info(p) for p in response.profiles]

    async def finish_generation(
        self,
        generation_id: str,
        status: str = "completed",
        *,
        reported_prompt_tokens: int | None = None,
        error_code: str = "",
        chat_id: str = "",
        timeout: float | None = None,
    ) -> FinishResult:
        request = _finish_request(generation_id, status, reported_prompt_tokens, error_code, chat_id)
        try:
            return _finish_result(await self._stub.FinishGeneration(request, timeout=timeout))
        except grpc.RpcError as e:
            raise library_error(e) from e
