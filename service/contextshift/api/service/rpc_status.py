"""Library and store errors as google.rpc.Status with details (the error contract of the .proto),
the same for both surfaces: gRPC sends the status as it is, HTTP as JSON (`api.http.messages`).

Every expected error carries an ErrorInfo whose reason (`contextshift.errors.ErrorReason`) a client
tells errors apart by; bad input also carries a BadRequest naming each field."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from google.protobuf import any_pb2, duration_pb2
from google.protobuf.message import Message
from google.rpc import code_pb2, error_details_pb2, status_pb2

from contextshift import engine
from contextshift.audit.store import (
    AlreadyFinished,
    GenerationIdInUse,
    StaleGeneration,
    StoreFull,
    StoreUnavailable,
)
from contextshift.errors import (
    ErrorReason,
    FieldViolation,
    InvalidBlocks,
    InvalidInput,
    InvalidOptions,
    InvalidTools,
    TokenBudgetExceeded,
)

DOMAIN = "contextshift.v1"
# The retry delay an UNAVAILABLE store answer asks for (RetryInfo; HTTP Retry-After).
STORE_RETRY_SECONDS = 1
_ROOT = re.compile(r"[a-z_]*")  # a field path's first name

# Library field paths that name request fields by another name.
_FIELD_NAMES = {
    "budget.context_limit": "context_limit",
    "budget.response_reserve": "response_reserve",
    "budget.system_reserve": "system_reserve",
}


class RequestError(Exception):
    """A request the service itself refuses, with its google.rpc.Code and, where callers tell it
    apart, a stable reason (ErrorInfo). Bad input is the library's `InvalidInput` instead."""

    def __init__(
        self,
        code: code_pb2.Code.ValueType,
        message: str,
        *,
        reason: ErrorReason | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.metadata = dict(metadata or {})


def bad_fields(violations: Sequence[FieldViolation | tuple[str, str]]) -> InvalidInput:
    """Bad input in request fields, as the library error a client raises for it (the ErrorInfo
    reason is its `code`): the blocks' fields (`blocks`, `blocks_json`, `items`, a stored
    `history`) are InvalidBlocks, the tool definitions' InvalidTools, the request's bytes or body
    as a whole InvalidInput, any other field (options, ids, figures) InvalidOptions."""
    found = [v if isinstance(v, FieldViolation) else FieldViolation(*v) for v in violations]
    roots = {_ROOT.match(v.field).group() for v in found}  # type: ignore[union-attr]  # matches ""
    kind: type[InvalidInput] = InvalidOptions
    if roots <= {"blocks", "blocks_json", "items", "history"}:
        kind = InvalidBlocks
    elif roots <= {"tools_json"}:
        kind = InvalidTools
    elif roots <= {"request", "body"}:
        kind = InvalidInput
    return kind(found)


def invalid(field: str, description: str) -> InvalidInput:
    """Bad input in one request field (see `bad_fields`)."""
    return bad_fields([(field, description)])


def undecodable(message_name: str, data: bytes) -> InvalidInput:
    """Request bytes that are not an encoded `message_name`, with the byte offset of the first
    malformed top-level field when the framing is what is wrong (a bad string or embedded message
    inside well-framed fields has no offset to give)."""
    problem = engine.wire_problem(data) or (
        "its fields are framed well, but one holds a value of the wrong wire type, a string that is "
        "not UTF-8, or a malformed embedded message"
    )
    return invalid("request", f"not an encoded {message_name}: {problem}")


def _status(code: code_pb2.Code.ValueType, message: str, *details: Message) -> status_pb2.Status:
    packed = []
    for detail in details:
        packed.append(any_pb2.Any())
        packed[-1].Pack(detail)
    return status_pb2.Status(code=code, message=message, details=packed)


def _error_info(
    reason: ErrorReason, metadata: Mapping[str, str] | None = None
) -> error_details_pb2.ErrorInfo:
    return error_details_pb2.ErrorInfo(reason=reason, domain=DOMAIN, metadata=metadata)


def _bad_input(error: InvalidInput) -> status_pb2.Status:
    violations = [FieldViolation(_FIELD_NAMES.get(v.field, v.field), v.description) for v in error.violations]
    bad = error_details_pb2.BadRequest(
        field_violations=[
            error_details_pb2.BadRequest.FieldViolation(field=v.field, description=v.description)
            for v in violations
        ]
    )
    message = "; ".join(f"{v.field}: {v.description}" for v in violations)
    return _status(code_pb2.INVALID_ARGUMENT, message, _error_info(error.code), bad)


def status_of(error: Exception) -> status_pb2.Status | None:
    """The status for an error the service expects, or None for a bug."""
    message = str(error)
    if isinstance(error, InvalidInput):
        return _bad_input(error)
    if isinstance(error, TokenBudgetExceeded):
        metadata = {
            "protected_tokens": str(error.protected_tokens),
            "budget": str(error.budget),
            "tools_tokens": str(error.tools_tokens),
        }
        return _status(code_pb2.FAILED_PRECONDITION, message, _error_info(error.code, metadata))
    if isinstance(error, StaleGeneration):
        metadata = {"generation_id": error.generation_id, "current_generation_id": error.current or ""}
        return _status(
            code_pb2.FAILED_PRECONDITION, message, _error_info(ErrorReason.STALE_GENERATION, metadata)
        )
    if isinstance(error, AlreadyFinished):
        metadata = {"generation_id": error.generation_id, "status": error.status.value}
        info = _error_info(ErrorReason.GENERATION_ALREADY_FINISHED, metadata)
        return _status(code_pb2.FAILED_PRECONDITION, message, info)
    if isinstance(error, GenerationIdInUse):
        info = _error_info(ErrorReason.GENERATION_ID_IN_USE, {"generation_id": error.generation_id})
        return _status(code_pb2.ALREADY_EXISTS, message, info)
    if isinstance(error, StoreFull):
        # RESOURCE_EXHAUSTED, not UNAVAILABLE: retrying the same call does not help until room is
        # made (AIP-193).
        info = _error_info(ErrorReason.STORE_FULL, {"cause": error.cause})
        return _status(code_pb2.RESOURCE_EXHAUSTED, message, info)
    if isinstance(error, StoreUnavailable):
        retry = error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=STORE_RETRY_SECONDS))
        return _status(code_pb2.UNAVAILABLE, f"the store is unavailable: {error}", retry)
    if isinstance(error, RequestError):
        if error.reason is not None:
            return _status(error.code, message, _error_info(error.reason, error.metadata))
        return _status(error.code, message)
    return None


def internal(message: str) -> status_pb2.Status:
    return _status(code_pb2.INTERNAL, message)


def code_name(status: status_pb2.Status) -> str:
    """The status's code by name (`INVALID_ARGUMENT`), as logs, metrics and HTTP bodies give it."""
    return str(code_pb2.Code.Name(status.code))


def error_info(status: status_pb2.Status) -> error_details_pb2.ErrorInfo | None:
    """The status's ErrorInfo, if it has one."""
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return info
    return None
