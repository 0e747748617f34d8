"""The gateway's routes (`Gateway.routes`, mounted by the HTTP surface) and the life of one call.

A fitted call (`/v1/chat/completions`, `/v1/responses`, `/v1/messages`) goes through the call gate
(contextshift's own API key, from `x-contextshift-api-key`; the calls in flight; the log line and
the metrics), then:
1. its body is read within max_request_bytes, once (`formats.read`), and its upstream chosen by
   its format and model (`upstreams.choose`); it takes an upstream slot (none free: 429);
2. ShiftContext fits its messages (the caller's own bytes in, the kept blocks' bytes out) and, with
   a chat, writes the chat's audit (PENDING) before anything goes upstream; when the shift fails,
   nothing goes;
3. the body with its message list replaced (`formats.upstream_body`) goes upstream; a caller that
   hangs up while the upstream has not answered cancels the call;
4. the answer is relayed as it comes (`_Relay`), its usage read as it passes, and once it ends the
   generation is closed (FinishGeneration): COMPLETED with the provider's prompt tokens, FAILED
   with what the provider said (normalized, never its body), CANCELLED when the caller went away,
   the upstream connection closed at once. A generation the shift did not store (no chat and an
   exact profile) has nothing to close.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from urllib.parse import quote, unquote

import anyio
import httpx
from google.protobuf import struct_pb2
from google.rpc import code_pb2, status_pb2
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import Receive, Scope, Send

from contextshift import engine
from contextshift._proto.contextshift.v1 import context_service_pb2 as pb
from contextshift.api import metrics
from contextshift.api.config import ServerConfig
from contextshift.api.gateway import formats, relay, upstreams
from contextshift.api.gateway.formats import Body, BodyError, Endpoint
from contextshift.api.gateway.upstreams import Format, Upstream
from contextshift.api.http.messages import http_status
from contextshift.api.service import audit_payload
from contextshift.api.service.gate import CallFailed, Gate, failure_status
from contextshift.api.service.rpc_status import STORE_RETRY_SECONDS, RequestError
from contextshift.api.service.servicer import ContextShiftService
from contextshift.errors import InvalidInput, TokenBudgetExceeded

log = logging.getLogger("contextshift.api")

CHAT_HEADER = "x-chat-id"
STRATEGY_HEADER = "x-contextshift-strategy"
KEY_HEADER = "x-contextshift-api-key"
# count_tokens counts a prompt whole: a window no prompt reaches, no answer reserved.
_COUNT_WINDOW = 1 << 40
_PLAN = pb.ShiftContextResponse.PLAN_FIELD_NUMBER
_MESSAGES = pb.ContextPlan.MESSAGES_FIELD_NUMBER
_MESSAGES_JSON = pb.ProviderMessages.MESSAGES_JSON_FIELD_NUMBER
_BLOCKS_JSON = pb.ShiftContextRequest.BLOCKS_JSON_FIELD_NUMBER
_TOOLS_JSON = pb.ShiftContextRequest.TOOLS_JSON_FIELD_NUMBER
_PREVIEW_PLAN = pb.PreviewContextResponse.PLAN_FIELD_NUMBER
_NO_UPSTREAM = "none"
_SEGMENT_SAFE = ":@!$&'()*+,;=-._~"  # what a path segment carries as it is (RFC 3986 pchar)  # the upstream label of a call refused before one was chosen

Headers = list[tuple[bytes, bytes]]


class _Refused(Exception):
    """A call the gateway answers itself, in the provider's shape."""

    def __init__(
        self, status: int, message: str, *, code: str | None = None, param: str | None = None, retry: int = 0
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.param = param
        self.retry = retry


class _GatewayCall:
    """A gateway call as the gate sees it (`gate.Surface`): labelled by the HTTP status it
    answered with (`status`, set by the call once known)."""

    name = "http"

    def __init__(self) -> None:
        self.status = 200

    def label(self, status: status_pb2.Status | None, error: BaseException | None) -> str:
        if isinstance(error, asyncio.CancelledError):
            return "499"
        return str(self.status if status is None else http_status(status))

    def answered(self, error: Exception) -> bool:
        return False


def _error(kind: Format, refused: _Refused, headers: Headers | None = None) -> Response:
    response = Response(
        formats.error_body(kind, refused.status, str(refused), code=refused.code, param=refused.param),
        status_code=refused.status,
        media_type="application/json",
    )
    if refused.retry:
        response.headers["retry-after"] = str(refused.retry)
    response.raw_headers += headers or []
    return response


def _refusal(status: status_pb2.Status, cause: BaseException | None, body: Body | None) -> _Refused:
    """A call the service or the gate answered with an error status, as the provider would say it."""
    if isinstance(cause, TokenBudgetExceeded):
        tools = f" and its tool definitions {cause.tools_tokens}" if cause.tools_tokens else ""
        return _Refused(
            400,
            f"contextshift: the prompt's protected blocks (its system prompt, the current input, pinned "
            f"blocks) alone take {cause.protected_tokens} tokens{tools}, over the budget of {cause.budget} "
            "tokens (the model's context window less the answer's reserve); nothing was sent to the provider",
            code="context_length_exceeded",
            param=body.endpoint.messages if body else None,
        )
    if isinstance(cause, InvalidInput) and body is not None:
        fields = [(formats.renamed_field(v.field, body), v.description) for v in cause.violations]
        message = "; ".join(f"{name}: {description}" for name, description in fields)
        return _Refused(400, message, code="invalid_request_error", param=fields[0][0] if fields else None)
    code = http_status(status)
    if code == 401:
        return _Refused(
            401,
            f"contextshift needs one of its own API keys on gateway routes, in the {KEY_HEADER} header "
            "(the authorization header goes to the provider)",
            code="invalid_api_key",
        )
    retry = STORE_RETRY_SECONDS if code == 503 else 1 if code == 429 else 0
    return _Refused(code, f"contextshift: {status.message}", code="contextshift_error", retry=retry)


async def _read_body(request: Request, limit: int) -> bytes:
    too_large = _Refused(
        413, f"the request body is over this server's limit of {limit} bytes (max_request_bytes)"
    )
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        raise too_large
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)


