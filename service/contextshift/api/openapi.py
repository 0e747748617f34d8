"""The OpenAPI 3.1 document of the HTTP surface (served at /openapi.json). The schemas are made
from the .proto's message descriptors as the protobuf JSON mapping writes them, so they follow the
API as it changes; docs/api.md has the field by field documentation."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from google.protobuf.descriptor import Descriptor, EnumDescriptor, FieldDescriptor

from contextshift._proto.contextshift.v1 import context_service_pb2 as pb

if TYPE_CHECKING:
    from contextshift.api.http import Operation

_SERVICE = pb.DESCRIPTOR.services_by_name["ContextShiftService"]
_SCHEMAS = "#/components/schemas/"

_SCALARS: dict[int, dict[str, Any]] = {
    FieldDescriptor.TYPE_STRING: {"type": "string"},
    FieldDescriptor.TYPE_BOOL: {"type": "boolean"},
    FieldDescriptor.TYPE_BYTES: {"type": "string", "contentEncoding": "base64"},
    FieldDescriptor.TYPE_DOUBLE: {"type": "number"},
    FieldDescriptor.TYPE_FLOAT: {"type": "number"},
}
_INT32 = {
    FieldDescriptor.TYPE_INT32,
    FieldDescriptor.TYPE_SINT32,
    FieldDescriptor.TYPE_SFIXED32,
    FieldDescriptor.TYPE_UINT32,
    FieldDescriptor.TYPE_FIXED32,
}
# The JSON mapping writes 64-bit integers as decimal strings and reads both.
_INT64 = {"type": ["string", "integer"], "pattern": "^-?[0-9]+$", "format": "int64"}
_WELL_KNOWN: dict[str, dict[str, Any]] = {
    "google.protobuf.Struct": {"type": "object"},
    "google.protobuf.Value": {},
    "google.protobuf.ListValue": {"type": "array"},
    "google.protobuf.Timestamp": {"type": "string", "format": "date-time"},
    "google.protobuf.Any": {"type": "object", "properties": {"@type": {"type": "string"}}},
}


def _enum(enum: EnumDescriptor) -> dict[str, Any]:
    return {"type": "string", "enum": [value.name for value in enum.values]}


class _Schemas:
    """The component schemas of the messages reachable from the operations."""

    def __init__(self) -> None:
        self.components: dict[str, dict[str, Any]] = {}

    def ref(self, message: Descriptor) -> dict[str, Any]:
        if message.full_name in _WELL_KNOWN:
            return dict(_WELL_KNOWN[message.full_name])
        if message.full_name not in self.components:
            self.components[message.full_name] = {}  # placeholder: messages may recurse
            self.components[message.full_name] = self._message(message)
        return {"$ref": _SCHEMAS + message.full_name}

    def _message(self, message: Descriptor) -> dict[str, Any]:
        properties = {field.json_name: self._field(field) for field in message.fields}
        return {
            "type": "object",
            "description": f"{message.full_name} in the protobuf JSON mapping (the .proto's field names work too).",
            "properties": properties,
        }

    def _field(self, field: FieldDescriptor) -> dict[str, Any]:
        message = field.message_type
        if message is not None and message.GetOptions().map_entry:
            return {"type": "object", "additionalProperties": self._single(message.fields_by_name["value"])}
        if field.name == "blocks_json":  # also the array itself (see api.http)
            return {"type": ["string", "array"], "description": "A JSON array of blocks, or its text."}
        single = self._single(field)
        if field.is_repeated:
            return {"type": "array", "items": single}
        return single

    def _single(self, field: FieldDescriptor) -> dict[str, Any]:
        if field.message_type is not None:
            return self.ref(field.message_type)
        if field.enum_type is not None:
            return _enum(field.enum_type)
        if field.type in _INT32:
            return {"type": "integer", "format": "int32"}
        if field.type in _SCALARS:
            return dict(_SCALARS[field.type])
        return dict(_INT64)


_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["code", "status", "message"],
            "properties": {
                "code": {"type": "integer", "description": "The HTTP status."},
                "status": {"type": "string", "description": "The gRPC status code name."},
                "message": {"type": "string"},
                "details": {"type": "array", "items": {"type": "object"}},
                "reason": {"type": "string", "description": "ErrorInfo.reason, e.g. TOKEN_BUDGET_EXCEEDED."},
                "protected_tokens": {"type": "integer"},
                "budget": {"type": "integer"},
                "tools_tokens": {"type": "integer", "description": "Of the tool definitions sent."},
                "field_violations": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {"field": {"type": "string"}, "description": {"type": "string"}},
                    },
                },
            },
        }
    },
}
ERRORS = {
    "400": "Bad input: `field_violations` names each field.",
    "401": "No valid API key (`authorization: Bearer <key>`), when the server has keys.",
    "404": "No such chat or generation for the caller's tenant.",
    "409": "A stale or already finished generation, a generation id in use, or a model role no configuration holds.",
    "413": "The body is over the server's max_request_bytes.",
    "422": "TOKEN_BUDGET_EXCEEDED: the protected blocks take `protected_tokens`, over `budget` less `tools_tokens`.",
    "429": "The server is at its limit of calls in flight; retry later.",
    "500": "A bug in contextshift; the server logs it.",
    "503": "The store is unavailable, or the server is draining.",
    "507": "STORE_FULL: the store has no room for a new audit or appended blocks (`cause`: max_store_bytes, "
    "store_reserve_bytes or disk); delete chats, or free room, first.",
}


def _error_responses() -> dict[str, Any]:
    content = {"application/json": {"schema": {"$ref": _SCHEMAS + "Error"}}}
    return {code: {"description": text, "content": content} for code, text in ERRORS.items()}


def _operation(op: Operation, schemas: _Schemas) -> dict[str, Any]:
    method = _SERVICE.methods_by_name[op.rpc]
    operation: dict[str, Any] = {
        "operationId": op.rpc,
        "summary": op.summary,
        "security": [{}, {"bearer": []}],
        "responses": {
            "200": {
                "description": f"{method.output_type.full_name}",
                "content": {"application/json": {"schema": schemas.ref(method.output_type)}},
            },
            **_error_responses(),
        },
    }
    if op.path_field is not None:
        operation["parameters"] = [
            {
                "name": "id",
                "in": "path",
                "required": True,
                "description": f"The request's `{op.path_field}`.",
                "schema": {"type": "string"},
            }
        ]
    if op.body:
        operation["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": schemas.ref(method.input_type)}},
        }
    return operation


def _plain(summary: str, media_type: str, schema: dict[str, Any], *extra: tuple[str, str]) -> dict[str, Any]:
    responses: dict[str, Any] = {"200": {"description": summary, "content": {media_type: {"schema": schema}}}}
    for code, text in extra:
        responses[code] = {"description": text, "content": {media_type: {"schema": schema}}}
    return {"get": {"summary": summary, "responses": responses}}


_HEALTH = {"type": "object", "properties": {"status": {"type": "string"}, "message": {"type": "string"}}}
_TEXT = {"type": "string"}


def _other_paths() -> dict[str, Any]:
    """The routes that are not RPCs (open to every caller, keys or not)."""
    return {
        "/healthz": _plain("The process is up.", "application/json", _HEALTH),
        "/readyz": _plain(
            "The process takes calls.", "application/json", _HEALTH, ("503", "Draining before a stop.")
        ),
        "/metrics": _plain("Prometheus metrics of every worker process.", "text/plain", _TEXT),
        "/openapi.json": _plain("This document.", "application/json", {"type": "object"}),
        "/": _plain("The preview page.", "text/html", _TEXT),
        "/static/{path}": {
            "get": {
                "summary": "The preview page's script and style sheet.",
                "parameters": [
                    {"name": "path", "in": "path", "required": True, "schema": {"type": "string"}}
                ],
                "responses": {"200": {"description": "The file."}, "404": {"description": "No such file."}},
            }
        },
    }


def document(operations: Sequence[Operation]) -> dict[str, Any]:
    schemas = _Schemas()
    paths: dict[str, Any] = {}
    for op in operations:
        paths.setdefault(op.path, {})[op.http_method.lower()] = _operation(op, schemas)
    paths.update(_other_paths())
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "contextshift",
            "version": "v1",
            "description": "Fit an LLM prompt into a model's context window: the HTTP/JSON surface of "
            "contextshift.v1.ContextShiftService. Bodies are the RPCs' messages in the protobuf JSON mapping.",
        },
        "paths": paths,
        "components": {
            "schemas": {**schemas.components, "Error": _ERROR},
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }
