"""The gateway's settings on a real server: upstreams from the config file (chosen by model prefix,
a server-side key from the environment), no upstream at all, bad settings that stop the start,
contextshift's own tenant keys beside the provider's, the bound on upstream calls, the body limit
and the metrics."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import anthropic
import httpx
import openai
import pytest
from fake_provider import FakeProvider

from .conftest import serving, start_server
from .gateway_support import audit, gateway, module_provider, reset_provider, settled

MESSAGES = [{"role": "user", "content": "hello"}]
CALLER_KEY = "sk-caller-0123456789"


fake = pytest.fixture(scope="module", name="fake")(module_provider)
fresh = pytest.fixture(autouse=True, name="fresh")(reset_provider)


def test_upstreams_from_the_config_file_by_model_prefix_with_a_server_key(
    fake: FakeProvider, tmp_path: Path
) -> None:
    other = FakeProvider()
    try:
        (tmp_path / "gateway.toml").write_text(
            f"""
[[upstreams]]
name = "primary"
base_url = "{fake.openai_url}"
format = "openai"
model_prefixes = ["gpt-"]
api_key_env = "GATEWAY_TEST_KEY"

[[upstreams]]
name = "minis"
base_url = "{other.openai_url}"
format = "openai"
model_prefixes = ["gpt-4o-mini"]
read_timeout_seconds = 30

