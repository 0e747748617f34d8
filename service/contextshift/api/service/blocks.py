"""Typed blocks (`contextshift.v1.Block`) as the engine's block dicts, and the engine's field paths
over such dicts named as the request's fields (`blocks[2].parts[1].tool_result.tool_call_id`)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from google.protobuf import json_format

from contextshift._proto.contextshift.v1 import block_pb2
from contextshift.api import rules
from contextshift.api.service.rpc_status import invalid
from contextshift.errors import FieldViolation, InvalidInput

_ROLES = {
    block_pb2.ROLE_SYSTEM: "system",
    block_pb2.ROLE_USER: "user",
    block_pb2.ROLE_ASSISTANT: "assistant",
    block_pb2.ROLE_TOOL: "tool",
}
_KINDS = {
    block_pb2.BLOCK_KIND_SYSTEM: "system",
    block_pb2.BLOCK_KIND_CHARACTER: "character",
    block_pb2.BLOCK_KIND_PERSONA: "persona",
    block_pb2.BLOCK_KIND_LOREBOOK: "lorebook",
    block_pb2.BLOCK_KIND_MEMORY: "memory",
    block_pb2.BLOCK_KIND_SUMMARY: "summary",
    block_pb2.BLOCK_KIND_MESSAGE: "message",
}


def _part(part: block_pb2.Part, at: str) -> dict[str, Any]:
    which = part.WhichOneof("part")
    if which == "text":
        return {"type": "text", "text": part.text}
    if which == "image":
        image: dict[str, Any] = {"url": part.image.url}
        if part.image.detail:
            image["detail"] = part.image.detail
        out: dict[str, Any] = {"type": "image_url", "image_url": image}
        if part.image.width:
            out["width"] = part.image.width
        if part.image.height:
            out["height"] = part.image.height
        return out
    if which == "tool_result":
        return {
            "type": "tool_result",
            "tool_use_id": part.tool_result.tool_call_id,
            "content": part.tool_result.content,
        }
    if which == "thinking":
        return {"type": "thinking", "thinking": part.thinking.thinking, "signature": part.thinking.signature}
    if which == "redacted_thinking":
        return {"type": "redacted_thinking", "data": part.redacted_thinking.data}
    raise invalid(at, rules.ONEOF_REQUIRED[block_pb2.Part.DESCRIPTOR.full_name][1])


def block_dict(block: block_pb2.Block, at: str) -> dict[str, Any]:
    """A typed block as the engine's block dict; `at` names it in errors (`blocks[3]`)."""
    out: dict[str, Any] = {}
    if block.id:
        out["id"] = block.id
    if block.role != block_pb2.ROLE_UNSPECIFIED:
        if block.role not in _ROLES:
            raise invalid(f"{at}.role", f"unknown role value {block.role}")
        out["role"] = _ROLES[block.role]
    if block.kind != block_pb2.BLOCK_KIND_UNSPECIFIED:
        if block.kind not in _KINDS:
            raise invalid(f"{at}.kind", f"unknown kind value {block.kind}")
        out["kind"] = _KINDS[block.kind]
    if block.parts:
        if block.content:
            raise invalid(f"{at}.content", "set either content or parts, not both")
        out["content"] = [_part(p, f"{at}.parts[{i}]") for i, p in enumerate(block.parts)]
    else:
        out["content"] = block.content
    if block.tool_calls:
        out["tool_calls"] = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in block.tool_calls]
    if block.tool_call_id:
        out["tool_call_id"] = block.tool_call_id
    if block.reasoning_content:
        out["reasoning_content"] = block.reasoning_content
    for flag in ("pinned", "mandatory", "injected"):
        if getattr(block, flag):
            out[flag] = True
    if block.HasField("relevance"):
        out["relevance"] = block.relevance
    if block.HasField("meta"):
        out["meta"] = json_format.MessageToDict(block.meta)
    return out


_TYPED_PATHS = [
    (re.compile(r"\.content\[(\d+)\]\.tool_use_id"), r".parts[\1].tool_result.tool_call_id"),
    (re.compile(r"\.content\[(\d+)\]\.content"), r".parts[\1].tool_result.content"),
    (re.compile(r"\.content\[(\d+)\]\.(?:image_url\.)?(url|detail|width|height)"), r".parts[\1].image.\2"),
    (re.compile(r"\.content\[(\d+)\]"), r".parts[\1]"),
]


def typed_field(field: str, item_prefix: str = "") -> str:
    """A library path over blocks built by `block_dict` → the proto field path:
    `blocks[2].content[1].tool_use_id` → `blocks[2].parts[1].tool_result.tool_call_id`;
    with `item_prefix=".block"`, `items[0].role` → `items[0].block.role`."""
    head, sep, rest = field.partition("]")
    if not sep:
        return field
    if rest.startswith(".content[") or rest == ".content":
        for pattern, replacement in _TYPED_PATHS:
            rest, count = pattern.subn(replacement, rest, count=1)
            if count:
                break
    return f"{head}]{item_prefix}{rest}"


def renamed(error: InvalidInput, rename: Callable[[str], str]) -> InvalidInput:
    """`error` with its fields renamed."""
    return type(error)([FieldViolation(rename(v.field), v.description) for v in error.violations])
