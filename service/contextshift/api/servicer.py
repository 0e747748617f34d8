"""ContextShiftService over the library. The engine and every conversion run on a thread pool (the
Rust core releases the GIL), so the event loop only moves bytes and the deadline is watched while
the engine works: a call whose deadline passes is cancelled, its result discarded, nothing stored.
Requests of at most `inline_request_bytes` are the exception once their profile is loaded: their
engine work (a fraction of a millisecond) costs less than the hop to a thread, so they run on the
event loop, to completion."""

from __future__ import annotations

import asyncio
import functools
import threading
from collections import OrderedDict
from collections.abc import Callable, Set
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import grpc
from google.protobuf import message_factory
from google.protobuf.descriptor import ServiceDescriptor
from grpc import aio

from contextshift import calibration, engine
from contextshift._proto.contextshift.bench.v1 import echo_service_pb2
from contextshift._proto.contextshift.v1 import context_service_pb2 as pb
from contextshift.api import convert
from contextshift.api.errors import RequestError
from contextshift.api.interceptors import call_stats
from contextshift.errors import FieldViolation
from contextshift.profiles import ProfileInfo, list_profiles

T = TypeVar("T")
Context = aio.ServicerContext[Any, Any]

NO_AUDIT_STORE = (
    "{rpc} needs the audit store, which is not built yet (DESIGN.md §8); this server keeps no audits"
)
# ShiftContext generations whose estimates FinishGeneration can still calibrate with, per process.
MAX_GENERATIONS = 10_000
# (profile, model) pairs a process remembers having served, so their small requests run inline;
# bounded because clients choose the strings.
MAX_SERVED_PROFILES = 1024

_EXACTNESS = {
    "exact": pb.EXACTNESS_EXACT,
    "text-exact": pb.EXACTNESS_TEXT_EXACT,
    "approximate": pb.EXACTNESS_APPROXIMATE,
}
_TERMINAL = {pb.GENERATION_STATUS_COMPLETED, pb.GENERATION_STATUS_FAILED, pb.GENERATION_STATUS_CANCELLED}


def profile_message(info: ProfileInfo) -> pb.TokenizerProfile:
    return pb.TokenizerProfile(
        name=info.name,
        approximate=info.approximate,
        exactness=_EXACTNESS[info.exactness],  # a new kind of exactness must be added to the proto
        source=info.source,
        vocab_size=info.vocab_size,
        message_overhead=info.message_overhead,
        name_overhead=info.name_overhead,
        prompt_overhead=info.prompt_overhead,
        image_rule=info.image_rule,
        overhead_source=info.overhead_source,
        licence=info.licence,
    )


@dataclass
class Generation:
    """What FinishGeneration needs of a ShiftContext: the calibration key and the raw estimate."""

    model: str
    prompt_tokens: int  # raw, before calibration
    approximate: bool
    reported: bool = False  # a FinishGeneration already fed its reported count


class Generations:
    """The last `capacity` ShiftContext generations of this process, by id (least recently
    recorded out first). Thread-safe."""

    def __init__(self, capacity: int = MAX_GENERATIONS) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self._capacity = capacity
        self._lock = threading.Lock()
        self._items: OrderedDict[str, Generation] = OrderedDict()

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def add(self, generation_id: str, generation: Generation) -> None:
        with self._lock:
            self._items.pop(generation_id, None)  # a reused id starts over
            self._items[generation_id] = generation
            while len(self._items) > self._capacity:
                self._items.popitem(last=False)

    @property
    def capacity(self) -> int:
        return self._capacity

    def finish(self, generation_id: str, *, report: bool) -> Generation | None:
        """The generation as it was before this call (None when unknown); with `report`, it is
        marked reported in the same step, so of concurrent or retried reports one sees
        `reported=False`."""
        with self._lock:
            generation = self._items.get(generation_id)
            if generation is None:
                return None
            before = replace(generation)
            if report:
                generation.reported = True
            return before