async def _read_raw(response: relay.Answer) -> bytes:
    """An upstream answer's bytes as they came (undecoded), whole: an error or a model list."""
    try:
        return b"".join([chunk async for chunk in response.aiter_raw()])
    finally:
        await response.aclose()


def _whole_answer(status: int, content: bytes, headers: Headers) -> Response:
    response = Response(content, status_code=status)
    kept = [(k, v) for k, v in headers if k != b"content-length"]
    response.raw_headers = [*kept, (b"content-length", str(len(content)).encode())]
    return response


def _header_value(value: object) -> bytes:
    """A header value of ours: ASCII on one line (a model name comes from the caller)."""
    return " ".join(str(value).split()).encode("ascii", "backslashreplace")


def _plan_headers(generation_id: str, plan: pb.ContextPlan) -> Headers:
    """What the shift did, for the caller: x-contextshift-*."""
    headers = [
        (b"x-contextshift-generation-id", _header_value(generation_id)),
        (b"x-contextshift-prompt-tokens", b"%d" % plan.prompt_tokens),
        (b"x-contextshift-tools-tokens", b"%d" % plan.tools_tokens),
        (b"x-contextshift-budget", b"%d" % plan.budget),
        (b"x-contextshift-kept", b"%d" % len(plan.kept)),
        (b"x-contextshift-excluded", b"%d" % len(plan.excluded)),
        (b"x-contextshift-approximate", b"true" if plan.approximate else b"false"),
        (b"x-contextshift-profile", _header_value(plan.profile)),
    ]
    headers += [(b"x-contextshift-warning", _header_value(w)) for w in plan.warnings]
    return headers


def _options(max_request_bytes: int) -> struct_pb2.Struct:
    """The gateway's shift options: whole blocks or none, never a block cut (no block is longer
    than the body it came in)."""
    return struct_pb2.Struct(fields={"max_block_chars": struct_pb2.Value(number_value=max_request_bytes + 1)})


def _plan_of(encoded_plan: bytes | None) -> tuple[pb.ContextPlan, bytes]:
    """An encoded ContextPlan's fields, and its messages_json's bytes apart (never decoded)."""
    rest, messages = engine.split_message_field(encoded_plan or b"", _MESSAGES)
    _, kept = engine.split_message_field(messages or b"", _MESSAGES_JSON)
    return pb.ContextPlan.FromString(rest), kept or b"[]"


