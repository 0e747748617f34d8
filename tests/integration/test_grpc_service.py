"""Every RPC of contextshift.v1 against the real server, with every error's details decoded."""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
import uuid
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor_pool, struct_pb2
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase
from grpc_status import rpc_status

import contextshift
from contextshift import profiles
from contextshift._proto.contextshift.bench.v1 import echo_service_pb2, echo_service_pb2_grpc
from contextshift._proto.contextshift.v1 import block_pb2, context_service_pb2_grpc
from contextshift._proto.contextshift.v1 import context_service_pb2 as pb

from .conftest import Gate, ServerProcess, health_status, start_server

# One conversation, typed and as the OpenAI / Anthropic JSON a caller already has.
TYPED = [
    block_pb2.Block(
        id="sys", role=block_pb2.ROLE_SYSTEM, content="You are Ada, a bicycle shop's support agent."
    ),
    block_pb2.Block(
        id="lore",
        role=block_pb2.ROLE_SYSTEM,
        kind=block_pb2.BLOCK_KIND_LOREBOOK,
        content="Returns: 30 days.",
        mandatory=True,
    ),
    block_pb2.Block(
        id="u1", role=block_pb2.ROLE_USER, content="Where is my chain? Ordered ten days ago. " * 30
    ),
    block_pb2.Block(
        id="a1",
        role=block_pb2.ROLE_ASSISTANT,
        tool_calls=[block_pb2.ToolCall(id="call-1", name="order_status", arguments='{"order": 1234}')],
    ),
    block_pb2.Block(
        id="t1", role=block_pb2.ROLE_TOOL, tool_call_id="call-1", content='{"status": "shipped"}'
    ),
    block_pb2.Block(
        id="u2",
        role=block_pb2.ROLE_USER,
        parts=[
            block_pb2.Part(text="And is this sealant in stock?"),
            block_pb2.Part(image=block_pb2.Image(url="https://example.test/sealant.png", detail="low")),
        ],
    ),
    block_pb2.Block(id="a2", role=block_pb2.ROLE_ASSISTANT, content="Yes, 14 bottles. Anything else?"),
    block_pb2.Block(id="u3", role=block_pb2.ROLE_USER, content="Great, thanks!", pinned=True),
]
AS_JSON: list[dict[str, Any]] = [
    {"id": "sys", "role": "system", "content": "You are Ada, a bicycle shop's support agent."},
    {"id": "lore", "role": "system", "kind": "lorebook", "content": "Returns: 30 days.", "mandatory": True},
    {"id": "u1", "role": "user", "content": "Where is my chain? Ordered ten days ago. " * 30},
    {
        "id": "a1",
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call-1",
                "type": "function",
                "function": {"name": "order_status", "arguments": '{"order": 1234}'},
            }
        ],
    },
    {"id": "t1", "role": "tool", "tool_call_id": "call-1", "content": '{"status": "shipped"}'},
    {
        "id": "u2",
        "role": "user",
        "content": [
            {"type": "text", "text": "And is this sealant in stock?"},
            {"type": "image_url", "image_url": {"url": "https://example.test/sealant.png", "detail": "low"}},
        ],
    },
    {"id": "a2", "role": "assistant", "content": "Yes, 14 bottles. Anything else?"},
    {"id": "u3", "role": "user", "content": "Great, thanks!", "pinned": True},
]


def stub(channel: grpc.Channel) -> context_service_pb2_grpc.ContextShiftServiceStub:
    return context_service_pb2_grpc.ContextShiftServiceStub(channel)


def details(error: grpc.RpcError) -> tuple[grpc.StatusCode, list[Any]]:
    status = rpc_status.from_call(error)  # type: ignore[arg-type]
    assert status is not None, error
    decoded: list[Any] = []
    for detail in status.details:
        for kind in (error_details_pb2.ErrorInfo, error_details_pb2.BadRequest):
            if detail.Is(kind.DESCRIPTOR):
                message = kind()
                detail.Unpack(message)
                decoded.append(message)
    return error.code(), decoded


def violations(error: grpc.RpcError) -> dict[str, str]:
    code, found = details(error)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    info, bad = found  # the library error's reason (what a client raises), then the fields
    assert info.reason.startswith("INVALID_") and info.domain == "contextshift.v1", info
    return {v.field: v.description for v in bad.field_violations}


# --- the RPCs ---------------------------------------------------------------------------------


def test_shift_context_typed(channel: grpc.Channel) -> None:
    # target_ratio 1: a chat's shift is cache-stable, down to 0.8 of the budget by default.
    options = struct_pb2.Struct()
    options.update({"target_ratio": 1.0})
    response = stub(channel).ShiftContext(
        pb.ShiftContextRequest(
            blocks=TYPED, context_limit=1200, response_reserve=200, chat_id="c1", options=options
        ),
        timeout=10,
    )
    plan = response.plan
    assert len(response.generation_id) == 36 and response.generation_id[14] == "7"  # UUIDv7
    assert plan.budget == 1000 and plan.context_limit == 1200 and plan.response_reserve == 200
    assert [(d.id, d.reason) for d in plan.excluded] == [
        ("u1", "BUDGET_OLDEST_FIRST"),
        ("a1", "LEADING_ASSISTANT"),
        ("t1", "TOOL_GROUP"),
    ]
    assert [d.id for d in plan.kept] == ["sys", "lore", "u2", "a2", "u3"]
    assert plan.kept[0].reason == "PROTECTED_SYSTEM" and plan.kept[-1].reason == "PINNED"
    assert plan.prompt_tokens == sum(d.tokens for d in plan.kept) <= plan.budget
    assert plan.profile == "heuristic" and plan.approximate
    assert plan.compaction == pb.CompactionNote(was_compacted=True, original_count=8, compacted_count=5)
    assert plan.messages.format == pb.OUTPUT_FORMAT_INPUT
    assert [m["id"] for m in json.loads(plan.messages.messages_json)] == [d.id for d in plan.kept]