def _finish_violations(request: pb.FinishGenerationRequest) -> list[FieldViolation]:
    found: list[FieldViolation] = []
    if not request.generation_id:
        found.append(FieldViolation("generation_id", "required: the generation_id ShiftContext returned"))
    if request.status not in _TERMINAL:
        what = (
            "not set"
            if request.status == pb.GENERATION_STATUS_UNSPECIFIED
            else f"unknown value {request.status}"
        )
        found.append(FieldViolation("status", f"{what}: set COMPLETED, FAILED or CANCELLED"))
    if request.error_code and request.status != pb.GENERATION_STATUS_FAILED:
        found.append(FieldViolation("error_code", "only with status FAILED"))
    if request.HasField("reported_prompt_tokens") and request.reported_prompt_tokens <= 0:
        found.append(
            FieldViolation(
                "reported_prompt_tokens", f"must be > 0 when set, got {request.reported_prompt_tokens}"
            )
        )
    return found


class ContextShiftServicer:
    """The methods of ContextShiftService (served by `add_context_service`)."""

    def __init__(
        self,
        executor: ThreadPoolExecutor,
        defaults: convert.BudgetDefaults,
        *,
        inline_request_bytes: int = 0,
        max_generations: int = MAX_GENERATIONS,
    ) -> None:
        self._executor = executor
        self._defaults = defaults
        self._inline_request_bytes = inline_request_bytes
        self._served_profiles: set[tuple[str, str]] = set()
        self._generations = Generations(max_generations)

    async def _run(
        self, fn: Callable[[], T], request_bytes: int | None = None, profile: tuple[str, str] | None = None
    ) -> T:
        """Runs `fn` on the engine threads. A request of at most `inline_request_bytes` runs on the
        event loop instead, once this process has served its `(profile, model)`: for a small
        request the hop to a thread and back (two wake-ups, and the GIL handed between the threads)
        costs more than the engine work itself, but a first use loads a vocabulary or a
        tokenizer.json (up to seconds), which must not stall the loop."""
        small = request_bytes is not None and request_bytes <= self._inline_request_bytes
        if small and profile in self._served_profiles:
            return fn()
        result = await asyncio.get_running_loop().run_in_executor(self._executor, fn)
        if small and profile is not None and len(self._served_profiles) < MAX_SERVED_PROFILES:
            self._served_profiles.add(profile)
        return result

    async def _shift(self, request: bytes, request_type: type[convert.R]) -> convert.Shifted[convert.R]:
        # Read here, as grpc's own deserializer would: a copy of the JSON, and a small message.
        read, blocks_json = convert.read_shift_request(request, request_type)
        shifted = await self._run(
            functools.partial(convert.shift, read, blocks_json, self._defaults),
            len(request),
            (read.profile, read.model),
        )
        stats = call_stats()
        stats.blocks = shifted.blocks
        stats.tokens = shifted.result.prompt_tokens
        return shifted

    async def ShiftContext(self, request: bytes, context: Context) -> bytes:
        """An encoded ShiftContextRequest in, an encoded ShiftContextResponse out (see
        `add_context_service`)."""
        shifted = await self._shift(request, pb.ShiftContextRequest)
        generation_id = shifted.request.generation_id or convert.uuid7()
        # Remembered for FinishGeneration's calibration (PreviewContext writes nothing).
        result = shifted.result
        self._generations.add(
            generation_id, Generation(result.model or "", result.prompt_tokens, result.approximate)
        )
        head = pb.ShiftContextResponse(generation_id=generation_id).SerializeToString()
        return engine.encode_pieces([head, (pb.ShiftContextResponse.PLAN_FIELD_NUMBER, shifted.plan)])

    async def PreviewContext(self, request: bytes, context: Context) -> bytes:
        """An encoded PreviewContextRequest in, an encoded PreviewContextResponse out."""
        shifted = await self._shift(request, pb.PreviewContextRequest)
        return engine.encode_pieces([(pb.PreviewContextResponse.PLAN_FIELD_NUMBER, shifted.plan)])

    async def CountTokens(self, request: pb.CountTokensRequest, context: Context) -> pb.CountTokensResponse:
        response = await self._run(
            functools.partial(convert.count, request), request.ByteSize(), (request.profile, request.model)
        )
        stats = call_stats()
        stats.blocks = len(response.counts)
        stats.tokens = response.total
        return response

    async def ListTokenizerProfiles(
        self, request: pb.ListTokenizerProfilesRequest, context: Context
    ) -> pb.ListTokenizerProfilesResponse:
        profiles = await self._run(list_profiles)
        return pb.ListTokenizerProfilesResponse(profiles=[profile_message(p) for p in profiles])

    async def GetContextAudit(
        self, request: pb.GetContextAuditRequest, context: Context
    ) -> pb.GetContextAuditResponse:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, NO_AUDIT_STORE.format(rpc="GetContextAudit"))

    async def FinishGeneration(
        self, request: pb.FinishGenerationRequest, context: Context
    ) -> pb.FinishGenerationResponse:
        """Feeds the calibration; the terminal status is validated, and not stored until the audit
        store exists."""
        violations = _finish_violations(request)
        if violations:
            raise RequestError(
                grpc.StatusCode.INVALID_ARGUMENT,
                "; ".join(f"{v.field}: {v.description}" for v in violations),
                violations,
            )
        reported = request.reported_prompt_tokens if request.HasField("reported_prompt_tokens") else None
        generation = self._generations.finish(request.generation_id, report=reported is not None)
        if generation is None:
            raise RequestError(
                grpc.StatusCode.NOT_FOUND,
                f"generation {request.generation_id!r} is not known to this server process: it keeps the "
                f"estimates of its last {self._generations.capacity} ShiftContext generations in memory "
                "(send FinishGeneration over the channel that made the ShiftContext call)",
            )
        recorded = None
        # Only approximate counts are calibrated (exact ones are the model's own), once per generation.
        if reported is not None and generation.approximate and not generation.reported:
            recorded = calibration.record(generation.model, generation.prompt_tokens, reported)
        current = recorded or calibration.DEFAULT.get(generation.model)
        response = pb.FinishGenerationResponse(calibration_recorded=recorded is not None)
        if current is not None:
            response.calibration.CopyFrom(
                pb.Calibration(model=current.model, factor=current.factor, samples=current.samples)
            )
        return response

    async def DeleteChat(self, request: pb.DeleteChatRequest, context: Context) -> pb.DeleteChatResponse:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, NO_AUDIT_STORE.format(rpc="DeleteChat"))

    async def BenchmarkProfiles(
        self, request: pb.BenchmarkProfilesRequest, context: Context
    ) -> pb.BenchmarkProfilesResponse:
        """Profiles measured on the caller's corpus, on an engine thread (bounded in size and time
        by `profile_bench`)."""
        return await self._run(functools.partial(convert.benchmark_profiles, request))


