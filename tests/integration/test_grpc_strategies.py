"""Strategies and plugins over gRPC, against the real server: ListStrategies, strategy options
through a Struct, the plan's summary, relevance and truncations, the errors naming `strategy` and
`options.<key>`, a plugin strategy from the sample package's entry point, and an interceptor
enabled on the server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import grpc
import pytest
from agent_loops import agent_loop, log_steps
from google.protobuf import struct_pb2

import contextshift
from contextshift._proto.contextshift.v1 import block_pb2, context_service_pb2_grpc
from contextshift._proto.contextshift.v1 import context_service_pb2 as pb

from .conftest import ServerProcess, start_server

FILLER = "We went over the details again and again without deciding anything new at all. "


def chat(turns: int) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = [{"id": "sys", "role": "system", "content": "You are a support agent."}]
    for n in range(turns):
        blocks.append({"id": f"u{n}", "role": "user", "content": f"Ticket OPS-{100 + n} again. " + FILLER})
        blocks.append(
            {"id": f"a{n}", "role": "assistant", "content": f"Logged to /var/log/ops_{n}.txt. " + FILLER}
        )
    blocks.append({"id": "now", "role": "user", "content": "Status of OPS-105?"})
    return blocks


@pytest.fixture
def client(server: ServerProcess) -> Any:
    with contextshift.Client(server.address) as c:
        yield c


def violation_fields(error: grpc.RpcError) -> list[str]:
    from contextshift.client import library_error

    converted = library_error(error)
    assert isinstance(converted, contextshift.InvalidInput), converted
    return [v.field for v in converted.violations]


def test_list_strategies(client: contextshift.Client) -> None:
    listing = client.list_strategies()
    by_name = {s.name: s for s in listing.strategies}
    assert {
        "truncate",
        "summarize",
        "vector-recall",
        "manual",
        "clear-tool-results",
        "drop-greetings",
    } <= set(by_name)
    assert [(o.name, o.kind, o.default) for o in by_name["clear-tool-results"].options] == [
        ("keep_tool_uses", "int", 3),
        ("exclude_tools", "list[str]", []),
        ("clear_tool_inputs", "bool", False),
        ("clear_at_least", "int", 0),
    ]
    assert by_name["summarize"].builtin and not by_name["drop-greetings"].builtin
    assert {o.name for o in listing.common_options} >= {
        "target_ratio",
        "plugin_timeout_ms",
        "max_block_chars",
    }


def test_summarize_over_grpc_matches_the_library(client: contextshift.Client) -> None:
    blocks = chat(10)
    options = {"summary_max_tokens": 200, "target_ratio": 0.9}  # an int through a Struct's double
    remote = client.shift_context(blocks, budget=600, strategy="summarize", options=options)
    local = contextshift.shift_context(blocks, budget=600, strategy="summarize", options=options)
    assert remote.kept == local.kept and remote.excluded == local.excluded
    assert remote.summary is not None and local.summary is not None
    assert remote.summary.text == local.summary.text
    assert (remote.summary.facts_kept, remote.summary.facts_total) == (
        local.summary.facts_kept,
        local.summary.facts_total,
    )
    assert remote.messages == json.loads(local.messages_json())
    assert remote.strategy == "summarize" and remote.was_compacted
    assert remote.summary.divider_text == local.summary.divider_text


def test_relevance_and_clearing_come_back_in_the_plan(channel: grpc.Channel) -> None:
    stub = context_service_pb2_grpc.ContextShiftServiceStub(channel)
    blocks = [
        {
            "id": "lore",
            "role": "system",
            "kind": "lorebook",
            "content": "The dragon sleeps in the pass.",
            "relevance": 0.3,
        },
        {
            "id": "call",
            "role": "assistant",
            "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{}"}}],
        },
        {"id": "res", "role": "tool", "tool_call_id": "c", "content": "data " * 300},
        {"id": "u", "role": "user", "content": "Where is the dragon?"},
    ]
    recall = stub.PreviewContext(
        pb.PreviewContextRequest(blocks_json=json.dumps(blocks), strategy="vector-recall")
    )
    assert [(r.id, r.score, r.source) for r in recall.plan.relevance] == [("lore", 0.3, "given")]
    options = struct_pb2.Struct()
    options.update({"keep_tool_uses": 0})
    cleared = stub.PreviewContext(
        pb.PreviewContextRequest(
            blocks_json=json.dumps(blocks),
            strategy="clear-tool-results",
            options=options,
            context_limit=200,
            response_reserve=0,
        )
    )
    assert [(t.id, t.how) for t in cleared.plan.truncated] == [("res", "TOOL_RESULT_CLEARED")]
    assert [d.event for d in cleared.plan.diagnostics] == ["TOOL_RESULTS_CLEARED"]
    assert "[tool result cleared:" in cleared.plan.messages.messages_json


@pytest.mark.parametrize(
    ("strategy", "options", "field"),
    [
        ("nope", {}, "strategy"),
        ("truncate", {"summary_max_tokens": 100}, "options.summary_max_tokens"),
        ("summarize", {"summary_max_tokens": 100.5}, "options.summary_max_tokens"),
        ("vector-recall", {"query_embedding": "x"}, "options.query_embedding"),
        ("truncate", {"target_ratio": 2}, "options.target_ratio"),
    ],
)
def test_bad_strategies_and_options_are_invalid_argument_naming_the_field(
    channel: grpc.Channel, strategy: str, options: dict[str, Any], field: str
) -> None:
    stub = context_service_pb2_grpc.ContextShiftServiceStub(channel)
    struct = struct_pb2.Struct()
    struct.update(options)
    request = pb.ShiftContextRequest(
        blocks_json='[{"role": "user", "content": "q"}]', strategy=strategy, options=struct
    )
    with pytest.raises(grpc.RpcError) as caught:
        stub.ShiftContext(request)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert violation_fields(caught.value) == [field]


def test_a_manual_flag_on_a_protected_typed_block_names_it(channel: grpc.Channel) -> None:
    stub = context_service_pb2_grpc.ContextShiftServiceStub(channel)
    meta = struct_pb2.Struct()
    meta.update({"manualExcluded": True})
    request = pb.ShiftContextRequest(
        blocks=[
            block_pb2.Block(role=block_pb2.ROLE_SYSTEM, content="s", meta=meta),
            block_pb2.Block(role=block_pb2.ROLE_USER, content="q"),
        ],
        strategy="manual",
    )
    with pytest.raises(grpc.RpcError) as caught:
        stub.ShiftContext(request)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert violation_fields(caught.value) == ["blocks[0].meta.manualExcluded"]


def test_a_plugin_strategy_from_an_entry_point_runs_on_the_server(client: contextshift.Client) -> None:
    blocks = [
        {"id": "sys", "role": "system", "content": "s"},
        {"id": "hi", "role": "user", "content": "hi!"},
        {"id": "q", "role": "user", "content": "What is the plan?"},
    ]
    result = client.shift_context(blocks, budget=1000, strategy="drop-greetings")
    assert [(d.id, d.reason) for d in result.excluded] == [("hi", "PLUGIN_EXCLUDED")]


def test_an_interceptor_enabled_on_the_server(tmp_path: Path) -> None:
    server = start_server(tmp_path, env={"CONTEXTSHIFT_INTERCEPTORS": "redact-secrets"})
    try:
        with contextshift.Client(server.address) as client:
            blocks = [{"role": "system", "content": "token SECRET-abc123"}, {"role": "user", "content": "go"}]
            result = client.shift_context(blocks, budget=1000)
            assert result.messages[0]["content"] == "token [redacted]"
            assert [d.event for d in result.diagnostics] == ["INTERCEPTED"]
            assert "SECRET-abc123" not in server.log_path.read_text()  # nor in the log
    finally:
        assert server.terminate() == 0


def test_the_audit_shows_the_plans_facts_anchor_and_repair_warning(
    client: contextshift.Client, channel: grpc.Channel
) -> None:
    # An agent loop shifted with summarize: the task is the anchor, the summary's figures are
    # those of the whole prompt, and the audit records the same as the reply and the library.
    blocks = agent_loop("openai-chat", log_steps(21))
    budget = sum(contextshift.count_tokens(blocks, "o200k_base")) * 3 // 10
    # The target ratio given: with a chat_id the server's default is a cache-stable 0.8.
    args: dict[str, Any] = {
        "budget": budget,
        "profile": "o200k_base",
        "strategy": "summarize",
        "options": {"target_ratio": 0.8},
    }
    remote = client.shift_context(blocks, chat_id="loop-audit", **args)
    local = contextshift.shift_context(blocks, **args)
    assert remote.summary is not None and local.summary is not None
    figures = (local.summary.facts_kept, local.summary.facts_total)
    assert (remote.summary.facts_kept, remote.summary.facts_total) == figures
    assert 0 < figures[0] <= figures[1]
    stub = context_service_pb2_grpc.ContextShiftServiceStub(channel)
    audit = stub.GetContextAudit(pb.GetContextAuditRequest(chat_id="loop-audit"), timeout=10).audit
    assert (audit.plan.summary.facts_kept, audit.plan.summary.facts_total) == figures
    reasons = {b.id: b.reason for b in audit.blocks}
    assert reasons["task"] == "ANCHOR_USER_TURN"
    assert list(audit.plan.warnings) == list(local.warnings)
