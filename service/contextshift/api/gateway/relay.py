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
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from contextshift._proto.contextshift.v1 import context_service_pb2 as pb
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


class Clients:
    """The process's pooled clients, one per kind of upstream: HTTP/2 where the upstream offers it
    (an https:// upstream, by ALPN), HTTP/1.1 for an http:// one, which could not speak HTTP/2 to
    it anyway (a client able to costs about 0.15 ms more per call there). Neither follows
    redirects or keeps cookies (one caller's would reach another)."""

    def __init__(self, max_connections: int) -> None:
        self._tls = self._client(max_connections, http2=True)
        self._plain = self._client(max_connections, http2=False)

    @staticmethod
    def _client(max_connections: int, *, http2: bool) -> httpx.AsyncClient:
        no_cookies = http.cookiejar.CookieJar(http.cookiejar.DefaultCookiePolicy(allowed_domains=[]))
        return httpx.AsyncClient(
            http2=http2,
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
            follow_redirects=False,
            cookies=no_cookies,
            timeout=None,
        )

    def of(self, upstream: Upstream) -> httpx.AsyncClient:
        return self._tls if upstream.base_url.startswith("https:") else self._plain

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


def relayed_headers(headers: httpx.Headers) -> Headers:
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
    def of(cls, headers: Mapping[str, str]) -> UsageScan:
        return cls(headers.get("content-type", "").startswith("text/event-stream"))

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