def test_a_request_over_the_inline_size_is_shifted_on_the_engine_threads(channel: grpc.Channel) -> None:
    blocks = [{"role": "user" if i % 2 else "assistant", "content": f"message {i} " * 40} for i in range(900)]
    request = pb.ShiftContextRequest(
        blocks_json=json.dumps(blocks), context_limit=9000, response_reserve=1000
    )
    assert request.ByteSize() > 256 * 1024  # the default inline_request_bytes
    plan = stub(channel).ShiftContext(request, timeout=10).plan
    lib = contextshift.shift_context(blocks, budget=contextshift.Budget(9000, 1000))
    assert plan.excluded and [d.id for d in plan.kept] == [d.id for d in lib.kept]
    assert plan.prompt_tokens == lib.prompt_tokens


def test_generation_id_is_kept_when_given(channel: grpc.Channel) -> None:
    response = stub(channel).ShiftContext(
        pb.ShiftContextRequest(blocks=TYPED, generation_id="g-42"), timeout=10
    )
    assert response.generation_id == "g-42"


def test_json_and_typed_blocks_give_identical_plans(channel: grpc.Channel) -> None:
    options = struct_pb2.Struct()
    options.update({"max_block_chars": 200, "start_on_user": True})
    common: dict[str, Any] = {
        "context_limit": 1180,
        "response_reserve": 300,
        "options": options,
        "output_format": pb.OUTPUT_FORMAT_OPENAI_CHAT,
    }
    typed = stub(channel).PreviewContext(pb.PreviewContextRequest(blocks=TYPED, **common), timeout=10).plan
    as_json = (
        stub(channel)
        .PreviewContext(pb.PreviewContextRequest(blocks_json=json.dumps(AS_JSON), **common), timeout=10)
        .plan
    )
    assert typed.truncated and typed.excluded  # the comparison covers a cut and a removal
    assert typed == as_json
    # And both are what the library says for the same input.
    lib = contextshift.shift_context(
        AS_JSON, budget=contextshift.Budget(1180, 300), options={"max_block_chars": 200}
    )
    assert [(d.id, d.tokens, d.reason) for d in typed.kept] == [(d.id, d.tokens, d.reason) for d in lib.kept]


@pytest.mark.parametrize(
    ("output_format", "expected_roles"),
    [
        (
            pb.OUTPUT_FORMAT_OPENAI_CHAT,
            ["system", "system", "user", "assistant", "tool", "user", "assistant", "user"],
        ),
        (pb.OUTPUT_FORMAT_ANTHROPIC_MESSAGES, ["user", "assistant", "user", "assistant", "user"]),
    ],
)
def test_provider_formats(channel: grpc.Channel, output_format: int, expected_roles: list[str]) -> None:
    plan = (
        stub(channel)
        .ShiftContext(
            pb.ShiftContextRequest(blocks=TYPED, output_format=output_format, context_limit=100_000),
            timeout=10,
        )
        .plan
    )
    messages = json.loads(plan.messages.messages_json)
    assert [m["role"] for m in messages] == expected_roles
    if output_format == pb.OUTPUT_FORMAT_ANTHROPIC_MESSAGES:
        assert plan.messages.system.startswith("You are Ada") and "Returns: 30 days." in plan.messages.system
        assert messages[1]["content"][0] == {
            "type": "tool_use",
            "id": "call-1",
            "name": "order_status",
            "input": {"order": 1234},
        }


def test_default_budget_is_design_default(channel: grpc.Channel) -> None:
    plan = stub(channel).PreviewContext(pb.PreviewContextRequest(blocks=TYPED), timeout=10).plan
    assert (plan.context_limit, plan.response_reserve, plan.budget) == (128_000, 64_000, 64_000)


def test_budget_defaults_come_from_the_environment(tmp_path: Any) -> None:
    running = start_server(tmp_path, env={"LLM_CONTEXT_SIZE": "32000", "LLM_MAX_OUTPUT_TOKENS": "8000"})
    try:
        with grpc.insecure_channel(running.address) as chan:
            plan = stub(chan).PreviewContext(pb.PreviewContextRequest(blocks=TYPED), timeout=10).plan
            # The environment comes before the model registry (docs/design.md §5) ...
            gpt = (
                stub(chan)
                .PreviewContext(pb.PreviewContextRequest(blocks=TYPED, model="gpt-4o"), timeout=10)
                .plan
            )
            # ... and the request before both.
            given = (
                stub(chan)
                .PreviewContext(
                    pb.PreviewContextRequest(
                        blocks=TYPED, model="gpt-4o", context_limit=50_000, response_reserve=10_000
                    ),
                    timeout=10,
                )
                .plan
            )
        assert (plan.context_limit, plan.response_reserve, plan.budget) == (32_000, 8_000, 24_000)
        assert (gpt.profile, gpt.context_limit, gpt.response_reserve) == ("o200k_base", 32_000, 8_000)
        assert (given.context_limit, given.response_reserve, given.budget) == (50_000, 10_000, 40_000)
    finally:
        assert running.terminate() == 0


