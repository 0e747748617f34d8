"""ContextShiftService over the library. The engine and every conversion run on a thread pool (the
Rust core releases the GIL), so the event loop only moves bytes and the deadline is watched while
the engine works: a call whose deadline passes is cancelled, its result discarded, nothing stored."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import grpc
from grpc import aio

from contextshift._proto.contextshift.bench.v1 import echo_service_pb2, echo_service_pb2_grpc
from contextshift._proto.contextshift.v1 import context_service_pb2 as pb
from contextshift._proto.contextshift.v1 import context_service_pb2_grpc
from contextshift.api import convert
from contextshift.api.interceptors import call_stats
from contextshift.profiles import list_profiles

T = TypeVar("T")
Context = aio.ServicerContext[Any, Any]

NO_AUDIT_STORE = (
    "{rpc} needs the audit store, which is not built yet (DESIGN.md §8); this server keeps no audits"
)
NO_CALIBRATION = (
    "FinishGeneration is not available yet: generation status needs the audit store and "
    "calibration of approximate profiles (contextshift.calibration) is not built yet; nothing was recorded"
)


class ContextShiftServicer(context_service_pb2_grpc.ContextShiftServiceServicer):
    def __init__(self, executor: ThreadPoolExecutor, defaults: convert.BudgetDefaults) -> None:
        self._executor = executor
        self._defaults = defaults

    async def _run(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn)

    async def _plan(self, request: convert.ShiftRequest) -> pb.ContextPlan:
        plan = await self._run(functools.partial(convert.shift, request, self._defaults))
        stats = call_stats()
        stats.blocks = plan.compaction.original_count
        stats.tokens = plan.prompt_tokens
        return plan

    async def ShiftContext(
        self, request: pb.ShiftContextRequest, context: Context
    ) -> pb.ShiftContextResponse:
        plan = await self._plan(request)
        return pb.ShiftContextResponse(generation_id=request.generation_id or convert.uuid7(), plan=plan)

    async def PreviewContext(
        self, request: pb.PreviewContextRequest, context: Context
    ) -> pb.PreviewContextResponse:
        return pb.PreviewContextResponse(plan=await self._plan(request))

    async def CountTokens(self, request: pb.CountTokensRequest, context: Context) -> pb.CountTokensResponse:
        response = await self._run(functools.partial(convert.count, request))
        stats = call_stats()
        stats.blocks = len(response.counts)
        stats.tokens = response.total
        return response

    async def ListTokenizerProfiles(
        self, request: pb.ListTokenizerProfilesRequest, context: Context
    ) -> pb.ListTokenizerProfilesResponse:
        return pb.ListTokenizerProfilesResponse(
            profiles=[pb.TokenizerProfile(name=p.name, approximate=p.approximate) for p in list_profiles()]
        )

    async def GetContextAudit(
        self, request: pb.GetContextAuditRequest, context: Context
    ) -> pb.GetContextAuditResponse:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, NO_AUDIT_STORE.format(rpc="GetContextAudit"))

    async def FinishGeneration(
        self, request: pb.FinishGenerationRequest, context: Context
    ) -> pb.FinishGenerationResponse:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, NO_CALIBRATION)

    async def DeleteChat(self, request: pb.DeleteChatRequest, context: Context) -> pb.DeleteChatResponse:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, NO_AUDIT_STORE.format(rpc="DeleteChat"))


class EchoServicer(echo_service_pb2_grpc.EchoServiceServicer):
    """Benchmark only (served with --bench-echo): the cost of a unary call with no work."""

    async def Echo(
        self, request: echo_service_pb2.EchoRequest, context: Context
    ) -> echo_service_pb2.EchoResponse:
        return echo_service_pb2.EchoResponse(payload=request.payload)
