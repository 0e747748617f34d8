"""Every unary call goes through here: the caller's API key is checked (see `auth`), library errors
become statuses with details, bugs become INTERNAL with a log line (never a hung call), and each call
is logged as one structured line (method, status, duration, blocks, tokens; never message content)
and counted in the metrics. The HTTP surface (`api.http`) ends its calls the same way."""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, cast

import grpc
from google.protobuf import descriptor_pool
from grpc import aio

from contextshift.api import metrics
from contextshift.api.auth import ApiKeys, authenticate, current_tenant
from contextshift.api.errors import internal, status_for, undecodable
from contextshift.errors import TokenBudgetExceeded

log = logging.getLogger("contextshift.api")

# Services any caller may use without a key: load balancers and tools probe these.
PUBLIC_SERVICES = ("/grpc.health.v1.Health/", "/grpc.reflection.")


@dataclass
class CallStats:
    """What a servicer method reports about its call for the log line."""

    blocks: int | None = None
    tokens: int | None = None
    shift_seconds: float | None = None  # a shift's own time (convert.Shifted.seconds)


_stats: contextvars.ContextVar[CallStats] = contextvars.ContextVar("contextshift_call_stats")


def call_stats() -> CallStats:
    """The current call's stats, filled in by the servicer."""
    return _stats.get()


def begin_call_stats() -> CallStats:
    """Fresh stats for a call starting in the current context."""
    stats = CallStats()
    _stats.set(stats)
    return stats


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, and the record's `fields`."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname,
            "logger": record.name,
            "pid": record.process,
            "msg": record.getMessage(),
        }
        line.update(getattr(record, "fields", {}))
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


def error_status(error: Exception, method: str) -> grpc.Status:
    """The status a call that raised `error` answers with: a bug is logged and becomes INTERNAL."""
    if isinstance(error, TokenBudgetExceeded):
        metrics.record_budget_exceeded(method)
    status = status_for(error)
    if status is None:
        log.exception("unexpected error", extra={"fields": {"method": method}})
        status = internal(f"internal error ({type(error).__name__}); see the server log")
    return status


def end_call(surface: str, method: str, status: str, start: float, stats: CallStats) -> None:
    """The log line and the metrics of a call answered with `status`."""
    seconds = time.perf_counter() - start
    fields: dict[str, Any] = {"method": method, "status": status, "duration_ms": round(seconds * 1e3, 3)}
    if stats.blocks is not None:
        fields["blocks"] = stats.blocks
    if stats.tokens is not None:
        fields["tokens"] = stats.tokens
    if stats.shift_seconds is not None:
        fields["shift_ms"] = round(stats.shift_seconds * 1e3, 3)
    if current_tenant():
        fields["tenant"] = current_tenant()
    log.info("rpc" if surface == "grpc" else surface, extra={"fields": fields})
    metrics.record_call(
        surface,
        method,
        status,
        seconds,
        blocks=stats.blocks,
        tokens=stats.tokens,
        shift_seconds=stats.shift_seconds,
    )


def _authorization(context: aio.ServicerContext[Any, Any]) -> str | None:
    for key, value in context.invocation_metadata() or ():
        if key == "authorization":
            return value if isinstance(value, str) else value.decode()
    return None


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


Behavior = Callable[[Any, aio.ServicerContext[Any, Any]], Awaitable[Any]]


DEADLINE_SLACK_SECONDS = 0.1


class ErrorsAndLogging(aio.ServerInterceptor):
    def __init__(self, keys: ApiKeys | None = None) -> None:
        self._keys = keys
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
        # Streaming calls (health Watch, reflection) pass through untouched.
        if handler is None or handler.unary_unary is None:
            return handler
        # The request is decoded inside the wrapper, not by gRPC: bytes that are not the method's
        # request message are then INVALID_ARGUMENT, logged and counted like any other error,
        # where a failing deserializer would answer UNKNOWN with no log line.
        wrapped = grpc.unary_unary_rpc_method_handler(
            self._wrap(method, cast(Behavior, handler.unary_unary), handler.request_deserializer),
            response_serializer=handler.response_serializer,
        )
        self._wrapped[method] = wrapped
        return wrapped

    def _wrap(self, method: str, behavior: Behavior, deserializer: Callable[[bytes], Any] | None) -> Behavior:
        needs_key = not method.startswith(PUBLIC_SERVICES)

        async def call(request: Any, context: aio.ServicerContext[Any, Any]) -> Any:
            stats = begin_call_stats()
            start = time.perf_counter()
            code = grpc.StatusCode.OK
            try:
                if needs_key:
                    authenticate(self._keys, _authorization(context))
                if deserializer is not None:
                    request = _decoded(method, request, deserializer)
                return await behavior(request, context)
            except asyncio.CancelledError:
                # The client cancelled, or its deadline passed. The client's stream reset can
                # arrive a little before this server's copy of the deadline runs out (the deadline
                # travels as a relative timeout), so "almost out of time" counts as expired.
                remaining = context.time_remaining()
                expired = remaining is not None and remaining <= DEADLINE_SLACK_SECONDS
                code = grpc.StatusCode.DEADLINE_EXCEEDED if expired else grpc.StatusCode.CANCELLED
                raise
            except aio.AbortError:
                code = context.code() or grpc.StatusCode.UNKNOWN
                raise
            except Exception as error:
                status = error_status(error, method)
                code = status.code
                await context.abort_with_status(status)
                raise  # not reached: abort_with_status raises
            finally:
                end_call("grpc", method, code.name, start, stats)

        return call
