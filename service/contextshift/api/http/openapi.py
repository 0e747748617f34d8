"""The OpenAPI 3.1 document of the HTTP surface (served at /openapi.json). The schemas are made
from the .proto's message descriptors as the protobuf JSON mapping writes them, with the rules of
`contextshift.api.rules` (required fields, ids, the enum values a request may send, ranges, the
conditions joining fields), and the HTTP surface validates every request body against them
(`RequestValidator`) before anything else reads it: the document and the server cannot disagree.
docs/api.md has the field by field documentation."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import jsonschema
from google.protobuf.descriptor import Descriptor, EnumDescriptor, FieldDescriptor

from contextshift._proto.contextshift.v1 import context_service_pb2 as pb
from contextshift.api import rules
from contextshift.api.http.routes import Operation
from contextshift.errors import FieldViolation

_SERVICE = pb.DESCRIPTOR.services_by_name["ContextShiftService"]
_SCHEMAS = "#/components/schemas/"

_INT32 = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
}
_INT64 = {
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}
_WELL_KNOWN: dict[str, dict[str, Any]] = {
    "google.protobuf.Struct": {"type": "object"},
    "google.protobuf.Value": {},
    "google.protobuf.ListValue": {"type": "array"},
    "google.protobuf.Timestamp": {"type": "string", "format": "date-time"},
    "google.protobuf.Any": {"type": "object", "properties": {"@type": {"type": "string"}}},
}
# The field a condition's violation names (a schema extension, as OpenAPI allows `x-` keys).
FIELD_KEY = "x-contextshift-field"
# Fields that take the JSON array itself on HTTP as well as its text (see api.http.messages).
JSON_TEXT_FIELDS = {"blocks_json": "blocks", "tools_json": "tool definitions"}


def _up_to(high: int, zero: bool = True) -> str:
    """A regular expression of the decimal numbers from 0 (1 without `zero`) to `high`, without
    leading zeros."""
    digits = str(high)
    shorter = [f"[1-9][0-9]{{0,{len(digits) - 2}}}"] if len(digits) > 1 else []
    same = [digits]
    for i, digit in enumerate(digits):
        low = 1 if i == 0 else 0
        if int(digit) > low:
            rest = len(digits) - i - 1
            same.append(f"{digits[:i]}[{low}-{int(digit) - 1}]" + (f"[0-9]{{{rest}}}" if rest else ""))
    return "|".join(["0", *shorter, *same] if zero else [*shorter, *same])


def _digits(low: int, high: int) -> str:
    """A pattern of the decimal strings of the whole numbers from `low` to `high`, exactly."""
    positive = f"(?:{_up_to(high)})"
    if low < 0:
        return f"^(?:{positive}|-(?:{_up_to(-low, zero=False)}))$"
    if low == 1:
        return f"^(?!0$){positive}$"
    return f"^{positive}$"


def _enum(enum: EnumDescriptor, values: Sequence[str]) -> dict[str, Any]:
    return {"type": "string", "enum": list(values) or [value.name for value in enum.values]}


def _default(field: FieldDescriptor) -> list[Any]:
    """The JSON values that leave a field at its default (unset)."""
    if field.is_repeated:
        return [[], None]
    if field.message_type is not None or field.has_presence:
        return [None]
    if field.enum_type is not None:
        return [field.enum_type.values[0].name, None]
    if field.type == FieldDescriptor.TYPE_BOOL:
        return [False, None]
    if field.type == FieldDescriptor.TYPE_STRING:
        return ["", None]
    if field.type in _INT32 or field.type in _INT64:
        return [0, "0", None]
    return [0, None]


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

    def body(self, op: Operation) -> dict[str, Any]:
        """The schema of an operation's body: its request message, less the field its path sets."""
        message = _SERVICE.methods_by_name[op.rpc].input_type
        ref = self.ref(message)
        if op.path_field is None:
            return ref
        name = f"{message.full_name}.Body"
        field = message.fields_by_name[op.path_field].json_name
        schema = {**self.components[message.full_name]}
        schema["properties"] = {k: v for k, v in schema["properties"].items() if k != field}
        if "required" in schema:
            schema["required"] = [r for r in schema["required"] if r != field]
            if not schema["required"]:
                del schema["required"]
        schema["description"] = (
            f"{message.full_name} in the protobuf JSON mapping, without `{field}` (the path's)."
        )
        self.components[name] = schema
        return {"$ref": _SCHEMAS + name}

    def _message(self, message: Descriptor) -> dict[str, Any]:
        own = rules.RULES.get(message.full_name, {})
        properties = {field.json_name: self._field(field, own.get(field.name)) for field in message.fields}
        schema: dict[str, Any] = {
            "type": "object",
            "description": f"{message.full_name} in the protobuf JSON mapping.",
            "properties": properties,
            "additionalProperties": False,
        }
        required = [message.fields_by_name[name].json_name for name, rule in own.items() if rule.required]
        if required:
            schema["required"] = required
        joined = [_condition(c, message) for c in rules.CONDITIONS.get(message.full_name, ())]
        joined += [_at_most_one(o.fields) for o in message.oneofs if len(o.fields) > 1]
        if message.full_name in rules.ONEOF_REQUIRED:
            oneof, why = rules.ONEOF_REQUIRED[message.full_name]
            members = message.oneofs_by_name[oneof].fields
            joined.append({"anyOf": [{"required": [f.json_name]} for f in members], "description": why})
        if joined:
            schema["allOf"] = joined
        return schema

    def _field(self, field: FieldDescriptor, rule: rules.Rule | None) -> dict[str, Any]:
        message = field.message_type
        if message is not None and message.GetOptions().map_entry:
            return {
                "type": ["object", "null"],
                "additionalProperties": self.single(message.fields_by_name["value"]),
            }
        if field.name in JSON_TEXT_FIELDS:  # also the array itself (see api.http.messages)
            what = JSON_TEXT_FIELDS[field.name]
            return {
                "type": ["string", "array", "null"],
                "items": {"type": "object"},
                "description": f"The {what}: a JSON array, or its text.",
            }
        single = self.single(field, rule)
        if field.is_repeated:
            return {"type": ["array", "null"], "items": single}
        if (rule is not None and rule.required) or (
            field.containing_oneof is not None and not field.has_presence
        ):
            return single
        return {"anyOf": [single, {"type": "null"}]} if "$ref" in single else _nullable(single)

    def single(self, field: FieldDescriptor, rule: rules.Rule | None = None) -> dict[str, Any]:
        """The schema of one value of a field (an element of a repeated one)."""
        rule = rule or rules.Rule()
        if field.message_type is not None:
            return self.ref(field.message_type)
        if field.enum_type is not None:
            return _enum(field.enum_type, rule.values)
        if field.type == FieldDescriptor.TYPE_STRING:
            if not rule.id:
                text: dict[str, Any] = {"type": "string"}
                if rule.pattern:
                    text["pattern"] = rule.pattern
                if rule.format:
                    text["format"] = rule.format
                return text
            low = 1 if rule.required else 0
            return {
                "type": "string",
                "minLength": low,
                "maxLength": rules.MAX_ID_CHARS,
                "pattern": rules.ID_PATTERN.replace("]+$", "]*$"),
            }
        if field.type == FieldDescriptor.TYPE_BOOL:
            return {"type": "boolean"}
        if field.type == FieldDescriptor.TYPE_BYTES:
            return {"type": "string", "contentEncoding": "base64"}
        if field.type in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
            return {"type": "number"}
        low, high = _INT32[field.type] if field.type in _INT32 else _INT64[field.type]
        if rule.minimum is not None:
            low = rule.minimum
        if rule.maximum is not None:
            high = rule.maximum
        if field.type in _INT32:
            return {"type": "integer", "minimum": low, "maximum": high}
        # The JSON mapping writes 64-bit integers as decimal strings and reads both forms.
        return {
            "anyOf": [
                {"type": "integer", "minimum": low, "maximum": high},
                {"type": "string", "pattern": _digits(low, high)},
            ],
            "format": "int64",
        }


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    """The JSON mapping reads null as "not set" for every field."""
    if not schema:  # any JSON value (google.protobuf.Value), null included
        return schema
    if "anyOf" in schema:
        return {**schema, "anyOf": [*schema["anyOf"], {"type": "null"}]}
    nullable = {**schema, "type": [schema["type"], "null"]}
    if "enum" in nullable:
        nullable["enum"] = [*nullable["enum"], None]
    return nullable


