"""Reasoning models' agent loops over gRPC (`blocks_json` and typed blocks, the real server):
reasoning kept with its calls, never edited, counted by the provider's rule and said so in the
plan, and carried into the output formats that have a place for it."""

from __future__ import annotations

import json
from typing import Any

import grpc
from google.protobuf import struct_pb2
from reasoning_payloads import anthropic_loop, deepseek_tool_loop, named, responses_loop

import contextshift
from contextshift._proto.contextshift.v1 import block_pb2, context_service_pb2_grpc
from contextshift._proto.contextshift.v1 import context_service_pb2 as pb


def shift(channel: grpc.Channel, blocks: list[dict[str, Any]], **fields: Any) -> pb.ContextPlan:
    options = fields.pop("options", None)
    request = pb.ShiftContextRequest(blocks_json=json.dumps(blocks), response_reserve=0, **fields)
    if options:
        request.options.update(options)
    stub = context_service_pb2_grpc.ContextShiftServiceStub(channel)
    return stub.ShiftContext(request, timeout=20).plan


def test_responses_loop_over_grpc_keeps_items_with_their_reasoning(channel: grpc.Channel) -> None:
    blocks = named(responses_loop(10))
    library = contextshift.shift_context(blocks, budget=10**9, profile="o200k_base")
    plan = shift(channel, blocks, profile="o200k_base", context_limit=library.prompt_tokens * 3 // 5)
    assert plan.reasoning_rule == "current_turn"
    kept = [d.id for d in plan.kept]
    for n in range(10):
        assert (f"rs_68a7{n:04d}" in kept) == (f"fc_68a7{n:04d}" in kept), n
    assert {d.reason for d in plan.excluded} <= {"BUDGET_OLDEST_FIRST", "TOOL_GROUP", "LEADING_ASSISTANT"}
    # The last user message is the task: every step is the current turn, so all reasoning counts.
    assert plan.reasoning and all(r.counted and r.basis == "estimated" for r in plan.reasoning)
    assert [r.id for r in plan.reasoning] == [i for i in kept if i.startswith("rs_")]
    # The kept blocks go out as the caller sent them, encrypted content and all.
    sent = json.loads(plan.messages.messages_json)
    assert sent == [b for b in blocks if b["id"] in kept]
    same = contextshift.shift_context(blocks, budget=plan.budget, profile="o200k_base")
    assert [(d.id, d.tokens, d.reason) for d in plan.kept] == [(d.id, d.tokens, d.reason) for d in same.kept]


def test_anthropic_thinking_over_grpc_goes_whole_and_out_with_its_signature(channel: grpc.Channel) -> None:
    blocks = named(anthropic_loop(4, thinking_repeat=2, new_question=True))
    plan = shift(
        channel,
        blocks,
        profile="anthropic",
        context_limit=100_000,
        options={"max_block_chars": 300},
        output_format=pb.OUTPUT_FORMAT_ANTHROPIC_MESSAGES,
    )
    assert [(d.id, d.reason) for d in plan.excluded] == [
        ("#2", "REASONING_OVER_CAP"),
        ("#3", "TOOL_GROUP"),
        ("#4", "REASONING_OVER_CAP"),
        ("#5", "TOOL_GROUP"),
        ("#6", "REASONING_OVER_CAP"),
        ("#7", "TOOL_GROUP"),
        ("#8", "REASONING_OVER_CAP"),
        ("#9", "TOOL_GROUP"),
    ]
    assert plan.reasoning_rule == "current_turn"
    [redacted] = plan.reasoning
    assert (redacted.id, redacted.counted, redacted.basis) == ("#10", False, "estimated")
    messages = json.loads(plan.messages.messages_json)
    assistant = [m for m in messages if m["role"] == "assistant"]
    assert assistant[-1]["content"][0] == blocks[10]["content"][0]  # redacted_thinking, as sent

    # Within the cap, the loop's thinking goes out first in each assistant message, unchanged.
    plan = shift(
        channel,
        blocks,
        profile="anthropic",
        context_limit=100_000,
        output_format=pb.OUTPUT_FORMAT_ANTHROPIC_MESSAGES,
    )
    messages = json.loads(plan.messages.messages_json)
    given = [b["content"] for b in blocks if b["role"] == "assistant"]
    sent = [m["content"] for m in messages if m["role"] == "assistant"]
    assert [c[0] for c in sent] == [c[0] for c in given]
    assert plan.messages.system == "You are a weather assistant."


def test_deepseek_reasoning_content_over_grpc_counted_and_sent_back(channel: grpc.Channel) -> None:
    blocks = named(deepseek_tool_loop())
    plan = shift(
        channel,
        blocks,
        profile="deepseek_v3",
        context_limit=100_000,
        output_format=pb.OUTPUT_FORMAT_OPENAI_CHAT,
    )
    assert plan.reasoning_rule == "tool_turns"
    assert [(r.id, r.counted, r.basis) for r in plan.reasoning] == [
        ("#1", False, "text"),
        ("#3", True, "text"),
        ("#5", True, "text"),
    ]
    tokens = {d.id: d.tokens for d in plan.kept}
    assert tokens["#3"] > 500  # 500 words of reasoning_content, not 9 tokens
    messages = json.loads(plan.messages.messages_json)
    calls = [m for m in messages if m.get("tool_calls")]
    # DeepSeek refuses a tool-call turn sent back without its reasoning_content.
    assert [m["reasoning_content"] for m in calls] == [
        blocks[3]["reasoning_content"],
        blocks[5]["reasoning_content"],
    ]


def test_keep_reasoning_turns_over_grpc(channel: grpc.Channel) -> None:
    blocks = named(anthropic_loop(6, thinking_repeat=4))
    size = contextshift.shift_context(blocks, budget=10**9).prompt_tokens
    plan = shift(channel, blocks, context_limit=size - 400, options={"keep_reasoning_turns": 2})
    assert not plan.excluded
    cleared = [t.id for t in plan.truncated if t.how == "REASONING_CLEARED"]
    assert cleared and "#12" not in cleared
    assert any(d.event == "REASONING_CLEARED" for d in plan.diagnostics)
    sent = {m["id"]: m for m in json.loads(plan.messages.messages_json)}
    assert all(p["type"] != "thinking" for i in cleared for p in sent[i]["content"])


def test_profiles_say_their_reasoning_rule(channel: grpc.Channel) -> None:
    stub = context_service_pb2_grpc.ContextShiftServiceStub(channel)
    profiles = stub.ListTokenizerProfiles(pb.ListTokenizerProfilesRequest(), timeout=10).profiles
    rules = {p.name: p.reasoning_rule for p in profiles}
    assert rules["o200k_base"] == rules["anthropic"] == rules["qwen"] == "current_turn"
    assert rules["deepseek_v3"] == "tool_turns" and rules["heuristic"] == "all"
    assert all(p.reasoning_source for p in profiles)


def test_a_model_that_keeps_every_turns_thinking_counts_it_all(channel: grpc.Channel) -> None:
    blocks = named(anthropic_loop(2, new_question=True))
    plan = shift(channel, blocks, model="claude-opus-4-5", context_limit=100_000)
    assert plan.reasoning_rule == "all" and all(r.counted for r in plan.reasoning)


def typed(block: dict[str, Any]) -> block_pb2.Block:
    """An Anthropic or DeepSeek block of the payloads as a typed block (tool_use parts become the
    block's tool calls)."""
    roles = {
        "system": block_pb2.ROLE_SYSTEM,
        "user": block_pb2.ROLE_USER,
        "assistant": block_pb2.ROLE_ASSISTANT,
    }
    roles["tool"] = block_pb2.ROLE_TOOL
    out = block_pb2.Block(
        id=block["id"], role=roles[block["role"]], reasoning_content=block.get("reasoning_content", "")
    )
    content = block.get("content")
    if isinstance(content, str):
        out.content = content
    for part in content if isinstance(content, list) else []:
        kind = part["type"]
        if kind == "thinking":
            out.parts.add(thinking=block_pb2.Thinking(thinking=part["thinking"], signature=part["signature"]))
        elif kind == "redacted_thinking":
            out.parts.add(redacted_thinking=block_pb2.RedactedThinking(data=part["data"]))
        elif kind == "text":
            out.parts.add(text=part["text"])
        elif kind == "tool_result":
            out.parts.add(
                tool_result=block_pb2.ToolResult(tool_call_id=part["tool_use_id"], content=part["content"])
            )
        else:
            out.tool_calls.add(id=part["id"], name=part["name"], arguments=json.dumps(part["input"]))
    for call in block.get("tool_calls", []):
        function = call["function"]
        out.tool_calls.add(id=call["id"], name=function["name"], arguments=function["arguments"])
    if "tool_call_id" in block:
        out.tool_call_id = block["tool_call_id"]
    return out


def test_typed_blocks_carry_reasoning_as_json_does(channel: grpc.Channel) -> None:
    stub = context_service_pb2_grpc.ContextShiftServiceStub(channel)
    for blocks, output_format in [
        (named(anthropic_loop(5, thinking_repeat=3, new_question=True)), pb.OUTPUT_FORMAT_ANTHROPIC_MESSAGES),
        (named(deepseek_tool_loop()), pb.OUTPUT_FORMAT_OPENAI_CHAT),
    ]:
        common: dict[str, Any] = {"context_limit": 900, "response_reserve": 0, "output_format": output_format}
        common["options"] = struct_pb2.Struct()
        common["options"].update({"max_block_chars": 400, "keep_reasoning_turns": 1})
        as_json = stub.PreviewContext(
            pb.PreviewContextRequest(blocks_json=json.dumps(blocks), **common), timeout=20
        )
        as_typed = stub.PreviewContext(
            pb.PreviewContextRequest(blocks=[typed(b) for b in blocks], **common), timeout=20
        )
        assert as_json.plan.excluded and as_json.plan.reasoning
        assert as_typed.plan == as_json.plan
