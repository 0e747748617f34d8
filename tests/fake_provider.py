"""A real HTTP server on 127.0.0.1 that plays an LLM provider for the gateway's tests: OpenAI Chat
Completions and Responses, Anthropic Messages, each streamed (server-sent events, usage in the last
events) and not, and `GET /v1/models` (stdlib `ThreadingHTTPServer` in a thread: a real socket,
real HTTP/1.1, chunked event streams; no mock object).

It keeps what it received (`requests`: path, headers, the body's bytes and JSON) and answers as
its `mode` says: `ok`, `rate_limit` (429 with Retry-After), `error` (500), `unauthorized` (401
echoing the caller's key, as a provider's message may), `hang` (headers never come), `slow` (an
event stream of `events` events, `interval` seconds apart). Like a provider, it counts each prompt
its own way (`count`: o200k_base by OpenAI's cookbook rule for OpenAI models, characters for
Claude) and refuses one over the model's window (`windows`) with its usual 400; it reports that
count as the usage. When the gateway closes a connection mid-answer it notes when (`closed_at`).
"""

from __future__ import annotations

import json
import math
import select
import socket
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any

from fake_llm import serve_in_thread, stop
from test_profiles_exact import openai_encoding

MODES = ("ok", "rate_limit", "error", "unauthorized", "hang", "slow")
RETRY_AFTER = "7"
# Text only the provider's error bodies carry: never to be stored by contextshift.
UPSTREAM_SECRET_TEXT = "upstream-private-detail-7f3a"


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    raw: bytes
    at: float

    @property
    def body(self) -> Any:
        return json.loads(self.raw)


def _texts(value: Any) -> list[str]:
    """The text a content value carries: a string, or the text of its parts."""
    if isinstance(value, str):
        return [value]
    found: list[str] = []
    if isinstance(value, list):
        for part in value:
            if isinstance(part, dict):
                for key in ("text", "output", "thinking"):
                    if isinstance(part.get(key), str):
                        found.append(part[key])
                if "input" in part and part.get("type") == "tool_use":
                    found.append(json.dumps(part["input"]))
                if part.get("type") == "tool_result":
                    found += _texts(part.get("content"))
    return found


def _o200k(text: str) -> int:
    return len(openai_encoding("o200k_base").encode(text, disallowed_special=()))


def _chars(text: str) -> int:
    ascii_count = sum(1 for c in text if ord(c) < 128)
    return max(1, math.ceil(ascii_count / 4 + (len(text) - ascii_count) / 1.5)) if text else 0


def count_openai(body: dict[str, Any]) -> int:
    """OpenAI's cookbook rule (o200k_base): 3 per message + its role + its text, tool calls' names
    and arguments + 3 each, 3 priming; tools as their JSON text. Responses items likewise; a
    reasoning item's payload only in the current turn."""
    items = body.get("messages") or body.get("input") or []
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    if body.get("instructions"):
        items = [{"role": "system", "content": body["instructions"]}, *items]
    last_user = max((i for i, m in enumerate(items) if m.get("role") == "user"), default=-1)
    total = 3
    for i, message in enumerate(items):
        kind = message.get("type", "message")
        if kind == "reasoning":
            if i > last_user:
                total += _o200k(message.get("encrypted_content") or "")
            continue
        total += 4
        if kind == "function_call":
            total += _o200k(message.get("name", "")) + _o200k(message.get("arguments", "")) + 3
            continue
        if kind == "function_call_output":
            total += _o200k(str(message.get("output", "")))
            continue
        total += sum(_o200k(t) for t in _texts(message.get("content")))
        for call in message.get("tool_calls") or []:
            function = call.get("function", {})
            total += _o200k(function.get("name", "")) + _o200k(function.get("arguments", "")) + 3
    if body.get("tools"):
        total += _o200k(json.dumps(body["tools"]))
    return total


def count_anthropic(body: dict[str, Any]) -> int:
    """Characters (a quarter token each, more for other scripts), 4 per message; thinking only in
    the current turn, as Anthropic drops earlier turns' thinking."""
    messages = body.get("messages") or []
    last_user = max(
        (
            i
            for i, m in enumerate(messages)
            if m.get("role") == "user"
            and not (
                isinstance(m.get("content"), list)
                and any(p.get("type") == "tool_result" for p in m["content"])
            )
        ),
        default=-1,
    )
    total = sum(_chars(t) for t in _texts(body.get("system")))
    for i, message in enumerate(messages):
        total += 4
        content = message.get("content")
        if isinstance(content, list) and i < last_user:
            content = [p for p in content if p.get("type") not in ("thinking", "redacted_thinking")]
        total += sum(_chars(t) for t in _texts(content))
    if body.get("tools"):
        total += _chars(json.dumps(body["tools"]))
    return total


