"""Each gateway endpoint's body: read once, fitted, and spliced back together.

`read` parses the body once (Python's own JSON scanner, one top-level field at a time, so each
field's place in the body is known) and takes what the shift needs: the model, the message list
(`messages`, or Responses' `input`), the system prompt (Anthropic's `system`, Responses'
`instructions`: a first system block `{"role": "system", "content": <it>}`, so it is counted and
protected), the tools and the answer's reserve. The shift gets the caller's own bytes of each block.

`upstream_body` is the caller's body with only the message list replaced by the kept blocks, each
byte for byte as the shift returned it (its `OUTPUT_FORMAT_INPUT` messages: the caller's text of
each block), every other field untouched, byte for byte too; when nothing was left out, the body
itself. A summary block (summarize, llm-compact) goes in as a system message where the shift put
it, or for Anthropic, which has no system role among its messages, at the end of `system`.

Errors come in the provider's own shape (`error_body`), so its SDK raises its usual exception.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from contextshift._proto.contextshift.v1 import context_service_pb2 as pb
from contextshift.api.gateway.upstreams import Format

_WS = re.compile(r"[ \t\n\r]*")
_SCAN = json.JSONDecoder().scan_once  # type: ignore[attr-defined]  # the C scanner json.loads uses
_SCAN_STRING = json.decoder.scanstring  # type: ignore[attr-defined]  # typeshed lacks it


@dataclass(frozen=True)
class Endpoint:
    """A fitted endpoint: its path, its name in metrics, the upstream format, and the body's
    fields that hold the messages, the system prompt and the answer's reserve (first given wins)."""

    path: str
    name: str
    format: Format
    messages: str
    system: str | None
    reserve: tuple[str, ...]


CHAT_COMPLETIONS = Endpoint(
    "/v1/chat/completions",
    "chat_completions",
    "openai",
    "messages",
    None,
    ("max_completion_tokens", "max_tokens"),
)
RESPONSES = Endpoint("/v1/responses", "responses", "openai", "input", "instructions", ("max_output_tokens",))
MESSAGES = Endpoint("/v1/messages", "messages", "anthropic", "messages", "system", ("max_tokens",))
COUNT_TOKENS = Endpoint("/v1/messages/count_tokens", "count_tokens", "anthropic", "messages", "system", ())


class BodyError(Exception):
    """A body the gateway cannot read: the field (`messages`, `max_tokens`, `body`) and why."""

    def __init__(self, field: str, description: str) -> None:
        super().__init__(f"{field}: {description}")
        self.field = field
        self.description = description


@dataclass(frozen=True)
class Span:
    """A top-level value's bytes in the body: [start, end)."""

    start: int
    end: int


@dataclass(frozen=True)
class Body:
    """A request body as the gateway read it."""

    endpoint: Endpoint
    raw: bytes
    model: str
    stream: bool
    # The shift's blocks_json, in pieces (the caller's own bytes, and the system block before them).
    blocks: Sequence[bytes]
    tools: bytes | None  # the `tools` array's bytes, None without tools
    reserve: int | None  # the answer's reserve the body gives, None: the model's default
    reserve_field: str | None  # the field it came in
    # Where the message list is, None when it is not replaced (absent, or `input` as a string).
    messages: Span | None
    # The system prompt's value and its bytes (None: not given, or null), and the block made of it.
    system: Any
    system_span: Span | None
    system_block: bytes | None
    opening: int  # the byte after the body's `{`

    @property
    def offset(self) -> int:
        """How many blocks the shift got before the body's own messages (the system block)."""
        return 0 if self.system_block is None else 1


def _where(text: str, index: int) -> str:
    line = text.count("\n", 0, index) + 1
    column = index - (text.rfind("\n", 0, index) + 1) + 1
    return f"line {line} column {column}"


def _value(text: str, index: int, field: str) -> tuple[Any, int]:
    try:
        value, end = _SCAN(text, index)
    except StopIteration as stop:
        raise BodyError(field, f"not valid JSON: expected a value at {_where(text, stop.value)}") from None
    except json.JSONDecodeError as e:
        raise BodyError(field, f"not valid JSON: {e.msg} at {_where(text, e.pos)}") from None
    except RecursionError:
        raise BodyError(field, "nested too deeply") from None
    return value, end


