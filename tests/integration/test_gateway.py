"""The gateway as a user meets it: the official `openai` and `anthropic` SDKs (sync, async,
streamed) pointed at a real contextshift server, which fits each request and forwards it to a real
HTTP server on 127.0.0.1 playing the provider (tests/fake_provider.py). What goes upstream is the
caller's body with only its message list replaced, byte for byte; the answer comes back as the
provider sent it, with what the shift did in x-contextshift-* headers; errors come in the
provider's shape."""

from __future__ import annotations

import asyncio
import json
import socket
import statistics
import time

import anthropic
import httpx
import openai
import pytest
from fake_provider import FakeProvider

from .conftest import ServerProcess
from .gateway_support import (
    ANTHROPIC_MODEL,
    OPENAI_MODEL,
    audit,
    contextshift_headers,
    module_gateway,
    module_provider,
    reset_provider,
    sent_messages,
    settled,
)

KEY = "sk-caller-0123456789"
SYSTEM = "You are a careful assistant. Keep answers short."


fake = pytest.fixture(scope="module", name="fake")(module_provider)
server = pytest.fixture(scope="module", name="server")(module_gateway)
fresh = pytest.fixture(autouse=True, name="fresh")(reset_provider)


def openai_client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.http_url}/v1", api_key=KEY, max_retries=0)


def anthropic_client(server: ServerProcess) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.http_url, api_key=KEY, max_retries=0)