def _is_set(field: FieldDescriptor) -> dict[str, Any]:
    """A field holding other than its default."""
    name = field.json_name
    return {"required": [name], "properties": {name: {"not": {"enum": _default(field)}}}}


def _condition(condition: rules.Condition, message: Descriptor) -> dict[str, Any]:
    a = message.fields_by_name[condition.a]
    b = message.fields_by_name[condition.b]
    schema: dict[str, Any]
    if condition.kind == "not_both":
        schema = {"not": {"allOf": [_is_set(a), _is_set(b)]}}
    elif condition.kind == "either":
        schema = {"anyOf": [_is_set(a), _is_set(b)]}
    elif condition.kind == "needs":
        schema = {"if": _is_set(a), "then": _is_set(b)}
    else:  # only_with
        schema = {
            "if": _is_set(a),
            "then": {"required": [b.json_name], "properties": {b.json_name: {"const": condition.value}}},
        }
    return {**schema, "description": condition.why, FIELD_KEY: condition.at or condition.a}


def _at_most_one(fields: Sequence[FieldDescriptor]) -> dict[str, Any]:
    """A oneof: at most one member set."""
    pairs = [(a, b) for i, a in enumerate(fields) for b in fields[i + 1 :]]
    names = ", ".join(f.json_name for f in fields)
    return {
        "not": {"anyOf": [{"required": [a.json_name, b.json_name]} for a, b in pairs]},
        "description": f"set at most one of {names}",
    }