def _top_level(text: str) -> tuple[dict[str, tuple[Any, int, int]], int]:
    """The body's top-level fields, each with its value and its [start, end) in `text`, and the
    index after its opening brace. Every value is parsed (once)."""
    index = _WS.match(text, 0).end()  # type: ignore[union-attr]  # matches ""
    if text[index : index + 1] != "{":
        raise BodyError("body", "expected a JSON object")
    opening = index + 1
    index = _WS.match(text, opening).end()  # type: ignore[union-attr]
    fields: dict[str, tuple[Any, int, int]] = {}
    if text[index : index + 1] == "}":
        return fields, opening
    while True:
        if text[index : index + 1] != '"':
            raise BodyError("body", f"not valid JSON: expected a field name at {_where(text, index)}")
        try:
            key, index = _SCAN_STRING(text, index + 1)
        except json.JSONDecodeError as e:
            raise BodyError("body", f"not valid JSON: {e.msg} at {_where(text, e.pos)}") from None
        index = _WS.match(text, index).end()  # type: ignore[union-attr]
        if text[index : index + 1] != ":":
            raise BodyError("body", f"not valid JSON: expected ':' at {_where(text, index)}")
        start = _WS.match(text, index + 1).end()  # type: ignore[union-attr]
        value, end = _value(text, start, key)
        if key in fields:
            raise BodyError(key, "given twice")
        fields[key] = (value, start, end)
        index = _WS.match(text, end).end()  # type: ignore[union-attr]
        mark = text[index : index + 1]
        if mark == "}":
            break
        if mark != ",":
            raise BodyError("body", f"not valid JSON: expected ',' or '}}' at {_where(text, index)}")
        index = _WS.match(text, index + 1).end()  # type: ignore[union-attr]
    if _WS.match(text, index + 1).end() != len(text):  # type: ignore[union-attr]
        raise BodyError("body", f"not valid JSON: extra data at {_where(text, index + 1)}")
    return fields, opening


class _Offsets:
    """Byte offsets of `text`'s character offsets (the same for ASCII)."""

    def __init__(self, text: str, raw: bytes) -> None:
        self._text = text
        self._ascii = len(text) == len(raw)

    def __call__(self, index: int) -> int:
        return index if self._ascii else len(self._text[:index].encode())