class FakeProvider:
    def __init__(self) -> None:
        self.mode = "ok"
        self.events = 3  # text deltas of a streamed answer
        self.interval = 0.2  # seconds between a slow stream's events
        self.windows: dict[str, int] = {}  # model -> context window; others: no limit
        self.requests: list[Received] = []
        self.closed_at: float | None = None  # when the gateway closed a connection mid-answer
        self.turn = 0
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                # As a provider's server does: each event leaves when written.
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", "0"))
                raw = self.rfile.read(length)
                headers = {k.lower(): v for k, v in self.headers.items()}
                fake.requests.append(Received(self.path, headers, raw, time.monotonic()))
                fake._answer(self, json.loads(raw))

            def do_GET(self) -> None:
                headers = {k.lower(): v for k, v in self.headers.items()}
                fake.requests.append(Received(self.path, headers, b"", time.monotonic()))
                models = {"object": "list", "data": [{"id": "gpt-4o", "object": "model", "owned_by": "fake"}]}
                fake._send(self, 200, json.dumps(models).encode())

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = serve_in_thread(Handler)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def openai_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def anthropic_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        stop(self._server)

    def reset(self) -> None:
        self.mode = "ok"
        self.events = 3
        self.requests.clear()
        self.closed_at = None

    @property
    def last(self) -> Received:
        return self.requests[-1]

    # --- answers ---------------------------------------------------------------------------------

    def _answer(self, handler: BaseHTTPRequestHandler, body: dict[str, Any]) -> None:
        anthropic = handler.path.startswith("/v1/messages")
        mode = self.mode
        if mode == "hang":
            self._wait_for_close(handler)
            return
        if mode == "rate_limit":
            if anthropic:
                error = {
                    "type": "error",
                    "error": {"type": "rate_limit_error", "message": f"slow down {UPSTREAM_SECRET_TEXT}"},
                }
            else:
                error = {
                    "error": {
                        "message": f"Rate limit reached {UPSTREAM_SECRET_TEXT}",
                        "type": "requests",
                        "param": None,
                        "code": "rate_limit_exceeded",
                    }
                }
            self._send(handler, 429, json.dumps(error).encode(), {"retry-after": RETRY_AFTER})
            return
        if mode == "error":
            self._send(
                handler,
                500,
                json.dumps({"error": {"message": UPSTREAM_SECRET_TEXT, "type": "server_error"}}).encode(),
            )
            return
        if mode == "unauthorized":
            key = handler.headers.get("authorization", "") or handler.headers.get("x-api-key", "")
            message = f"Incorrect API key provided: {key} {UPSTREAM_SECRET_TEXT}"
            error = {
                "error": {"message": message, "type": "invalid_request_error", "code": "invalid_api_key"}
            }
            self._send(handler, 401, json.dumps(error).encode())
            return
        model = body.get("model", "")
        tokens = count_anthropic(body) if anthropic else count_openai(body)
        reserve = (
            body.get("max_tokens") or body.get("max_completion_tokens") or body.get("max_output_tokens") or 0
        )
        window = self.windows.get(model)
        if window is not None and tokens + reserve > window:
            if anthropic:
                error = {
                    "type": "error",
                    "error": {
                        "type": "invalid_request_error",
                        "message": f"prompt is too long: {tokens} tokens > {window - reserve} maximum",
                    },
                }
            else:
                message = f"This model's maximum context length is {window} tokens. However, you requested {tokens + reserve} tokens."
                error = {
                    "error": {
                        "message": message,
                        "type": "invalid_request_error",
                        "param": "messages",
                        "code": "context_length_exceeded",
                    }
                }
            self._send(handler, 400, json.dumps(error).encode())
            return
        self.turn += 1
        if handler.path.startswith("/v1/chat/completions"):
            self._chat(handler, body, tokens)
        elif handler.path.startswith("/v1/responses"):
            self._responses(handler, body, tokens)
        else:
            self._messages(handler, body, tokens)

    def _chat(self, handler: BaseHTTPRequestHandler, body: dict[str, Any], tokens: int) -> None:
        tool = bool(body.get("tools")) and body.get("tool_choice") != "none"
        call_id = f"call_{self.turn}"
        message: dict[str, Any] = {"role": "assistant", "content": None if tool else "done"}
        if tool:
            name = body["tools"][0]["function"]["name"]
            message["tool_calls"] = [
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": '{"q": 1}'}}
            ]
        usage = {"prompt_tokens": tokens, "completion_tokens": 5, "total_tokens": tokens + 5}
        finish = "tool_calls" if tool else "stop"
        if not body.get("stream"):
            answer = {
                "id": f"chatcmpl-{self.turn}",
                "object": "chat.completion",
                "created": 1,
                "model": body["model"],
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": usage,
            }
            self._send(handler, 200, json.dumps(answer).encode())
            return
        base = {
            "id": f"chatcmpl-{self.turn}",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": body["model"],
        }
        include = bool((body.get("stream_options") or {}).get("include_usage"))
        usage_field = {"usage": None} if include else {}

        def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
            return {
                **base,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
                **usage_field,
            }

        events: list[Any] = [chunk({"role": "assistant", "content": ""})]
        if tool:
            events.append(chunk({"tool_calls": [{"index": 0, **message["tool_calls"][0]}]}))
        else:
            events += [chunk({"content": f"part{i} "}) for i in range(self.events)]
        events.append(chunk({}, finish))
        if include:
            events.append({**base, "choices": [], "usage": usage})
        self._stream(handler, [f"data: {json.dumps(e)}\n\n".encode() for e in events] + [b"data: [DONE]\n\n"])

    def _responses(self, handler: BaseHTTPRequestHandler, body: dict[str, Any], tokens: int) -> None:
        tool = bool(body.get("tools"))
        n = self.turn
        output: list[dict[str, Any]] = [
            {"type": "reasoning", "id": f"rs_{n}", "summary": [], "encrypted_content": f"enc-{n}-" + "z" * 40}
        ]
        if tool:
            output.append(
                {
                    "type": "function_call",
                    "id": f"fc_{n}",
                    "call_id": f"call_{n}",
                    "name": body["tools"][0]["name"],
                    "arguments": '{"q": 1}',
                    "status": "completed",
                }
            )
        else:
            output.append(
                {
                    "type": "message",
                    "id": f"msg_{n}",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": "done", "annotations": []}],
                }
            )
        response = {
            "id": f"resp_{n}",
            "object": "response",
            "created_at": 1,
            "status": "completed",
            "model": body["model"],
            "output": output,
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": body.get("tools") or [],
            "usage": {
                "input_tokens": tokens,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": 5,
                "output_tokens_details": {"reasoning_tokens": 3},
                "total_tokens": tokens + 5,
            },
        }
        if not body.get("stream"):
            self._send(handler, 200, json.dumps(response).encode())
            return
        events: list[tuple[str, dict[str, Any]]] = [
            (
                "response.created",
                {
                    "type": "response.created",
                    "sequence_number": 0,
                    "response": {**response, "status": "in_progress", "output": [], "usage": None},
                },
            ),
        ]
        for i, item in enumerate(output):
            events.append(
                (
                    "response.output_item.added",
                    {
                        "type": "response.output_item.added",
                        "sequence_number": len(events),
                        "output_index": i,
                        "item": item,
                    },
                )
            )
            if item["type"] == "message":
                for d in range(self.events):
                    events.append(
                        (
                            "response.output_text.delta",
                            {
                                "type": "response.output_text.delta",
                                "sequence_number": len(events),
                                "item_id": item["id"],
                                "output_index": i,
                                "content_index": 0,
                                "delta": f"part{d} ",
                                "logprobs": [],
                            },
                        )
                    )
            events.append(
                (
                    "response.output_item.done",
                    {
                        "type": "response.output_item.done",
                        "sequence_number": len(events),
                        "output_index": i,
                        "item": item,
                    },
                )
            )
        events.append(
            (
                "response.completed",
                {"type": "response.completed", "sequence_number": len(events), "response": response},
            )
        )
        self._stream(
            handler, [f"event: {name}\ndata: {json.dumps(data)}\n\n".encode() for name, data in events]
        )

    def _messages(self, handler: BaseHTTPRequestHandler, body: dict[str, Any], tokens: int) -> None:
        tool = bool(body.get("tools"))
        thinking = (body.get("thinking") or {}).get("type") == "enabled"
        n = self.turn
        content: list[dict[str, Any]] = []
        if thinking:
            content.append(
                {"type": "thinking", "thinking": f"thought {n}", "signature": f"sig-{n}-" + "s" * 30}
            )
        if tool:
            content.append(
                {"type": "tool_use", "id": f"toolu_{n}", "name": body["tools"][0]["name"], "input": {"q": 1}}
            )
        else:
            content.append({"type": "text", "text": "done"})
        cached = min(10, tokens)  # part of the prompt read from the provider's cache
        usage = {
            "input_tokens": tokens - cached,
            "cache_read_input_tokens": cached,
            "cache_creation_input_tokens": 0,
            "output_tokens": 5,
        }
        message = {
            "id": f"msg_{n}",
            "type": "message",
            "role": "assistant",
            "model": body["model"],
            "content": content,
            "stop_reason": "tool_use" if tool else "end_turn",
            "stop_sequence": None,
            "usage": usage,
        }
        if not body.get("stream"):
            self._send(handler, 200, json.dumps(message).encode())
            return
        start = {**message, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 1}}
        events: list[tuple[str, dict[str, Any]]] = [
            ("message_start", {"type": "message_start", "message": start})
        ]
        for i, block in enumerate(content):
            if block["type"] == "text":
                events.append(
                    (
                        "content_block_start",
                        {
                            "type": "content_block_start",
                            "index": i,
                            "content_block": {"type": "text", "text": ""},
                        },
                    )
                )
                for d in range(self.events):
                    events.append(
                        (
                            "content_block_delta",
                            {
                                "type": "content_block_delta",
                                "index": i,
                                "delta": {"type": "text_delta", "text": f"part{d} "},
                            },
                        )
                    )
            elif block["type"] == "thinking":
                events.append(
                    (
                        "content_block_start",
                        {
                            "type": "content_block_start",
                            "index": i,
                            "content_block": {"type": "thinking", "thinking": "", "signature": ""},
                        },
                    )
                )
                events.append(
                    (
                        "content_block_delta",
                        {
                            "type": "content_block_delta",
                            "index": i,
                            "delta": {"type": "thinking_delta", "thinking": block["thinking"]},
                        },
                    )
                )
                events.append(
                    (
                        "content_block_delta",
                        {
                            "type": "content_block_delta",
                            "index": i,
                            "delta": {"type": "signature_delta", "signature": block["signature"]},
                        },
                    )
                )
            else:
                events.append(
                    (
                        "content_block_start",
                        {"type": "content_block_start", "index": i, "content_block": {**block, "input": {}}},
                    )
                )
                events.append(
                    (
                        "content_block_delta",
                        {
                            "type": "content_block_delta",
                            "index": i,
                            "delta": {"type": "input_json_delta", "partial_json": json.dumps(block["input"])},
                        },
                    )
                )
            events.append(("content_block_stop", {"type": "content_block_stop", "index": i}))
        events.append(
            (
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
                    "usage": {"output_tokens": 5},
                },
            )
        )
        events.append(("message_stop", {"type": "message_stop"}))
        self._stream(
            handler, [f"event: {name}\ndata: {json.dumps(data)}\n\n".encode() for name, data in events]
        )

    # --- the wire --------------------------------------------------------------------------------

    def _stream(self, handler: BaseHTTPRequestHandler, events: list[bytes]) -> None:
        """A chunked event stream: one chunk per event; `slow` mode: `interval` between them."""
        try:
            handler.send_response(200)
            handler.send_header("content-type", "text/event-stream")
            handler.send_header("transfer-encoding", "chunked")
            handler.send_header("x-request-id", "req_fake")
            handler.end_headers()
            for event in events:
                if self.mode == "slow" and self._closed_within(handler, self.interval):
                    raise ConnectionResetError("the gateway closed the connection")
                handler.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
                handler.wfile.flush()
            handler.wfile.write(b"0\r\n\r\n")
            handler.wfile.flush()
        except OSError:
            self.closed_at = time.monotonic()
            handler.close_connection = True

    @staticmethod
    def _closed_within(handler: BaseHTTPRequestHandler, seconds: float) -> bool:
        """Whether the other side closes the connection within `seconds` (it sends nothing more
        while it waits for an answer, so a readable socket is its end)."""
        sock: socket.socket = handler.connection
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            readable, _, _ = select.select([sock], [], [], min(left, 0.02))
            if readable:
                try:
                    return not sock.recv(1, socket.MSG_PEEK)
                except OSError:
                    return True
        return False

    def _wait_for_close(self, handler: BaseHTTPRequestHandler) -> None:
        """Answers nothing; notes when the other side closes the connection."""
        while not self._closed_within(handler, 1.0):
            pass
        self.closed_at = time.monotonic()
        handler.close_connection = True

    @staticmethod
    def _send(
        handler: BaseHTTPRequestHandler, status: int, payload: bytes, headers: dict[str, str] | None = None
    ) -> None:
        try:
            handler.send_response(status)
            handler.send_header("content-type", "application/json")
            handler.send_header("content-length", str(len(payload)))
            handler.send_header("x-request-id", "req_fake")
            for key, value in (headers or {}).items():
                handler.send_header(key, value)
            handler.end_headers()
            handler.wfile.write(payload)
        except OSError:
            pass