def long_chat(turns: int, size: int = 600) -> list[dict[str, str]]:
    """A chat of `turns` user/assistant pairs of about `size` tokens each, then a question."""
    chat = [{"role": "system", "content": SYSTEM}]
    for i in range(turns):
        chat.append(
            {"role": "user", "content": f"Question {i}: " + "tell me about rivers and lakes " * (size // 6)}
        )
        chat.append(
            {
                "role": "assistant",
                "content": f"Answer {i}: " + "rivers flow into lakes and seas " * (size // 6),
            }
        )
    chat.append({"role": "user", "content": "And the oceans?"})
    return chat


# --- OpenAI Chat Completions ---------------------------------------------------------------------


def test_chat_completions_through_the_sdk_sync_async_and_streamed(
    server: ServerProcess, fake: FakeProvider
) -> None:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hi"}]
    client = openai_client(server)
    raw = client.chat.completions.with_raw_response.create(model="gpt-4o", messages=messages)
    assert raw.parse().choices[0].message.content == "done"
    headers = contextshift_headers(raw.headers)
    assert headers["x-contextshift-kept"] == "2" and headers["x-contextshift-excluded"] == "0"
    assert (
        headers["x-contextshift-approximate"] == "false" and headers["x-contextshift-profile"] == "o200k_base"
    )
    assert (
        int(headers["x-contextshift-budget"]) == 128_000 - 16_384
    )  # the registry's window less its max output
    assert raw.headers["x-request-id"] == "req_fake"  # the provider's own headers come through
    received = fake.last
    assert received.path == "/v1/chat/completions"
    assert received.headers["authorization"] == f"Bearer {KEY}"
    assert received.body["messages"] == messages

    async def async_call() -> str | None:
        async with openai.AsyncOpenAI(
            base_url=f"{server.http_url}/v1", api_key=KEY, max_retries=0
        ) as aclient:
            answer = await aclient.chat.completions.create(model="gpt-4o", messages=messages)
            return answer.choices[0].message.content

    assert asyncio.run(async_call()) == "done"

    stream = client.chat.completions.create(
        model="gpt-4o",
        messages=messages,
        stream=True,
        stream_options={"include_usage": True},
        extra_headers={"x-chat-id": "chat-stream"},
    )
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "part0 part1 part2 "
    assert chunks[-1].usage is not None
    closed = settled(server, "chat-stream")
    assert closed["status"] == "GENERATION_STATUS_COMPLETED"
    assert int(closed["reportedPromptTokens"]) == chunks[-1].usage.prompt_tokens
    assert closed["provider"] == "openai" and closed["model"] == "gpt-4o"


def test_the_body_goes_upstream_byte_for_byte_with_only_its_messages_replaced(
    server: ServerProcess, fake: FakeProvider
) -> None:
    """Whitespace, key order, escapes, unknown fields and every value but `messages` stay as the
    caller wrote them; the kept messages are the caller's own bytes."""
    chat = long_chat(12)
    texts = [json.dumps(m, ensure_ascii=False) for m in chat]
    texts[1] = texts[1].replace('"content"', '"name": "ana",  "content"')  # a field of its own
    head = '{ "model" :"gpt-4o-small",\n  "temperature": 0.25, "x_unknown": {"nested": [1, "é\\u00e9"]},\n  "messages": [\n'
    tail = '\n  ],\n  "max_tokens": 500, "metadata": {"k": "v"}, "stream": false }'
    body = (head + ",\n".join(texts) + tail).encode()
    answer = httpx.post(
        f"{server.http_url}/v1/chat/completions", content=body, headers={"authorization": f"Bearer {KEY}"}
    )
    assert answer.status_code == 200, answer.text
    excluded = int(answer.headers["x-contextshift-excluded"])
    assert excluded > 0
    received = fake.last.raw
    kept = sent_messages(received)
    assert kept[0] == texts[0] and kept[-1] == texts[-1]  # the system prompt, the latest turn
    assert kept == [texts[0], *texts[1 + excluded :]]  # the oldest went, the rest as written
    prefix, suffix = head[: head.rindex("[")], tail[tail.index("]") + 1 :]
    assert received == (prefix + "[" + ",".join(kept) + "]" + suffix).encode()
    assert json.loads(received)["x_unknown"] == {"nested": [1, "éé"]}
    # Nothing left out: the body itself goes up.
    small = ('{"model":"gpt-4o",  "messages":[' + ",".join(texts[:1] + texts[-1:]) + '], "seed": 7}').encode()
    assert httpx.post(f"{server.http_url}/v1/chat/completions", content=small).status_code == 200
    assert fake.last.raw == small


def test_a_summary_goes_in_as_a_system_message_where_the_shift_put_it(
    server: ServerProcess, fake: FakeProvider
) -> None:
    chat = long_chat(12)
    answer = openai_client(server).chat.completions.with_raw_response.create(
        model=OPENAI_MODEL,
        messages=chat,
        max_tokens=500,
        extra_headers={"x-contextshift-strategy": "summarize"},
    )
    assert answer.status_code == 200
    received = fake.last.body["messages"]
    summaries = [m for m in received if m["content"].startswith("[Conversation summary]")]
    assert (
        len(summaries) == 1 and set(summaries[0]) == {"role", "content"} and summaries[0]["role"] == "system"
    )
    assert received[0] == chat[0] and received[-1] == chat[-1] and received[-2] is summaries[0]


def test_over_the_window_the_provider_gets_a_prompt_that_fits(
    server: ServerProcess, fake: FakeProvider
) -> None:
    chat = long_chat(20)
    client = openai_client(server)
    answer = client.chat.completions.with_raw_response.create(
        model=OPENAI_MODEL, messages=chat, max_tokens=500
    )
    assert answer.status_code == 200  # the provider refuses a prompt over its window with 400
    usage = answer.parse().usage
    assert usage is not None and usage.prompt_tokens + 500 <= 6000
    assert int(answer.headers["x-contextshift-prompt-tokens"]) <= int(answer.headers["x-contextshift-budget"])
    # Sent as it was, the provider refuses it, and the SDK raises its usual error.
    direct = openai.OpenAI(base_url=fake.openai_url, api_key=KEY, max_retries=0)
    with pytest.raises(openai.BadRequestError) as refused:
        direct.chat.completions.create(model=OPENAI_MODEL, messages=chat, max_tokens=500)
    assert refused.value.code == "context_length_exceeded"


def test_protected_blocks_over_the_window_are_the_providers_context_length_error(
    server: ServerProcess, fake: FakeProvider
) -> None:
    huge = "word " * 9000
    with pytest.raises(openai.BadRequestError) as raised:
        openai_client(server).chat.completions.create(
            model=OPENAI_MODEL, messages=[{"role": "user", "content": huge}], max_tokens=500
        )
    assert raised.value.code == "context_length_exceeded"
    assert "protected" in raised.value.message and "5500" in raised.value.message  # the budget
    with pytest.raises(anthropic.BadRequestError) as anthropic_raised:
        anthropic_client(server).messages.create(
            model=ANTHROPIC_MODEL, max_tokens=500, system=huge, messages=[{"role": "user", "content": "hi"}]
        )
    assert anthropic_raised.value.body["error"]["type"] == "invalid_request_error"
    assert "protected" in anthropic_raised.value.message
    assert fake.requests == []  # nothing went upstream


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b'{"model": "gpt-4o", "messages": [', "messages"),  # where the JSON breaks
        (b"[1]", "body"),
        (b'{"model": "gpt-4o", "messages": {}}', "messages"),
        (b'{"messages": []}', "model"),
        (b'{"model": "gpt-4o", "messages": [], "max_tokens": "many"}', "max_tokens"),
        (
            b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "a"}, {"role": "wizard", "content": "b"}]}',
            "messages[1]",
        ),
        (b'{"model": "gpt-4o", "messages": [], "tools": [{"type": "function", "function": {}}]}', "tools[0]"),
        (b'{"model": "gpt-4o", "messages": [], "messages": []}', "messages"),
    ],
)
def test_a_body_that_cannot_be_read_is_a_400_naming_the_field(
    server: ServerProcess, fake: FakeProvider, body: bytes, field: str
) -> None:
    answer = httpx.post(f"{server.http_url}/v1/chat/completions", content=body)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"].startswith(field), error
    assert fake.requests == []


