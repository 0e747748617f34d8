"""Kept blocks in any accepted shape → OpenAI Chat Completions and Anthropic Messages."""

from __future__ import annotations

import json
from typing import Any

from reasoning_payloads import THINKING, anthropic_tool_turn, deepseek_tool_loop, responses_loop

from contextshift.provider_messages import read_turn, to_anthropic_messages, to_openai_chat

OPENAI_STYLE: list[dict[str, Any]] = [
    {"role": "system", "content": "Be brief."},
    {"role": "developer", "content": "Use tools."},
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "18C"},
    {"role": "assistant", "content": "18C and sunny."},
]


def test_openai_chat_passes_openai_shapes_through() -> None:
    out = to_openai_chat(OPENAI_STYLE)
    assert out[1] == {"role": "system", "content": "Use tools."}
    assert out[3] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    }
    assert out[4] == {"role": "tool", "tool_call_id": "c1", "content": "18C"}
    assert [m["role"] for m in out] == ["system", "system", "user", "assistant", "tool", "assistant"]


def test_anthropic_from_openai_shapes() -> None:
    system, messages = to_anthropic_messages(OPENAI_STYLE)
    assert system == "Be brief.\n\nUse tools."
    assert messages == [
        {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "c1", "name": "weather", "input": {"city": "Paris"}}],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c1", "content": "18C"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "18C and sunny."}]},
    ]


ANTHROPIC_STYLE: list[dict[str, Any]] = [
    {
        "role": "user",
        "content": [
            {"type": "text", "text": "Look:"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAA="}},
        ],
    },
    {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "hmm", "signature": "s"},
            {"type": "tool_use", "id": "t1", "name": "zoom", "input": {"x": 1}},
        ],
    },
    {
        "role": "user",
        "content": [
            {"type": "text", "text": "and?"},
            {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "zoomed"}]},
        ],
    },
]


def test_openai_from_anthropic_shapes_splits_tool_results_and_drops_thinking() -> None:
    out = to_openai_chat(ANTHROPIC_STYLE)
    assert out[0] == {
        "role": "user",
        "content": [
            {"type": "text", "text": "Look:"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAA="}},
        ],
    }
    assert out[1] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "t1", "type": "function", "function": {"name": "zoom", "arguments": '{"x": 1}'}}
        ],
    }
    assert out[2:] == [
        {"role": "tool", "tool_call_id": "t1", "content": "zoomed"},
        {"role": "user", "content": "and?"},
    ]


def test_anthropic_round_trip_puts_tool_results_first_and_keeps_base64_images() -> None:
    _, messages = to_anthropic_messages(ANTHROPIC_STYLE)
    assert messages[0]["content"][1] == {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": "AAA="},
    }
    assert messages[1]["content"] == [
        {"type": "thinking", "thinking": "hmm", "signature": "s"},
        {"type": "tool_use", "id": "t1", "name": "zoom", "input": {"x": 1}},
    ]
    assert [p["type"] for p in messages[2]["content"]] == ["tool_result", "text"]


def test_responses_and_vercel_items() -> None:
    blocks: list[dict[str, Any]] = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "thinking"}]},
        {"type": "function_call", "call_id": "f1", "name": "search", "arguments": "not json"},
        {"type": "function_call_output", "call_id": "f1", "output": "found"},
        {
            "role": "assistant",
            "content": [{"type": "tool-call", "toolCallId": "v1", "toolName": "calc", "input": {"a": 2}}],
        },
        {"role": "tool", "content": [{"type": "tool-result", "toolCallId": "v1", "output": {"value": 4}}]},
    ]
    out = to_openai_chat(blocks)
    # The reasoning item is not carried over.
    assert [m["role"] for m in out] == ["user", "assistant", "tool", "assistant", "tool"]
    assert out[2] == {"role": "tool", "tool_call_id": "f1", "content": "found"}
    assert out[4] == {"role": "tool", "tool_call_id": "v1", "content": '{"value": 4}'}
    _, messages = to_anthropic_messages(blocks)
    # Non-object arguments are wrapped for Anthropic's `input`.
    assert messages[1]["content"] == [
        {"type": "tool_use", "id": "f1", "name": "search", "input": {"arguments": "not json"}}
    ]
    assert messages[3]["content"][0]["input"] == {"a": 2}
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant", "user"]


def test_consecutive_turns_of_one_role_merge_for_anthropic() -> None:
    _, messages = to_anthropic_messages([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
    assert messages == [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    ]


def test_result_id_from_meta_and_other_spellings() -> None:
    assert read_turn({"role": "tool", "meta": {"toolCallId": "m1"}, "content": "x"}).result_id == "m1"
    assert read_turn({"role": "tool", "callId": "c9", "content": "x"}).result_id == "c9"
    assert to_openai_chat([{"role": "tool", "tool_use_id": "u1", "content": "r"}]) == [
        {"role": "tool", "tool_call_id": "u1", "content": "r"}
    ]


def test_reasoning_goes_out_whole_where_the_format_has_a_place_for_it() -> None:
    # Anthropic's thinking with tools: thinking and redacted thinking lead their message, verbatim
    # (their signatures cover them); a new Anthropic message is built around them.
    turn = anthropic_tool_turn(0, THINKING)
    redacted = {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix"}
    turn[0]["content"].insert(1, redacted)
    _, messages = to_anthropic_messages(turn)
    assert messages[0]["content"][:2] == [turn[0]["content"][0], redacted]
    assert [p["type"] for p in messages[0]["content"]] == [
        "thinking",
        "redacted_thinking",
        "text",
        "tool_use",
    ]
    # DeepSeek's tool-call turns keep their reasoning_content in Chat Completions (it is asked back).
    chat = to_openai_chat(deepseek_tool_loop("think"))
    assert [m.get("reasoning_content") for m in chat if m.get("tool_calls")] == [
        "think",
        "Today is 2025-12-01, so tomorrow is 2025-12-02. Now the forecast.",
    ]
    vllm = to_openai_chat([{"role": "assistant", "content": "2", "reasoning": "1+1"}])
    assert vllm == [{"role": "assistant", "content": "2", "reasoning": "1+1"}]
    # Reasoning of another format has no signature there: not carried over.
    assert all("reasoning_content" not in m and "thinking" not in json.dumps(m) for m in to_openai_chat(turn))
    _, from_chat = to_anthropic_messages(deepseek_tool_loop("think"))
    assert all(p["type"] not in {"thinking", "redacted_thinking"} for m in from_chat for p in m["content"])
    _, from_items = to_anthropic_messages(responses_loop(1))
    assert all(p["type"] != "thinking" for m in from_items for p in m["content"])