def test_environment_window_wins_over_the_registry_and_the_registry_reserve_applies(tmp_path: Any) -> None:
    running = start_server(tmp_path, env={"LLM_CONTEXT_SIZE": "32000"})
    try:
        with grpc.insecure_channel(running.address) as chan:
            plan = (
                stub(chan)
                .PreviewContext(pb.PreviewContextRequest(blocks=TYPED, model="gpt-4o"), timeout=10)
                .plan
            )
        # Window from LLM_CONTEXT_SIZE; no LLM_MAX_OUTPUT_TOKENS, so the registry's max output,
        # which was meant for gpt-4o's own 128000: at most a quarter of this window.
        assert (plan.profile, plan.context_limit, plan.response_reserve) == ("o200k_base", 32_000, 8_000)
        assert plan.budget == 32_000 - 8_000
    finally:
        assert running.terminate() == 0


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        # A model alone picks the registry's profile, window and max output.
        ({"model": "gpt-4o"}, ("o200k_base", False, "gpt-4o", 128_000, 16_384)),
        ({"model": "gpt-4o-2024-08-06"}, ("o200k_base", False, "gpt-4o-2024-08-06", 128_000, 16_384)),
        ({"model": "claude-sonnet-4-5"}, ("anthropic", True, "claude-sonnet-4-5", 200_000, 64_000)),
        # A profile wins over the model's; the model still gives its window.
        ({"model": "gpt-4o", "profile": "heuristic"}, ("heuristic", True, "gpt-4o", 128_000, 16_384)),
        # A model named as the profile.
        ({"profile": "gpt-4o"}, ("o200k_base", False, "gpt-4o", 128_000, 16_384)),
        # An unknown model: heuristic and the built-in defaults.
        ({"model": "no-such-model"}, ("heuristic", True, "no-such-model", 128_000, 64_000)),
        ({}, ("heuristic", True, "", 128_000, 64_000)),
    ],
)
def test_model_picks_profile_and_window_from_the_registry(
    channel: grpc.Channel, fields: dict[str, Any], expected: tuple[str, bool, str, int, int]
) -> None:
    plan = stub(channel).PreviewContext(pb.PreviewContextRequest(blocks=TYPED, **fields), timeout=10).plan
    assert (plan.profile, plan.approximate, plan.model, plan.context_limit, plan.response_reserve) == expected
    assert ("no-such-model" in " ".join(plan.warnings)) == (fields.get("model") == "no-such-model")
    assert plan.calibration_factor == 1.0 and plan.calibrated_prompt_tokens == plan.prompt_tokens
    # The counts are the library's with the same profile.
    lib = contextshift.shift_context(
        AS_JSON, budget=contextshift.Budget(plan.context_limit, plan.response_reserve), profile=plan.profile
    )
    assert plan.prompt_tokens == lib.prompt_tokens


def test_count_tokens(channel: grpc.Channel) -> None:
    response = stub(channel).CountTokens(
        pb.CountTokensRequest(items=[pb.CountItem(text="hello world"), pb.CountItem(block=TYPED[0])]),
        timeout=10,
    )
    assert list(response.counts) == contextshift.count_tokens(["hello world", AS_JSON[0]])
    assert response.total == sum(response.counts) and response.profile == "heuristic" and response.approximate


def test_count_tokens_unknown_model_falls_back_with_a_warning(channel: grpc.Channel) -> None:
    response = stub(channel).CountTokens(
        pb.CountTokensRequest(items=[pb.CountItem(text="hi")], model="no-such-model"), timeout=10
    )
    assert response.profile == "heuristic" and "no-such-model" in response.warnings[0]


def test_list_tokenizer_profiles(channel: grpc.Channel) -> None:
    response = stub(channel).ListTokenizerProfiles(pb.ListTokenizerProfilesRequest(), timeout=10)
    by_name = {p.name: p for p in response.profiles}
    assert list(by_name) == [p.name for p in profiles.list_profiles()]
    heuristic, o200k = by_name["heuristic"], by_name["o200k_base"]
    assert heuristic.approximate and heuristic.exactness == pb.EXACTNESS_APPROXIMATE
    assert not heuristic.HasField("vocab_size") and not heuristic.HasField("name_overhead")
    assert dict(heuristic.message_overhead) == {"system": 4, "user": 4, "assistant": 4, "tool": 4}
    assert heuristic.prompt_overhead == 0 and heuristic.image_rule == "765 per image"
    assert "semantics.md" in heuristic.source and "semantics.md" in heuristic.overhead_source
    assert heuristic.licence.startswith("Apache-2.0")
    assert not o200k.approximate and o200k.exactness == pb.EXACTNESS_EXACT
    assert o200k.vocab_size == 200_019 and o200k.name_overhead == 1 and o200k.prompt_overhead == 3
    assert dict(o200k.message_overhead) == {"system": 4, "user": 4, "assistant": 4, "tool": 4}
    assert "o200k_base" in o200k.source and o200k.licence == "MIT (tiktoken)"
    assert o200k.image_rule.startswith("OpenAI tiles") and "cookbook" in o200k.overhead_source
    # Every profile, every field, as the library lists it (through the Python client; not closed:
    # the channel is the session's).
    assert contextshift.Client(channel=channel).list_profiles() == profiles.list_profiles()


# --- FinishGeneration: calibration ---------------------------------------------------------------


def fresh_claude() -> str:
    """A model the registry maps to the approximate `anthropic` profile, with no calibration yet in
    the shared server's store (calibration is per model name)."""
    return f"claude-sonnet-4-5-test-{uuid.uuid4().hex[:8]}"


def finish(channel: grpc.Channel, generation_id: str, **fields: Any) -> pb.FinishGenerationResponse:
    request = pb.FinishGenerationRequest(
        generation_id=generation_id, **({"status": pb.GENERATION_STATUS_COMPLETED} | fields)
    )
    response: pb.FinishGenerationResponse = stub(channel).FinishGeneration(request, timeout=10)
    return response