def add_service(
    server: aio.Server, servicer: object, service: ServiceDescriptor, encoded: Set[str] = frozenset()
) -> None:
    """Serves every method of `service` from the servicer's method of the same name, as the
    generated `add_*Servicer_to_server` does, except that the methods in `encoded` take and
    return encoded messages (bytes), with no (de)serializer in between."""
    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}
    for method in service.methods:
        behavior = getattr(servicer, method.name)
        if method.name in encoded:
            handlers[method.name] = grpc.unary_unary_rpc_method_handler(behavior)
        else:
            request_type = message_factory.GetMessageClass(method.input_type)
            handlers[method.name] = grpc.unary_unary_rpc_method_handler(
                behavior,
                request_deserializer=request_type.FromString,
                response_serializer=lambda response: response.SerializeToString(),
            )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service.full_name, handlers),))
    server.add_registered_method_handlers(service.full_name, handlers)


def add_context_service(servicer: ContextShiftServicer, server: aio.Server) -> None:
    # ShiftContext and PreviewContext take and return encoded messages: `convert` takes the
    # request's `blocks_json` out as bytes and builds the reply's encoding around the kept blocks'
    # bytes, so the JSON is never decoded into a Python str, re-encoded, or copied through a
    # parsed reply message.
    encoded = {"ShiftContext", "PreviewContext"}
    add_service(server, servicer, pb.DESCRIPTOR.services_by_name["ContextShiftService"], encoded)


class EchoServicer:
    """Benchmark only (served with --bench-echo): the cost of a unary call with no work."""

    async def Echo(
        self, request: echo_service_pb2.EchoRequest, context: Context
    ) -> echo_service_pb2.EchoResponse:
        return echo_service_pb2.EchoResponse(payload=request.payload)

    async def EchoBytes(self, request: bytes, context: Context) -> bytes:
        return request  # an EchoBytesResponse is encoded as the EchoBytesRequest it answers


def add_echo_service(server: aio.Server) -> None:
    service = echo_service_pb2.DESCRIPTOR.services_by_name["EchoService"]
    add_service(server, EchoServicer(), service, encoded={"EchoBytes"})