[[upstreams]]
name = "claude"
base_url = "{other.anthropic_url}"
format = "anthropic"
api_key_env = "GATEWAY_TEST_KEY"
strategy = "summarize"
"""
        )
        environment = {"GATEWAY_TEST_KEY": "server-key-0123456789"}
        with serving(tmp_path, "--config", str(tmp_path / "gateway.toml"), env=environment) as running:
            client = openai.OpenAI(base_url=f"{running.http_url}/v1", api_key=CALLER_KEY, max_retries=0)
            client.chat.completions.create(
                model="gpt-4o", messages=MESSAGES, extra_headers={"x-chat-id": "p"}
            )
            assert fake.last.headers["authorization"] == "Bearer server-key-0123456789"  # not the caller's
            assert audit(running, "p")["provider"] == "primary"
            client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES)
            assert other.last.path == "/v1/chat/completions"  # the longer prefix
            assert other.last.headers["authorization"] == f"Bearer {CALLER_KEY}"  # no key of its own
            with pytest.raises(openai.NotFoundError) as raised:
                client.chat.completions.create(model="llama-3", messages=MESSAGES)
            assert "model_prefixes" in raised.value.message and "primary: gpt-" in raised.value.message
            anthropic.Anthropic(base_url=running.http_url, api_key=CALLER_KEY, max_retries=0).messages.create(
                model="claude-sonnet-4-6",
                max_tokens=20,
                messages=MESSAGES,
                extra_headers={"x-chat-id": "c"},
            )
            assert other.last.headers["x-api-key"] == "server-key-0123456789"
            assert "authorization" not in other.last.headers
            assert audit(running, "c")["plan"]["strategy"] == "summarize"  # the upstream's default
    finally:
        other.close()


@pytest.mark.parametrize(
    ("flags", "config", "message"),
    [
        (
            ("--upstream-openai", "ftp://example.test/v1"),
            "",
            "upstream_openai: must be an http:// or https:// URL",
        ),
        (
            (),
            '[[upstreams]]\nname = "x"\nbase_url = "http://127.0.0.1:9/v1"\nformat = "grpc"\n',
            "upstreams[0].format",
        ),
        (
            (),
            '[[upstreams]]\nname = "x"\nbase_url = "http://127.0.0.1:9/v1"\nformat = "openai"\napi_key_env = "NOT_SET_ANYWHERE"\n',
            "$NOT_SET_ANYWHERE, which is not set",
        ),
        (
            (),
            '[[upstreams]]\nname = "x"\nbase_url = "http://127.0.0.1:9/v1"\nformat = "openai"\nmodel = "y"\n',
            "unknown keys model",
        ),
    ],
)
def test_a_bad_upstream_setting_stops_the_start(
    tmp_path: Path, flags: tuple[str, ...], config: str, message: str
) -> None:
    (tmp_path / "gateway.toml").write_text(config)
    running = start_server(tmp_path, "--config", str(tmp_path / "gateway.toml"), *flags, wait=False)
    assert running.proc.wait(30) == 2
    assert message in running.log_path.read_text()


def test_without_an_upstream_each_format_says_what_to_set(tmp_path: Path) -> None:
    with gateway(tmp_path, None) as running:
        with pytest.raises(openai.APIStatusError) as raised:
            openai.OpenAI(
                base_url=f"{running.http_url}/v1", api_key=CALLER_KEY, max_retries=0
            ).chat.completions.create(
                model="gpt-4o",
                messages=MESSAGES,
            )
        assert raised.value.status_code == 501 and "--upstream-openai" in raised.value.message
        client = anthropic.Anthropic(base_url=running.http_url, api_key=CALLER_KEY, max_retries=0)
        with pytest.raises(anthropic.APIStatusError) as anthropic_raised:
            client.messages.create(model="claude-sonnet-4-6", max_tokens=20, messages=MESSAGES)
        assert (
            anthropic_raised.value.status_code == 501
            and "CONTEXTSHIFT_UPSTREAM_ANTHROPIC" in anthropic_raised.value.message
        )
        assert client.messages.count_tokens(model="claude-sonnet-4-6", messages=MESSAGES).input_tokens > 0


def test_contextshift_keys_ride_beside_the_providers(fake: FakeProvider, tmp_path: Path) -> None:
    tenant_key = "tenant-key-0123456789"
    with gateway(tmp_path, fake, "--api-keys", f"team:{tenant_key}") as running:
        bare = openai.OpenAI(base_url=f"{running.http_url}/v1", api_key=CALLER_KEY, max_retries=0)
        with pytest.raises(openai.AuthenticationError) as raised:
            bare.chat.completions.create(model="gpt-4o", messages=MESSAGES)
        assert "x-contextshift-api-key" in raised.value.message
        assert fake.requests == []
        client = bare.with_options(default_headers={"x-contextshift-api-key": tenant_key})
        client.chat.completions.create(model="gpt-4o", messages=MESSAGES, extra_headers={"x-chat-id": "t"})
        assert fake.last.headers["authorization"] == f"Bearer {CALLER_KEY}"
        assert not any(k.startswith("x-contextshift") for k in fake.last.headers)
        assert (
            settled(running, "t", {"authorization": f"Bearer {tenant_key}"})["status"]
            == "GENERATION_STATUS_COMPLETED"
        )
        assert httpx.get(f"{running.http_url}/api/v2/chats/t/context-audit").status_code == 401


def test_the_bound_on_upstream_calls_the_body_limit_and_the_metrics(
    fake: FakeProvider, tmp_path: Path
) -> None:
    flags = ("--upstream-max-concurrent", "1", "--max-request-bytes", "4096")
    with gateway(tmp_path, fake, *flags) as running:
        fake.mode, fake.events, fake.interval = "slow", 10, 0.1
        client = openai.OpenAI(base_url=f"{running.http_url}/v1", api_key=CALLER_KEY, max_retries=0)
        holding = threading.Event()

        def hold_the_slot() -> None:
            stream = client.chat.completions.create(model="gpt-4o", messages=MESSAGES, stream=True)
            holding.set()
            list(stream)

        holder = threading.Thread(target=hold_the_slot)
        holder.start()
        assert holding.wait(10)
        metrics = httpx.get(f"{running.http_url}/metrics").text
        assert 'contextshift_gateway_streams_in_flight{endpoint="chat_completions"} 1.0' in metrics
        with pytest.raises(openai.RateLimitError) as raised:
            client.chat.completions.create(model="gpt-4o", messages=MESSAGES)
        assert raised.value.response.headers["retry-after"] == "1"
        holder.join(10)
        fake.mode = "ok"
        with pytest.raises(openai.APIStatusError) as too_large:
            client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x" * 5000}])
        assert too_large.value.status_code == 413 and "max_request_bytes" in too_large.value.message
        client.chat.completions.create(model="gpt-4o", messages=MESSAGES)
        time.sleep(0.1)
        metrics = httpx.get(f"{running.http_url}/metrics").text
        for line in (
            'contextshift_gateway_saturated_total{upstream="openai"} 1.0',
            'contextshift_gateway_calls_total{endpoint="chat_completions",status="200",upstream="openai"} 2.0',
            'contextshift_gateway_calls_total{endpoint="chat_completions",status="429",upstream="openai"} 1.0',
            'contextshift_gateway_calls_total{endpoint="chat_completions",status="413",upstream="none"} 1.0',
            'contextshift_gateway_upstream_first_byte_seconds_count{endpoint="chat_completions",upstream="openai"} 2.0',
            'contextshift_gateway_streams_in_flight{endpoint="chat_completions"} 0.0',
            'contextshift_shift_duration_seconds_count{method="POST /v1/chat/completions",surface="http"} 2.0',
        ):
            assert line in metrics, line