def test_finish_generation_calibrates_approximate_counts(channel: grpc.Channel) -> None:
    model = fresh_claude()
    first = stub(channel).ShiftContext(
        pb.ShiftContextRequest(blocks=TYPED, model=model, context_limit=1200, response_reserve=200),
        timeout=10,
    )
    plan = first.plan
    assert (plan.profile, plan.approximate, plan.model) == ("anthropic", True, model)
    assert plan.calibration_factor == 1.0 and plan.calibrated_prompt_tokens == plan.prompt_tokens
    # The provider counted twice the estimate: the ratio 2.0 moves the factor 0.2 of the way from 1.0.
    response = finish(channel, first.generation_id, reported_prompt_tokens=2 * plan.prompt_tokens)
    assert response.calibration_recorded
    assert (response.calibration.model, response.calibration.samples) == (model, 1)
    assert response.calibration.factor == pytest.approx(1.2)
    # A retried report for the same generation is not counted twice.
    again = finish(channel, first.generation_id, reported_prompt_tokens=2 * plan.prompt_tokens)
    assert not again.calibration_recorded and again.calibration == response.calibration

    later = (
        stub(channel)
        .ShiftContext(
            pb.ShiftContextRequest(blocks=TYPED, model=model, context_limit=1200, response_reserve=200),
            timeout=10,
        )
        .plan
    )
    factor = response.calibration.factor
    assert factor > 1 and later.calibration_factor == pytest.approx(factor)
    assert later.calibrated_prompt_tokens == math.ceil(later.prompt_tokens * factor - 1e-9)
    assert later.prompt_tokens < later.calibrated_prompt_tokens <= later.budget == 1000
    # Block tokens stay raw; the calibrated prompt is fitted, so less of the history fits.
    assert later.prompt_tokens == sum(d.tokens for d in later.kept)
    assert len(later.kept) <= len(plan.kept)
    # PreviewContext applies the calibration too; another model is untouched.
    preview = (
        stub(channel).PreviewContext(pb.PreviewContextRequest(blocks=TYPED, model=model), timeout=10).plan
    )
    assert preview.calibration_factor == pytest.approx(factor)
    other = stub(channel).PreviewContext(
        pb.PreviewContextRequest(blocks=TYPED, model=fresh_claude()), timeout=10
    )
    assert other.plan.calibration_factor == 1.0


def test_finish_generation_without_a_report_or_for_an_exact_profile_records_nothing(
    channel: grpc.Channel,
) -> None:
    model = fresh_claude()
    shifted = stub(channel).ShiftContext(pb.ShiftContextRequest(blocks=TYPED, model=model), timeout=10)
    # Status only (FAILED with its code): valid, nothing to calibrate with, no calibration yet.
    failed = stub(channel).FinishGeneration(
        pb.FinishGenerationRequest(
            generation_id=shifted.generation_id,
            status=pb.GENERATION_STATUS_FAILED,
            error_code="rate_limited",
        ),
        timeout=10,
    )
    assert not failed.calibration_recorded and not failed.HasField("calibration")
    assert (failed.status, failed.provider_error_code) == (
        pb.GENERATION_STATUS_FAILED,
        pb.PROVIDER_ERROR_CODE_RATE_LIMITED,
    )
    # The status-only call did not use up the generation's report: the same status again, now with
    # the provider's count, is accepted and calibrates.
    again = finish(
        channel, shifted.generation_id, status=pb.GENERATION_STATUS_FAILED, reported_prompt_tokens=10_000
    )
    assert again.calibration_recorded and again.provider_error_code == pb.PROVIDER_ERROR_CODE_RATE_LIMITED

    # An exact profile's counts are the model's own: the report is not fed, the factor stays 1.
    exact = stub(channel).ShiftContext(
        pb.ShiftContextRequest(blocks=TYPED, model="gpt-4o", chat_id=f"exact-{uuid.uuid4()}"), timeout=10
    )
    assert not exact.plan.approximate
    response = finish(channel, exact.generation_id, reported_prompt_tokens=2 * exact.plan.prompt_tokens)
    assert not response.calibration_recorded and not response.HasField("calibration")
    later = stub(channel).PreviewContext(pb.PreviewContextRequest(blocks=TYPED, model="gpt-4o"), timeout=10)
    assert later.plan.calibration_factor == 1.0

    # No model: nothing to key a calibration on.
    bare = stub(channel).ShiftContext(
        pb.ShiftContextRequest(blocks=TYPED, chat_id=f"bare-{uuid.uuid4()}"), timeout=10
    )
    response = finish(channel, bare.generation_id, reported_prompt_tokens=50)
    assert not response.calibration_recorded and not response.HasField("calibration")
    assert response.status == pb.GENERATION_STATUS_COMPLETED