def test_a_bad_strategy_header_is_named(server: ServerProcess) -> None:
    answer = httpx.post(
        f"{server.http_url}/v1/messages",
        json={
            "model": "claude-sonnet-4-6",
            "max_tokens": 10,
            "messages": [{"role": "user", "content": "hi"}],
        },
        headers={"x-contextshift-strategy": "nonsense"},
    )
    assert answer.status_code == 400
    assert answer.json()["type"] == "error"
    assert answer.json()["error"]["message"].startswith("x-contextshift-strategy")


def test_the_headers_and_the_reserve_are_named_as_the_caller_sent_them(server: ServerProcess) -> None:
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}
    url = f"{server.http_url}/v1/chat/completions"
    too_long = httpx.post(url, json=body, headers={"x-chat-id": "c" * 300})
    assert too_long.status_code == 400 and too_long.json()["error"]["param"] == "x-chat-id"
    too_large = httpx.post(url, json=body | {"max_completion_tokens": 2**60})
    assert too_large.status_code == 400 and too_large.json()["error"]["param"] == "max_completion_tokens"


# --- OpenAI Responses ----------------------------------------------------------------------------


def test_responses_through_the_sdk_with_instructions_and_a_text_input(
    server: ServerProcess, fake: FakeProvider
) -> None:
    client = openai_client(server)
    answer = client.responses.create(
        model="gpt-4o", instructions=SYSTEM, input="hello", extra_headers={"x-chat-id": "resp-1"}
    )
    assert answer.output_text == "done"
    assert fake.last.body["input"] == "hello" and fake.last.body["instructions"] == SYSTEM
    closed = settled(server, "resp-1")
    assert closed["status"] == "GENERATION_STATUS_COMPLETED"
    assert [b["reason"] for b in closed["blocks"]] == ["PROTECTED_SYSTEM", "PINNED"]  # instructions counted
    with client.responses.stream(model="gpt-4o", input=[{"role": "user", "content": "hi"}]) as stream:
        final = stream.get_final_response()
    assert final.output_text == "done"


# --- Anthropic Messages --------------------------------------------------------------------------


def test_messages_through_the_sdk_sync_async_and_streamed(server: ServerProcess, fake: FakeProvider) -> None:
    client = anthropic_client(server)
    messages = [{"role": "user", "content": "hi"}]
    answer = client.messages.with_raw_response.create(
        model="claude-sonnet-4-6",
        max_tokens=100,
        system=SYSTEM,
        messages=messages,
        extra_headers={"x-chat-id": "ant-1"},
    )
    assert answer.parse().content[0].text == "done"
    assert answer.headers["x-contextshift-approximate"] == "true"  # no public tokenizer for Claude
    received = fake.last
    # This SDK sends its key as a bearer token (older ones as x-api-key): as it is, upstream.
    assert received.headers["authorization"] == f"Bearer {KEY}" and "anthropic-version" in received.headers
    assert received.body["system"] == SYSTEM and received.body["messages"] == messages
    closed = settled(server, "ant-1")
    assert closed["status"] == "GENERATION_STATUS_COMPLETED"
    # The provider's input tokens with those read from its cache.
    assert int(closed["reportedPromptTokens"]) == answer.parse().usage.input_tokens + 10

    async def async_call() -> str:
        aclient = anthropic.AsyncAnthropic(base_url=server.http_url, api_key=KEY, max_retries=0)
        async with (
            aclient,
            aclient.messages.stream(model="claude-sonnet-4-6", max_tokens=100, messages=messages) as stream,
        ):
            return await stream.get_final_text()

    assert asyncio.run(async_call()) == "part0 part1 part2 "


