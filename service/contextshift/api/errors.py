"""Library and store errors → gRPC status with google.rpc details (the error contract of the
.proto)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from contextshift import engine
from contextshift.audit.store import (
    AlreadyFinished,
    GenerationIdInUse,
    StaleGeneration,
    StoreFull,
    StoreUnavailable,
)
from contextshift.errors import FieldViolation, InvalidInput, TokenBudgetExceeded

DOMAIN = "contextshift.v1"
STORE_FULL = "STORE_FULL"  # the ErrorInfo reason of a write refused for want of room

# Library field paths that name request fields by another name.
_FIELD_NAMES = {
    "budget.context_limit": "context_limit",
    "budget.response_reserve": "response_reserve",
    "budget.system_reserve": "system_reserve",
}


class RequestError(Exception):
    """A request the API layer itself rejects, with its gRPC code, and either the fields at fault
    (BadRequest) or a stable reason (ErrorInfo)."""

    def __init__(
        self,
        code: grpc.StatusCode,
        message: str,
        violations: Iterable[FieldViolation] = (),
        *,
        reason: str = "",
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.violations = list(violations)
        self.reason = reason
        self.metadata = dict(metadata or {})


def invalid(field: str, description: str) -> RequestError:
    return RequestError(
        grpc.StatusCode.INVALID_ARGUMENT, f"{field}: {description}", [FieldViolation(field, description)]
    )


def undecodable(message_name: str, data: bytes) -> RequestError:
    """INVALID_ARGUMENT for request bytes that are not an encoded `message_name`, with the byte
    offset of the first malformed top-level field when the framing is what is wrong (a bad string
    or embedded message inside well-framed fields has no offset to give)."""
    problem = engine.wire_problem(data) or (
        "its fields are framed well, but one holds a value of the wrong wire type, a string that is "
        "not UTF-8, or a malformed embedded message"
    )
    return invalid("request", f"not an encoded {message_name}: {problem}")


def _pack(message: error_details_pb2.ErrorInfo | error_details_pb2.BadRequest) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(message)
    return packed


def _status(code: grpc.StatusCode, message: str, *details: any_pb2.Any) -> grpc.Status:
    number = code.value[0]
    return rpc_status.to_status(status_pb2.Status(code=number, message=message, details=list(details)))


def bad_request(message: str, violations: Iterable[FieldViolation]) -> grpc.Status:
    detail = error_details_pb2.BadRequest(
        field_violations=[
            error_details_pb2.BadRequest.FieldViolation(field=v.field, description=v.description)
            for v in violations
        ]
    )
    return _status(grpc.StatusCode.INVALID_ARGUMENT, message, _pack(detail))


def _with_reason(
    code: grpc.StatusCode, message: str, reason: str, metadata: Mapping[str, str]
) -> grpc.Status:
    return _status(
        code, message, _pack(error_details_pb2.ErrorInfo(reason=reason, domain=DOMAIN, metadata=metadata))
    )


def status_for(error: Exception) -> grpc.Status | None:
    """The status for an error the API expects, or None for a bug."""
    if isinstance(error, TokenBudgetExceeded):
        metadata = {
            "protected_tokens": str(error.protected_tokens),
            "budget": str(error.budget),
            "tools_tokens": str(error.tools_tokens),
        }
        return _with_reason(grpc.StatusCode.FAILED_PRECONDITION, str(error), error.code, metadata)
    if isinstance(error, StaleGeneration):
        metadata = {"generation_id": error.generation_id, "current_generation_id": error.current or ""}
        return _with_reason(grpc.StatusCode.FAILED_PRECONDITION, str(error), "STALE_GENERATION", metadata)
    if isinstance(error, AlreadyFinished):
        metadata = {"generation_id": error.generation_id, "status": error.status.value}
        return _with_reason(
            grpc.StatusCode.FAILED_PRECONDITION, str(error), "GENERATION_ALREADY_FINISHED", metadata
        )
    if isinstance(error, GenerationIdInUse):
        metadata = {"generation_id": error.generation_id}
        return _with_reason(grpc.StatusCode.ALREADY_EXISTS, str(error), "GENERATION_ID_IN_USE", metadata)
    if isinstance(error, StoreFull):
        # RESOURCE_EXHAUSTED, not UNAVAILABLE: retrying the same call does not help until room is
        # made (AIP-193).
        return _with_reason(
            grpc.StatusCode.RESOURCE_EXHAUSTED, str(error), STORE_FULL, {"cause": error.cause}
        )
    if isinstance(error, StoreUnavailable):
        return _status(grpc.StatusCode.UNAVAILABLE, f"the store is unavailable: {error}")
    if isinstance(error, InvalidInput):
        violations = [
            FieldViolation(_FIELD_NAMES.get(v.field, v.field), v.description) for v in error.violations
        ]
        return bad_request("; ".join(f"{v.field}: {v.description}" for v in violations), violations)
    if isinstance(error, RequestError):
        if error.violations:
            return bad_request(str(error), error.violations)
        if error.reason:
            return _with_reason(error.code, str(error), error.reason, error.metadata)
        return _status(error.code, str(error))
    return None


def internal(message: str) -> grpc.Status:
    return _status(grpc.StatusCode.INTERNAL, message)