class _Hangup:
    """Watches for the caller going away, from the upstream call's start to the relay's end (its
    body already read), and then cancels the call's task, which sees `gone`: one watching task for
    the call's whole life, while the call itself awaits the upstream (no task of its own)."""

    def __init__(self, receive: Receive) -> None:
        self.gone = False
        self._task = asyncio.current_task()
        self._watching = True
        self._watch = asyncio.ensure_future(self._run(receive))

    async def _run(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        if self._watching and self._task is not None:
            self.gone = True
            self._task.cancel()

    def caught(self) -> bool:
        """Whether the CancelledError being handled is the caller's going away (then the call goes
        on, uncancelled, to close what it opened), not the call's own cancellation."""
        self.stop()
        return self.gone and self._task is not None and self._task.uncancel() == 0

    def stop(self) -> None:
        """No more watching: the answer ended (the server says the caller is gone once it has)."""
        self._watching = False
        self._watch.cancel()


@dataclass
class _Fitted:
    """A fitted call on its way upstream: what its answer and the close of its generation need."""

    body: Body
    upstream: Upstream
    chat_id: str
    generation_id: str
    plan: pb.ContextPlan
    started: float
    stored: bool  # whether the shift stored the generation (FinishGeneration can find it)
    headers: Headers = field(default_factory=list)
    first_byte: float | None = None

    def reported(self, tokens: int | None) -> int | None:
        """The provider's prompt tokens as the generation's estimate compares with them: less the
        tool definitions, which the plan's prompt tokens leave out."""
        if tokens is None:
            return None
        return max(1, tokens - self.plan.tools_tokens)


class Gateway:
    """The gateway of one worker process: its upstreams, its pooled client, its slots."""

    def __init__(self, service: ContextShiftService, gate: Gate, config: ServerConfig) -> None:
        self._service = service
        self._gate = gate
        self._upstreams = upstreams.with_keys(config.upstreams)
        self._clients = relay.Clients(config.upstream_max_concurrent)
        self._limit = config.upstream_max_concurrent
        self._in_flight = 0
        connect, read = config.upstream_connect_timeout_seconds, config.upstream_read_timeout_seconds
        self._timeouts = {u.name: relay.timeout(u, connect, read) for u in self._upstreams}
        self._max_bytes = config.max_request_bytes
        self._options = _options(config.max_request_bytes)

    def routes(self) -> list[BaseRoute]:
        fitted = [formats.CHAT_COMPLETIONS, formats.RESPONSES, formats.MESSAGES]
        return [
            *(Route(e.path, self._endpoint(e), methods=["POST"]) for e in fitted),
            Route(formats.COUNT_TOKENS.path, self._count_tokens, methods=["POST"]),
            Route("/v1/models", self._models, methods=["GET"]),
            Route("/v1/models/{model:path}", self._models, methods=["GET"]),
        ]

    async def aclose(self) -> None:
        await self._clients.aclose()

    async def _served(
        self,
        request: Request,
        kind: Format,
        label: str,
        work: Callable[[_GatewayCall], Awaitable[Response]],
    ) -> Response:
        """`work` through the gate; the gate's own refusals (a key, the calls in flight) in the
        provider's shape."""
        call = _GatewayCall()
        key = request.headers.get(KEY_HEADER)
        try:
            return await self._gate.serve(call, label, f"Bearer {key}" if key else None, lambda: work(call))
        except CallFailed as failed:
            return _error(kind, _refusal(failed.status, failed.cause, None))

    def _endpoint(self, endpoint: Endpoint) -> Callable[[Request], Awaitable[Response]]:
        label = f"POST {endpoint.path}"

        async def handle(request: Request) -> Response:
            return await self._served(
                request, endpoint.format, label, lambda call: self._fitted_call(endpoint, request, call)
            )

        return handle

    async def _fitted_call(self, endpoint: Endpoint, request: Request, call: _GatewayCall) -> Response:
        """Steps 1 to 3 of the module's doc; the answer, or the gateway's own error."""
        upstream_name = _NO_UPSTREAM
        taken = False
        try:
            raw = await _read_body(request, self._max_bytes)
            try:
                body = formats.read(endpoint, raw)
            except BodyError as e:
                raise _Refused(400, str(e), code="invalid_request_error", param=e.field) from None
            try:
                upstream = upstreams.choose(self._upstreams, endpoint.format, body.model)
            except upstreams.NoUpstream as e:
                status = 404 if e.configured else 501
                raise _Refused(status, str(e), code="model_not_found", param="model") from None
            upstream_name = upstream.name
            if self._in_flight >= self._limit:
                metrics.record_gateway_saturated(upstream.name)
                raise _Refused(
                    429,
                    f"contextshift: {self._limit} calls to upstreams are in flight "
                    "(upstream_max_concurrent); retry later",
                    code="rate_limit_exceeded",
                    retry=1,
                )
            self._in_flight += 1
            taken = True
            try:
                fitted, kept = await self._shift(body, request, upstream)
            except Exception as e:
                raise _refusal(failure_status(e, f"POST {endpoint.path}"), e, body) from e
            response = await self._forward(fitted, kept, request, call)
            taken = not isinstance(response, _Relay)  # the relay gives the slot back
            return response
        except _Refused as refused:
            call.status = refused.status
            metrics.record_gateway_call(endpoint.name, upstream_name, str(refused.status), 0.0)
            return _error(endpoint.format, refused)
        finally:
            if taken:
                self._in_flight -= 1

    async def _shift(self, body: Body, request: Request, upstream: Upstream) -> tuple[_Fitted, bytes]:
        """ShiftContext on the body's blocks (raises what it raises); the kept blocks' bytes."""
        started = time.perf_counter()
        head = pb.ShiftContextRequest(
            model=body.model,
            # As the other routes read it: the id as it is, or percent-encoded UTF-8.
            chat_id=unquote(request.headers.get(CHAT_HEADER, "")),
            provider=upstream.name,
            strategy=request.headers.get(STRATEGY_HEADER, "") or upstream.strategy,
            output_format=pb.OUTPUT_FORMAT_INPUT,
            options=self._options,
        )
        if body.reserve is not None:
            head.response_reserve = body.reserve
        pieces: list[engine.Piece] = [head.SerializeToString(), (_BLOCKS_JSON, body.blocks)]
        if body.tools is not None:
            pieces.append((_TOOLS_JSON, [body.tools]))
        reply = await self._service.ShiftContext(engine.encode_pieces(pieces))
        rest, encoded_plan = engine.split_message_field(reply, _PLAN)
        plan, kept = _plan_of(encoded_plan)
        generation_id = pb.ShiftContextResponse.FromString(rest).generation_id
        fitted = _Fitted(
            body=body,
            upstream=upstream,
            chat_id=head.chat_id,
            generation_id=generation_id,
            plan=plan,
            started=started,
            stored=audit_payload.generation_stored(head.chat_id, plan.approximate, plan.model),
            headers=_plan_headers(generation_id, plan),
        )
        return fitted, kept

    async def _forward(self, fitted: _Fitted, kept: bytes, request: Request, call: _GatewayCall) -> Response:
        """Sends the fitted body upstream; the answer to relay, or the error to answer with."""
        body, upstream = fitted.body, fitted.upstream
        content = formats.upstream_body(body, kept, fitted.plan)
        sent = time.perf_counter()
        hangup = _Hangup(request.receive)
        try:
            answer = await self._upstream_call("POST", upstream, body.endpoint.path, request, content)
        except (
            asyncio.CancelledError
        ):  # the caller went away (the upstream call is closed), or this call is cancelled
            if not hangup.caught():
                raise
            await self._close(fitted, pb.GENERATION_STATUS_CANCELLED)
            call.status = 499
            self._record(fitted, "499")
            return Response(status_code=499)
        except httpx.TimeoutException:
            hangup.stop()
            return await self._unanswered(fitted, call, 504, "timeout", "the upstream did not answer in time")
        except httpx.HTTPError:
            hangup.stop()
            return await self._unanswered(
                fitted, call, 502, "APIConnectionError", f"the upstream {upstream.name!r} cannot be reached"
            )
        except BaseException:
            hangup.stop()
            raise
        fitted.first_byte = time.perf_counter() - sent
        metrics.record_upstream_first_byte(body.endpoint.name, upstream.name, fitted.first_byte)
        headers = relay.relayed_headers(answer.headers) + fitted.headers
        call.status = answer.status_code
        if answer.status_code < 400:
            return _Relay(self, fitted, answer, headers, hangup)  # the relay watches on
        hangup.stop()
        content = await _read_raw(answer)
        error = relay.error_of_body(answer.status_code, content)
        await self._close(fitted, pb.GENERATION_STATUS_FAILED, error=error)
        self._record(fitted, str(answer.status_code))
        return _whole_answer(answer.status_code, content, headers)

    def _upstream_call(
        self, method: str, upstream: Upstream, path: str, request: Request, content: bytes | None = None
    ) -> Awaitable[relay.Answer]:
        """`upstream`'s answer to a gateway `path`, with the caller's query and headers."""
        url = upstream.url(path)
        query = request.scope.get("query_string", b"")
        if query:
            url += "?" + query.decode("latin-1")
        headers = relay.upstream_headers(request.scope["headers"], upstream)
        return self._clients.send(upstream, method, url, headers, content, self._timeouts[upstream.name])

    async def _unanswered(
        self, fitted: _Fitted, call: _GatewayCall, status: int, kind: str, message: str
    ) -> Response:
        """An upstream that timed out (504) or cannot be reached (502)."""
        error = pb.ProviderError(http_status=status, type=kind)
        await self._close(fitted, pb.GENERATION_STATUS_FAILED, error=error)
        call.status = status
        self._record(fitted, str(status))
        return _error(
            fitted.body.endpoint.format, _Refused(status, f"contextshift: {message}"), fitted.headers
        )

    def _record(self, fitted: _Fitted, status: str, outcome: str = "", tokens: int | None = None) -> None:
        """The metrics and the log line of a call whose answer ended (never a key, a chat id or
        a message)."""
        seconds = time.perf_counter() - fitted.started
        endpoint, upstream = fitted.body.endpoint.name, fitted.upstream.name
        metrics.record_gateway_call(endpoint, upstream, status, seconds)
        fields: dict[str, object] = {
            "endpoint": endpoint,
            "upstream": upstream,
            "status": status,
            "duration_ms": round(seconds * 1e3, 3),
        }
        if fitted.first_byte is not None:
            fields["first_byte_ms"] = round(fitted.first_byte * 1e3, 3)
        if outcome:
            fields["outcome"] = outcome
        if tokens is not None:
            fields["reported_prompt_tokens"] = tokens
        log.info("gateway", extra={"fields": fields})

    async def _close(
        self,
        fitted: _Fitted,
        status: pb.GenerationStatus.ValueType,
        *,
        tokens: int | None = None,
        error: pb.ProviderError | None = None,
    ) -> None:
        """FinishGeneration for a stored generation; a generation gone (NOT_FOUND) or replaced is
        not the caller's problem, so nothing is raised."""
        if not fitted.stored:
            return
        report = pb.FinishGenerationRequest(
            chat_id=fitted.chat_id, generation_id=fitted.generation_id, status=status
        )
        reported = fitted.reported(tokens)
        if reported is not None:
            report.reported_prompt_tokens = reported
        if error is not None:
            report.provider_error.CopyFrom(error)
        try:
            await self._service.FinishGeneration(report)
        except RequestError as e:
            if e.code != code_pb2.NOT_FOUND:
                log.info("generation not closed", extra={"fields": {"reason": type(e).__name__}})
        except Exception as e:  # the store: the answer has been relayed all the same
            log.warning("generation not closed", extra={"fields": {"reason": type(e).__name__}})

    async def _ended(
        self, fitted: _Fitted, answer: relay.Answer, scan: relay.UsageScan, state: _Ending
    ) -> None:
        """After a relay: the upstream answer closed, the generation closed, the slot freed."""
        await answer.aclose()
        self._in_flight -= 1
        if state.failure is not None or scan.error is not None:
            status, outcome = pb.GENERATION_STATUS_FAILED, "failed"
        elif state.ended or scan.finished:
            status, outcome = pb.GENERATION_STATUS_COMPLETED, "completed"
        else:
            status, outcome = pb.GENERATION_STATUS_CANCELLED, "cancelled"
        error = state.failure or scan.error
        await self._close(fitted, status, tokens=scan.prompt_tokens, error=error)
        label = "499" if outcome == "cancelled" else str(answer.status_code)
        self._record(fitted, label, outcome, scan.prompt_tokens)

    async def _count_tokens(self, request: Request) -> Response:
        """`POST /v1/messages/count_tokens`, answered here: the prompt as the model's profile counts
        it (PreviewContext; nothing stored), `{"input_tokens": N}`."""
        endpoint = formats.COUNT_TOKENS

        async def work(call: _GatewayCall) -> Response:
            body: Body | None = None
            try:
                body = formats.read(endpoint, await _read_body(request, self._max_bytes))
                head = pb.PreviewContextRequest(
                    model=body.model,
                    context_limit=_COUNT_WINDOW,
                    response_reserve=0,
                    output_format=pb.OUTPUT_FORMAT_INPUT,
                    options=self._options,
                )
                pieces: list[engine.Piece] = [head.SerializeToString(), (_BLOCKS_JSON, body.blocks)]
                if body.tools is not None:
                    pieces.append((_TOOLS_JSON, [body.tools]))
                try:
                    reply = await self._service.PreviewContext(engine.encode_pieces(pieces))
                except Exception as e:
                    raise _refusal(failure_status(e, f"POST {endpoint.path}"), e, body) from e
            except BodyError as e:
                call.status = 400
                return _error("anthropic", _Refused(400, str(e), param=e.field))
            except _Refused as refused:
                call.status = refused.status
                return _error("anthropic", refused)
            plan, _ = _plan_of(engine.split_message_field(reply, _PREVIEW_PLAN)[1])
            answer = JSONResponse({"input_tokens": plan.calibrated_prompt_tokens + plan.tools_tokens})
            answer.raw_headers += [
                (b"x-contextshift-approximate", b"true" if plan.approximate else b"false"),
                (b"x-contextshift-profile", _header_value(plan.profile)),
                *((b"x-contextshift-warning", _header_value(w)) for w in plan.warnings),
            ]
            return answer

        return await self._served(request, "anthropic", f"POST {endpoint.path}", work)

    async def _models(self, request: Request) -> Response:
        """`GET /v1/models` (and `/v1/models/{id}`), relayed to the OpenAI upstream that takes any
        model (else the first)."""

        async def work(call: _GatewayCall) -> Response:
            try:
                upstream = upstreams.choose(self._upstreams, "openai", "")
            except upstreams.NoUpstream as e:
                if not e.configured:
                    call.status = 501
                    return _error("openai", _Refused(501, str(e), code="model_not_found"))
                upstream = next(u for u in self._upstreams if u.format == "openai")
            model = request.path_params.get("model")
            segments = model.split("/") if model is not None else []
            if any(segment in ("", ".", "..") for segment in segments):  # no other path upstream
                call.status = 404
                return _error("openai", _Refused(404, f"no model {model!r}", code="model_not_found"))
            path = "/".join(["/v1/models", *(quote(segment, safe=_SEGMENT_SAFE) for segment in segments)])
            try:
                answer = await self._upstream_call("GET", upstream, path, request)
            except httpx.TimeoutException:
                call.status = 504
                return _error("openai", _Refused(504, "contextshift: the upstream did not answer in time"))
            except httpx.HTTPError:
                call.status = 502
                message = f"contextshift: the upstream {upstream.name!r} cannot be reached"
                return _error("openai", _Refused(502, message))
            call.status = answer.status_code
            content = await _read_raw(answer)
            return _whole_answer(answer.status_code, content, relay.relayed_headers(answer.headers))

        return await self._served(request, "openai", "GET /v1/models", work)


@dataclass
class _Ending:
    """How a relay ended: the upstream's answer read to its end, or why it broke off."""

    ended: bool = False
    failure: pb.ProviderError | None = None


class _Relay(Response):
    """An upstream answer relayed as it comes, chunk by chunk (the caller's reading paces the
    upstream's: no more than a chunk is held), while its usage is read; the caller going away
    ends it at once (the call's `_Hangup` cancels it). Whatever ends it, the upstream answer is
    closed and the generation closed (`Gateway._ended`), shielded from the cancellation that may
    have ended it."""

    def __init__(
        self, gateway: Gateway, fitted: _Fitted, answer: relay.Answer, headers: Headers, hangup: _Hangup
    ) -> None:
        self.status_code = answer.status_code
        self.raw_headers = headers
        self.background = None
        self._gateway = gateway
        self._fitted = fitted
        self._answer = answer
        self._hangup = hangup

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        endpoint = self._fitted.body.endpoint.name
        scan = relay.UsageScan.of(self._answer.headers)
        state = _Ending()
        metrics.gateway_streams(endpoint, 1)
        try:
            await send(
                {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
            )
            try:
                async for chunk in self._answer.aiter_raw():
                    scan.feed(chunk)
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                scan.end()
                state.ended = True
            except httpx.TimeoutException:
                state.failure = pb.ProviderError(http_status=504, type="timeout")
            except httpx.HTTPError:
                state.failure = pb.ProviderError(http_status=502, type="APIConnectionError")
            self._hangup.stop()
            with contextlib.suppress(Exception):  # an answer cut short may not end well
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            if not self._hangup.caught():
                raise
        finally:
            self._hangup.stop()
            metrics.gateway_streams(endpoint, -1)
            with anyio.CancelScope(shield=True):
                await self._gateway._ended(self._fitted, self._answer, scan, state)