def test_finish_generation_through_the_python_client(channel: grpc.Channel) -> None:
    model = fresh_claude()
    client = contextshift.Client(channel=channel)  # not closed: the channel is the session's
    result = client.shift_context(AS_JSON, model=model)
    assert (result.model, result.calibration_factor) == (model, 1.0)
    assert result.calibrated_prompt_tokens == result.prompt_tokens
    finished = client.finish_generation(
        result.generation_id, reported_prompt_tokens=result.prompt_tokens // 2
    )
    assert finished.calibration_recorded and finished.calibration is not None
    assert (finished.calibration.model, finished.calibration.samples) == (model, 1)
    assert finished.calibration.factor == pytest.approx(0.9)  # ratio 0.5: 1.0 + 0.2 * (0.5 - 1.0)
    later = client.preview_context(AS_JSON, model=model)
    assert later.calibration_factor == pytest.approx(0.9)
    assert later.calibrated_prompt_tokens is not None
    assert later.calibrated_prompt_tokens < later.prompt_tokens
    with pytest.raises(contextshift.InvalidOptions) as invalid_error:
        client.finish_generation(result.generation_id, "failed", reported_prompt_tokens=0)
    assert [v.field for v in invalid_error.value.violations] == ["reported_prompt_tokens"]
    with pytest.raises(grpc.RpcError) as rpc_error:
        client.finish_generation("no-such-generation")
    assert rpc_error.value.code() == grpc.StatusCode.NOT_FOUND


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, {"generation_id", "status"}),
        ({"generation_id": "g"}, {"status"}),
        ({"generation_id": "g", "status": 99}, {"status"}),
        ({"generation_id": "g", "status": pb.GENERATION_STATUS_COMPLETED, "error_code": "x"}, {"error_code"}),
        ({"generation_id": "g", "status": pb.GENERATION_STATUS_CANCELLED, "error_code": "x"}, {"error_code"}),
        (
            {
                "generation_id": "g",
                "status": pb.GENERATION_STATUS_COMPLETED,
                "provider_error": {"http_status": 429},
            },
            {"provider_error"},
        ),
        (
            {
                "generation_id": "g",
                "status": pb.GENERATION_STATUS_FAILED,
                "provider_error": {"http_status": 429},
                "error_code": "rate_limited",
            },
            {"error_code"},
        ),
        ({"generation_id": "g" * 257, "status": pb.GENERATION_STATUS_COMPLETED}, {"generation_id"}),
        ({"generation_id": "g", "chat_id": "c\n", "status": pb.GENERATION_STATUS_COMPLETED}, {"chat_id"}),
        (
            {"generation_id": "g", "status": pb.GENERATION_STATUS_COMPLETED, "reported_prompt_tokens": 0},
            {"reported_prompt_tokens"},
        ),
        (
            {"status": pb.GENERATION_STATUS_FAILED, "error_code": "x", "reported_prompt_tokens": -3},
            {"generation_id", "reported_prompt_tokens"},
        ),
    ],
)
def test_finish_generation_validation(
    channel: grpc.Channel, fields: dict[str, Any], expected: set[str]
) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        stub(channel).FinishGeneration(pb.FinishGenerationRequest(**fields), timeout=10)
    assert set(violations(caught.value)) == expected


TERMINAL = "GENERATION_STATUS_COMPLETED, GENERATION_STATUS_FAILED, GENERATION_STATUS_CANCELLED"


@pytest.mark.parametrize(
    ("status", "message"),
    [
        (pb.GENERATION_STATUS_UNSPECIFIED, f"not set: one of {TERMINAL}"),
        (pb.GENERATION_STATUS_PENDING, f"GENERATION_STATUS_PENDING is not allowed: one of {TERMINAL}"),
        (42, f"unknown value 42: one of {TERMINAL}"),
    ],
)
def test_finish_generation_says_what_is_wrong_with_its_status(
    channel: grpc.Channel, status: int, message: str
) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        stub(channel).FinishGeneration(
            pb.FinishGenerationRequest(generation_id="g", status=status), timeout=10
        )
    assert message in violations(caught.value)["status"]


def test_finish_generation_of_an_unknown_generation_is_not_found(channel: grpc.Channel) -> None:
    # PreviewContext writes nothing, so nothing of it can be finished either.
    stub(channel).PreviewContext(pb.PreviewContextRequest(blocks=TYPED, model=fresh_claude()), timeout=10)
    with pytest.raises(grpc.RpcError) as caught:
        finish(channel, "0190a3b4-no-such-generation", reported_prompt_tokens=100)
    code, found = details(caught.value)
    assert code == grpc.StatusCode.NOT_FOUND and found == []
    assert "0190a3b4-no-such-generation" in (caught.value.details() or "")
    assert "is not stored" in (caught.value.details() or "")


def test_echo_returns_its_payload(channel: grpc.Channel) -> None:
    payload = pb.ShiftContextRequest(blocks=TYPED)
    echo = echo_service_pb2_grpc.EchoServiceStub(channel)
    assert echo.Echo(echo_service_pb2.EchoRequest(payload=payload), timeout=10).payload == payload
    reply = echo.EchoBytes(echo_service_pb2.EchoBytesRequest(payload=payload), timeout=10)
    assert reply.payload == payload


# --- errors -------------------------------------------------------------------------------------


def test_token_budget_exceeded_is_failed_precondition_with_error_info(channel: grpc.Channel) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        stub(channel).ShiftContext(pb.ShiftContextRequest(blocks=TYPED, context_limit=40), timeout=10)
    code, (info,) = details(caught.value)
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert (info.reason, info.domain) == ("TOKEN_BUDGET_EXCEEDED", "contextshift.v1")
    assert dict(info.metadata) == {  # 40 less a default reserve of a quarter of it
        "protected_tokens": info.metadata["protected_tokens"],
        "budget": "30",
        "tools_tokens": "0",
    }
    assert int(info.metadata["protected_tokens"]) > 30


WEATHER_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_current_weather",
            "description": "Get the current weather in a given location",
            "parameters": {"type": "object", "properties": {"location": {"type": "string"}}},
        },
    }
]