_ID_PARAMETER = {
    "type": "string",
    "minLength": 1,
    "maxLength": rules.MAX_ID_CHARS,
    # No control characters, and no "/" (a path segment).
    "pattern": rules.ID_PATTERN.replace("]+$", "/]+$"),
}


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
    parameters: list[dict[str, Any]] = []
    if op.path_field is not None:
        parameters.append(
            {
                "name": "id",
                "in": "path",
                "required": True,
                "description": f"The request's `{op.path_field}`.",
                "schema": dict(_ID_PARAMETER),
            }
        )
    own = rules.RULES.get(method.input_type.full_name, {})
    for name in op.query:  # named as the JSON mapping names them (the .proto's name is read too)
        field = method.input_type.fields_by_name[name]
        parameters.append(
            {
                "name": field.json_name,
                "in": "query",
                "required": False,
                "description": f"The request's `{name}`.",
                "schema": schemas.single(field, own.get(name)),
            }
        )
    if parameters:
        operation["parameters"] = parameters
    if op.body:
        operation["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": schemas.body(op)}},
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


class RequestValidator:
    """Request bodies checked against the document's schema of their message: what the document
    says is what the server refuses, with each problem named by its field (`config.model`)."""

    def __init__(self, operations: Sequence[Operation]) -> None:
        doc = document(operations)
        self._validators: dict[str, jsonschema.Draft202012Validator] = {}
        for op in operations:
            if op.body:
                schema = doc["paths"][op.path][op.http_method.lower()]["requestBody"]["content"]
                root = {**schema["application/json"]["schema"], "components": doc["components"]}
                self._validators[op.rpc] = jsonschema.Draft202012Validator(root)

    def violations(self, rpc: str, body: Any) -> list[FieldViolation]:
        """What is wrong with the body of a call of `rpc`, by the document's schema."""
        found: list[FieldViolation] = []
        errors = self._validators[rpc].iter_errors(body)
        for error in sorted(errors, key=lambda e: [str(part) for part in e.absolute_path]):
            path = list(error.absolute_path)
            description = error.message
            if error.validator == "required":
                missing = [name for name in error.validator_value if name not in error.instance]
                path, description = [*path, *missing[:1]], "required"
            elif error.validator == "additionalProperties":
                extra = sorted(set(error.instance) - set(error.schema.get("properties", {})))
                path, description = [*path, *extra[:1]], "unknown field"
            elif error.validator in {"allOf", "not", "anyOf", "if"} and "description" in error.schema:
                description = str(error.schema["description"])
                path = [*path, *([error.schema[FIELD_KEY]] if FIELD_KEY in error.schema else [])]
            elif error.validator == "anyOf" and error.schema.get("format") == "int64":
                number = error.schema["anyOf"][0]
                description = (
                    f"must be a whole number from {number['minimum']} to {number['maximum']} (a JSON "
                    f"number, or its decimal text), got {error.instance!r}"
                )
            found.append(FieldViolation(_field_path(path), description))
        return found


def _field_path(path: Sequence[str | int]) -> str:
    """A JSON path as the API names fields: `config.model`, `blocks[3].role` (.proto names)."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", part).lower()
    return out or "body"
