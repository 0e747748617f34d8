"""LLM summaries of conversation turns, for the `llm-compact` strategy and `memory.LlmSummarizer`.

One call to an OpenAI-compatible Chat Completions endpoint (`POST <base_url>/chat/completions`):
the system prompt of the hint (compaction_prompts.toml), the turns as one user message, and
`max_tokens`. The answer becomes `[Conversation summary]\\n<answer>`, and the facts of the turns
that the answer left out (contextshift.summarizer.facts, as `summarize` keeps them) go on a
`Facts:` line within the token limit.

Every way the call can go wrong is a `CompactionFailed` with its cause (never message content or
the API key): no connection, no answer within the timeout, an HTTP error status, an answer that
is not Chat Completions JSON, an empty answer, an answer over the limit. Callers fall back (a shift
to truncate, a memory to the extractive summary) instead of failing.

Exactly one attempt per summary, no retry: a caller that falls back at once serves the turn, and
the next turn tries again, so a struggling endpoint never sees a retry storm from us. Redirects
are not followed.

Transports: `BLOCKING` (the library) shares one pooled `httpx.Client` per process;
`LoopTransport` (the server) runs the request on the server's event loop with one pooled
`httpx.AsyncClient`, handed over from the engine thread the strategy runs on.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import os
import threading
import time
import tomllib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import TYPE_CHECKING, Any, Protocol

from contextshift.diagnostics import CompactionUsage
from contextshift.options import Secret
from contextshift.summarizer import extractive
from contextshift.summarizer import facts as fact_spans

if TYPE_CHECKING:  # httpx is imported on first use: `import contextshift` does not pay for it
    import httpx

DEFAULT_HINT = "general"
DEFAULT_TIMEOUT_MS = 30_000
# An answer larger than this is not a summary (and must not fill the memory of the server).
MAX_ANSWER_BYTES = 4 * 1024 * 1024
# Connections per process to compaction endpoints.
MAX_CONNECTIONS = 32
COMPLETIONS_PATH = "/chat/completions"


def _load_prompts() -> dict[str, str]:
    text = resources.files("contextshift.summarizer").joinpath("compaction_prompts.toml").read_text("utf-8")
    return {hint: str(entry["prompt"]).strip() for hint, entry in tomllib.loads(text).items()}


PROMPTS: Mapping[str, str] = _load_prompts()
HINTS: tuple[str, ...] = tuple(PROMPTS)


def url_problem(url: str) -> str | None:
    """Why `url` cannot be a compaction endpoint's base URL, or None."""
    import httpx

    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as e:
        return f"not a URL ({e})"
    if parsed.scheme not in {"http", "https"} or not parsed.host:
        return "must be an http:// or https:// URL with a host"
    if parsed.userinfo:
        return "must not carry credentials (give the API key apart)"
    return None


def shown_url(url: str) -> str:
    """`url` as a log may show it: scheme, host, port and path (no query, which may hold a key)."""
    import httpx

    return str(httpx.URL(url).copy_with(query=None, fragment=None))


@dataclass(frozen=True)
class Endpoint:
    """Where a summary is asked for. `url` is the API's base URL (`https://host/v1`) or the full
    `.../chat/completions` URL. The key is a `Secret`: no repr shows it."""

    url: str
    model: str
    api_key: Secret = field(default_factory=lambda: Secret(""))
    timeout_ms: int = DEFAULT_TIMEOUT_MS

    @property
    def completions_url(self) -> str:
        base = self.url.rstrip("/")
        return base if base.endswith(COMPLETIONS_PATH) else base + COMPLETIONS_PATH

    @property
    def headers(self) -> dict[str, str]:
        headers = {"content-type": "application/json", "accept": "application/json"}
        if self.api_key.value:
            headers["authorization"] = f"Bearer {self.api_key.value}"
        return headers

    @property
    def timeout_seconds(self) -> float:
        return self.timeout_ms / 1000

    def request(self, body: bytes) -> dict[str, Any]:
        """The arguments of an httpx client's `stream` that POST `body` here."""
        return {
            "method": "POST",
            "url": self.completions_url,
            "content": body,
            "headers": self.headers,
            "timeout": self.timeout_seconds,
        }


class CompactionFailed(Exception):
    """A summary the endpoint did not give: `cause` says why (no content, no key); `usage` is
    what it reported spending, if it answered."""

    def __init__(self, cause: str, usage: CompactionUsage | None = None) -> None:
        super().__init__(cause)
        self.cause = cause
        self.usage = usage


class Transport(Protocol):
    def post(self, endpoint: Endpoint, body: bytes) -> bytes:
        """The body of a 2xx answer to `body` POSTed to the endpoint; `CompactionFailed` else."""
        ...


