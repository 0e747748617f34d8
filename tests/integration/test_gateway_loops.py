"""Agent loops through the gateway, each format over its model's window, driven by the official SDKs
as a user's loop drives them (the model's answer appended as the SDK returned it, then the tool's
result): a Chat Completions tool loop, a Responses loop of reasoning and function calls, an
Anthropic loop with signed thinking. At every turn the provider (tests/fake_provider.py, which
refuses a prompt over the window by its own count, as a provider does) receives whole groups,
the system prompt, and the latest turn; reasoning and signatures come back untouched."""

from __future__ import annotations

from typing import Any

import anthropic
import openai
import pytest
from fake_provider import FakeProvider

from .conftest import ServerProcess
from .gateway_support import (
    ANTHROPIC_MODEL,
    OPENAI_MODEL,
    SMALL_WINDOW,
    check_anthropic_groups,
    check_openai_groups,
    check_responses_groups,
    module_gateway,
    module_provider,
    settled,
)

KEY = "sk-loop-0123456789"
SYSTEM = "You are a research agent. Use the search tool, then answer."
TURNS = 12
RESERVE = 500


def tool_output(turn: int) -> str:
    """About 1,000 tokens: a dozen of these are twice the window."""
    return "\n".join(f"result {turn}.{line}: rivers carry sediment to the delta" for line in range(110))


fake = pytest.fixture(scope="module", name="fake")(module_provider)
server = pytest.fixture(scope="module", name="server")(module_gateway)


def test_a_chat_completions_tool_loop(server: ServerProcess, fake: FakeProvider) -> None:
    client = openai.OpenAI(base_url=f"{server.http_url}/v1", api_key=KEY, max_retries=0)
    tools: list[Any] = [
        {
            "type": "function",
            "function": {
                "name": "search",
                "description": "Search the documents",
                "parameters": {"type": "object", "properties": {"q": {"type": "integer"}}},
            },
        }
    ]
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "What do rivers carry?"},
    ]
    for turn in range(TURNS):
        sent = list(messages)
        options: dict[str, Any] = {
            "model": OPENAI_MODEL,
            "messages": messages,
            "tools": tools,
            "max_completion_tokens": RESERVE,
            "extra_headers": {"x-chat-id": "tool-loop"},
        }
        if turn % 2:  # the usage comes in the stream's last chunk when asked for
            with client.chat.completions.stream(**options, stream_options={"include_usage": True}) as stream:
                message = stream.get_final_completion().choices[0].message
        else:
            message = client.chat.completions.create(**options).choices[0].message
        received = fake.last.body["messages"]
        check_openai_groups(received)
        assert received[0] == sent[0] and received[-1] == sent[-1]  # the system prompt, the latest turn
        assert fake.last.body["tools"] == tools and fake.last.body["max_completion_tokens"] == RESERVE
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls or []:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": tool_output(turn)})
    assert len(received) < len(sent)  # over the window, the oldest steps went
    closed = settled(server, "tool-loop")
    assert closed["status"] == "GENERATION_STATUS_COMPLETED"
    assert int(closed["reportedPromptTokens"]) + RESERVE <= SMALL_WINDOW


def test_a_responses_loop_of_reasoning_and_function_calls(server: ServerProcess, fake: FakeProvider) -> None:
    client = openai.OpenAI(base_url=f"{server.http_url}/v1", api_key=KEY, max_retries=0)
    tools: list[Any] = [
        {
            "type": "function",
            "name": "search",
            "description": "Search the documents",
            "parameters": {"type": "object", "properties": {"q": {"type": "integer"}}},
        }
    ]
    items: list[Any] = [{"role": "user", "content": "What do rivers carry?"}]
    sent_reasoning: dict[str, Any] = {}
    for turn in range(TURNS):
        sent = list(items)
        options: dict[str, Any] = {
            "model": OPENAI_MODEL,
            "instructions": SYSTEM,
            "input": items,
            "tools": tools,
            "max_output_tokens": RESERVE,
            "extra_headers": {"x-chat-id": "responses-loop"},
        }
        if turn % 2:
            with client.responses.stream(**options) as stream:
                response = stream.get_final_response()
        else:
            response = client.responses.create(**options)
        received = fake.last.body["input"]
        check_responses_groups(received)
        assert fake.last.body["instructions"] == SYSTEM
        assert received[0] == sent[0] and received[-1] == sent[-1]  # the user's task, the latest result
        for item in received:
            if item.get("type") == "reasoning":
                assert item == sent_reasoning[item["id"]]  # never edited
        output = [item.model_dump(exclude_none=True) for item in response.output]
        sent_reasoning.update({i["id"]: i for i in output if i["type"] == "reasoning"})
        items += output
        call = next(i for i in response.output if i.type == "function_call")
        items.append({"type": "function_call_output", "call_id": call.call_id, "output": tool_output(turn)})
    assert len(received) < len(sent)
    assert settled(server, "responses-loop")["status"] == "GENERATION_STATUS_COMPLETED"


def test_an_anthropic_loop_with_signed_thinking(server: ServerProcess, fake: FakeProvider) -> None:
    client = anthropic.Anthropic(base_url=server.http_url, api_key=KEY, max_retries=0)
    tools: list[Any] = [
        {
            "name": "search",
            "description": "Search the documents",
            "input_schema": {"type": "object", "properties": {"q": {"type": "integer"}}},
        }
    ]
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What do rivers carry?"}]
    signatures: dict[str, str] = {}
    for turn in range(TURNS):
        sent = list(messages)
        options: dict[str, Any] = {
            "model": ANTHROPIC_MODEL,
            "max_tokens": RESERVE,
            "system": SYSTEM,
            "thinking": {"type": "enabled", "budget_tokens": RESERVE // 2},
            "tools": tools,
            "messages": messages,
            "extra_headers": {"x-chat-id": "thinking-loop"},
        }
        if turn % 2:
            with client.messages.stream(**options) as stream:
                answer = stream.get_final_message()
        else:
            answer = client.messages.create(**options)
        received = fake.last.body
        check_anthropic_groups(received["messages"])
        assert received["system"] == SYSTEM and received["thinking"] == options["thinking"]
        assert received["messages"][0] == sent[0] and received["messages"][-1] == sent[-1]
        for message in received["messages"]:
            for part in message["content"] if isinstance(message["content"], list) else []:
                if part["type"] == "thinking":
                    assert signatures[part["thinking"]] == part["signature"]  # as the provider signed it
        content = [block.model_dump(exclude_none=True) for block in answer.content]
        signatures.update({b["thinking"]: b["signature"] for b in content if b["type"] == "thinking"})
        messages.append({"role": "assistant", "content": content})
        use = next(b for b in answer.content if b.type == "tool_use")
        messages.append(
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": use.id, "content": tool_output(turn)}],
            }
        )
    assert len(received["messages"]) < len(sent)
    closed = settled(server, "thinking-loop")
    assert closed["status"] == "GENERATION_STATUS_COMPLETED"
    assert closed["provider"] == "anthropic"