def _whole(value: Any, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BodyError(field, "expected a whole number >= 0")
    return value


def read(endpoint: Endpoint, raw: bytes) -> Body:
    """The body of a call to `endpoint`; BodyError names the field that cannot be read."""
    try:
        text = raw.decode()
    except UnicodeDecodeError as e:
        raise BodyError("body", f"not UTF-8 (byte {e.start})") from None
    fields, opening = _top_level(text)
    at = _Offsets(text, raw)

    def span(name: str) -> Span:
        _, start, end = fields[name]
        return Span(at(start), at(end))

    model = fields.get("model", (None,))[0]
    if not isinstance(model, str) or not model:
        raise BodyError("model", "required: the model's name")
    stream = fields.get("stream", (None,))[0]
    if stream is not None and not isinstance(stream, bool):
        raise BodyError("stream", "expected true or false")
    reserve, reserve_field = None, None
    for name in endpoint.reserve:
        given = fields.get(name, (None,))[0]
        if given is not None:
            reserve, reserve_field = _whole(given, name), name
            break
    tools_value = fields.get("tools", (None,))[0]
    if tools_value is not None and not isinstance(tools_value, list):
        raise BodyError("tools", "expected an array")
    tools = None
    if tools_value:
        tools_span = span("tools")
        tools = raw[tools_span.start : tools_span.end]

    system, system_span, system_block = None, None, None
    if endpoint.system is not None and fields.get(endpoint.system, (None,))[0] is not None:
        system = fields[endpoint.system][0]
        if not isinstance(system, str | list):
            raise BodyError(endpoint.system, "expected a string or an array")
        system_span = span(endpoint.system)
        system_block = b'{"role":"system","content":' + raw[system_span.start : system_span.end] + b"}"

    messages_value = fields.get(endpoint.messages, (None,))[0]
    messages: Span | None = None
    own: list[bytes] = []  # the body's own blocks, between brackets
    if isinstance(messages_value, str) and endpoint is RESPONSES:
        own = [b'{"role":"user","content":', raw[span("input").start : span("input").end], b"}"]
    elif isinstance(messages_value, list):
        messages = span(endpoint.messages)
        inner = raw[messages.start + 1 : messages.end - 1]
        own = [inner] if inner.strip() else []
    elif messages_value is not None:
        raise BodyError(endpoint.messages, "expected an array")
    blocks: list[bytes] = [b"["]
    if system_block is not None:
        blocks += [system_block, b","] if own else [system_block]
    blocks += [*own, b"]"]
    return Body(
        endpoint=endpoint,
        raw=raw,
        model=model,
        stream=bool(stream),
        blocks=blocks,
        tools=tools,
        reserve=reserve,
        reserve_field=reserve_field,
        messages=messages,
        system=system,
        system_span=system_span,
        system_block=system_block,
        opening=at(opening),
    )


def _elements(array: bytes) -> list[bytes]:
    """The elements of a JSON array's text, each as its own bytes."""
    text = array.decode()
    index = _WS.match(text, 1).end()  # type: ignore[union-attr]
    found: list[bytes] = []
    while text[index] != "]":
        _, end = _SCAN(text, index)
        found.append(text[index:end].encode())
        index = _WS.match(text, end).end()  # type: ignore[union-attr]
        if text[index] == ",":
            index = _WS.match(text, index + 1).end()  # type: ignore[union-attr]
    return found


def _dumps(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False).encode()


def _system_with(body: Body, summary: str) -> tuple[int, int, bytes]:
    """The splice that adds a summary to an Anthropic body's `system`."""
    if body.system_span is None:  # a new first field
        return (body.opening, body.opening, b'"system":' + _dumps(summary) + b",")
    span = body.system_span
    if isinstance(body.system, str):
        return (span.start, span.end, _dumps(f"{body.system}\n\n{summary}" if body.system else summary))
    part = _dumps({"type": "text", "text": summary})
    return (span.end - 1, span.end - 1, (b"," + part) if body.system else part)


def splice(raw: bytes, replacements: Sequence[tuple[int, int, bytes]]) -> bytes:
    """`raw` with each [start, end) replaced (the ranges do not overlap)."""
    out: list[bytes] = []
    at = 0
    for start, end, text in sorted(replacements, key=lambda r: r[0]):
        out += [raw[at:start], text]
        at = end
    out.append(raw[at:])
    return b"".join(out)


def upstream_body(body: Body, kept: bytes, plan: pb.ContextPlan) -> bytes:
    """What goes upstream: the body with its message list replaced by `kept` (the shift's
    `messages_json`: the kept blocks' own bytes, the system block first when the shift got one),
    or the body itself when the shift left it whole."""
    summary = plan.summary if plan.HasField("summary") else None
    if body.messages is None or not (plan.excluded or plan.truncated or summary):
        return body.raw
    head = b"[" + body.system_block if body.system_block is not None else None
    if head is not None and kept.startswith(head) and kept[len(head) : len(head) + 1] in (b",", b"]"):
        kept = b"[" + kept[len(head) + 1 :] if kept[len(head) : len(head) + 1] == b"," else b"[]"
        head = None
    replacements: list[tuple[int, int, bytes]] = []
    if summary is not None or head is not None:  # element by element (rare: a summary was made)
        items = _elements(kept)
        if head is not None:  # the system block, rewritten by a plugin: the body's own goes up
            del items[0]
        if summary is not None:
            at = [d.id for d in plan.kept].index(summary.id) - body.offset
            if body.endpoint.format == "anthropic":
                del items[at]
                replacements.append(_system_with(body, summary.text))
            else:
                items[at] = _dumps({"role": "system", "content": summary.text})
        kept = b"[" + b",".join(items) + b"]"
    replacements.append((body.messages.start, body.messages.end, kept))
    return splice(body.raw, replacements)


def renamed_field(field: str, body: Body) -> str:
    """A shift's error field (`blocks_json[3].content`, `tools_json[1].name`, `strategy`) as the
    caller names it (`messages[2].content`, `tools[1].name`, the strategy header)."""
    found = re.match(r"blocks(?:_json)?\[(\d+)\]", field)
    if found:
        index = int(found.group(1)) - body.offset
        system = body.endpoint.system or "system"
        if index < 0:
            return system + field[found.end() :].replace(".content", "", 1)
        if body.messages is None:
            return body.endpoint.messages
        return f"{body.endpoint.messages}[{index}]{field[found.end() :]}"
    if field.startswith("tools_json"):
        return "tools" + field.removeprefix("tools_json")
    if field == "blocks_json":
        return body.endpoint.messages
    renamed = {
        "strategy": "x-contextshift-strategy",
        "chat_id": "x-chat-id",
        "response_reserve": body.reserve_field or "response_reserve",
    }
    return renamed.get(field, field)


# The error types each provider uses by HTTP status (OpenAI's `error.type`, Anthropic's).
_OPENAI_TYPES = {401: "invalid_request_error", 403: "invalid_request_error", 429: "rate_limit_exceeded"}
_ANTHROPIC_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def error_type(kind: Format, status: int) -> str:
    """The provider's error type for an HTTP status."""
    if kind == "anthropic":
        return _ANTHROPIC_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
    return _OPENAI_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")


def error_body(
    kind: Format, status: int, message: str, *, code: str | None = None, param: str | None = None
) -> bytes:
    """An error answer's body in the provider's shape: OpenAI's `{"error": {message, type, param,
    code}}`, Anthropic's `{"type": "error", "error": {type, message}}`."""
    kind_name = error_type(kind, status)
    if kind == "anthropic":
        return _dumps({"type": "error", "error": {"type": kind_name, "message": message}})
    return _dumps({"error": {"message": message, "type": kind_name, "param": param, "code": code}})
