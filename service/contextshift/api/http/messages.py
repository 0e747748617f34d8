"""Messages over HTTP: a request body in the protobuf JSON mapping read into the RPC's request
message (after the OpenAPI document's check), a response message as JSON, and an error status as
google.rpc.Status JSON with its HTTP status.

A request body is the RPC's request message in the protobuf JSON mapping (lowerCamelCase or the
.proto's snake_case names, int64 as a number or a string), and `blocksJson` and `toolsJson` may
also be the JSON array itself rather than its text. Errors are `{"error": {...}}` in the shape of
google.rpc.Status over HTTP (AIP-193: `code` the HTTP status, `status` the gRPC code name,
`message`, `details`), plus `reason`, `protected_tokens`, `budget` and `tools_tokens` of an
ErrorInfo and the `field_violations` of a BadRequest, flattened.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import Message
from google.rpc import code_pb2, error_details_pb2, status_pb2

from contextshift.api.http.openapi import JSON_TEXT_FIELDS, RequestValidator
from contextshift.api.service.rpc_status import bad_fields, code_name, error_info, invalid
from contextshift.errors import ErrorReason

# google.rpc.Code over HTTP (google/rpc/code.proto), but for FAILED_PRECONDITION:
# TOKEN_BUDGET_EXCEEDED is a well-formed request whose protected blocks cannot fit (422); the
# others (a stale or already finished generation, a role no model holds) conflict with the stored
# state (409, see `http_status`).
HTTP_STATUS = {
    code_pb2.OK: 200,
    code_pb2.CANCELLED: 499,
    code_pb2.UNKNOWN: 500,
    code_pb2.INVALID_ARGUMENT: 400,
    code_pb2.DEADLINE_EXCEEDED: 504,
    code_pb2.NOT_FOUND: 404,
    code_pb2.ALREADY_EXISTS: 409,
    code_pb2.PERMISSION_DENIED: 403,
    code_pb2.UNAUTHENTICATED: 401,
    code_pb2.RESOURCE_EXHAUSTED: 429,
    code_pb2.FAILED_PRECONDITION: 422,  # see http_status
    code_pb2.ABORTED: 409,
    code_pb2.OUT_OF_RANGE: 400,
    code_pb2.UNIMPLEMENTED: 501,
    code_pb2.INTERNAL: 500,
    code_pb2.UNAVAILABLE: 503,
    code_pb2.DATA_LOSS: 500,
}

_PARSE_FIELD = re.compile(r"Failed to parse (\w+) field")
_UNKNOWN_FIELD = re.compile(r'no field named "([^"]+)"')


def json_names(payload: Any, descriptor: Any) -> Any:
    """`payload` with the .proto's field names (`chat_id`) as the JSON mapping's (`chatId`), in
    this message and the messages in it: the mapping reads both, the document lists the second."""
    if not isinstance(payload, dict) or descriptor.full_name.startswith("google.protobuf."):
        return payload
    out: dict[str, Any] = {}
    for key, value in payload.items():
        field = descriptor.fields_by_name.get(key) or descriptor.fields_by_camelcase_name.get(key)
        name = field.json_name if field is not None and field.json_name not in payload else key
        if (
            field is not None
            and field.message_type is not None
            and not field.message_type.GetOptions().map_entry
        ):
            value = (
                [json_names(v, field.message_type) for v in value]
                if isinstance(value, list)
                else json_names(value, field.message_type)
            )
        out[name] = value
    return out


def read_message(body: bytes, message: Message, validator: RequestValidator, rpc: str) -> None:
    """Fills `message` from a JSON body in the protobuf JSON mapping (see the module's doc), first
    checked against the OpenAPI document's schema of the message (`openapi.RequestValidator`)."""
    try:
        payload = json.loads(body)
    except ValueError as e:
        raise invalid("body", f"not JSON: {e}") from None
    if not isinstance(payload, dict):
        raise invalid(
            "body",
            f"expected a JSON object (a {message.DESCRIPTOR.full_name} in the protobuf JSON mapping), "
            f"got {type(payload).__name__}",
        )
    payload = json_names(payload, message.DESCRIPTOR)
    violations = validator.violations(rpc, payload)
    if violations:
        raise bad_fields(violations)
    for name in JSON_TEXT_FIELDS:
        field = message.DESCRIPTOR.fields_by_name.get(name)
        if field is not None and isinstance(payload.get(field.json_name), list):
            payload[field.json_name] = json.dumps(payload[field.json_name], ensure_ascii=False)
    try:
        json_format.ParseDict(payload, message)
    except (json_format.ParseError, ValueError) as e:  # ValueError: a string the message cannot hold
        text = str(e).splitlines()[0]  # the rest lists every field of the message
        path = _PARSE_FIELD.findall(text)
        unknown = _UNKNOWN_FIELD.search(text)
        if unknown:
            path.append(unknown.group(1))
        raise invalid(".".join(path) or "body", text) from None


def read_query(params: Iterable[tuple[str, str]], message: Message, fields: Sequence[str]) -> None:
    """Sets the request fields a route takes from its query string (`Operation.query`), each named
    by the .proto's name or the JSON mapping's and read as the JSON mapping reads a string (an
    empty value leaves the field unset). A parameter the route does not take, or one given twice,
    is INVALID_ARGUMENT naming it."""
    descriptor = message.DESCRIPTOR
    taken = {}
    for name in fields:
        field = descriptor.fields_by_name[name]
        taken[name] = taken[field.json_name] = field
    given: dict[str, str] = {}
    for key, value in params:
        found = taken.get(key)
        if found is None:
            names = ", ".join(descriptor.fields_by_name[name].json_name for name in fields)
            raise invalid(key, f"unknown query parameter: this route takes {names}")
        if found.name in given:
            raise invalid(found.name, "given more than once in the query")
        given[found.name] = value
    for name, value in given.items():
        if not value:
            continue
        try:
            json_format.ParseDict({taken[name].json_name: value}, message)
        except (json_format.ParseError, ValueError) as e:
            raise invalid(name, str(e).splitlines()[0]) from None


def message_json(message: Message) -> dict[str, Any]:
    return json_format.MessageToDict(message, always_print_fields_with_no_presence=True)


def http_status(status: status_pb2.Status) -> int:
    """The HTTP status of an error `status`."""
    info = error_info(status)
    reason = info.reason if info else None
    if status.code == code_pb2.FAILED_PRECONDITION and reason != ErrorReason.TOKEN_BUDGET_EXCEEDED:
        return 409
    if status.code == code_pb2.RESOURCE_EXHAUSTED and reason == ErrorReason.STORE_FULL:
        return 507  # Insufficient Storage: not a rate limit to back off from
    return HTTP_STATUS[status.code]


def error_json(status: status_pb2.Status, http: int) -> dict[str, Any]:
    """The body of an error answer with HTTP status `http` (see the module's doc)."""
    error: dict[str, Any] = {
        "code": http,
        "status": code_name(status),
        "message": status.message,
        "details": json_format.MessageToDict(status).get("details", []),
    }
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            error["reason"] = info.reason
            error.update({key: int(value) for key, value in info.metadata.items() if value.isdigit()})
        elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
            error["field_violations"] = [
                {"field": v.field, "description": v.description} for v in bad.field_violations
            ]
    return {"error": error}
