"""The HTTP/JSON surface: the service's methods behind Starlette routes (`routes.OPERATIONS`), served
by uvicorn in the gRPC server's event loop (`serving`), so both surfaces run the same service,
store, keys and metrics. Each call goes through the service's call gate (`calls.Gate`: the calls in
flight, the key, errors, the log line and metrics); what is HTTP's own is here and in `messages`:
the body read within max_request_bytes (413 past it) and checked against the OpenAPI document, the
reply as JSON, the error status as google.rpc.Status JSON with its HTTP status.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

from google.protobuf import message_factory
from google.rpc import code_pb2, error_details_pb2, status_pb2
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from contextshift._proto.contextshift.v1 import context_service_pb2 as pb
from contextshift.api import metrics
from contextshift.api.http import openapi
from contextshift.api.http.messages import error_json, http_status, message_json, read_message, read_query
from contextshift.api.http.openapi import RequestValidator
from contextshift.api.http.routes import OPERATIONS, Operation
from contextshift.api.service import chat_header
from contextshift.api.service.gate import CallFailed, Gate
from contextshift.api.service.rpc_status import RequestError
from contextshift.api.service.servicer import ENCODED_METHODS, ContextShiftService

SERVICE = pb.DESCRIPTOR.services_by_name["ContextShiftService"]
# The preview page: plain files in the package, no build step; it loads nothing from elsewhere.
STATIC = Path(__file__).with_name("static")
PAGE_POLICY = (
    "default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; frame-ancestors 'none'"
)


class BodyTooLarge(RequestError):
    """A body over max_request_bytes: RESOURCE_EXHAUSTED, as gRPC says it, answered with 413."""

    def __init__(self, limit: int) -> None:
        super().__init__(
            code_pb2.RESOURCE_EXHAUSTED, f"the request body is over the server's limit of {limit} bytes"
        )


class _HttpCall:
    """One HTTP call as the gate sees it (`calls.Surface`): its status is the HTTP status."""

    name = "http"

    def label(self, status: status_pb2.Status | None, error: BaseException | None) -> str:
        if isinstance(error, asyncio.CancelledError):
            return "499"  # the client went away before the answer
        return "200" if status is None else str(_http_status(status, error))

    def answered(self, error: Exception) -> bool:
        return False


def _http_status(status: status_pb2.Status, cause: BaseException | None) -> int:
    return 413 if isinstance(cause, BodyTooLarge) else http_status(status)


def _error_response(failed: CallFailed) -> Response:
    code = _http_status(failed.status, failed.cause)
    headers = {"www-authenticate": "Bearer"} if code == 401 else {}
    delay = _retry_delay(failed.status)
    if delay is not None:  # whole seconds, at least one (RFC 9110)
        headers["retry-after"] = str(max(1, math.ceil(delay)))
    return JSONResponse(error_json(failed.status, code), status_code=code, headers=headers)


def _retry_delay(status: status_pb2.Status) -> float | None:
    """The seconds the status's RetryInfo asks a client to wait before retrying, if it has one."""
    for detail in status.details:
        if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            info = error_details_pb2.RetryInfo()
            detail.Unpack(info)
            return float(info.retry_delay.ToTimedelta().total_seconds())
    return None


def _dispatch(
    handlers: dict[str, Callable[[Request], Awaitable[Response]]],
) -> Callable[[Request], Awaitable[Response]]:
    """The endpoint of a path served with several methods (HEAD as GET)."""

    async def endpoint(request: Request) -> Response:
        return await handlers["GET" if request.method == "HEAD" else request.method](request)

    return endpoint


# Routing errors (no such path, a method the path does not take) as google.rpc.Status JSON, like
# every other error of this surface.
_ROUTING_CODES = {404: "NOT_FOUND", 405: "UNIMPLEMENTED"}


async def _routing_error(request: Request, error: Exception) -> Response:
    assert isinstance(error, HTTPException)
    headers = dict(error.headers or {})
    if error.status_code == 404:
        message = f"no route {request.url.path} (the routes: /openapi.json)"
    elif error.status_code == 405:
        message = f"{request.method} is not allowed on {request.url.path}: allowed {headers.get('Allow', '')}"
    else:
        message = str(error.detail)
    code = _ROUTING_CODES.get(error.status_code, "UNKNOWN")
    body = {"error": {"code": error.status_code, "status": code, "message": message, "details": []}}
    return JSONResponse(body, status_code=error.status_code, headers=headers)


class HttpApi:
    """The routes of one worker process."""

    def __init__(
        self,
        service: ContextShiftService,
        gate: Gate,
        *,
        max_request_bytes: int,
        routes: Sequence[BaseRoute] = (),
    ) -> None:
        self._service = service
        self._routes = routes  # more routes: the gateway's (`api.gateway.routes`)
        self._gate = gate
        self._max_request_bytes = max_request_bytes
        self._validator = RequestValidator(OPERATIONS)
        self.ready = True  # False from the start of a drain: /readyz answers 503
        # Why the store is not ready (`api.readiness`; /readyz answers 503), None while it is.
        self.store_problem: str | None = None

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
            *self._routes,
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
        behavior = getattr(self._service, op.rpc)
        encoded = op.rpc in ENCODED_METHODS
        label = f"{op.http_method} {op.path}"  # the route, never the ids in the path

        async def call(request: Request) -> Response:
            message = request_type()
            if op.body:
                read_message(await self._body(request), message, self._validator, op.rpc)
            if op.path_field is not None:
                setattr(message, op.path_field, request.path_params["id"])
            if op.query:
                read_query(request.query_params.multi_items(), message, op.query)
            if encoded:
                reply = response_type.FromString(await behavior(message.SerializeToString()))
            else:
                reply = await behavior(message)
            return JSONResponse(message_json(reply))

        async def handle(request: Request) -> Response:
            authorization = request.headers.get("authorization")
            chat = request.headers.get(chat_header.HEADER)
            try:
                return await self._gate.serve(
                    _HttpCall(), label, authorization, lambda: call(request), chat=chat
                )
            except CallFailed as failed:
                return _error_response(failed)

        return handle

    async def _healthz(self, request: Request) -> Response:
        return JSONResponse({"status": "SERVING"})

    async def _readyz(self, request: Request) -> Response:
        if not self.ready:
            return JSONResponse(
                {"status": "NOT_SERVING", "message": "draining: shutting down"}, status_code=503
            )
        if self.store_problem is not None:
            message = f"the store does not answer: {self.store_problem}"
            return JSONResponse({"status": "NOT_SERVING", "message": message}, status_code=503)
        return JSONResponse({"status": "SERVING"})

    async def _metrics(self, request: Request) -> Response:
        return Response(await asyncio.to_thread(metrics.render), media_type=metrics.CONTENT_TYPE)

    async def _openapi(self, request: Request) -> Response:
        return JSONResponse(openapi.document(OPERATIONS))

    async def _page(self, request: Request) -> Response:
        return FileResponse(STATIC / "index.html", headers={"content-security-policy": PAGE_POLICY})
