"""When the provider fails or the caller leaves, through the gateway: the provider's own errors come
back as it sent them (Retry-After too), so the SDK raises its usual exception; an upstream that
hangs is a 504, one that cannot be reached a 502; the audit closes FAILED with the normalized code
and none of the provider's text, or CANCELLED when the caller hangs up, the upstream connection then
closed within a second. No key is ever logged, counted in a metric or stored."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import anthropic
import httpx
import openai
import pytest
from fake_llm import closed_port_url
from fake_provider import RETRY_AFTER, UPSTREAM_SECRET_TEXT, FakeProvider

from .conftest import ServerProcess, serving
from .gateway_support import audit_text, module_gateway, module_provider, reset_provider, settled

KEY = "sk-failures-0123456789"
MESSAGES = [{"role": "user", "content": "hello there"}]
READ_TIMEOUT = 1.5


GATEWAY_FLAGS = ("--upstream-read-timeout-seconds", str(READ_TIMEOUT))
fake = pytest.fixture(scope="module", name="fake")(module_provider)
server = pytest.fixture(scope="module", name="server")(module_gateway)
fresh = pytest.fixture(autouse=True, name="fresh")(reset_provider)


def openai_client(server: ServerProcess, key: str = KEY, timeout: float = 30) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.http_url}/v1", api_key=key, max_retries=0, timeout=timeout)


def upstream_closed_within(fake: FakeProvider, left: float, seconds: float) -> bool:
    """Whether the provider saw its connection closed within `seconds` of the caller leaving."""
    while fake.closed_at is None and time.monotonic() - left < 5:
        time.sleep(0.01)
    return fake.closed_at is not None and fake.closed_at - left < seconds


def failed_with(server: ServerProcess, chat_id: str, code: str) -> None:
    closed = settled(server, chat_id)
    assert closed["status"] == "GENERATION_STATUS_FAILED", closed
    assert closed["providerErrorCode"] == f"PROVIDER_ERROR_CODE_{code}"
    assert UPSTREAM_SECRET_TEXT not in audit_text(server, chat_id)


def test_a_rate_limit_is_the_sdks_rate_limit_error_with_retry_after(
    server: ServerProcess, fake: FakeProvider
) -> None:
    fake.mode = "rate_limit"
    with pytest.raises(openai.RateLimitError) as raised:
        openai_client(server).chat.completions.create(
            model="gpt-4o",
            messages=MESSAGES,
            extra_headers={"x-chat-id": "limited"},
        )
    assert raised.value.response.headers["retry-after"] == RETRY_AFTER
    assert raised.value.code == "rate_limit_exceeded"  # the provider's body, as it sent it
    assert raised.value.response.headers["x-contextshift-generation-id"]
    failed_with(server, "limited", "RATE_LIMITED")

    client = anthropic.Anthropic(base_url=server.http_url, api_key=KEY, max_retries=0)
    with pytest.raises(anthropic.RateLimitError) as anthropic_raised:
        client.messages.create(
            model="claude-sonnet-4-6",
            max_tokens=50,
            messages=MESSAGES,
            extra_headers={"x-chat-id": "limited-2"},
        )
    assert anthropic_raised.value.response.headers["retry-after"] == RETRY_AFTER
    failed_with(server, "limited-2", "RATE_LIMITED")


def test_the_sdks_own_retry_goes_through_the_gateway_again(server: ServerProcess, fake: FakeProvider) -> None:
    """The SDK retries a 500 by itself: the gateway shifts and forwards it again, and the chat's
    audit is the retry's, FAILED too."""
    fake.mode = "error"
    client = openai.OpenAI(base_url=f"{server.http_url}/v1", api_key=KEY, max_retries=1)
    with pytest.raises(openai.InternalServerError):
        client.chat.completions.create(
            model="gpt-4o", messages=MESSAGES, extra_headers={"x-chat-id": "broken"}
        )
    assert len(fake.requests) == 2
    failed_with(server, "broken", "PROVIDER_UNAVAILABLE")


def test_a_refused_key_is_the_sdks_authentication_error(server: ServerProcess, fake: FakeProvider) -> None:
    fake.mode = "unauthorized"
    with pytest.raises(openai.AuthenticationError):
        openai_client(server).chat.completions.create(
            model="gpt-4o",
            messages=MESSAGES,
            extra_headers={"x-chat-id": "refused"},
        )
    failed_with(server, "refused", "AUTHENTICATION_FAILED")


