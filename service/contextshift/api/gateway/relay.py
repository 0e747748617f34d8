"""The upstream side of the gateway: the pooled HTTP clients of the process, the headers that go each
way, and the usage found in an answer as it passes (`UsageScan`), never holding an event stream.

Headers. Upstream go the caller's headers (its `authorization` or `x-api-key`, `anthropic-version`,
`openai-organization`, ...) less the hop-by-hop ones, `host`, `content-length`, contextshift's own
(`x-contextshift-*`, `x-chat-id`), and `accept-encoding` (the answer comes unencoded, so its usage
can be read as it passes); an upstream with a key of its own sends it instead of the caller's.
Back come the provider's headers less the hop-by-hop ones and `date` (the server sends its own).
No header is ever logged.
"""

from __future__ import annotations

import http.cookiejar
import json
import re
from collections.abc import AsyncIterator, Awaitable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from contextshift._proto.contextshift.v1 import context_service_pb2 as pb
from contextshift.api.gateway import http1
from contextshift.api.gateway.upstreams import Upstream

# RFC 9110 §7.6.1, and the ones proxies also drop.
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)
_NOT_FORWARDED = HOP_BY_HOP | {b"host", b"content-length", b"accept-encoding", b"x-chat-id"}
_CALLER_KEYS = frozenset({b"authorization", b"x-api-key", b"api-key"})
_NOT_RELAYED = HOP_BY_HOP | {b"date"}
# The most of a JSON answer kept to find its usage.
MAX_SCANNED_BYTES = 16 * 1024 * 1024

Headers = list[tuple[bytes, bytes]]


class AnswerHeaders(Protocol):
    """An upstream answer's headers: as they came, and one looked up by name."""

    @property
    def raw(self) -> list[tuple[bytes, bytes]]: ...

    def get(self, key: str, default: Any = None) -> Any: ...


class Answer(Protocol):
    """An upstream's answer, from either client: httpx's Response, or `http1.Answer`."""

    @property
    def status_code(self) -> int: ...

    @property
    def headers(self) -> AnswerHeaders: ...

    def aiter_raw(self) -> AsyncIterator[bytes]: ...

    async def aclose(self) -> None: ...


class Clients:
    """The process's pooled clients, one per kind of upstream: httpx with HTTP/2 where the upstream
    offers it (an https:// upstream, by ALPN), and the gateway's own HTTP/1.1 client
    (`http1.Pool`) for an http:// one, which could not speak HTTP/2 to it anyway and where httpx's
    layers cost more than the rest of a call. Neither follows redirects or keeps cookies (one
    caller's would reach another)."""

    def __init__(self, max_connections: int) -> None:
        no_cookies = http.cookiejar.CookieJar(http.cookiejar.DefaultCookiePolicy(allowed_domains=[]))
        self._tls = httpx.AsyncClient(
            http2=True,
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
            follow_redirects=False,
            cookies=no_cookies,
            timeout=None,
        )
        self._plain = http1.Pool(max_connections)

    def send(
        self,
        upstream: Upstream,
        method: str,
        url: str,
        headers: Sequence[tuple[bytes, bytes]],
        content: bytes | None,
        timeout: httpx.Timeout,
    ) -> Awaitable[Answer]:
        """A request to `upstream`: its answer once the head came (the body to be read), or
        httpx's errors."""
        if upstream.base_url.startswith("https:"):
            request = self._tls.build_request(method, url, content=content, headers=headers, timeout=timeout)
            return self._tls.send(request, stream=True)
        return self._plain.send(method, url, headers, content, timeout)

    async def aclose(self) -> None:
        await self._tls.aclose()
        await self._plain.aclose()


def _listed(headers: Headers) -> set[bytes]:
    """The headers a `connection` header names, which are hop-by-hop too."""
    return {
        name.strip().lower() for key, value in headers if key == b"connection" for name in value.split(b",")
    }


def upstream_headers(headers: Headers, upstream: Upstream) -> Headers:
    """The headers that go upstream with a caller's `headers` (names in lower case, as ASGI has them)."""
    dropped = _NOT_FORWARDED | _listed(headers)
    if upstream.key is not None:
        dropped = dropped | _CALLER_KEYS
    sent = [(k, v) for k, v in headers if k not in dropped and not k.startswith(b"x-contextshift-")]
    sent.append((b"accept-encoding", b"identity"))
    if upstream.key is not None:
        key = upstream.key.value.encode()
        if upstream.format == "anthropic":
            sent.append((b"x-api-key", key))
        else:
            sent.append((b"authorization", b"Bearer " + key))
    return sent


def relayed_headers(headers: AnswerHeaders) -> Headers:
    """The provider's answer headers as the caller gets them."""
    pairs = [(k.lower(), v) for k, v in headers.raw]
    dropped = _NOT_RELAYED | _listed(pairs)
    return [(k, v) for k, v in pairs if k not in dropped]


