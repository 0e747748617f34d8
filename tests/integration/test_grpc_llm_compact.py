"""llm-compact through the real server, configured (by environment variables) with the fake LLM
endpoint on 127.0.0.1: the summary and the tokens spent in the plan, models by role or name, a
failing or slow endpoint falling back to truncate, URL/key/timeout options refused as
INVALID_ARGUMENT, compactions never holding the engine threads, and the API key never in the
server's log."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest
from fake_llm import GOOD_ANSWER, FakeLlm
from google.protobuf import struct_pb2

import contextshift
from contextshift._proto.contextshift.v1 import context_service_pb2 as pb
from contextshift._proto.contextshift.v1 import context_service_pb2_grpc
from contextshift.strategies import llm_compact
from contextshift.summarizer import llm

from .conftest import ServerProcess, start_server
from .test_grpc_strategies import chat, violation_fields

KEY = "sk-grpc-KEY-0a1b2c3d4e5f"
TIMEOUT_MS = 1500


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeLlm]:
    endpoint = FakeLlm()
    yield endpoint
    endpoint.close()


@pytest.fixture(scope="module")
def compacting(tmp_path_factory: pytest.TempPathFactory, fake: FakeLlm) -> Iterator[ServerProcess]:
    """A server whose llm-compact calls the fake; one engine thread, nothing inline, DEBUG logs."""
    env = {
        "CONTEXTSHIFT_COMPACT_URL": fake.url,
        "CONTEXTSHIFT_COMPACT_MODEL": "big",
        "CONTEXTSHIFT_COMPACT_FAST_MODEL": "small",
        "CONTEXTSHIFT_COMPACT_API_KEY": KEY,
        "CONTEXTSHIFT_COMPACT_TIMEOUT_MS": str(TIMEOUT_MS),
    }
    flags = ("--log-level", "DEBUG", "--engine-threads", "1", "--inline-request-bytes", "0")
    running = start_server(tmp_path_factory.mktemp("compacting"), *flags, env=env)
    yield running
    assert running.terminate() == 0


@pytest.fixture
def client(compacting: ServerProcess, fake: FakeLlm) -> Iterator[contextshift.Client]:
    fake.mode, fake.delay = "good", 3.0
    fake.requests.clear()
    with contextshift.Client(compacting.address) as c:
        yield c


def test_llm_compact_over_grpc_matches_the_library(client: contextshift.Client, fake: FakeLlm) -> None:
    blocks = chat(12)
    options = {"hint": "step_dependency", "summary_max_tokens": 300}
    remote = client.shift_context(blocks, budget=700, strategy="llm-compact", options=options)
    asked = fake.requests[-1]
    assert asked.body["model"] == "big" and asked.headers["authorization"] == f"Bearer {KEY}"
    assert asked.system_prompt == llm.PROMPTS["step_dependency"]
    local = contextshift.shift_context(
        blocks,
        budget=700,
        strategy="llm-compact",
        options={**options, "compact_base_url": fake.url, "compact_model": "big"},
    )
    assert remote.kept == local.kept and remote.excluded == local.excluded
    assert remote.summary is not None and local.summary is not None
    assert remote.summary.text == local.summary.text
    assert remote.summary.text.startswith(f"[Conversation summary]\n{GOOD_ANSWER}")
    assert remote.messages == json.loads(local.messages_json())
    assert remote.compaction_usage == contextshift.CompactionUsage("big", 321, 45)
    assert [(d.event, d.detail) for d in remote.diagnostics] == [
        ("LLM_COMPACTED", "20 blocks summarized by big (hint step_dependency)")
    ]
    assert remote.summary.divider_text == "Earlier context (20 messages) was summarized by AI."
    assert remote.was_compacted and remote.strategy == "llm-compact"


def test_a_request_picks_a_configured_model_by_role_or_name(
    client: contextshift.Client, fake: FakeLlm
) -> None:
    for requested, model in [("fast", "small"), ("small", "small"), ("main", "big")]:
        result = client.shift_context(
            chat(12), budget=700, strategy="llm-compact", options={"compact_model": requested}
        )
        assert fake.requests[-1].body["model"] == model
        assert result.compaction_usage is not None and result.compaction_usage.model == model


def test_a_failing_endpoint_falls_back_without_failing_the_call(
    client: contextshift.Client, fake: FakeLlm
) -> None:
    blocks = chat(12)
    plain = client.shift_context(blocks, budget=700)
    fake.mode = "error"
    failed = client.shift_context(blocks, budget=700, strategy="llm-compact")
    assert failed.kept == plain.kept and failed.excluded == plain.excluded and failed.summary is None
    assert [(d.source, d.event, d.detail) for d in failed.diagnostics] == [
        ("strategy:llm-compact", "LLM_FALLBACK", "the endpoint answered HTTP 500; fell back to truncate")
    ]
    assert failed.compaction_usage is None
    fake.mode, fake.delay = "slow", 4.0
    slow = client.shift_context(blocks, budget=700, strategy="llm-compact")
    assert [d.detail for d in slow.diagnostics] == [
        f"no answer within compact_timeout_ms ({TIMEOUT_MS} ms); fell back to truncate"
    ]
    assert slow.kept == plain.kept


@pytest.mark.parametrize(
    ("options", "fields"),
    [
        ({"compact_base_url": "http://169.254.169.254/latest"}, ["options.compact_base_url"]),
        ({"compact_api_key": "sk-other"}, ["options.compact_api_key"]),
        ({"compact_timeout_ms": 100}, ["options.compact_timeout_ms"]),
        (
            {"compact_base_url": "http://10.0.0.1/v1", "compact_api_key": "k"},
            ["options.compact_base_url", "options.compact_api_key"],
        ),
        ({"compact_model": "gpt-x"}, ["options.compact_model"]),
        ({"hint": "poetry"}, ["options.hint"]),
    ],
)
def test_a_request_never_chooses_the_endpoint(
    compacting: ServerProcess, fake: FakeLlm, options: dict[str, Any], fields: list[str]
) -> None:
    fake.requests.clear()
    struct = struct_pb2.Struct()
    struct.update(options)
    request = pb.ShiftContextRequest(blocks_json=json.dumps(chat(12)), strategy="llm-compact", options=struct)
    with grpc.insecure_channel(compacting.address) as channel:
        stub = context_service_pb2_grpc.ContextShiftServiceStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            stub.ShiftContext(request)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert violation_fields(caught.value) == fields
    assert fake.requests == []  # nothing was fetched


def test_compactions_do_not_hold_the_engine_threads(compacting: ServerProcess, fake: FakeLlm) -> None:
    """With one engine thread, a truncate call completes while compactions wait on a slow
    endpoint (they run on the I/O threads)."""
    fake.mode, fake.delay = "slow", 1.2  # within the timeout: the compactions succeed
    with ThreadPoolExecutor(3) as pool, contextshift.Client(compacting.address) as c:
        waiting = [
            pool.submit(c.shift_context, chat(12), budget=700, strategy="llm-compact") for _ in range(2)
        ]
        deadline = time.monotonic() + 30
        while len(fake.requests) < 2:  # both compactions are at the endpoint
            assert not any(f.done() for f in waiting), [f.result() for f in waiting if f.done()]
            assert time.monotonic() < deadline, "the compactions never reached the endpoint"
            time.sleep(0.01)
        plain = c.shift_context(chat(12), budget=700)
        assert not any(f.done() for f in waiting)
        assert plain.excluded and plain.strategy == "truncate"
        assert all(f.result().summary is not None for f in waiting)


def test_presets_and_the_tool_result_cap_over_grpc(client: contextshift.Client) -> None:
    blocks = [
        {"id": "q", "role": "user", "content": "run it"},
        {
            "id": "call",
            "role": "assistant",
            "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{}"}}],
        },
        {"id": "res", "role": "tool", "tool_call_id": "c", "content": "r" * 2000},
        {"id": "now", "role": "user", "content": "x" * 2000},
    ]
    result = client.shift_context(blocks, budget=100_000, options={"preset": "dag_replan"})
    assert [(t.id, t.how) for t in result.truncated] == [("res", "CHAR_CAP")]
    assert len(result.messages[2]["content"]) == 500


def test_list_strategies_shows_no_endpoint_options(client: contextshift.Client) -> None:
    listing = {s.name: s for s in client.list_strategies().strategies}
    compact = listing["llm-compact"]
    assert compact.builtin
    assert [o.name for o in compact.options] == [
        "hint",
        "summary_max_tokens",
        "keep_recent",
        "compact_above_tokens",
        "compact_model",
    ]
    common = {o.name for o in client.list_strategies().common_options}
    assert {"preset", "tool_result_max_chars"} <= common


def test_a_server_without_an_endpoint_shifts_as_truncate_with_a_warning(tmp_path: Path) -> None:
    server = start_server(tmp_path)
    try:
        with contextshift.Client(server.address) as c:
            result = c.shift_context(chat(12), budget=700, strategy="llm-compact")
            plain = c.shift_context(chat(12), budget=700)
        assert result.kept == plain.kept and result.summary is None
        assert llm_compact.NO_ENDPOINT in result.warnings
    finally:
        assert server.terminate() == 0


def test_bad_compaction_settings_stop_the_server_at_start(tmp_path: Path) -> None:
    for env, message in [
        ({"CONTEXTSHIFT_COMPACT_URL": "ftp://x/v1", "CONTEXTSHIFT_COMPACT_MODEL": "m"}, "compact_url"),
        ({"CONTEXTSHIFT_COMPACT_URL": "http://127.0.0.1:9/v1"}, "compact_model: required"),
    ]:
        with pytest.raises(RuntimeError, match=message):
            start_server(tmp_path, env=env)


def test_the_api_key_never_reaches_the_server_log(compacting: ServerProcess, fake: FakeLlm) -> None:
    with contextshift.Client(compacting.address) as c:
        for mode in ("good", "error", "garbage", "empty"):
            fake.mode = mode
            c.shift_context(chat(12), budget=700, strategy="llm-compact")
    log = compacting.log_path.read_text()
    # A real log at DEBUG: the endpoint configured, the calls, the fallbacks with their causes.
    assert "llm compaction configured" in log and "ShiftContext" in log
    assert log.count("llm compaction fell back") >= 3 and "the endpoint answered HTTP 500" in log
    assert any(r.headers.get("authorization") == f"Bearer {KEY}" for r in fake.requests)  # it was in play
    assert KEY not in log