def test_an_upstream_that_does_not_answer_is_a_504(server: ServerProcess, fake: FakeProvider) -> None:
    fake.mode = "hang"
    started = time.monotonic()
    with pytest.raises(openai.InternalServerError) as raised:
        openai_client(server).chat.completions.create(
            model="gpt-4o",
            messages=MESSAGES,
            extra_headers={"x-chat-id": "hung"},
        )
    assert raised.value.status_code == 504
    assert READ_TIMEOUT <= time.monotonic() - started < READ_TIMEOUT + 3
    failed_with(server, "hung", "TIMEOUT")


def test_a_caller_hanging_up_mid_stream_closes_the_upstream_and_cancels(
    server: ServerProcess, fake: FakeProvider
) -> None:
    fake.mode, fake.events, fake.interval = "slow", 50, 0.1
    stream = openai_client(server).chat.completions.create(
        model="gpt-4o",
        messages=MESSAGES,
        stream=True,
        extra_headers={"x-chat-id": "left"},
    )
    chunks = iter(stream)
    next(chunks), next(chunks)  # the answer is under way
    stream.close()
    assert upstream_closed_within(fake, time.monotonic(), 1.0)
    closed = settled(server, "left")
    assert closed["status"] == "GENERATION_STATUS_CANCELLED"


def test_a_caller_hanging_up_before_the_answer_began_cancels_too(
    server: ServerProcess, fake: FakeProvider
) -> None:
    fake.mode = "hang"
    with pytest.raises(openai.APITimeoutError):
        openai_client(server, timeout=0.5).chat.completions.create(
            model="gpt-4o",
            messages=MESSAGES,
            extra_headers={"x-chat-id": "impatient"},
        )
    assert upstream_closed_within(fake, time.monotonic(), 1.0)
    assert settled(server, "impatient")["status"] == "GENERATION_STATUS_CANCELLED"


def test_an_upstream_that_cannot_be_reached_is_a_502(tmp_path: Path) -> None:
    with serving(tmp_path, "--upstream-openai", closed_port_url()) as running:
        with pytest.raises(openai.InternalServerError) as raised:
            openai_client(running).chat.completions.create(
                model="gpt-4o",
                messages=MESSAGES,
                extra_headers={"x-chat-id": "nowhere"},
            )
        assert raised.value.status_code == 502
        assert "cannot be reached" in raised.value.message
        failed_with(running, "nowhere", "PROVIDER_UNAVAILABLE")


def test_no_key_in_logs_metrics_or_audits(server: ServerProcess, fake: FakeProvider) -> None:
    key = f"sk-proj-{uuid.uuid4().hex}"
    client = openai_client(server, key)
    client.chat.completions.create(model="gpt-4o", messages=MESSAGES, extra_headers={"x-chat-id": "keyed-1"})
    list(
        client.chat.completions.create(
            model="gpt-4o", messages=MESSAGES, stream=True, extra_headers={"x-chat-id": "keyed-2"}
        )
    )
    anthropic.Anthropic(base_url=server.http_url, api_key=key, max_retries=0).messages.create(
        model="claude-sonnet-4-6",
        max_tokens=50,
        messages=MESSAGES,
        extra_headers={"x-chat-id": "keyed-3"},
    )
    fake.mode = "unauthorized"  # the provider's error repeats the key, as real ones partly do
    with pytest.raises(openai.AuthenticationError) as raised:
        client.chat.completions.create(
            model="gpt-4o", messages=MESSAGES, extra_headers={"x-chat-id": "keyed-4"}
        )
    assert key in raised.value.message  # the caller gets the provider's answer as it was
    assert all(r.headers.get("authorization") == f"Bearer {key}" for r in fake.requests)  # it went upstream
    for chat in ("keyed-1", "keyed-2", "keyed-3", "keyed-4"):
        settled(server, chat)
        assert key not in audit_text(server, chat)
    assert key not in httpx.get(f"{server.http_url}/metrics").text
    log = server.log_path.read_text()
    assert log.count('"msg": "gateway"') >= 4 and key not in log
