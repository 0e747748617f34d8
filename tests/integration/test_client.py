"""`contextshift.Client` and `AsyncClient` against the real server: a method for every RPC, and the
errors raised by the ErrorInfo reason the server gives (the library's where one stands for it, else
a `ServiceError` that is still a `grpc.RpcError`)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator

import grpc
import pytest

import contextshift
from contextshift._proto.contextshift.v1 import context_service_pb2 as pb
from contextshift.client import ServiceError
from contextshift.errors import ErrorReason

from .conftest import ServerProcess
from .test_grpc_service import AS_JSON

SERVICE = pb.DESCRIPTOR.services_by_name["ContextShiftService"]
# Each RPC and the clients' method for it.
METHODS = {
    "ShiftContext": "shift_context",
    "PreviewContext": "preview_context",
    "CountTokens": "count_tokens",
    "ListTokenizerProfiles": "list_profiles",
    "GetContextAudit": "get_context_audit",
    "ListChats": "list_chats",
    "FinishGeneration": "finish_generation",
    "DeleteChat": "delete_chat",
    "AppendBlocks": "append_blocks",
    "SetModelConfig": "set_model_config",
    "GetModelConfig": "get_model_config",
    "ListModelConfigs": "list_model_configs",
    "DeleteModelConfig": "delete_model_config",
    "ListStrategies": "list_strategies",
    "BenchmarkProfiles": "benchmark_profiles",
}


@pytest.fixture
def client(server: ServerProcess) -> Iterator[contextshift.Client]:
    with contextshift.Client(server.address) as c:
        yield c


def test_both_clients_have_a_method_for_every_rpc() -> None:
    assert set(METHODS) == {m.name for m in SERVICE.methods}
    for name in METHODS.values():
        assert callable(getattr(contextshift.Client, name)), name
        assert asyncio.iscoroutinefunction(getattr(contextshift.AsyncClient, name)), name


def test_a_chat_through_every_store_rpc(client: contextshift.Client) -> None:
    chat = f"client-{uuid.uuid4()}"
    appended = client.append_blocks(chat, AS_JSON[:2], profile="o200k_base")
    assert (appended.block_count, appended.profile, len(appended.tokens)) == (2, "o200k_base", 2)
    result = client.shift_context(AS_JSON[2:], chat_id=chat, budget=100_000)
    audit = client.get_context_audit(chat)
    assert (audit.chat_id, audit.generation_id) == (chat, result.generation_id)
    assert audit.status == pb.GENERATION_STATUS_PENDING
    finished = client.finish_generation(result.generation_id, "completed", chat_id=chat)
    assert finished.status == "completed"
    with pytest.raises(ServiceError) as again:  # another status than the one reported
        client.finish_generation(result.generation_id, "failed", chat_id=chat)
    assert again.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert again.value.reason == ErrorReason.GENERATION_ALREADY_FINISHED
    assert again.value.metadata["status"] == "COMPLETED"
    assert client.delete_chat(chat) is True
    with pytest.raises(ServiceError) as gone:
        client.get_context_audit(chat)
    assert (gone.value.code(), gone.value.reason) == (grpc.StatusCode.NOT_FOUND, "")
    assert isinstance(gone.value, grpc.RpcError) and isinstance(gone.value, contextshift.ContextShiftError)
    assert client.delete_chat(chat) is False


def test_model_configurations_and_the_profile_benchmark(client: contextshift.Client) -> None:
    model = f"client-model-{uuid.uuid4()}"
    stored = client.set_model_config(pb.ModelConfig(model=model, context_size=9000, profile="o200k_base"))
    assert (stored.model, stored.context_size) == (model, 9000)
    assert client.get_model_config(model).profile == "o200k_base"
    assert model in {c.model for c in client.list_model_configs()}
    with pytest.raises(contextshift.InvalidOptions):
        client.get_model_config(model, role="slow")  # refused before it is sent
    assert client.delete_model_config(model) is True
    with pytest.raises(ServiceError) as missing:
        client.get_model_config(model)
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    report = client.benchmark_profiles(["One paragraph.\n\nAnother one, longer."], ["heuristic"])
    assert (report.documents, report.messages) == (1, 2)
    assert [t.profile for t in report.throughput] == ["heuristic"]


@pytest.mark.parametrize(
    ("call", "expected", "field"),
    [
        (lambda c: c.preview_context([{"role": "robot"}]), contextshift.InvalidBlocks, "blocks[0].role"),
        (
            lambda c: c.preview_context(AS_JSON, tools=[{"type": 3}]),
            contextshift.InvalidTools,
            "tools_json[0]",
        ),
        (lambda c: c.preview_context(AS_JSON, strategy="nope"), contextshift.InvalidOptions, "strategy"),
        (lambda c: c.shift_context(AS_JSON, chat_id="a\nb"), contextshift.InvalidOptions, "chat_id"),
        (lambda c: c.count_tokens(["x"], "no-such-profile"), contextshift.InvalidOptions, "profile"),
    ],
)
def test_bad_input_is_the_library_error_its_reason_names(
    client: contextshift.Client, call: object, expected: type[contextshift.InvalidInput], field: str
) -> None:
    with pytest.raises(expected) as caught:
        call(client)  # type: ignore[operator]
    assert type(caught.value) is expected
    assert any(v.field.startswith(field) for v in caught.value.violations), caught.value.violations


def test_protected_blocks_over_the_budget(client: contextshift.Client) -> None:
    with pytest.raises(contextshift.TokenBudgetExceeded) as caught:
        client.preview_context([{"role": "system", "content": "x " * 500}], budget=20)
    assert caught.value.budget == 20 and caught.value.protected_tokens > 20


def test_the_async_client_calls_and_raises_alike(server: ServerProcess) -> None:
    async def scenario() -> None:
        async with contextshift.AsyncClient(server.address) as client:
            counts = await client.count_tokens(["hello", "world"], "heuristic")
            assert counts == contextshift.count_tokens(["hello", "world"], "heuristic")
            chat = f"async-{uuid.uuid4()}"
            await client.append_blocks(chat, json.dumps(AS_JSON[:1]))
            assert (await client.list_profiles()) and (await client.list_strategies()).strategies
            with pytest.raises(ServiceError) as caught:
                await client.get_context_audit(chat)  # appended, never shifted: no audit
            assert caught.value.code() == grpc.StatusCode.NOT_FOUND
            assert await client.delete_chat(chat) is True
            with pytest.raises(contextshift.InvalidBlocks):
                await client.shift_context([{"role": "robot"}])

    asyncio.run(scenario())
