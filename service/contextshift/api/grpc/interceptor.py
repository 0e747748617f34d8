"""Every unary gRPC call goes through the service's call gate (`calls.Gate`): the caller's API key,
errors as statuses with details, one log line and the metrics per call. What is gRPC's own: the
request is decoded here, so bytes that are not the method's request message are INVALID_ARGUMENT
(logged and counted like any other error, where a failing deserializer would answer UNKNOWN with
no log line), a call cancelled near its deadline counts as DEADLINE_EXCEEDED, and the call's
deadline bounds its store calls when sooner than the store's own bound (`audit.bounds`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, cast

import grpc
from google.protobuf import descriptor_pool
from google.rpc import status_pb2
from grpc import aio
from grpc_status import rpc_status

from contextshift.api.service import chat_header
from contextshift.api.service.gate import CallFailed, Gate
from contextshift.api.service.rpc_status import code_name, undecodable
from contextshift.audit import bounds

# Services any caller may use without a key: load balancers and tools probe these.
PUBLIC_SERVICES = ("/grpc.health.v1.Health/", "/grpc.reflection.")
# The client's stream reset can arrive a little before this server's copy of the deadline runs
# out (the deadline travels as a relative timeout), so "almost out of time" counts as expired.
DEADLINE_SLACK_SECONDS = 0.1

Behavior = Callable[[Any, aio.ServicerContext[Any, Any]], Awaitable[Any]]


class _GrpcCall:
    """One gRPC call as the gate sees it (`calls.Surface`)."""

    name = "grpc"

    def __init__(self, context: aio.ServicerContext[Any, Any]) -> None:
        self._context = context

    def label(self, status: status_pb2.Status | None, error: BaseException | None) -> str:
        if isinstance(error, asyncio.CancelledError):
            remaining = self._context.time_remaining()
            expired = remaining is not None and remaining <= DEADLINE_SLACK_SECONDS
            return "DEADLINE_EXCEEDED" if expired else "CANCELLED"
        if isinstance(error, aio.AbortError):
            return (self._context.code() or grpc.StatusCode.UNKNOWN).name
        return "OK" if status is None else code_name(status)

    def answered(self, error: Exception) -> bool:
        return isinstance(error, aio.AbortError)  # another service's handler aborted (health)


def _headers(context: aio.ServicerContext[Any, Any]) -> tuple[str | None, str | None]:
    """The call's `authorization` and `x-chat-id` metadata (None: not sent)."""
    authorization = chat = None
    for key, value in context.invocation_metadata() or ():
        if key == "authorization":
            authorization = value if isinstance(value, str) else value.decode()
        elif key == chat_header.HEADER:
            chat = value if isinstance(value, str) else value.decode()
    return authorization, chat


def _decoded(method: str, data: bytes, deserializer: Callable[[bytes], Any]) -> Any:
    """The request message of `method` (`/package.Service/Method`) from its bytes; INVALID_ARGUMENT
    naming the message (and where possible the byte offset) when they are not one."""
    try:
        return deserializer(data)
    except Exception as e:  # DecodeError, or what another service's deserializer raises
        service, _, name = method.strip("/").partition("/")
        try:
            found = descriptor_pool.Default().FindServiceByName(service).FindMethodByName(name)
            message = found.input_type.full_name
        except KeyError:
            message = f"request of {method}"
        raise undecodable(message, data) from e


class GateInterceptor(aio.ServerInterceptor):
    """Wraps every unary method's handler (ours, health's, reflection's; streams pass through) so
    its calls go through `gate`."""

    def __init__(self, gate: Gate) -> None:
        self._gate = gate
        # A method's handler is fixed once the server runs: wrap it once, not on every call.
        self._wrapped: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        method = handler_call_details.method
        wrapped = self._wrapped.get(method)
        if wrapped is not None:
            return wrapped
        handler = await continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:
            return handler
        wrapped = grpc.unary_unary_rpc_method_handler(
            self._wrap(method, cast(Behavior, handler.unary_unary), handler.request_deserializer),
            response_serializer=handler.response_serializer,
        )
        self._wrapped[method] = wrapped
        return wrapped

    def _wrap(self, method: str, behavior: Behavior, deserializer: Callable[[bytes], Any] | None) -> Behavior:
        public = method.startswith(PUBLIC_SERVICES)

        async def call(request: Any, context: aio.ServicerContext[Any, Any]) -> Any:
            async def work() -> Any:
                decoded = request if deserializer is None else _decoded(method, request, deserializer)
                remaining = context.time_remaining()
                # The call's store calls end by its deadline, when sooner than the store's bound.
                with bounds.caller_deadline(None if remaining is None else time.monotonic() + remaining):
                    return await behavior(decoded, context)

            authorization, chat = _headers(context)
            try:
                return await self._gate.serve(
                    _GrpcCall(context), method, authorization, work, public=public, chat=chat
                )
            except CallFailed as failed:
                await context.abort_with_status(rpc_status.to_status(failed.status))
                raise  # not reached: abort_with_status raises

        return call