@contextlib.contextmanager
def _http_failures(endpoint: Endpoint) -> Iterator[None]:
    """httpx's errors as `CompactionFailed` with a cause free of URLs and content."""
    import httpx

    try:
        yield
    except (httpx.TimeoutException, TimeoutError):
        raise CompactionFailed(f"no answer within compact_timeout_ms ({endpoint.timeout_ms} ms)") from None
    except httpx.ConnectError:
        raise CompactionFailed("could not connect to the endpoint (refused or unreachable)") from None
    except httpx.HTTPError as e:
        raise CompactionFailed(f"HTTP transport error ({type(e).__name__})") from None


class _Body:
    """An answer's body as it arrives: within MAX_ANSWER_BYTES and before `deadline`."""

    def __init__(self, response: httpx.Response, deadline: float) -> None:
        if not response.is_success:
            raise CompactionFailed(f"the endpoint answered HTTP {response.status_code}")
        self._deadline = deadline
        self._chunks: list[bytes] = []
        self._size = 0

    def add(self, chunk: bytes) -> None:
        self._size += len(chunk)
        if self._size > MAX_ANSWER_BYTES:
            raise CompactionFailed(f"the answer is over {MAX_ANSWER_BYTES} bytes")
        if time.monotonic() > self._deadline:
            raise TimeoutError
        self._chunks.append(chunk)

    def bytes(self) -> bytes:
        return b"".join(self._chunks)


def _limits() -> httpx.Limits:
    import httpx

    return httpx.Limits(max_connections=MAX_CONNECTIONS, max_keepalive_connections=8)


