"""Kept blocks → the final messages of a provider's API (OpenAI Chat Completions, Anthropic Messages).

Input is what `shift_context` returns in `messages`: blocks in any shape the engine accepts (OpenAI
chat and Responses items, Anthropic, Vercel AI SDK, contextshift blocks), already validated by the
engine. Each block is read into one neutral form (`Turn`), then written in the target format.

Choices a caller should know:
- Reasoning goes out whole where the target format has a place for it, since providers refuse tool
  loops without it: Anthropic `thinking` and `redacted_thinking` parts (with their signatures) lead
  their assistant message in Anthropic Messages, and a message's `reasoning_content` / `reasoning`
  stays on it in OpenAI Chat (DeepSeek and Moonshot ask it back on tool-call turns). Reasoning of
  another format is not carried over (a provider accepts reasoning only with its own signatures, in
  its own shape), nor are Responses `reasoning` items (Chat Completions has no place for them).
- Anthropic has no system role inside `messages`: every system block's text joins the top-level
  `system` (in order, separated by a blank line); consecutive turns of one role are merged, and tool
  results become `tool_result` parts of a user turn, ahead of its other content.
- Tool-call arguments that are not a JSON object become `{"arguments": <text>}` for Anthropic,
  whose `input` must be an object.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

RESULT_ID_KEYS = ("toolCallId", "tool_call_id", "callId", "call_id", "tool_use_id")
TEXT_PARTS = {"text", "input_text", "output_text", "summary_text", "reasoning_text"}
IMAGE_PARTS = {"image_url", "image", "input_image"}


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text


@dataclass
class Turn:
    """One block in neutral form."""

    role: str  # system, user, assistant, tool
    texts: list[str] = field(default_factory=list)
    images: list[dict[str, Any]] = field(default_factory=list)  # OpenAI `image_url` objects
    calls: list[ToolCall] = field(default_factory=list)
    results: list[tuple[str, str]] = field(default_factory=list)  # (call id, text) from parts
    result_id: str = ""  # the call a tool block answers, from the block's own fields
    thinking: list[dict[str, Any]] = field(default_factory=list)  # Anthropic reasoning parts, verbatim
    reasoning: dict[str, str] = field(default_factory=dict)  # `reasoning_content` / `reasoning`, as given

    @property
    def text(self) -> str:
        return "\n\n".join(t for t in self.texts if t)


def _json_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _image(part: Mapping[str, Any]) -> dict[str, Any]:
    """An OpenAI `image_url` object from any image part."""
    url: Any = part.get("image_url")
    detail = part.get("detail")
    if isinstance(url, Mapping):
        detail = url.get("detail", detail)
        url = url.get("url")
    source = part.get("source")
    if url is None and isinstance(source, Mapping):
        if source.get("type") == "base64":
            url = (
                f"data:{source.get('media_type', 'application/octet-stream')};base64,{source.get('data', '')}"
            )
        else:
            url = source.get("url")
    image: dict[str, Any] = {"url": url if isinstance(url, str) else ""}
    if isinstance(detail, str):
        image["detail"] = detail
    return image


REASONING_PARTS = {"thinking", "redacted_thinking"}
REASONING_FIELDS = ("reasoning_content", "reasoning")


def _read_parts(turn: Turn, parts: Any) -> None:
    if isinstance(parts, str):
        turn.texts.append(parts)
        return
    if not isinstance(parts, list):
        return
    for part in parts:
        kind = part.get("type")
        if kind in TEXT_PARTS:
            turn.texts.append(part.get("text", ""))
        elif kind == "refusal":
            turn.texts.append(part.get("refusal", ""))
        elif kind in IMAGE_PARTS:
            turn.images.append(_image(part))
        elif kind == "tool_use":
            turn.calls.append(ToolCall(part["id"], part.get("name", ""), _json_text(part.get("input", {}))))
        elif kind == "tool-call":
            args = part["input"] if "input" in part else part.get("args", {})
            turn.calls.append(ToolCall(part["toolCallId"], part.get("toolName", ""), _json_text(args)))
        elif kind == "tool_result":
            inner = Turn("tool")
            _read_parts(inner, part.get("content"))
            turn.results.append((part["tool_use_id"], inner.text))
        elif kind == "tool-result":
            output = part["output"] if "output" in part else part.get("result", "")
            turn.results.append((part["toolCallId"], _json_text(output)))
        elif kind in REASONING_PARTS:
            turn.thinking.append(dict(part))


def _result_id(block: Mapping[str, Any]) -> str:
    meta = block.get("meta")
    for source in (block, meta if isinstance(meta, Mapping) else {}):
        for key in RESULT_ID_KEYS:
            value = source.get(key)
            if isinstance(value, str) and value:
                return value
    return ""


def read_turn(block: Mapping[str, Any]) -> Turn:
    """The neutral form of one engine-validated block."""
    item_type = block.get("type")
    implied = {"function_call": "assistant", "function_call_output": "tool", "reasoning": "assistant"}
    role = block.get("role") or implied.get(str(item_type), "user")
    turn = Turn("system" if role == "developer" else str(role))
    if item_type == "reasoning":
        return turn  # reasoning is not carried over
    if item_type == "function_call":
        turn.calls.append(
            ToolCall(block["call_id"], block.get("name", ""), _json_text(block.get("arguments", "")))
        )
        return turn
    if item_type == "function_call_output":
        _read_parts(turn, block.get("output"))
        turn.result_id = block["call_id"]
        return turn
    _read_parts(turn, block.get("content"))
    turn.reasoning = {key: block[key] for key in REASONING_FIELDS if isinstance(block.get(key), str)}
    for call in block.get("tool_calls") or []:
        function = call.get("function")
        source = function if isinstance(function, Mapping) else call
        turn.calls.append(
            ToolCall(call["id"], source.get("name", ""), _json_text(source.get("arguments", "")))
        )
    turn.result_id = _result_id(block)
    return turn


def to_openai_chat(blocks: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI Chat Completions `messages`."""
    out: list[dict[str, Any]] = []
    for turn in map(read_turn, blocks):
        out.extend(
            {"role": "tool", "tool_call_id": call_id, "content": text} for call_id, text in turn.results
        )
        if turn.role == "tool":
            if turn.result_id or not turn.results:
                out.append({"role": "tool", "tool_call_id": turn.result_id, "content": turn.text})
            continue
        if turn.role == "assistant":
            if not (turn.text or turn.calls):
                continue  # e.g. a reasoning item: nothing to send
            message: dict[str, Any] = {"role": "assistant", "content": turn.text or None, **turn.reasoning}
            if turn.calls:
                message["tool_calls"] = [
                    {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                    for c in turn.calls
                ]
            out.append(message)
        elif turn.images:
            content: list[dict[str, Any]] = [{"type": "text", "text": t} for t in turn.texts if t]
            content += [{"type": "image_url", "image_url": image} for image in turn.images]
            out.append({"role": turn.role, "content": content})
        elif turn.texts or not turn.results:
            out.append({"role": turn.role, "content": turn.text})
    return out


def _anthropic_input(arguments: str) -> dict[str, Any]:
    try:
        value = json.loads(arguments) if arguments else {}
    except ValueError:
        value = None
    return value if isinstance(value, dict) else {"arguments": arguments}


def _anthropic_image(image: Mapping[str, Any]) -> dict[str, Any]:
    url = str(image.get("url", ""))
    source: dict[str, str] = {"type": "url", "url": url}
    if url.startswith("data:") and ";base64," in url:
        media_type, data = url[5:].split(";base64,", 1)
        source = {"type": "base64", "media_type": media_type, "data": data}
    return {"type": "image", "source": source}


def to_anthropic_messages(blocks: Sequence[Mapping[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """Anthropic Messages: (top-level `system`, `messages`)."""
    system: list[str] = []
    messages: list[dict[str, Any]] = []
    for turn in map(read_turn, blocks):
        if turn.role == "system":
            if turn.text:
                system.append(turn.text)
            continue
        content: list[dict[str, Any]] = [
            {"type": "tool_result", "tool_use_id": call_id, "content": text} for call_id, text in turn.results
        ]
        if turn.role == "tool" and (turn.result_id or not turn.results):
            content.append({"type": "tool_result", "tool_use_id": turn.result_id, "content": turn.text})
        elif turn.role != "tool":
            content += turn.thinking  # first, as the model wrote them: their signatures cover them
            content += [{"type": "text", "text": t} for t in turn.texts if t]
            content += [_anthropic_image(image) for image in turn.images]
            content += [
                {"type": "tool_use", "id": c.id, "name": c.name, "input": _anthropic_input(c.arguments)}
                for c in turn.calls
            ]
        role = "assistant" if turn.role == "assistant" else "user"
        if not content:
            continue
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"].extend(content)
        else:
            messages.append({"role": role, "content": content})
    # Within a merged user turn, tool results must come first.
    for message in messages:
        message["content"].sort(key=lambda part: part["type"] != "tool_result")
    return "\n\n".join(system), messages
