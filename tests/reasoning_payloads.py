"""Agent loops of reasoning models in the shapes their providers publish, for the reasoning tests
(library, gRPC, output formats).

- OpenAI Responses: the function-calling guide's items (`reasoning` with `encrypted_content`, as
  returned with `include=["reasoning.encrypted_content"]` and `store=false`; `function_call` with its
  `fc_` item id and `call_id`; `function_call_output`), and the reasoning cookbook's final
  `message`.
- Anthropic: the extended-thinking guide's tool-use example (a `thinking` block with its
  `signature`, `text`, `tool_use`, then the `tool_result` in a user message), and a
  `redacted_thinking` block.
- DeepSeek thinking mode: the tool-call example (`reasoning_content` beside `tool_calls`, an empty
  `content`), `get_date` then `get_weather`.
Encrypted payloads and signatures are made up (base64 of the right sizes): only the providers
can make real ones, and contextshift never reads them.
"""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

Block = dict[str, Any]

# The 500 words of reasoning the DeepSeek message carried.
_SENTENCE = ["The", "user", "wants", "tomorrow's", "weather", "in", "Hangzhou,", "so", "I", "need", "the"]
_SENTENCE += ["date", "first", "and", "then", "the", "forecast."]
FIVE_HUNDRED_WORDS = " ".join((_SENTENCE * (500 // len(_SENTENCE) + 1))[:500])


def opaque(seed: str, size: int) -> str:
    """Base64 text of `size` bytes, standing for an encrypted payload or a signature."""
    out = b""
    while len(out) < size:
        out += hashlib.sha256(f"{seed}:{len(out)}".encode()).digest()
    return base64.b64encode(out[:size]).decode()


def responses_loop(steps: int, *, task_first: bool = True, answer: bool = True) -> list[Block]:
    """An OpenAI Responses agent loop: the task, then per step a reasoning item (encrypted), its
    function call and the call's output; a last response of reasoning and the answer message.
    With `task_first` false, a later user turn ("continue") is the current input and the task the
    oldest turn."""
    blocks: list[Block] = [
        {"role": "developer", "content": "You are a travel agent. Use the tools."},
        {"role": "user", "content": "Plan three days in Paris: weather, museums and a dinner booking."},
    ]
    for n in range(steps):
        blocks += [
            {
                "id": f"rs_68a7{n:04d}",
                "type": "reasoning",
                "summary": [{"type": "summary_text", "text": f"Step {n}: check the next thing."}]
                if n % 2
                else [],
                "encrypted_content": "gAAAAA" + opaque(f"rs{n}", 900),
            },
            {
                "id": f"fc_68a7{n:04d}",
                "type": "function_call",
                "status": "completed",
                "call_id": f"call_{n:04d}",
                "name": "get_weather",
                "arguments": json.dumps({"latitude": 48.8566, "longitude": 2.3522, "day": n}),
            },
            {
                "type": "function_call_output",
                "call_id": f"call_{n:04d}",
                "output": json.dumps({"day": n, "temperature": 14 + n, "sky": "cloudy " * 20}),
            },
        ]
    if answer:
        blocks += [
            {
                "id": "rs_68a7final",
                "type": "reasoning",
                "summary": [],
                "encrypted_content": opaque("final", 600),
            },
            {
                "id": "msg_68a7final",
                "type": "message",
                "status": "completed",
                "role": "assistant",
                "content": [
                    {"type": "output_text", "text": "Here is your plan for Paris.", "annotations": []}
                ],
            },
        ]
    if not task_first:
        blocks.append({"role": "user", "content": "continue"})
    return blocks


def anthropic_tool_turn(n: int, thinking: str) -> list[Block]:
    """One step of Anthropic's thinking-with-tools example: thinking, text and tool_use, then the
    tool_result in a user message."""
    tool_id = f"toolu_01CswdEQBMshySk6Y9DFK{n:03d}"
    return [
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": thinking, "signature": opaque(f"sig{n}", 200)},
                {"type": "text", "text": "I can help you get the current weather information for Paris."},
                {"type": "tool_use", "id": tool_id, "name": "get_weather", "input": {"location": "Paris"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": tool_id, "content": f"Current temperature: {80 + n}°F"}
            ],
        },
    ]


THINKING = (
    "The user wants to know the current weather in Paris. I have access to a function `get_weather` "
    "that takes a location. I will call it with Paris, then read the temperature. "
)


def anthropic_loop(steps: int, thinking_repeat: int = 1, *, new_question: bool = False) -> list[Block]:
    """An Anthropic agent loop with interleaved thinking: the question, `steps` tool turns whose
    thinking is `THINKING` repeated, and (with `new_question`) the final answer and a new question,
    which starts a new turn."""
    blocks: list[Block] = [
        {"role": "system", "content": "You are a weather assistant."},
        {"role": "user", "content": "What's the weather in Paris?"},
    ]
    for n in range(steps):
        blocks += anthropic_tool_turn(n, THINKING * thinking_repeat)
    if new_question:
        blocks += [
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "redacted_thinking",
                        "data": "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT" + opaque("red", 300),
                    },
                    {"type": "text", "text": "It is 88°F in Paris."},
                ],
            },
            {"role": "user", "content": "And in Rome?"},
        ]
    return blocks


def deepseek_tool_loop(reasoning: str = FIVE_HUNDRED_WORDS) -> list[Block]:
    """DeepSeek's thinking-mode tool-call example: a turn without tools (its reasoning is ignored),
    then a turn calling get_date and get_weather, each call with its reasoning_content."""
    return [
        {"role": "user", "content": "Hi, who are you?"},
        {
            "role": "assistant",
            "content": "I am DeepSeek.",
            "reasoning_content": "A greeting. Answer briefly.",
        },
        {"role": "user", "content": "How's the weather in Hangzhou tomorrow?"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": reasoning,
            "tool_calls": [
                {
                    "id": "call_00_date",
                    "type": "function",
                    "function": {"name": "get_date", "arguments": "{}"},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_00_date", "content": "2025-12-01"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "Today is 2025-12-01, so tomorrow is 2025-12-02. Now the forecast.",
            "tool_calls": [
                {
                    "id": "call_01_weather",
                    "type": "function",
                    "function": {
                        "name": "get_weather",
                        "arguments": '{"location": "Hangzhou", "date": "2025-12-02"}',
                    },
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_01_weather", "content": "Cloudy 7~13°C"},
    ]


def named(blocks: list[Block]) -> list[Block]:
    """The blocks with an `id` each (the given one, else `#<position>`), for readable decisions."""
    return [{"id": f"#{i}", **b} if "id" not in b else b for i, b in enumerate(blocks)]
