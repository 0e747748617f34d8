"""The one way into the service, for both surfaces (`Gate.serve`): the calls in flight against
the limit, the caller's API key (`auth`), the chat its `x-chat-id` header names (`chat_header`), the
call's stats, errors as a google.rpc.Status (a bug: INTERNAL and a log line, never a hung call),
and one structured log line and the metrics per call (method, status, duration, blocks, tokens;
never message content). The gRPC interceptor and the
HTTP routes bring only what is their own (`Surface`): how they name an answer in the log and the
metrics, and which exceptions already are their answer."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from google.rpc import code_pb2, status_pb2

from contextshift.api import metrics
from contextshift.api.auth import ApiKeys, authenticate, current_tenant
from contextshift.api.service import chat_header
from contextshift.api.service.rpc_status import RequestError, internal, status_of
from contextshift.errors import TokenBudgetExceeded

log = logging.getLogger("contextshift.api")

T = TypeVar("T")


@dataclass
class CallStats:
    """What a service method reports about its call for the log line."""

    blocks: int | None = None
    tokens: int | None = None
    shift_seconds: float | None = None  # a shift's own time (shifts.Shifted.seconds)


_stats: contextvars.ContextVar[CallStats] = contextvars.ContextVar("contextshift_call_stats")


def call_stats() -> CallStats:
    """The current call's stats, filled in by the service."""
    return _stats.get()


def begin_call_stats() -> CallStats:
    """Fresh stats for a call starting in the current context."""
    stats = CallStats()
    _stats.set(stats)
    return stats


class Surface(Protocol):
    """What a surface brings to a call it serves through the gate."""

    @property
    def name(self) -> str:
        """`grpc` or `http`: the label of its log lines and metrics."""
        ...

    def label(self, status: status_pb2.Status | None, error: BaseException | None) -> str:
        """The call's status in its log line and metrics: a success (neither), an error answered
        with `status`, or `error` the surface answered itself or that cancelled the call."""
        ...

    def answered(self, error: Exception) -> bool:
        """Whether `error` already is the surface's answer, to pass on as it is (gRPC's abort)."""
        ...


class CallFailed(Exception):
    """A call answered with an error: its status, for the surface to send, and its cause."""

    def __init__(self, status: status_pb2.Status, cause: Exception) -> None:
        super().__init__(status.message)
        self.status = status
        self.cause = cause


def failure_status(error: Exception, method: str) -> status_pb2.Status:
    """The status a call that raised `error` answers with: a bug is logged and becomes INTERNAL."""
    if isinstance(error, TokenBudgetExceeded):
        metrics.record_budget_exceeded(method)
    status = status_of(error)
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


class Gate:
    """Serves calls: the API keys every call but a public one needs, and the calls in flight at
    most (None: the surface bounds them itself, as gRPC does before a call reaches the gate)."""

    def __init__(self, keys: ApiKeys | None, max_in_flight: int | None = None) -> None:
        self._keys = keys
        self._max_in_flight = max_in_flight
        self._in_flight = 0

    async def serve(
        self,
        surface: Surface,
        method: str,
        authorization: str | None,
        work: Callable[[], Awaitable[T]],
        *,
        public: bool = False,
        chat: str | None = None,
    ) -> T:
        """`work()`'s answer; CallFailed with the status of what it (or the gate) raised. `chat`:
        the call's `x-chat-id` header, which the service compares with the chat its body names."""
        stats = begin_call_stats()
        chat_header.set_for_call(chat)
        start = time.perf_counter()
        status: status_pb2.Status | None = None
        error: BaseException | None = None
        admitted = False
        try:
            if self._max_in_flight is not None:
                if self._in_flight >= self._max_in_flight:
                    raise RequestError(
                        code_pb2.RESOURCE_EXHAUSTED,
                        f"the server is at its limit of {self._max_in_flight} calls in flight; retry later",
                    )
                self._in_flight += 1
                admitted = True
            if not public:
                authenticate(self._keys, authorization)
            return await work()
        except asyncio.CancelledError as cancelled:  # by the client, or its deadline
            error = cancelled
            raise
        except Exception as e:
            error = e
            if surface.answered(e):
                raise
            status = failure_status(e, method)
            raise CallFailed(status, e) from e
        finally:
            if admitted:
                self._in_flight -= 1
            end_call(surface.name, method, surface.label(status, error), start, stats)
