"""API keys and tenants on both surfaces: every RPC and route refuses a call without a valid key,
health and metrics stay open, and a tenant reaches only its own generations, chats (audits and
stored history) and model configurations, even with the same ids: the matrix below runs every
chat RPC and route for each tenant against the other's data."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

import contextshift
from contextshift._proto.contextshift.v1 import context_service_pb2 as pb
from contextshift._proto.contextshift.v1 import context_service_pb2_grpc
from contextshift.api.http import OPERATIONS

from .conftest import ServerProcess, start_server
from .test_grpc_service import AS_JSON

KEYS = {"acme": "acme-key-0123456789abcdef", "globex": "globex-key-0123456789abcdef"}
TEXT = json.dumps(AS_JSON)
REQUESTS: dict[str, Any] = {
    "ShiftContext": pb.ShiftContextRequest(blocks_json=TEXT, chat_id="chat-1"),
    "PreviewContext": pb.PreviewContextRequest(blocks_json=TEXT),
    "CountTokens": pb.CountTokensRequest(items=[pb.CountItem(text="hi")]),
    "ListTokenizerProfiles": pb.ListTokenizerProfilesRequest(),
    "GetContextAudit": pb.GetContextAuditRequest(chat_id="chat-1"),
    "FinishGeneration": pb.FinishGenerationRequest(generation_id="g", status=pb.GENERATION_STATUS_COMPLETED),
    "DeleteChat": pb.DeleteChatRequest(chat_id="chat-1"),
    "ListStrategies": pb.ListStrategiesRequest(),
    "AppendBlocks": pb.AppendBlocksRequest(chat_id="chat-1", blocks_json=TEXT),
    "SetModelConfig": pb.SetModelConfigRequest(config=pb.ModelConfig(model="m", context_size=9000)),
    "GetModelConfig": pb.GetModelConfigRequest(model="m"),
    "ListModelConfigs": pb.ListModelConfigsRequest(),
    "DeleteModelConfig": pb.DeleteModelConfigRequest(model="m"),
    "BenchmarkProfiles": pb.BenchmarkProfilesRequest(documents=["hello there"], profiles=["heuristic"]),
}
BODIES: dict[str, Any] = {
    "ShiftContext": {"blocksJson": TEXT, "chatId": "chat-1"},
    "PreviewContext": {"blocksJson": TEXT},
    "CountTokens": {"items": [{"text": "hi"}]},
    "FinishGeneration": {"status": "GENERATION_STATUS_COMPLETED"},
    "AppendBlocks": {"blocksJson": TEXT},
    "SetModelConfig": {"config": {"model": "m", "contextSize": 9000}},
}


def test_every_rpc_is_in_the_matrix() -> None:
    assert set(REQUESTS) == {m.name for m in pb.DESCRIPTOR.services_by_name["ContextShiftService"].methods}


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    directory = tmp_path_factory.mktemp("keys")
    keys = directory / "keys.txt"
    keys.write_text(f"acme:{KEYS['acme']}\n")
    # One tenant from the file, one from the environment.
    env = {"CONTEXTSHIFT_API_KEYS": f"globex:{KEYS['globex']}"}
    running = start_server(directory, "--api-keys-file", str(keys), env=env)
    yield running
    assert running.terminate() == 0


def metadata(tenant: str | None) -> tuple[tuple[str, str], ...]:
    return () if tenant is None else (("authorization", f"Bearer {KEYS[tenant]}"),)


def headers(tenant: str | None) -> dict[str, str]:
    return {} if tenant is None else {"authorization": f"Bearer {KEYS[tenant]}"}


def call_rpc(server: ServerProcess, rpc: str, request: Any, meta: tuple[tuple[str, str], ...]) -> Any:
    with grpc.insecure_channel(server.address) as channel:
        stub = context_service_pb2_grpc.ContextShiftServiceStub(channel)
        return getattr(stub, rpc)(request, metadata=meta, timeout=10)


def call_route(
    server: ServerProcess, rpc: str, auth: dict[str, str], path_id: str = "chat-1"
) -> httpx.Response:
    op = next(op for op in OPERATIONS if op.rpc == rpc)
    with httpx.Client(base_url=server.http_url, timeout=10) as client:
        return client.request(
            op.http_method,
            op.path.replace("{id}", path_id),
            json=BODIES.get(rpc) if op.body else None,
            headers=auth,
        )


@pytest.mark.parametrize("rpc", sorted(REQUESTS))
@pytest.mark.parametrize(
    "bad", [(), (("authorization", "Bearer not-a-key-of-anyone-at-all"),), (("authorization", KEYS["acme"]),)]
)
def test_every_rpc_refuses_a_call_without_a_valid_key(
    keyed: ServerProcess, rpc: str, bad: tuple[tuple[str, str], ...]
) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        call_rpc(keyed, rpc, REQUESTS[rpc], bad)
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED


@pytest.mark.parametrize("rpc", sorted(op.rpc for op in OPERATIONS))
@pytest.mark.parametrize("bad", [{}, {"authorization": "Bearer not-a-key-of-anyone-at-all"}])
def test_every_route_refuses_a_call_without_a_valid_key(
    keyed: ServerProcess, rpc: str, bad: dict[str, str]
) -> None:
    response = call_route(keyed, rpc, bad)
    assert response.status_code == 401 and response.headers["www-authenticate"] == "Bearer"
    assert response.json()["error"]["status"] == "UNAUTHENTICATED"


def test_health_reflection_metrics_and_the_page_need_no_key(keyed: ServerProcess) -> None:
    with grpc.insecure_channel(keyed.address) as channel:
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        assert (
            "contextshift.v1.ContextShiftService" in ProtoReflectionDescriptorDatabase(channel).get_services()
        )
    with httpx.Client(base_url=keyed.http_url, timeout=10) as client:
        for path in ("/healthz", "/readyz", "/metrics", "/openapi.json", "/", "/static/app.js"):
            assert client.get(path).status_code == 200, path


def test_a_valid_key_is_served_as_its_tenant(keyed: ServerProcess) -> None:
    for tenant in KEYS:
        assert call_rpc(keyed, "PreviewContext", REQUESTS["PreviewContext"], metadata(tenant)).plan.kept
        assert call_route(keyed, "PreviewContext", headers(tenant)).status_code == 200
    with contextshift.Client(keyed.address, api_key=KEYS["acme"]) as client:
        assert client.count_tokens(["abcde"]) == [2]
        assert client.list_profiles() and client.list_strategies().strategies

    async def listed() -> int:
        async with contextshift.AsyncClient(keyed.address, api_key=KEYS["acme"]) as client:
            return len((await client.list_strategies()).strategies)

    assert asyncio.run(listed()) > 0
    lines = keyed.log_lines()
    served = [line for line in lines if line.get("status") in ("OK", "200")]
    assert {
        line.get("tenant") for line in served if line["method"].endswith(("PreviewContext", "preview"))
    } == {
        "acme",
        "globex",
    }
    assert not any(key in keyed.log_path.read_text() for key in KEYS.values())


def test_a_tenant_finishes_only_its_own_generations_even_with_the_same_id(keyed: ServerProcess) -> None:
    models = {"acme": "claude-sonnet-4-5-acme", "globex": "claude-sonnet-4-5-globex"}
    with grpc.insecure_channel(keyed.address) as channel:
        stub = context_service_pb2_grpc.ContextShiftServiceStub(channel)
        # Both tenants choose the same generation id.
        for tenant, model in models.items():
            request = pb.ShiftContextRequest(blocks_json=TEXT, model=model, generation_id="shared-id")
            stub.ShiftContext(request, metadata=metadata(tenant), timeout=10)
        only_acme = pb.ShiftContextRequest(blocks_json=TEXT, model=models["acme"], generation_id="acme-only")
        stub.ShiftContext(only_acme, metadata=metadata("acme"), timeout=10)

        def finish(tenant: str, generation: str) -> pb.FinishGenerationResponse:
            request = pb.FinishGenerationRequest(
                generation_id=generation, status=pb.GENERATION_STATUS_COMPLETED, reported_prompt_tokens=400
            )
            response: pb.FinishGenerationResponse = stub.FinishGeneration(
                request, metadata=metadata(tenant), timeout=10
            )
            return response

        for tenant, model in models.items():  # each finds its own generation behind the shared id
            assert finish(tenant, "shared-id").calibration.model == model
        with pytest.raises(grpc.RpcError) as caught:
            finish("globex", "acme-only")
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    over_http = call_route(keyed, "FinishGeneration", headers("globex"), path_id="acme-only")
    assert over_http.status_code == 404
    assert call_route(keyed, "FinishGeneration", headers("acme"), path_id="acme-only").status_code == 200


def other(tenant: str) -> str:
    return next(t for t in KEYS if t != tenant)


def audit_of(server: ServerProcess, tenant: str, chat: str) -> pb.ContextAudit | None:
    try:
        response = call_rpc(
            server, "GetContextAudit", pb.GetContextAuditRequest(chat_id=chat), metadata(tenant)
        )
    except grpc.RpcError as error:
        assert error.code() == grpc.StatusCode.NOT_FOUND
        return None
    audit: pb.ContextAudit = response.audit
    return audit


@pytest.mark.parametrize("tenant", sorted(KEYS))
def test_chats_are_the_tenants_own_on_every_rpc_and_route(keyed: ServerProcess, tenant: str) -> None:
    """Both tenants use the chat id "shared"; `tenant` alone has the chat "own-<tenant>". Every chat
    RPC and route of the other tenant misses `tenant`'s data, and `tenant` still has it after."""
    intruder = other(tenant)
    own = f"own-{tenant}"
    generations = {}
    for who, chat in ((tenant, "shared"), (intruder, "shared"), (tenant, own)):
        request = pb.ShiftContextRequest(
            blocks_json=TEXT, chat_id=chat, provider=who, generation_id=f"g-{who}-{chat}"
        )
        generations[who, chat] = call_rpc(keyed, "ShiftContext", request, metadata(who)).generation_id
    history = json.dumps([{"role": "user", "content": "earlier"}, {"role": "assistant", "content": "reply"}])
    call_rpc(
        keyed, "AppendBlocks", pb.AppendBlocksRequest(chat_id=own, blocks_json=history), metadata(tenant)
    )

    # Same chat id: each tenant reads its own audit.
    for who in (tenant, intruder):
        audit = audit_of(keyed, who, "shared")
        assert (
            audit is not None and audit.provider == who and audit.generation_id == generations[who, "shared"]
        )
    # The other tenant reads, finishes, deletes nothing of `own`, on either surface.
    assert audit_of(keyed, intruder, own) is None
    assert call_route(keyed, "GetContextAudit", headers(intruder), path_id=own).status_code == 404
    finish = pb.FinishGenerationRequest(
        generation_id=generations[tenant, own], status=pb.GENERATION_STATUS_COMPLETED
    )
    with pytest.raises(grpc.RpcError) as caught:
        call_rpc(keyed, "FinishGeneration", finish, metadata(intruder))
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert (
        call_route(keyed, "FinishGeneration", headers(intruder), path_id=generations[tenant, own]).status_code
        == 404
    )
    assert not call_rpc(keyed, "DeleteChat", pb.DeleteChatRequest(chat_id=own), metadata(intruder)).deleted
    assert call_route(keyed, "DeleteChat", headers(intruder), path_id=own).json() == {"deleted": False}
    # Its stored history is not the intruder's either: a shift on it sees only the request's blocks.
    with_history = pb.PreviewContextRequest(blocks_json=TEXT, chat_id=own, use_stored_history=True)
    seen = call_rpc(keyed, "PreviewContext", with_history, metadata(intruder)).plan.compaction.original_count
    assert seen == len(AS_JSON)
    assert call_rpc(
        keyed, "PreviewContext", with_history, metadata(tenant)
    ).plan.compaction.original_count == 2 + len(AS_JSON)
    # `tenant` still has everything: its audit, unfinished, and finishes it itself.
    audit = audit_of(keyed, tenant, own)
    assert audit is not None and audit.status == pb.GENERATION_STATUS_PENDING
    assert (
        call_rpc(keyed, "FinishGeneration", finish, metadata(tenant)).status == pb.GENERATION_STATUS_COMPLETED
    )
    # Deleting "shared" deletes the deleter's chat only.
    assert call_route(keyed, "DeleteChat", headers(intruder), path_id="shared").json() == {"deleted": True}
    assert audit_of(keyed, intruder, "shared") is None
    assert audit_of(keyed, tenant, "shared") is not None
    assert call_rpc(keyed, "DeleteChat", pb.DeleteChatRequest(chat_id=own), metadata(tenant)).deleted