def test_tools_json_is_counted_and_taken_from_the_budget(channel: grpc.Channel) -> None:
    blocks = [{"role": "user", "content": "old " * 170}, {"role": "user", "content": "Weather in Oslo?"}]
    common = {"blocks_json": json.dumps(blocks), "profile": "o200k_base", "context_limit": 200}
    without = stub(channel).PreviewContext(pb.PreviewContextRequest(**common, response_reserve=0), timeout=10)
    assert without.plan.tools_tokens == 0 and not without.plan.excluded
    request = pb.ShiftContextRequest(**common, response_reserve=0, tools_json=json.dumps(WEATHER_TOOLS))
    plan = stub(channel).ShiftContext(request, timeout=10).plan
    library = contextshift.shift_context(blocks, budget=200, profile="o200k_base", tools=WEATHER_TOOLS)
    assert plan.tools_tokens == library.tools_tokens > 0
    assert [d.id for d in plan.excluded] == ["#0"]  # the tools left no room for the old message
    assert plan.prompt_tokens + plan.tools_tokens <= plan.budget
    # Too small for the tools and the protected input: the numbers, the tools apart.
    with pytest.raises(grpc.RpcError) as caught:
        stub(channel).ShiftContext(
            pb.ShiftContextRequest(**{**common, "context_limit": 40}, tools_json=json.dumps(WEATHER_TOOLS)),
            timeout=10,
        )
    code, (info,) = details(caught.value)
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert info.metadata["tools_tokens"] == str(library.tools_tokens)
    with pytest.raises(contextshift.TokenBudgetExceeded) as raised:
        contextshift.Client(channel=channel).shift_context(
            blocks, budget=20, profile="o200k_base", tools=WEATHER_TOOLS
        )
    assert raised.value.tools_tokens == library.tools_tokens


def test_bad_tools_json_names_the_field(channel: grpc.Channel) -> None:
    tools = [WEATHER_TOOLS[0], {"type": "function", "function": {"description": "no name"}}]
    request = pb.ShiftContextRequest(blocks=TYPED, tools_json=json.dumps(tools))
    with pytest.raises(grpc.RpcError) as caught:
        stub(channel).ShiftContext(request, timeout=10)
    assert list(violations(caught.value)) == ["tools_json[1].function.name"]
    with pytest.raises(contextshift.InvalidTools) as raised:
        contextshift.Client(channel=channel).shift_context(AS_JSON, budget=1000, tools=tools)
    assert [v.field for v in raised.value.violations] == ["tools_json[1].function.name"]


def test_bad_json_blocks_name_index_and_field(channel: grpc.Channel) -> None:
    blocks = [
        {"role": "user", "content": "hi"},
        {"role": "robot", "content": "x"},
        {"role": "user", "relevance": "high"},
    ]
    with pytest.raises(grpc.RpcError) as caught:
        stub(channel).ShiftContext(pb.ShiftContextRequest(blocks_json=json.dumps(blocks)), timeout=10)
    assert set(violations(caught.value)) == {"blocks[1].role", "blocks[2].relevance"}


def test_bad_typed_blocks_name_the_proto_fields(channel: grpc.Channel) -> None:
    blocks = [
        block_pb2.Block(role=block_pb2.ROLE_USER, parts=[block_pb2.Part(tool_result=block_pb2.ToolResult())]),
        block_pb2.Block(id="x", role=block_pb2.ROLE_ASSISTANT, tool_calls=[block_pb2.ToolCall(id="")]),
        block_pb2.Block(id="x", role=block_pb2.ROLE_USER, relevance=float("nan")),
    ]
    with pytest.raises(grpc.RpcError) as caught:
        stub(channel).ShiftContext(pb.ShiftContextRequest(blocks=blocks), timeout=10)
    assert set(violations(caught.value)) == {
        "blocks[0].parts[0].tool_result.tool_call_id",
        "blocks[1].tool_calls[0].id",
        "blocks[2].id",  # repeats blocks[1]'s
        "blocks[2].relevance",
    }


def test_typed_block_without_role_or_with_both_contents(channel: grpc.Channel) -> None:
    for block, field in [
        (block_pb2.Block(content="hi"), "blocks[0].role"),
        (
            block_pb2.Block(role=block_pb2.ROLE_USER, content="a", parts=[block_pb2.Part(text="b")]),
            "blocks[0].content",
        ),
        (block_pb2.Block(role=block_pb2.ROLE_USER, parts=[block_pb2.Part()]), "blocks[0].parts[0]"),
    ]:
        with pytest.raises(grpc.RpcError) as caught:
            stub(channel).PreviewContext(pb.PreviewContextRequest(blocks=[block]), timeout=10)
        assert list(violations(caught.value)) == [field]


def test_bad_options_budget_profile_strategy(channel: grpc.Channel) -> None:
    options = struct_pb2.Struct()
    options.update({"max_block_chars": 100.5, "pinned_cap": 3, "nope": True})
    cases: list[tuple[dict[str, Any], set[str]]] = [
        ({"options": options}, {"options.max_block_chars", "options.pinned_cap", "options.nope"}),
        ({"context_limit": 0}, {"context_limit"}),
        ({"response_reserve": -1}, {"response_reserve"}),
        ({"profile": "no-such-profile"}, {"profile"}),
        ({"strategy": "no-such-strategy"}, {"strategy"}),
        ({"blocks_json": "[]"}, {"blocks_json"}),  # together with typed blocks
        ({"output_format": 99}, {"output_format"}),
    ]
    for fields, expected in cases:
        with pytest.raises(grpc.RpcError) as caught:
            stub(channel).ShiftContext(pb.ShiftContextRequest(blocks=TYPED, **fields), timeout=10)
        assert set(violations(caught.value)) == expected, fields


def test_malformed_json_is_invalid_argument(channel: grpc.Channel) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        stub(channel).ShiftContext(pb.ShiftContextRequest(blocks_json='[{"role": "user"'), timeout=10)
    assert list(violations(caught.value)) == ["blocks_json"]