class BlockingTransport:
    """The library's: one pooled `httpx.Client` per process, made on first use (a forked child
    makes its own: pooled connections are not shared across a fork)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._client: httpx.Client | None = None
        self._pid = 0

    def _get(self) -> httpx.Client:
        import httpx

        with self._lock:
            if self._client is None or self._pid != os.getpid():
                self._client = httpx.Client(limits=_limits())
                self._pid = os.getpid()
            return self._client

    def post(self, endpoint: Endpoint, body: bytes) -> bytes:
        # httpx's timeouts bound each connect and read; the deadline bounds the whole answer.
        deadline = time.monotonic() + endpoint.timeout_seconds
        client = self._get()
        with _http_failures(endpoint), client.stream(**endpoint.request(body)) as response:
            answer = _Body(response, deadline)
            for chunk in response.iter_bytes():
                answer.add(chunk)
            return answer.bytes()


BLOCKING = BlockingTransport()


class LoopTransport:
    """The server's: requests run on its event loop with one pooled `httpx.AsyncClient`, so
    concurrent compactions share connections and cost no thread each while they wait. `post` is
    called from the thread a strategy runs on (never the loop's own: it would wait on itself)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, client: httpx.AsyncClient) -> None:
        self._loop = loop
        self._client = client

    @classmethod
    def on_running_loop(cls) -> LoopTransport:
        import httpx

        return cls(asyncio.get_running_loop(), httpx.AsyncClient(limits=_limits()))

    async def aclose(self) -> None:
        await self._client.aclose()

    def post(self, endpoint: Endpoint, body: bytes) -> bytes:
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            raise RuntimeError("LoopTransport.post on its own event loop would wait on itself")
        try:
            future = asyncio.run_coroutine_threadsafe(self._post(endpoint, body), self._loop)
        except RuntimeError:  # the loop is closed: the server is stopping
            raise CompactionFailed("the server is stopping") from None
        try:
            # The coroutine keeps its own deadline; this one only guards against a stalled loop.
            return future.result(timeout=endpoint.timeout_seconds + 1)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise CompactionFailed(
                f"no answer within compact_timeout_ms ({endpoint.timeout_ms} ms)"
            ) from None
        except concurrent.futures.CancelledError:
            raise CompactionFailed("the request was cancelled (the server is stopping)") from None

    async def _post(self, endpoint: Endpoint, body: bytes) -> bytes:
        deadline = time.monotonic() + endpoint.timeout_seconds
        with _http_failures(endpoint):
            async with (
                asyncio.timeout(endpoint.timeout_seconds),
                self._client.stream(**endpoint.request(body)) as response,
            ):
                answer = _Body(response, deadline)
                async for chunk in response.aiter_bytes():
                    answer.add(chunk)
                return answer.bytes()


# --- the summary ------------------------------------------------------------------------------


def transcript(turns: Sequence[extractive.Turn]) -> str:
    """The turns as text: `role: text` blocks, oldest first, within the most recent
    `extractive.MAX_INPUT_CHARS`; an earlier summary's header is not content."""
    return "\n\n".join(
        f"{t.role}: {t.text.replace(extractive.HEADER, '').strip()}"
        for t in extractive.recent(turns)
        if t.text.strip()
    )


def request_body(endpoint: Endpoint, hint: str, turns: Sequence[extractive.Turn], max_tokens: int) -> bytes:
    """The Chat Completions request: the hint's system prompt, then the conversation with the
    length it must fit in."""
    ask = f"Summarize this conversation in at most {max_tokens} tokens.\n\n{transcript(turns)}"
    body = {
        "model": endpoint.model,
        "messages": [{"role": "system", "content": PROMPTS[hint]}, {"role": "user", "content": ask}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": False,
    }
    return json.dumps(body, ensure_ascii=False).encode()


def _usage(answer: Mapping[str, Any], model: str) -> CompactionUsage:
    """The `usage` an answer reports (counts it does not give are None)."""
    usage = answer.get("usage")
    if not isinstance(usage, Mapping):
        return CompactionUsage(model, None, None)

    def tokens(key: str) -> int | None:
        value = usage.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None

    return CompactionUsage(model, tokens("prompt_tokens"), tokens("completion_tokens"))


def parse_answer(raw: bytes, model: str) -> tuple[str, CompactionUsage]:
    """The summary text of a Chat Completions answer (its first choice's message content, an
    echoed header taken off) and the usage it reports."""
    try:
        answer = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise CompactionFailed("the answer is not JSON") from None
    if not isinstance(answer, dict):
        raise CompactionFailed("the answer is not a Chat Completions object")
    usage = _usage(answer, model)
    choices = answer.get("choices")
    first = choices[0] if isinstance(choices, list) and choices else None
    message = first.get("message") if isinstance(first, dict) else None
    if not isinstance(first, dict) or not isinstance(message, dict):
        raise CompactionFailed("the answer has no choices[0].message", usage)
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        raise CompactionFailed("the answer's message content is not text", usage)
    if first.get("finish_reason") == "length":
        raise CompactionFailed("the answer was cut at max_tokens: over the summary's limit", usage)
    text = (content or "").strip()
    if text.startswith(extractive.HEADER):  # the model echoed the header: one is enough
        text = text[len(extractive.HEADER) :].strip()
    if not text:
        raise CompactionFailed("the answer is empty", usage)
    return text, usage


@dataclass(frozen=True)
class LlmSummary:
    text: str  # starts with [Conversation summary]
    # The distinct facts (values) of the summarized text read, newest first.
    facts: tuple[str, ...]
    usage: CompactionUsage | None
    # As `extractive.SummaryText.unread_chars`: history too old for its facts to be read.
    unread_chars: int = 0


def summarize(
    turns: Sequence[extractive.Turn],
    endpoint: Endpoint,
    hint: str,
    tokens: Callable[[str], int],
    limit: int,
    transport: Transport = BLOCKING,
) -> LlmSummary:
    """The endpoint's summary of `turns` (oldest first), with the facts it left out appended, at
    most `limit` tokens as `tokens` counts a summary text. Raises `CompactionFailed`."""
    head = f"{extractive.HEADER}\n"
    max_tokens = max(1, limit - tokens(head))  # the answer's room under the header
    raw = transport.post(endpoint, request_body(endpoint, hint, turns, max_tokens))
    answer, usage = parse_answer(raw, endpoint.model)
    text = head + answer
    size = tokens(text)
    if size > limit:
        raise CompactionFailed(f"the answer takes {size} tokens, over the limit of {limit}", usage)
    # Every turn's facts (within the facts window), not only those of the transcript sent:
    # facts_total must be honest.
    read, unread = extractive.facts_window(turns)
    found = extractive.facts_newest_first(read)
    missing = [v for v in found if v not in answer]
    line = fact_spans.longest_that_fits(
        missing, lambda facts: tokens(extractive.with_facts(text, facts)) <= limit
    )
    return LlmSummary(extractive.with_facts(text, line), tuple(found), usage, unread)


# --- the server's endpoint --------------------------------------------------------------------

ROLES = ("main", "fast")


@dataclass(frozen=True)
class ConfiguredEndpoint:
    """The compaction endpoint of a server (its settings), and the transport to reach it. A
    request picks a model by role (`main`, `fast`) or by name among `models`, never a URL."""

    url: str
    models: Mapping[str, str]  # role -> model
    api_key: Secret
    timeout_ms: int
    transport: Transport = field(compare=False)

    def endpoint(self, requested: str) -> Endpoint | None:
        """The endpoint for the `compact_model` option ("" is the main model); None when the
        request names a model the server does not offer."""
        role = requested or "main"
        model = self.models.get(role) or next((m for m in self.models.values() if m == requested), None)
        return None if model is None else Endpoint(self.url, model, self.api_key, self.timeout_ms)

    def offered(self) -> str:
        return ", ".join(f"{role} ({model})" for role, model in self.models.items())


_configured: ConfiguredEndpoint | None = None


def configure(endpoint: ConfiguredEndpoint | None) -> None:
    """Sets (or clears) this process's compaction endpoint: the server does at start and stop."""
    global _configured
    _configured = endpoint


def configured() -> ConfiguredEndpoint | None:
    return _configured