def timeout(upstream: Upstream, connect: float, read: float) -> httpx.Timeout:
    """An upstream call's timeouts: its own, else the server's settings. A read timeout bounds
    each wait for the next bytes (a stream may last longer)."""
    connect = upstream.connect_timeout_seconds or connect
    read = upstream.read_timeout_seconds or read
    return httpx.Timeout(connect=connect, read=read, write=read, pool=connect)


def _prompt_tokens(usage: Any) -> int | None:
    """The prompt tokens a usage object reports: OpenAI Chat's `prompt_tokens`; Responses' and
    Anthropic's `input_tokens` (Anthropic's plus the tokens read from and written to its cache)."""
    if not isinstance(usage, dict):
        return None
    if isinstance(usage.get("prompt_tokens"), int):
        return int(usage["prompt_tokens"])
    if not isinstance(usage.get("input_tokens"), int):
        return None
    cached = (usage.get(k) for k in ("cache_creation_input_tokens", "cache_read_input_tokens"))
    return int(usage["input_tokens"]) + sum(c for c in cached if isinstance(c, int))


def provider_error(status: int, payload: Any) -> pb.ProviderError:
    """What a provider's error answer (or error event) says, for FinishGeneration to normalize:
    `{"error": {type, code, message}}` (OpenAI, Anthropic's inner object, a Responses event)."""
    error = payload.get("error", payload) if isinstance(payload, dict) else None
    if isinstance(payload, dict) and payload.get("type") == "response.failed":
        error = (payload.get("response") or {}).get("error")
    found = pb.ProviderError(http_status=status)
    if isinstance(error, dict):
        for name in ("type", "code", "message"):
            if isinstance(error.get(name), str | int) and not isinstance(error.get(name), bool):
                setattr(found, name, str(error[name]))
    elif isinstance(error, str):
        found.message = error
    return found


def error_of_body(status: int, body: bytes) -> pb.ProviderError:
    try:
        payload = json.loads(body)
    except ValueError:
        payload = None
    return provider_error(status, payload)


# Lines worth a look in an event stream: the ones that can carry usage, an end or an error.
_MARKERS = re.compile(rb'\[DONE\]|"usage":\s*\{|error|message_stop|response\.(?:completed|incomplete|failed)')


@dataclass
class UsageScan:
    """Reads an answer as it passes to the caller: the provider's prompt tokens, whether the
    answer ended as the provider ends it, and an error the provider sent inside a 200 answer.

    An event stream is read line by line, and only lines that may matter are parsed: OpenAI Chat's
    chunk with `usage` (with `stream_options.include_usage`) and `[DONE]`; Responses'
    `response.completed` / `.incomplete` / `.failed` and `error`; Anthropic's `message_start` and
    `message_delta` (usage), `message_stop` and `error`. A JSON answer is kept (up to
    MAX_SCANNED_BYTES) and read once it has all come."""

    stream: bool
    prompt_tokens: int | None = None
    finished: bool = False
    error: pb.ProviderError | None = None

    def __post_init__(self) -> None:
        self._parts: list[bytes] = []
        self._size = 0

    @classmethod
    def of(cls, headers: AnswerHeaders) -> UsageScan:
        return cls(str(headers.get("content-type") or "").startswith("text/event-stream"))

    def feed(self, chunk: bytes) -> None:
        if self._size > MAX_SCANNED_BYTES:
            return
        if not self.stream:
            self._parts.append(chunk)
            self._size += len(chunk)
            return
        cut = chunk.rfind(b"\n")
        if cut < 0:  # a line goes on
            self._parts.append(chunk)
            self._size += len(chunk)
            return
        lines = b"".join([*self._parts, chunk[: cut + 1]]) if self._parts else chunk[: cut + 1]
        rest = chunk[cut + 1 :]
        self._parts = [rest] if rest else []
        self._size = len(rest)
        if _MARKERS.search(lines):
            for line in lines.split(b"\n"):
                if line.startswith(b"data:"):
                    self._event(line[5:].strip())

    def _event(self, data: bytes) -> None:
        if data == b"[DONE]":
            self.finished = True
            return
        if not data.startswith(b"{") or not _MARKERS.search(data):
            return
        try:
            event = json.loads(data)
        except ValueError:
            return
        if not isinstance(event, dict):
            return
        kind = event.get("type")
        if kind == "message_start":
            self._tokens((event.get("message") or {}).get("usage"))
        elif kind in ("response.completed", "response.incomplete"):
            self._tokens((event.get("response") or {}).get("usage"))
            self.finished = True
        elif kind == "message_stop":
            self.finished = True
        elif kind in ("error", "response.failed") or (kind is None and "error" in event):
            self.error = provider_error(0, event)
            self.finished = True
        else:
            self._tokens(event.get("usage"))  # message_delta, a Chat chunk

    def _tokens(self, usage: Any) -> None:
        found = _prompt_tokens(usage)
        if found is not None:
            self.prompt_tokens = found

    def end(self) -> None:
        """The answer has all come."""
        if self.stream or self._size > MAX_SCANNED_BYTES:
            return
        self.finished = True
        try:
            answer = json.loads(b"".join(self._parts))
        except ValueError:
            return
        finally:
            self._parts = []
        if isinstance(answer, dict):
            self._tokens(answer.get("usage"))