def test_an_anthropic_summary_goes_to_the_end_of_system(server: ServerProcess, fake: FakeProvider) -> None:
    chat = long_chat(12)
    system = [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}]
    anthropic_client(server).messages.create(
        model=ANTHROPIC_MODEL,
        max_tokens=500,
        system=system,
        messages=chat[1:],
        extra_headers={"x-contextshift-strategy": "summarize", "x-chat-id": "ant-summary"},
    )
    received = fake.last.body
    assert received["system"][0] == system[0]  # the cached prefix unchanged
    assert received["system"][1]["text"].startswith("[Conversation summary]")
    assert all(m["role"] in ("user", "assistant") for m in received["messages"])
    assert received["messages"][-1] == chat[-1]
    assert audit(server, "ant-summary")["plan"]["summary"]["text"] == received["system"][1]["text"]


def test_count_tokens_is_answered_by_the_models_profile(server: ServerProcess, fake: FakeProvider) -> None:
    client = anthropic_client(server)
    messages = [{"role": "user", "content": "How many tokens is this?"}]
    tools = [
        {"name": "lookup", "description": "Look it up", "input_schema": {"type": "object", "properties": {}}}
    ]
    counted = client.messages.with_raw_response.count_tokens(
        model="claude-sonnet-4-6", system=SYSTEM, messages=messages, tools=tools
    )
    preview = httpx.post(
        f"{server.http_url}/api/v2/context-preview",
        json={
            "blocksJson": json.dumps([{"role": "system", "content": SYSTEM}, *messages]),
            "toolsJson": json.dumps(tools),
            "model": "claude-sonnet-4-6",
            "contextLimit": 1_000_000,
            "responseReserve": 0,
        },
    ).json()["plan"]
    assert counted.parse().input_tokens == int(preview["promptTokens"]) + int(preview["toolsTokens"])
    assert counted.headers["x-contextshift-approximate"] == "true"
    assert fake.requests == []  # answered locally


def test_models_are_relayed_to_the_openai_upstream(server: ServerProcess, fake: FakeProvider) -> None:
    assert [m.id for m in openai_client(server).models.list()] == ["gpt-4o"]
    assert fake.last.path == "/v1/models" and fake.last.headers["authorization"] == f"Bearer {KEY}"


def test_a_model_is_relayed_by_its_id_and_no_other_path_is(server: ServerProcess, fake: FakeProvider) -> None:
    assert httpx.get(f"{server.http_url}/v1/models/meta-llama/Llama-3:8b").status_code == 200
    assert fake.last.path == "/v1/models/meta-llama/Llama-3:8b"
    fake.reset()
    with socket.create_connection(("127.0.0.1", server.http_port)) as sock:  # as sent, not normalized
        sock.sendall(b"GET /v1/models/x/../../admin HTTP/1.1\r\nhost: gateway\r\nconnection: close\r\n\r\n")
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 404")
    assert fake.requests == []


def test_an_unknown_model_counts_with_the_heuristic_says_so_and_calibrates(
    server: ServerProcess, fake: FakeProvider
) -> None:
    """No chat, but an approximate count: the generation is stored, and the provider's reported
    prompt tokens calibrate the model's later counts."""
    client = openai_client(server)
    messages = [{"role": "user", "content": "a few words to count " * 20}]
    answer = client.chat.completions.with_raw_response.create(model="mystery-model-1", messages=messages)
    assert answer.headers["x-contextshift-approximate"] == "true"
    assert "not in the model registry" in answer.headers["x-contextshift-warning"]
    preview = {"blocksJson": json.dumps(messages), "model": "mystery-model-1"}
    for _ in range(100):
        plan = httpx.post(f"{server.http_url}/api/v2/context-preview", json=preview).json()["plan"]
        if plan["calibrationFactor"] != 1.0:
            break
    assert plan["calibrationFactor"] != 1.0


def test_answers_are_not_held_back_on_a_kept_alive_connection(server: ServerProcess) -> None:
    """An answer goes in several writes (its head, then each chunk): with Nagle's algorithm on, each
    small write waited for the client's delayed acknowledgement, 40 ms, on a kept-alive connection."""
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    times = []
    with httpx.Client(base_url=server.http_url) as client:
        for _ in range(15):
            started = time.perf_counter()
            with client.stream("POST", "/v1/chat/completions", json=body) as answer:
                chunks = answer.iter_raw()
                next(chunks)
                times.append(time.perf_counter() - started)
                for _ in chunks:
                    pass
    assert statistics.median(times) < 0.03, times