@pytest.mark.parametrize("tenant", sorted(KEYS))
def test_model_configurations_are_the_tenants_own(keyed: ServerProcess, tenant: str) -> None:
    intruder = other(tenant)
    config = pb.ModelConfig(model=f"model-{tenant}", context_size=7000, max_output_tokens=500)
    call_rpc(keyed, "SetModelConfig", pb.SetModelConfigRequest(config=config), metadata(tenant))
    listed = call_rpc(keyed, "ListModelConfigs", pb.ListModelConfigsRequest(), metadata(intruder)).configs
    assert config.model not in {c.model for c in listed}
    with pytest.raises(grpc.RpcError) as caught:
        call_rpc(keyed, "GetModelConfig", pb.GetModelConfigRequest(model=config.model), metadata(intruder))
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    # The same model name shifts with the owner's configuration only.
    request = pb.PreviewContextRequest(blocks_json=TEXT, model=config.model)
    assert call_rpc(keyed, "PreviewContext", request, metadata(tenant)).plan.context_limit == 7000
    assert call_rpc(keyed, "PreviewContext", request, metadata(intruder)).plan.context_limit != 7000
    assert not call_rpc(
        keyed, "DeleteModelConfig", pb.DeleteModelConfigRequest(model=config.model), metadata(intruder)
    ).deleted
    assert call_rpc(
        keyed, "DeleteModelConfig", pb.DeleteModelConfigRequest(model=config.model), metadata(tenant)
    ).deleted
