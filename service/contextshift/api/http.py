"""The HTTP/JSON surface: the servicer's own methods behind Starlette routes, served by uvicorn in
the gRPC server's event loop (see `server`), so both surfaces run the same engine, store, limits,
keys and metrics.

A request body is the RPC's request message in the protobuf JSON mapping (lowerCamelCase or the
.proto's snake_case names, int64 as a number or a string), and `blocksJson` and `toolsJson` may
also be the JSON array itself rather than its text. Every body is checked against the OpenAPI
document's schema of its message before it is read, so the document says what is refused. The answer is the RPC's response message in the same mapping.
Errors are `{"error": {...}}` in the shape of google.rpc.Status over HTTP (AIP-193: `code` the HTTP
status, `status` the gRPC code name, `message`, `details`), plus `reason`, `protected_tokens`,
`budget` and `tools_tokens` of an ErrorInfo and the `field_violations` of a BadRequest, flattened.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, cast

import grpc
from google.protobuf import json_format, message_factory
from google.protobuf.message import Message
from google.rpc import error_details_pb2, status_pb2
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from contextshift._proto.contextshift.v1 import context_service_pb2 as pb
from contextshift.api import metrics, openapi
from contextshift.api.auth import ApiKeys, authenticate
from contextshift.api.errors import STORE_FULL, RequestError, invalid
from contextshift.api.interceptors import begin_call_stats, end_call, error_status
from contextshift.api.openapi import JSON_TEXT_FIELDS, RequestValidator
from contextshift.api.servicer import ENCODED_METHODS, Context, ContextShiftServicer
from contextshift.errors import InvalidInput

SERVICE = pb.DESCRIPTOR.services_by_name["ContextShiftService"]
# The preview page: plain files in the package, no build step; it loads nothing from elsewhere.
STATIC = Path(__file__).with_name("static")
PAGE_POLICY = (
    "default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; frame-ancestors 'none'"
)
STATUS_DETAILS_KEY = "grpc-status-details-bin"


@dataclass(frozen=True)
class Operation:
    """A route onto one RPC of ContextShiftService."""

    http_method: str
    path: str
    rpc: str
    summary: str
    # The request field the path's `{id}` sets, if any.
    path_field: str | None = None
    # Whether the request message comes in the body (else it is empty but for `path_field`).
    body: bool = True


OPERATIONS = [
    Operation(
        "POST",
        "/api/v2/context-preview",
        "PreviewContext",
        "Runs every stage of a shift and writes nothing (PreviewContext).",
    ),
    Operation(
        "POST",
        "/api/v2/context-shift",
        "ShiftContext",
        "Fits the blocks into the budget; returns the plan and the final provider messages (ShiftContext).",
    ),
    Operation(
        "GET",
        "/api/v2/chats/{id}/context-audit",
        "GetContextAudit",
        "The last audit of a chat of the caller's tenant (GetContextAudit).",
        path_field="chat_id",
        body=False,
    ),
    Operation(
        "DELETE",
        "/api/v2/chats/{id}",
        "DeleteChat",
        "Deletes a chat of the caller's tenant and its audit (DeleteChat).",
        path_field="chat_id",
        body=False,
    ),
    Operation(
        "POST",
        "/api/v2/generations/{id}/finish",
        "FinishGeneration",
        "Reports how a generation ended and the provider's prompt tokens (FinishGeneration).",
        path_field="generation_id",
    ),
    Operation(
        "POST", "/api/v2/count-tokens", "CountTokens", "Counts tokens of texts or blocks (CountTokens)."
    ),
    Operation(
        "GET",
        "/api/v2/tokenizer-profiles",
        "ListTokenizerProfiles",
        "Every tokenizer profile of this server (ListTokenizerProfiles).",
        body=False,
    ),
    Operation(
        "POST",
        "/api/v2/chats/{id}/blocks",
        "AppendBlocks",
        "Stores blocks at the end of a chat's history, for use_stored_history (AppendBlocks).",
        path_field="chat_id",
    ),
    Operation(
        "GET",
        "/api/v2/model-configs",
        "ListModelConfigs",
        "Every stored model configuration of the caller's tenant (ListModelConfigs).",
        body=False,
    ),
    Operation(
        "GET",
        "/api/v2/model-configs/{id}",
        "GetModelConfig",
        "The stored configuration of a model (GetModelConfig).",
        path_field="model",
        body=False,
    ),
    Operation(
        "PUT",
        "/api/v2/model-configs",
        "SetModelConfig",
        "Creates or replaces the stored configuration of a model (SetModelConfig).",
    ),
    Operation(
        "DELETE",
        "/api/v2/model-configs/{id}",
        "DeleteModelConfig",
        "Deletes the stored configuration of a model (DeleteModelConfig).",
        path_field="model",
        body=False,
    ),
    Operation(
        "GET",
        "/api/v2/strategies",
        "ListStrategies",
        "Every strategy of this server with its options, and the common options (ListStrategies).",
        body=False,
    ),
    Operation(
        "POST",
        "/api/v2/profile-benchmarks",
        "BenchmarkProfiles",
        "Measures tokenizer profiles on the caller's documents: throughput and approximation error "
        "(BenchmarkProfiles; at most 1 MiB, about 10 seconds).",
    ),
]

# google.rpc.Code over HTTP (google/rpc/code.proto), but for FAILED_PRECONDITION: TOKEN_BUDGET_EXCEEDED
# is a well-formed request whose protected blocks cannot fit (422); the others (a stale or already
# finished generation, a role no model holds) conflict with the stored state (409, see `http_status_of`).
HTTP_STATUS = {
    grpc.StatusCode.OK: 200,
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.UNKNOWN: 500,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.FAILED_PRECONDITION: 422,  # see http_status_of
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.INTERNAL: 500,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DATA_LOSS: 500,
}


class BodyTooLarge(RequestError):
    """A body over max_request_bytes: RESOURCE_EXHAUSTED, as gRPC says it, answered with 413."""

    def __init__(self, limit: int) -> None:
        super().__init__(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"the request body is over the server's limit of {limit} bytes",
        )


class _Aborted(Exception):
    def __init__(self, status: grpc.Status) -> None:
        super().__init__(status.details)
        self.status = status


class HttpContext:
    """What the servicer's methods use of a gRPC call's context, for a call over HTTP."""

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()) -> NoReturn:
        raise RequestError(code, details)

    async def abort_with_status(self, status: grpc.Status) -> NoReturn:
        raise _Aborted(status)

    def time_remaining(self) -> float | None:
        return None  # HTTP calls carry no deadline


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
        raise InvalidInput(violations)
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


def message_json(message: Message) -> dict[str, Any]:
    return json_format.MessageToDict(message, always_print_fields_with_no_presence=True)


def http_status_of(status: grpc.Status, body: dict[str, Any]) -> int:
    """The HTTP status of an error `status` whose JSON body (`error_json`) is `body`."""
    if (
        status.code == grpc.StatusCode.FAILED_PRECONDITION
        and body["error"].get("reason") != "TOKEN_BUDGET_EXCEEDED"
    ):
        return 409
    if status.code == grpc.StatusCode.RESOURCE_EXHAUSTED and body["error"].get("reason") == STORE_FULL:
        return 507  # Insufficient Storage: not a rate limit to back off from
    return HTTP_STATUS[status.code]


def error_json(status: grpc.Status, http_status: int) -> dict[str, Any]:
    """The body of an error answer (see the module's doc)."""
    error: dict[str, Any] = {"code": http_status, "status": status.code.name, "message": status.details}
    encoded = dict(status.trailing_metadata or ()).get(STATUS_DETAILS_KEY)
    if not isinstance(encoded, bytes):
        error["details"] = []
        return {"error": error}
    rich = status_pb2.Status.FromString(encoded)
    error["details"] = json_format.MessageToDict(rich).get("details", [])
    for detail in rich.details:
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


def _dispatch(
    handlers: dict[str, Callable[[Request], Awaitable[Response]]],
) -> Callable[[Request], Awaitable[Response]]:
    """The endpoint of a path served with several methods (HEAD as GET)."""

    async def endpoint(request: Request) -> Response:
        return await handlers["GET" if request.method == "HEAD" else request.method](request)

    return endpoint


# Routing errors (no such path, a method the path does not take) as google.rpc.Status JSON, like
# every other error of this surface.
_ROUTING_CODES = {404: grpc.StatusCode.NOT_FOUND, 405: grpc.StatusCode.UNIMPLEMENTED}


async def _routing_error(request: Request, error: Exception) -> Response:
    assert isinstance(error, HTTPException)
    headers = dict(error.headers or {})
    if error.status_code == 404:
        message = f"no route {request.url.path} (the routes: /openapi.json)"
    elif error.status_code == 405:
        message = f"{request.method} is not allowed on {request.url.path}: allowed {headers.get('Allow', '')}"
    else:
        message = str(error.detail)
    code = _ROUTING_CODES.get(error.status_code, grpc.StatusCode.UNKNOWN)
    body = {"error": {"code": error.status_code, "status": code.name, "message": message, "details": []}}
    return JSONResponse(body, status_code=error.status_code, headers=headers)


class HttpApi:
    """The routes of one worker process."""

    def __init__(
        self,
        servicer: ContextShiftServicer,
        *,
        keys: ApiKeys | None,
        max_request_bytes: int,
        max_concurrent_calls: int,
    ) -> None:
        self._servicer = servicer
        self._keys = keys
        self._max_request_bytes = max_request_bytes
        self._max_concurrent_calls = max_concurrent_calls
        self._in_flight = 0
        self._validator = RequestValidator(OPERATIONS)
        self.ready = True  # False from the start of a drain: /readyz answers 503

    def app(self) -> Starlette:
        # One route per path with all its methods: a 405 then lists every method the path takes.
        by_path: dict[str, dict[str, Callable[[Request], Awaitable[Response]]]] = {}
        for op in OPERATIONS:
            by_path.setdefault(op.path, {})[op.http_method] = self._handler(op)
        routes: list[BaseRoute] = [
            Route(path, _dispatch(handlers), methods=list(handlers)) for path, handlers in by_path.items()
        ]
        routes += [
            Route("/healthz", self._healthz, methods=["GET"]),
            Route("/readyz", self._readyz, methods=["GET"]),
            Route("/metrics", self._metrics, methods=["GET"]),
            Route("/openapi.json", self._openapi, methods=["GET"]),
            Route("/", self._page, methods=["GET"]),
            Mount("/static", StaticFiles(directory=STATIC), name="static"),
        ]
        return Starlette(routes=routes, exception_handlers={HTTPException: _routing_error})

    async def _body(self, request: Request) -> bytes:
        limit = self._max_request_bytes
        length = request.headers.get("content-length", "")
        if length.isdigit() and int(length) > limit:
            raise BodyTooLarge(limit)
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise BodyTooLarge(limit)
            chunks.append(chunk)
        return b"".join(chunks)

    def _handler(self, op: Operation) -> Callable[[Request], Awaitable[Response]]:
        method = SERVICE.methods_by_name[op.rpc]
        request_type = message_factory.GetMessageClass(method.input_type)
        response_type = message_factory.GetMessageClass(method.output_type)
        behavior = getattr(self._servicer, op.rpc)
        encoded = op.rpc in ENCODED_METHODS
        label = f"{op.http_method} {op.path}"  # the route, never the ids in the path

        async def call(request: Request) -> Response:
            message = request_type()
            if op.body:
                read_message(await self._body(request), message, self._validator, op.rpc)
            if op.path_field is not None:
                setattr(message, op.path_field, request.path_params["id"])
            context = cast(Context, HttpContext())
            if encoded:
                reply = response_type.FromString(await behavior(message.SerializeToString(), context))
            else:
                reply = await behavior(message, context)
            return JSONResponse(message_json(reply))

        async def handle(request: Request) -> Response:
            stats = begin_call_stats()
            start = time.perf_counter()
            http_status = 499  # until answered: the call was cancelled
            counted = False
            try:
                if self._in_flight >= self._max_concurrent_calls:
                    raise RequestError(
                        grpc.StatusCode.RESOURCE_EXHAUSTED,
                        f"the server is at its limit of {self._max_concurrent_calls} calls in flight; retry later",
                    )
                self._in_flight += 1
                counted = True
                authenticate(self._keys, request.headers.get("authorization"))
                response = await call(request)
                http_status = response.status_code
                return response
            except Exception as error:
                status = error.status if isinstance(error, _Aborted) else error_status(error, label)
                body = error_json(status, HTTP_STATUS[status.code])
                http_status = 413 if isinstance(error, BodyTooLarge) else http_status_of(status, body)
                body["error"]["code"] = http_status
                headers = {"www-authenticate": "Bearer"} if http_status == 401 else None
                return JSONResponse(body, status_code=http_status, headers=headers)
            finally:
                if counted:
                    self._in_flight -= 1
                end_call("http", label, str(http_status), start, stats)

        return handle

    async def _healthz(self, request: Request) -> Response:
        return JSONResponse({"status": "SERVING"})

    async def _readyz(self, request: Request) -> Response:
        if self.ready:
            return JSONResponse({"status": "SERVING"})
        return JSONResponse({"status": "NOT_SERVING", "message": "draining: shutting down"}, status_code=503)

    async def _metrics(self, request: Request) -> Response:
        return Response(await asyncio.to_thread(metrics.render), media_type=metrics.CONTENT_TYPE)

    async def _openapi(self, request: Request) -> Response:
        return JSONResponse(openapi.document(OPERATIONS))

    async def _page(self, request: Request) -> Response:
        return FileResponse(STATIC / "index.html", headers={"content-security-policy": PAGE_POLICY})
