"""What the gateway tests share: a real contextshift server in front of the real fake provider
(tests/fake_provider.py), the audit as GetContextAudit reads it, and checks of what the provider
received (whole tool groups, reasoning with its calls)."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fake_provider import FakeProvider

from .conftest import ServerProcess, serving

# Small windows, so a test chat goes over them: stored model configurations (the model's window
# comes from there before the registry), and the same windows at the provider.
SMALL_WINDOW = 6000
OPENAI_MODEL = "gpt-4o-small"
ANTHROPIC_MODEL = "claude-small"
MODELS_TOML = f"""
[models."{OPENAI_MODEL}"]
context_size = {SMALL_WINDOW}
profile = "o200k_base"

[models."{ANTHROPIC_MODEL}"]
context_size = {SMALL_WINDOW}
profile = "anthropic"
"""


def provider() -> FakeProvider:
    fake = FakeProvider()
    fake.windows = {OPENAI_MODEL: SMALL_WINDOW, ANTHROPIC_MODEL: SMALL_WINDOW}
    return fake


# Fixtures, made in each module as `name = pytest.fixture(...)(function)`: a module's provider, its
# gateway (started with the module's GATEWAY_FLAGS), the provider reset before each test.
def module_provider() -> Iterator[FakeProvider]:
    running = provider()
    yield running
    running.close()


def module_gateway(
    fake: FakeProvider, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    flags = getattr(request.module, "GATEWAY_FLAGS", ())
    with gateway(tmp_path_factory.mktemp("gateway"), fake, *flags) as running:
        yield running


def reset_provider(fake: FakeProvider) -> None:
    fake.reset()


@contextlib.contextmanager
def gateway(tmp: Path, fake: FakeProvider | None, *flags: str, **options: Any) -> Iterator[ServerProcess]:
    """A server whose OpenAI and Anthropic upstreams are `fake` (none without it), with the small
    windows' model configurations."""
    (tmp / "models.toml").write_text(MODELS_TOML)
    upstreams = (
        ["--upstream-openai", fake.openai_url, "--upstream-anthropic", fake.anthropic_url] if fake else []
    )
    with serving(
        tmp, "--model-config-file", str(tmp / "models.toml"), *upstreams, *flags, **options
    ) as running:
        yield running


def audit(server: ServerProcess, chat_id: str, headers: dict[str, str] | None = None) -> dict[str, Any]:
    answer = httpx.get(f"{server.http_url}/api/v2/chats/{chat_id}/context-audit", headers=headers)
    assert answer.status_code == 200, answer.text
    found: dict[str, Any] = answer.json()["audit"]
    return found


def audit_text(server: ServerProcess, chat_id: str, headers: dict[str, str] | None = None) -> str:
    return httpx.get(f"{server.http_url}/api/v2/chats/{chat_id}/context-audit", headers=headers).text


def settled(server: ServerProcess, chat_id: str, headers: dict[str, str] | None = None) -> dict[str, Any]:
    """The chat's audit once it is no longer PENDING (the gateway closes it as the answer ends)."""
    deadline = time.monotonic() + 10
    while True:
        found = audit(server, chat_id, headers)
        if found.get("status") != "GENERATION_STATUS_PENDING" or time.monotonic() > deadline:
            return found
        time.sleep(0.02)


def contextshift_headers(headers: httpx.Headers | Any) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.startswith("x-contextshift-")}


def check_openai_groups(messages: list[dict[str, Any]]) -> None:
    """Every tool call of a Chat Completions list has its result and every result its call."""
    calls = {c["id"] for m in messages for c in m.get("tool_calls") or []}
    results = {m["tool_call_id"] for m in messages if m.get("role") == "tool"}
    assert calls == results, calls ^ results


def check_responses_groups(items: list[dict[str, Any]]) -> None:
    """Every function call of a Responses input has its output and every output its call, and
    every reasoning item is followed by the call its response made with it."""
    calls = {i["call_id"] for i in items if i.get("type") == "function_call"}
    outputs = {i["call_id"] for i in items if i.get("type") == "function_call_output"}
    assert calls == outputs, calls ^ outputs
    for at, item in enumerate(items):
        if item.get("type") == "reasoning":
            turn = item["id"].removeprefix("rs_")
            assert items[at + 1].get("call_id") == f"call_{turn}", "a reasoning item left without its call"


def _parts(messages: list[dict[str, Any]], kind: str, key: str) -> set[str]:
    """The `key` of every `kind` part of an Anthropic message list."""
    return {
        p[key] for m in messages if isinstance(m["content"], list) for p in m["content"] if p["type"] == kind
    }


def check_anthropic_groups(messages: list[dict[str, Any]]) -> None:
    """Every tool_use has its tool_result and every result its use, and the list starts on a user turn."""
    uses, results = _parts(messages, "tool_use", "id"), _parts(messages, "tool_result", "tool_use_id")
    assert uses == results, uses ^ results
    assert messages[0]["role"] == "user"


def sent_messages(raw: bytes, field: str = "messages") -> list[str]:
    """The message list's elements as the provider received them, each its own text."""
    text = raw.decode()
    decoder = json.JSONDecoder()
    start = text.index("[", text.index(f'"{field}"'))
    items: list[str] = []
    index = start + 1
    while text[index] != "]":
        while text[index] in " \n\t,":
            index += 1
        if text[index] == "]":
            break
        _, end = decoder.raw_decode(text, index)
        items.append(text[index:end])
        index = end
    return items