@pytest.mark.parametrize(
    ("blocks_json", "field", "description"),
    [
        (r'[{"role":"user","content":"a\ud83db"}]', "blocks_json", "unpaired UTF-16 surrogate"),
        ('[{"role":"user","content":"x","relevance":1e999}]', "blocks_json", "number out of range"),
        ('[{"role":"user","role":"assistant","content":"x"}]', "blocks[0].role", 'duplicate key "role"'),
    ],
)
def test_json_text_errors_name_what_and_where(
    channel: grpc.Channel, blocks_json: str, field: str, description: str
) -> None:
    """The cases of issue #12 that the reader once answered wrongly, over the wire."""
    with pytest.raises(grpc.RpcError) as caught:
        stub(channel).ShiftContext(pb.ShiftContextRequest(blocks_json=blocks_json), timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    found = violations(caught.value)
    assert list(found) == [field] and description in found[field], found


def raw_shift(channel: grpc.Channel, encoded: bytes) -> pb.ShiftContextResponse:
    """ShiftContext with a request encoded by hand (bytes a protobuf library would not write)."""
    call = channel.unary_unary(
        "/contextshift.v1.ContextShiftService/ShiftContext",
        response_deserializer=pb.ShiftContextResponse.FromString,
    )
    response: pb.ShiftContextResponse = call(encoded, timeout=10)
    return response


def blocks_json_field(payload: bytes) -> bytes:
    assert len(payload) < 128  # a one-byte length
    return bytes([pb.ShiftContextRequest.BLOCKS_JSON_FIELD_NUMBER << 3 | 2, len(payload)]) + payload


def test_blocks_json_is_read_as_protobuf_reads_it(channel: grpc.Channel) -> None:
    """The server takes blocks_json out of the encoded request itself: a repeated field's last
    occurrence wins, as in any protobuf parser, and the other fields are read as usual."""
    first = blocks_json_field(b'[{"id": "x", "role": "user", "content": "ignored"}]')
    last = blocks_json_field('[{"id": "é", "role": "user", "content": "kept 🚲"}]'.encode())
    encoded = pb.ShiftContextRequest(generation_id="g-raw").SerializeToString() + first + last
    response = raw_shift(channel, encoded)
    assert response.generation_id == "g-raw"
    assert [d.id for d in response.plan.kept] == ["é"]
    assert response.plan.messages.messages_json == '[{"id": "é", "role": "user", "content": "kept 🚲"}]'


def test_kept_blocks_go_back_byte_for_byte_and_cut_ones_re_serialized(channel: grpc.Channel) -> None:
    system = '{"role":"system",  "content":"Be brief. 🚲"}'
    user = {"role": "user", "content": "long " * 50}
    options = struct_pb2.Struct()
    options.update({"max_block_chars": 64})
    request = pb.ShiftContextRequest(blocks_json=f" [ {system},\n{json.dumps(user)} ]", options=options)
    plan = stub(channel).ShiftContext(request, timeout=10).plan
    assert [t.id for t in plan.truncated] == ["#1"]
    (_, cut) = contextshift.shift_context(
        [json.loads(system), user], budget=100_000, options={"max_block_chars": 64}
    ).messages
    assert cut["content"] != user["content"]
    assert (
        plan.messages.messages_json
        == f"[{system},{json.dumps(cut, ensure_ascii=False, separators=(',', ':'))}]"
    )


@pytest.mark.parametrize(
    ("encoded", "field", "description"),
    [
        (b"\x12\x05[]", "request", "field runs past the end of the message at byte 0"),
        (b"\x0b", "request", "unsupported wire type"),
        (pb.ShiftContextRequest(chat_id="c").SerializeToString()[:-1], "request", "not an encoded"),
        (blocks_json_field(b'[{"role": "user", "content": "\xff"}]'), "blocks_json", "not UTF-8"),
    ],
)
def test_undecodable_requests_are_invalid_argument(
    channel: grpc.Channel, encoded: bytes, field: str, description: str
) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        raw_shift(channel, encoded)
    found = violations(caught.value)
    assert list(found) == [field] and description in found[field], found


def test_count_tokens_bad_typed_block(channel: grpc.Channel) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        stub(channel).CountTokens(
            pb.CountTokensRequest(items=[pb.CountItem(), pb.CountItem(block=block_pb2.Block())])
        )
    assert set(violations(caught.value)) == {"items[0]"}
    with pytest.raises(grpc.RpcError) as caught:
        stub(channel).CountTokens(pb.CountTokensRequest(items=[pb.CountItem(block=block_pb2.Block())]))
    assert set(violations(caught.value)) == {"items[0].block.role"}


def test_oversize_request_and_overload_are_resource_exhausted(tmp_path: Any) -> None:
    running = start_server(tmp_path, "--max-request-bytes", "65536", "--max-concurrent-rpcs", "1")
    try:
        with grpc.insecure_channel(running.address) as chan:
            with pytest.raises(grpc.RpcError) as caught:
                stub(chan).PreviewContext(
                    pb.PreviewContextRequest(blocks_json="[" + " " * 70_000 + "]"), timeout=10
                )
            assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            # A health Watch stream holds the only slot; the next call is refused, not queued.
            watch = health_pb2_grpc.HealthStub(chan).Watch(
                health_pb2.HealthCheckRequest(service=""), timeout=10
            )
            assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
            with pytest.raises(grpc.RpcError) as caught:
                stub(chan).PreviewContext(pb.PreviewContextRequest(blocks=TYPED), timeout=10)
            assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            watch.cancel()
    finally:
        assert running.terminate() == 0


# --- health, reflection, deadlines, cancellation ------------------------------------------------


def test_health_serving(server: ServerProcess) -> None:
    for service in ("", "contextshift.v1.ContextShiftService"):
        assert health_status(server.address, service) == health_pb2.HealthCheckResponse.SERVING


def test_reflection_lists_and_describes_the_service(channel: grpc.Channel) -> None:
    database = ProtoReflectionDescriptorDatabase(channel)
    assert {"contextshift.v1.ContextShiftService", "grpc.health.v1.Health"} <= set(database.get_services())
    service = descriptor_pool.DescriptorPool(database).FindServiceByName(
        "contextshift.v1.ContextShiftService"
    )
    assert {m.name for m in service.methods} == {
        "ShiftContext",
        "PreviewContext",
        "CountTokens",
        "ListTokenizerProfiles",
        "GetContextAudit",
        "ListChats",
        "FinishGeneration",
        "DeleteChat",
        "ListStrategies",
        "AppendBlocks",
        "SetModelConfig",
        "GetModelConfig",
        "ListModelConfigs",
        "DeleteModelConfig",
        "BenchmarkProfiles",
    }


def test_deadline_expiry(gated: tuple[ServerProcess, Gate]) -> None:
    server, gate = gated
    request = pb.PreviewContextRequest(blocks=TYPED)
    with grpc.insecure_channel(server.address) as channel:
        with pytest.raises(grpc.RpcError) as caught:
            stub(channel).PreviewContext(request, timeout=0.5)  # the gate holds the engine past it
        assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        # The server logged the call as expired. Its copy of the deadline runs out a little after
        # the client's: the gate opens only then, else the held call could finish first (CI saw
        # it answer OK at 498 ms into its 500).
        wait_for_log(server, "/contextshift.v1.ContextShiftService/PreviewContext", "DEADLINE_EXCEEDED")
        gate.open()
        # The server goes on serving.
        assert stub(channel).PreviewContext(request, timeout=10).plan.kept


def test_cancellation(gated: tuple[ServerProcess, Gate]) -> None:
    server, gate = gated
    request = pb.ShiftContextRequest(blocks=TYPED)

    async def cancel_in_flight() -> None:
        async with grpc.aio.insecure_channel(server.address) as chan:
            call = context_service_pb2_grpc.ContextShiftServiceStub(chan).ShiftContext(request, timeout=30)
            await asyncio.get_running_loop().run_in_executor(None, gate.wait_entered)
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            assert await call.code() == grpc.StatusCode.CANCELLED

    asyncio.run(cancel_in_flight())
    # Seen by the server before the gate opens: opened first, the held call could finish and
    # answer before the client's reset arrives.
    wait_for_log(server, "/contextshift.v1.ContextShiftService/ShiftContext", "CANCELLED")
    gate.open()


def wait_for_log(server: ServerProcess, method: str, status: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(line.get("method") == method and line.get("status") == status for line in server.log_lines()):
            return
        time.sleep(0.05)
    raise AssertionError(f"no {status} log line for {method}")


def test_log_lines_carry_no_message_content(server: ServerProcess, channel: grpc.Channel) -> None:
    stub(channel).ShiftContext(pb.ShiftContextRequest(blocks=TYPED), timeout=10)
    text = server.log_path.read_text()
    assert "bicycle" not in text and "sealant" not in text
    line = next(x for x in reversed(server.log_lines()) if x.get("method", "").endswith("/ShiftContext"))
    assert {"method", "status", "duration_ms", "shift_ms", "blocks", "tokens", "pid"} <= line.keys()
    assert 0 < line["shift_ms"] <= line["duration_ms"]  # the shift is part of the call


def test_concurrent_calls_all_answered(channel: grpc.Channel) -> None:
    results: list[int] = []

    def call() -> None:
        plan = (
            stub(channel)
            .PreviewContext(pb.PreviewContextRequest(blocks=TYPED, context_limit=1200), timeout=10)
            .plan
        )
        results.append(plan.prompt_tokens)

    threads = [threading.Thread(target=call) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 16 and len(set(results)) == 1


def test_benchmark_profiles_on_the_callers_corpus(channel: grpc.Channel) -> None:
    request = pb.BenchmarkProfilesRequest(
        documents=[json.dumps(AS_JSON), "A paragraph of plain text.\n\nAnd another one."],
        profiles=["heuristic", "gpt-4o"],
    )
    response = stub(channel).BenchmarkProfiles(request, timeout=60)
    assert (response.documents, response.messages) == (2, len(AS_JSON) + 2)
    assert [t.profile for t in response.throughput] == ["heuristic", "o200k_base"]
    assert all(
        t.tokens > 0 and t.single_thread_mb_per_s > 0 and t.batch_mb_per_s > 0 for t in response.throughput
    )
    [accuracy] = response.accuracy
    assert (accuracy.profile, accuracy.reference) == ("heuristic", "o200k_base")
    assert accuracy.messages > 0 and accuracy.p95_relative_error > 0
    # No documents: the sample corpus shipped with the server.
    sample = stub(channel).BenchmarkProfiles(pb.BenchmarkProfilesRequest(profiles=["heuristic"]), timeout=60)
    assert sample.documents == 4


def test_benchmark_profiles_is_bounded_and_names_bad_fields(channel: grpc.Channel) -> None:
    too_large = pb.BenchmarkProfilesRequest(documents=["x" * (1 << 20), "y"], profiles=["heuristic"])
    with pytest.raises(grpc.RpcError) as caught:
        stub(channel).BenchmarkProfiles(too_large, timeout=60)
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    with pytest.raises(grpc.RpcError) as caught:
        stub(channel).BenchmarkProfiles(pb.BenchmarkProfilesRequest(profiles=["nope"]), timeout=60)
    assert list(violations(caught.value)) == ["profiles[0]"]
    with pytest.raises(grpc.RpcError) as caught:
        stub(channel).BenchmarkProfiles(pb.BenchmarkProfilesRequest(documents=["[]"]), timeout=60)
    assert list(violations(caught.value)) == ["corpus"]
